"""Which local models stay resident: the memory budget's arithmetic, the least-recently-used choice of what to
stop to make room, and idle deadlines. Pure: no processes, no I/O, no event loop; time comes from an injected
clock, and what "holds memory" is handed in by the caller (ondemand.py), who owns the processes.

A process holds its memory from the moment its start is decided until its stop has completed: a process still
stopping counts, so a start never overlaps the stop that made room for it.

Requests in flight are not counted here: the count is each upstream's (upstream/upstream.py), read through the
injected `in_flight(process)`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass


class NoRoom(Exception):
    """Starting a process cannot fit in the budget whatever is stopped (pinned ones, or too big alone)."""


@dataclass
class Resident:
    """One managed process as the policy sees it."""

    name: str
    memory_mb: float = 0.0  # 0: unknown (an estimate failed and none was configured): counts as nothing
    pinned: bool = False
    idle_stop_s: float = 0.0  # 0: never stopped for idleness
    admitted: int = 0  # requests whose turn it is (it came up for them) that have not begun yet: kept for them
    last_used: float = 0.0  # clock time of the last request's start or end
    draining: bool = False  # chosen to stop: takes no new request
    ready_at: float | None = None  # clock time it last became ready by a start of ours (minimum residency)
    load_s: float | None = None  # learned from its own starts: decision to ready, smoothed


class ResidencyPolicy:
    def __init__(self, budget_mb: float = 0.0, *, clock: Callable[[], float], min_resident_s: float = 0.0,
                 in_flight: Callable[[str], int] = lambda _name: 0) -> None:
        """`in_flight(process)`: requests being served by it now (its upstreams' one count)."""
        self.budget_mb = budget_mb
        self.clock = clock
        self._in_flight = in_flight
        # A model started by us is not stopped again (idle, room) sooner than this after it became ready: the
        # hysteresis against A B A B (a stop by hand, a reload or shutdown ignore it).
        self.min_resident_s = min_resident_s
        self.residents: dict[str, Resident] = {}

    # -- configuration ------------------------------------------------------------------------------------

    def configure(self, residents: Iterable[Resident], budget_mb: float) -> None:
        """Take a new set of processes (a reload); what was learned about the kept ones (use, load) stays."""
        old = self.residents
        self.residents = {}
        for r in residents:
            prev = old.get(r.name)
            if prev is not None:
                r.admitted, r.last_used, r.draining = prev.admitted, prev.last_used, prev.draining
                r.ready_at, r.load_s = prev.ready_at, prev.load_s
            self.residents[r.name] = r
        self.budget_mb = budget_mb

    # -- use ------------------------------------------------------------------------------------------------

    def begin(self, name: str) -> bool:
        """A request starts on this process (its upstream counts it). False when it is being stopped: the request
        must not go there."""
        r = self.residents.get(name)
        if r is None:
            return True
        if r.draining:
            return False
        r.last_used = self.clock()
        return True

    def end(self, name: str) -> None:
        """A request on it ended (its upstream's count is down already): it was used now."""
        r = self.residents.get(name)
        if r is None:
            return
        r.last_used = self.clock()

    def started(self, name: str, load_s: float | None) -> None:
        """It became ready after a start of ours that took `load_s` (None: not measured, e.g. not waited for).
        The load time learned is smoothed (half the last, half what was known): one slow cold start from disk
        does not define it, two do."""
        r = self.residents.get(name)
        if r is None:
            return
        now = self.clock()
        r.ready_at = r.last_used = now
        if load_s is not None and load_s >= 0:
            r.load_s = load_s if r.load_s is None else 0.5 * r.load_s + 0.5 * load_s

    def resident_until(self, name: str) -> float:
        """When its minimum residency ends (a time already past when it has none)."""
        r = self.residents.get(name)
        if r is None or r.ready_at is None:
            return float("-inf")
        return r.ready_at + self.min_resident_s

    def busy(self, name: str) -> bool:
        """Requests are in flight on it, or were promised it (admitted) and have not begun yet."""
        r = self.residents.get(name)
        return r is not None and (self._in_flight(name) > 0 or r.admitted > 0)

    def touch(self, name: str) -> None:
        """A request wants this process (it is being started for it): it is the most recently used."""
        r = self.residents.get(name)
        if r is not None:
            r.last_used = self.clock()

    # -- the budget -----------------------------------------------------------------------------------------

    def held_mb(self, holding: Collection[str]) -> float:
        return sum(r.memory_mb for n, r in self.residents.items() if n in holding)

    def victims(self, name: str, holding: Collection[str], fixed: Collection[str] = ()) -> list[str]:
        """What must stop before `name` starts: idle ones before busy ones, then least recently used first (ties:
        the bigger first, as it frees more). Empty when it fits, or when there is no budget. `fixed`: holding but
        not ours to stop (adopted by URL), treated like pinned ones. Raises NoRoom when nothing would make it
        fit."""
        want = self.residents.get(name)
        if self.budget_mb <= 0 or want is None or name in holding:
            return []
        need = want.memory_mb
        if need > self.budget_mb:
            raise NoRoom(f"{name} needs {need:,.0f} MB, more than [models] memory_budget_mb = "
                         f"{self.budget_mb:,.0f}")
        held = self.held_mb(holding)
        if held + need <= self.budget_mb:
            return []
        others = [r for n, r in self.residents.items() if n in holding and n != name]
        candidates = sorted((r for r in others if not r.pinned and r.name not in fixed),
                            key=lambda r: (self._in_flight(r.name) > 0 or r.admitted > 0, r.last_used, -r.memory_mb))
        chosen: list[str] = []
        for r in candidates:
            if held + need <= self.budget_mb:
                break
            chosen.append(r.name)
            held -= r.memory_mb
        if held + need > self.budget_mb:
            kept = [r for r in others if r.pinned or r.name in fixed]
            what = ", ".join(f"{r.name} ({r.memory_mb:,.0f} MB)" for r in kept) or "nothing"
            raise NoRoom(f"{name} needs {need:,.0f} MB and the budget of {self.budget_mb:,.0f} MB cannot make room: "
                         f"pinned {what}")
        return chosen

    def drain(self, names: Iterable[str]) -> None:
        for n in names:
            r = self.residents.get(n)
            if r is not None:
                r.draining = True

    def drained(self, name: str) -> None:
        r = self.residents.get(name)
        if r is not None:
            r.draining = False

    def in_flight(self, name: str) -> int:
        return self._in_flight(name) if name in self.residents else 0

    # -- idleness -------------------------------------------------------------------------------------------

    def idle_deadline(self, name: str) -> float | None:
        """When this process is due for an idle stop if nothing uses it (None: never, or busy now)."""
        r = self.residents.get(name)
        if r is None or r.idle_stop_s <= 0 or self._in_flight(name) or r.admitted or r.draining:
            return None
        return max(r.last_used + r.idle_stop_s, self.resident_until(name))

    def idle_due(self, ready: Collection[str]) -> list[str]:
        """Ready processes whose idle time is up, now."""
        now = self.clock()
        return [n for n in self.residents if n in ready
                and (d := self.idle_deadline(n)) is not None and d <= now]

    def next_deadline(self, ready: Collection[str]) -> float | None:
        deadlines = [d for n in self.residents if n in ready and (d := self.idle_deadline(n)) is not None]
        return min(deadlines) if deadlines else None

    def idle_left(self, name: str) -> float | None:
        """Seconds until this process's idle stop (None: no idle stop pending)."""
        d = self.idle_deadline(name)
        return None if d is None else max(0.0, d - self.clock())
