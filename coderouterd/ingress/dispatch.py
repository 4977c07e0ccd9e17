"""The proxy's HTTP surface as a raw ASGI app: no framework middleware on the hot path (measured, see
docs/decisions.md). Dispatch, body limits, auth, profile selection; the work itself is in routing/."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson

from ..ids import client_request_id, clip, new_id
from ..routing.record import CLIENT_DISCONNECTED, INTERNAL_ERROR
from ..routing.request import ClientRequest
from ..runtime import UnknownProfile
from ..state.refusals import UnnamedRefusal, gate_reason, refusal_event
from .asgi import App
from .auth import KEY_HEADERS, KeyRefusal, presented_key, scope_refusal, source_of
from .browsers import BrowserGuard, with_cors
from .gemini import GeminiResponder, admit_gemini, is_gemini, with_query_key
from .gemini import serve as serve_gemini
from .guard import BodyTooLarge, ClientLeft, answer_internal_error, describe_exception, read_body
from .model_list import model_ids
from .protocol import DISCONNECT_HOOK
from .responder import ClientGone, Responder
from .responses import ResponsesResponder, admit_responses
from .validate import depth_problem, validate_anthropic, validate_openai

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only
    from ..keys.model import TeamKey
    from ..routing.executor import Exchange
    from ..routing.record import RequestRecord
    from ..runtime import Runtime
    from .asgi import Message, Receive, Scope, Send

log = logging.getLogger("coderouterd.request")

_TEXT = [(b"content-type", b"text/plain; charset=utf-8")]

# An ASGI app (scope, receive, send), and what makes the dashboard's: the dashboard (ui/) sits above ingress (it
# uses ingress's key check and browser guard), so it is handed in by whoever serves the proxy, never imported here.
DashboardFactory = Callable[[], App]


def _caller_wire(path: str, scope: Scope) -> str:
    """Which wire's error shape an unrouted request gets: Anthropic's for its paths or when the caller sends
    Anthropic's headers (the SDK always sends anthropic-version; x-api-key is Anthropic's key header)."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    for k, _v in scope["headers"]:
        if k in (b"anthropic-version", b"x-api-key"):
            return "anthropic"
    return "openai"


_SENT = object()  # "an error answer was already sent" (a JSON body may itself be null)

# routing/executor.py is loaded after start-up (see Daemon._start_background); its Exchange class is looked up on
# the first request and kept (an import statement per request costs more than the lookup it saves).
_EXCHANGE: type[Exchange] | None = None


def _exchange_class() -> type[Exchange]:
    global _EXCHANGE
    from ..routing.executor import Exchange

    _EXCHANGE = Exchange
    return Exchange


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _client_left(record: RequestRecord) -> None:
    """The client went away before the response's closing bytes: the status being answered (499 when none) and
    `client_disconnected`. One that already had the whole answer (it closes right after [DONE]) was served:
    `end` keeps its success and the usage it recorded."""
    record.end(record.status or 499, CLIENT_DISCONNECTED)


class _TrackedSend:
    """The server's `send`, noting that a response started. A callable returning the server's own awaitable:
    no coroutine of ours per message."""

    __slots__ = ("send", "started")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False

    def __call__(self, message: Message) -> Awaitable[None]:
        self.started = True
        return self.send(message)


class ProxyApp:
    def __init__(self, daemon: Daemon, dashboard: DashboardFactory | None = None) -> None:
        self.daemon = daemon
        self._make_dashboard = dashboard  # None: no dashboard, /ui is a path like any other unknown one
        self._dashboard: App | None = None  # made on the first /ui request
        self._guard: tuple[object, int, BrowserGuard] | None = None  # (runtime, port, guard) last built

    def browser_guard(self, scope: Scope) -> BrowserGuard:
        """The Host/Origin/content-type checks for this config generation and the port the request came in on
        (built once per reload)."""
        runtime = self.daemon.runtime
        server = scope.get("server")
        port = server[1] if server else self.daemon.listen[1]
        cached = self._guard
        if cached is not None and cached[0] is runtime and cached[1] == port:
            return cached[2]
        s = runtime.config.server
        guard = BrowserGuard(self.daemon.listen[0], port, s.allowed_hosts, s.cors_origins)
        self._guard = (runtime, port, guard)
        return guard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            # The one guard at the edge: whatever escapes a handler is answered in the caller's shape (never
            # uvicorn's plain-text 500) and logged once, without request values.
            tracked = _TrackedSend(send)
            try:
                await self.http(scope, receive, tracked)
            except ClientLeft:
                return
            except Exception as e:
                log.error("%s %s failed: %s", scope.get("method"), scope.get("path", "")[:100],
                          describe_exception(e))
                await answer_internal_error(scope, send, tracked.started)
                return
            if not tracked.started:  # a handler that returned without answering is a bug, still answered properly
                log.error("%s %s: no response from its handler", scope.get("method"), scope.get("path", "")[:100])
                await answer_internal_error(scope, send, False)
        elif kind == "lifespan":
            await self.lifespan(receive, send)

    async def lifespan(self, receive: Receive, send: Send) -> None:
        try:
            await self._lifespan(receive, send)
        except asyncio.CancelledError:
            # A forced exit cancels the lifespan: the managed children must still be stopped (no orphans).
            await self.daemon.shutdown()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "lifespan.startup":
                try:
                    await self.daemon.startup()
                except Exception as e:  # a failed start must be reported, not hang the server
                    await send({"type": "lifespan.startup.failed", "message": str(e)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif msg["type"] == "lifespan.shutdown":
                await self.daemon.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"]
        method = scope["method"]
        if path != "/healthz" and path != "/ui" and not path.startswith("/ui/"):
            # /healthz stays open to any prober (it reads nothing and spends nothing); /ui checks Host itself and
            # may be opened from a link on another site (a navigation, which reads nothing it was not shown).
            guard = self.browser_guard(scope)
            refused, cors_origin = guard.refusal(path, method, scope["headers"])
            if refused is not None and refused.reason == "host":
                # A request carrying a valid key is no browser being rebound (the page would have to know the
                # secret): served under any Host name (docs/decisions.md, "N13"). A wrong key is refused as such.
                opened = await self._key_for_foreign_host(scope, send, path)
                if opened is None:
                    return None
                if opened:
                    refused, cors_origin = guard.refusal(path, method, scope["headers"], host_checked=False)
            if refused is not None:
                refusals = self.daemon.browser_refused
                refusals[refused.reason] = refusals.get(refused.reason, 0) + 1
                r = GeminiResponder(send, new_id("req")) if is_gemini(path, scope) else \
                    Responder(send, _caller_wire(path, scope), new_id("req"))
                return await r.error(refused.status, refused.message, error_type=refused.error_type)
            if cors_origin is not None:
                if method == "OPTIONS":
                    return await _preflight(send, cors_origin, scope)
                send = with_cors(send, cors_origin)
        if path.startswith(("/v1beta/", "/v1/models")) and is_gemini(path, scope):
            return await serve_gemini(self, scope, receive, send)
        if method == "POST":
            if path == "/v1/messages":
                return await self.proxy(scope, receive, send, "anthropic")
            if path == "/v1/chat/completions":
                return await self.proxy(scope, receive, send, "openai")
            if path == "/v1/responses":
                return await self.proxy(scope, receive, send, "responses")
            if path == "/v1/messages/count_tokens":
                return await self.count_tokens(scope, receive, send)
        elif method in ("GET", "HEAD"):
            if path == "/healthz":
                return await _plain(send, 200, b'{"status":"ok"}', json=True)
            if path == "/":
                return await _plain(send, 200, b"coderouterd is running\n", head=method == "HEAD")
            if path == "/v1/models":
                return await self.models(scope, send)
            if path == "/metrics":
                return await self.metrics(scope, send)
        if (path == "/ui" or path.startswith("/ui/")) and self._make_dashboard is not None:
            # After every proxy route: the model requests never pay for this comparison.
            return await self.dashboard(scope, receive, send)
        r = Responder(send, _caller_wire(path, scope), new_id("req"))
        known = path in ("/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/messages/count_tokens",
                         "/v1/models", "/healthz", "/", "/metrics")
        if known:
            await r.error(405, f"method {method} not allowed on {path}", error_type="invalid_request_error")
        else:
            await r.error(404, f"no such endpoint: {method} {path}", error_type="not_found_error")

    async def metrics(self, scope: Scope, send: Send) -> None:
        """GET /metrics. It names every team key with its requests, spend and refusals: once team keys are required
        it needs a valid key like every route, unless [metrics] bearer_token is set (then that token is the
        scraper's, checked by the endpoint). Operator keys alone leave it as it was (the token protects it)."""
        daemon = self.daemon
        if daemon.key_gate.registry.required and not daemon.runtime.config.metrics.bearer_token:
            r = Responder(send, _caller_wire(scope["path"], scope), new_id("req"))
            admitted, _key = await self.admit_key(scope, _headers(scope), r)
            if not admitted:
                return
        await daemon.metrics_endpoint(scope, send)

    async def dashboard(self, scope: Scope, receive: Receive, send: Send) -> None:
        """/ui: the read-only web dashboard, built (and its modules imported) on the first visit."""
        app = self._dashboard
        if app is None:
            assert self._make_dashboard is not None  # http() routes /ui here only when there is a dashboard
            app = self._dashboard = self._make_dashboard()
        await app(scope, receive, send)

    async def _key_for_foreign_host(self, scope: Scope, send: Send, path: str) -> bool | None:
        """A Host that is not one of ours, when keys are required: True when the request carries a valid key (it
        goes on), None after a wrong key was refused (401, counted against its source like any other), False
        when it carries none (the Host refusal stands). Only the refusal path pays for this."""
        gate = self.daemon.key_gate
        api_keys = self.daemon.runtime.config.server.api_keys
        if not gate.required(api_keys):
            return False
        gemini = is_gemini(path, scope)
        # A Gemini client may send its key as `?key=` (read as the header it stands for, as its routes do).
        headers = _headers(with_query_key(scope) if gemini else scope)
        if not presented_key(headers):
            return False
        refusal, _key = gate.admit(headers, api_keys)
        if refusal is None:
            return True
        wire = "gemini" if gemini else _caller_wire(path, scope)
        rid = new_id("req")
        r = GeminiResponder(send, rid) if gemini else Responder(send, wire, rid)  # the caller's shape
        await gate.refuse(r, refusal, source_of(scope), path)
        self._journal_refusal(rid, wire, refusal)
        return None

    async def _read_json(self, scope: Scope, receive: Receive, r: Responder, runtime: Runtime) -> tuple[Any, bytes]:
        """The request body parsed (any JSON value, `null` included: Any until validated) and its bytes, or _SENT
        after an error was sent."""
        limit = int(runtime.config.server.max_body_mb * 1024 * 1024)
        for k, v in scope["headers"]:
            if k == b"content-length":
                try:
                    if int(v) > limit:
                        await r.error(413, f"request body exceeds the {runtime.config.server.max_body_mb:g} MB limit",
                                      error_type="request_too_large")
                        return _SENT, b""
                except ValueError:
                    pass
                break
        try:
            raw = await read_body(receive, limit)
        except BodyTooLarge:
            await r.error(413, f"request body exceeds the {runtime.config.server.max_body_mb:g} MB limit",
                          error_type="request_too_large")
            return _SENT, b""
        try:
            return orjson.loads(raw), raw
        except orjson.JSONDecodeError as e:
            await r.error(400, f"request body is not valid JSON: {e}", error_type="invalid_request_error")
            return _SENT, b""

    async def _admit(self, scope: Scope, receive: Receive, send: Send, ingress: str, runtime: Runtime, *,
                     count_tokens: bool = False) -> tuple[ClientRequest, Responder, str] | None:
        """What every model request goes through first: auth, body limits, JSON, validation, profile.
        Returns (request, responder, profile), or None after an error in the caller's shape was sent."""
        headers = _headers(scope)
        rid = client_request_id(headers.get("x-request-id"))
        r: Responder
        if ingress == "responses":
            r = ResponsesResponder(send, rid)
        elif ingress == "gemini":
            r = GeminiResponder(send, rid, sse=b"alt=sse" in scope.get("query_string", b""))
        else:
            r = Responder(send, ingress, rid)
        gate = self.daemon.key_gate
        api_keys = runtime.config.server.api_keys
        key = None
        if api_keys or gate.registry.required:
            refusal, key = gate.admit(headers, api_keys)
            if refusal is not None:
                await gate.refuse(r, refusal, source_of(scope), scope["path"])
                self._journal_refusal(rid, ingress, refusal)
                return None
            # The client's key opened this door and is nobody else's: it never goes upstream, even to a provider
            # with forward_client_key (that is for a client holding the upstream's own key).
            for h in KEY_HEADERS:
                headers.pop(h, None)
        body, raw = await self._read_json(scope, receive, r, runtime)
        if body is _SENT:
            return None
        native = None
        gemini = None
        param = None
        if ingress == "anthropic":
            problem = validate_anthropic(body, count_tokens=count_tokens, raw=raw)
        elif ingress == "responses":
            # The router works on the chat translation; the client's own body stays in `native`.
            problem = depth_problem(body, raw) if type(body) is dict else None
            if not problem:
                native, problem, param = admit_responses(body)
            if native is not None:
                native.raw = raw
                assert isinstance(r, ResponsesResponder)  # ingress == "responses" made it one, above
                r.rq = native
                body = native.chat
        elif ingress == "gemini":
            gemini, problem, param = admit_gemini(body, raw, scope, count_tokens=count_tokens)
            if gemini is not None:
                assert isinstance(r, GeminiResponder)  # ingress == "gemini" made it one, above
                r.rq = gemini
                body = gemini.chat
        else:
            problem = validate_openai(body, raw=raw)
        if problem:
            await r.error(400, problem, error_type="invalid_request_error", param=param or problem.split(":")[0])
            return None
        model = body.get("model") or ""
        try:
            profile = runtime.select_profile(headers.get("x-coderouter-profile"), model, self.daemon.active_profile)
        except UnknownProfile as e:
            await r.error(400, str(e), error_type="invalid_request_error", extra={"valid_profiles": e.valid})
            return None
        if key is not None and (key.profiles or key.models):
            refusal = scope_refusal(key, profile, model)
            if refusal is not None:
                await gate.refuse(r, refusal, source_of(scope), scope["path"])
                self._journal_refusal(rid, ingress, refusal, model=model, profile=profile)
                return None
        req = ClientRequest(ingress=ingress, body=body, raw=raw, headers=headers,
                            stream=bool(body.get("stream")) and not count_tokens, model=model, request_id=rid,
                            native=native or gemini, key=key)
        return req, r, profile

    async def admit_key(self, scope: Scope, headers: dict[str, str], r: Responder) -> tuple[bool, TeamKey | None]:
        """The key check of a route that reads but does not spend (the model lists): (admitted, the team key that
        admitted it). A refusal was answered in `r`'s shape when not admitted."""
        gate = self.daemon.key_gate
        api_keys = self.daemon.runtime.config.server.api_keys
        if not (api_keys or gate.registry.required):
            return True, None
        refusal, key = gate.admit(headers, api_keys)
        if refusal is not None:
            await gate.refuse(r, refusal, source_of(scope), scope["path"])
            return False, None
        return True, key

    def _journal_refusal(self, rid: str, ingress: str, refusal: KeyRefusal, *, model: str = "",
                         profile: str = "") -> None:
        """Who spent what counts refusals too (state/refusals.py): one naming a key is journaled with it; one that
        names none only counted (anyone reaching the port could fill the journal with those)."""
        reason = gate_reason(refusal.reason)
        publish = self.daemon.telemetry.publish
        if refusal.key is None:
            publish(UnnamedRefusal(reason=reason))
            return
        publish(refusal_event(request_id=rid, ingress=ingress, status=refusal.status, reason=reason,
                              key_name=refusal.key, model=clip(model), profile=profile))

    async def proxy(self, scope: Scope, receive: Receive, send: Send, ingress: str) -> None:
        # Counted from the first byte to the last: `coderouter_requests_in_flight` answers "is anything stuck?".
        in_flight = self.daemon.in_flight
        in_flight[ingress] = in_flight.get(ingress, 0) + 1
        try:
            await self._proxy(scope, receive, send, ingress)
        finally:
            in_flight[ingress] -= 1

    async def _proxy(self, scope: Scope, receive: Receive, send: Send, ingress: str) -> None:
        daemon = self.daemon
        runtime = daemon.runtime  # this request keeps this generation even if a reload swaps it meanwhile
        admitted = await self._admit(scope, receive, send, ingress, runtime)
        if admitted is None:
            return
        req, r, profile = admitted
        rid = req.request_id
        Exchange = _EXCHANGE or _exchange_class()
        after = daemon.after_response
        ex = Exchange(req, r, runtime=runtime, router=daemon.router, profile=profile,
                      before_upstream=after.while_waiting)
        record = ex.record
        try:
            answered = await daemon.guard_request(ex)
        except BaseException:  # a guard that raised (or a cancellation) after the key's limits admitted it
            if req.limits is not None:
                daemon.key_guard.release(req, None, upstream=False)
            raise
        if answered:
            if req.limits is not None:  # admitted under its key's limits, then answered by another guard
                daemon.key_guard.release(req, None, upstream=False)
            after.defer(daemon.finish, record)
            return
        task = asyncio.current_task()
        # Our protocol (ingress/protocol.py) calls back when the client leaves, so a hung upstream is dropped
        # at once: no task per request to watch for it. Absent only when the app is driven without our server.
        hook = scope.get(DISCONNECT_HOOK)
        if hook is not None and task is not None:
            hook(lambda: task.cancel() if not r.finished else None)
        serving = daemon.requests_now  # the dashboard's in-flight list (admin/inflight.py)
        serving[rid] = record
        try:
            await ex.run()
        except ClientGone:
            _client_left(record)
        except asyncio.CancelledError:
            if not r.finished:
                _client_left(record)
                # The client left: swallow the cancellation so the server finishes this cycle quietly.
                if task is not None and task.cancelling():
                    task.uncancel()
            else:
                raise
        except Exception as e:  # a bug must cost one request, never the daemon
            log.error("request %s failed: %s", rid, describe_exception(e))
            record.end(500, INTERNAL_ERROR)
            if not r.finished:
                try:
                    await r.error(500, f"internal error in coderouterd: {type(e).__name__}", kind="api_error",
                                  headers={"x-coderouter-profile": record.profile_name,
                                           "x-coderouter-attempts": record.attempts_header()})
                except ClientGone:
                    pass
        finally:
            if serving.get(rid) is record:  # a client may reuse an id: only this request's own entry goes
                del serving[rid]
            if hook is not None:
                hook(None)
            if req.limits is not None:  # its key's slot is free the moment it ends, not when bookkeeping runs
                # Every attempt at an upstream is recorded (served, failed or abandoned): none, no token used.
                daemon.key_guard.release(req, record.usage, upstream=bool(record.attempts))
        after.defer(daemon.guard_after_answer, ex)
        after.defer(daemon.finish, record)
        if not r.headers_sent and record.error_class == CLIENT_DISCONNECTED:
            raise ClientLeft  # nothing was answered because the client left: the edge guard stays quiet

    async def count_tokens(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = self.daemon.runtime
        admitted = await self._admit(scope, receive, send, "anthropic", runtime, count_tokens=True)
        if admitted is None:
            return
        req, r, profile = admitted
        from .tokens import count_tokens

        n, source = await count_tokens(req, runtime, self.daemon.router, profile)
        r.add_header("x-coderouter-token-count", source)
        await r.json(200, orjson.dumps({"input_tokens": n}))

    async def models(self, scope: Scope, send: Send) -> None:
        headers = _headers(scope)
        runtime = self.daemon.runtime
        anthropic = "anthropic-version" in headers
        r = Responder(send, "anthropic" if anthropic else "openai", new_id("req"))
        admitted, key = await self.admit_key(scope, headers, r)
        if not admitted:
            return
        ids = model_ids(runtime, key)
        now = int(time.time())
        if anthropic:
            data = [{"type": "model", "id": i, "display_name": f"{i} (coderouter {src})",
                     "created_at": "2026-01-01T00:00:00Z"} for i, src in ids]
            body = {"data": data, "has_more": False, "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None}
        else:
            body = {"object": "list", "data": [{"id": i, "object": "model", "created": now, "owned_by": src}
                                                for i, src in ids]}
        await r.json(200, orjson.dumps(body))


async def _preflight(send: Send, origin: bytes, scope: Scope) -> None:
    requested = next((v for k, v in scope["headers"] if k == b"access-control-request-headers"), None)
    await send({"type": "http.response.start", "status": 204,
                "headers": BrowserGuard.preflight_headers(origin, requested)})
    await send({"type": "http.response.body", "body": b""})


async def _plain(send: Send, status: int, body: bytes, *, json: bool = False, head: bool = False) -> None:
    hs = [(b"content-type", b"application/json")] if json else list(_TEXT)
    hs.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": hs})
    await send({"type": "http.response.body", "body": b"" if head else body})
