"""Model control on local backends: which models are available and loaded, load and unload.

Ollama: /api/tags (available), /api/ps (loaded), an empty /api/generate loads, keep_alive 0 unloads.
LM Studio: /api/v1/models (loaded_instances), /api/v1/models/load and /unload (REST v1, 0.4+), falling back to
/api/v0/models for the loaded state on older versions. Anything else: the OpenAI model list, no load state."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

LOAD_TIMEOUT_S = 600.0
_LIST_TIMEOUT_S = 10.0


class ModelControlError(Exception):
    pass


async def _get(provider, path: str):
    async with asyncio.timeout(_LIST_TIMEOUT_S):
        async with provider.session().get(provider.root_url + path, headers=provider.auth_headers()) as r:
            if r.status >= 400:
                return r.status, None
            return r.status, orjson.loads(await r.read())


async def _post(provider, path: str, body: dict, timeout: float):
    headers = {"content-type": "application/json", **provider.auth_headers()}
    async with asyncio.timeout(timeout):
        async with provider.session().post(provider.root_url + path, data=orjson.dumps(body), headers=headers) as r:
            raw = await r.read()
            data = None
            for line in raw.splitlines():  # Ollama may answer NDJSON; the last object is the result
                if line.strip():
                    try:
                        data = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        pass
            if r.status >= 400:
                msg = error_message(data) or raw[:200].decode("utf-8", "replace").strip()
                raise ModelControlError(f"HTTP {r.status}: {msg or 'no detail'}")
            return data


def error_message(data) -> str | None:
    """The human message in a backend's error body: {"error": "..."} (Ollama), {"error": {"message": ...}}
    (OpenAI, LM Studio), {"message": ...}; never the dict itself."""
    if not isinstance(data, dict):
        return None
    err = data.get("error", data)
    if isinstance(err, str):
        return err
    if isinstance(err, dict):
        msg = err.get("message") or err.get("error")
        if isinstance(msg, str):
            return msg
    return None


async def detect_backend(provider) -> str:
    """ollama | lmstudio | openai, by asking the backend's own endpoints."""
    if provider.adapter.model_backend:
        return provider.adapter.model_backend
    try:
        status, _ = await _get(provider, "/api/version")
        if status == 200:
            return "ollama"
        status, data = await _get(provider, "/api/v1/models")
        if status == 200 and isinstance(data, dict) and "models" in data:
            return "lmstudio"
        status, data = await _get(provider, "/api/v0/models")
        if status == 200:
            return "lmstudio"
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        # Nothing answers at all: say so, rather than guess "openai" and fail later with a wrong reason.
        raise BackendUnreachable(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
    except orjson.JSONDecodeError:
        pass
    return "openai"


class BackendUnreachable(ModelControlError):
    """No HTTP answer at the provider's address (refused, timed out, DNS)."""


async def list_models(provider) -> dict:
    backend = await detect_backend(provider)
    models: list[dict] = []
    if backend == "ollama":
        _, tags = await _get(provider, "/api/tags")
        _, ps = await _get(provider, "/api/ps")
        loaded = {m.get("name") or m.get("model") for m in (ps or {}).get("models", [])}
        for m in (tags or {}).get("models", []):
            name = m.get("name") or m.get("model")
            models.append({"id": name, "loaded": name in loaded, "size": m.get("size"),
                           "details": m.get("details", {})})
    elif backend == "lmstudio":
        status, data = await _get(provider, "/api/v1/models")
        if status == 200 and data:
            for m in data.get("models", []):
                inst = m.get("loaded_instances") or []
                models.append({"id": m.get("key"), "loaded": bool(inst), "instances": [i.get("id") for i in inst],
                               "max_context_length": m.get("max_context_length"), "type": m.get("type")})
        else:
            _, data = await _get(provider, "/api/v0/models")
            for m in (data or {}).get("data", []):
                models.append({"id": m.get("id"), "loaded": m.get("state") == "loaded",
                               "max_context_length": m.get("max_context_length"), "type": m.get("type")})
    else:
        for mid in await provider.list_models(refresh=True):
            models.append({"id": mid, "loaded": None})
    return {"provider": provider.name, "backend": backend, "models": models}


async def load_model(provider, model: str) -> dict:
    backend = await detect_backend(provider)
    if backend == "ollama":
        data = await _post(provider, "/api/generate", {"model": model}, LOAD_TIMEOUT_S)
        return {"provider": provider.name, "backend": backend, "model": model, "loaded": True,
                "done_reason": (data or {}).get("done_reason")}
    if backend == "lmstudio":
        current = await list_models(provider)
        for m in current["models"]:
            if m["id"] == model and m.get("loaded"):
                # Loading again would create a second instance: LM Studio does not deduplicate.
                return {"provider": provider.name, "backend": backend, "model": model, "loaded": True,
                        "already_loaded": True}
        data = await _post(provider, "/api/v1/models/load", {"model": model}, LOAD_TIMEOUT_S)
        return {"provider": provider.name, "backend": backend, "model": model, "loaded": True,
                "instance_id": (data or {}).get("instance_id"),
                "load_time_seconds": (data or {}).get("load_time_seconds")}
    raise ModelControlError(f"{provider.name}: this backend has no model load API (OpenAI-compatible only)")


async def unload_model(provider, model: str) -> dict:
    backend = await detect_backend(provider)
    if backend == "ollama":
        data = await _post(provider, "/api/generate", {"model": model, "keep_alive": 0}, _LIST_TIMEOUT_S * 3)
        return {"provider": provider.name, "backend": backend, "model": model, "loaded": False,
                "done_reason": (data or {}).get("done_reason")}
    if backend == "lmstudio":
        current = await list_models(provider)
        instances = [i for m in current["models"] if m["id"] == model for i in m.get("instances") or [model]]
        if not instances:
            return {"provider": provider.name, "backend": backend, "model": model, "loaded": False,
                    "already_unloaded": True}
        for inst in instances:
            await _post(provider, "/api/v1/models/unload", {"instance_id": inst}, _LIST_TIMEOUT_S * 3)
        return {"provider": provider.name, "backend": backend, "model": model, "loaded": False,
                "instances": instances}
    raise ModelControlError(f"{provider.name}: this backend has no model unload API (OpenAI-compatible only)")
