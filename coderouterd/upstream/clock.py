"""Injectable time sources: routing decisions read time only through a clock so tests never sleep."""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    def now(self) -> float:
        """Monotonic seconds; only differences are meaningful."""
        ...


class SystemClock:
    def now(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class ManualClock:
    """A clock that moves only when told to; `wall` moves with it so persisted wall times stay coherent."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_700_000_000.0) -> None:
        self._now = float(start)
        self._wall = float(wall_start)

    def now(self) -> float:
        return self._now

    def wall(self) -> float:
        return self._wall

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go back")
        self._now += seconds
        self._wall += seconds

    def set_wall(self, value: float) -> None:
        # Lets tests simulate a daemon restart: wall time jumps while the monotonic origin is unrelated.
        self._wall = float(value)


def wall_time(clock: Clock) -> float:
    """Wall-clock seconds for persistence. Monotonic time means nothing after a restart, so snapshots
    store wall time; a clock that only offers `now()` falls back to the system wall clock."""
    wall = getattr(clock, "wall", None)
    return float(wall()) if callable(wall) else time.time()
