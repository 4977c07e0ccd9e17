"""Bookkeeping that need not delay anybody: what the daemon records about a request once its answer is out.

A request's record (journal event, metrics, drift sample, decision trace) costs 0.1-0.4 ms of CPU on the
benchmark VM. Done right after the answer, it delays the client's next request, which arrives in about that
time. Deferred, it runs while the loop has nothing else to do: `while_waiting()` is called just before an
exchange sends its upstream request (the loop is then idle until the upstream answers), and a short timer
catches the rest (the last request of a burst). Readers of what the bookkeeping writes (the admin API, shutdown) call
`drain()` first, so nobody ever sees a request as missing.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger("coderouterd")

# The timer for work that no upstream wait picked up. Long enough for the next request of an agent's burst to
# arrive and reach its upstream first; short enough that the record is there when anyone could look.
FALLBACK_DELAY_S = 0.002


class AfterResponse:
    def __init__(self, delay_s: float = FALLBACK_DELAY_S) -> None:
        self.delay_s = delay_s
        self._queue: deque[tuple[Callable, tuple]] = deque()
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False

    def defer(self, fn: Callable, *args) -> None:
        """Run fn(*args) later on this loop (in order with other deferred work)."""
        self._queue.append((fn, args))
        if self._timer is None:
            try:
                self._timer = asyncio.get_running_loop().call_later(self.delay_s, self.drain)
            except RuntimeError:  # no loop (a test driving parts synchronously): run it now
                self.drain()

    def while_waiting(self) -> None:
        """The caller is about to send an upstream request and wait for the answer: deferred work runs once the
        request is on its way. Two turns of the loop, not one: aiohttp writes the request from a task of its own
        that is scheduled after this call, and work run before it would hold the request back."""
        if self._queue and not self._soon:
            self._soon = True
            loop = asyncio.get_running_loop()
            loop.call_soon(loop.call_soon, self.drain)

    def drain(self) -> None:
        self._soon = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        queue = self._queue
        while queue:
            fn, args = queue.popleft()
            try:
                fn(*args)
            except Exception:  # one request's record must never cost the others theirs
                log.exception("recording a finished request failed")

    @property
    def pending(self) -> int:
        return len(self._queue)
