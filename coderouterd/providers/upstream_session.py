"""The HTTP client every upstream call goes through (requests, health probes, model lists, model control, slot
calls): an aiohttp session that never follows a redirect.

aiohttp follows redirects by default and, on a redirect to another origin, drops only `Authorization`: an
Anthropic-kind provider's `x-api-key`, any configured header and the whole prompt (a 307/308 resends the body)
would go wherever the upstream points. A redirect is answered to the caller as it came; callers treat a 3xx as
the upstream's failure (`errors.redirect_error`). Only `get` and `post` exist, so no call can bypass this."""

from __future__ import annotations


class UpstreamSession:
    __slots__ = ("_session",)

    def __init__(self, session) -> None:
        self._session = session  # aiohttp.ClientSession

    def get(self, url: str, **kw):
        return self._session.get(url, allow_redirects=False, **kw)

    def post(self, url: str, **kw):
        return self._session.post(url, allow_redirects=False, **kw)

    @property
    def closed(self) -> bool:
        return self._session.closed

    async def close(self) -> None:
        await self._session.close()
