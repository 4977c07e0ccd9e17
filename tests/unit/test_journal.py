import csv
import io
import sqlite3
from datetime import UTC, datetime

import orjson

from coderouterd.state.bus import EventBus
from coderouterd.state.events import HealthTransition, RequestFinished
from coderouterd.state.journal import JOURNAL_COLUMNS, export_rows
from coderouterd.state.journal_reader import JournalUnreadable, SqliteJournal, journal_rows
from coderouterd.state.store import Store

DAY = 86400.0
NOW = datetime(2025, 6, 1, tzinfo=UTC).timestamp()


def _req(i, *, ts, provider="ollama", profile="default", **kw):
    fields = dict(
        attempts=[{"provider": provider, "status": 200, "elapsed_ms": 10.0 + i}],
        model_requested="claude-sonnet-4",
        model_used="qwen3-coder:30b",
        status=200,
        latency_ms=100.0 + i,
        ttfb_ms=20.0 + i,
        input_tokens=1000 + i,
        output_tokens=50,
        cache_read_tokens=10,
        cache_write_tokens=5,
        cost_usd=0.001 * i,
        streaming=i % 2 == 0,
    )
    fields.update(kw)
    return RequestFinished(f"req-{i}", "anthropic", profile, provider, ts=ts, **fields)


def _open_store(tmp_path, clock=lambda: NOW, **kw):
    store = Store(tmp_path / "state.db", flush_interval_s=60, clock=clock, **kw)
    store.open()
    return store


def test_bus_to_journal_round_trip_and_filters(tmp_path):
    store = _open_store(tmp_path)
    bus = EventBus(flush_interval_s=0.01)
    bus.subscribe(store.journal_sink(), kinds={"request_finished"})
    bus.start()
    for i in range(10):
        provider = "ollama" if i < 6 else "anthropic"
        profile = "coding" if i % 2 else "default"
        bus.publish(_req(i, ts=NOW - DAY + i * 60, provider=provider, profile=profile))
    bus.publish(HealthTransition("ollama", "up", "down"))  # not a journal row
    bus.stop()
    store.close()

    db = tmp_path / "state.db"
    rows = journal_rows(db)
    assert [r["request_id"] for r in rows] == [f"req-{i}" for i in range(10)]
    r3 = rows[3]
    assert set(r3) == set(JOURNAL_COLUMNS)
    assert r3["attempts"] == [{"provider": "ollama", "status": 200, "elapsed_ms": 13.0}]
    assert r3["streaming"] is False and rows[2]["streaming"] is True
    assert r3["ttfb_ms"] == 23.0 and r3["cache_write_tokens"] == 5 and r3["error_class"] is None

    assert len(journal_rows(db, provider="anthropic")) == 4
    assert [r["request_id"] for r in journal_rows(db, provider="ollama", profile="coding")] == [
        "req-1",
        "req-3",
        "req-5",
    ]
    start = datetime.fromtimestamp(NOW - DAY + 2 * 60, UTC)
    until = NOW - DAY + 5 * 60
    assert [r["request_id"] for r in journal_rows(db, since=start, until=until)] == ["req-2", "req-3", "req-4"]
    # limit keeps the newest rows, still returned oldest first
    assert [r["request_id"] for r in journal_rows(db, limit=2)] == ["req-8", "req-9"]


def test_journal_never_stores_bodies(tmp_path):
    store = _open_store(tmp_path)
    store.journal_sink()([_req(1, ts=NOW)])
    store.close()
    conn = sqlite3.connect(tmp_path / "state.db")
    cols = [r[1] for r in conn.execute("PRAGMA table_info(journal)")]
    indexes = conn.execute("PRAGMA index_list(journal)").fetchall()
    conn.close()
    assert not {"body", "messages", "prompt", "response"} & set(cols)
    assert {"journal_ts", "journal_provider_ts"} <= {row[1] for row in indexes}


def test_retention_purge_runs_from_the_sink(tmp_path):
    now = [NOW]
    store = _open_store(tmp_path, clock=lambda: now[0], journal_retention_days=90, purge_every_s=3600)
    sink = store.journal_sink()
    sink([_req(0, ts=NOW - 200 * DAY), _req(1, ts=NOW - 91 * DAY), _req(2, ts=NOW - 89 * DAY)])
    # The first batch triggers a purge right after its insert.
    assert [r["request_id"] for r in journal_rows(tmp_path / "state.db")] == ["req-2"]

    sink([_req(3, ts=NOW - 100 * DAY)])  # purged again only after purge_every_s
    assert len(journal_rows(tmp_path / "state.db")) == 2
    now[0] += 3600
    sink([_req(4, ts=NOW)])
    assert [r["request_id"] for r in journal_rows(tmp_path / "state.db")] == ["req-2", "req-4"]

    assert store.purge_journal(0) == 2
    assert journal_rows(tmp_path / "state.db") == []
    store.close()


def test_rows_written_while_locked_arrive_after_recovery(tmp_path):
    now = [NOW]
    store = _open_store(tmp_path, clock=lambda: now[0], busy_timeout_ms=20, retry_s=5)
    sink = store.journal_sink()
    sink([_req(0, ts=NOW)])
    other = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    sink([_req(1, ts=NOW)])
    assert not store.healthy
    sink([_req(2, ts=NOW)])  # retry not due yet: buffered without touching the database
    other.execute("COMMIT")
    other.close()
    now[0] += 5
    sink([_req(3, ts=NOW)])
    assert store.healthy
    assert [r["request_id"] for r in journal_rows(tmp_path / "state.db")] == [f"req-{i}" for i in range(4)]
    store.close()


def test_missing_database_reads_empty(tmp_path):
    assert journal_rows(tmp_path / "nope.db") == []
    sqlite3.connect(tmp_path / "empty.db").close()
    assert journal_rows(tmp_path / "empty.db") == []


def test_export_jsonl_and_csv(tmp_path):
    store = _open_store(tmp_path)
    store.journal_sink()([_req(1, ts=NOW, error_class="timeout", status=504), _req(2, ts=NOW + 1)])
    store.close()
    rows = journal_rows(tmp_path / "state.db")

    lines = export_rows(rows, "jsonl").splitlines()
    first = orjson.loads(lines[0])
    assert first["ts"] == "2025-06-01T00:00:00.000Z" and first["status"] == 504 and first["error_class"] == "timeout"

    parsed = list(csv.DictReader(io.StringIO(export_rows(rows, "csv"))))
    assert list(parsed[0]) == list(JOURNAL_COLUMNS)
    assert parsed[1]["request_id"] == "req-2" and parsed[1]["error_class"] == ""
    assert orjson.loads(parsed[0]["attempts"])[0]["provider"] == "ollama"
    try:
        export_rows(rows, "xml")
    except ValueError as exc:
        assert "xml" in str(exc)
    else:
        raise AssertionError("unknown format accepted")


def test_journal_row_reads_one_request(tmp_path):
    journal = SqliteJournal(tmp_path / "state.db")
    assert journal.row("req-1") is None  # no database yet
    store = _open_store(tmp_path)
    store.journal_sink()([_req(1, ts=NOW), _req(2, ts=NOW + 1)])
    store.close()
    row = journal.row("req-2")
    assert row is not None and row["request_id"] == "req-2" and isinstance(row["attempts"], list)
    assert journal.row("nope") is None


def test_names_are_every_provider_and_profile_with_rows(tmp_path):
    journal = SqliteJournal(tmp_path / "state.db")
    assert journal.names() == {"provider": set(), "profile": set()}  # no database yet
    store = _open_store(tmp_path)
    store.journal_sink()([_req(1, ts=NOW, provider="ollama", profile="coding"),
                          _req(2, ts=NOW + 1, provider="anthropic", profile="default")])
    store.close()
    assert journal.names() == {"provider": {"ollama", "anthropic"}, "profile": {"coding", "default"}}


def test_an_unreadable_journal_says_where_and_why(tmp_path):
    (tmp_path / "state.db").write_bytes(b"not a database, " * 256)
    journal = SqliteJournal(tmp_path / "state.db")
    for read in (journal.rows, lambda: journal.row("r"), journal.names, journal.cache_busts):
        try:
            read()
        except JournalUnreadable as e:
            assert str(e) == f"cannot read the journal {tmp_path / 'state.db'}: {e.detail}"
            assert "not a database" in e.detail and not e.shared
        else:
            raise AssertionError("a corrupt journal read as empty")
