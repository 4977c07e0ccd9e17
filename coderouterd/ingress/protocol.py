"""Connection limits uvicorn does not give us, as a thin subclass of its httptools protocol.

uvicorn offers `limit_concurrency` (a plain-text 503 for every path, /healthz included), `timeout_keep_alive`
(armed only after a first response, so a connection that never sends a request stays forever) and nothing
for header size (httptools accumulates an unterminated header without bound). So, per connection:

- the request head (request line + headers) is counted before it reaches the parser: beyond
  `max_header_kb` in total, or `max_header_line_kb` on one line, the answer is 431 and the connection closes,
  so memory stays flat whatever the client sends;
- the head must arrive within `header_timeout_s` of the connection opening (or of its first byte after an
  idle keep-alive), the body within `body_timeout_s` of the head: slow clients get 408 and a close;
- chunked-request trailers count against `max_header_kb` too (they arrive after the body, where httptools
  accumulates them like headers), and are never added to the request's headers;
- after an early answer (a 401 before the body was read), the body timeout still closes a client that keeps
  sending;
- at `max_connections`, a new connection first takes the place of the oldest one that has not sent a complete
  request head (never a byte, a head still arriving, or idle between keep-alive requests): that one is closed.
  Idle or reconnecting sockets then cannot keep a request or /healthz out, while connections that are really
  working (a request head received, its answer not yet complete) keep the cap (issue 34, item 5);
- when every connection is working, beyond `max_connections` a connection is answered 503 in the caller's shape
  (except /healthz, which is served, so a supervisor still sees the daemon alive); beyond a reserve above it, a
  small health lane still answers /healthz (and 503 to anything else) and closes; beyond that, closed at once.
  Every connection over the cap must send its request head within `_OVER_CAP_HEAD_S`;
- an HTTP/1.0 client gets a streamed response close-delimited (HTTP/1.0 has no chunked encoding);
- an absolute-form request target (`POST http://name/v1/messages`) whose name is not the Host header's is a 400:
  uvicorn keeps only its path, so the app's Host check would never see the name the request was sent for; so is
  an HTTP/1.1 request without Host (except /healthz).

And two things per request that cost less here than in the app (bench/README.md, "Tail and big body"):

- a response's head leaves with its first body bytes: one write instead of two for a sized answer, and a
  stream's head goes out with its first event;
- the app learns that its client left through a callback (`DISCONNECT_HOOK` in the scope) instead of a task
  per request waiting on `receive()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .guard import error_body

if TYPE_CHECKING:
    from uvicorn._types import ASGI3Application, ASGIReceiveCallable, ASGISendCallable, ASGISendEvent, Scope

    from ..config.schema import ServerConfig

log = logging.getLogger("coderouterd")

# The scope key of a function the app calls with a callback to be called (once, on the loop) if the client
# goes away before the response is complete; called with None to drop it.
DISCONNECT_HOOK = "coderouter.on_disconnect"

# Connections over the cap that still get an answer (503, or /healthz) before new ones are simply closed.
_RESERVE_MIN = 16
# Beyond that reserve, a few more for /healthz only: idle sockets filling cap and reserve must not make the
# daemon look dead to its supervisor (README: /healthz still answers).
_HEALTH_LANE = 8
# How long a connection over the cap may take to send its request head (a probe sends it at once).
_OVER_CAP_HEAD_S = 1.0
_CAP_LOG_EVERY_S = 60.0


class Limits:
    """The connection limits in force: one instance shared by every connection, updated in place by a reload
    (the listener itself is never rebound)."""

    def __init__(self, server: ServerConfig, fd_cap: int | None = None) -> None:
        # fd_cap: the most connections the process's file-descriptor limit allows (see serve.raise_fd_limit)
        self.fd_cap = fd_cap
        # Connections waiting for a request head, oldest wait first (a dict keeps insertion order, and adding,
        # removing and taking the first are O(1)): the ones a new connection may replace at the cap.
        self.waiting: dict[GuardedHttpToolsProtocol, None] = {}
        self.closing = 0  # connections closed to make room whose connection_lost has not run yet
        self.update(server)

    def update(self, server: ServerConfig) -> None:
        self.max_header_bytes = server.max_header_kb * 1024
        self.max_header_line_bytes = server.max_header_line_kb * 1024
        self.header_timeout_s = server.header_timeout_s
        self.body_timeout_s = server.body_timeout_s
        self.keep_alive_s = server.keep_alive_s
        cap = server.max_connections
        if self.fd_cap is not None and cap > self.fd_cap:
            log.warning("[server] max_connections = %d exceeds what the open-files limit allows; using %d",
                        cap, self.fd_cap)
            cap = self.fd_cap
        self.max_connections = cap

    @property
    def hard_connections(self) -> int:
        return self.max_connections + max(_RESERVE_MIN, self.max_connections // 8)

    @property
    def health_lane_end(self) -> int:
        return self.hard_connections + _HEALTH_LANE

    def make_room(self) -> bool:
        """Close the connection that has waited longest for a request head. False when every connection is
        working."""
        if not self.waiting:
            return False
        proto = next(iter(self.waiting))
        del self.waiting[proto]
        proto.evict()
        return True


class _CapLog:
    """One warning when the cap is first hit, then at most one a minute: a flood must not flood the log."""

    last = float("-inf")
    refused = 0
    replaced = 0

    @classmethod
    def note(cls, *, replaced: bool = False) -> None:
        if replaced:
            cls.replaced += 1
        else:
            cls.refused += 1
        now = time.monotonic()
        if now - cls.last >= _CAP_LOG_EVERY_S:
            cls.last = now
            log.warning("connection limit reached: %d idle connections closed to let new ones in, %d new ones "
                        "answered 503 (so far); raise [server] max_connections if this load is legitimate",
                        cls.replaced, cls.refused)


def make_protocol(limits: Limits) -> type[HttpToolsProtocol]:
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"limits": limits})


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    limits: Limits

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # uvicorn's own, passed on as they came
        super().__init__(*args, **kwargs)
        # uvicorn annotates it int (its CLI option) and hands it to loop.call_later, which takes seconds as float.
        self.timeout_keep_alive = self.limits.keep_alive_s  # type: ignore[assignment]
        self._in_head = False  # between a message's first byte and the end of its headers
        self._head_bytes = 0  # raw bytes of an unfinished head
        self._line_bytes = 0  # raw bytes since the last newline of an unfinished head
        self._head_size = 0  # parsed size of the head (url + headers)
        self._head_problem: str | None = None
        self._refused = False
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._head_s = self.limits.header_timeout_s
        self._health_lane = False  # over cap and reserve: /healthz only, then close
        self._in_body = False  # between the end of the head and the end of the message
        self._body_seen = 0  # body bytes parsed from the chunk being fed
        self._frame_bytes = 0  # bytes that were not body since the last body bytes: chunk framing, trailers
        self._evicted = False  # closed to make room for a new connection at the cap

    # -- connection ------------------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn does
        super().connection_made(transport)
        lim = self.limits
        n = len(self.connections) - lim.closing
        if n > lim.max_connections and lim.make_room():
            _CapLog.note(replaced=True)
            n -= 1
        if n > lim.max_connections:
            _CapLog.note()
            if n > lim.health_lane_end:
                self._refused = True
                transport.abort()
                return
            self._health_lane = n > lim.hard_connections
            self.app = _over_capacity(self.app)
            self._head_s = min(self._head_s, _OVER_CAP_HEAD_S)
        lim.waiting[self] = None  # until its request head is complete
        # Also covers a connection that never sends a byte: it is closed when this fires.
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self.limits.waiting.pop(self, None)
        if self._evicted:
            self.limits.closing -= 1
        cycle = self.cycle
        super().connection_lost(exc)
        if isinstance(cycle, _WatchedCycle) and cycle.disconnected:
            callback = cycle.on_disconnect
            if callback is not None:
                cycle.on_disconnect = None
                callback()

    def evict(self) -> None:
        """Closed at once (no answer: no request was made) so that a new connection gets in."""
        self._evicted = True
        self._refused = True
        self.limits.closing += 1
        self._cancel_timers()
        self.transport.abort()  # not close(): a client that does not read could hold a flush for ever

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.timeout_keep_alive_task is not None:  # idle until the next request (none pipelined)
            self.limits.waiting[self] = None

    def _cancel_timers(self) -> None:
        for t in (self._head_timer, self._body_timer):
            if t is not None:
                t.cancel()
        self._head_timer = self._body_timer = None

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self._head_s, self._head_timed_out)

    # -- the request head ------------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        was_in_body = self._in_body
        self._body_seen = 0
        super().data_received(data)
        if self._refused:
            return
        if was_in_body and self._in_body:
            # What of this chunk was not body is framing or trailers: since the last body bytes it is bounded
            # like a head (httptools joins a trailer's pieces by concatenation, and before the app answers).
            extra = len(data) - self._body_seen
            self._frame_bytes = extra if self._body_seen else self._frame_bytes + extra
            if self._frame_bytes > self.limits.max_header_bytes:
                self._refuse(431, f"request trailers exceed {self.limits.max_header_bytes // 1024} KB")
            return
        if not self._in_head:
            return
        # The head is still unfinished after this chunk, so the chunk was head: count it before the parser is
        # fed again, which bounds what httptools buffers to one chunk beyond the limit.
        lim = self.limits
        self._head_bytes += len(data)
        nl = data.rfind(b"\n")
        self._line_bytes = self._line_bytes + len(data) if nl < 0 else len(data) - nl - 1
        if self._line_bytes > lim.max_header_line_bytes:
            self._refuse(431, f"a request header line exceeds {lim.max_header_line_bytes // 1024} KB")
        elif self._head_bytes > lim.max_header_bytes:
            self._refuse(431, f"request headers exceed {lim.max_header_bytes // 1024} KB")

    def send_400_response(self, msg: str) -> None:
        """A request the HTTP parser cannot read (bad framing, an invalid header, a bad chunk): a 400 in the
        caller's JSON error shape, as far as the path is known, instead of uvicorn's plain text."""
        if not self._refused:
            self._refuse(400, msg or "malformed HTTP request")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        self._head_bytes = self._line_bytes = self._head_size = 0
        self._head_problem = None
        self._arm_head_timer()

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_size += len(url)
        if len(self.url) > self.limits.max_header_line_bytes:
            self._head_problem = f"the request line exceeds {self.limits.max_header_line_bytes // 1024} KB"

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._refused or self._head_problem or not self._in_head:
            return  # not in the head: a trailer, counted in data_received and never a request header
        size = len(name) + len(value) + 4
        self._head_size += size
        lim = self.limits
        if size > lim.max_header_line_bytes:
            self._head_problem = f"a request header line exceeds {lim.max_header_line_bytes // 1024} KB"
        elif self._head_size > lim.max_header_bytes:
            self._head_problem = f"request headers exceed {lim.max_header_bytes // 1024} KB"
        else:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self.limits.waiting.pop(self, None)  # working from here: not to be replaced
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._refused:
            return
        if self._head_problem:
            return self._refuse(431, self._head_problem)
        # The Host forms the app cannot see (ingress/browsers.py checks the rest): an absolute-form target, and no
        # Host at all. Clients send Host first, so the common request pays a prefix test and one comparison.
        url = self.url
        if not url.startswith(b"/"):
            problem = target_problem(url, self.headers)
            if problem is not None:
                return self._refuse(400, problem)
        else:
            for name, _value in self.headers:
                if name == b"host":
                    break
            else:
                problem = host_missing(self.parser.get_http_version(), url)
                if problem is not None:
                    return self._refuse(400, problem)
        self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)
        self._in_body = True
        self._frame_bytes = 0
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is None:
            return
        if self._health_lane:
            cycle.keep_alive = False  # answered, then closed: the lane is for one probe at a time
        # Swapped before its task first runs, so the app's send is ours.
        cycle.__class__ = _CloseDelimitedCycle if self.scope.get("http_version") == "1.0" else _Cycle
        # Our own key in the scope (uvicorn types the scope as a TypedDict of the ASGI keys only).
        cast(dict[str, Any], self.scope)[DISCONNECT_HOOK] = cast(_WatchedCycle, cycle).watch_disconnect

    def on_body(self, body: bytes) -> None:
        self._body_seen += len(body)
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_body = False
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        if not self._refused:
            super().on_message_complete()

    # -- timeouts and refusals -------------------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._refused or self.transport.is_closing():
            return
        if self._in_head:
            self._refuse(408, f"request headers not received within {self._head_s:g} s")
        elif self.cycle is None:
            self.transport.close()  # connected and never sent a byte: close, as an idle keep-alive would be

    def _body_timed_out(self) -> None:
        self._body_timer = None
        cycle = self.cycle
        if cycle is None or not cycle.more_body:
            return
        if cycle.response_complete:
            # Answered early (a 401 before the body was read) and the client is still sending: the body timeout
            # holds, or a client trickling bytes would keep the connection forever.
            self._refused = True
            self.transport.close()
            return
        if cycle.response_started:  # an answer on its way: its end decides
            self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timed_out)
            return
        self._refuse(408, f"request body not received within {self.limits.body_timeout_s:g} s")

    def _refuse(self, status: int, message: str) -> None:
        """Answer in the caller's shape (as far as the path is known) and close; the parser is not fed again."""
        self._refused = True
        self._in_head = False
        self._cancel_timers()
        url = getattr(self, "url", None) or b""
        path = _path_of(url)[:200].decode("latin-1", "replace")
        openai = path.startswith("/v1/chat")
        error_type = "invalid_request_error" if openai or status in (400, 431) else "timeout_error"
        body = error_body(path, status, message, error_type)
        reason = {400: b"Bad Request", 408: b"Request Timeout",
                  431: b"Request Header Fields Too Large"}.get(status, b"Error")
        head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                b"connection: close\r\n\r\n" % (status, reason, len(body)))
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the app, if it is reading the body, sees the client gone
            self.cycle.message_event.set()
        if not self.transport.is_closing():
            self.transport.write(head + body)
            self.transport.close()


def _split_target(url: bytes) -> tuple[bytes, bytes] | None:
    """An absolute-form request target (`http://name:port/path?q`) as (authority, the rest), else None."""
    scheme, sep, rest = url.partition(b"://")
    if not sep or scheme.lower() not in (b"http", b"https"):
        return None
    end = len(rest)
    for c in b"/?#":
        i = rest.find(bytes((c,)))
        if 0 <= i < end:
            end = i
    return rest[:end], rest[end:]


def _path_of(url: bytes) -> bytes:
    """The path part of a request target, absolute-form or not (for the error's shape)."""
    split = _split_target(url)
    return url if split is None else split[1]


def target_problem(url: bytes, headers: list[tuple[bytes, bytes]]) -> str | None:
    """Why an absolute-form target cannot be served, or None. `http://name/path` is what a client sends to a
    proxy, and it names a host of its own: unless it is the one Host header's, which name the request is for
    depends on who reads it (uvicorn keeps only the path, so the Host check would see the other name). Browsers
    never send it to a server; the Host check (ingress/browsers.py) then reads the Host, which is the target's."""
    split = _split_target(url)
    if split is None:
        return None  # `*` and the like: uvicorn's parser answers those
    authority = split[0].strip().lower()
    hosts = [v.strip().lower() for k, v in headers if k == b"host"]
    if hosts == [authority]:
        return None
    named = authority.decode("latin-1")[:100]
    given = ", ".join(repr(h.decode("latin-1")[:100]) for h in hosts) or "none"
    return (f"the request target names host {named!r} but the Host header says {given}: send the path alone "
            "(origin-form), with the Host header naming this server")


def host_missing(http_version: str, url: bytes) -> str | None:
    """Why a request without a Host header is refused, or None. RFC 9112 3.2: an HTTP/1.1 request must carry one
    (every browser and SDK does); only HTTP/1.0 may leave it out. /healthz stays open to any prober."""
    if http_version == "1.0" or url == b"/healthz" or url.startswith(b"/healthz?"):
        return None
    return "an HTTP/1.1 request must carry a Host header"


def _over_capacity(app: ASGI3Application) -> ASGI3Application:
    """The app seen by a connection beyond the cap: /healthz as usual, everything else a 503 and a close."""

    async def over_capacity(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http" or scope["path"] == "/healthz":
            return await app(scope, receive, send)
        body = error_body(scope["path"], 503, "coderouterd is at its connection limit; retry shortly",
                          "overloaded_error" if not scope["path"].startswith("/v1/chat") else "server_error")
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", b"1"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

    return over_capacity


class _HeadHeld:
    """The connection's transport, except that a response head written while `hold` is set waits for the first
    body write and leaves with it."""

    __slots__ = ("transport", "hold", "head")

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.hold = False
        self.head = b""

    def write(self, data: bytes) -> None:
        if self.hold:
            self.hold = False
            self.head = data
            return
        if self.head:
            data = self.head + data
            self.head = b""
        self.transport.write(data)

    def flush(self) -> None:
        """A stream's head, if no body write took it along in the same turn of the loop."""
        if self.head:
            head, self.head = self.head, b""
            if not self.transport.is_closing():
                self.transport.write(head)

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)


class _WatchedCycle(RequestResponseCycle):
    """uvicorn's cycle with the app's disconnect callback (called by GuardedHttpToolsProtocol.connection_lost)."""

    on_disconnect: Callable[[], object] | None = None

    def watch_disconnect(self, callback: Callable[[], object] | None) -> None:
        self.on_disconnect = callback


class _Cycle(_WatchedCycle):
    """The response head sent along with the first body bytes: one write for a sized response, and for a
    stream's head and first event (see the module's docstring)."""

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started and message["type"] == "http.response.start" \
                and self.scope["method"] != "HEAD":
            held = _HeadHeld(self.transport)
            self.transport = cast(asyncio.Transport, held)  # it forwards everything else to the real one
            held.hold = True
            try:
                await super().send(message)
            finally:
                held.hold = False
                if not held.head:  # nothing held (the client left meanwhile): back to the real one
                    self.transport = held.transport
            if held.head and not any(name == b"content-length" for name, _v in message.get("headers", ())):
                # A stream: its first event normally follows in this same turn and takes the head along;
                # if not (a held stream that pings later), the head leaves on the loop's next turn anyway.
                asyncio.get_running_loop().call_soon(held.flush)
            return
        await super().send(message)
        if self.response_complete and type(self.transport) is _HeadHeld:
            self.transport = self.transport.transport


class _CloseDelimitedCycle(_WatchedCycle):
    """HTTP/1.0 has no chunked encoding: a response without a length is sent raw and ended by closing."""

    _close_delimited = False

    async def send(self, message: ASGISendEvent) -> None:
        if not self.response_started and message["type"] == "http.response.start":
            names = {n.lower() for n, _ in message.get("headers", [])}
            if b"content-length" not in names and self.scope["method"] != "HEAD":
                self._close_delimited = True
                self.chunked_encoding = False
                self.keep_alive = False
            return await super().send(message)
        if self._close_delimited and message["type"] == "http.response.body" and not self.response_complete:
            if self.disconnected:
                return
            if self.flow.write_paused:
                await self.flow.drain()
            body = message.get("body", b"")
            if body:
                self.transport.write(body)
            if not message.get("more_body", False):
                self.response_complete = True
                self.message_event.set()
                self.transport.close()
                self.on_response()
            return
        return await super().send(message)

