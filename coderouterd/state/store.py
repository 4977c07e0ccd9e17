"""SQLite-backed state: namespaced JSON key/value pairs and the request journal.

Callers (on the event loop) only touch an in-memory mirror; a background thread writes changes in
batches. A broken database — missing directory, locked, corrupt, read-only, disk full — never
raises into callers: the mirror keeps serving, `healthy`/`problem` say what is wrong, a
PersistenceFault event is published once per distinct problem, and the store keeps retrying.
Opening the file (checked, private, migrated) and moving a corrupt one aside are store_file.py's.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from coderouterd.state.events import Event, PersistenceFault, RequestFinished
from coderouterd.state.journal import INSERT_SQL, row_from_event
from coderouterd.state.store_file import is_corruption, move_aside, open_checked

log = logging.getLogger(__name__)

_UPSERT = (
    "INSERT INTO kv (namespace, key, value_json, updated_at) VALUES (?, ?, ?, ?) ON CONFLICT(namespace, key)"
    " DO UPDATE SET value_json = excluded.value_json, updated_at = excluded.updated_at"
)


# Rows (and keys) per write transaction. In WAL mode a transaction needs its pages in the -wal file and again
# in the database at checkpoint: after a long disk-full outage one transaction of 50,000 pending rows needed
# ~33 MB free before anything could be written. Small batches make progress with a few hundred KB.
WRITE_BATCH = 256

class Store:
    def __init__(
        self,
        path: Path,
        *,
        flush_interval_s: float = 1.0,
        bus: Any | None = None,
        retry_s: float = 5.0,
        busy_timeout_ms: int = 1000,
        journal_retention_days: float = 90.0,
        purge_every_s: float = 3600.0,
        max_pending_journal: int = 50_000,
        clock: Callable[[], float] = time.time,
    ):
        self.path = Path(path)
        self.flush_interval_s = flush_interval_s
        self.retry_s = retry_s
        self.busy_timeout_ms = busy_timeout_ms
        self.journal_retention_days = journal_retention_days
        self.purge_every_s = purge_every_s
        self.max_pending_journal = max_pending_journal
        self.healthy = True
        self.problem: str | None = None
        self.dropped_journal_rows = 0  # since start: rows that waited for a broken database and were given up
        self._dropped_this_outage = 0
        self._out_of_space = False  # the last write failed for space: checkpoint before writing again
        self._failures = 0  # failures so far: a flush without a new one is a real recovery
        self._bus = bus
        self._clock = clock
        self._conn: sqlite3.Connection | None = None
        self._loaded = False
        self._mirror: dict[str, dict[str, Any]] = {}
        # Latest serialisation of every live key, so a recreated database can be refilled from
        # memory without serialising objects another thread may be mutating.
        self._serialized: dict[tuple[str, str], bytes] = {}
        self._pending: dict[tuple[str, str], bytes | None] = {}
        self._pending_journal: list[tuple] = []
        self._lock = threading.Lock()  # guards mirror/pending swaps; held for microseconds
        self._io_lock = threading.RLock()  # guards the connection; held during SQLite work
        self._next_retry = 0.0
        self._last_purge = float("-inf")
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def open(self) -> None:
        self._closed = False
        try:
            with self._io_lock:
                self._connect()
        except Exception as exc:  # a bug here must still not take the daemon down
            self._fail(f"open failed: {exc}")
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="state-store", daemon=True)
            self._thread.start()

    def get(self, namespace: str, key: str, default: Any = None) -> Any:
        ns = self._mirror.get(namespace)
        if ns is None:
            return default
        return ns.get(key, default)

    def set(self, namespace: str, key: str, value: Any) -> None:
        """Values are treated as immutable once set: call set() again after changing one."""
        try:
            data = orjson.dumps(value)
        except TypeError:
            log.error("state %s/%s: value of type %s is not JSON-serialisable", namespace, key, type(value))
            return
        k = (namespace, key)
        with self._lock:
            self._mirror.setdefault(namespace, {})[key] = value
            self._serialized[k] = data
            self._pending[k] = data

    def delete(self, namespace: str, key: str) -> None:
        k = (namespace, key)
        with self._lock:
            ns = self._mirror.get(namespace)
            if ns is not None:
                ns.pop(key, None)
            self._serialized.pop(k, None)
            self._pending[k] = None

    def items(self, namespace: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._mirror.get(namespace, {}))

    def flush(self) -> None:
        """Write pending changes now, retrying a broken database immediately."""
        self._flush(force=True)

    def close(self) -> None:
        """Final flush and close. Stop the bus first so its last journal rows get written here."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(5.0)
            self._thread = None
        self.flush()
        with self._io_lock:
            self._closed = True
            self._close_conn()

    def journal_sink(self) -> Callable[[list[Event]], None]:
        """A bus sink that appends RequestFinished events to the journal table in one transaction."""

        def journal_sink(events: list[Event]) -> None:
            rows = [row_from_event(e) for e in events if isinstance(e, RequestFinished)]
            if not rows:
                return
            with self._io_lock:
                self._pending_journal.extend(rows)
                overflow = len(self._pending_journal) - self.max_pending_journal
                if overflow > 0:
                    # Only reachable during a long outage: keep the most recent history.
                    del self._pending_journal[:overflow]
                    self._note_dropped(overflow)
                if not self._retry_due():
                    return
                failures = self._failures
                if self._conn is not None and not self._room_for_writes():
                    return
                self._write_journal()
                if self._failures == failures and not self._pending_journal and not self._pending:
                    self._ok()  # everything held in memory really reached the disk
                now = self._clock()
                if self._conn is not None and now - self._last_purge >= self.purge_every_s:
                    self._last_purge = now  # retention runs here, in the writer thread, at most hourly
                    self.purge_journal(self.journal_retention_days)

        return journal_sink

    def purge_journal(self, older_than_days: float) -> int:
        """Delete journal rows older than the cutoff; returns how many went (0 if unavailable)."""
        cutoff = self._clock() - older_than_days * 86400.0
        with self._io_lock:
            if self._conn is None:
                return 0
            cur = self._transaction(lambda conn: conn.execute("DELETE FROM journal WHERE ts < ?", (cutoff,)))
            return cur.rowcount if cur is not None else 0

    def _run(self) -> None:
        while not self._stop.wait(self.flush_interval_s):
            self._flush(force=False)

    def _flush(self, *, force: bool) -> None:
        try:
            with self._io_lock:
                if self._closed or not (force or self._retry_due()):
                    return
                if self._conn is None and not self._connect():
                    return
                failures = self._failures
                if not self._room_for_writes():
                    return
                self._write_kv()
                self._write_journal()
                # Recovered only when a whole flush went through: one successful small write on a nearly full
                # disk, followed by the next failing, used to flap the status every retry.
                if self._failures == failures and not self._pending and not self._pending_journal:
                    self._ok()
        except Exception as exc:  # never let a bug here kill the flusher or reach a caller
            self._fail(f"flush failed: {exc}")

    def _room_for_writes(self) -> bool:
        """After a write failed for space, first move what the WAL holds into the database and truncate it.
        Otherwise each retry appends its batch to the WAL, which takes the space the checkpoint needs, and the
        store ends up holding its backlog twice (in the WAL and, at the checkpoint, in the database)."""
        if not self._out_of_space or self._conn is None:
            return True
        try:
            busy, frames, moved = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            self._fail(f"write failed: {exc}")
            return False
        if busy or frames != moved:  # -1/-1: not in WAL mode; a reader in the way: try again next time
            if frames >= 0:
                self._fail("write failed: database or disk is full")
                return False
        self._out_of_space = False
        return True

    def _retry_due(self) -> bool:
        return self.healthy or self._clock() >= self._next_retry

    def _connect(self) -> bool:
        if self._conn is not None:
            return True
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return self._fail(f"cannot create state directory {self.path.parent}: {exc.strerror or exc}")
        try:
            conn = open_checked(self.path, self.busy_timeout_ms)
        except Exception as exc:
            if not is_corruption(exc):
                return self._fail(f"cannot open {self.path}: {exc}")
            aside = move_aside(self.path)
            if aside is None:
                return self._fail(f"database {self.path} is corrupt and could not be moved aside")
            log.error("state database %s was corrupt (%s); moved to %s", self.path, exc, aside)
            self._publish(
                PersistenceFault(component="store", problem=f"corrupt database moved to {aside.name}", recovered=True)
            )
            try:
                conn = open_checked(self.path, self.busy_timeout_ms)
            except Exception as exc2:
                return self._fail(f"cannot create fresh database {self.path}: {exc2}")
        self._conn = conn
        if not self._loaded:
            self._load_mirror(conn)
        else:
            # Reconnecting after an outage (maybe to a fresh file): make the database match memory.
            with self._lock:
                for k, data in self._serialized.items():
                    self._pending.setdefault(k, data)
        return True

    def _load_mirror(self, conn: sqlite3.Connection) -> None:
        rows = conn.execute("SELECT namespace, key, value_json FROM kv").fetchall()
        with self._lock:
            for namespace, key, value_json in rows:
                k = (namespace, key)
                if k in self._pending:
                    continue  # set or deleted in memory while the database was unreachable
                try:
                    value = orjson.loads(value_json)
                except orjson.JSONDecodeError:
                    log.warning("state %s/%s holds invalid JSON; ignored", namespace, key)
                    continue
                self._mirror.setdefault(namespace, {})[key] = value
                self._serialized[k] = value_json.encode() if isinstance(value_json, str) else value_json
            self._loaded = True

    def _close_conn(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None

    def _write_kv(self) -> None:
        if self._conn is None:
            return
        with self._lock:
            batch, self._pending = self._pending, {}
        if not batch:
            return
        now = self._clock()
        items = list(batch.items())
        for start in range(0, len(items), WRITE_BATCH):
            part = items[start:start + WRITE_BATCH]
            upserts = [(ns, key, data.decode(), now) for (ns, key), data in part if data is not None]
            deletes = [k for k, data in part if data is None]

            def work(conn: sqlite3.Connection, upserts: list[tuple[str, str, str, float]] = upserts,
                     deletes: list[tuple[str, str]] = deletes) -> bool:
                conn.executemany(_UPSERT, upserts)
                conn.executemany("DELETE FROM kv WHERE namespace = ? AND key = ?", deletes)
                return True

            if self._transaction(work) is None:
                with self._lock:
                    for k, data in items[start:]:
                        self._pending.setdefault(k, data)  # a newer set() since the swap wins
                return

    def _write_journal(self) -> None:
        if not self._pending_journal:
            return
        if self._conn is None and (self._closed or not self._connect()):
            return
        # Oldest first, a batch at a time: what fits on a nearly full disk is written, the rest waits.
        while self._pending_journal:
            rows = self._pending_journal[:WRITE_BATCH]

            def insert(conn: sqlite3.Connection, rows: list = rows) -> sqlite3.Cursor:
                return conn.executemany(INSERT_SQL, rows)

            if self._transaction(insert) is None:
                return
            del self._pending_journal[:len(rows)]

    @property
    def dropped_this_outage(self) -> int:
        return self._dropped_this_outage

    def _note_dropped(self, n: int) -> None:
        if self.dropped_journal_rows == 0:
            log.error("state store: journal rows are being dropped (more than %d waiting for the disk); "
                      "the count is reported when the store recovers", self.max_pending_journal)
        self.dropped_journal_rows += n
        self._dropped_this_outage += n

    def _transaction(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run `work` in one write transaction; its result, or None after recording the failure."""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            self._write_failed(exc)
            return None
        return result

    def _write_failed(self, exc: sqlite3.Error) -> None:
        msg = str(exc)
        if "full" in msg:
            self._out_of_space = True
        if is_corruption(exc) or "readonly" in msg or "disk i/o" in msg.lower() or "no such table" in msg:
            # The handle itself is suspect: reopen (and re-check / move aside) on the next retry.
            self._close_conn()
        self._fail(f"write failed: {msg}")

    def _fail(self, problem: str) -> bool:
        self._failures += 1
        self._next_retry = self._clock() + self.retry_s
        changed = problem != self.problem
        self.healthy = False
        self.problem = problem
        if changed:
            log.error("state store unhealthy: %s (keeping state in memory, retrying every %gs)", problem, self.retry_s)
            self._publish(PersistenceFault(component="store", problem=problem))
        return False

    def _ok(self) -> None:
        if self.healthy:
            return
        old = self.problem or ""
        self.healthy = True
        self.problem = None
        lost, self._dropped_this_outage = self._dropped_this_outage, 0
        if lost:
            old += f"; {lost} journal rows dropped during the outage (the oldest; metadata only)"
        log.warning("state store recovered (was: %s)", old)
        self._publish(PersistenceFault(component="store", problem=old, recovered=True))

    def _publish(self, event: Event) -> None:
        if self._bus is not None:
            self._bus.publish(event)
