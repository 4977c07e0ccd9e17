"""Race mode without a daemon: the race itself, and what it leaves to the one try-in-order routine."""

from __future__ import annotations

import asyncio

import pytest

from coderouterd.providers.errors import BUDGET, OVERFLOW, UpstreamError, http_error
from coderouterd.routing.attempts import Outcome
from coderouterd.upstream.breaker import BreakerState
from tests.support.routing import Routing, boom, chain_config, fail, hang, slow

RACE = 'mode = "race"\nrace_width = 2'
STREAM = {"model": "m", "max_tokens": 5, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def run(coro):
    return asyncio.run(coro)


class Budget:
    """BudgetHooks' shape: refuses the providers named, records every settlement."""

    def __init__(self, refuse=()) -> None:
        self.refuse = set(refuse)
        self.settled: list[tuple[str, dict | None]] = []

    def allowed(self, name):
        return True

    def reserve(self, provider, req):
        if provider.name in self.refuse:
            raise UpstreamError(BUDGET, message=f"monthly budget for {provider.name} would be exceeded")
        return provider.name

    def settle(self, reservation, provider, usage):
        self.settled.append((provider.name, usage))

    def spent_cap(self, name):
        return None  # refusals here stand for reservations in flight, never a spent month


def half_open(r, name):
    br = r.breaker(name)
    for _ in range(br.failures):
        br.record_failure(reason="t")
    r.clock.advance(30)
    assert br.state is BreakerState.HALF_OPEN


@pytest.mark.parametrize("body", [None, STREAM])
def test_the_first_useful_answer_wins_and_the_loser_is_dropped(body):
    r = Routing(chain_config("a", "b", extra_profile=RACE))
    r.ups.script("a", hang())
    r.ups.script("b", slow(0.01, b"event: x\ndata: {}\n\n") if body else slow(0.01))
    ex, sink = run(r.serve(body))
    assert ex.record.served_by == "b" and sink.status == 200
    assert {(a.provider, a.outcome) for a in ex.record.attempts} == {("a", Outcome.LOST), ("b", Outcome.OK)}
    assert "a" in r.ups.closed and ex.record.race_outcome.startswith("winner=b")


def test_a_loser_holding_the_half_open_trial_gives_it_back():
    r = Routing(chain_config("a", "b", extra_profile=RACE))
    half_open(r, "a")
    r.ups.script("a", hang())
    r.ups.script("b", slow(0.01))
    run(r.serve())
    assert r.breaker("a").state is BreakerState.HALF_OPEN and r.breaker("a").allow()


def test_after_the_race_the_rest_goes_through_the_same_routine_budget_skip_included():
    budget = Budget(refuse={"c"})
    r = Routing(chain_config("a", "b", "c", "d", extra_profile=RACE), budget=budget)
    r.ups.script("a", fail(http_error(500, "x")))
    r.ups.script("b", fail(http_error(503, "y")))
    ex, sink = run(r.serve())
    assert ex.record.served_by == "d" and ex.record.race_outcome == "no_winner_fallback"
    parts = sink.headers()["x-coderouter-attempts"].split(",")
    # The two racers fail in whichever order their tasks finish; the rest follows in order.
    assert parts[0] == "c:skipped:budget" and set(parts[1:3]) == {"a:http_500", "b:http_503"}
    assert parts[3] == "d:ok"
    # A refused reservation is a gate, not a failure: c's breaker never heard of it.
    assert r.breaker("c").consecutive_failures == 0
    assert sorted(n for n, _u in budget.settled) == ["a", "b", "d"]


def test_a_request_caused_error_after_the_race_reaches_the_client():
    r = Routing(chain_config("a", "b", "c", "d", extra_profile=RACE))
    r.ups.script("a", fail(http_error(500, "x")))
    r.ups.script("b", fail(http_error(500, "x")))
    r.ups.script("c", fail(http_error(400, "bad stop_sequences")))
    ex, sink = run(r.serve())
    status, msg = sink.last_error()[1:3]
    assert status == 400 and "bad stop_sequences" in msg
    tried = [a.provider for a in ex.record.attempts]
    assert set(tried[:2]) == {"a", "b"} and tried[2:] == ["c"]  # the racers in either order; d was not asked
    assert r.breaker("c").consecutive_failures == 0


@pytest.mark.parametrize("d_window, served", [(0, True), (1000, False)])
def test_the_context_overflow_rule_applies_after_the_race(d_window, served):
    cfg = chain_config("a", "b", "c", "d", extra_profile=RACE,
                       provider_extra={"c": "context_window = 4096", "d": f"context_window = {d_window}"})
    r = Routing(cfg)
    r.ups.script("a", fail(http_error(500, "x")))
    r.ups.script("b", fail(http_error(500, "x")))
    r.ups.script("c", fail(UpstreamError(OVERFLOW, status=400, message="long", overflow=(5000, 4096))))
    ex, sink = run(r.serve())
    if served:
        assert ex.record.served_by == "d"
    else:
        assert sink.last_error()[1] == 400 and "prompt is too long: 5000 tokens > 4096" in sink.last_error()[2]


def test_a_race_ended_by_the_client_releases_every_trial():
    r = Routing(chain_config("a", "b", extra_profile=RACE))
    half_open(r, "a")
    half_open(r, "b")
    r.ups.script("a", hang())
    r.ups.script("b", hang())
    ex, _sink = r.exchange()

    async def go():
        task = asyncio.ensure_future(ex.run())
        await asyncio.sleep(0.02)
        task.cancel()
        return await asyncio.gather(task, return_exceptions=True)

    (result,) = run(go())
    assert isinstance(result, asyncio.CancelledError)
    assert all(a.outcome is Outcome.CANCELLED for a in ex.record.attempts) and len(ex.record.attempts) == 2
    assert r.breaker("a").allow() and r.breaker("b").allow()
    assert set(r.ups.closed) == {"a", "b"}


def test_our_own_exception_in_one_racer_drops_the_other_and_releases_both():
    r = Routing(chain_config("a", "b", extra_profile=RACE))
    half_open(r, "a")
    half_open(r, "b")
    r.ups.script("a", boom(RuntimeError("bug")))
    r.ups.script("b", hang())
    ex, _sink = r.exchange()
    with pytest.raises(RuntimeError):
        run(ex.run())
    assert r.breaker("a").allow() and r.breaker("b").allow()
    assert {a.outcome for a in ex.record.attempts} == {Outcome.ERROR, Outcome.LOST}


def test_panic_reaches_race_profiles_too():
    r = Routing(chain_config("a", "b", extra_profile=RACE))
    for name in ("a", "b"):
        br = r.breaker(name)
        for _ in range(br.failures):
            br.record_failure(reason="t")
    ex, sink = run(r.serve())
    assert sink.status == 200 and ex.record.attempts[0].panic
    assert sink.headers()["x-coderouter-attempts"] == "a:panic:ok"


def test_a_racer_that_overflows_drops_out_while_a_larger_window_is_still_racing():
    cfg = chain_config("a", "b", extra_profile=RACE,
                       provider_extra={"a": "context_window = 4096", "b": "context_window = 0"})
    r = Routing(cfg)
    r.ups.script("a", fail(UpstreamError(OVERFLOW, status=400, message="long", overflow=(5000, 4096))))
    r.ups.script("b", slow(0.02))
    ex, sink = run(r.serve())
    assert ex.record.served_by == "b" and sink.status == 200
