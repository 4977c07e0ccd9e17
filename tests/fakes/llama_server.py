"""Fake llama-server with slots: the server's own slot choice, `id_slot`, `cache_prompt`, `timings`,
``/props`` (``total_slots``, per-slot ``n_ctx``), ``/slots``, slot save/restore and the RAM prompt cache.
Held to the real llama-server by tests/real/test_llama_contract.py.

The prompt is the chat rendered to text (the leading system messages, then the tools, then each other message,
as tool-capable chat templates render them); a token is four bytes of it. Each slot
keeps the bytes of the last prompt it processed. Without ``id_slot`` the server picks as llama-server does:
among idle slots holding something, the one sharing the longest common prefix with the prompt if that covers
more than ``slot_prompt_similarity`` of it (default 0.1), else the least recently used (among never-used
slots, the highest id). With ``id_slot`` (taken modulo the slot count, as the real server does) the request
waits for that slot. ``cache_prompt`` (default true) reuses the common prefix; at least one token is always
evaluated, as in llama.cpp.

The RAM prompt cache (``--cache-ram``, on by default in llama-server): when a task lands on a slot that
would keep less than half of what it holds, the slot's prompt is saved to RAM first, and the cached prompt
that best matches the new task (keeping at least a quarter of itself, and more of both than the slot has) is
loaded into the slot. ``cache_ram=False`` turns it off (``--cache-ram 0``).

A prompt longer than a slot's context (``n_ctx``, tokens per slot) is refused with the server's
``exceed_context_size_error``. ``loading_s``: every endpoint answers 503 "Loading model" that long after
start.

Slot files: a save writes the slot's tokens with a header naming the model they belong to, to
``slot_save_path`` (a directory, as ``--slot-save-path``) or to memory; a restore refuses, as the real server
does, a file that is missing, not a slot file, from another model (its tensors would not fit) or holding more
tokens than a slot's context.

Options: ``n_slots`` (default 4), ``n_ctx`` (131072, the OpenAI fake's), ``slot_prompt_similarity`` (0.1), ``slot_save`` (False:
save/restore answer 501 as a server started without ``--slot-save-path``; a ``slot_save_path`` turns it on),
``model_path`` and ``build_info`` (what /props says), ``cache_ram`` (True),
``ms_per_token`` (reported prefill speed), ``loading_s`` (0), ``apply_template`` (False: no ``/apply-template`` and
``/tokenize``), ``tools_rendered`` (True: the template shows the tool schemas). ``log`` records every generation: slot,
id_slot asked, prompt tokens, cached tokens and the prompt bytes.
"""

import asyncio
import itertools
import time
from pathlib import Path

import orjson
from aiohttp import web

from .behaviour import Call, Plan, dumps, json_response, write_frames
from .openai_server import DONE, SSE_HEADERS, OpenAIFake

BYTES_PER_TOKEN = 4
SLOT_MAGIC = b"FAKESLOT1\n"
RESTORE_FAILED = "Unable to restore slot: No available space in KV cache or invalid slot save file"
LLAMA = web.RequestKey("fake_llama_generation", dict)
_tick = itertools.count(1)


def render(body: dict, *, tools_rendered: bool = True) -> bytes:
    """A stand-in for a chat template: deterministic text in which the conversation's prefix is a prefix.
    `tools_rendered=False`: a template that never shows the model the tool schemas (SmolLM2's)."""
    out = []
    tools = body.get("tools")
    leading = True
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        if leading and m.get("role") not in ("system", "developer"):
            leading = False
            if tools and tools_rendered:
                out.append(b"<tools>" + orjson.dumps(tools) + b"</tools>\n")
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        else:
            text = content or ""
        part = f"<|{m.get('role')}|>{text}"
        if m.get("tool_calls"):
            part += orjson.dumps(m["tool_calls"]).decode()
        out.append(part.encode() + b"<|end|>\n")
    if leading and tools and tools_rendered:
        out.append(b"<tools>" + orjson.dumps(tools) + b"</tools>\n")
    out.append(b"<|assistant|>")
    return b"".join(out)


def common_bytes(a: bytes, b: bytes) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:  # a[:lo] == b[:lo] already holds
            lo = mid
        else:
            hi = mid - 1
    return lo


class FakeSlot:
    def __init__(self, sid: int) -> None:
        self.id = sid
        self.cache = b""
        self.busy = False
        self.last_used = -1
        self.task: dict | None = None  # what /slots reports of the last task: prompt tokens, processed, cached


def _valid_filename(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and name not in (".", "..") and len(name) <= 255


def _error(status: int, message: str, etype: str) -> web.StreamResponse:
    return json_response({"error": {"code": status, "message": message, "type": etype}}, status)


class LlamaServerFake(OpenAIFake):
    kind = "llamacpp"

    def configure(self) -> None:
        super().configure()
        self.n_slots = int(self.options.get("n_slots", 4))
        self.similarity = float(self.options.get("slot_prompt_similarity", 0.1))
        self.slot_save_path = self.options.get("slot_save_path")
        self.slot_save = bool(self.options.get("slot_save", False)) or bool(self.slot_save_path)
        self.model_path = str(self.options.get("model_path") or self.models[0])
        self.build_info = str(self.options.get("build_info") or "fake-llama-server")
        self.ms_per_token = float(self.options.get("ms_per_token", 1.0))
        self.cache_ram = bool(self.options.get("cache_ram", True))
        self.loading_until = time.monotonic() + float(self.options.get("loading_s", 0.0))
        self.slots = [FakeSlot(i) for i in range(self.n_slots)]
        self.tools_rendered = bool(self.options.get("tools_rendered", True))
        self.prompt_cache: list[bytes] = []  # the RAM prompt cache, oldest first
        self._task_ids = itertools.count()
        self.files: dict[str, bytes] = {}
        self.log: list[dict] = []
        self.slot_actions: list[tuple[str, int, str]] = []
        self._freed: asyncio.Condition | None = None

    def setup_routes(self) -> None:
        super().setup_routes()
        self.route("GET", "/slots", self.list_slots)
        self.route("POST", "/slots/{id}", self.slot_action)
        if self.options.get("apply_template"):
            # The real server's counting pair: the chat template applied (as for a generation), then tokenized.
            self.route("POST", "/apply-template", self.apply_template)
            if not self.options.get("tokenize"):
                self.route("POST", "/tokenize", self.tokenize)

    async def apply_template(self, call: Call) -> web.StreamResponse:
        body = call.body if isinstance(call.body, dict) else {}
        return json_response({"prompt": render(body, tools_rendered=self.tools_rendered).decode()})

    # -- slot API ---------------------------------------------------------------------------------------

    async def props(self, call: Call) -> web.StreamResponse:
        return json_response({"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": self.n_slots,
                              "model_path": self.model_path, "build_info": self.build_info})

    def route(self, method, path, handler, **kw) -> None:
        """Every endpoint answers 503 "Loading model" until the model is loaded, as llama-server's middleware
        does."""
        async def guarded(call: Call) -> web.StreamResponse:
            if time.monotonic() < self.loading_until:
                return _error(503, "Loading model", "unavailable_error")
            return await handler(call)

        super().route(method, path, guarded, **kw)

    async def health(self, call: Call) -> web.StreamResponse:
        return json_response({"status": "ok"})

    async def list_slots(self, call: Call) -> web.StreamResponse:
        out = []
        for s in self.slots:
            row = {"id": s.id, "n_ctx": self.n_ctx, "speculative": False, "is_processing": s.busy}
            if s.task is not None:
                row.update(s.task)
            out.append(row)
        return json_response(out)

    async def slot_action(self, call: Call) -> web.StreamResponse:
        if not self.slot_save:
            return _error(501, "This server does not support slots action. Start it with `--slot-save-path`",
                          "not_supported_error")
        try:
            sid = int(call.request.match_info["id"]) % self.n_slots  # the real server wraps ids too
        except ValueError:
            return _error(400, "Invalid slot ID", "invalid_request_error")
        action = call.request.query.get("action", "")
        if action not in ("save", "restore", "erase"):
            return _error(400, "Invalid action", "invalid_request_error")
        fname = str((call.body or {}).get("filename") or "")
        if action != "erase" and not _valid_filename(fname):
            return _error(400, "Invalid filename", "invalid_request_error")
        slot = self.slots[sid]
        self.slot_actions.append((action, sid, fname))
        if action == "save":
            data = SLOT_MAGIC + orjson.dumps({"model": self.model_path, "n_tokens": len(slot.cache) // BYTES_PER_TOKEN}) \
                + b"\n" + slot.cache
            await self._write_file(fname, data)
            return json_response({"id_slot": sid, "filename": fname, "n_saved": len(slot.cache) // BYTES_PER_TOKEN,
                                  "n_written": len(data), "timings": {"save_ms": 1.0}})
        if action == "restore":
            data = await self._read_file(fname)
            cache = self._slot_state(data)
            if cache is None:
                return _error(400, RESTORE_FAILED, "invalid_request_error")
            slot.cache = cache
            return json_response({"id_slot": sid, "filename": fname,
                                  "n_restored": len(slot.cache) // BYTES_PER_TOKEN, "n_read": len(data or b""),
                                  "timings": {"restore_ms": 1.0}})
        slot.cache = b""
        return json_response({"id_slot": sid, "n_erased": 0})

    async def _write_file(self, fname: str, data: bytes) -> None:
        if not self.slot_save_path:
            self.files[fname] = data
            return

        def write() -> None:
            (Path(str(self.slot_save_path)) / fname).write_bytes(data)

        await asyncio.to_thread(write)

    async def _read_file(self, fname: str) -> bytes | None:
        if not self.slot_save_path:
            return self.files.get(fname)

        def read() -> bytes | None:
            try:
                return (Path(str(self.slot_save_path)) / fname).read_bytes()
            except OSError:
                return None

        return await asyncio.to_thread(read)

    def _slot_state(self, data: bytes | None) -> bytes | None:
        """The tokens of a slot file this server can load, else None (the real server's refusal)."""
        if not data or not data.startswith(SLOT_MAGIC):
            return None
        header, _, cache = data[len(SLOT_MAGIC):].partition(b"\n")
        try:
            meta = orjson.loads(header)
        except orjson.JSONDecodeError:
            return None
        if not isinstance(meta, dict) or meta.get("model") != self.model_path:
            return None
        if not isinstance(meta.get("n_tokens"), int) or meta["n_tokens"] > self.n_ctx:
            return None
        return cache

    # -- generation -------------------------------------------------------------------------------------

    def _pick(self, prompt: bytes, id_slot) -> tuple[FakeSlot | None, bool]:
        """(the slot, whether the RAM prompt cache is updated first): as llama-server's get_available_slot."""
        if isinstance(id_slot, int) and id_slot >= 0:
            s = self.slots[id_slot % self.n_slots]  # out-of-range ids wrap around
            if s.busy:
                return None, False
            keep = common_bytes(s.cache, prompt) / len(s.cache) if s.cache else 0.0
            sim = common_bytes(s.cache, prompt) / max(1, len(prompt))
            return s, not (s.cache and sim > self.similarity and keep >= 0.5)
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None, False
        if self.similarity > 0:
            scored = [(common_bytes(s.cache, prompt) / max(1, len(prompt)), s) for s in idle if s.cache]
            best = None
            for sim, s in scored:  # the first slot with the best similarity above the threshold
                if sim > self.similarity and (best is None or sim > best[0]):
                    best = (sim, s)
            if best is not None:
                s = best[1]
                return s, common_bytes(s.cache, prompt) / len(s.cache) < 0.5
        lru = None
        for s in idle:  # `<=`: among equally old slots the last one wins, as in the real server
            if lru is None or s.last_used <= lru.last_used:
                lru = s
        return lru, True

    def _update_prompt_cache(self, slot: FakeSlot, prompt: bytes) -> None:
        """Save the slot's prompt to RAM, then load the cached prompt that best fits the new one."""
        if not self.cache_ram:
            return
        if slot.cache and not any(common_bytes(c, slot.cache) == len(slot.cache) for c in self.prompt_cache):
            # Cached prompts wholly contained in the one being saved are obsolete.
            self.prompt_cache = [c for c in self.prompt_cache if common_bytes(c, slot.cache) != len(c)]
            self.prompt_cache.append(slot.cache)
        lcp = common_bytes(slot.cache, prompt)
        keep_best = lcp / len(slot.cache) if slot.cache else -1.0
        sim_best = lcp / max(1, len(prompt))
        best = None
        for i, c in enumerate(self.prompt_cache):
            cur = common_bytes(c, prompt)
            keep, sim = cur / len(c), cur / max(1, len(prompt))
            if keep < 0.25:
                continue  # don't trash large prompts
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, i
        if best is not None:
            slot.cache = self.prompt_cache.pop(best)

    async def chat_completions(self, call: Call) -> web.StreamResponse:
        body = call.body
        if not isinstance(body, dict):
            return await super().chat_completions(call)
        if self._freed is None:
            self._freed = asyncio.Condition()
        prompt = render(body, tools_rendered=self.tools_rendered)
        n_prompt = -(-len(prompt) // BYTES_PER_TOKEN)
        if n_prompt > self.n_ctx:
            return json_response({"error": {
                "code": 400, "message": f"request ({n_prompt} tokens) exceeds the available context size "
                                        f"({self.n_ctx} tokens), try increasing it",
                "type": "exceed_context_size_error", "n_prompt_tokens": n_prompt, "n_ctx": self.n_ctx}}, 400)
        id_slot = body.get("id_slot")
        async with self._freed:
            slot, update_cache = self._pick(prompt, id_slot)
            while slot is None:
                await self._freed.wait()
                slot, update_cache = self._pick(prompt, id_slot)
            slot.busy = True
        try:
            if update_cache and body.get("cache_prompt", True):
                self._update_prompt_cache(slot, prompt)
            cached = 0
            if body.get("cache_prompt", True):
                cached = min(common_bytes(slot.cache, prompt) // BYTES_PER_TOKEN, n_prompt - 1)
            slot.cache = prompt
            slot.last_used = next(_tick)
            slot.task = {"id_task": next(self._task_ids), "n_prompt_tokens": n_prompt,
                         "n_prompt_tokens_processed": 0, "n_prompt_tokens_cache": 0}
            entry = {"slot": slot.id, "id_slot": id_slot, "n_prompt": n_prompt, "cache_n": cached,
                     "prompt": prompt}
            self.log.append(entry)
            call.request[LLAMA] = entry
            return await super().chat_completions(call)
        finally:
            async with self._freed:
                slot.busy = False
                self._freed.notify_all()

    def _timings(self, call: Call, plan: Plan) -> dict:
        e = call.request[LLAMA]
        # The slot keeps the prompt and what was generated, all but the last token (as /slots reports it).
        self.slots[e["slot"]].task["n_prompt_tokens"] = e["n_prompt"] + max(0, plan.output_tokens - 1)
        processed = e["n_prompt"] - e["cache_n"]
        return {"cache_n": e["cache_n"], "prompt_n": processed, "prompt_ms": processed * self.ms_per_token,
                "prompt_per_second": 1000 / self.ms_per_token if self.ms_per_token else 0.0,
                "predicted_n": plan.output_tokens, "predicted_ms": float(plan.output_tokens)}

    def _usage(self, call: Call, plan: Plan) -> dict:
        usage = super()._usage(call, plan)
        e = call.request.get(LLAMA)
        if e is not None:
            usage["prompt_tokens"] = e["n_prompt"]
            usage["total_tokens"] = e["n_prompt"] + usage["completion_tokens"]
            usage["prompt_tokens_details"] = {"cached_tokens": e["cache_n"]}
        return usage

    async def _stream(self, call: Call, plan: Plan, model: str, field: str,
                      include_usage: bool) -> web.StreamResponse:
        if plan.fail:
            return await super()._stream(call, plan, model, field, include_usage)
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(call.request)
        frames = list(self._cached_frames(call, plan, model, field))
        timings = self._timings(call, plan)
        last = {"id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": plan.finish}],
                "timings": timings}
        frames.append(b"data: " + dumps(last) + b"\n\n")
        if include_usage:
            frames.append(b"data: " + dumps({
                "id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": model, "choices": [], "usage": self._usage(call, plan), "timings": timings,
            }) + b"\n\n")
        frames.append(DONE)
        await write_frames(resp, frames, plan.delay)
        return resp

    async def _complete(self, call: Call, plan: Plan, model: str, field: str) -> web.StreamResponse:
        resp = await super()._complete(call, plan, model, field)
        if plan.fail or resp.status != 200:
            return resp
        obj = orjson.loads(resp.body)
        obj["timings"] = self._timings(call, plan)
        return json_response(obj)
