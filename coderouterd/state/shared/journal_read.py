"""Reading the shared journal (corectl journal, replay compare, explain): the same rows as the local journal's
readers return, from every instance, with the instance each came from; a blocking psycopg connection, since
corectl has no event loop and reads once."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from ..journal import JOURNAL_COLUMNS, _decode, _epoch

if TYPE_CHECKING:
    from psycopg import Connection

_COLS = ", ".join(JOURNAL_COLUMNS)


def _connect(dsn: str) -> Connection[Any]:
    import psycopg

    return psycopg.connect(dsn, autocommit=True, connect_timeout=5)


def _row(raw: tuple) -> dict[str, Any]:
    out = _decode(cast(Any, raw[1:]))  # a psycopg row: a plain tuple, which _decode reads as it reads sqlite3's
    out["instance"] = raw[0]
    return out


def rows(dsn: str, since: datetime | float | None = None, until: datetime | float | None = None, provider: str | None = None, profile: str | None = None,
         limit: int | None = None, instance: str | None = None) -> list[dict[str, Any]]:
    """Shared journal rows oldest first; with `limit`, the newest `limit` (still oldest first)."""
    where, args = [], []
    for clause, value in (("ts >= %s", _epoch(since)), ("ts < %s", _epoch(until)), ("provider = %s", provider),
                          ("profile = %s", profile), ("instance = %s", instance)):
        if value is not None:
            where.append(clause)
            args.append(value)
    sql = f"SELECT instance, {_COLS} FROM cr_journal"
    if where:
        sql += " WHERE " + " AND ".join(where)
    if limit is not None:
        sql += " ORDER BY ts DESC, instance, seq DESC LIMIT %s"
        args.append(int(limit))
    else:
        sql += " ORDER BY ts, instance, seq"
    with _connect(dsn) as conn:
        raw = conn.execute(sql, args).fetchall()
    if limit is not None:
        raw.reverse()
    return [_row(r) for r in raw]


def row(dsn: str, request_id: str) -> dict[str, Any] | None:
    with _connect(dsn) as conn:
        raw = conn.execute(f"SELECT instance, {_COLS} FROM cr_journal WHERE request_id = %s ORDER BY ts DESC LIMIT 1",
                           (request_id,)).fetchone()
    return None if raw is None else _row(raw)


def names(dsn: str) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {"provider": set(), "profile": set(), "instance": set()}
    with _connect(dsn) as conn:
        for column in out:
            out[column] = {r[0] for r in conn.execute(f"SELECT DISTINCT {column} FROM cr_journal").fetchall() if r[0]}
    return out
