"""Restart back-off starts over once a child has served for a healthy period (supervisord's startsecs model), with
a real child process and an injected clock: no test waits for the period to pass."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys

import pytest

from coderouterd.supervise import ProcessSpec, ProcessState, Supervisor

PY = sys.executable
SLEEPER = [PY, "-c", "import time; time.sleep(120)"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _crash_and_get_delay(mp, events: list, clock: Clock | None = None) -> float:
    """kill -9 the ready child; returns the back-off delay of the restart the supervisor schedules."""
    assert await mp.wait_ready(5)
    seen = len(events)
    os.kill(mp.pid, signal.SIGKILL)
    for _ in range(500):
        restarts = [e for e in events[seen:] if e[1] == "restarting"]
        if restarts:
            return float(re.search(r"in ([0-9.]+)s", restarts[0][3]).group(1))
        await asyncio.sleep(0.01)
    raise AssertionError(f"no restart after the crash: {events[seen:]}")


@pytest.mark.parametrize("healthy_after_s", [None, 5.0])
def test_backoff_starts_over_after_the_child_was_ready_for_the_healthy_period(tmp_path, healthy_after_s):
    clock = Clock()
    events: list[tuple] = []
    backoff = (0.05, 0.1, 0.2)
    period = healthy_after_s if healthy_after_s is not None else max(backoff)

    async def scenario() -> None:
        sup = Supervisor(log_dir=tmp_path, on_event=lambda *a: events.append(a), backoff=backoff, clock=clock)
        mp = sup.add(ProcessSpec(name="p", command=SLEEPER, startsecs=0.05, stop_timeout_s=2, max_restarts=10,
                                 restart_window_s=1e6, healthy_after_s=healthy_after_s))
        try:
            await mp.start()
            # A crash loop climbs the steps...
            assert await _crash_and_get_delay(mp, events) == 0.05
            assert await _crash_and_get_delay(mp, events) == 0.1
            # ...but ready a little less than the healthy period is still part of the loop...
            assert await mp.wait_ready(5)
            clock.now += period * 0.9
            assert await _crash_and_get_delay(mp, events) == 0.2
            # ...and ready for the whole period, the child has proved itself: the next crash is news.
            assert await mp.wait_ready(5)
            clock.now += period
            assert await _crash_and_get_delay(mp, events) == 0.05
            assert mp.snapshot()["restarts_recent"] == 1
            assert await mp.wait_ready(5) and mp.state is ProcessState.READY
        finally:
            await sup.shutdown()

    asyncio.run(scenario())
