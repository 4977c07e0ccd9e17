"""A small JSON-over-HTTP router for the admin socket, in raw ASGI.

The admin API has a dozen routes, JSON in and out; FastAPI cost ~0.3 s of CPU to import and ~7.5 MB of
resident memory in a daemon that runs all day, for validation we do by hand anyway."""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qs

import orjson

from .version import API_VERSION_HEADER

log = logging.getLogger("coderouterd.admin")

_PARAM = re.compile(r"\{(\w+)\}")


class AdminError(Exception):
    """An answer for the client: HTTP status, message and extra JSON fields."""

    def __init__(self, status: int, message: str, **extra) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


class AdminRequest:
    __slots__ = ("method", "path", "params", "query", "_body")

    def __init__(self, method: str, path: str, params: dict[str, str], query: dict[str, str], body: bytes) -> None:
        self.method = method
        self.path = path
        self.params = params
        self.query = query
        self._body = body

    async def body(self) -> bytes:
        return self._body

    def query_int(self, name: str, default: int) -> int:
        raw = self.query.get(name)
        if raw is None:
            return default
        try:
            return int(raw)
        except ValueError:
            raise AdminError(400, f"{name}: must be an integer, got {raw!r}") from None


Handler = Callable[[AdminRequest], Awaitable[dict | tuple[int, dict]]]


class AdminApp:
    def __init__(self, api_version: int | None = None) -> None:
        self._routes: list[tuple[str, re.Pattern, Handler]] = []
        # Sent on every answer, so a client can refuse a daemon it would misread (see apitype.py).
        self._extra_headers = [] if api_version is None else [(API_VERSION_HEADER.encode(), str(api_version).encode())]

    def route(self, method: str, pattern: str) -> Callable[[Handler], Handler]:
        regex = re.compile("^" + _PARAM.sub(r"(?P<\1>[^/]+)", pattern) + "$")

        def add(handler: Handler) -> Handler:
            self._routes.append((method, regex, handler))
            return handler

        return add

    def get(self, pattern: str) -> Callable[[Handler], Handler]:
        return self.route("GET", pattern)

    def post(self, pattern: str) -> Callable[[Handler], Handler]:
        return self.route("POST", pattern)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return
        chunks = []
        more = True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        method, path = scope["method"], scope["path"]
        status, payload = await self._dispatch(method, path, scope.get("query_string", b""), b"".join(chunks))
        body = orjson.dumps(payload)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()), *self._extra_headers]})
        await send({"type": "http.response.body", "body": body})

    async def _dispatch(self, method: str, path: str, query_string: bytes, body: bytes) -> tuple[int, dict]:
        allowed = False
        for route_method, regex, handler in self._routes:
            m = regex.match(path)
            if m is None:
                continue
            if route_method != method:
                allowed = True
                continue
            query = {k: v[-1] for k, v in parse_qs(query_string.decode("latin-1")).items()}
            req = AdminRequest(method, path, m.groupdict(), query, body)
            try:
                result = await handler(req)
            except AdminError as e:
                return e.status, {"error": str(e), **e.extra}
            except Exception as e:  # a bug in one admin call must not take the socket down
                log.exception("admin request failed")
                return 500, {"error": f"internal error in coderouterd: {type(e).__name__}: {e}"}
            if isinstance(result, tuple):
                return result
            return 200, result
        if allowed:
            return 405, {"error": f"method {method} not allowed on {path}"}
        return 404, {"error": f"no such admin endpoint: {method} {path}"}
