"""The decision trace stays typed through routing and becomes JSON only at the journal's edge."""

from __future__ import annotations

import asyncio

from coderouterd.observe.request_record import RequestRecorder
from coderouterd.providers.errors import http_error
from coderouterd.routing.attempts import Attempt
from coderouterd.routing.breaker import BreakerState
from coderouterd.routing.planner import Skip
from coderouterd.state import FallbackUsed, RequestFinished
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
