"""The HTTP client every upstream call goes through (requests, health probes, model lists, model control, slot
calls): an aiohttp session that never follows a redirect, and that sends a request once more on a fresh
connection when the pooled one it took had been closed by the server without a word.

Redirects: aiohttp follows them by default and, on a redirect to another origin, drops only `Authorization`:
an Anthropic-kind provider's `x-api-key`, any configured header and the whole prompt (a 307/308 resends the
body) would go wherever the upstream points. A redirect is answered to the caller as it came; callers treat a
3xx as the upstream's failure (`errors.redirect_error`). Only `get` and `post` exist, so no call can bypass
this.

Stale connections: llama-server closes every connection after a streamed answer without saying so (no
`Connection: close`), so the next request on that pooled connection gets no response at all (seen on the real
server, tests/real). Nothing was answered, so nothing was served: the second send is the request's first real
try. A connection refused (nothing listens) is never retried."""

from __future__ import annotations

from collections.abc import Generator
from types import TracebackType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Unpack

    import aiohttp
    from aiohttp.client import _RequestOptions  # aiohttp's own type of a request's keywords


class _Request:
    """Awaitable (the response) and an async context manager (released on exit), like aiohttp's own."""

    __slots__ = ("_owner", "_method", "_url", "_kw", "_resp")

    def __init__(self, owner: UpstreamSession, method: str, url: str, kw: _RequestOptions) -> None:
        self._owner = owner
        self._method = method
        self._url = url
        self._kw = kw
        self._resp: aiohttp.ClientResponse | None = None

    async def _send(self) -> aiohttp.ClientResponse:
        session = self._owner._session
        try:
            return await session.request(self._method, self._url, **self._kw)
        except _dead_connection_errors() as e:  # evaluated only when something was raised: no import per call
            import aiohttp

            if isinstance(e, aiohttp.ClientConnectorError) or session.closed:
                raise  # a new connection refused (nothing listens), or the session itself was closed under it
            self._owner.stale_retries += 1
            return await session.request(self._method, self._url, **self._kw)

    def __await__(self) -> Generator[object, None, aiohttp.ClientResponse]:
        return self._send().__await__()

    async def __aenter__(self) -> aiohttp.ClientResponse:
        self._resp = await self._send()
        return await self._resp.__aenter__()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._resp is not None  # __aenter__ set it
        await self._resp.__aexit__(exc_type, exc, tb)


_DEAD_CONNECTION: tuple[type[Exception], ...] = ()


def _dead_connection_errors() -> tuple[type[Exception], ...]:
    """aiohttp's errors for a pooled connection the server had closed (aiohttp is loaded after start-up, so
    they are looked up on first need, then kept)."""
    global _DEAD_CONNECTION
    if not _DEAD_CONNECTION:
        import aiohttp

        _DEAD_CONNECTION = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
    return _DEAD_CONNECTION


def _no_redirects(kw: _RequestOptions) -> _RequestOptions:
    if "allow_redirects" in kw:
        raise TypeError("upstream calls never follow redirects: allow_redirects cannot be given")
    kw["allow_redirects"] = False
    return kw


class UpstreamSession:
    __slots__ = ("_session", "stale_retries")

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session
        self.stale_retries = 0  # requests sent again because their pooled connection was dead

    def get(self, url: str, **kw: Unpack[_RequestOptions]) -> _Request:
        return _Request(self, "GET", url, _no_redirects(kw))

    def post(self, url: str, **kw: Unpack[_RequestOptions]) -> _Request:
        return _Request(self, "POST", url, _no_redirects(kw))

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def close(self) -> None:
        await self._session.close()
