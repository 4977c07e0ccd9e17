"""Routing without a daemon: a scripted upstream call and a recording client sink, for the executor and race.

`FakeCall` stands where `providers.call.Call` stands (the Exchange's `call_factory` seam) and keeps the real
translation strategy the executor chose, so what the executor reads from it (`started_content`, `usage`,
`skip_prologue`) behaves as in production. Each provider gets a queue of scripted attempts:

    ok(b"body")                 whole answer (non-streaming) / ok(b"a", b"b") stream chunks
    fail(UpstreamError(...))    open() raises it
    boom(ValueError("bug"))     open() raises our own exception
    hang()                      open() never returns (until cancelled)
    slow(0.05, b"x")            open() waits, then answers like ok()
    midstream(b"a", err)        streams b"a" then raises err (after content)
    gated(event, err=None)      open() waits for the event, then raises err or answers like ok()
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from coderouterd.config.loader import LoadedConfig, parse_config_text
from coderouterd.providers.errors import UpstreamError
from coderouterd.routing.executor import Exchange
from coderouterd.routing.request import ClientRequest
from coderouterd.routing.router import Router
from coderouterd.routing.sink import ClientGone
from coderouterd.routing.state import RoutingState
from coderouterd.runtime import build_runtime
from coderouterd.upstream.clock import ManualClock


@dataclass
class Script:
    kind: str  # ok | fail | boom | hang | slow | midstream | gated
    chunks: tuple[bytes, ...] = ()
    error: BaseException | None = None
    delay: float = 0.0
    gate: asyncio.Event | None = None


def ok(*chunks: bytes) -> Script:
    return Script("ok", chunks or (b'{"ok":true}',))


def fail(e: UpstreamError) -> Script:
    return Script("fail", error=e)


def boom(e: BaseException) -> Script:
    return Script("boom", error=e)


def hang() -> Script:
    return Script("hang")


def slow(delay: float, *chunks: bytes) -> Script:
    return Script("slow", chunks or (b'{"ok":true}',), delay=delay)


def gated(gate: asyncio.Event, e: BaseException | None = None) -> Script:
    return Script("gated", (b'{"ok":true}',), error=e, gate=gate)


def midstream(chunk: bytes, e: UpstreamError) -> Script:
    return Script("midstream", (chunk,), error=e)


@dataclass
class Upstreams:
    """The scripted upstreams: per provider, a queue of attempts; records what each call was sent."""

    scripts: dict[str, list[Script]] = field(default_factory=dict)
    sent: list[tuple[str, bytes]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)
    call_class: type | None = None  # a FakeCall subclass, for a test that needs more of the real strategy

    def script(self, provider: str, *steps: Script) -> None:
        self.scripts.setdefault(provider, []).extend(steps)

    def __call__(self, provider, strategy, *, raw_body: bytes, stream: bool, client_headers: dict):
        queue = self.scripts.get(provider.name) or []
        step = queue.pop(0) if queue else ok()
        return (self.call_class or FakeCall)(self, provider, strategy, step, raw_body, stream)


class FakeCall:
    def __init__(self, ups: Upstreams, provider, strategy, step: Script, raw_body: bytes, stream: bool) -> None:
        self.ups = ups
        self.provider = provider
        self.strategy = strategy
        self.step = step
        self.raw_body = raw_body
        self.stream = stream
        self.started = time.monotonic()
        self.first_byte_deadline = self.started + 30
        self.total_deadline = self.started + 60
        self.ttfb: float | None = None
        self.wait_s = 0.0
        self.request_chars = len(raw_body)
        self._chunks = list(step.chunks)
        self._closed = False
        self.placement = None
        self.extra_fields = None

    async def open(self) -> None:
        self.ups.sent.append((self.provider.name, self.raw_body))
        s = self.step
        if s.kind in ("fail", "boom"):
            raise s.error
        if s.kind == "hang":
            await asyncio.Event().wait()
        if s.kind == "slow":
            await asyncio.sleep(s.delay)
        if s.kind == "gated":
            assert s.gate is not None
            await s.gate.wait()
            if s.error is not None:
                raise s.error
        self.ttfb = time.monotonic() - self.started

    async def result(self) -> bytes:
        self.strategy.usage = {"input_tokens": 10, "output_tokens": 2}
        return b"".join(self._chunks)

    async def read(self, timeout: float) -> bytes | None:
        if self._chunks:
            self.strategy.started_content = True
            return self._chunks.pop(0)
        if self.step.kind == "midstream":
            raise self.step.error
        self.strategy.usage = {"input_tokens": 10, "output_tokens": 2}
        return None

    async def drain(self) -> None:
        """The scripted body has no bytes after its last event to read."""

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.ups.closed.append(self.provider.name)


class FakeSink:
    """A ClientSink that records what the client would have received."""

    def __init__(self, *, opens_stream_itself: bool = True, gone_on: str | None = None) -> None:
        self.opens_stream_itself = opens_stream_itself
        self.log: list[tuple] = []
        self.headers_sent = False
        self.finished = False
        self._gone_on = gone_on  # raise ClientGone on this call ("start", "event", "finish", "error")

    def _maybe_gone(self, what: str) -> None:
        if self._gone_on == what:
            raise ClientGone(what)

    async def start_stream(self, headers, opening=None) -> None:
        self._maybe_gone("start")
        self.headers_sent = True
        self.log.append(("start", dict(headers or {}), opening))

    async def event(self, data: bytes) -> None:
        self._maybe_gone("event")
        self.log.append(("event", data))

    async def ping(self) -> None:
        self.log.append(("ping",))

    async def error(self, status, message, *, kind=None, headers=None, extra=None, code=None) -> None:
        self._maybe_gone("error")
        self.log.append(("error", status, message, kind, dict(headers or {})))
        self.headers_sent = self.finished = True

    async def finish(self, body=None, headers=None) -> None:
        self._maybe_gone("finish")
        self.log.append(("finish", body, dict(headers or {})))
        self.headers_sent = self.finished = True

    # -- what tests look at ---------------------------------------------------------------------------------

    @property
    def status(self) -> int:
        for entry in self.log:
            if entry[0] == "start":
                return 200
            if entry[0] == "error":
                return entry[1]
            if entry[0] == "finish":
                return 200
        return 0

    def headers(self) -> dict:
        for entry in self.log:
            if entry[0] in ("start",):
                return entry[1]
            if entry[0] == "error":
                return entry[4]
            if entry[0] == "finish":
                return entry[2]
        return {}

    def last_error(self) -> tuple | None:
        errs = [e for e in self.log if e[0] == "error"]
        return errs[-1] if errs else None


class Routing:
    """A runtime, routing state and router built from a TOML config, with a manual clock for the breakers."""

    def __init__(self, toml: str, *, budget=None) -> None:
        cfg = parse_config_text(toml, "test")
        self.runtime = build_runtime(LoadedConfig(cfg, "test"))
        self.clock = ManualClock()
        self.health_moves: list[tuple[str, str, str, str]] = []
        self.state = RoutingState(cfg, clock=self.clock, on_health=lambda *a: self.health_moves.append(a))
        self.router = Router(self.state, budget=budget)
        self.ups = Upstreams()

    def exchange(self, body: dict | None = None, *, ingress: str = "anthropic", profile: str = "default",
                 sink: FakeSink | None = None) -> tuple[Exchange, FakeSink]:
        import orjson

        body = body or {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        req = ClientRequest(ingress=ingress, body=body, raw=orjson.dumps(body), headers={},
                            stream=bool(body.get("stream")), model=body.get("model", ""), request_id="req_test")
        sink = sink or FakeSink(opens_stream_itself=ingress == "anthropic")
        ex = Exchange(req, sink, runtime=self.runtime, router=self.router, profile=profile, call_factory=self.ups)
        return ex, sink

    async def serve(self, body: dict | None = None, **kw) -> tuple[Exchange, FakeSink]:
        ex, sink = self.exchange(body, **kw)
        await ex.run()
        return ex, sink

    def breaker(self, name: str):
        return self.state.breakers.get(name)


def chain_config(*providers: str, extra_profile: str = "", provider_extra: dict | None = None,
                 breaker_failures: int = 3) -> str:
    """A config with providers named as given (kind openai, model "m") in one `default` profile."""
    provider_extra = provider_extra or {}
    parts = [f"[breaker]\nfailures = {breaker_failures}\nrecovery_s = 30\n"]
    for p in providers:
        parts.append(f'[providers.{p}]\nbase_url = "http://127.0.0.1:9/v1"\nmodel = "m"\n{provider_extra.get(p, "")}\n')
    names = ", ".join(f'"{p}"' for p in providers)
    parts.append(f"[profiles.default]\nproviders = [{names}]\n{extra_profile}\n")
    return "\n".join(parts)
