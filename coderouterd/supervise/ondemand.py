"""Local models on demand, within a memory budget: the scheduler that starts a stopped process for the requests
that need it, makes room by stopping others, and stops idle ones.

A request that needs a stopped process takes a `Turn` (`demand`) and waits for it. One dispatcher decides whose
turn it is (turns.py, pure: collate, never for a lighter request, minimum residency) and runs one swap at a
time: two swaps deciding at once could each count memory the other is about to free. When the process comes
up, every turn waiting for it is admitted: the process is kept for them until each has begun its request (or
given up), so a swap that has started always serves what it was started for. Requests for a process that is
ready never wait: they are served while another model is being swapped in.

The memory arithmetic is residency.py's (pure); this module sequences the decisions, acts on processes through a
small `Effects` interface (start and wait for readiness, stop), so it is tested with a fake one, without processes,
and says what routing should know by moving each provider's upstream lifecycle (upstream/: starting, draining,
cannot start). It is the upstreams' starter: a request's lease asks it for a turn, and tells it when a request
begins and ends there; the count of requests in flight is the upstream's, which the budget arithmetic reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from ..tasks import TaskSet
from ..upstream.breaker import BreakerRegistry
from ..upstream.lifecycle import Phase
from ..upstream.upstream import Upstreams
from .residency import NoRoom, ResidencyPolicy, Resident
from .turns import Go, Hold, Refuse, Want, decide

log = logging.getLogger("coderouterd.supervise")

# Stops the scheduler itself decided: a process stopped for these reasons is started again by the next request
# that needs it, whatever its `start`. One stopped by hand (`corectl stop`) stays stopped unless it is on demand.
IDLE = "idle"


def room_for(name: str) -> str:
    return f"room for {name}"


class StartFailed(Exception):
    """The process did not come up (fatal, timed out, no room); the message says why."""


class Effects(Protocol):
    def holding(self) -> Collection[str]:
        """Processes whose memory counts now: anything not stopped or fatal (a process still stopping counts)."""

    def ready(self) -> Collection[str]:
        """Processes that are ready and that the daemon owns (an external one is never stopped by us)."""

    def external(self) -> Collection[str]:
        """Processes coderouterd adopted by their URL and does not own: they hold memory but cannot be stopped."""

    def providers_of(self, name: str) -> list[str]:
        """The providers a process serves (their upstreams move with it)."""

    def stopped(self, name: str) -> bool:
        """Stopped (not fatal, not starting): a request may start it."""

    async def start(self, name: str, wait: bool = True) -> str | None:
        """Start it and (`wait`) wait for readiness (its start timeout). None when ready (or, not waiting,
        starting), else why it did not come up."""

    async def wait_ready(self, name: str) -> None:
        """Until it is ready or has settled otherwise (stopped, fatal, its start timeout)."""

    async def stop(self, name: str, reason: str) -> None:
        """Stop it (its tree; the slots are saved first by the supervisor's before-stop hook)."""


@dataclass
class Settings:
    """What the scheduler needs of each process's config."""

    on_demand: bool = False
    stop_timeout_s: float = 10.0
    start_timeout_s: float = 120.0  # how long a request may wait for its start
    # How long a stop to make room waits for the requests in flight to end (their own timeouts bound them):
    # a request is never cut because another model was wanted. 0: stop_timeout_s, as other stops.
    room_drain_s: float = 0.0


@dataclass
class Rules:
    """[models] swap_hold_s and min_resident_s (README: Several local models)."""

    hold_s: float = 5.0
    min_resident_s: float = 5.0


WAITING, ADMITTED, USED, GONE = "waiting", "admitted", "used", "gone"


class Turn:
    """One request's place in the queue for a stopped process. `ready` resolves True when the process is up and
    kept for this request (admitted: it must `begin` or be released), False when it could not start."""

    __slots__ = ("name", "background", "since", "ready", "state")

    def __init__(self, name: str, background: bool, since: float) -> None:
        self.name = name
        self.background = background
        self.since = since
        self.ready: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.state = WAITING

    def waiting(self) -> bool:
        return self.state == WAITING

    def admitted(self) -> bool:
        return self.state == ADMITTED


class OnDemand:
    def __init__(self, effects: Effects, *, clock: Callable[[], float], process_of: Callable[[str], str | None],
                 upstreams: Upstreams | None = None, budget_mb: float = 0.0, rules: Rules | None = None) -> None:
        """`process_of(provider)`: the managed process serving a provider, or None. `upstreams`: the registry whose
        lifecycles it moves and whose starter it becomes (its own when none is given: a test's)."""
        self.effects = effects
        self.rules = rules or Rules()
        self.upstreams = upstreams if upstreams is not None else Upstreams(BreakerRegistry())
        self.upstreams.starter = self
        self.policy = ResidencyPolicy(budget_mb, clock=clock, min_resident_s=self.rules.min_resident_s,
                                      in_flight=self._in_flight)
        self._process_of = process_of
        self._settings: dict[str, Settings] = {}
        self._swap = asyncio.Lock()
        self._turns: dict[str, list[Turn]] = {}  # process -> turns waiting for it, oldest first
        self._unwaited: dict[str, float] = {}  # process -> since when a start is wanted that nobody waits for
        self._swapping: asyncio.Task[None] | None = None
        self._target: str | None = None  # what the running swap brings in
        self._kick = asyncio.Event()
        self._dispatcher: asyncio.Task[None] | None = None
        # Set (and dropped) when a stop or a request ends: a start waiting for a stop, and a stop waiting for its
        # requests, look again. None while nobody waits (no event per request).
        self._change: asyncio.Event | None = None
        self._wake = asyncio.Event()
        self._tasks = TaskSet()
        self._idle_task: asyncio.Task[None] | None = None
        self.swaps = 0  # starts that stopped another process to make room (the count the tests and bench read)
        self._began: dict[str, float] = {}  # process -> when its latest start began (with load_s: its expected end)
        self._held: Hold | None = None  # the latest decision, when it held a want: shown by the status

    # -- configuration --------------------------------------------------------------------------------------

    def configure(self, budget_mb: float, processes: dict[str, tuple[Resident, Settings]],
                  rules: Rules | None = None) -> None:
        if rules is not None:
            self.rules = rules
            self.policy.min_resident_s = rules.min_resident_s
        self.policy.configure([r for r, _ in processes.values()], budget_mb)
        self._settings = {n: s for n, (_, s) in processes.items()}
        self._wake.set()
        self._kick.set()

    @property
    def budget_mb(self) -> float:
        return self.policy.budget_mb

    def process_of(self, provider: str) -> str | None:
        name = self._process_of(provider)
        return name if name in self._settings else None

    def adopt_running(self, name: str, rss_mb: float | None) -> None:
        """`name` was found running at the daemon's start and adopted (left by a coderouterd killed before it
        could stop it; supervise/process.py `adopt`): it is resident like one we started, so the next swap stops it
        first (issue 43, D2). It holds its configured (or estimated) memory, its measured rss when neither is
        known, and counts as just used."""
        r = self.policy.residents.get(name)
        if r is None:
            return
        if not r.memory_mb and rss_mb:
            r.memory_mb = rss_mb
        r.last_used = self.policy.clock()
        self._wake.set()  # its idle deadline starts now
        self._kick.set()

    def on_demand(self, name: str) -> bool:
        s = self._settings.get(name)
        return s is not None and s.on_demand

    def _in_flight(self, name: str) -> int:
        """Requests in flight on a process: its providers' upstreams count them (the one count)."""
        return self.upstreams.in_flight(self.effects.providers_of(name))

    def _ours(self, name: str) -> bool:
        """Stopped (or being stopped) by the scheduler (idle, room): a request starts it again. Its upstreams'
        lifecycle says so (DRAINING or stopped for a reason of ours)."""
        return any(self.upstreams.get(p).life.ours for p in self.effects.providers_of(name))

    def _move(self, name: str, phase: Phase, why: str) -> None:
        """Tell routing through the process's upstreams (upstream/lifecycle.py): the one writer of "down" besides
        the supervisor's events."""
        providers = self.effects.providers_of(name)
        if phase is Phase.STARTING:
            s = self._settings.get(name, Settings())
            self.upstreams.starting(providers, name, s.start_timeout_s, "starting on demand")
        elif phase is Phase.DRAINING:
            self.upstreams.draining(providers, name, why, ours=why == IDLE or why.startswith("room for "))
        elif phase is Phase.CANNOT_START:
            self.upstreams.cannot_start(providers, f"managed process {name} cannot start: {why}")

    # -- the request path -----------------------------------------------------------------------------------

    def begin(self, provider: str, turn: object = None) -> bool:
        """A request is about to be sent to this provider (with the turn it waited for, if any), through its lease,
        which counts it in flight. False: its process is being stopped (the request must treat it as not ready,
        and may take a turn)."""
        name = self.process_of(provider)
        if name is None:
            return True
        r = self.policy.residents.get(name)
        if isinstance(turn, Turn) and turn.name == name and turn.state == ADMITTED and r is not None:
            # Kept for it since it came up: never refused, even if a stop by hand is waiting for it.
            turn.state = USED
            r.admitted = max(0, r.admitted - 1)
            r.last_used = self.policy.clock()
            ok = True
        else:
            ok = self.policy.begin(name)
        if ok:
            self._wake.set()  # its idle deadline moved
        return ok

    def end(self, provider: str) -> None:
        """A request counted by its lease is over (the upstream's count is down already)."""
        name = self.process_of(provider)
        if name is None:
            return
        self.policy.end(name)
        self._changed()
        self._wake.set()
        self._kick.set()

    def release(self, turn: object) -> None:
        """The request is done with its turn (served, elsewhere or by it, or gone). Idempotent."""
        if not isinstance(turn, Turn):
            return
        state, turn.state = turn.state, GONE
        if state == WAITING:
            waiting = self._turns.get(turn.name)
            if waiting is not None and turn in waiting:
                waiting.remove(turn)
                if not waiting:
                    del self._turns[turn.name]
            if not turn.ready.done():
                turn.ready.set_result(False)
        elif state == ADMITTED:
            r = self.policy.residents.get(turn.name)
            if r is not None:
                r.admitted = max(0, r.admitted - 1)
                self._changed()
        else:
            return
        self._wake.set()
        self._kick.set()

    def _changed(self) -> None:
        ev, self._change = self._change, None
        if ev is not None:
            ev.set()

    async def _until(self, done: Callable[[], bool]) -> None:
        """Until `done()` (looked at again after every stop and request that ends); the caller bounds it."""
        while not done():
            if self._change is None:
                self._change = asyncio.Event()
            await self._change.wait()

    def _stopping(self, name: str) -> bool:
        """A stop of it is under way (idle, room, by hand): the policy has it draining from the stop's decision
        to its end, and its upstreams are DRAINING."""
        r = self.policy.residents.get(name)
        return r is not None and r.draining

    def can_start(self, provider: str) -> bool:
        """A request may start the provider's process: it is stopped (or being stopped by us), and on demand or
        stopped by us (idle, room). Never a fatal one: that waits for `corectl start`."""
        name = self.process_of(provider)
        if name is None:
            return False
        if name == self._target or name in self._turns:
            return True
        if self._stopping(name) and self._ours(name):
            return True
        return self.effects.stopped(name) and (self._settings[name].on_demand or self._ours(name))

    def demand(self, provider: str, *, background: bool = False) -> Turn | None:
        """A request needs the provider's stopped process: its turn, to wait for (`Turn.ready`), or None when this
        provider cannot be started by a request. A start nobody waits for any more (released while it was
        still waiting, `unwaited`) still happens when it stops no busy model."""
        name = self.process_of(provider)
        if name is None or not self.can_start(provider):
            return None
        self.policy.touch(name)
        turn = Turn(name, background, self.policy.clock())
        # Routing hears it is coming when its swap begins (`_start`), not now: a turn may wait, or be released
        # before its swap, and a provider said to be coming makes other requests wait for it.
        self._turns.setdefault(name, []).append(turn)
        if not background:
            self._unwaited.setdefault(name, turn.since)
        self._kick.set()
        self._run_dispatcher()
        return turn

    # -- whose turn -----------------------------------------------------------------------------------------

    def _run_dispatcher(self) -> None:
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.get_running_loop().create_task(self._dispatch(), name="on-demand turns")

    def wants(self) -> list[Want]:
        out = []
        for name in set(self._turns) | set(self._unwaited):
            turns = self._turns.get(name) or []
            since = min([t.since for t in turns] or [self._unwaited.get(name, self.policy.clock())])
            out.append(Want(name, since, foreground=sum(not t.background for t in turns),
                            background=sum(t.background for t in turns)))
        return out

    async def _dispatch(self) -> None:
        clock = self.policy.clock
        while True:
            self._kick.clear()
            until: float | None = None
            try:
                self._admit_ready()
                if self._swapping is None and (self._turns or self._unwaited):
                    until = self._decide()
            except Exception:  # a bug here must not leave every waiting request hanging until its deadline
                log.exception("on-demand turn decision failed")
                until = clock() + 1.0
            # A process may come up by other means (a start by hand, the supervisor's restart): look again now
            # and then while anything waits, besides every kick.
            timeout = 1.0 if self._turns else None
            if until is not None:
                timeout = max(0.01, min(timeout or 1.0, until - clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._kick.wait()

    def _decide(self) -> float | None:
        holding = set(self.effects.holding())
        for name in [n for n in self._unwaited if n in holding]:
            del self._unwaited[name]  # up (or coming up) by other means: nothing left to start
        d = decide(self.wants(), self.policy, holding=holding, starting=holding - set(self.effects.ready()),
                   fixed=self.effects.external(), hold_s=self.rules.hold_s, now=self.policy.clock())
        self._held = d if isinstance(d, Hold) else None
        if isinstance(d, Refuse):
            self._unwaited.pop(d.target, None)
            self._move(d.target, Phase.CANNOT_START, d.why)
            self._settle(d.target, False)
            self._kick.set()
            return None
        if isinstance(d, Go):
            self._unwaited.pop(d.target, None)
            self._target = d.target
            self._swapping = asyncio.get_running_loop().create_task(self._swap_in(d.target, d.victims),
                                                                    name=f"on-demand:{d.target}")
            return None
        return d.until

    def _admit_ready(self) -> None:
        """Every turn waiting for a process that is ready (and not being stopped) is admitted: kept for it."""
        if not self._turns:
            return
        ready = set(self.effects.ready())
        for name in list(self._turns):
            r = self.policy.residents.get(name)
            if name in ready and r is not None and not r.draining and name != self._target:
                self._unwaited.pop(name, None)
                self._settle(name, True)

    def _settle(self, name: str, ok: bool) -> None:
        r = self.policy.residents.get(name)
        for t in self._turns.pop(name, []):
            if t.state != WAITING:
                continue
            if ok and r is not None:
                t.state = ADMITTED
                r.admitted += 1
            else:
                t.state = GONE
            if not t.ready.done():
                t.ready.set_result(ok)

    async def _swap_in(self, name: str, victims: list[str]) -> None:
        ok = False
        try:
            await self._start(name, victims, wait=True, coming=True)
            ok = True
        except StartFailed as e:
            log.warning("%s: not started on demand: %s", name, e)
        except Exception:  # the requests waiting on it get "not started", never our exception
            log.exception("%s: on-demand start failed", name)
        finally:
            self._target = None
            self._swapping = None
            if ok and name in self.effects.ready():
                self._settle(name, True)
            elif not ok:
                self._settle(name, False)
            self._kick.set()

    # -- starting and stopping ------------------------------------------------------------------------------

    async def ensure(self, name: str, *, wait: bool = True) -> None:
        """Start `name` by hand (making room first: least recently used, idle ones first, whatever the turn rules
        say) and (`wait`) wait until it is ready. Raises StartFailed. Not waiting frees the next swap sooner; the
        starting process still counts against the budget."""
        await self._stopped(name)
        if name in self.effects.ready():
            return
        await self._start(name, None, wait=wait)
        self._kick.set()

    async def _start(self, name: str, victims: list[str] | None, *, wait: bool, coming: bool = False) -> None:
        """Stop `victims` (None: chosen now), then start `name`. One at a time: under the swap lock. `coming`:
        routing is told requests may wait for it (a start for requests, not by hand)."""
        async with self._swap:
            await self._stopped(name)
            if name in self.effects.ready():
                return
            try:
                chosen = self.policy.victims(name, self.effects.holding(), fixed=self.effects.external())
            except NoRoom as e:
                self._move(name, Phase.CANNOT_START, str(e))
                raise StartFailed(str(e)) from None
            if victims is not None:
                # The dispatcher's choice, unless something changed since (a stop by hand): never fewer than
                # the budget needs now.
                chosen = list(dict.fromkeys([*victims, *chosen]))
                chosen = [v for v in chosen if v in self.effects.holding()]
            if chosen:
                log.info("%s: stopping %s to make room (budget %.0f MB)", name, ", ".join(chosen),
                         self.policy.budget_mb)
                await asyncio.gather(*(self._stop(v, room_for(name)) for v in chosen))
                self.swaps += 1
            self.policy.touch(name)
            if coming:
                self._move(name, Phase.STARTING, "")
            began = self._began[name] = self.policy.clock()
            why = await self.effects.start(name, wait)
            if wait and why is None:
                # Idle time and minimum residency count from readiness, not from the start's decision.
                self.policy.started(name, self.policy.clock() - began)
                self._wake.set()
            elif why is None:
                self._tasks.spawn(self._touch_when_ready(name), name=f"ready:{name}")
            if why is not None:
                self._move(name, Phase.CANNOT_START, why)
                raise StartFailed(why)

    async def _touch_when_ready(self, name: str) -> None:
        await self.effects.wait_ready(name)
        self.policy.started(name, None)
        self._wake.set()
        self._kick.set()

    async def _stopped(self, name: str) -> None:
        """A stop of this process under way (idle, room, by hand) ends before it is started again."""
        await self._until(lambda: not self._stopping(name))

    async def stop(self, name: str, reason: str) -> None:
        """Stop by hand (corectl stop: pinned ones too) or for a reason of ours; in-flight requests finish first,
        within the process's stop timeout."""
        await self._stop(name, reason)

    async def _stop(self, name: str, reason: str) -> None:
        if self._stopping(name):
            await self._stopped(name)  # one stop at a time: this one is under way
            return
        # Decided now, before any await: a request from here on finds it draining, and may start it again.
        self.policy.drain([name])
        self._move(name, Phase.DRAINING, reason)
        try:
            await self._wait_drained(name, room=reason.startswith("room for "))
            await self.effects.stop(name, reason)
            # Stopped (the supervisor's event says so too): a request restarts it if it is on demand or ours.
            self.upstreams.stopped(self.effects.providers_of(name), name, on_demand=self.on_demand(name))
        finally:
            self.policy.drained(name)
            providers = self.effects.providers_of(name)
            if providers and self.upstreams.get(providers[0]).phase is Phase.DRAINING:
                # The stop did not happen (an external process, an error): it serves on.
                self.upstreams.move(providers, Phase.RESIDENT if name in self.effects.ready() else Phase.STOPPED,
                                    process=name)
            self._changed()
            self._wake.set()

    async def _wait_drained(self, name: str, *, room: bool = False) -> None:
        if not self.policy.busy(name):
            return
        settings = self._settings.get(name, Settings())
        timeout = max(settings.stop_timeout_s, settings.room_drain_s) if room else settings.stop_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await self._until(lambda: not self.policy.busy(name))
        except TimeoutError:
            log.warning("%s: %d request(s) still in flight after %.0fs; stopping it anyway", name,
                        self.policy.in_flight(name), timeout)

    # -- idleness -------------------------------------------------------------------------------------------

    def start_idle_watch(self) -> None:
        if self._idle_task is None or self._idle_task.done():
            self._idle_task = asyncio.get_running_loop().create_task(self._idle_loop(), name="idle-stop")

    async def _idle_loop(self) -> None:
        clock = self.policy.clock
        while True:
            self._wake.clear()
            try:
                ready = self._idle_ready()
                for name in self.policy.idle_due(ready):
                    # Not under the swap lock: a stop of an idle process frees memory, it never needs room.
                    # Drained at once (inside _stop, before its first await): it takes no new request from here on.
                    self._tasks.spawn(self._idle_stop(name), name=f"idle-stop:{name}")
                deadline = self.policy.next_deadline(self._idle_ready())
            except Exception:  # a bug here must not end idle stops for the daemon's life
                log.exception("idle-stop check failed")
                deadline = clock() + 5.0
            timeout = None if deadline is None else max(0.05, deadline - clock())
            # asyncio.timeout, not wait_for: on 3.11 wait_for loses a cancel that lands as the event is set.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    def _idle_ready(self) -> set[str]:
        busy = {self._target} if self._target else set()
        stopping = {n for n, r in self.policy.residents.items() if r.draining}
        return set(self.effects.ready()) - set(self.effects.external()) - stopping - busy

    async def _idle_stop(self, name: str) -> None:
        try:
            r = self.policy.residents.get(name)
            log.info("%s: idle for %.0fs; stopping it", name, r.idle_stop_s if r else 0)
            await self._stop(name, IDLE)
        except Exception:
            log.exception("%s: idle stop failed", name)

    async def close(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
            await asyncio.gather(self._idle_task, return_exceptions=True)
        for t in (self._dispatcher, self._swapping):
            if t is not None:
                t.cancel()
                await asyncio.gather(t, return_exceptions=True)
        for name in list(self._turns):
            self._settle(name, False)
        await self._tasks.close()

    # -- what can be seen -----------------------------------------------------------------------------------

    def start_eta(self, provider: str) -> float | None:
        """Seconds until the provider's process, being started, is expected ready by the load time learned from its
        own starts (at least 0); None when it is not starting or no load time was learned yet."""
        name = self._process_of(provider)
        r = self.policy.residents.get(name) if name is not None else None
        began = self._began.get(name) if name is not None else None
        if r is None or r.load_s is None or began is None or name in self.effects.ready():
            return None
        return max(0.0, began + r.load_s - self.policy.clock())

    def snapshot(self) -> dict[str, Any]:
        holding = set(self.effects.holding())
        procs = {}
        held = self._held if self._held is not None and self._held.target in self._turns else None
        for name, r in self.policy.residents.items():
            s = self._settings.get(name, Settings())
            hold = held if held is not None and held.target == name else None
            procs[name] = {"resident": name in holding, "memory_mb": r.memory_mb, "pinned": r.pinned,
                           "start": "on_demand" if s.on_demand else "always", "idle_stop_s": r.idle_stop_s,
                           "idle_stop_in_s": self.policy.idle_left(name) if name in holding else None,
                           "in_flight": self._in_flight(name), "starting_on_demand": name == self._target,
                           "stopping": r.draining, "waiting": len(self._turns.get(name) or ()),
                           "admitted": r.admitted, "load_s": r.load_s,
                           # Its requests held to save a swap: for how long at most (the load times learned, at
                           # most swap_hold_s), and why, as last decided (looked at again at least every second).
                           "hold_s": hold.hold_s if hold else None, "held": hold.why if hold else None,
                           "resident_for_s": None if r.ready_at is None or name not in holding
                           else max(0.0, self.policy.clock() - r.ready_at)}
        return {"memory_budget_mb": self.policy.budget_mb, "memory_held_mb": self.policy.held_mb(holding),
                "swap_hold_s": self.rules.hold_s, "min_resident_s": self.rules.min_resident_s,
                "swaps": self.swaps, "processes": procs}
