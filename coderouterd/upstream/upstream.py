"""One object per provider for everything about its upstream that routing, residency and self-healing share: its
circuit breaker, self-healing's hold, the last active probe, the one count of requests in flight, and its
lifecycle (lifecycle.py). `Upstreams` is the registry of them; a request reaches an upstream only through a
`Lease` (`async with upstream.lease(...)`, or its steps one by one as the executor takes them), which is the only
way a request waits for a process.

Single-threaded: everything here runs on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from types import TracebackType
from typing import Protocol

from ..state.events import ProcessEventName
from .breaker import BreakerRegistry, BreakerState, CircuitBreaker
from .lifecycle import NOT_COMING, Lifecycle, Phase, down_why

log = logging.getLogger("coderouterd.upstream")

# How an attempt was let through the breaker, which decides what its end gives back.
CLOSED, TRIAL, PANIC = "closed", "trial", "panic"

E = ProcessEventName
# The process's state as the client's error names it ("process llama is fatal; `corectl restart llama` ...").
_STATE_WORD = {E.STARTED: "starting", E.RESTARTING: "restarting", E.EXITED: "exited", E.FATAL: "fatal",
               E.STOPPED: "stopped"}


class Turn(Protocol):
    """A request's turn at a stopped process (supervise/ondemand.py's Turn)."""

    @property
    def ready(self) -> asyncio.Future[bool]: ...

    def waiting(self) -> bool: ...

    def admitted(self) -> bool: ...


class Starter(Protocol):
    """Who starts a stopped process for a request and keeps it for it (supervise/ondemand.py's OnDemand)."""

    def can_start(self, provider: str) -> bool: ...

    def demand(self, provider: str, *, background: bool = False) -> Turn | None: ...

    def begin(self, provider: str, turn: Turn | None = None) -> bool: ...

    def end(self, provider: str) -> None: ...

    def release(self, turn: Turn) -> None: ...

    def start_eta(self, provider: str) -> float | None: ...


class Refused(Exception):
    """`async with upstream.lease()` could not admit the request; `code` says why (availability's words)."""

    def __init__(self, provider: str, code: str, words: str) -> None:
        super().__init__(f"{provider}: {words}")
        self.provider = provider
        self.code = code
        self.words = words


class Upstream:
    __slots__ = ("name", "breaker", "held", "last_probe", "in_flight", "life", "_registry")

    def __init__(self, name: str, breaker: CircuitBreaker, registry: Upstreams) -> None:
        self.name = name
        self.breaker = breaker
        self.held: str | None = None  # why self-healing holds it out of routing
        self.last_probe: Mapping[str, object] | None = None  # the health monitor's last active probe
        self.in_flight = 0  # requests begun here and not ended: the one count residency and affinity read
        self.life = Lifecycle(name)
        self._registry = registry

    @property
    def phase(self) -> Phase:
        return self.life.phase

    def probed(self, result: Mapping[str, object]) -> None:
        """The health monitor's latest active probe ({"ok", "detail", "at", "seconds"}): its words go into the
        availability answer of a provider failing its probes."""
        self.last_probe = result

    def lease(self, *, background: bool = False, timeout: float = 0.0, panic: bool = False) -> Lease:
        """`async with upstream.lease(timeout=...)`: admitted through the breaker, started and waited for (at most
        `timeout`) when stopped on demand or starting, refused when draining, counted in flight until the exit."""
        lease = Lease(self, self._registry.starter, background)
        lease.timeout = timeout
        lease.panic = panic
        return lease


class Lease:
    """One request's hold on one upstream. Its steps, in order: `want` (ask for a start when the process is stopped
    on demand or starting: no wait), `wait` (until it is up or will not come), `admit` (the breaker), `begin` (count
    in flight; refused when draining), `end` (the count ends, an unreported trial is released), `give_back` (a
    turn taken and not used). `async with` runs them all."""

    __slots__ = ("upstream", "starter", "background", "timeout", "panic", "turn", "admission", "counted",
                 "starting")

    def __init__(self, upstream: Upstream, starter: Starter | None, background: bool = False) -> None:
        # One per attempt, on every request: positional, and no more fields set than an attempt reads.
        self.upstream = upstream
        self.starter = starter
        self.background = background
        self.timeout = 0.0  # `async with` only: how long to wait for a process
        self.panic = False  # `async with` only: let through although the breaker refuses
        self.turn: Turn | None = None
        self.admission: str | None = None
        self.counted = False
        self.starting = 0.0  # > 0: waiting for a start the supervisor runs, up to this many seconds

    # -- waiting for a process ------------------------------------------------------------------------------

    def want(self) -> bool:
        """The process is stopped and a request may start it (a turn is taken), or it is starting: True when
        there is something to wait for. Never waits."""
        if self.turn is not None and (self.turn.waiting() or self.turn.admitted()):
            return True
        up = self.upstream
        if self.starter is not None:
            turn = self.starter.demand(up.name, background=self.background)
            if turn is not None:
                self.turn = turn
                return True
        if up.phase is Phase.STARTING and up.life.wait_s > 0:
            self.starting = up.life.wait_s
            return True
        return False

    def back(self, since: int) -> bool:
        """The process has moved since the lifecycle's count `since` and is up again (restarted while the request
        tried elsewhere): True, and `admitted` holds at once (the wait for it is over before it began)."""
        up = self.upstream
        if up.phase is not Phase.RESIDENT or up.life.moves == since:
            return False
        self.starting = 1.0  # any window: it is up
        return True

    def waiting(self) -> bool:
        if self.turn is not None:
            return self.turn.waiting()
        return self.starting > 0 and self.upstream.phase is Phase.STARTING

    def admitted(self) -> bool:
        """Up and (for a turn) kept for this request."""
        if self.turn is not None:
            return self.turn.admitted()
        return self.starting > 0 and self.upstream.phase is Phase.RESIDENT

    async def wait(self, timeout: float) -> None:
        """Until the start this lease wants has ended (ready or not), at most `timeout`."""
        if self.turn is not None:
            if not self.turn.ready.done():
                try:
                    async with asyncio.timeout(max(0.0, timeout)):
                        await asyncio.shield(self.turn.ready)
                except TimeoutError:
                    return
            return
        await self.upstream.life.settled(timeout)

    def give_back(self) -> None:
        """The request is done with its turn (served, elsewhere or here, or gone). Idempotent."""
        turn, self.turn = self.turn, None
        self.starting = 0.0
        if turn is not None and self.starter is not None:
            self.starter.release(turn)

    # -- one attempt ----------------------------------------------------------------------------------------

    def admit(self, panic: bool = False) -> str | None:
        """Through the breaker: CLOSED, TRIAL (it holds the half-open trial slot), PANIC (let through although the
        breaker refuses), or None (refused)."""
        br = self.upstream.breaker
        half_open = br.state is BreakerState.HALF_OPEN
        if br.allow():
            self.admission = TRIAL if half_open else CLOSED
        else:
            self.admission = PANIC if panic else None
        return self.admission

    def release_trial(self) -> None:
        """The attempt ended without a verdict on the provider (cancelled, our own error, a lost race)."""
        if self.admission == TRIAL:
            self.upstream.breaker.release()
        self.admission = None

    def begin(self) -> bool:
        """The request is about to be sent: counted in flight. False when the process is being stopped (or is not
        up any more): the request must go elsewhere, and may take a turn for its next start."""
        up = self.upstream
        turn = self.turn
        kept = turn is not None and turn.admitted()  # up and kept for this request since it came up
        if up.phase is not Phase.RESIDENT and not kept:
            return False
        if self.starter is not None and not self.starter.begin(up.name, turn):
            return False
        if kept:
            self.turn = None  # used: nothing to give back
        up.in_flight += 1
        self.counted = True
        return True

    def end(self) -> None:
        """The attempt is over: the count ends (the scheduler hears it: an idle deadline moves, a drain may end)."""
        if self.counted:
            self.counted = False
            up = self.upstream
            up.in_flight = max(0, up.in_flight - 1)
            if self.starter is not None:
                self.starter.end(up.name)

    # -- all of it ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Lease:
        up = self.upstream
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        for _ in range(3):  # a process that dies again as soon as it is ready is not waited for forever
            if up.phase is Phase.DRAINING and not (self.starter is not None and self.want()):
                raise Refused(up.name, "not_ready", up.life.words())
            if up.phase is not Phase.RESIDENT or (self.turn is not None and not self.turn.admitted()):
                if not self.want():
                    raise Refused(up.name, "cannot_start" if up.phase in NOT_COMING else "not_ready",
                                  up.life.words())
                await self.wait(deadline - loop.time())
                if not self.admitted():
                    if loop.time() >= deadline or not self.waiting():
                        self.give_back()
                        raise Refused(up.name, "not_ready", up.life.words())
                    continue
            if self.admit(self.panic) is None:
                self.give_back()
                raise Refused(up.name, "breaker_open", "its breaker refused the attempt")
            if self.begin():
                return self
            self.release_trial()
        self.give_back()
        raise Refused(up.name, "not_ready", up.life.words())

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self.end()
        self.release_trial()
        self.give_back()


class Upstreams:
    """The registry: one `Upstream` per provider, created on first use, forgotten when no longer configured. The
    supervisor's process events move their lifecycles (`process_event`); watchers hear every move."""

    def __init__(self, breakers: BreakerRegistry, clock: Callable[[], float] = time.monotonic) -> None:
        """`clock`: monotonic seconds, for when a start's window ends (routing's clock)."""
        self.breakers = breakers
        self.clock = clock
        self._all: dict[str, Upstream] = {}
        # Those not RESIDENT, kept with every move: the planner asks on every request, and it is nearly always empty.
        self.out: set[str] = set()
        self.starter: Starter | None = None  # the on-demand scheduler, once there are managed processes
        self._watchers: list[Callable[[Upstream, Phase, Phase], None]] = []

    def get(self, name: str) -> Upstream:
        up = self._all.get(name)
        if up is None:
            # Its breaker is the registry's for good: the registry forgets one only for a provider no longer
            # configured, whose upstream `configure` forgets with it.
            up = self._all[name] = Upstream(name, self.breakers.get(name), self)
        return up

    def __iter__(self) -> Iterator[Upstream]:
        return iter(list(self._all.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._all

    def names(self) -> list[str]:
        return list(self._all)

    def lease(self, name: str, background: bool = False) -> Lease:
        """A request's lease on this provider's upstream (the request path's way in: one call, no keywords)."""
        up = self._all.get(name)
        return Lease(up if up is not None else self.get(name), self.starter, background)

    def configure(self, names: Collection[str]) -> None:
        """Every configured provider has its upstream from the start; a removed one is forgotten."""
        for gone in [n for n in self._all if n not in names]:
            del self._all[gone]
            self.out.discard(gone)
        for n in names:
            self.get(n)

    def watch(self, fn: Callable[[Upstream, Phase, Phase], None]) -> None:
        """Call fn(upstream, old, new) after every lifecycle move."""
        self._watchers.append(fn)

    def in_flight(self, providers: Iterable[str]) -> int:
        return sum(up.in_flight for p in providers if (up := self._all.get(p)) is not None)

    # -- lifecycle moves ------------------------------------------------------------------------------------

    def move(self, providers: Iterable[str], new: Phase, why: str = "", *, process: str = "", wait_s: float = 0.0,
             ours: bool = False) -> None:
        for p in providers:
            up = self.get(p)
            old = up.phase
            if up.life.move(new, why, process=process, wait_s=wait_s, ours=ours, now=self.clock()) \
                    and old is not new:
                if new is Phase.RESIDENT:
                    self.out.discard(p)
                else:
                    self.out.add(p)
                for fn in list(self._watchers):
                    fn(up, old, new)

    def starting(self, providers: Iterable[str], process: str, wait_s: float, state: str = "starting") -> None:
        """A start (or restart) is under way: a request that needs it may wait `wait_s`."""
        self.move(providers, Phase.STARTING, down_why(state, process, coming=True), process=process, wait_s=wait_s)

    def draining(self, providers: Iterable[str], process: str, reason: str, *, ours: bool) -> None:
        """Chosen to stop: no new request. `ours` (idle, room): the next request that needs it starts it again."""
        self.move(providers, Phase.DRAINING, down_why(f"stopping: {reason}", process, coming=False),
                  process=process, ours=ours)

    def cannot_start(self, providers: Iterable[str], reason: str) -> None:
        """Its start failed for a reason that holds: every client is told `reason` at once."""
        self.move(providers, Phase.CANNOT_START, reason)

    def stopped(self, providers: Iterable[str], process: str, *, on_demand: bool, first: bool = False) -> None:
        """Its process stopped. On demand, or stopped for a reason of the scheduler's (`ours`): the next request
        that needs it starts it. `first`: not started yet (the daemon's start), not stopped."""
        providers = list(providers)
        ours = any(self.get(p).life.ours for p in providers)
        why = down_why("stopped until a request needs it", "", coming=False) if first else \
            down_why("stopped", process, coming=False)
        self.move(providers, Phase.STOPPED_ON_DEMAND if on_demand or ours else Phase.STOPPED, why, process=process,
                  ours=ours)

    def awaited(self, providers: Iterable[str], process: str, wait_s: float) -> None:
        """Started with the daemon: a request that arrives first waits for it (at most `wait_s`)."""
        self.move(providers, Phase.STARTING, down_why("", "", coming=True), process=process, wait_s=wait_s)

    def process_event(self, process: str, event: ProcessEventName, providers: Iterable[str], detail: str, *,
                      wait_s: float, on_demand: bool) -> None:
        """The supervisor's news of a process, straight to its providers' upstreams. `wait_s`: its start
        timeout, how long a request may wait for a start or restart."""
        providers = list(providers)
        if event in (E.READY, E.ADOPTED):
            self.move(providers, Phase.RESIDENT, process=process)
        elif event in (E.STARTED, E.RESTARTING, E.EXITED):
            if event is E.STARTED and all(self.get(p).phase is Phase.STARTING for p in providers):
                return  # the scheduler said so already, in its own words ("starting on demand")
            self.starting(providers, process, wait_s, _STATE_WORD[event])
        elif event is E.STOPPED:
            self.stopped(providers, process, on_demand=on_demand)
        elif event is E.FATAL:
            # It will not come back by itself: every client is told why at once, not "overloaded".
            self.move(providers, Phase.FATAL, f"managed process {process} cannot start: {detail}; fix it, then "
                                              f"`corectl start {process}`", process=process)
