"""allocator.py: the memory a big transient buffer used goes back to the OS (issue 23: RSS flat in the soak while
hostile upstreams send answers up to their 16 MB bound). Measured in a fresh process, as the daemon runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from coderouterd import allocator

pytestmark = pytest.mark.skipif(allocator._glibc() is None, reason="glibc only (elsewhere there is nothing to do)")

# Twenty answers of 16 MB read in 64 KB chunks, as read_capped reads them, with small allocations that outlive
# each one in between (what a running daemon always has): the RSS they leave behind, in MB.
PROGRAM = textwrap.dedent("""
    import os, sys, time
    from coderouterd import allocator
    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
    if sys.argv[1] == "on":
        assert allocator.keep_large_buffers_off_heap()
    keep = []
    base = rss()
    for _ in range(20):
        parts = [os.urandom(65536) for _ in range(256)]
        body = b"".join(parts)
        keep.append(bytearray(3000))
        del parts, body
        if sys.argv[1] == "on":
            allocator.released(16 << 20)
    if sys.argv[1] == "on":  # the last ask is answered TRIM_DELAY_S after it
        deadline = time.monotonic() + 10
        while (allocator._trimmer._asked.is_set() or allocator._trimmer.trims == 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
    print(round(rss() - base, 1), allocator._trimmer.trims)
""")


def _left_behind(mode: str) -> tuple[float, int]:
    out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, timeout=60,
                         check=True).stdout.split()
    return float(out[0]), int(out[1])


def test_big_answers_read_and_let_go_leave_no_memory_behind():
    kept_before, _ = _left_behind("off")
    kept_after, trims = _left_behind("on")
    assert kept_before >= 16  # what the soak saw: glibc keeps at least one answer's worth
    assert kept_after < 4 and 1 <= trims < 20  # debounced: at most one trim per TRIM_DELAY_S, not one per ask


def test_small_reads_ask_for_nothing(monkeypatch):
    asked = []
    monkeypatch.setattr(allocator._trimmer, "ask", lambda: asked.append(1))
    allocator.released(allocator.TRIM_AFTER_BYTES - 1)
    assert asked == []
    allocator.released(allocator.TRIM_AFTER_BYTES)
    assert asked == [1]


# A request body of ~95 KB parsed again and again, as the proxy does (issue 25, item 6): orjson's parser takes a
# scratch buffer of about 12x the document, which a 1 MB mmap threshold mapped and unmapped on every parse.
PARSE = textwrap.dedent("""
    import resource, sys, orjson
    from coderouterd import allocator
    if sys.argv[1] == "on":
        assert allocator.keep_large_buffers_off_heap()
    blocks = [{"type": "text", "text": "t" * 40, "n": i} for i in range(1400)]
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": blocks}]})
    keep = []
    for _ in range(20):
        orjson.loads(raw); keep.append(bytearray(3000))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(100):
        orjson.loads(raw); keep.append(bytearray(3000))
    print(len(raw), (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 100)
""")


def test_a_request_sized_parse_does_not_map_its_scratch_buffer_every_time():
    out = subprocess.run([sys.executable, "-c", PARSE, "on"], capture_output=True, text=True, timeout=60,
                         check=True).stdout.split()
    size, faults = int(out[0]), float(out[1])
    assert 80_000 < size < 120_000
    assert faults < 8  # at a 1 MB mmap threshold: ~30 page faults per parse
