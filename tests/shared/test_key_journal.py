"""Who spent what on the shared journal (real PostgreSQL): each shipped row keeps its team key's name, a shared
database of the previous schema gains the column without losing a row, and `--key` and the per-key month sums read
the same from PostgreSQL as from this machine's SQLite journal, over every instance's rows; with three real
instances, `corectl usage --by key` sums a key's requests and refusals across them."""

from __future__ import annotations

import asyncio
import os

import httpx
import orjson
import psycopg
import pytest

from coderouterd.state.journal import JOURNAL_COLUMNS
from coderouterd.state.journal_reader import NO_KEY
from coderouterd.state.shared.journal_read import PostgresJournal
from coderouterd.state.shared.schema import LATEST, journal_column_type, migrate
from coderouterd.state.shared.shipper import read_local, ship
from coderouterd.state.usage import usage_by_key
from tests.fakes.runner import FakeServer
from tests.shared.test_team_keys import _corectl, _daemon, _status
from tests.support import cli
from tests.support.wait import wait_for
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


def test_three_instances_usage_by_key_reads_every_instance(tmp_path, pg_dsn):
    """Three real daemons on one PostgreSQL: a key's requests served by each are shipped to the shared journal,
    and `corectl --json usage --by key` (the shared journal, as the config says) sums them across instances;
    `--local` keeps to one machine's."""
    chat = {"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}
    with FakeServer("openai", name="local", models=["m"]) as up:
        ds = [_daemon(tmp_path, n, up.url, pg_dsn) for n in ("a", "b", "c")]
        try:
            for d in ds:
                d.start()
            assert wait_for(lambda: all(_status(d)["shared"]["up"] for d in ds), 30)
            secret = _corectl(ds[0], "keys", "create", "alice")["key"]
            other = _corectl(ds[0], "keys", "create", "bob", "--profiles", "nope")["key"]
            for d in ds:
                assert wait_for(lambda d=d: _status(d)["keys"]["counts"]["active"] == 2, 30)
            for i, d in enumerate(ds):  # alice: 1 on a, 2 on b, 3 on c; bob refused once on each (scope)
                for _ in range(i + 1):
                    r = httpx.post(d.url + "/v1/chat/completions", json=chat, timeout=30,
                                   headers={"authorization": f"Bearer {secret}"})
                    assert r.status_code == 200, r.text
                r = httpx.post(d.url + "/v1/chat/completions", json=chat, timeout=30,
                               headers={"authorization": f"Bearer {other}"})
                assert r.status_code == 403 and "bob" in r.text

            def shared_usage() -> dict | None:
                u = _corectl(ds[0], "usage", "--by", "key")
                by = {e["name"]: e for e in u["keys"]}
                return by if by.get("alice", {}).get("requests") == 6 and by.get("bob", {}).get("refused") == 3 \
                    else None

            by = wait_for(shared_usage, 30)
            assert by, _corectl(ds[0], "usage", "--by", "key")
            assert by["bob"]["refusals"] == {"key_scope": 3} and by["alice"]["input_tokens"] > 0
            # the dashboard's Keys view on any instance reads the shared journal too (a key's cap is the team's)
            view = httpx.get(ds[0].url + "/ui/api/keys", headers={"authorization": f"Bearer {secret}"},
                             timeout=10).json()
            assert view["source"] == "shared"
            assert {k["name"]: k["requests"] for k in view["keys"]} == {"alice": 6, "bob": 3}
            env = {**os.environ, **ds[2].env, "CODEROUTER_SOCKET": str(ds[2].state_dir / "coderouterd.sock")}
            local = orjson.loads(cli.corectl(["--json", "usage", "--local"], env=env).stdout)
            assert {e["name"]: e["requests"] for e in local["keys"]} == {"alice": 3, "bob": 1}
            # the shared database holds the key's name on each row, never its secret
            with psycopg.connect(pg_dsn) as c:
                rows = c.execute("SELECT key_name, count(*) FROM cr_journal GROUP BY 1 ORDER BY 1").fetchall()
                assert ("alice", 6) in rows and ("bob", 3) in rows
                assert not c.execute("SELECT 1 FROM cr_journal WHERE attempts LIKE %s OR key_name LIKE %s",
                                     (f"%{secret}%", "crk_%")).fetchall()
        finally:
            for d in ds:
                d.stop()
