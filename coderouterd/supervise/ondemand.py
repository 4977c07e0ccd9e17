"""Local models on demand, within a memory budget: the scheduler that starts a stopped process for the request
that needs it, makes room by stopping the least recently used ones first, and stops idle ones.

The decisions are residency.py's (pure); this module sequences them and acts through a small `Effects`
interface (start and wait for readiness, stop, say what routing should know), so it is tested with a fake one,
without processes. One start-with-room-making at a time: two swaps deciding at once could each count memory
the other is about to free. Requests for a process that is ready never take that lock: they are served while
another model is being swapped in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Protocol

from ..tasks import TaskSet
from .residency import NoRoom, ResidencyPolicy, Resident

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

    def stopped(self, name: str) -> bool:
        """Stopped (not fatal, not starting): a request may start it."""

    async def start(self, name: str, wait: bool = True) -> str | None:
        """Start it and (`wait`) wait for readiness (its start timeout). None when ready (or, not waiting,
        starting), else why it did not come up."""

    async def wait_ready(self, name: str) -> None:
        """Until it is ready or has settled otherwise (stopped, fatal, its start timeout)."""

    async def stop(self, name: str, reason: str) -> None:
        """Stop it (its tree; the slots are saved first by the supervisor's before-stop hook)."""

    def coming(self, name: str) -> None:
        """Routing: it is being started for a request; requests that must may wait for it."""

    def leaving(self, name: str, reason: str) -> None:
        """Routing: it is being stopped; no new request goes to it."""

    def cannot_start(self, name: str, reason: str) -> None:
        """Routing: it cannot start; clients are told why at once."""


@dataclass
class Settings:
    """What the scheduler needs of each process's config."""

    on_demand: bool = False
    stop_timeout_s: float = 10.0


class OnDemand:
    def __init__(self, effects: Effects, *, clock: Callable[[], float], process_of: Callable[[str], str | None],
                 budget_mb: float = 0.0) -> None:
        """`process_of(provider)`: the managed process serving a provider, or None."""
        self.effects = effects
        self.policy = ResidencyPolicy(budget_mb, clock=clock)
        self._process_of = process_of
        self._settings: dict[str, Settings] = {}
        self._swap = asyncio.Lock()
        self._starts: dict[str, asyncio.Task[bool]] = {}
        self._stopping: dict[str, asyncio.Future[None]] = {}
        self._ours: set[str] = set()  # stopped (or being stopped) by the scheduler: a request starts them again
        self._drained: dict[str, asyncio.Event] = {}
        self._wake = asyncio.Event()
        self._tasks = TaskSet()
        self._idle_task: asyncio.Task[None] | None = None

    # -- configuration --------------------------------------------------------------------------------------

    def configure(self, budget_mb: float, processes: dict[str, tuple[Resident, Settings]]) -> None:
        self.policy.configure([r for r, _ in processes.values()], budget_mb)
        self._settings = {n: s for n, (_, s) in processes.items()}
        self._wake.set()

    @property
    def budget_mb(self) -> float:
        return self.policy.budget_mb

    def process_of(self, provider: str) -> str | None:
        name = self._process_of(provider)
        return name if name in self._settings else None

    # -- the request path -----------------------------------------------------------------------------------

    def begin(self, provider: str) -> bool:
        """A request is about to be sent to this provider. False: its process is being stopped (the request
        must treat it as not ready)."""
        name = self.process_of(provider)
        if name is None:
            return True
        ok = self.policy.begin(name)
        if ok:
            self._wake.set()  # its idle deadline moved
        return ok

    def end(self, provider: str) -> None:
        name = self.process_of(provider)
        if name is None:
            return
        self.policy.end(name)
        if self.policy.in_flight(name) == 0:
            ev = self._drained.get(name)
            if ev is not None:
                ev.set()
        self._wake.set()

    def can_start(self, provider: str) -> bool:
        """A request may start the provider's process: it is stopped (or being stopped by us), and on demand or
        stopped by us (idle, room). Never a fatal one: that waits for `corectl start`."""
        name = self.process_of(provider)
        if name is None:
            return False
        if name in self._starts:
            return True
        if name in self._stopping and name in self._ours:
            return True
        return self.effects.stopped(name) and (self._settings[name].on_demand or name in self._ours)

    def demand(self, provider: str) -> asyncio.Task[bool] | None:
        """Start the provider's process for a request, in the background (one start per process, whoever asks).
        Returns the start (True once ready, False if it failed: routing then says why), or None when this
        provider cannot be started by a request."""
        name = self.process_of(provider)
        if name is None or not self.can_start(provider):
            return None
        self.policy.touch(name)
        task = self._starts.get(name)
        if task is None:
            self.effects.coming(name)
            task = asyncio.get_running_loop().create_task(self._start_logged(name), name=f"on-demand:{name}")
            self._starts[name] = task
            task.add_done_callback(self._start_done)
        return task

    def _start_done(self, task: asyncio.Task[bool]) -> None:
        for name, t in list(self._starts.items()):
            if t is task:
                del self._starts[name]

    async def _start_logged(self, name: str) -> bool:
        try:
            await self.ensure(name)
            return True
        except StartFailed as e:
            log.warning("%s: not started on demand: %s", name, e)
            return False
        except Exception:  # the requests waiting on it get "not started", never our exception
            log.exception("%s: on-demand start failed", name)
            return False

    # -- starting and stopping ------------------------------------------------------------------------------

    async def ensure(self, name: str, *, wait: bool = True) -> None:
        """Start `name` (making room first) and (`wait`) wait until it is ready. Raises StartFailed. Not waiting
        (a start by hand) frees the next swap sooner; the starting process still counts against the budget."""
        await self._stopped(name)
        if name in self.effects.ready():
            return
        async with self._swap:
            await self._stopped(name)
            if name in self.effects.ready():
                return
            try:
                victims = self.policy.victims(name, self.effects.holding(), fixed=self.effects.external())
            except NoRoom as e:
                self.effects.cannot_start(name, str(e))
                raise StartFailed(str(e)) from None
            if victims:
                log.info("%s: stopping %s to make room (budget %.0f MB)", name, ", ".join(victims),
                         self.policy.budget_mb)
                await asyncio.gather(*(self._stop(v, room_for(name)) for v in victims))
            self._ours.discard(name)
            self.policy.touch(name)
            why = await self.effects.start(name, wait)
            if wait:
                self.policy.touch(name)  # idle time counts from readiness, not from the start's decision
                self._wake.set()
            elif why is None:
                self._tasks.spawn(self._touch_when_ready(name), name=f"ready:{name}")
            if why is not None:
                self.effects.cannot_start(name, why)
                raise StartFailed(why)

    async def _touch_when_ready(self, name: str) -> None:
        await self.effects.wait_ready(name)
        self.policy.touch(name)
        self._wake.set()

    async def _stopped(self, name: str) -> None:
        """A stop of this process under way (idle, room, by hand) ends before it is started again."""
        fut = self._stopping.get(name)
        if fut is not None:
            await asyncio.shield(fut)

    async def stop(self, name: str, reason: str) -> None:
        """Stop by hand (corectl stop: pinned ones too) or for a reason of ours; in-flight requests finish first,
        within the process's stop timeout."""
        await self._stop(name, reason)

    async def _stop(self, name: str, reason: str) -> None:
        running = self._stopping.get(name)
        if running is not None:
            await asyncio.shield(running)
            return
        fut = self._stopping[name] = asyncio.get_running_loop().create_future()
        # Decided now, before any await: a request from here on finds it draining, and may start it again.
        self.policy.drain([name])
        if reason == IDLE or reason.startswith("room for "):
            self._ours.add(name)
        else:
            self._ours.discard(name)
        self.effects.leaving(name, reason)
        try:
            await self._wait_drained(name)
            await self.effects.stop(name, reason)
        finally:
            self.policy.drained(name)
            del self._stopping[name]
            fut.set_result(None)
            self._wake.set()

    async def _wait_drained(self, name: str) -> None:
        if self.policy.in_flight(name) == 0:
            return
        ev = self._drained[name] = asyncio.Event()
        timeout = self._settings.get(name, Settings()).stop_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await ev.wait()
        except TimeoutError:
            log.warning("%s: %d request(s) still in flight after %.0fs; stopping it anyway", name,
                        self.policy.in_flight(name), timeout)
        finally:
            self._drained.pop(name, None)

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
        return set(self.effects.ready()) - set(self.effects.external()) - set(self._stopping) - set(self._starts)

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
        for t in list(self._starts.values()):
            t.cancel()
        await asyncio.gather(*self._starts.values(), return_exceptions=True)
        await self._tasks.close()

    # -- what can be seen -----------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        holding = set(self.effects.holding())
        procs = {}
        for name, r in self.policy.residents.items():
            s = self._settings.get(name, Settings())
            procs[name] = {"resident": name in holding, "memory_mb": r.memory_mb, "pinned": r.pinned,
                           "start": "on_demand" if s.on_demand else "always", "idle_stop_s": r.idle_stop_s,
                           "idle_stop_in_s": self.policy.idle_left(name) if name in holding else None,
                           "in_flight": r.in_flight, "starting_on_demand": name in self._starts,
                           "stopping": name in self._stopping}
        return {"memory_budget_mb": self.policy.budget_mb, "memory_held_mb": self.policy.held_mb(holding),
                "processes": procs}
