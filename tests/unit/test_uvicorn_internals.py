"""The uvicorn internals the HTTP edge relies on are still there, with the shapes it expects.

`coderouterd/ingress/protocol.py` subclasses uvicorn's httptools protocol (overrides its parser callbacks,
reads and writes its fields, swaps the class of its response cycle and writes the cycle's fields), and
`coderouterd/admin/server.py` overrides `Server.capture_signals`. None of that is uvicorn's public API, so
pyproject.toml pins uvicorn to the range tested here (docs/decisions.md, "The edge"). An upgrade that
changes any of it fails here, naming the installed uvicorn version and what changed, instead of breaking
the edge silently (an override that uvicorn no longer calls fails no test of its own).
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import textwrap
import tomllib
from pathlib import Path

import uvicorn
from uvicorn.protocols.http import flow_control, httptools_impl
from uvicorn.server import Server, ServerState

from coderouterd.admin.server import ManagedServer
from coderouterd.ingress.protocol import (
    GuardedHttpToolsProtocol,
    Limits,
    _CloseDelimitedCycle,
    _Cycle,
    make_protocol,
)

ROOT = Path(__file__).resolve().parents[2]


def _tested_range() -> str:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return next(d for d in deps if d.startswith("uvicorn"))


def _fail(what: str) -> str:
    return (f"uvicorn {uvicorn.__version__} (pyproject.toml: {_tested_range()}): {what}. "
            "coderouterd/ingress/protocol.py and admin/server.py rely on this uvicorn internal; adapt them "
            "and the pin together (docs/decisions.md, 'The edge')")


def _params(func) -> list[str]:
    return [p for p in inspect.signature(func).parameters if p != "self"]


def _assigned_on_self(cls) -> set[str]:
    """Every `self.X = ...` (or `self.X: T = ...`) in the class's own methods: its instance fields."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    names = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign | ast.AugAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                names.add(t.attr)
    return names


def _calls_on_self(func) -> set[str]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"}


# The protocol's methods GuardedHttpToolsProtocol overrides and calls with super(), with their parameters.
PROTOCOL_METHODS = {
    "connection_made": ["transport"],
    "connection_lost": ["exc"],
    "data_received": ["data"],
    "send_400_response": ["msg"],
    "on_message_begin": [],
    "on_url": ["url"],
    "on_header": ["name", "value"],
    "on_headers_complete": [],
    "on_body": ["body"],
    "on_message_complete": [],
    "eof_received": [],
    "on_response_complete": [],
}
# Fields of the protocol it reads or writes (timeout_keep_alive and app are written; timeout_keep_alive_task,
# set by on_response_complete only when the connection goes idle, tells an idle keep-alive from a pipelined one).
PROTOCOL_FIELDS = {"timeout_keep_alive", "connections", "app", "loop", "cycle", "url", "scope", "transport",
                   "flow", "parser", "pipeline", "timeout_keep_alive_task", "headers"}
# Fields of the response cycle that _Cycle and _CloseDelimitedCycle read or write.
CYCLE_FIELDS = {"scope", "transport", "flow", "message_event", "on_response", "disconnected", "keep_alive",
                "more_body", "response_started", "response_complete", "chunked_encoding"}


def test_the_protocol_methods_overridden_still_exist_with_the_same_parameters():
    base = httptools_impl.HttpToolsProtocol
    for name, params in PROTOCOL_METHODS.items():
        assert callable(getattr(base, name, None)), _fail(f"HttpToolsProtocol.{name} is gone")
        assert _params(getattr(base, name)) == params, _fail(
            f"HttpToolsProtocol.{name}{inspect.signature(getattr(base, name))} no longer takes ({', '.join(params)})")
    # Our 400 in the caller's shape replaces uvicorn's only if uvicorn still calls it by that name.
    assert "send_400_response" in _calls_on_self(base.data_received), _fail(
        "HttpToolsProtocol.data_received no longer answers a parse error through self.send_400_response")
    # GuardedHttpToolsProtocol.__init__ passes everything through: uvicorn builds it as protocol_class(config=,
    # server_state=, app_state=) and the config's http= may be a class (serve.py passes make_protocol(...)).
    assert _params(base.__init__)[:3] == ["config", "server_state", "app_state"], _fail(
        f"HttpToolsProtocol.__init__{inspect.signature(base.__init__)} changed")


def test_the_protocol_and_cycle_fields_used_are_still_set_by_uvicorn():
    missing = PROTOCOL_FIELDS - _assigned_on_self(httptools_impl.HttpToolsProtocol)
    assert not missing, _fail(f"HttpToolsProtocol no longer sets self.{', self.'.join(sorted(missing))}")
    missing = CYCLE_FIELDS - _assigned_on_self(httptools_impl.RequestResponseCycle)
    assert not missing, _fail(f"RequestResponseCycle no longer sets self.{', self.'.join(sorted(missing))}")
    flow = flow_control.FlowControl
    assert "write_paused" in _assigned_on_self(flow) and inspect.iscoroutinefunction(flow.drain), _fail(
        "FlowControl.write_paused / async FlowControl.drain() changed (the HTTP/1.0 stream writes through them)")


def test_the_cycle_is_swapped_before_its_task_first_runs():
    # on_headers_complete builds the cycle and starts its task with loop.create_task (not eagerly), so the
    # class swap right after super().on_headers_complete() happens before the app's first send.
    base = httptools_impl.HttpToolsProtocol
    source = inspect.getsource(base.on_headers_complete)
    assert "self.cycle = RequestResponseCycle(" in source, _fail(
        "on_headers_complete no longer builds self.cycle as RequestResponseCycle(...)")
    # Our on_response_complete (closing a half-closed connection once answered) runs only if the cycle is
    # handed the protocol's method, looked up on the instance.
    assert "on_response=self.on_response_complete" in source, _fail(
        "the cycle is no longer given on_response=self.on_response_complete")
    started_by = inspect.getsource(getattr(base, "_start_asgi_task", base.on_headers_complete))
    assert "create_task" in started_by and "eager" not in started_by, _fail(
        "the request's task is no longer started with loop.create_task (an eager start would run the app "
        "before the cycle's class is swapped)")
    for cls in (_Cycle, _CloseDelimitedCycle):
        assert cls.__mro__[2] is httptools_impl.RequestResponseCycle
    send = httptools_impl.RequestResponseCycle.send
    assert inspect.iscoroutinefunction(send) and _params(send) == ["message"], _fail(
        f"RequestResponseCycle.send{inspect.signature(send)} changed")


def test_server_capture_signals_and_the_fields_serve_uses():
    assert "capture_signals" in _calls_on_self(Server.serve), _fail(
        "Server.serve no longer enters self.capture_signals() (ManagedServer overrides it so that serve.py "
        "owns the signals)")
    assert _params(Server.capture_signals) == [], _fail(
        f"Server.capture_signals{inspect.signature(Server.capture_signals)} changed")
    assert _params(Server.startup) == ["sockets"], _fail(f"Server.startup{inspect.signature(Server.startup)} changed")
    missing = {"started", "should_exit", "force_exit", "server_state"} - _assigned_on_self(Server)
    assert not missing, _fail(f"Server no longer sets self.{', self.'.join(sorted(missing))}")
    config_params = set(inspect.signature(uvicorn.Config).parameters)
    used = {"loop", "http", "lifespan", "access_log", "log_level", "timeout_graceful_shutdown", "server_header",
            "date_header", "timeout_keep_alive", "proxy_headers"}
    assert used <= config_params, _fail(f"uvicorn.Config no longer takes {sorted(used - config_params)}")
    assert ManagedServer.capture_signals is not Server.capture_signals


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8088), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


class _ServerSettings:
    max_header_kb = 64
    max_header_line_kb = 16
    header_timeout_s = 20.0
    body_timeout_s = 30.0
    keep_alive_s = 75.0
    max_connections = 512


def test_a_request_through_the_guarded_protocol_on_this_uvicorn():
    """The same internals, exercised: one sized answer and one HTTP/1.0 stream through the real subclass."""

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"a", "more_body": True})
            await send({"type": "http.response.body", "body": b"b"})
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    async def exchange(request: bytes) -> tuple[bytes, type, bool]:
        config = uvicorn.Config(app, loop="none", lifespan="off", server_header=False, date_header=False)
        config.load()
        protocol = make_protocol(Limits(_ServerSettings()))(config=config, server_state=ServerState(),
                                                            app_state={})
        assert isinstance(protocol, GuardedHttpToolsProtocol)
        transport = _Transport()
        protocol.connection_made(transport)
        protocol.data_received(request)
        cycle_class = type(protocol.cycle)
        for _ in range(20):
            await asyncio.sleep(0)
        protocol.connection_lost(None)
        return bytes(transport.written), cycle_class, transport.closed

    written, cycle_class, _closed = asyncio.run(exchange(b"GET /x HTTP/1.1\r\nhost: a\r\n\r\n"))
    assert cycle_class is _Cycle, _fail("the response cycle's class could not be swapped")
    assert written.startswith(b"HTTP/1.1 200 OK\r\n") and written.endswith(b"\r\n\r\nok"), _fail(
        f"a sized answer through GuardedHttpToolsProtocol came out as {written[:200]!r}")
    written, cycle_class, closed = asyncio.run(exchange(b"GET /stream HTTP/1.0\r\n\r\n"))
    assert cycle_class is _CloseDelimitedCycle and closed and written.endswith(b"\r\n\r\nab"), _fail(
        f"an HTTP/1.0 stream came out as {written[:200]!r}")
