"""Trends over the journal (the dashboard's Spend, Latency and Cache panels): bucketed series whose figures are
replay.summarize's, cost per day summed by SQLite (the journal reader), the outcome filter agreeing with replay.is_error."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from coderouterd.state.events import RequestFinished
from coderouterd.state.journal import OUTCOMES
from coderouterd.state.journal_reader import SqliteJournal, journal_rows
from coderouterd.state.replay import is_error, summarize
from coderouterd.state.store import Store
from coderouterd.state.trends import buckets, provider_series

MONTH = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
DAY = 86_400.0


def _ev(rid, ts, provider="cloud", **kw):
    return RequestFinished(rid, "anthropic", "default", provider, ts=ts, **kw)


@pytest.fixture
def db(tmp_path):
    store = Store(tmp_path / "state.db", flush_interval_s=60, journal_retention_days=36_500)  # March stays
    store.open()
    events = [
        _ev("a", MONTH + 10, cost_usd=0.5, latency_ms=100, ttfb_ms=10),
        _ev("b", MONTH + 20, cost_usd=0.25, latency_ms=300, ttfb_ms=30, status=529, error_class="overloaded"),
        _ev("c", MONTH + DAY + 5, cost_usd=1.0, latency_ms=200, ttfb_ms=20, cache_bust="tools changed"),
        _ev("d", MONTH + DAY + 6, provider="local", latency_ms=50, input_tokens=100, cache_read_tokens=300,
            status=0, error_class="client_disconnected"),
        _ev("e", MONTH + 2 * DAY, provider="local", latency_ms=70, status=0),
        _ev("f", MONTH - 5, cost_usd=9.0),  # last month
    ]
    store.journal_sink()(events)
    store.close()
    return tmp_path / "state.db"


def test_cost_per_day_is_summed_per_provider_within_the_month(db):
    per_day = SqliteJournal(db).daily_cost(MONTH, MONTH + 31 * DAY)
    assert per_day["cloud"] == {0: 0.75, 1: 1.0}
    assert per_day["local"] == {1: 0.0, 2: 0.0}


def test_series_use_replays_figures_per_provider_and_bucket(db):
    rows = SqliteJournal(db).series_rows(MONTH, MONTH + 3 * DAY)
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows) and len(rows) == 5
    s = provider_series(rows, MONTH, MONTH + 3 * DAY, DAY)
    assert s["t"] == [MONTH, MONTH + DAY, MONTH + 2 * DAY]
    cloud = s["providers"]["cloud"]
    day0 = summarize([r for r in rows if r["provider"] == "cloud" and r["ts"] < MONTH + DAY])
    assert cloud["total_p50"][0] == day0["p50_latency_ms"] == 200
    assert cloud["total_p95"][0] == day0["p95_latency_ms"]
    assert cloud["ttft_p50"][0] == 20 and cloud["requests"] == [2, 1, None]
    assert cloud["total_p50"][2] is None  # served nothing that day: a gap, not a zero
    assert s["providers"]["local"]["cache_hit_ratio"][1] == pytest.approx(0.75)


def test_series_read_only_the_window_and_at_most_the_limit(db):
    assert SqliteJournal(db).series_rows(MONTH + DAY, MONTH + 2 * DAY) == [
        r for r in SqliteJournal(db).series_rows(MONTH, MONTH + 3 * DAY) if MONTH + DAY <= r["ts"] < MONTH + 2 * DAY]
    newest = SqliteJournal(db).series_rows(MONTH, MONTH + 3 * DAY, limit=2)
    assert [r["ts"] for r in newest] == [MONTH + DAY + 6, MONTH + 2 * DAY]


def test_buckets_are_aligned_so_a_refresh_keeps_them():
    assert buckets(125, 300, 60) == [120, 180, 240]
    assert buckets(130, 300, 60) == [120, 180, 240]


def test_cache_busts_newest_first_with_their_segment(db):
    assert [(b["request_id"], b["segment"]) for b in SqliteJournal(db).cache_busts()] == [("c", "tools changed")]


@pytest.mark.parametrize("outcome", sorted(OUTCOMES))
def test_outcome_filter_agrees_with_replay(db, outcome):
    every = journal_rows(db)
    expected = {"ok": lambda r: not is_error(r), "error": is_error,
                "fallback": lambda r: (r["fallback_count"] or 0) > 0}[outcome]
    assert [r["request_id"] for r in journal_rows(db, outcome=outcome)] == \
        [r["request_id"] for r in every if expected(r)]


def test_a_missing_journal_reads_as_empty(tmp_path):
    missing = tmp_path / "none.db"
    journal = SqliteJournal(missing)
    assert journal.series_rows(0, 1) == [] and journal.daily_cost(0, 1) == {} and journal.cache_busts() == []


def test_tokens_and_generation_speed_per_bucket_and_unserved_requests_apart(tmp_path):
    store = Store(tmp_path / "state.db", flush_interval_s=60, journal_retention_days=36_500)
    store.open()
    store.journal_sink()([
        _ev("a", MONTH + 10, input_tokens=100, output_tokens=50, cache_read_tokens=400, latency_ms=1100, ttfb_ms=100),
        _ev("b", MONTH + 20, input_tokens=10, output_tokens=150, latency_ms=1300, ttfb_ms=300),
        _ev("c", MONTH + 30, input_tokens=7, output_tokens=0, latency_ms=50, ttfb_ms=None),  # nothing generated
        _ev("x", MONTH + 40, provider="", status=503, error_class="no_provider", cost_usd=0.0),
    ])
    store.close()
    db = tmp_path / "state.db"
    s = provider_series(SqliteJournal(db).series_rows(MONTH, MONTH + DAY), MONTH, MONTH + DAY, DAY)
    cloud = s["providers"]["cloud"]
    assert cloud["input_tokens"] == [117] and cloud["output_tokens"] == [200] and cloud["cached_tokens"] == [400]
    assert cloud["tokens_per_s"][0] == pytest.approx(200 / 2.0)  # 200 tokens over 1.0 s + 1.0 s of generation
    assert cloud["requests"] == [3]
    assert set(s["providers"]) == {"cloud"} and s["unserved"] == [1]  # never a provider named "-"
    assert set(SqliteJournal(db).daily_cost(MONTH, MONTH + DAY)) == {"cloud"}
