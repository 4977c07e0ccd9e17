"""The dashboard's live feed: events from the bus, fanned out to the browsers watching, each through a bounded queue.

Cost while nobody watches: the bus's writer thread calls `sink` with each batch and it returns at once (no
viewer); the request path never sees it (the sink runs in the writer thread, not in `publish`).

While someone watches: the writer thread turns the batch into small metadata dicts (never prompt or answer
text: only the fields in `_FIELDS`) and hands them to the event loop in one call. Each viewer has a deque of at
most `queue_len` items: a browser that reads slowly (or not at all) loses its oldest events, counted and
reported to it, and the daemon's memory stays at viewers x queue_len whatever it does. The number of viewers
is capped too.

Notable events (a tool loop stopped, drift, a cache-bust, a breaker or health change, a process restarting, a
budget blocked: everything but finished requests) are also kept, the newest `RECENT_EVENTS`, whether anyone
watches or not: a page opened later shows them (its feed and its "needs attention" strip), not only the ones
that happen while it is open. One kind check per event and a bounded deque: the writer thread's whole cost.

Every kind the feed keeps is audited, so what happened before this daemon started is read back from the audit log
(state/audit.read_audit, the one audit reader) once, on the first read of the recent events (`load_history`, in a
worker thread): a restart does not empty the feed nor the attention strip's tool-loop alerts (issue 43, E3).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from ..admin.words import event_tone
from ..state.audit import read_audit
from ..state.events import (
    BreakerTransition,
    BudgetBlocked,
    BudgetWarning,
    CacheBust,
    DriftAction,
    DriftDetected,
    DriftRecovered,
    Event,
    GuardFired,
    HealthTransition,
    ProcessEvent,
    RequestFinished,
)

QUEUE_LEN = 256
MAX_VIEWERS = 16
RECENT_EVENTS = 50

# What a browser is told of each kind: metadata the journal keeps, nothing from a request's body.
_FIELDS: dict[str, tuple[str, ...]] = {
    RequestFinished.kind: ("request_id", "ingress", "profile", "provider", "model_requested", "model_used",
                           "status", "error_class", "latency_ms", "ttfb_ms", "input_tokens", "output_tokens",
                           "cache_read_tokens", "cache_write_tokens", "cost_usd", "streaming", "fallback_count",
                           "race_outcome", "cache_bust", "key_name"),
    BreakerTransition.kind: ("provider", "old", "new", "reason"),
    HealthTransition.kind: ("provider", "old", "new", "reason"),
    CacheBust.kind: ("request_id", "provider", "segment", "cause", "expected_tokens", "cached_tokens"),
    ProcessEvent.kind: ("provider", "process", "event", "pid", "detail"),
    GuardFired.kind: ("request_id", "guard", "action", "detail"),
    DriftDetected.kind: ("provider", "model", "score", "action"),
    DriftAction.kind: ("provider", "model", "action", "ok", "detail"),
    DriftRecovered.kind: ("provider", "model"),
    BudgetWarning.kind: ("provider", "spent_usd", "cap_usd", "ratio"),
    BudgetBlocked.kind: ("provider", "spent_usd", "cap_usd"),
}
# Every kind the feed carries, as server-sent event names (the page listens to these).
KINDS: tuple[str, ...] = tuple(_FIELDS)
_AUDITED_KINDS = tuple(k for k in KINDS if k != RequestFinished.kind)
_MAX_STR = 200  # a model name or a reason is shown, a 3 MB one is not carried


def project(ev: Event) -> dict | None:
    """The browser's view of one event, or None for kinds the feed does not carry."""
    names = _FIELDS.get(ev.kind)
    if names is None:
        return None
    if isinstance(ev, ProcessEvent) and not ev.primary:
        return None
    return _project(ev.kind, ev.ts, {n: getattr(ev, n) for n in names})


def project_record(record: dict[str, Any]) -> dict | None:
    """The browser's view of one audit log line (state/audit.py: the event's fields, `ts` in ISO-8601 UTC), the
    same as `project` gave for the event when it happened; None for kinds the feed does not carry."""
    kind = record.get("kind")
    if not isinstance(kind, str):
        return None
    names = _FIELDS.get(kind)
    if names is None or kind == RequestFinished.kind:
        return None
    if kind == ProcessEvent.kind and record.get("primary") is False:
        return None
    try:
        ts = datetime.fromisoformat(str(record.get("ts")).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return _project(kind, ts, {n: record.get(n) for n in names})


def _project(kind: str, ts: float, values: dict[str, Any]) -> dict:
    # tone: ok | warn | idle | bad, the daemon's reading of a state change (admin/words.py); None for other kinds
    tone = event_tone(kind, values)
    out: dict = {"kind": kind, "ts": ts, "tone": tone.value if tone is not None else None}
    for n, v in values.items():
        if isinstance(v, str):
            v = str(v)[:_MAX_STR]  # str(): a StrEnum arrives as its plain name
        elif isinstance(v, dict):  # a guard's or a process's detail: flat metadata, each value bounded
            v = {str(k)[:_MAX_STR]: str(x)[:_MAX_STR] if isinstance(x, str) else x
                 for k, x in list(v.items())[:20] if isinstance(x, str | int | float | bool) or x is None}
        out[n] = v
    if kind == ProcessEvent.kind:
        # Self-healing speaks of providers without a process of ours too (issue 43, E8): the line names the
        # provider and says it is not a managed process, never an empty name.
        out["managed"] = bool(out.get("process"))
        if not out["managed"]:
            out["process"] = out.get("provider") or ""
    return out


class AuditSource(Protocol):
    """Where the audit log is (telemetry.Telemetry): its directory, and whether state is kept at all."""

    state_dir: Path
    enabled: bool


class Viewer:
    """One browser's queue. Filled on the loop by the feed, emptied by its stream."""

    __slots__ = ("queue", "dropped", "wake", "closed")

    def __init__(self, queue_len: int) -> None:
        self.queue: deque = deque(maxlen=queue_len)
        self.dropped = 0
        self.wake = asyncio.Event()
        self.closed = False

    def offer(self, items: list[dict]) -> None:
        q = self.queue
        for item in items:
            if len(q) == q.maxlen:
                self.dropped += 1  # the deque drops its oldest on append
            q.append(item)
        self.wake.set()

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    def take(self) -> tuple[list[dict], int]:
        """Everything queued and how many were dropped since the last take."""
        items = list(self.queue)
        self.queue.clear()
        dropped, self.dropped = self.dropped, 0
        self.wake.clear()
        return items, dropped


class LiveFeed:
    def __init__(self, *, queue_len: int = QUEUE_LEN, max_viewers: int = MAX_VIEWERS) -> None:
        self.queue_len = queue_len
        self.max_viewers = max_viewers
        self._viewers: set[Viewer] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self.closed = False
        # Appended by the writer thread, copied by the loop: deque appends and list() are atomic under the GIL.
        self._recent: deque = deque(maxlen=RECENT_EVENTS)
        # What the audit log holds from before this feed existed (load_history): read once, then never changed.
        self.started = time.time()
        self._past: list[dict] = []
        self._history: asyncio.Task | None = None

    def recent(self) -> list[dict]:
        """The newest notable events (no finished requests: the journal has those), oldest first: the audit
        log's from before this daemon started (once loaded), then this daemon's own."""
        mine = list(self._recent)
        if not self._past:
            return mine
        return (self._past + mine)[-RECENT_EVENTS:]

    async def load_history(self, source: AuditSource) -> None:
        """Read the events from before this start out of the audit log, once (later calls wait for the first)."""
        if self._history is None:
            self._history = asyncio.ensure_future(self._load(source))
        await asyncio.shield(self._history)

    async def _load(self, source: AuditSource) -> None:
        where = getattr(source, "state_dir", None)
        if not source.enabled or where is None:
            return
        before = self.started

        def read() -> list[dict]:
            # A few more than kept: some lines are kinds or copies the feed does not show.
            records = read_audit(where, n=RECENT_EVENTS * 4, kind=_AUDITED_KINDS)
            items = [i for i in map(project_record, records) if i is not None and i["ts"] < before]
            return items[-RECENT_EVENTS:]

        try:
            self._past = await asyncio.to_thread(read)
        except OSError:
            self._past = []  # an unreadable audit log costs the page its history, not its answer

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def join(self) -> Viewer | None:
        """A new viewer (on the loop), or None when the cap is reached or the feed is closed."""
        if self.closed or len(self._viewers) >= self.max_viewers:
            return None
        self._loop = asyncio.get_running_loop()
        v = Viewer(self.queue_len)
        with self._lock:
            self._viewers = {*self._viewers, v}  # copy-on-write: the writer thread iterates without a lock
        return v

    def leave(self, v: Viewer) -> None:
        with self._lock:
            self._viewers = self._viewers - {v}

    def close(self) -> None:
        """The server is stopping: every stream ends, so a watching browser does not hold up the drain."""
        self.closed = True
        for v in self._viewers:
            v.close()

    def sink(self, events: list[Event]) -> None:
        """The bus's writer thread, once per batch."""
        for ev in events:
            if ev.kind != RequestFinished.kind and ev.kind in _FIELDS:
                item = project(ev)
                if item is not None:
                    self._recent.append(item)
        if not self._viewers:
            return
        items = [d for d in map(project, events) if d is not None]
        loop = self._loop
        if items and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._fanout, items)
            except RuntimeError:  # the loop closed between the check and the call
                pass

    def _fanout(self, items: list[dict]) -> None:
        for v in self._viewers:
            v.offer(items)
