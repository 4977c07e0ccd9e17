"""The daemon's client for what coderouterd/servers/ knows how to ask a provider's server: a GET and a POST over
the provider's own pool and headers, every answer read within a cap. servers/ performs no I/O of its own; this
is what it is handed in the daemon (corectl doctor hands it httpx, the unit tests plain dicts)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import orjson

from ..servers.llamacpp import LlamaServer
from .limits import MAX_AUX_BYTES, MAX_IGNORED_BYTES, BodyTooLarge, read_at_most, read_capped

if TYPE_CHECKING:
    from ..servers.base import Get
    from ..servers.llamacpp import PostStatus
    from .provider import Provider


def getter(provider: Provider) -> Get:
    """GET a path under the server's root: (status, JSON or None). Raises aiohttp/OS errors when nothing answers;
    the caller bounds the time."""
    headers = provider.adapter.headers()
    root = provider.root_url

    async def get(path: str) -> tuple[int, Any]:
        async with provider.session().get(root + path, headers=headers) as r:
            if r.status >= 300:  # an error, or a redirect (not followed): its body says nothing we use
                await read_at_most(r, MAX_IGNORED_BYTES)
                return r.status, None
            try:
                return r.status, orjson.loads(await read_capped(r, MAX_AUX_BYTES, f"{path} answer"))
            except (orjson.JSONDecodeError, BodyTooLarge):
                return r.status, None

    return get


def poster(provider: Provider) -> PostStatus:
    """POST JSON to a path under the server's root within `timeout`: (status, JSON or None). An error status is an
    answer; raises OSError (aiohttp's errors are OSErrors) or TimeoutError when nothing answered in time."""
    headers = provider.adapter.headers(json=True)
    root = provider.root_url

    async def post(path: str, body: dict, timeout: float) -> tuple[int, Any]:
        import aiohttp

        try:
            async with asyncio.timeout(timeout):
                async with provider.session().post(root + path, data=orjson.dumps(body), headers=headers) as r:
                    if r.status >= 300:
                        await read_at_most(r, MAX_IGNORED_BYTES)
                        return r.status, None
                    try:
                        return r.status, orjson.loads(await read_capped(r, MAX_AUX_BYTES, f"{path} answer"))
                    except (orjson.JSONDecodeError, BodyTooLarge):
                        return r.status, None
        except aiohttp.ClientError as e:
            raise OSError(f"{type(e).__name__}: {e}") from e

    return post


def llama_server(provider: Provider) -> LlamaServer:
    """The provider's server as a llama-server (servers/llamacpp.py: the only code that speaks its API)."""
    return LlamaServer(getter(provider), poster(provider))
