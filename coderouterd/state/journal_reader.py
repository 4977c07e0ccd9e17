"""The one reader of the request journal: recent rows, one request's row, the names it holds, and the trend reads
(latency series, cost per day, cache-busts), with this machine's SQLite file or the shared PostgreSQL journal
behind it (state/shared/journal_read.py).

Every query is written once, here, in the SQL both databases speak; a backend only says how it connects, how it
orders rows that share a timestamp, and which of its driver's errors mean "unreadable". So `corectl journal`,
`corectl explain`, `replay compare`, the admin API and the dashboard read the same rows the same way, whichever
journal they are pointed at.

Reads are blocking (sqlite3, psycopg): the daemon runs each in a worker thread (admin/history.py), corectl calls
them directly. Each call opens its own short connection, read-only on SQLite, so a query can never block or
corrupt the daemon's writes.
"""

from __future__ import annotations

import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from coderouterd.state.journal import JOURNAL_COLUMNS, OUTCOMES, decode_row, epoch
from coderouterd.state.refusals import REASON_SQL, REFUSAL_SQL

# A trend reads at most this many of the newest rows in its window: bounded time and memory whatever the load.
MAX_SERIES_ROWS = 50_000
MAX_BUSTS = 20

SERIES_COLUMNS: tuple[str, ...] = ("ts", "provider", "latency_ms", "ttfb_ms", "input_tokens", "output_tokens",
                                   "cache_read_tokens", "cache_write_tokens", "cost_usd", "status", "error_class")
_COLS = ", ".join(JOURNAL_COLUMNS)

# One statement runner for the length of a connection: (sql with ? placeholders, arguments) -> every row.
Execute = Callable[[str, Sequence[object]], list[tuple[Any, ...]]]
TimeArg = datetime | float | int | None
# `--key -`: the requests no team key came with (an operator key, open loopback).
NO_KEY = "-"


class JournalUnreadable(Exception):
    """The journal is there but cannot be read now (locked past the timeout, corrupt, the database down).
    `detail` is the driver's one line (never a password: a DSN is shown redacted)."""

    def __init__(self, where: str, detail: str, *, shared: bool) -> None:
        self.where = where
        self.detail = detail
        self.shared = shared
        what = f"the shared journal at {where}" if shared else f"the journal {where}"
        super().__init__(f"cannot read {what}: {detail}")


class JournalReader(ABC):
    """A journal to read. `where` is what a person is shown (a path, or a DSN without its password)."""

    where: str
    shared: bool = False
    # Names that can be filtered on: SQL columns, never user input.
    name_columns: tuple[str, ...] = ("provider", "profile")
    # Columns selected before the journal's own (the shared journal's `instance`), added to each row.
    _lead: tuple[str, ...] = ()
    _table = "journal"

    # -- what a backend says ---------------------------------------------------------------------------------

    @abstractmethod
    def _session(self) -> AbstractContextManager[Execute]:
        """A context manager yielding an Execute for one connection; a journal that does not exist yet (no file,
        no table) answers every statement with no rows. Driver errors come out as JournalUnreadable."""

    @abstractmethod
    def _order(self, newest_first: bool) -> str:
        """ORDER BY for whole rows: by time, then by the order they were written (ties share a timestamp)."""

    def _scope(self) -> list[tuple[str, object]]:
        """Filters every row read carries (the shared journal's --instance)."""
        return []

    def _day(self) -> str:
        """The UTC day index of a row from a start (the one ? argument): floor((ts - start) / 86400)."""
        return "CAST(FLOOR((ts - ?) / 86400) AS INTEGER)"

    def _bucket(self) -> str:
        """A row's bucket index from a start, by a step (two ? arguments: start, step)."""
        return "CAST(FLOOR((ts - ?) / ?) AS INTEGER)"

    def _unreadable(self, detail: str) -> JournalUnreadable:
        """What a backend's driver error becomes (`detail`: the driver's one line, never a password)."""
        return JournalUnreadable(self.where, detail, shared=self.shared)

    # -- reads -----------------------------------------------------------------------------------------------

    def _run(self, sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
        with self._session() as execute:
            rows: list[tuple[Any, ...]] = execute(sql, args)
            return rows

    def _row(self, raw: Sequence[Any]) -> dict[str, Any]:
        n = len(self._lead)
        out = decode_row(raw[n:])
        for i, name in enumerate(self._lead):
            out[name] = raw[i]
        return out

    def _select(self) -> str:
        return f"SELECT {', '.join((*self._lead, _COLS))} FROM {self._table}"

    def rows(self, since: TimeArg = None, until: TimeArg = None, provider: str | None = None,
             profile: str | None = None, limit: int | None = None, outcome: str | None = None,
             key: str | None = None) -> list[dict[str, Any]]:
        """Rows oldest first; with `limit`, the newest `limit` rows (still oldest first).

        `key`: a team key's name, or NO_KEY for the requests that came without one.
        `since` is inclusive, `until` exclusive; both accept a datetime (naive = UTC) or epoch seconds.
        `outcome`: one of OUTCOMES (ok, error, fallback); errors as replay.is_error counts them.
        """
        where: list[str] = []
        args: list[object] = []
        filters = [("ts >= ?", epoch(since)), ("ts < ?", epoch(until)), ("provider = ?", provider),
                   ("profile = ?", profile), *((f"{c} = ?", v) for c, v in self._scope())]
        for clause, value in filters:
            if value is not None:
                where.append(clause)
                args.append(value)
        if outcome is not None:
            where.append(OUTCOMES[outcome])
        if key == NO_KEY:
            where.append("key_name IS NULL")
        elif key is not None:
            where.append("key_name = ?")
            args.append(key)
        sql = self._select()
        if where:
            sql += " WHERE " + " AND ".join(where)
        if limit is not None:
            sql += f" ORDER BY {self._order(True)} LIMIT ?"
            args.append(int(limit))
        else:
            sql += f" ORDER BY {self._order(False)}"
        raw = self._run(sql, args)
        if limit is not None:
            raw.reverse()
        return [self._row(r) for r in raw]

    def row(self, request_id: str) -> dict[str, Any] | None:
        """The newest row of one request, or None. A request id names one request whichever instance served it,
        so this is never scoped to an instance."""
        raw = self._run(f"{self._select()} WHERE request_id = ? ORDER BY ts DESC LIMIT 1", (request_id,))
        return self._row(raw[0]) if raw else None

    def names(self) -> dict[str, set[str]]:
        """Every name the journal has rows for, per column (names since removed from the config too)."""
        out: dict[str, set[str]] = {c: set() for c in self.name_columns}
        with self._session() as execute:
            for column in self.name_columns:
                out[column] = {r[0] for r in execute(f"SELECT DISTINCT {column} FROM {self._table}", ()) if r[0]}
        return out

    def series_rows(self, since: float, until: float, *, limit: int = MAX_SERIES_ROWS) -> list[dict[str, Any]]:
        """The columns a latency/cache trend needs, oldest first (the newest `limit` of [since, until))."""
        scope = self._scope()
        extra = "".join(f" AND {c} = ?" for c, _ in scope)
        raw = self._run(f"SELECT {', '.join(SERIES_COLUMNS)} FROM {self._table} WHERE ts >= ? AND ts < ?{extra} "
                        "ORDER BY ts DESC LIMIT ?", (since, until, *(v for _, v in scope), int(limit)))
        raw.reverse()
        return [dict(zip(SERIES_COLUMNS, r, strict=True)) for r in raw]

    def daily_cost(self, start: float, end: float) -> dict[str, dict[int, float]]:
        """provider -> {day index from `start` (UTC days): cost in USD} over [start, end), summed by the database."""
        scope = self._scope()
        extra = "".join(f" AND {c} = ?" for c, _ in scope)
        raw = self._run(f"SELECT COALESCE(provider, ''), {self._day()}, SUM(cost_usd) FROM {self._table} "
                        f"WHERE ts >= ? AND ts < ?{extra} GROUP BY 1, 2",
                        (start, start, end, *(v for _, v in scope)))
        out: dict[str, dict[int, float]] = {}
        for provider, day, cost in raw:
            if provider:  # a request no provider served cost nothing and is no provider's
                out.setdefault(provider, {})[int(day)] = float(cost or 0.0)
        return out

    # -- who spent what (issue 41) ----------------------------------------------------------------------------

    def usage_by_key(self, since: float, until: float, *, last_used: bool = True) -> dict[str | None, dict[str, Any]]:
        """key name (None: no team key) -> requests (refusals included), refused, input/output/cached tokens
        (cache reads; cache writes apart), spend_usd, refusals {reason: n} and last_used (the key's newest row before
        `until`, earlier months included: a past month's report stays what it was), summed by the database.
        `last_used` False: leave it None and skip its read, which walks every row before `until` (the Keys view's
        last-minute rate needs only the window's sums)."""
        scope = self._scope()
        extra = "".join(f" AND {c} = ?" for c, _ in scope)
        sargs = tuple(v for _, v in scope)
        out: dict[str | None, dict[str, Any]] = {}
        with self._session() as execute:
            for name, n, refused, i, o, cr, cw, usd in execute(
                    f"SELECT key_name, COUNT(*), SUM(CASE WHEN {REFUSAL_SQL} THEN 1 ELSE 0 END), SUM(input_tokens),"
                    " SUM(output_tokens), SUM(cache_read_tokens), SUM(cache_write_tokens), SUM(cost_usd)"
                    f" FROM {self._table} WHERE ts >= ? AND ts < ?{extra} GROUP BY key_name",
                    (since, until, *sargs)):
                out[name] = {"name": name, "requests": int(n), "refused": int(refused or 0),
                             "input_tokens": int(i or 0), "output_tokens": int(o or 0),
                             "cached_tokens": int(cr or 0), "cache_write_tokens": int(cw or 0),
                             "spend_usd": float(usd or 0.0), "refusals": {}, "last_used": None}
            for name, reason, n in execute(
                    f"SELECT key_name, {REASON_SQL}, COUNT(*) FROM {self._table}"
                    f" WHERE ts >= ? AND ts < ?{extra} AND {REFUSAL_SQL} GROUP BY 1, 2", (since, until, *sargs)):
                if name in out:
                    out[name]["refusals"][str(reason)] = int(n)
            lasts = execute(f"SELECT key_name, MAX(ts) FROM {self._table} WHERE ts < ?{extra}"
                            " GROUP BY key_name", (until, *sargs)) if last_used else ()
            for name, last in lasts:
                if name in out:
                    out[name]["last_used"] = float(last) if last is not None else None
                else:  # no row in the window: still say when the key was last used
                    out[name] = {"name": name, "requests": 0, "refused": 0, "input_tokens": 0, "output_tokens": 0,
                                 "cached_tokens": 0, "cache_write_tokens": 0, "spend_usd": 0.0, "refusals": {},
                                 "last_used": float(last) if last is not None else None}
        return out

    def key_series(self, since: float, until: float, step: float) -> dict[str | None, dict[int, tuple[int, int, float]]]:
        """key name -> {bucket index from `since` by `step`: (requests, refusals, spend USD)} over [since, until)."""
        scope = self._scope()
        extra = "".join(f" AND {c} = ?" for c, _ in scope)
        raw = self._run(f"SELECT key_name, {self._bucket()}, COUNT(*), SUM(CASE WHEN {REFUSAL_SQL} THEN 1 ELSE 0 END),"
                        f" SUM(cost_usd) FROM {self._table} WHERE ts >= ? AND ts < ?{extra} GROUP BY 1, 2",
                        (since, step, since, until, *(v for _, v in scope)))
        out: dict[str | None, dict[int, tuple[int, int, float]]] = {}
        for name, bucket, n, refused, usd in raw:
            out.setdefault(name, {})[int(bucket)] = (int(n), int(refused or 0), float(usd or 0.0))
        return out

    def cache_busts(self, *, limit: int = MAX_BUSTS) -> list[dict[str, Any]]:
        """The newest cache-busts the journal recorded, newest first, with the segment that changed."""
        scope = self._scope()
        extra = "".join(f" AND {c} = ?" for c, _ in scope)
        raw = self._run(f"SELECT ts, request_id, provider, profile, cache_bust, cache_read_tokens FROM {self._table} "
                        f"WHERE cache_bust IS NOT NULL AND cache_bust != ''{extra} ORDER BY ts DESC LIMIT ?",
                        (*(v for _, v in scope), int(limit)))
        return [{"ts": ts, "request_id": rid, "provider": prov, "profile": prof, "segment": seg,
                 "cached_tokens": cached} for ts, rid, prov, prof, seg, cached in raw]


class SqliteJournal(JournalReader):
    """This machine's journal: the `journal` table of the daemon's state.db, opened read-only per call. A missing
    file, or one whose journal table (or a column added by a later migration) is not there yet, reads as empty:
    the daemon has not written it yet."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.where = str(self.path)

    def _order(self, newest_first: bool) -> str:
        return "ts DESC, id DESC" if newest_first else "ts, id"

    def _day(self) -> str:
        # SQLite has no FLOOR before 3.35; every row is at or after the start, so truncation is the floor.
        return "CAST((ts - ?) / 86400 AS INTEGER)"

    def _bucket(self) -> str:
        return "CAST((ts - ?) / ? AS INTEGER)"

    @contextmanager
    def _session(self) -> Iterator[Execute]:
        if not self.path.is_file():
            yield _nothing
            return
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=5.0)
        except sqlite3.Error as e:
            raise self._unreadable(str(e)) from e

        def execute(sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
            try:
                return conn.execute(sql, args).fetchall()
            except sqlite3.OperationalError as e:
                if "no such table" in str(e) or "no such column" in str(e):
                    return []  # a journal not created yet, or from before a migration added what is asked
                raise self._unreadable(str(e)) from e
            except sqlite3.Error as e:
                raise self._unreadable(str(e)) from e

        try:
            yield execute
        finally:
            conn.close()


def _nothing(sql: str, args: Sequence[object]) -> list[tuple[Any, ...]]:
    return []


def journal_rows(db_path: str | Path, since: TimeArg = None, until: TimeArg = None, provider: str | None = None,
                 profile: str | None = None, limit: int | None = None,
                 outcome: str | None = None, key: str | None = None) -> list[dict[str, Any]]:
    """SqliteJournal(db_path).rows(...): the shorthand tests, bench/ and scripts read a state.db with."""
    return SqliteJournal(db_path).rows(since=since, until=until, provider=provider, profile=profile, limit=limit,
                                       outcome=outcome, key=key)
