"""Waiting for something a test can observe, instead of sleeping for as long as it usually takes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# The shortest ceiling any wait gets. A wait that passes returns the moment its condition holds, so a long ceiling
# costs a green run nothing; a short one has only ever turned a loaded machine (two cores, the suite's workers, a
# real model and other builds) into a red run. A test that means "this happens within N seconds" is a benchmark.
MIN_CEILING_S = 30.0


def wait_for(pred: Callable[[], T], timeout: float = MIN_CEILING_S, step: float = 0.05) -> T:
    """Call `pred` every `step` seconds until it returns something truthy, for at most `timeout` seconds (never
    less than MIN_CEILING_S); the last value either way, so `assert wait_for(...)` fails with what was last seen.
    The deadline is generous on purpose: on a loaded machine a flush or a restart takes many times its idle
    duration, and a passing wait returns as soon as the condition holds."""
    deadline = time.monotonic() + max(timeout, MIN_CEILING_S)
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()
