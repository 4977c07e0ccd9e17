"""Issue 36 item 2: "why is provider X getting no traffic?" has one answer (routing/availability.py), for a provider
at a moment of the injected routing clock; health is a view of the breaker's one count, which probes and real
requests share; at most [breaker] max_ejection_percent of the providers are out at once; panic says so."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from coderouterd.providers.errors import MEMORY_PRESSURE, UpstreamError
from coderouterd.routing.availability import Code, judge_chain
from coderouterd.upstream.breaker import BreakerState
from coderouterd.upstream.lifecycle import Phase, down_why
from tests.support.routing import Routing, chain_config, fail


def _with(toml: str, line: str) -> str:
    return toml.replace("recovery_s = 30\n", f"recovery_s = 30\n{line}\n", 1)


def _request_failure(r: Routing, name: str, e: UpstreamError | None = None) -> None:
    r.router.report_failure(name, e or UpstreamError("http_500", status=500), 0.01)


@dataclass
class _Budget:
    over: frozenset[str] = frozenset()

    def allowed(self, provider: str) -> bool:
        return provider not in self.over

    def spent_cap(self, provider: str) -> str | None:
        return f"{provider} spent $5.00 of its $5.00 monthly cap" if provider in self.over else None


class _Demand:
    def can_start(self, provider: str) -> bool:
        return True


# -- each reason, in words -----------------------------------------------------------------------------------

def test_a_provider_with_no_trouble_can_take_traffic():
    r = Routing(chain_config("a"))
    a = r.router.availability("a")
    assert (a.available, a.code, a.words, a.failures) == (True, Code.OK, "can take traffic", 0)


def test_failures_below_the_threshold_are_degraded_and_routed():
    r = Routing(chain_config("a", breaker_failures=3))
    _request_failure(r, "a")
    a = r.router.availability("a")
    assert (a.available, a.code, a.failures) == (True, Code.DEGRADED, 1)
    assert a.words == "1 consecutive failure (out at 3)"


def test_an_open_breaker_says_after_how_many_failures_and_when_it_retries_on_the_injected_clock():
    r = Routing(chain_config("a", breaker_failures=5))
    for _ in range(5):
        _request_failure(r, "a")
    a = r.router.availability("a")
    assert (a.available, a.code, a.failures) == (False, Code.BREAKER_OPEN, 5)
    assert a.words == "breaker open after 5 failures, retry in 30 s"
    r.clock.advance(18)
    assert r.router.availability("a").words == "breaker open after 5 failures, retry in 12 s"
    r.clock.advance(12)  # the recovery time passed: the next request is the trial
    a = r.router.availability("a")
    assert (a.available, a.code) == (True, Code.HALF_OPEN)
    assert a.words == "breaker half-open: the next request is its trial"
    assert r.breaker("a").allow()  # someone takes the trial
    a = r.router.availability("a")
    assert (a.available, a.code) == (False, Code.HALF_OPEN) and "trial request is in flight" in a.words


def test_a_memory_cooldown_and_a_retry_after_are_named_as_such():
    r = Routing(chain_config("a", "b"))
    r.router.memory_cooldown_s = 30.0
    _request_failure(r, "a", UpstreamError(MEMORY_PRESSURE, status=500, message="out of memory"))
    a = r.router.availability("a")
    assert (a.available, a.code) == (False, Code.MEMORY_COOLDOWN)
    assert a.words == "held: memory cooldown 30 s (a ran out of memory)"
    _request_failure(r, "b", UpstreamError("rate_limited", status=429, retry_after=20.0))
    b = r.router.availability("b")
    assert (b.available, b.code, b.words) == (False, Code.RETRY_AFTER, "the upstream asked us to wait, retry in 20 s")


def test_failed_probes_make_it_unhealthy_and_health_action_decides_whether_it_is_routed():
    r = Routing(chain_config("a"))
    r.state.upstream("a").probed({"ok": False, "detail": "cannot connect: refused"})
    for _ in range(3):
        r.state.probe_failed("a", "probe failed: cannot connect")
    assert r.breaker("a").state is BreakerState.CLOSED  # a probe never opens the breaker
    out = r.router.availability("a", health_action="exclude")
    assert (out.available, out.code) == (False, Code.UNHEALTHY)
    assert out.words == "unhealthy after 3 failures (last probe: cannot connect: refused)"
    warned = r.router.availability("a", health_action="warn")
    assert warned.available and warned.words.endswith("health_action = warn: still routed")


def test_self_healing_holds_it_with_its_reason():
    r = Routing(chain_config("a"))
    r.state.hold("a", "process llama exited: code 1")
    a = r.router.availability("a")
    assert (a.available, a.code, a.words) == (False, Code.HELD, "held by self-healing (process llama exited: code 1)")


def test_a_managed_process_not_ready_stopped_on_demand_or_unable_to_start():
    r = Routing(chain_config("a"))
    r.state.upstreams.starting(["a"], "llama", 60, "starting")
    a = r.router.availability("a")
    assert (a.available, a.code, a.words) == (False, Code.STARTING,
                                              "a's managed process llama is not ready (starting)")
    # stopped by hand: not coming by itself
    r.state.upstreams.move(["a"], Phase.STOPPED, down_why("stopped", "llama", coming=False), process="llama")
    assert r.router.availability("a").code is Code.NOT_READY
    demand = Routing(chain_config("a"))
    demand.state.upstreams.starter = _Demand()  # type: ignore[assignment]
    demand.state.upstreams.move(["a"], Phase.STOPPED, down_why("stopped", "llama", coming=False), process="llama")
    assert demand.router.availability("a").code is Code.ON_DEMAND
    r.state.upstreams.cannot_start(["a"], "managed process llama cannot start: no such file; fix it")
    a = r.router.availability("a")
    assert (a.available, a.code, a.words) == (False, Code.CANNOT_START,
                                              "managed process llama cannot start: no such file; fix it")


def test_an_exhausted_budget_says_so():
    r = Routing(chain_config("a"), budget=_Budget(frozenset({"a"})))
    a = r.router.availability("a")
    assert (a.available, a.code, a.words) == (False, Code.BUDGET,
                                              "budget exhausted: a spent $5.00 of its $5.00 monthly cap")


# -- one count: probes and real requests --------------------------------------------------------------------

def test_probe_and_request_failures_share_one_count_and_open_the_breaker_at_its_threshold():
    r = Routing(chain_config("a", "b", breaker_failures=3))
    r.state.probe_failed("a", "probe failed")
    r.state.probe_failed("a", "probe failed")
    assert r.state.failures("a") == 2 and r.state.health_of("a") == "DEGRADED"
    assert r.breaker("a").state is BreakerState.CLOSED
    _request_failure(r, "a")  # the third failure of the same count: out
    assert r.breaker("a").state is BreakerState.OPEN and r.state.health_of("a") == "UNHEALTHY"
    assert r.state.failures("a") == 3 and r.router.availability("a").failures == 3


def test_a_probe_that_answers_ends_a_probe_streak_but_not_one_with_a_failed_request_in_it():
    r = Routing(chain_config("a", breaker_failures=3))
    r.state.probe_failed("a", "probe failed")
    r.state.reachable("a", "probe ok")
    assert r.state.failures("a") == 0 and r.state.health_of("a") == "HEALTHY"
    _request_failure(r, "a")
    r.state.probe_failed("a", "probe failed")
    r.state.reachable("a", "probe ok")  # the model list answers; generating failed: the streak stands
    assert r.state.failures("a") == 2 and r.state.health_of("a") == "DEGRADED"
    r.router.report_success("a", 0.01)
    assert r.state.failures("a") == 0 and r.state.health_of("a") == "HEALTHY"


def test_health_and_the_breaker_never_part_in_panic():
    """A panic attempt that fails while the breaker is open is counted once, by the breaker, and health follows."""
    r = Routing(chain_config("a", breaker_failures=2))
    for _ in range(2):
        _request_failure(r, "a")
    assert r.breaker("a").state is BreakerState.OPEN
    r.ups.script("a", fail(UpstreamError("http_500", status=500)))
    ex, _sink = asyncio.run(r.serve())
    assert ex.record.attempts[0].panic
    assert r.breaker("a").state is BreakerState.OPEN  # the panic attempt does not move the breaker...
    assert r.state.failures("a") == 3 == r.breaker("a").consecutive_failures  # ...but is counted, once
    assert r.state.health_of("a") == "UNHEALTHY"


# -- panic ---------------------------------------------------------------------------------------------------

def test_when_every_provider_is_ejected_the_answer_says_panic_and_they_are_tried_anyway():
    r = Routing(chain_config("a", "b", breaker_failures=1))
    _request_failure(r, "a")
    _request_failure(r, "b")
    profile = r.runtime.config.profiles["default"]
    answers = r.router.chain_availability(profile)
    assert all(a.available and a.code is Code.PANIC for a in answers.values())
    assert answers["a"].words == ("panic: every provider of the chain is out, trying anyway "
                                  "(breaker open after 1 failure, retry in 30 s)")
    ex, sink = asyncio.run(r.serve())  # and the executor does what the answer says
    assert sink.status == 200 and ex.record.panic and ex.record.attempts[0].panic


def test_panic_leaves_out_what_is_not_passing_and_is_off_when_the_profile_says_so():
    r = Routing(chain_config("a", "b", breaker_failures=1), budget=_Budget(frozenset({"b"})))
    _request_failure(r, "a")
    answers = judge_chain(["a", "b"], r.router.sources)
    assert answers["a"].code is Code.PANIC and answers["b"].code is Code.BUDGET and not answers["b"].available
    off = judge_chain(["a", "b"], r.router.sources, panic=False)
    assert off["a"].code is Code.BREAKER_OPEN and not off["a"].available


def test_one_provider_still_routed_means_no_panic():
    r = Routing(chain_config("a", "b", breaker_failures=1))
    _request_failure(r, "a")
    answers = r.router.chain_availability(r.runtime.config.profiles["default"])
    assert answers["a"].code is Code.BREAKER_OPEN and answers["b"].code is Code.OK


# -- max ejection ----------------------------------------------------------------------------------------------

def test_a_provider_whose_ejection_would_exceed_the_share_stays_in_rotation_and_the_answer_says_so():
    toml = _with(chain_config("a", "b", "c", "d", breaker_failures=1), "max_ejection_percent = 50")
    r = Routing(toml)
    _request_failure(r, "a")
    _request_failure(r, "b")
    assert r.breaker("a").state is BreakerState.OPEN and r.breaker("b").state is BreakerState.OPEN
    _request_failure(r, "c")  # a third out of four would exceed 50%
    assert r.breaker("c").state is BreakerState.CLOSED
    c = r.router.availability("c")
    assert (c.available, c.code, c.failures) == (True, Code.KEPT_IN_ROTATION, 1)
    assert "2 of 4 providers are out already (a, b)" in c.words and "max_ejection_percent = 50 allows 2" in c.words
    assert r.state.health_of("c") == "DEGRADED"  # not UNHEALTHY: that would take it out all the same
    assert r.breaker("c").snapshot()["kept_in_rotation"] == r.breaker("c").kept_in_rotation
    # It stays a candidate for real traffic, with the words in the plan's explanation of nothing skipped.
    plan = r.router.plan("default", r.runtime.config.profiles["default"], r.runtime, _req())
    assert "c" in plan.candidates and {s.provider for s in plan.skips} == {"a", "b"}


def test_once_a_provider_is_back_the_next_failure_may_eject_the_kept_one():
    toml = _with(chain_config("a", "b", breaker_failures=1), "max_ejection_percent = 50")
    r = Routing(toml)
    _request_failure(r, "a")
    _request_failure(r, "b")
    assert r.breaker("b").state is BreakerState.CLOSED and r.router.availability("b").code is Code.KEPT_IN_ROTATION
    r.breaker("a").reset("verified")
    _request_failure(r, "b")
    assert r.breaker("b").state is BreakerState.OPEN and r.router.availability("b").code is Code.BREAKER_OPEN


def test_the_ejection_limit_also_keeps_a_probe_streak_in_rotation():
    toml = _with(chain_config("a", "b", breaker_failures=2), "max_ejection_percent = 50")
    r = Routing(toml)
    for _ in range(2):
        _request_failure(r, "a")
        r.state.probe_failed("b", "probe failed")
    b = r.router.availability("b")
    assert (b.available, b.code) == (True, Code.KEPT_IN_ROTATION) and r.state.health_of("b") == "DEGRADED"


def test_by_default_every_provider_may_be_ejected_and_never_fewer_than_one():
    r = Routing(chain_config("a", "b", breaker_failures=1))
    _request_failure(r, "a")
    _request_failure(r, "b")
    assert r.breaker("b").state is BreakerState.OPEN  # max_ejection_percent defaults to 100
    zero = Routing(_with(chain_config("a", "b", breaker_failures=1), "max_ejection_percent = 0"))
    _request_failure(zero, "a")
    assert zero.breaker("a").state is BreakerState.OPEN  # one may always go out
    _request_failure(zero, "b")
    assert zero.breaker("b").state is BreakerState.CLOSED


def _req():
    from coderouterd.routing.request import ClientRequest

    return ClientRequest(ingress="anthropic", body={}, raw=b"", headers={}, stream=False, model="", request_id="t")


def test_a_plans_skip_carries_the_answers_words_as_corectl_explain_shows_them():
    r = Routing(chain_config("a", "b", breaker_failures=2))
    for _ in range(2):
        _request_failure(r, "a")
    r.clock.advance(18)
    answer = r.router.availability("a")
    plan = r.router.plan("default", r.runtime.config.profiles["default"], r.runtime, _req())
    (skip,) = plan.skips
    assert (skip.provider, skip.reason, skip.message) == ("a", "breaker_open", f"a: {answer.words}")
    assert skip.message == "a: breaker open after 2 failures, retry in 12 s"
    assert plan.explain()["skips"][0]["message"] == skip.message  # the trace's skip, as `corectl explain` renders it


# -- the ejection limit counts only the providers configured now -------------------------------------------------

def _reload(r: Routing, toml: str) -> None:
    from coderouterd.config.loader import LoadedConfig, parse_config_text
    from coderouterd.runtime import build_runtime

    cfg = parse_config_text(toml, "test")
    r.runtime = build_runtime(LoadedConfig(cfg, "test"))
    r.router.reconfigure(cfg)


def test_providers_removed_by_a_reload_no_longer_count_toward_the_ejection_limit():
    r = Routing(_with(chain_config("a", "b", "c", "d", breaker_failures=1), "max_ejection_percent = 50"))
    _request_failure(r, "c")
    _request_failure(r, "d")
    assert r.breaker("c").state is BreakerState.OPEN and r.breaker("d").state is BreakerState.OPEN
    _reload(r, _with(chain_config("a", "b", breaker_failures=1), "max_ejection_percent = 50"))
    r.clock.advance(31)  # c and d turn half-open and never get a trial: they are no longer routed to
    _request_failure(r, "a")  # none of the 2 configured providers is out: a may go
    assert r.breaker("a").state is BreakerState.OPEN and r.router.availability("a").code is Code.BREAKER_OPEN
    _request_failure(r, "b")  # b would be the second of two: the words count the configured ones only
    b = r.router.availability("b")
    assert b.code is Code.KEPT_IN_ROTATION
    assert "1 of 2 providers are out already (a)" in b.words and "allows 1" in b.words
    assert "c" not in r.state.breakers.names() and "d" not in r.state.breakers.names()


def test_persisted_breakers_of_providers_no_longer_configured_are_dropped_at_start():
    from coderouterd.persisted import NS_BREAKERS, PersistedState
    from coderouterd.state.memory import MemoryStore

    old = Routing(_with(chain_config("a", "b", "c", "d", breaker_failures=1), "max_ejection_percent = 50"))
    store = MemoryStore()
    for name in ("c", "d"):
        _request_failure(old, name)
        store.set(NS_BREAKERS, name, old.breaker(name).snapshot())
    r = Routing(_with(chain_config("a", "b", breaker_failures=1), "max_ejection_percent = 50"))
    PersistedState(store, lambda _e: None).restore_routing(r.state)
    assert set(store.items(NS_BREAKERS)) == set()  # not brought back at the next start either
    # Every configured provider has its (closed) breaker from the start (E14: its gauges are in /metrics); the
    # dropped ones are not among them.
    assert sorted(r.state.breakers.names()) == ["a", "b"]
    assert all(r.breaker(n).state is BreakerState.CLOSED for n in ("a", "b"))
    _request_failure(r, "a")
    assert r.breaker("a").state is BreakerState.OPEN


def test_shared_breakers_of_providers_only_a_peer_configures_do_not_count():
    peer = Routing(chain_config("x", "y", breaker_failures=1))
    _request_failure(peer, "x")
    _request_failure(peer, "y")
    r = Routing(_with(chain_config("a", "b", breaker_failures=1), "max_ejection_percent = 50"))
    for name in ("x", "y"):
        r.state.adopt_breaker(name, peer.breaker(name).snapshot(), "shared: peer (polled)")
    _request_failure(r, "a")
    assert r.breaker("a").state is BreakerState.OPEN


def test_a_retry_after_may_take_a_kept_provider_out_and_once_it_elapses_nothing_of_the_streak_is_left():
    # The upstream's "wait 5 s" is a fact, not a verdict: it is honoured although it exceeds the limit.
    r = Routing(_with(chain_config("a", "b"), "max_ejection_percent = 50"))
    for _ in range(3):
        _request_failure(r, "b")
    for _ in range(3):
        _request_failure(r, "a")
    assert r.router.availability("a").code is Code.KEPT_IN_ROTATION
    _request_failure(r, "a", UpstreamError("http_429", status=429, retry_after=5))
    answers = {p: r.router.availability(p) for p in ("a", "b")}
    assert (answers["a"].available, answers["a"].code) == (False, Code.RETRY_AFTER)
    assert (answers["b"].available, answers["b"].code) == (False, Code.BREAKER_OPEN)  # both out: the hint wins
    r.clock.advance(6)
    a = r.router.availability("a")  # the first read after the wait: one answer, after the close
    assert (a.available, a.code, a.failures, a.words) == (True, Code.OK, 0, "can take traffic")
    assert r.breaker("a").state is BreakerState.CLOSED and r.breaker("a").kept_in_rotation is None
    assert r.breaker("a").snapshot()["kept_in_rotation"] is None


# -- health follows the count whatever moves it ------------------------------------------------------------------

def test_health_follows_a_retry_after_that_elapses_on_the_injected_clock():
    r = Routing(chain_config("a", breaker_failures=5))
    _request_failure(r, "a")
    _request_failure(r, "a", UpstreamError("http_429", status=429, retry_after=5))
    assert r.breaker("a").retry_after_only and r.state.health_of("a") == "DEGRADED"
    r.clock.advance(6)
    assert r.state.health_of("a") == "HEALTHY"  # no success needed: the close zeroed the count
    assert r.health_moves[-1][:3] == ("a", "DEGRADED", "HEALTHY")
    assert r.router.availability("a").code is Code.OK


def test_health_follows_a_breaker_adopted_from_a_peer():
    r = Routing(chain_config("a"))
    for _ in range(2):
        r.state.probe_failed("a", "probe failed")
    assert r.state.health_of("a") == "DEGRADED"
    peer = Routing(chain_config("a"))
    r.state.adopt_breaker("a", peer.breaker("a").snapshot(), "shared: peer (notified)")  # its trial closed it
    assert r.state.health_of("a") == "HEALTHY" and r.router.availability("a").code is Code.OK
    for _ in range(3):
        _request_failure(peer, "a")
    r.state.adopt_breaker("a", peer.breaker("a").snapshot(), "shared: peer (notified)")  # the peer opened it
    assert r.state.health_of("a") == "UNHEALTHY" and r.router.availability("a").code is Code.BREAKER_OPEN
    assert [m[1:3] for m in r.health_moves[-2:]] == [("DEGRADED", "HEALTHY"), ("HEALTHY", "UNHEALTHY")]
