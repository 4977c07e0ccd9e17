"""Fake llama-server with slots: the server's own slot choice, `id_slot`, `cache_prompt`, `timings`,
``/props`` (``total_slots``), ``/slots`` and slot save/restore.

The prompt is the chat rendered to text (tools, then each message); a token is four bytes of it. Each slot
keeps the bytes of the last prompt it processed. Without ``id_slot`` the server picks as llama-server does:
among idle slots, the one sharing the longest common prefix with the prompt if that covers more than
``slot_prompt_similarity`` of it (default 0.1), else the least recently used. With ``id_slot`` the request
waits for that slot. ``cache_prompt`` (default true) reuses the common prefix; at least one token is always
evaluated, as in llama.cpp.

Options: ``n_slots`` (default 4), ``slot_prompt_similarity`` (0.1), ``slot_save`` (False: save/restore
answer 501 as a server started without ``--slot-save-path``), ``ms_per_token`` (reported prefill speed).
``log`` records every generation: slot, id_slot asked, prompt tokens, cached tokens and the prompt bytes.
"""

import asyncio
import itertools

import orjson
from aiohttp import web

from .behaviour import Call, Plan, dumps, json_response, write_frames
from .openai_server import DONE, SSE_HEADERS, OpenAIFake

BYTES_PER_TOKEN = 4
LLAMA = web.RequestKey("fake_llama_generation", dict)
_tick = itertools.count(1)


def render(body: dict) -> bytes:
    """A stand-in for a chat template: deterministic text in which the conversation's prefix is a prefix."""
    out = []
    tools = body.get("tools")
    if tools:
        out.append(b"<tools>" + orjson.dumps(tools) + b"</tools>\n")
    for m in body.get("messages") or ():
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            text = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
        else:
            text = content or ""
        part = f"<|{m.get('role')}|>{text}"
        if m.get("tool_calls"):
            part += orjson.dumps(m["tool_calls"]).decode()
        out.append(part.encode() + b"<|end|>\n")
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
        self.last_used = 0


class LlamaServerFake(OpenAIFake):
    kind = "llamacpp"

    def configure(self) -> None:
        super().configure()
        self.n_slots = int(self.options.get("n_slots", 4))
        self.similarity = float(self.options.get("slot_prompt_similarity", 0.1))
        self.slot_save = bool(self.options.get("slot_save", False))
        self.ms_per_token = float(self.options.get("ms_per_token", 1.0))
        self.slots = [FakeSlot(i) for i in range(self.n_slots)]
        self.files: dict[str, bytes] = {}
        self.log: list[dict] = []
        self.slot_actions: list[tuple[str, int, str]] = []
        self._freed: asyncio.Condition | None = None

    def setup_routes(self) -> None:
        super().setup_routes()
        self.route("GET", "/slots", self.list_slots)
        self.route("POST", "/slots/{id}", self.slot_action)

    # -- slot API ---------------------------------------------------------------------------------------

    async def props(self, call: Call) -> web.StreamResponse:
        return json_response({"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": self.n_slots,
                              "model_path": self.models[0], "build_info": "fake-llama-server"})

    async def list_slots(self, call: Call) -> web.StreamResponse:
        return json_response([{"id": s.id, "n_ctx": self.n_ctx, "is_processing": s.busy,
                               "n_past": len(s.cache) // BYTES_PER_TOKEN} for s in self.slots])

    async def slot_action(self, call: Call) -> web.StreamResponse:
        if not self.slot_save:
            return json_response({"error": {"code": 501, "type": "not_supported_error",
                                            "message": "This server does not support slots action. "
                                                       "Start it with `--slot-save-path`"}}, 501)
        sid = int(call.request.match_info["id"])
        action = call.request.query.get("action", "")
        fname = str((call.body or {}).get("filename") or "")
        if not 0 <= sid < self.n_slots or action not in ("save", "restore", "erase") or \
                (action != "erase" and (not fname or "/" in fname)):
            return json_response({"error": {"code": 400, "type": "invalid_request_error",
                                            "message": "Invalid slot action"}}, 400)
        slot = self.slots[sid]
        self.slot_actions.append((action, sid, fname))
        if action == "save":
            self.files[fname] = slot.cache
            return json_response({"id_slot": sid, "filename": fname, "n_saved": len(slot.cache) // BYTES_PER_TOKEN,
                                  "n_written": len(slot.cache), "timings": {"save_ms": 1.0}})
        if action == "restore":
            if fname not in self.files:
                return json_response({"error": {"code": 400, "type": "invalid_request_error",
                                                "message": "failed to restore slot"}}, 400)
            slot.cache = self.files[fname]
            return json_response({"id_slot": sid, "filename": fname,
                                  "n_restored": len(slot.cache) // BYTES_PER_TOKEN, "n_read": len(slot.cache),
                                  "timings": {"restore_ms": 1.0}})
        slot.cache = b""
        return json_response({"id_slot": sid, "n_erased": 0})

    # -- generation -------------------------------------------------------------------------------------

    def _pick(self, prompt: bytes, id_slot) -> FakeSlot | None:
        if isinstance(id_slot, int) and 0 <= id_slot < self.n_slots:
            s = self.slots[id_slot]
            return None if s.busy else s
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        if self.similarity > 0:
            best = max(idle, key=lambda s: (common_bytes(s.cache, prompt), -s.last_used))
            if common_bytes(best.cache, prompt) > self.similarity * len(prompt):
                return best
        return min(idle, key=lambda s: s.last_used)

    async def chat_completions(self, call: Call) -> web.StreamResponse:
        body = call.body
        if not isinstance(body, dict):
            return await super().chat_completions(call)
        if self._freed is None:
            self._freed = asyncio.Condition()
        prompt = render(body)
        id_slot = body.get("id_slot")
        async with self._freed:
            slot = self._pick(prompt, id_slot)
            while slot is None:
                await self._freed.wait()
                slot = self._pick(prompt, id_slot)
            slot.busy = True
        try:
            n_prompt = -(-len(prompt) // BYTES_PER_TOKEN)
            cached = 0
            if body.get("cache_prompt", True):
                cached = min(common_bytes(slot.cache, prompt) // BYTES_PER_TOKEN, n_prompt - 1)
            slot.cache = prompt
            slot.last_used = next(_tick)
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
