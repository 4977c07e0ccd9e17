"""Fake LM Studio: OpenAI ``/v1`` routes plus REST v0 (model states) and v1 (instances, load, unload).

Options: ``loaded`` (models with one instance at start), ``context_length`` (max and loaded context).
A chat for a model without an instance loads one first (JIT), waiting ``load_delay``.
"""

import asyncio

from aiohttp import web

from .behaviour import Call, json_response
from .openai_server import OpenAIFake


class LMStudioFake(OpenAIFake):
    kind = "lmstudio"

    def configure(self) -> None:
        self.context_length = int(self.options.get("context_length", 32768))
        # model key -> instance ids; a second load of the same key makes a second instance, as LM Studio does.
        self.instances: dict[str, dict[str, int]] = {m: {m: self.context_length}
                                                     for m in self.options.get("loaded", ())}
        super().configure()

    def setup_routes(self) -> None:
        self.add_openai_routes()
        self.route("GET", "/api/v0/models", self.v0_models)
        self.route("GET", "/api/v1/models", self.v1_models)
        self.route("POST", "/api/v1/models/load", self.load)
        self.route("POST", "/api/v1/models/unload", self.unload)

    async def before_generation(self, model: str) -> None:
        if not self.instances.get(model):
            await self._load(model)

    async def _load(self, model: str, context_length: int | None = None) -> str:
        if self.load_delay > 0:
            await asyncio.sleep(self.load_delay)
        existing = self.instances.setdefault(model, {})
        instance_id, n = model, 1
        while instance_id in existing:
            n += 1
            instance_id = f"{model}:{n}"
        existing[instance_id] = context_length or self.context_length
        return instance_id

    def _not_found(self, what: str) -> web.Response:
        return json_response({"error": {"type": "not_found", "message": f"{what} not found"}}, 404)

    async def v0_models(self, call: Call) -> web.StreamResponse:
        data = [{"id": m, "object": "model", "type": "llm", "publisher": "fake", "arch": "qwen3moe",
                 "compatibility_type": "gguf", "quantization": "Q4_K_M",
                 "state": "loaded" if self.instances.get(m) else "not-loaded",
                 "max_context_length": self.context_length} for m in self.models]
        return json_response({"object": "list", "data": data})

    async def v1_models(self, call: Call) -> web.StreamResponse:
        models = [{
            "type": "llm", "publisher": "fake", "key": m, "display_name": m, "architecture": "qwen3moe",
            "quantization": {"name": "Q4_K_M", "bits_per_weight": 4.5}, "size_bytes": 18_556_700_000,
            "params_string": "30B", "format": "gguf", "max_context_length": self.context_length,
            "loaded_instances": [{"id": i, "config": {"context_length": ctx}}
                                 for i, ctx in self.instances.get(m, {}).items()],
            "capabilities": {"vision": False, "trained_for_tool_use": True},
        } for m in self.models]
        return json_response({"models": models})

    async def load(self, call: Call) -> web.StreamResponse:
        body = call.body if isinstance(call.body, dict) else {}
        model = body.get("model")
        if model not in self.models:
            return self._not_found(f"model {model!r}")
        context_length = int(body.get("context_length") or self.context_length)
        instance_id = await self._load(model, context_length)
        result = {"type": "llm", "instance_id": instance_id, "load_time_seconds": self.load_delay,
                  "status": "loaded"}
        if body.get("echo_load_config"):
            result["load_config"] = {"context_length": context_length}
        return json_response(result)

    async def unload(self, call: Call) -> web.StreamResponse:
        body = call.body if isinstance(call.body, dict) else {}
        instance_id = body.get("instance_id")
        for ids in self.instances.values():
            if instance_id in ids:
                del ids[instance_id]
                return json_response({"instance_id": instance_id})
        return self._not_found(f"instance {instance_id!r}")
