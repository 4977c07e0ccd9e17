"""Model control on local backends: which models are available and loaded, load and unload.

What each kind of server offers (Ollama's /api, LM Studio's REST API, none for llama-server, vLLM and other
OpenAI-compatible servers) lives in its module under coderouterd/servers/; this module runs it over the
provider's connection pool and shapes the admin API's answers. A kind without a model list of its own gets
the OpenAI model list, with no load state."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson

from .. import servers
from ..servers import Get, NoModelControl, ServerKind
from .limits import MAX_AUX_BYTES, BodyTooLarge, read_capped

if TYPE_CHECKING:
    import aiohttp

    from .provider import Provider

LOAD_TIMEOUT_S = 600.0
_LIST_TIMEOUT_S = 10.0


class ModelControlError(Exception):
    pass


async def _read(r: aiohttp.ClientResponse) -> bytes:
    try:
        return await read_capped(r, MAX_AUX_BYTES)
    except BodyTooLarge as e:
        raise ModelControlError(str(e)) from None


async def _get(provider: Provider, path: str) -> tuple[int, object]:
    async with asyncio.timeout(_LIST_TIMEOUT_S):
        async with provider.session().get(provider.root_url + path, headers=provider.auth_headers()) as r:
            if r.status >= 300:  # a redirect (not followed) is no answer either
                return r.status, None
            return r.status, orjson.loads(await _read(r))


async def _post(provider: Provider, path: str, body: dict, timeout: float) -> object:
    headers = {"content-type": "application/json", **provider.auth_headers()}
    async with asyncio.timeout(timeout):
        async with provider.session().post(provider.root_url + path, data=orjson.dumps(body), headers=headers) as r:
            raw = await _read(r)
            data = None
            for line in raw.splitlines():  # Ollama may answer NDJSON; the last object is the result
                if line.strip():
                    try:
                        data = orjson.loads(line)
                    except orjson.JSONDecodeError:
                        pass
            if r.status >= 300:  # a redirect is not followed (upstream_session.py): no result
                msg = error_message(data) or raw[:200].decode("utf-8", "replace").strip()
                raise ModelControlError(f"HTTP {r.status}: {msg or 'no detail'}")
            return data


def error_message(data: object) -> str | None:
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


def _getter(provider: Provider) -> Get:
    """The servers package's GET over this provider's pool: (status, JSON or None)."""

    async def get(path: str) -> tuple[int, object]:
        try:
            return await _get(provider, path)
        except orjson.JSONDecodeError:
            return 200, None

    return get


async def _kind(provider: Provider) -> ServerKind:
    """The kind of server behind the provider: the config's kind when it says (ollama), else recognised by the
    servers package's probes."""
    if provider.adapter.model_backend:
        return servers.by_name(provider.adapter.model_backend)
    try:
        return (await servers.detect(_getter(provider))).kind
    except servers.Unreachable as e:
        # Nothing answers at all: say so, rather than guess "openai" and fail later with a wrong reason.
        raise BackendUnreachable(str(e)) from None


async def detect_backend(provider: Provider) -> str:
    """The server kind's name: ollama | lmstudio | llama.cpp | vllm | openai (any other OpenAI-compatible)."""
    return (await _kind(provider)).name


class BackendUnreachable(ModelControlError):
    """No HTTP answer at the provider's address (refused, timed out, DNS)."""


async def list_models(provider: Provider) -> dict:
    kind = await _kind(provider)
    models = await kind.list_models(_getter(provider))
    if models is None:
        models = [{"id": mid, "loaded": None} for mid in await provider.list_models(refresh=True)]
    return {"provider": provider.name, "backend": kind.name, "models": models}


async def load_model(provider: Provider, model: str) -> dict:
    return await _control(provider, model, "load", LOAD_TIMEOUT_S)


async def unload_model(provider: Provider, model: str) -> dict:
    return await _control(provider, model, "unload", _LIST_TIMEOUT_S * 3)


async def _control(provider: Provider, model: str, action: str, timeout: float) -> dict:
    kind = await _kind(provider)

    async def post(path: str, body: dict, t: float) -> object:
        return await _post(provider, path, body, t)

    try:
        done = await getattr(kind, action)(_getter(provider), post, model, timeout)
    except NoModelControl:
        raise ModelControlError(f"this backend has no model {action} API "
                                "(OpenAI-compatible only)") from None
    return {"provider": provider.name, "backend": kind.name, "model": model, **done}
