"""The restart budget of one managed process: how long it waits before its next start, and when it stops trying.

A crash loop must end (FATAL, until someone starts it by hand) instead of reloading a model every few seconds for
good, while a server that crashes once a day must never run out of restarts. So restarts are counted within a
sliding window, each one waits the next step of the back-off, and a crash after the process has served for a
healthy period starts the count from nothing. Apart from the state machine (process.py) because it is plain
arithmetic over an injected clock: it moves no state and awaits nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from .spec import ProcessSpec


class RestartBudget:
    """Reads its limits (max_restarts, restart_window_s, healthy_after_s) from the spec at each call, as the
    process reads the rest of it."""

    def __init__(self, spec: ProcessSpec, backoff: Sequence[float], clock: Callable[[], float]) -> None:
        if not backoff:
            raise ValueError("backoff needs at least one delay")
        self._spec = spec
        self._backoff = tuple(float(b) for b in backoff)
        self._clock = clock
        self._times: deque[float] = deque()  # when each restart within the window was taken

    def recent(self, now: float) -> int:
        """Restarts taken within the window that ends at `now`."""
        while self._times and now - self._times[0] > self._spec.restart_window_s:
            self._times.popleft()
        return len(self._times)

    def take(self, now: float) -> float | None:
        """Spend one restart: the delay before it, or None when max_restarts are spent within the window."""
        recent = self.recent(now)
        if recent >= self._spec.max_restarts:
            return None
        self._times.append(now)
        return self._backoff[min(recent, len(self._backoff) - 1)]

    def clear(self) -> None:
        self._times.clear()

    def proved(self, ready_since: float | None) -> bool:
        """Ready since `ready_since` (None: not ready) for the healthy period: a crash now is news, not part of a
        crash loop."""
        if ready_since is None:
            return False
        period = self._spec.healthy_after_s
        if period is None:
            period = max(self._backoff)
        return self._clock() - ready_since >= period
