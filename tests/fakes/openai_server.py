"""Fake OpenAI-compatible server with llama.cpp extras (``/health``, ``/props``, optional ``/tokenize``).

Options: ``reasoning_field`` (delta field for reasoning, default ``reasoning_content``), ``tool_split``
(default fragment size of streamed tool arguments, None = whole arguments in one chunk), ``tokenize``
(enable ``POST /tokenize``), ``n_ctx`` (context size reported and used by ``overflow``), ``max_model_len``
(as vLLM: a chat request whose prompt plus max_tokens exceeds it is refused with vLLM's classic wording, one that
fits is served).
"""

import asyncio
import time

import orjson
from aiohttp import web

from .behaviour import (
    Call,
    FakeBase,
    Plan,
    dumps,
    json_response,
    make_plan,
    structured,
    write_frames,
)
from .responses_render import response_body, response_frames

SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
DONE = b"data: [DONE]\n\n"


def openai_error(call: Call, *, model: str, n_ctx: int, name: str | None = None) -> web.Response:
    b = call.behaviour
    name = name or b.name
    headers = None
    if name == "500":
        status, err = 500, {"code": 500, "message": "Internal server error", "type": "server_error"}
    elif name == "oom":  # llama.cpp's answer when the KV cache or a compute buffer does not fit
        status = 500
        err = {"code": 500, "type": "server_error",
               "message": "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: "
                          "cudaMalloc failed: out of memory"}
    elif name == "503_loading":
        status, err = 503, {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    elif name == "429":
        status = 429
        err = {"message": "Rate limit reached, please retry later", "type": "requests", "param": None,
               "code": "rate_limit_exceeded"}
        headers = {"retry-after": b.get("retry_after", "1")}
    elif name == "401":
        status = 401
        err = {"message": "Incorrect API key provided", "type": "invalid_request_error", "param": None,
               "code": "invalid_api_key"}
    elif name == "404_model":
        status = 404
        err = {"message": f"The model `{model}` does not exist", "type": "invalid_request_error",
               "param": "model", "code": "model_not_found"}
    elif name == "overflow":
        status = 400
        ctx = b.integer("n_ctx", n_ctx)
        err = {"code": 400, "message": "the request exceeds the available context size, try increasing it",
               "type": "exceed_context_size_error",
               "n_prompt_tokens": b.integer("n_prompt", max(call.prompt_tokens, ctx + 1)), "n_ctx": ctx}
    elif name == "529":
        status, err = 529, {"message": "Overloaded", "type": "overloaded_error", "param": None, "code": 529}
    else:
        status = 400
        err = {"message": "Invalid request: 'messages' is malformed", "type": "invalid_request_error",
               "param": "messages", "code": None}
    return json_response({"error": err}, status, headers)


def tool_names(body: dict | None) -> list[str]:
    """Function names from OpenAI/Ollama-style ``tools`` entries, in request order."""
    names = []
    for tool in (body or {}).get("tools") or ():
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def last_tool_result(body: dict) -> str | None:
    """The text of the last `role: tool` message, if any."""
    for msg in reversed(body.get("messages") or ()):
        if isinstance(msg, dict) and msg.get("role") == "tool":
            c = msg.get("content")
            if isinstance(c, list):
                return "".join(p.get("text", "") for p in c if isinstance(p, dict))
            return c if isinstance(c, str) else None
    return None


class OpenAIFake(FakeBase):
    kind = "openai"
    default_reasoning_field = "reasoning_content"
    default_tool_split: int | None = 3

    def configure(self) -> None:
        opts = self.options
        self.reasoning_field = str(opts.get("reasoning_field", self.default_reasoning_field))
        self.tool_split = opts.get("tool_split", self.default_tool_split)
        # Reported in /props, which the daemon's context gate reads (and the llama fake enforces): large by
        # default, so neither gates a prompt of a test that is not about context sizes.
        self.n_ctx = int(opts.get("n_ctx", 131072))
        self.created = int(time.time())
        self.completion_id = f"chatcmpl-{self.name}"
        self._frame_cache: dict[tuple, list[bytes]] = {}

    def setup_routes(self) -> None:
        self.add_openai_routes()
        self.route("GET", "/health", self.health)
        self.route("GET", "/props", self.props)
        if self.options.get("tokenize"):
            self.route("POST", "/tokenize", self.tokenize)

    def add_openai_routes(self) -> None:
        self.route("POST", "/v1/chat/completions", self.chat_completions, generation=True)
        self.route("POST", "/v1/responses", self.responses, generation=True)
        self.route("GET", "/v1/models", self.list_models)

    def error_response(self, call: Call) -> web.StreamResponse:
        return openai_error(call, model=call.model(self.models[0]), n_ctx=self.n_ctx)

    async def before_generation(self, model: str) -> None:
        """Hook for servers that load models on demand (JIT)."""

    # -- handlers -------------------------------------------------------------------------------

    async def list_models(self, call: Call) -> web.StreamResponse:
        data = [{"id": m, "object": "model", "created": self.created, "owned_by": "fake",
                 "meta": {"n_ctx_train": self.n_ctx}} for m in self.models]
        return json_response({"object": "list", "data": data})

    async def health(self, call: Call) -> web.StreamResponse:
        return json_response({"status": "ok"})

    async def props(self, call: Call) -> web.StreamResponse:
        return json_response({"default_generation_settings": {"n_ctx": self.n_ctx}, "total_slots": 1,
                              "model_path": self.models[0], "modalities": {"vision": False},
                              "build_info": "fake", "is_sleeping": False})

    async def tokenize(self, call: Call) -> web.StreamResponse:
        content = (call.body or {}).get("content", "")
        text = content if isinstance(content, str) else ""
        # One token per four UTF-8 bytes, ids derived from the bytes so they are stable across runs.
        data = text.encode()
        tokens = [int.from_bytes(data[i:i + 4].ljust(4, b"\0"), "little") % 151_000
                  for i in range(0, len(data), 4)]
        return json_response({"tokens": tokens})

    async def chat_completions(self, call: Call) -> web.StreamResponse:
        body = call.body
        if not isinstance(body, dict):
            return json_response({"error": {"message": "request body is not a JSON object",
                                            "type": "invalid_request_error", "param": None, "code": None}},
                                 400)
        # served_model: the server names the model its own way (llama-server: the .gguf path)
        model = str(self.options.get("served_model") or call.model(self.models[0]))
        limit = int(self.options.get("max_model_len") or 0)
        asked = body.get("max_tokens") or body.get("max_completion_tokens") or 0
        if limit and isinstance(asked, int) and call.prompt_tokens + asked > limit:
            p = call.prompt_tokens
            return json_response({"object": "error", "type": "BadRequestError", "param": None, "code": 400,
                                  "message": f"This model's maximum context length is {limit} tokens. However, you "
                                             f"requested {p + asked} tokens ({p} in the messages, {asked} in the "
                                             "completion). Please reduce the length of the messages or completion."},
                                 400)
        await self.before_generation(model)
        plan = make_plan(call.behaviour, self.name, tool_names(body), split_default=self.tool_split,
                         id_prefix="call_", tool_result=last_tool_result(body))
        fmt = body.get("response_format")
        if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
            structured(plan, call.behaviour, fmt["json_schema"].get("schema"))  # as a grammar-constrained server
        field = plan.reasoning_field or self.reasoning_field
        if body.get("stream"):
            opts = body.get("stream_options")
            include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            return await self._stream(call, plan, model, field, include_usage)
        return await self._complete(call, plan, model, field)

    async def responses(self, call: Call) -> web.StreamResponse:
        """The Responses API, as OpenAI, LM Studio and llama-swap serve it (text, reasoning, function calls)."""
        body = call.body
        if not isinstance(body, dict) or "input" not in body:
            return json_response({"error": {"message": "input: field required", "type": "invalid_request_error",
                                            "param": "input", "code": None}}, 400)
        model = call.model(self.models[0])
        names = [t["name"] for t in body.get("tools") or () if isinstance(t, dict) and t.get("type") == "function"]
        plan = make_plan(call.behaviour, self.name, names, split_default=self.tool_split, id_prefix="call_")
        if not body.get("stream"):
            return json_response(response_body(plan, model, self.name, call.prompt_tokens))
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(call.request)
        await write_frames(resp, response_frames(plan, model, self.name, call.prompt_tokens), plan.delay)
        return resp

    # -- rendering -------------------------------------------------------------------------------

    def _usage(self, call: Call, plan: Plan) -> dict:
        prompt, completion = call.prompt_tokens, plan.output_tokens
        usage = {"prompt_tokens": prompt, "completion_tokens": completion,
                 "total_tokens": prompt + completion, "prompt_tokens_details": {"cached_tokens": 0}}
        if plan.reasoning:
            usage["completion_tokens_details"] = {"reasoning_tokens": len(plan.reasoning)}
        return usage

    @staticmethod
    def _with_running_usage(frames: list[bytes], prompt: int) -> list[bytes]:
        """Each chunk with the usage so far (vLLM's continuous_usage_stats): one completion token per chunk."""
        out = []
        for i, frame in enumerate(frames):
            obj = orjson.loads(frame[len(b"data: "):].strip())
            obj["usage"] = {"prompt_tokens": prompt, "completion_tokens": i, "total_tokens": prompt + i}
            out.append(b"data: " + dumps(obj) + b"\n\n")
        return out

    def _chunk(self, model: str, delta: dict, finish: str | None = None) -> bytes:
        return b"data: " + dumps({
            "id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
            "model": model, "system_fingerprint": "fake",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }) + b"\n\n"

    def _body_frames(self, plan: Plan, model: str, field: str) -> list[bytes]:
        frames = [self._chunk(model, {"role": "assistant", "content": ""})]
        frames += [self._chunk(model, {field: piece}) for piece in plan.reasoning]
        frames += [self._chunk(model, {"content": piece}) for piece in plan.content]
        # Round-robin over the calls so parallel calls interleave on the wire; each call's first piece
        # carries id and name, later pieces only the index and an argument fragment.
        sequences = []
        for index, tc in enumerate(plan.tool_calls):
            whole = len(tc.fragments) == 1
            head = {"index": index, "id": tc.id, "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments if whole else ""}}
            rest = [] if whole else [{"index": index, "function": {"arguments": f}} for f in tc.fragments]
            sequences.append([head, *rest])
        longest = max((len(s) for s in sequences), default=0)
        for step in range(longest):
            for seq in sequences:
                if step < len(seq):
                    frames.append(self._chunk(model, {"tool_calls": [seq[step]]}))
        return frames

    def _cached_frames(self, call: Call, plan: Plan, model: str, field: str) -> list[bytes]:
        if plan.tool_calls or call.behaviour.name == "text_tools":  # the answer depends on the request
            return self._body_frames(plan, model, field)
        # Keyed by what the frames say, not only by behaviour: an answer built from the request (echo_tool_result)
        # must never be served from another request's cache entry.
        key = (call.behaviour.spec, model, field, tuple(plan.reasoning), tuple(plan.content))
        frames = self._frame_cache.get(key)
        if frames is None:
            if len(self._frame_cache) > 256:
                self._frame_cache.clear()
            frames = self._frame_cache[key] = self._body_frames(plan, model, field)
        return frames

    async def _stream(self, call: Call, plan: Plan, model: str, field: str,
                      include_usage: bool) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(call.request)
        frames = self._cached_frames(call, plan, model, field)
        if call.behaviour.flag("usage_each"):
            frames = self._with_running_usage(frames, call.prompt_tokens)
        if plan.fail == "disconnect":
            await write_frames(resp, frames, plan.delay)
            call.close_connection()
            return resp
        if plan.fail == "error":
            err = {"error": {"code": 500, "message": "upstream model crashed mid-stream", "type": "server_error"}}
            await write_frames(resp, [*frames, b"data: " + dumps(err) + b"\n\n"], plan.delay)
            return resp
        tail = [self._chunk(model, {}, plan.finish)]
        if include_usage:
            tail.append(b"data: " + dumps({
                "id": self.completion_id, "object": "chat.completion.chunk", "created": self.created,
                "model": model, "system_fingerprint": "fake", "choices": [], "usage": self._usage(call, plan),
            }) + b"\n\n")
        tail.append(DONE)
        await write_frames(resp, [*frames, *tail], plan.delay)
        if plan.linger > 0:  # the end of the HTTP body comes well after [DONE]
            await asyncio.sleep(plan.linger)
        return resp

    async def _complete(self, call: Call, plan: Plan, model: str, field: str) -> web.StreamResponse:
        if plan.fail == "disconnect":
            call.close_connection()
            return web.Response(status=200)
        if plan.fail == "error":
            return openai_error(call, model=model, n_ctx=self.n_ctx, name="500")
        if plan.delay > 0:
            await asyncio.sleep(plan.delay * plan.output_tokens)
        message: dict = {"role": "assistant", "content": plan.text if plan.content else None}
        if plan.reasoning:
            message[field] = "".join(plan.reasoning)
        if plan.tool_calls:
            message["tool_calls"] = [{"id": tc.id, "type": "function",
                                      "function": {"name": tc.name, "arguments": tc.arguments}}
                                     for tc in plan.tool_calls]
        return json_response({
            "id": self.completion_id, "object": "chat.completion", "created": self.created, "model": model,
            "system_fingerprint": "fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": plan.finish}],
            "usage": self._usage(call, plan),
        })
