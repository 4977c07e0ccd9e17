"""Interpreter settings for a latency-bound server: the cyclic garbage collector and the GIL.

The collector. Once started the daemon holds some 60,000 long-lived container objects (imported modules,
pydantic models, the config). A full collection walks them all: 24 ms each, twice in 12,000 proxied requests
on the benchmark VM (measured with `gc.callbacks`), the worst tail a request could meet. `gc.freeze()` moves
what exists once the daemon is up into a generation the collector never scans. The first threshold is 7000
instead of 700: a request's objects are freed by reference counting, but a 95 KB body alive during its
request makes a young collection cost 0.2 ms at 700 (one request in 25 paid it) and 3.3 ms at 7000 (one in
500): fewer requests pay, which is what a p99 counts. (Total collector time was about the same.)

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
