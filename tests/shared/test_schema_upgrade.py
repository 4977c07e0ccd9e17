"""A shared database made by the previous release (schema v1: the journal without usage_estimated and key_name, no
key tables) migrates to the latest in one start, keeps its rows, and takes the new rows, cut usage and keys
included; a second start finds nothing left to do."""

from __future__ import annotations

import asyncio

import psycopg

from coderouterd.state.shared.schema import LATEST, MIGRATIONS, migrate
from tests.shared.test_key_journal import _ship
from tests.unit.test_key_usage import _journal, _month_events


def test_a_v1_database_migrates_to_the_latest(pg_dsn, tmp_path):
    assert MIGRATIONS[0][0] == 1
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE cr_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())")
        for sql in MIGRATIONS[0][1]:
            c.execute(sql)
        c.execute("INSERT INTO cr_schema (version) VALUES (1)")
        c.execute("INSERT INTO cr_journal (instance, seq, ts, request_id, status) VALUES ('old', 1, 1.0, 'r-old', 200)")

    async def up() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as c:
            return await migrate(c)

    assert asyncio.run(up()) == (1, LATEST)
    assert asyncio.run(up()) == (LATEST, LATEST)
    _ship(pg_dsn, {"east": _journal(tmp_path / "east.db", _month_events()[:2]).path})
    with psycopg.connect(pg_dsn) as c:
        rows = c.execute("SELECT request_id, key_name, usage_estimated FROM cr_journal ORDER BY ts").fetchall()
        assert rows[0] == ("r-old", None, 0) and {r[1] for r in rows[1:]} == {"alice"}
        for table in ("cr_key", "cr_key_meta", "cr_rate_grant", "cr_key_slot"):
            assert c.execute("SELECT to_regclass(%s)", (table,)).fetchone() == (table,)
