"""What the dashboard QA of issue 43 found, checked at the daemon's side of the page (the browser's side is
tests/browser/test_dashboard_requests.py): the feed's history from the audit log (E3), process lines of providers
without a process of ours (E8), the trends' oldest request (E9), the Requests table's why and time filter (E10),
the trace's order as it ran (E11), and the shared database's problem in words (E16)."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from types import SimpleNamespace

from coderouterd.admin import history, shared_words
from coderouterd.state import RequestFinished, Store
from coderouterd.state.audit import AuditLog
from coderouterd.state.events import BreakerTransition, GuardFired, ProcessEvent, ProcessEventName
from coderouterd.ui.feed import RECENT_EVENTS, LiveFeed, project, project_record


def _daemon(tmp_path, *, journal: bool = True) -> SimpleNamespace:
    return SimpleNamespace(telemetry=SimpleNamespace(enabled=journal, state_dir=tmp_path,
                                                     journal_path=tmp_path / "state.db" if journal else None),
                           recent=OrderedDict())


def _journal(tmp_path, events: list[RequestFinished]) -> None:
    store = Store(tmp_path / "state.db")
    store.open()
    store.journal_sink()(events)
    store.close()


# -- E3: the feed and the tool-loop alerts survive a restart ---------------------------------------------------

def test_the_feed_reads_what_happened_before_this_start_from_the_audit_log(tmp_path):
    earlier = time.time() - 600
    loop = GuardFired(request_id="r-loop", guard="tool_loop", action="break", detail={"tool": "Bash", "repeat_count": 4})
    breaker = BreakerTransition(provider="dead", old="closed", new="open", reason="connect_error")
    copy = ProcessEvent(provider="b", process="box", event=ProcessEventName.EXITED, primary=False)
    for ev in (loop, breaker, copy):
        ev.ts = earlier
    audit = AuditLog(tmp_path)
    audit.sink([loop, breaker, copy])
    audit.close()

    feed = LiveFeed()  # a daemon started after those were written
    mine = BreakerTransition(provider="dead", old="open", new="half_open", reason="recovery")
    feed.sink([mine])
    asyncio.run(feed.load_history(SimpleNamespace(state_dir=tmp_path, enabled=True)))
    got = feed.recent()
    assert [e["kind"] for e in got] == ["guard_fired", "breaker_transition", "breaker_transition"]
    # As the page saw them live: the same projection, read back from the log (times to the log's millisecond).
    for live, back in ((project(loop), got[0]), (project(breaker), got[1])):
        assert {k: v for k, v in back.items() if k != "ts"} == {k: v for k, v in live.items() if k != "ts"}
        assert abs(back["ts"] - earlier) < 0.002
    assert got[2]["new"] == "half_open"  # this daemon's own, after the log's


def test_the_history_is_bounded_read_once_and_an_audit_log_written_since_is_not_read_twice(tmp_path):
    audit = AuditLog(tmp_path)
    old = []
    for i in range(RECENT_EVENTS * 2):
        ev = BreakerTransition(provider=f"p{i}", old="closed", new="open")
        ev.ts = time.time() - 1000 + i
        old.append(ev)
    audit.sink(old)
    feed = LiveFeed()
    source = SimpleNamespace(state_dir=tmp_path, enabled=True)
    asyncio.run(feed.load_history(source))
    assert len(feed.recent()) == RECENT_EVENTS and feed.recent()[-1]["provider"] == f"p{RECENT_EVENTS * 2 - 1}"
    # Written by this daemon (its own events are in memory already): never taken from the log again.
    now_ev = BreakerTransition(provider="now", old="closed", new="open")
    audit.sink([now_ev])
    feed.sink([now_ev])
    asyncio.run(feed.load_history(source))
    assert [e["provider"] for e in feed.recent()].count("now") == 1
    audit.close()


def test_without_state_there_is_no_history_to_read(tmp_path):
    feed = LiveFeed()
    asyncio.run(feed.load_history(SimpleNamespace(state_dir=tmp_path / "missing", enabled=False)))
    assert feed.recent() == []
    asyncio.run(feed.load_history(SimpleNamespace(state_dir=tmp_path / "missing", enabled=True)))
    assert feed.recent() == []


def test_an_audit_line_of_another_kind_or_torn_is_not_projected():
    assert project_record({"kind": "config_reloaded", "ts": "2026-01-01T00:00:00.000Z"}) is None
    assert project_record({"kind": "request_finished", "ts": "2026-01-01T00:00:00.000Z"}) is None
    assert project_record({"kind": "breaker_transition", "ts": "yesterday"}) is None
    assert project_record({"kind": 3}) is None


# -- E8: a provider without a process of ours is named ----------------------------------------------------------

def test_a_process_line_of_an_unmanaged_provider_names_the_provider():
    unmanaged = project(ProcessEvent(provider="cloud", process="", event=ProcessEventName.EXCLUDED, detail="probe"))
    assert unmanaged["process"] == "cloud" and unmanaged["managed"] is False
    managed = project(ProcessEvent(provider="local", process="llama", event=ProcessEventName.READY))
    assert managed["process"] == "llama" and managed["managed"] is True


# -- E9: the window's oldest request ---------------------------------------------------------------------------

def test_trends_say_how_old_the_oldest_request_in_the_window_is(tmp_path):
    now = time.time()
    d = _daemon(tmp_path)
    empty = asyncio.run(history.trends(d, "24h", now=now))
    assert empty.first_ts is None
    _journal(tmp_path, [RequestFinished("young-1", "anthropic", "default", "local", status=200, ts=now - 300),
                        RequestFinished("young-2", "anthropic", "default", "local", status=200, ts=now - 60)])
    young = asyncio.run(history.trends(d, "24h", now=now))
    assert young.first_ts is not None and abs(young.first_ts - (now - 300)) < 0.01
    assert sum(v or 0 for v in young.providers["local"]["requests"]) == 2  # a lone bucket's data is there to draw


# -- E10: why, and the time filter -----------------------------------------------------------------------------

def test_a_request_says_why_in_a_few_words_from_its_attempts():
    assert history.why([], [{"provider": "local", "outcome": "ok"}]) == ""
    assert history.why([{"provider": "paid", "reason": "budget"}],
                       [{"provider": "dead", "outcome": "failed", "reason": "connect_error"},
                        {"provider": "local", "outcome": "ok"}]) == "paid skipped (budget), dead connect_error"
    many = [{"provider": f"p{i}", "outcome": "failed", "reason": "http_500"} for i in range(5)]
    assert history.why([], many) == "p0 http_500, p1 http_500, p2 http_500, +2 more"


def test_the_requests_list_says_why_and_filters_by_time_from_the_journal_and_from_memory(tmp_path):
    now = time.time()
    steps = [{"provider": "dead", "outcome": "failed", "reason": "connect_error", "status": None},
             {"provider": "local", "outcome": "ok"}]
    _journal(tmp_path, [RequestFinished("old", "anthropic", "default", "local", status=200, ts=now - 7200),
                        RequestFinished("new", "anthropic", "default", "local", status=200, ts=now - 60,
                                        attempts=steps)])
    d = _daemon(tmp_path)
    listed = asyncio.run(history.requests(d, since=now - 3600)).requests
    assert [(r.request_id, r.reason) for r in listed] == [("new", "dead connect_error")]
    assert len(asyncio.run(history.requests(d)).requests) == 2
    memory = _daemon(tmp_path, journal=False)
    memory.recent["m-old"] = {"request_id": "m-old", "ts": now - 7200, "served_by": "local", "status": 200}
    memory.recent["m-new"] = {"request_id": "m-new", "ts": now - 5, "served_by": "local", "status": 200,
                              "skips": [{"provider": "paid", "reason": "budget"}], "attempts": steps}
    listed = asyncio.run(history.requests(memory, since=now - 3600)).requests
    assert [(r.request_id, r.reason) for r in listed] == [("m-new", "paid skipped (budget), dead connect_error")]


# -- E11: the order as it ran ----------------------------------------------------------------------------------

def test_a_provider_the_budget_skipped_at_its_turn_is_not_in_the_trace_s_order(tmp_path):
    d = _daemon(tmp_path, journal=False)
    d.recent["r1"] = {"request_id": "r1", "effective_order": ["paid", "local"], "served_by": "local", "status": 200,
                      "skips": [{"provider": "paid", "reason": "budget", "message": "estimated $0.0080 > $0.0010 left"}],
                      "attempts": [{"provider": "local", "outcome": "ok"}]}
    d.recent["r2"] = {"request_id": "r2", "effective_order": ["local"], "served_by": "local", "status": 200}
    t = asyncio.run(history.trace(d, "r1")).trace
    assert t.effective_order == ["local"] and t.model_extra["planned_order"] == ["paid", "local"]
    assert [s.provider for s in t.skips] == ["paid"]  # still in the Skipped table, with its reason
    assert asyncio.run(history.trace(d, "r2")).trace.effective_order == ["local"]


# -- E16: the shared database in words -------------------------------------------------------------------------

def test_the_shared_database_s_problem_in_words():
    refused = ('OperationalError: connection failed: connection to server at "127.0.0.1", port 5433 failed: '
               "Connection refused")
    assert shared_words.meaning(refused).startswith("nothing listens at its address")
    assert "password" in shared_words.meaning('OperationalError: password authentication failed for user "cr"')
    assert "host name" in shared_words.meaning("OperationalError: could not translate host name \"db\" to address")
    assert shared_words.meaning('FATAL: database "coderouter" does not exist').startswith("the database")
    assert shared_words.meaning("ConnectionTimeout: timeout expired") == "it did not answer in time"
    assert shared_words.meaning("SomethingNew: ???") == "it answered with an error"
    assert shared_words.meaning(None) is None and shared_words.meaning("") is None
