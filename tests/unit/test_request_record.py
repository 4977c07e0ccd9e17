"""The decision trace stays typed through routing and becomes JSON only at the journal's edge."""

from __future__ import annotations

import asyncio

from coderouterd.observe.request_record import RequestRecorder
from coderouterd.providers.errors import http_error
from coderouterd.routing.attempts import Attempt
from coderouterd.routing.planner import Skip
from coderouterd.state import FallbackUsed, RequestFinished
from coderouterd.upstream.breaker import BreakerState
from tests.support.routing import Routing, chain_config, fail


def test_skips_and_attempts_are_typed_until_the_journal_event():
    r = Routing(chain_config("a", "b", "c"))
    br = r.breaker("a")
    for _ in range(br.failures):
        br.record_failure(reason="test")
    assert br.state is BreakerState.OPEN
    r.ups.script("b", fail(http_error(500, "x" * 5000)))
    ex, _sink = asyncio.run(r.serve())
    trace = ex.record.skips_and_attempts()
    assert [type(t) for t in trace] == [Skip, Attempt, Attempt]

    seen = []
    RequestRecorder(seen.append).record(ex.record, 0.01, 0.0)
    finished = next(e for e in seen if isinstance(e, RequestFinished))
    assert [(a["provider"], a["outcome"], a["reason"]) for a in finished.attempts] == [
        ("a", "skipped", "breaker_open"), ("b", "failed", "http_500"), ("c", "ok", "ok")]
    assert all("message" not in a for a in finished.attempts)  # messages stay in the in-memory trace
    fallback = next(e for e in seen if isinstance(e, FallbackUsed))
    assert fallback.chain == finished.attempts
    assert ex.record.trace(0.01, cost_usd=0.0)["skips"] == [{"provider": "a", "outcome": "skipped", "reason": "breaker_open",
                                        "message": trace[0].message}]


# -- the outcome: set only by end, and the first end stands unless a later one is meant to replace it ------------

def _record():
    from coderouterd.routing.record import RequestRecord

    r = Routing(chain_config("a"))
    ex, _sink = r.exchange()
    assert isinstance(ex.record, RequestRecord)
    return ex.record


def test_an_ended_record_keeps_its_first_outcome_and_a_second_plain_end_is_a_bug():
    import pytest

    from coderouterd.routing.record import RecordEnded

    rec = _record()
    assert (rec.status, rec.error_class) == (0, None)
    rec.end(502, "api_error")
    with pytest.raises(RecordEnded):
        rec.end(200, None)
    assert (rec.status, rec.error_class) == (502, "api_error")
    with pytest.raises(AttributeError):
        rec.status = 200  # type: ignore[misc]  # only end() sets the outcome


def test_a_client_that_leaves_after_its_whole_answer_was_served():
    rec = _record()
    rec.end(200, None)
    rec.end(499, "client_disconnected")
    assert (rec.status, rec.error_class) == (200, None)


def test_a_client_that_leaves_before_its_answer_replaces_the_outcome():
    rec = _record()
    rec.end(200, "upstream_disconnect")  # a stream that failed after its 200
    rec.end(499, "client_disconnected")
    assert (rec.status, rec.error_class) == (499, "client_disconnected")
    rec.end(rec.status or 499, "client_disconnected")  # the edge says it again: the same outcome
    assert (rec.status, rec.error_class) == (499, "client_disconnected")


def test_our_own_error_replaces_any_outcome():
    rec = _record()
    rec.end(200, None)
    rec.end(500, "internal_error")
    assert (rec.status, rec.error_class) == (500, "internal_error")


# -- observers read the record, in any order ------------------------------------------------------------------------

COSTED = {"a": "[providers.a.cost]\ninput = 3.0\noutput = 15.0\n"}


def test_the_trace_and_the_journal_carry_the_same_cost_whatever_runs_first():
    from coderouterd.observe.finish import RequestFinisher
    from coderouterd.observe.request_record import request_cost
    from coderouterd.observe.traces import RecentTraces

    r = Routing(chain_config("a", provider_extra=COSTED))
    ex, _sink = asyncio.run(r.serve())
    rec = ex.record
    cost = request_cost(rec)
    assert cost > 0
    before = rec.trace(0.01, cost_usd=cost)
    seen: list = []
    RequestRecorder(seen.append).record(rec, 0.01, cost)
    assert rec.trace(0.01, cost_usd=cost) == before  # the journal's events leave the record as it was

    seen.clear()
    traces = RecentTraces()
    RequestFinisher(RequestRecorder(seen.append), traces)(rec)
    finished = next(e for e in seen if isinstance(e, RequestFinished))
    assert finished.cost_usd == traces[rec.request_id]["cost_usd"] == cost


def test_a_context_overflow_that_reached_the_server_names_its_provider_in_the_journal():
    """The server answered (its own 400, passed on to the client): the journal and the log name it, not "-"."""
    from coderouterd.providers.errors import OVERFLOW, UpstreamError

    r = Routing(chain_config("local"))
    r.ups.script("local", fail(UpstreamError(OVERFLOW, status=400, message="prompt too long",
                                             overflow=(9000, 4096))))
    ex, sink = asyncio.run(r.serve())
    assert sink.status == 400 and ex.record.served_by is None
    seen = []
    RequestRecorder(seen.append).record(ex.record, 0.01, 0.0)
    finished = next(e for e in seen if isinstance(e, RequestFinished))
    assert finished.provider == "local" and finished.status == 400
    assert finished.cost_usd == 0.0
