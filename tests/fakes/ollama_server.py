"""Fake Ollama: native API (NDJSON chat/generate, tags, ps, show, load/unload) plus its OpenAI ``/v1`` routes.

Options: ``version`` (``/api/version``), ``context_length`` (``model_info``), ``capabilities`` (list),
``loaded`` (models already in memory), ``arch`` (model_info architecture prefix).
A chat or generate request for a model that is not loaded waits ``load_delay`` first, like a cold start.
"""

import asyncio
import hashlib
import time

import orjson
from aiohttp import web

from .behaviour import Call, Plan, dumps, json_response, make_plan, write_frames
from .openai_server import OpenAIFake, last_tool_result, tool_names

NDJSON_HEADERS = {"content-type": "application/x-ndjson"}
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}


class OllamaFake(OpenAIFake):
    kind = "ollama"
    default_reasoning_field = "reasoning"
    # Ollama's /v1 sends every streamed tool call whole, in one chunk.
    default_tool_split = None

    def configure(self) -> None:
        opts = self.options
        self.version = str(opts.get("version", "0.14.3"))
        self.context_length = int(opts.get("context_length", 32768))
        self.capabilities = list(opts.get("capabilities", ["completion", "tools"]))
        self.arch = str(opts.get("arch", "qwen3moe"))
        self.loaded: dict[str, float] = dict.fromkeys(opts.get("loaded", ()), 0.0)
        self.created_at = time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime())
        super().configure()

    def setup_routes(self) -> None:
        self.add_openai_routes()
        self.route("GET", "/", self.root)
        self.route("HEAD", "/", self.root)
        self.route("GET", "/api/version", self.api_version)
        self.route("GET", "/api/tags", self.tags)
        self.route("GET", "/api/ps", self.ps)
        self.route("POST", "/api/show", self.show)
        self.route("POST", "/api/chat", self.chat, generation=True, errors=self.native_error)
        self.route("POST", "/api/generate", self.generate, generation=True, errors=self.native_error)

    def native_error(self, call: Call, name: str | None = None) -> web.StreamResponse:
        b = call.behaviour
        name = name or b.name
        model = call.model(self.models[0])
        statuses = {"500": 500, "503_loading": 503, "429": 429, "401": 401, "404_model": 404, "400": 400,
                    "overflow": 400, "529": 503}
        messages = {
            "500": "an error was encountered while running the model: unexpected EOF",
            "503_loading": "server busy, please try again.  maximum pending requests exceeded",
            "429": "too many requests",
            "401": "unauthorized",
            "404_model": f"model '{model}' not found",
            "400": "invalid request: messages must be an array",
            "overflow": "the input length exceeds the context length",
            "529": "server overloaded, please try again",
        }
        headers = {"retry-after": b.get("retry_after", "1")} if name == "429" else None
        return json_response({"error": messages[name]}, statuses[name], headers)

    async def before_generation(self, model: str) -> None:
        if model not in self.loaded:
            if self.load_delay > 0:
                await asyncio.sleep(self.load_delay)
            self.loaded[model] = time.time()

    # -- discovery ---------------------------------------------------------------------------------

    async def root(self, call: Call) -> web.StreamResponse:
        return web.Response(text="Ollama is running")

    async def api_version(self, call: Call) -> web.StreamResponse:
        return json_response({"version": self.version})

    def _details(self) -> dict:
        return {"parent_model": "", "format": "gguf", "family": self.arch, "families": [self.arch],
                "parameter_size": "30.5B", "quantization_level": "Q4_K_M"}

    async def tags(self, call: Call) -> web.StreamResponse:
        models = [{"name": m, "model": m, "modified_at": self.created_at, "size": 18_556_700_000,
                   "digest": hashlib.sha256(m.encode()).hexdigest(), "details": self._details()}
                  for m in self.models]
        return json_response({"models": models})

    async def ps(self, call: Call) -> web.StreamResponse:
        expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 300))
        models = [{"name": m, "model": m, "size": 20_000_000_000, "size_vram": 20_000_000_000,
                   "expires_at": expires, "details": self._details(), "context_length": self.context_length}
                  for m in self.loaded]
        return json_response({"models": models})

    async def show(self, call: Call) -> web.StreamResponse:
        body = call.body if isinstance(call.body, dict) else {}
        model = body.get("model") or body.get("name")
        if model not in self.models:
            return json_response({"error": f"model '{model}' not found"}, 404)
        return json_response({
            "modelfile": f"FROM {model}\n", "parameters": "temperature 0.7\nnum_ctx 4096",
            "template": "{{ .Prompt }}", "details": self._details(),
            "model_info": {"general.architecture": self.arch, "general.parameter_count": 30_532_122_624,
                           f"{self.arch}.context_length": self.context_length,
                           f"{self.arch}.embedding_length": 2048},
            "capabilities": self.capabilities, "modified_at": self.created_at,
        })

    # -- generation --------------------------------------------------------------------------------

    def _final(self, call: Call, model: str, plan: Plan, done_reason: str, extra: dict) -> dict:
        return {"model": model, "created_at": self.created_at, **extra, "done": True, "done_reason": done_reason,
                "total_duration": 1_200_000_000, "load_duration": 10_000_000,
                "prompt_eval_count": call.prompt_tokens, "prompt_eval_duration": 100_000_000,
                "eval_count": plan.output_tokens, "eval_duration": 1_000_000_000}

    async def _load_or_unload(self, call: Call, model: str, extra: dict) -> web.StreamResponse:
        body = call.body or {}
        if body.get("keep_alive") in (0, "0", "0s", "0m"):
            self.loaded.pop(model, None)
            reason = "unload"
        else:
            await self.before_generation(model)
            reason = "load"
        return json_response({"model": model, "created_at": self.created_at, **extra, "done_reason": reason,
                              "done": True})

    def _tool_calls(self, plan: Plan) -> list[dict]:
        return [{"id": tc.id, "function": {"index": i, "name": tc.name, "arguments": orjson.loads(tc.arguments)}}
                for i, tc in enumerate(plan.tool_calls)]

    async def chat(self, call: Call) -> web.StreamResponse:
        body = call.body
        if not isinstance(body, dict):
            return self.native_error(call, "400")
        model = call.model(self.models[0])
        if not body.get("messages"):
            return await self._load_or_unload(call, model, {"message": {"role": "assistant", "content": ""}})
        await self.before_generation(model)
        plan = make_plan(call.behaviour, self.name, tool_names(body), split_default=None, id_prefix="call_",
                         tool_result=last_tool_result(body))
        if body.get("stream", True):
            lines = [self._line(model, {"role": "assistant", "content": "", "thinking": p}) for p in plan.reasoning]
            lines += [self._line(model, {"role": "assistant", "content": p}) for p in plan.content]
            if plan.tool_calls:
                lines.append(self._line(model, {"role": "assistant", "content": "",
                                                "tool_calls": self._tool_calls(plan)}))
            final = self._final(call, model, plan, DONE_REASONS[plan.finish],
                                {"message": {"role": "assistant", "content": ""}})
            return await self._ndjson(call, plan, lines, final)
        if plan.fail:
            return await self._fail_whole(call)
        message: dict = {"role": "assistant", "content": plan.text}
        if plan.reasoning:
            message["thinking"] = "".join(plan.reasoning)
        if plan.tool_calls:
            message["tool_calls"] = self._tool_calls(plan)
        return json_response(self._final(call, model, plan, DONE_REASONS[plan.finish], {"message": message}))

    async def generate(self, call: Call) -> web.StreamResponse:
        body = call.body
        if not isinstance(body, dict):
            return self.native_error(call, "400")
        model = call.model(self.models[0])
        if not body.get("prompt"):
            return await self._load_or_unload(call, model, {"response": ""})
        await self.before_generation(model)
        plan = make_plan(call.behaviour, self.name, [], split_default=None, id_prefix="call_")
        if body.get("stream", True):
            lines = [self._gen_line(model, {"response": "", "thinking": p}) for p in plan.reasoning]
            lines += [self._gen_line(model, {"response": p}) for p in plan.content]
            final = self._final(call, model, plan, DONE_REASONS[plan.finish], {"response": ""})
            return await self._ndjson(call, plan, lines, final)
        if plan.fail:
            return await self._fail_whole(call)
        extra = {"response": plan.text}
        if plan.reasoning:
            extra["thinking"] = "".join(plan.reasoning)
        return json_response(self._final(call, model, plan, DONE_REASONS[plan.finish], extra))

    def _line(self, model: str, message: dict) -> bytes:
        return dumps({"model": model, "created_at": self.created_at, "message": message, "done": False}) + b"\n"

    def _gen_line(self, model: str, extra: dict) -> bytes:
        return dumps({"model": model, "created_at": self.created_at, **extra, "done": False}) + b"\n"

    async def _fail_whole(self, call: Call) -> web.StreamResponse:
        if call.behaviour.name == "disconnect_mid_stream":
            call.close_connection()
            return web.Response(status=200)
        return self.native_error(call, "500")

    async def _ndjson(self, call: Call, plan: Plan, lines: list[bytes], final: dict) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=NDJSON_HEADERS)
        await resp.prepare(call.request)
        if plan.fail == "disconnect":
            await write_frames(resp, lines, plan.delay)
            call.close_connection()
            return resp
        if plan.fail == "error":
            lines.append(dumps({"error": "an error was encountered while running the model: unexpected EOF"})
                         + b"\n")
        else:
            lines.append(dumps(final) + b"\n")
        await write_frames(resp, lines, plan.delay)
        return resp

