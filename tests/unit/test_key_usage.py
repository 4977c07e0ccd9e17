"""Who spent what (issue 41), below the daemon: each journal row names its team key (never the secret), an
existing journal gains the column without losing a row, `--key` filters, the per-key month sums (tokens, spend,
refusals by reason, last use) come from the database, and /metrics carries the key on requests, tokens, cost and
refusals."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from coderouterd.keys.model import TeamKey
from coderouterd.observe.metrics import Metrics
from coderouterd.observe.request_record import RequestRecorder
from coderouterd.observe.traces import trace_from_row
from coderouterd.state.events import RequestFinished
from coderouterd.state.journal_reader import NO_KEY, SqliteJournal
from coderouterd.state.refusals import (
    KEY_EXPIRED,
    KEY_RPM,
    KEY_SCOPE,
    REFUSAL_SQL,
    is_refusal,
    refusal_event,
)
from coderouterd.state.store import Store
from coderouterd.state.store_file import MIGRATIONS
from coderouterd.state.usage import month_window, usage_by_key

MONTH = datetime(2026, 3, 1, tzinfo=UTC).timestamp()
APRIL = datetime(2026, 4, 1, tzinfo=UTC).timestamp()
DAY = 86_400.0


def _ev(rid: str, ts: float, key: str | None, provider: str | None = "cloud", **kw) -> RequestFinished:
    return RequestFinished(rid, "anthropic", kw.pop("profile", "default"), provider, ts=ts, key_name=key, **kw)


def _journal(path, events) -> SqliteJournal:
    store = Store(path, flush_interval_s=60, journal_retention_days=36_500)
    store.open()
    store.journal_sink()(events)
    store.close()
    return SqliteJournal(path)


def _month_events() -> list[RequestFinished]:
    served = {"attempts": [{"provider": "cloud", "outcome": "ok", "reason": "ok"}]}
    return [
        # alice: two served, one refused for her rate, one for her scope, one whose upstream rate-limited her
        _ev("a1", MONTH + 10, "alice", input_tokens=100, output_tokens=20, cache_read_tokens=50,
            cache_write_tokens=7, cost_usd=0.5, **served),
        _ev("a2", MONTH + DAY, "alice", input_tokens=300, output_tokens=40, cost_usd=0.25, **served),
        refusal_event(request_id="a3", ingress="openai", status=429, reason=KEY_RPM, key_name="alice",
                      ts=MONTH + DAY + 1),
        refusal_event(request_id="a4", ingress="anthropic", status=403, reason=KEY_SCOPE, key_name="alice",
                      ts=MONTH + DAY + 2),
        # the upstream's own 429 after an attempt: an error, not the router refusing the key
        _ev("a5", MONTH + 2 * DAY, "alice", provider=None, status=429, error_class="rate_limit_error",
            attempts=[{"provider": "cloud", "outcome": "failed", "reason": "rate_limited"}]),
        # bob: one served, one stopped by a spent budget (402, skips only)
        _ev("b1", MONTH + 3 * DAY, "bob", input_tokens=10, output_tokens=5, cost_usd=2.0, **served),
        _ev("b2", MONTH + 3 * DAY + 5, "bob", provider=None, status=402, error_class="billing_error",
            attempts=[{"provider": "cloud", "outcome": "skipped", "reason": "budget"}]),
        # an expired key's refusal names it; an operator's request has no key
        refusal_event(request_id="c1", ingress="anthropic", status=401, reason=KEY_EXPIRED, key_name="carol",
                      ts=MONTH + 3 * DAY + 9),
        _ev("o1", MONTH + 4 * DAY, None, input_tokens=1, output_tokens=1, cost_usd=0.01, **served),
        # outside the month: counted in dave's last use only, and in April's sums
        _ev("d0", MONTH - DAY, "dave", cost_usd=9.0, **served),
        _ev("a6", APRIL + 5, "alice", cost_usd=100.0, **served),
    ]


def test_each_row_names_its_key_and_journal_filters_by_it(tmp_path):
    j = _journal(tmp_path / "state.db", _month_events())
    rows = j.rows()
    assert {r["request_id"]: r["key_name"] for r in rows}["a1"] == "alice"
    assert [r["request_id"] for r in j.rows(key="bob")] == ["b1", "b2"]
    assert [r["request_id"] for r in j.rows(key=NO_KEY)] == ["o1"]
    assert j.rows(key="nobody") == []
    assert [r["request_id"] for r in j.rows(key="alice", limit=1)] == ["a6"]
    # explain, from the journal, names the key
    assert trace_from_row(j.row("c1"))["key"] == "carol"  # type: ignore[arg-type]
    assert trace_from_row(j.row("o1"))["key"] is None  # type: ignore[arg-type]


def test_an_existing_journal_gains_the_key_column_and_keeps_its_rows(tmp_path):
    path = tmp_path / "state.db"
    before = len(MIGRATIONS) - 1  # the journal as the last release left it: no key_name
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
    for version, stmts in enumerate(MIGRATIONS[:before], 1):
        for stmt in stmts:
            conn.execute(stmt)
        conn.execute("INSERT INTO schema_version VALUES (?)", (version,))
    assert "key_name" not in {c[1] for c in conn.execute("PRAGMA table_info(journal)")}
    conn.execute("INSERT INTO journal (ts, request_id, ingress, profile, provider, status) "
                 "VALUES (?, 'old', 'anthropic', 'default', 'cloud', 200)", (MONTH,))
    conn.commit()
    conn.close()
    j = _journal(path, [_ev("new", MONTH + 1, "alice")])
    assert [(r["request_id"], r["key_name"]) for r in j.rows()] == [("old", None), ("new", "alice")]
    conn = sqlite3.connect(path)
    assert ("journal_key_ts",) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'").fetchall()
    conn.close()


def test_usage_by_key_sums_a_month_with_refusals_by_reason(tmp_path):
    j = _journal(tmp_path / "state.db", _month_events())
    out = usage_by_key(j, "2026-03", keys=["erin"])
    assert out["month"] == "2026-03" and out["since"] == "2026-03-01T00:00:00Z"
    by = {e["name"]: e for e in out["keys"]}
    assert sorted(by) == ["alice", "bob", "carol", "dave", "erin"]
    a = by["alice"]
    assert (a["requests"], a["refused"], a["input_tokens"], a["output_tokens"], a["cached_tokens"],
            a["cache_write_tokens"]) == (5, 2, 400, 60, 50, 7)
    assert a["spend_usd"] == pytest.approx(0.75)
    assert a["refusals"] == {KEY_RPM: 1, KEY_SCOPE: 1}  # the upstream's 429 is not the key's refusal
    assert a["last_used"] == "2026-03-03T00:00:00Z"  # as of the month's end (April's row is after it)
    assert by["bob"]["refusals"] == {"billing_error": 1} and by["bob"]["spend_usd"] == pytest.approx(2.0)
    assert by["carol"]["refusals"] == {KEY_EXPIRED: 1} and by["carol"]["requests"] == 1
    # dave spent only before the month: listed, nothing summed, his last use said
    assert (by["dave"]["requests"], by["dave"]["spend_usd"], by["dave"]["last_used_ts"]) == (0, 0.0, MONTH - DAY)
    # a key from the registry that never made a request
    assert by["erin"] == {**by["erin"], "requests": 0, "last_used": None, "refusals": {}}
    assert out["no_key"]["requests"] == 1 and out["no_key"]["spend_usd"] == pytest.approx(0.01)
    april = {e["name"]: e for e in usage_by_key(j, "2026-04")["keys"]}
    assert april["alice"]["spend_usd"] == pytest.approx(100.0) and april["bob"]["requests"] == 0
    assert april["alice"]["last_used"] == "2026-04-01T00:00:05Z"
    assert april["bob"]["last_used"] == "2026-03-04T00:00:05Z"  # no request in April: when it last made one


def test_the_refusal_predicate_is_the_same_in_sql_and_python(tmp_path):
    events = _month_events()
    j = _journal(tmp_path / "state.db", events)
    conn = sqlite3.connect(j.path)
    in_sql = {r[0] for r in conn.execute(f"SELECT request_id FROM journal WHERE {REFUSAL_SQL}")}
    conn.close()
    in_py = {e.request_id for e in events if is_refusal(e.provider, e.status, e.error_class, e.attempts)}
    assert in_sql == in_py == {"a3", "a4", "b2", "c1"}


@pytest.mark.parametrize(("text", "expected"), [
    ("2026-02", ("2026-02", datetime(2026, 2, 1, tzinfo=UTC), datetime(2026, 3, 1, tzinfo=UTC))),
    ("2026-12", ("2026-12", datetime(2026, 12, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))),
])
def test_month_window(text, expected):
    name, start, end = month_window(text)
    assert (name, start, end) == (expected[0], expected[1].timestamp(), expected[2].timestamp())


@pytest.mark.parametrize("bad", ["2026-13", "2026-1", "26-01", "march", "2026-00"])
def test_month_window_refuses_what_is_not_a_month(bad):
    with pytest.raises(ValueError, match="YYYY-MM"):
        month_window(bad)


def test_month_window_defaults_to_now():
    assert month_window(None, now=MONTH + 5 * DAY)[0] == "2026-03"


def _samples(m: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for metric in (m.requests, m.tokens, m.cost, m.refusals):
        for fam in metric.collect():
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_carry_the_key_on_requests_tokens_cost_and_refusals():
    m = Metrics(daemon=None)  # type: ignore[arg-type]  # the sink reads events only; scrape-time gauges are apart
    m.sink(_month_events())
    s = _samples(m)
    req = {labels: v for (name, labels), v in s.items() if name == "coderouter_requests_total"}
    assert sum(v for labels, v in req.items() if ("key", "alice") in labels) == 6
    assert req[(("ingress", "anthropic"), ("key", ""), ("profile", "default"), ("provider", "cloud"),
                ("status", "200"))] == 1  # no team key: the empty label, which Prometheus reads as absent
    assert s[("coderouter_tokens_total", (("key", "alice"), ("kind", "input"), ("provider", "cloud")))] == 400
    assert s[("coderouter_cost_usd_total", (("key", "bob"), ("provider", "cloud")))] == pytest.approx(2.0)
    refusals = {labels: v for (name, labels), v in s.items() if name == "coderouter_refusals_total"}
    assert refusals == {(("key", "alice"), ("reason", KEY_RPM)): 1, (("key", "alice"), ("reason", KEY_SCOPE)): 1,
                        (("key", "bob"), ("reason", "billing_error")): 1,
                        (("key", "carol"), ("reason", KEY_EXPIRED)): 1}
    # the exposition parses as a scraper reads it, with the key as a label
    parsed = {f.name for f in text_string_to_metric_families(generate_latest(_Families(m)).decode())}
    assert {"coderouter_requests", "coderouter_refusals"} <= parsed


class _Families:
    """A registry of the four keyed counters alone (the scrape-time gauges need a daemon)."""

    def __init__(self, m: Metrics) -> None:
        self.m = m

    def collect(self):
        for metric in (self.m.requests, self.m.tokens, self.m.cost, self.m.refusals):
            yield from metric.collect()


def test_a_served_request_journals_and_traces_its_key_by_name_only():
    import asyncio

    from tests.support.routing import Routing, chain_config

    r = Routing(chain_config("a"))
    ex, _sink = r.exchange()
    ex.req.key = TeamKey(name="alice", prefix="crk_3fA9", monthly_usd=5.0)
    asyncio.run(ex.run())
    seen: list = []
    RequestRecorder(seen.append).record(ex.record, 0.01, 0.0)
    finished = next(e for e in seen if isinstance(e, RequestFinished))
    assert finished.key_name == "alice" and finished.provider == "a"
    assert ex.record.trace(0.01, cost_usd=0.0)["key"] == "alice"
    assert "crk_" not in repr(finished.to_dict())  # the name, never the secret (nor its prefix)
