"""Event bus: producers append, one writer thread hands batches to sinks.

The request path only ever pays for a deque append (plus any cheap in-memory sinks registered with
`in_thread=False`). Everything that touches disk — SQLite journal, audit file — runs in the single
writer thread, in batches, so a slow disk shows up as queue depth, never as request latency.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from coderouterd.state.events import Event

log = logging.getLogger(__name__)

Sink = Callable[[list[Event]], None]


class _FlushMarker:
    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = threading.Event()


@dataclass(slots=True)
class _Subscription:
    sink: Callable
    kinds: frozenset[str] | None


class EventBus:
    def __init__(self, *, flush_interval_s: float = 0.25, max_batch: int = 1000, max_queue: int = 100_000):
        self.flush_interval_s = flush_interval_s
        self.max_batch = max_batch
        # Bound memory if sinks stall for a long time: newest events are dropped and counted.
        self.max_queue = max_queue
        self.dropped = 0
        self.sink_errors: dict[str, int] = {}
        self._queue: deque = deque()
        self._thread_subs: list[_Subscription] = []
        self._sync_subs: list[_Subscription] = []
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # Serialises inline draining (bus not running) against the writer thread's own drains.
        self._drain_lock = threading.Lock()

    def subscribe(self, sink: Callable, *, kinds: set[str] | None = None, in_thread: bool = True) -> None:
        sub = _Subscription(sink, frozenset(kinds) if kinds is not None else None)
        # Copy-on-write so publish() and the writer iterate a list nobody mutates under them.
        if in_thread:
            self._thread_subs = [*self._thread_subs, sub]
        else:
            self._sync_subs = [*self._sync_subs, sub]

    def publish(self, event: Event) -> None:
        for sub in self._sync_subs:
            if sub.kinds is None or event.kind in sub.kinds:
                try:
                    sub.sink([event])
                except Exception:
                    self._sink_failed(sub.sink)
        q = self._queue
        if len(q) >= self.max_queue:
            self.dropped += 1
            return
        q.append(event)
        if len(q) >= self.max_batch:
            self._wake.set()

    @property
    def pending(self) -> int:
        return len(self._queue)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="event-writer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        thread = self._thread
        if thread is not None:
            self._stopping.set()
            self._wake.set()
            thread.join(timeout)
            if not thread.is_alive():
                self._thread = None
        if not self.running:
            # Anything published after the writer's last drain (or with no writer at all).
            self._drain()

    def flush(self, timeout: float = 5.0) -> bool:
        """Block until every event published before this call has been handed to the sinks."""
        if not self.running:
            self._drain()
            return True
        marker = _FlushMarker()
        self._queue.append(marker)
        self._wake.set()
        return marker.done.wait(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait(self.flush_interval_s)
            self._wake.clear()
            self._drain()
            if self._stopping.is_set():
                self._drain()
                return

    def _drain(self) -> None:
        with self._drain_lock:
            q = self._queue
            batch: list[Event] = []
            while True:
                try:
                    item = q.popleft()
                except IndexError:
                    break
                if isinstance(item, _FlushMarker):
                    self._dispatch(batch)
                    batch = []
                    item.done.set()
                    continue
                batch.append(item)
                if len(batch) >= self.max_batch:
                    self._dispatch(batch)
                    batch = []
            self._dispatch(batch)

    def _dispatch(self, batch: list[Event]) -> None:
        if not batch:
            return
        for sub in self._thread_subs:
            events = batch if sub.kinds is None else [e for e in batch if e.kind in sub.kinds]
            if not events:
                continue
            try:
                sub.sink(events)
            except Exception:
                self._sink_failed(sub.sink)

    def _sink_failed(self, sink: Callable) -> None:
        name = getattr(sink, "__qualname__", None) or repr(sink)
        count = self.sink_errors.get(name, 0)
        self.sink_errors[name] = count + 1
        if count == 0:
            # Once per sink: a sink failing on every batch must not flood the log.
            log.exception("event sink %s failed; further failures are only counted", name)
