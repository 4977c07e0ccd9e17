"""The dashboard's HTTP surface under /ui, as raw ASGI (the proxy's dispatch hands it every /ui request).

Every answer goes through the same gate, in this order: the dashboard is enabled, the Host is one of ours
(guard.py), the key when api_keys are set. Only then is anything read. Every answer carries the security headers
(a strict CSP, no framing, no CORS). Nothing here changes the daemon: the only POST is the login form, which
sets a cookie.

Every data endpoint is an entry of the admin API's handler table (admin/handlers.py) marked for the browser, served
under its browser name by the same function the admin socket calls, and answers with its model (admin/apitype.py),
serialised by pydantic's own JSON writer; refusals are apitype.ErrorAnswer. An entry not marked for the browser is
refused here (403), even by its name. The browser's names: GET /ui/api/now, profiles, inflight, spend,
trends?range=, keys?range=, requests?profile=&provider=&outcome=&key=&limit=&before=&since=, requests/{id}.

The one answer that is no entry of the table is the live feed, GET /ui/api/events: a stream of server-sent events
(feed.py), whose items have apitype.FeedEvent's shape, written by orjson (see _events).
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote

import orjson
from pydantic import BaseModel, ValidationError, create_model

from ..admin import apitype, handlers
from ..admin.context import AdminError, Ctx, Status
from ..ingress.asgi import Receive, Scope, Send  # ASGI, as the proxy's dispatch calls us
from ..ingress.auth import presented_key, source_of
from ..ingress.browsers import BrowserGuard
from ..ingress.guard import BodyTooLarge, read_body
from ..ingress.protocol import DISCONNECT_HOOK
from .guard import SECURITY_HEADERS, UiAuth, allowed_hosts, host_allowed, origin_allowed

if TYPE_CHECKING:  # the daemon hands itself in; the dashboard reads it, never imports it at run time
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

Headers = list[tuple[bytes, bytes]]

log = logging.getLogger("coderouterd.ui")

STATIC = Path(__file__).parent / "static"
# Every file the page may load, by URL name: nothing else under static/ (or elsewhere) is ever served.
_ASSETS = {
    "app.js": ("app.js", b"text/javascript; charset=utf-8"),  # ES modules: app.js imports one per view
    "core.js": ("core.js", b"text/javascript; charset=utf-8"),
    "now.js": ("now.js", b"text/javascript; charset=utf-8"),
    "trends.js": ("trends.js", b"text/javascript; charset=utf-8"),
    "requests.js": ("requests.js", b"text/javascript; charset=utf-8"),
    "keys.js": ("keys.js", b"text/javascript; charset=utf-8"),
    "ui.css": ("ui.css", b"text/css; charset=utf-8"),
    "uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", b"text/javascript; charset=utf-8"),
    "uPlot.min.css": ("vendor/uPlot.min.css", b"text/css; charset=utf-8"),
    "uPlot.LICENSE.txt": ("vendor/LICENSE", b"text/plain; charset=utf-8"),
}
_MAX_LOGIN_BODY = 4096
PING_S = 15.0  # a comment line on an idle feed: proxies and the browser keep the stream open, dead ones show


class Answer(Exception):
    """An early answer (a refusal) from inside a handler."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


async def _send(send: Send, status: int, body: bytes, ctype: bytes, extra: Headers | None = None,
                cache: bytes = b"no-store", head: bool = False) -> None:
    hs = [(b"content-type", ctype), (b"content-length", str(len(body)).encode()), (b"cache-control", cache),
          *SECURITY_HEADERS, *(extra or [])]
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": b"" if head else body})


def _json(answer: BaseModel) -> bytes:
    """An answer as the admin endpoint serialises it (aliases: `global`), straight to bytes by pydantic-core (what
    model_dump_json does before decoding to str). A value JSON has no type for is written as its str()."""
    return type(answer).__pydantic_serializer__.to_json(answer, by_alias=True, fallback=str)


def _error(message: str) -> bytes:
    return _json(apitype.ErrorAnswer(error=message))


_QUERY_MODELS: dict[str, type[BaseModel]] = {}


def _parameters(h: handlers.Handler, given: dict[str, str]) -> dict[str, Any]:
    """The handler's parameters from the browser's query and path, validated against its own signature (the
    constraints the admin socket's FastAPI applies): a bad one is a 400 naming it. Unknown ones are ignored."""
    model = _QUERY_MODELS.get(h.path)
    if model is None:
        fields: dict[str, Any] = {p.name: (p.annotation, ... if p.default is p.empty else p.default)
                                  for p in h.parameters()}
        model = _QUERY_MODELS[h.path] = create_model(f"Query_{h.fn.__name__}", **fields)
    try:
        parsed = model.model_validate({k: v for k, v in given.items() if k in model.model_fields})
    except ValidationError as e:
        raise Answer(400, "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg'][:1].lower()}"
                                    f"{err['msg'][1:]}, got {str(err.get('input'))[:50]!r}"
                                    for err in e.errors())) from None
    return {name: getattr(parsed, name) for name in model.model_fields}


class DashboardApp:
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.auth = UiAuth()
        self._files: dict[str, tuple[bytes, bytes]] = {}  # name -> (content, its ETag)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        api = path.startswith("/ui/api/")
        try:
            await self._gate_and_route(scope, receive, send, path, api)
        except Answer as a:
            if api or a.status == 403:
                await _send(send, a.status, _error(a.message), b"application/json")
            else:
                await _send(send, a.status, (a.message + "\n").encode(), b"text/plain; charset=utf-8")

    async def _gate_and_route(self, scope: Scope, receive: Receive, send: Send, path: str, api: bool) -> None:
        server = self.daemon.runtime.config.server
        if not server.dashboard:
            raise Answer(404, "the dashboard is off ([server] dashboard = false)")
        for name in (b"host", b"origin"):
            if sum(1 for k, _v in scope["headers"] if k == name) > 1:
                # Which one counts would depend on who reads it (the dict below keeps the last): never guessed.
                raise Answer(400, f"more than one {name.decode().title()} header: a request must carry exactly one")
        headers = _headers(scope)
        port = (scope.get("server") or (None, self.daemon.listen[1]))[1]
        allowed = allowed_hosts(self.daemon.listen[0], port)
        if not host_allowed(headers.get("host"), allowed,
                            BrowserGuard(self.daemon.listen[0], port, server.allowed_hosts)
                            if server.allowed_hosts else None):
            # DNS rebinding: another site's page reaching us through the user's browser under its own name.
            raise Answer(403, "this Host is not served: open the dashboard as http://127.0.0.1:PORT/ui or "
                              "http://localhost:PORT/ui")
        method = scope["method"]
        if path == "/ui/login":
            return await self._login(scope, receive, send, method, headers, allowed, server.api_keys)
        if method not in ("GET", "HEAD") or (method == "HEAD" and api):
            raise Answer(405, f"method {method} not allowed on {path}: the dashboard is read-only")
        head = method == "HEAD"  # a link checker or `curl -I` asking whether the page is there
        if path.startswith("/ui/static/"):
            # The page's own code and styles (the login page needs them too): no data in them, so no key.
            return await self._asset(send, path[len("/ui/static/"):], headers, head)
        if not self.auth.authorized(headers, server.api_keys, self.daemon.keys):
            if presented_key(headers):  # a wrong key, not just a browser that has not logged in yet
                await self.daemon.key_gate.failed_elsewhere(source_of(scope), path)
            if api:
                raise Answer(401, "the dashboard needs a key: one of the server's api_keys or a team key "
                                  "(log in at /ui)")
            return await self._login_page(send, 401, "")
        if path in ("/ui", "/ui/"):
            return await self._asset_page(send, "index.html", headers, head)
        if not api:
            raise Answer(404, f"no such page: {path}")
        await self._api(scope, send, path[len("/ui/api/"):])

    # -- pages and files -------------------------------------------------------------------------------------

    async def _entry(self, name: str) -> tuple[bytes, bytes]:
        entry = self._files.get(name)
        if entry is None:
            # Read once, off the loop; a handful of small files, kept for the daemon's life. The ETag is their
            # content's hash: after an upgrade the browser fetches the new file, else it revalidates for free.
            data = await asyncio.to_thread((STATIC / name).read_bytes)
            entry = self._files[name] = (data, b'"%s"' % hashlib.sha256(data).hexdigest()[:20].encode())
        return entry

    async def _file(self, name: str) -> bytes:
        return (await self._entry(name))[0]

    async def _cached(self, send: Send, name: str, ctype: bytes, headers: dict[str, str], head: bool) -> None:
        data, etag = await self._entry(name)
        # no-cache: the browser keeps the file but asks each time; an unchanged file costs a 304 and no body.
        if etag.decode() in [t.strip() for t in headers.get("if-none-match", "").split(",")]:
            return await _send(send, 304, b"", ctype, [(b"etag", etag)], cache=b"no-cache", head=True)
        await _send(send, 200, data, ctype, [(b"etag", etag)], cache=b"no-cache", head=head)

    async def _asset(self, send: Send, name: str, headers: dict[str, str], head: bool) -> None:
        entry = _ASSETS.get(name)
        if entry is None:
            raise Answer(404, f"no such file: {name}")
        rel, ctype = entry
        await self._cached(send, rel, ctype, headers, head)

    async def _asset_page(self, send: Send, name: str, headers: dict[str, str], head: bool) -> None:
        await self._cached(send, name, b"text/html; charset=utf-8", headers, head)

    async def _login_page(self, send: Send, status: int, message: str, extra: Headers | None = None) -> None:
        page = (await self._file("login.html")).replace(b"<!--MESSAGE-->", html.escape(message).encode())
        await _send(send, status, page, b"text/html; charset=utf-8", extra)

    async def _login(self, scope: Scope, receive: Receive, send: Send, method: str, headers: dict[str, str],
                     allowed: frozenset[str], keys: list[str]) -> None:
        team = self.daemon.keys
        if method == "GET" or not (keys or team.required):
            # Nothing to log in to (no keys), or a bookmark of the form's target: the page.
            return await _send(send, 303, b"", b"text/plain", [(b"location", b"/ui")])
        if method != "POST":
            raise Answer(405, f"method {method} not allowed on /ui/login")
        if not origin_allowed(headers, allowed):
            raise Answer(403, "the login form must be posted from this dashboard's own page")
        try:
            body = await read_body(receive, _MAX_LOGIN_BODY)
        except BodyTooLarge:
            raise Answer(413, "the login form is larger than any key") from None
        key = (parse_qs(body.decode("latin-1")).get("key") or [""])[0]
        cookie = self.auth.login(key, keys, team)
        if cookie is None:
            # Counted and slowed like a wrong key on the proxy's routes: the form is no way around the throttle.
            await self.daemon.key_gate.failed_elsewhere(source_of(scope), "/ui/login")
            return await self._login_page(send, 401, "That key is not valid for this coderouterd (an operator "
                                                     "api_key or a team key that is active).")
        await _send(send, 303, b"", b"text/plain", [(b"location", b"/ui"), (b"set-cookie", cookie.encode())])

    # -- data ------------------------------------------------------------------------------------------------

    async def _api(self, scope: Scope, send: Send, name: str) -> None:
        d = self.daemon
        if name == "events":
            return await self._events(scope, send)
        found = handlers.find_browser(name)
        if found is None:
            h = handlers.find_any("GET", "/v1/" + name) or handlers.find_any("GET", "/" + name)
            if h is not None and h.browser is not None:
                raise Answer(404, f"no such endpoint: /ui/api/{name[:100]} (this answer is /ui/api/{h.browser})")
            if h is not None:
                # The browser flag is the table's, enforced here: the socket's own entries stay the socket's.
                raise Answer(403, f"{h.path} is served on the admin socket only, not to the browser")
            raise Answer(404, f"no such endpoint: /ui/api/{name[:100]}")
        h, path_params = found
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        params = _parameters(h, {**query, **{k: unquote(v) for k, v in path_params.items()}})
        # As on the admin socket (admin/server.py): what a request just answered left to record is recorded
        # before the page reads it, so a request is never missing from the list it was just answered for.
        d.after_response.drain()
        try:
            answer = await handlers.call(h, Ctx(d), params)
        except AdminError as e:
            raise Answer(e.status, str(e)) from None
        if isinstance(answer, Status):  # an answer in its model's shape that is not a 200
            return await _send(send, answer.status, orjson.dumps(answer.body, default=str), b"application/json")
        if not isinstance(answer, BaseModel):
            answer = h.model.model_validate(answer)
        await _send(send, 200, _json(answer), b"application/json")

    async def _events(self, scope: Scope, send: Send) -> None:
        feed = self.daemon.live
        viewer = feed.join()
        if viewer is None:
            raise Answer(503, f"the live feed already has its {feed.max_viewers} viewers (or is closing)")
        hook = scope.get(DISCONNECT_HOOK)
        if hook is not None:
            hook(viewer.close)  # the browser left: the loop below ends at once
        try:
            hs = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-store"), *SECURITY_HEADERS]
            await send({"type": "http.response.start", "status": 200, "headers": hs})
            await send({"type": "http.response.body", "body": b"retry: 3000\n: live\n\n", "more_body": True})
            while not viewer.closed:
                try:
                    await asyncio.wait_for(viewer.wake.wait(), PING_S)
                except TimeoutError:
                    await send({"type": "http.response.body", "body": b": ping\n\n", "more_body": True})
                    continue
                items, dropped = viewer.take()
                chunks = [b"event: dropped\ndata: %d\n\n" % dropped] if dropped else []
                # Each item is already apitype.FeedEvent's shape (feed.project; tests/unit/test_ui_feed.py holds the
                # two together): orjson writes it in ~1 us, where building the model on the loop costs ~7 us per item
                # per viewer.
                chunks += [b"event: %s\ndata: %s\n\n" % (i["kind"].encode(), orjson.dumps(i)) for i in items]
                if chunks:
                    # Awaits while the browser's socket is full: meanwhile its queue drops, the daemon never grows.
                    await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            feed.leave(viewer)
            if hook is not None:
                hook(None)


