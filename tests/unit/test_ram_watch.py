"""Memory pressure: out-of-memory errors classified, the watch's edges and order change, the fit check."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from coderouterd.health.ram_watch import RamWatch
from coderouterd.providers.errors import MEMORY_PRESSURE, http_error, is_memory_error, stream_error_reason

OOM_MESSAGES = [
    "CUDA error: out of memory",
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed: out of memory",
    "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 1073741824",
    "llama_model_load: error loading model: failed to load model",
    "model requires more system memory (21.3 GiB) than is available (7.9 GiB)",
    "Insufficient Memory (00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)",
    "[metal] failed to allocate buffer",
    "unable to allocate 2.0 GiB for the KV cache",
]
NOT_OOM = ["Internal server error", "Rate limit reached", "the request exceeds the available context size",
           "model 'x' not found", "Loading model"]


@pytest.mark.parametrize("message", OOM_MESSAGES)
def test_out_of_memory_errors_are_memory_pressure(message):
    assert is_memory_error(message)
    e = http_error(500, message)
    assert e.reason == MEMORY_PRESSURE and e.failover and e.counts_against_provider
    assert e.label == "memory_pressure:500"
    assert stream_error_reason(message) == MEMORY_PRESSURE


@pytest.mark.parametrize("message", NOT_OOM)
def test_other_errors_are_not(message):
    assert not is_memory_error(message) and http_error(500, message).reason == "http_500"


def test_watch_edges_and_prefer_remote_order():
    events: list = []
    w = RamWatch(low_mb=2000, interval_s=1, publish=events.append, probe=lambda: 0)
    w.update(3_000_000_000)
    assert not w.low and events == []
    w.update(1_000_000_000)
    w.update(900_000_000)
    assert w.low and [e.low for e in events] == [True]
    local = {"ollama", "lms"}.__contains__
    order = ["ollama", "lms", "cloud", "free"]
    notes = w.adjust_order(SimpleNamespace(memory_action="prefer_remote"), order, local)
    assert order == ["cloud", "free", "ollama", "lms"] and {n["provider"] for n in notes} == {"ollama", "lms"}
    assert "memory pressure: 0.9 GB available" in notes[0]["why"]
    order = ["ollama", "cloud"]
    assert w.adjust_order(SimpleNamespace(memory_action="warn"), order, local) == [] and order[0] == "ollama"
    w.update(2_500_000_000)
    assert not w.low and [e.low for e in events] == [True, False]
    assert w.adjust_order(SimpleNamespace(memory_action="prefer_remote"), order, local) == []


def test_check_fits_says_how_much_is_missing():
    w = RamWatch(low_mb=2000, interval_s=1, probe=lambda: 8_000_000_000)
    assert asyncio.run(w.check_fits(5_000_000_000)) is None
    why = asyncio.run(w.check_fits(20_000_000_000))
    assert "needs 20.0 GB but only 8.0 GB is available (12.0 GB missing)" in why and "--force" in why
    assert asyncio.run(w.check_fits(None)) is None
