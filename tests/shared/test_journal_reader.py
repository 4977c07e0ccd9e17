"""The one journal reader on a real PostgreSQL: the shared journal answers every read (rows, one row, names, the
trend reads) exactly as this machine's SQLite journal answers it for the same rows, plus the instance each row
came from; --instance scopes the rows and trends; an unreachable database is one line that never shows the
password."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import psycopg
import pytest

from coderouterd.state.events import RequestFinished
from coderouterd.state.journal import OUTCOMES
from coderouterd.state.journal_reader import JournalUnreadable, SqliteJournal
from coderouterd.state.shared.journal_read import PostgresJournal
from coderouterd.state.shared.schema import migrate
from coderouterd.state.shared.shipper import read_local, ship
from coderouterd.state.store import Store

MONTH = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
DAY = 86_400.0


def _ev(rid: str, ts: float, provider: str = "cloud", **kw: object) -> RequestFinished:
    return RequestFinished(rid, "anthropic", kw.pop("profile", "default"), provider, ts=ts, **kw)  # type: ignore[arg-type]


def _events(prefix: str) -> list[RequestFinished]:
    return [
        _ev(f"{prefix}a", MONTH + 10, cost_usd=0.5, latency_ms=100, ttfb_ms=10, input_tokens=100, output_tokens=20),
        _ev(f"{prefix}b", MONTH + 10, cost_usd=0.25, latency_ms=300, ttfb_ms=30, status=529,
            error_class="overloaded"),  # the same second as a: written order breaks the tie
        _ev(f"{prefix}c", MONTH + DAY + 5, provider="local", profile="coding", cache_read_tokens=300,
            input_tokens=100, cache_bust="tools changed", fallback_count=1, attempts=[{"provider": "cloud"}]),
        _ev(f"{prefix}d", MONTH + 2 * DAY + 1, provider="", status=503, error_class="no_provider"),
        _ev(f"{prefix}e", MONTH + 2 * DAY - 1, cost_usd=1.0, latency_ms=200, ttfb_ms=20, streaming=True),
    ]


def _local(path, events: list[RequestFinished]) -> SqliteJournal:
    store = Store(path, flush_interval_s=60, journal_retention_days=36_500)
    store.open()
    store.journal_sink()(events)
    store.close()
    return SqliteJournal(path)


def _share(dsn: str, shipped: dict[str, object]) -> None:
    async def go() -> None:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
            await migrate(c)
            for instance, path in shipped.items():
                await ship(c, instance, read_local(path, 0))  # type: ignore[arg-type]

    asyncio.run(go())


def _without_instance(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "instance"} for r in rows]


@pytest.fixture
def journals(pg_dsn, tmp_path):
    east = _local(tmp_path / "east.db", _events("e-"))
    west = _local(tmp_path / "west.db", [_ev("w-a", MONTH + 20, provider="cloud", cost_usd=2.0, latency_ms=50)])
    _share(pg_dsn, {"east": east.path, "west": west.path})
    return east, west, pg_dsn


def test_the_shared_journal_reads_as_the_local_one(journals):
    east, _west, dsn = journals
    shared = PostgresJournal(dsn, where="postgresql://x@y/db", instance="east")
    rows = shared.rows()
    assert {r["instance"] for r in rows} == {"east"}
    assert _without_instance(rows) == east.rows()
    for kw in ({"limit": 2}, {"provider": "cloud"}, {"profile": "coding"}, {"since": MONTH + 10, "until": MONTH + DAY},
               *({"outcome": o} for o in OUTCOMES)):
        assert _without_instance(shared.rows(**kw)) == east.rows(**kw), kw
    assert _without_instance([shared.row("e-c")]) == [east.row("e-c")]  # type: ignore[list-item]
    assert shared.row("nope") is None and east.row("nope") is None
    assert shared.series_rows(MONTH, MONTH + 3 * DAY) == east.series_rows(MONTH, MONTH + 3 * DAY)
    assert shared.series_rows(MONTH, MONTH + 3 * DAY, limit=2) == east.series_rows(MONTH, MONTH + 3 * DAY, limit=2)
    # Day indexes are floored in both: a row a second before midnight is that day's, not the next one's.
    assert shared.daily_cost(MONTH, MONTH + 31 * DAY) == east.daily_cost(MONTH, MONTH + 31 * DAY) == \
        {"cloud": {0: 0.75, 1: 1.0}, "local": {1: 0.0}}
    assert shared.cache_busts() == east.cache_busts() and [b["request_id"] for b in east.cache_busts()] == ["e-c"]


def test_every_instance_unless_one_is_asked_for(journals):
    east, west, dsn = journals
    every = PostgresJournal(dsn)
    assert [(r["instance"], r["request_id"]) for r in every.rows(until=MONTH + DAY)] == \
        [("east", "e-a"), ("east", "e-b"), ("west", "w-a")]
    assert every.names() == {"provider": {"cloud", "local"}, "profile": {"default", "coding"},
                             "instance": {"east", "west"}}
    assert every.daily_cost(MONTH, MONTH + DAY) == {"cloud": {0: 2.75}}
    west_only = PostgresJournal(dsn, instance="west")
    assert _without_instance(west_only.rows()) == west.rows()
    assert west_only.daily_cost(MONTH, MONTH + DAY) == west.daily_cost(MONTH, MONTH + DAY) == {"cloud": {0: 2.0}}
    assert west_only.row("e-a") is not None  # a request id names one request, whichever instance served it


def test_a_database_without_the_schema_reads_as_empty(pg_dsn):
    fresh = PostgresJournal(pg_dsn)
    assert fresh.rows() == [] and fresh.row("r") is None and fresh.cache_busts() == []
    assert fresh.names() == {"provider": set(), "profile": set(), "instance": set()}


def test_an_unreachable_database_is_one_line_without_the_password(pg_server):
    # A database that does not exist on a server that is up: refused at connect, the password in the DSN.
    dsn = pg_server.dsn_for("no_such_db").replace("postgres@", "postgres:s3cret@", 1)
    shared = PostgresJournal(dsn, where="the redacted place")
    with pytest.raises(JournalUnreadable) as e:
        shared.rows()
    assert e.value.shared and str(e.value).startswith("cannot read the shared journal at the redacted place: ")
    assert "no_such_db" in e.value.detail and "s3cret" not in str(e.value) and "\n" not in str(e.value)
