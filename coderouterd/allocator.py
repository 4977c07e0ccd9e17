"""Memory that a big transient buffer used goes back to the OS (glibc on Linux; elsewhere nothing to do).

An answer may be read up to its bound (providers/limits.py: 16 MB), and a hostile upstream sends such answers on
purpose. Once Python frees the buffer (see Exchange.failed for what used to keep it), glibc still keeps what was
freed: after the first big buffer is freed its dynamic mmap threshold rises to that size, so the next ones come
from the heap, and a heap page goes back only when nothing live sits above it. RSS then wanders by tens of MB
with no leak behind it, which a soak cannot tell from one. Two measures, both cheap and both on rare paths:

- at start, a fixed mmap threshold (4 MB, TRIM_AFTER_BYTES): a single buffer that large is mapped, and unmapped
  when freed; one below it that the trimmer is not asked about stays on the heap, reused by later requests.
  With it a fixed trim threshold (8 MB, glibc's own pairing of twice the mmap threshold): fixing either turns
  off glibc's adjustment of both, and its 128 KB trim default would hand the heap's top back after every big
  request for the next to fault in again. The threshold was 1 MB until issue 25 (item 6): orjson's parser
  takes a scratch buffer of about 12x the document (1.18 MB for the 95 KB Claude Code body), so every such
  request mapped and unmapped one and faulted 33 pages in: ~150-250 µs of CPU per request on the benchmark VM
  (bench/README.md, "CPU per request by stage"). Request bodies up to ~330 KB now parse on the heap;
- after a read of at least TRIM_AFTER_BYTES, `malloc_trim(0)` shortly after and once more when the burst is over
  (on a thread of its own, debounced: a burst of big answers costs two trims), which hands back free heap pages
  wherever they are. A trim of a 100 MB heap takes about 10 ms of that thread.
"""

from __future__ import annotations

import ctypes
import sys
import threading
import time

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers
M_MMAP_THRESHOLD = -3
TRIM_AFTER_BYTES = 4 << 20  # a read this big (kept or refused) asks for a trim
MMAP_THRESHOLD_BYTES = TRIM_AFTER_BYTES  # below: on the heap, reused; at or above: mapped, and a read asks a trim
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES
TRIM_DELAY_S = 0.5  # waits for the request that read it to let go of it, and gathers a burst into one trim
SETTLE_TRIM_S = 5.0  # and once more this long after the last ask

_libc = None


def _glibc():
    global _libc
    if _libc is None:
        _libc = False
        if sys.platform.startswith("linux"):
            try:
                lib = ctypes.CDLL(None)
                if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim"):  # glibc (musl has neither)
                    _libc = lib
            except OSError:
                pass
    return _libc or None


def keep_large_buffers_off_heap() -> bool:
    """Fix glibc's mmap threshold at MMAP_THRESHOLD_BYTES and its trim threshold at TRIM_THRESHOLD_BYTES. True
    when both were set."""
    libc = _glibc()
    return libc is not None and libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and \
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES) == 1


class _Trimmer:
    """One daemon thread that trims the heap TRIM_DELAY_S after it is asked, however often it is asked."""

    def __init__(self) -> None:
        self._asked = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.trims = 0

    def ask(self) -> None:
        self._asked.set()
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name="malloc-trim", daemon=True)
                    self._thread.start()

    def _run(self) -> None:
        libc = _glibc()
        while True:
            self._asked.wait()
            time.sleep(TRIM_DELAY_S)
            self._asked.clear()
            self._trim(libc)
            # Once more when the burst is over: buffers still held by requests in flight at the first trim
            # (a big answer being relayed, its neighbours failing over) are freed after it.
            if not self._asked.wait(SETTLE_TRIM_S):
                self._trim(libc)

    def _trim(self, libc) -> None:
        if libc is not None:
            libc.malloc_trim(0)
        self.trims += 1


_trimmer = _Trimmer()


def released(nbytes: int) -> None:
    """A buffer of `nbytes` was read and is being let go: trim the heap soon if it was a big one."""
    if nbytes >= TRIM_AFTER_BYTES and _glibc() is not None:
        _trimmer.ask()
