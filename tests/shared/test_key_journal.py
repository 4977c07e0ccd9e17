"""Who spent what on the shared journal (real PostgreSQL): each shipped row keeps its team key's name, a shared
database of the previous schema gains the column without losing a row, and `--key` and the per-key month sums read
the same from PostgreSQL as from this machine's SQLite journal, over every instance's rows."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from coderouterd.state.journal import JOURNAL_COLUMNS
from coderouterd.state.journal_reader import NO_KEY
from coderouterd.state.shared.journal_read import PostgresJournal
from coderouterd.state.shared.schema import LATEST, journal_column_type, migrate
from coderouterd.state.shared.shipper import read_local, ship
from coderouterd.state.usage import usage_by_key
from tests.unit.test_key_usage import _journal, _month_events


def _ship(dsn: str, shipped: dict) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            await migrate(c)
            for instance, path in shipped.items():
                await ship(c, instance, read_local(path, 0))

    asyncio.run(go())


def test_shipped_rows_keep_their_key_and_read_as_the_local_journal(pg_dsn, tmp_path):
    east = _journal(tmp_path / "east.db", _month_events())
    _ship(pg_dsn, {"east": east.path})
    shared = PostgresJournal(pg_dsn, instance="east")
    for key in ("alice", "bob", NO_KEY, "nobody"):
        assert [r["request_id"] for r in shared.rows(key=key)] == [r["request_id"] for r in east.rows(key=key)], key
    assert shared.row("c1")["key_name"] == "carol"  # type: ignore[index]
    for month in ("2026-03", "2026-04"):
        assert usage_by_key(shared, month) == usage_by_key(east, month), month


def test_usage_sums_every_instance(pg_dsn, tmp_path):
    east = _journal(tmp_path / "east.db", _month_events())
    west = _journal(tmp_path / "west.db", _month_events())
    _ship(pg_dsn, {"east": east.path, "west": west.path})
    one = {e["name"]: e for e in usage_by_key(east, "2026-03")["keys"]}
    both = {e["name"]: e for e in usage_by_key(PostgresJournal(pg_dsn), "2026-03")["keys"]}
    assert both["alice"]["requests"] == 2 * one["alice"]["requests"]
    assert both["alice"]["spend_usd"] == pytest.approx(2 * one["alice"]["spend_usd"])
    assert both["alice"]["refusals"] == {r: 2 * n for r, n in one["alice"]["refusals"].items()}


def test_a_shared_database_of_the_previous_schema_gains_the_key_column(pg_dsn, tmp_path):
    old_columns = [c for c in JOURNAL_COLUMNS if c != "key_name"]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE cr_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        c.execute("CREATE TABLE cr_journal (instance text NOT NULL, seq bigint NOT NULL, "
                  + ", ".join(f"{col} {journal_column_type(col)}" for col in old_columns)
                  + ", PRIMARY KEY (instance, seq))")
        c.execute("INSERT INTO cr_journal (instance, seq, ts, request_id, status) VALUES ('old', 1, 1.0, 'r-old', 200)")
        # the version before the key column's (its migration is the last one): every other column is there
        c.execute("INSERT INTO cr_schema (version) VALUES (%s)", (LATEST - 1,))

    async def up() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as c:
            return await migrate(c)

    assert asyncio.run(up()) == (LATEST - 1, LATEST)
    east = _journal(tmp_path / "east.db", _month_events()[:2])
    _ship(pg_dsn, {"east": east.path})
    shared = PostgresJournal(pg_dsn)
    assert [(r["request_id"], r["key_name"]) for r in shared.rows()] == [("r-old", None), ("a1", "alice"),
                                                                          ("a2", "alice")]
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT 1 FROM pg_indexes WHERE indexname = 'cr_journal_key_ts'").fetchone() == (1,)
