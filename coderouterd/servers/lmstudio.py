"""LM Studio.

Recognised by its REST API: `GET /api/v1/models` (0.4+: `models[]` with `key`, `max_context_length` and
`loaded_instances[]` each with `config.context_length`) or, on older versions, `GET /api/v0/models` (`data[]`
with `state`, `loaded_context_length` when loaded, `max_context_length`). Load: `POST /api/v1/models/load`
(`{"model"}` → `instance_id`); unload: `POST /api/v1/models/unload` (`{"instance_id"}`); loading a model
twice makes a second instance. No slots. Cached prompt tokens: not reported. Context overflow reads "Trying
to keep the first N tokens when context the overflows. However, the model is loaded with context length of
only M tokens, which is not enough."."""

from __future__ import annotations

from .base import Answers, Get, Post, ServerKind, Window, positive_int, wording

V1 = "/api/v1/models"
V0 = "/api/v0/models"


def window_from(v1, v0, model: str) -> Window:
    """The loaded context of `model` (the smallest instance's), else its maximum (an upper bound: LM Studio
    loads it on demand with a context no larger)."""
    for m in (v1 or {}).get("models") or [] if isinstance(v1, dict) else []:
        if isinstance(m, dict) and m.get("key") == model:
            contexts = [positive_int((i.get("config") or {}).get("context_length"))
                        for i in m.get("loaded_instances") or [] if isinstance(i, dict)]
            loaded = [n for n in contexts if n]
            most = positive_int(m.get("max_context_length"))
            if loaded:
                return Window(min(loaded), "loaded instance", most)
            return Window(most, f"{model} is not loaded (it supports up to {most})" if most else "", most,
                          firm=False)
    for m in (v0 or {}).get("data") or [] if isinstance(v0, dict) else []:
        if isinstance(m, dict) and m.get("id") == model:
            most = positive_int(m.get("max_context_length"))
            n = positive_int(m.get("loaded_context_length")) if m.get("state") == "loaded" else None
            if n:
                return Window(n, "loaded (/api/v0/models)", most)
            return Window(most, f"{model} is not loaded (it supports up to {most})" if most else "", most,
                          firm=False)
    return Window(None, "LM Studio did not describe the model (/api/v1/models)")


class LMStudio(ServerKind):
    name = "lmstudio"
    label = "LM Studio"
    default_port = 1234
    probe_paths = (V1, V0)
    cached_tokens = "not reported"
    overflow_markers = ("when context the overflows", "context length of only")
    overflow_wordings = (
        wording(r"keep the first (?P<prompt>[\d,]+) tokens.*context length of (?:only )?(?P<limit>[\d,]+)"),
    )

    def recognise(self, answers: Answers) -> bool:
        status, v1 = answers.get(V1, (0, None))
        if status == 200 and isinstance(v1, dict) and isinstance(v1.get("models"), list):
            return True
        status, v0 = answers.get(V0, (0, None))
        return status == 200 and isinstance(v0, dict) and isinstance(v0.get("data"), list)

    async def window(self, get: Get, model: str, answers: Answers, post: Post | None = None) -> Window:
        if not model:
            return Window(None)
        v1 = answers.get(V1) or await get(V1)
        v0 = answers.get(V0) or (0, None)
        w = window_from(v1[1] if v1[0] == 200 else None, v0[1] if v0[0] == 200 else None, model)
        # Not loaded: its maximum still bounds what any load will give, so it is safe to route by.
        return Window(w.tokens, w.source, w.trained) if w.tokens else w

    async def list_models(self, get: Get) -> list[dict] | None:
        status, data = await get(V1)
        out = []
        if status == 200 and data:
            for m in data.get("models", []):
                inst = m.get("loaded_instances") or []
                out.append({"id": m.get("key"), "loaded": bool(inst), "instances": [i.get("id") for i in inst],
                            "max_context_length": m.get("max_context_length"), "type": m.get("type")})
            return out
        _, data = await get(V0)
        for m in (data or {}).get("data", []):
            out.append({"id": m.get("id"), "loaded": m.get("state") == "loaded",
                        "max_context_length": m.get("max_context_length"), "type": m.get("type")})
        return out

    async def load(self, get: Get, post: Post, model: str, timeout: float) -> dict:
        for m in await self.list_models(get) or []:
            if m["id"] == model and m.get("loaded"):
                # Loading again would create a second instance: LM Studio does not deduplicate.
                return {"loaded": True, "already_loaded": True}
        data = await post("/api/v1/models/load", {"model": model}, timeout)
        return {"loaded": True, "instance_id": (data or {}).get("instance_id"),
                "load_time_seconds": (data or {}).get("load_time_seconds")}

    async def unload(self, get: Get, post: Post, model: str, timeout: float) -> dict:
        current = await self.list_models(get) or []
        instances = [i for m in current if m["id"] == model for i in m.get("instances") or [model]]
        if not instances:
            return {"loaded": False, "already_unloaded": True}
        for inst in instances:
            await post("/api/v1/models/unload", {"instance_id": inst}, timeout)
        return {"loaded": False, "instances": instances}


KIND = LMStudio()
