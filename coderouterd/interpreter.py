"""Interpreter settings for a latency-bound server: the cyclic garbage collector and the GIL.

The collector.
After start-up the daemon holds a few hundred thousand long-lived objects (imported modules, pydantic models,
the config). A full collection walks them all (20-30 ms on the benchmark VM, measured with `gc.callbacks`),
and one arrives every few thousand requests: the worst tail a request could meet. `gc.freeze()` moves what
exists once the daemon is up into a generation the collector never scans; what requests allocate is still
collected as before. A larger first threshold makes young collections rarer: a request's objects are freed by
reference counting, and only the few that survive it count towards the threshold.

The GIL. The event-bus writer thread (journal, audit, metrics) works in bursts of a few milliseconds. While it
holds the GIL the event loop waits up to the switch interval before the interpreter makes the writer let go;
CPython's default is 5 ms, i.e. a request arriving during a burst could wait 5 ms. At 0.5 ms the loop waits
at most that long, and the writer's burst is simply spread out."""

from __future__ import annotations

import gc
import sys

# (gen0, gen1, gen2) thresholds; CPython's default is (700, 10, 10).
THRESHOLDS = (7000, 20, 20)
SWITCH_INTERVAL_S = 0.0005


def settle() -> None:
    """Call once the daemon has finished starting (imports done, config built). Idempotent."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
