"""Waiting for something a test can observe, instead of sleeping for as long as it usually takes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float = 10.0, step: float = 0.05) -> T:
    """Call `pred` every `step` seconds until it returns something truthy, for at most `timeout` seconds; the
    last value either way, so `assert wait_for(...)` fails with what was last seen. The deadline is generous on
    purpose: on a loaded machine a flush or a restart takes many times its idle duration, and a passing wait
    returns as soon as the condition holds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    return pred()
