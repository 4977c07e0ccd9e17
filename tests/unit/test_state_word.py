"""Issue 43 §3: one state word per provider, computed once in the daemon (admin/words.py) from the availability
verdict and the process's lifecycle; the budget's skips counted per provider in a window on an injected clock
(guards/budget.BudgetSkips) and named by the verdict (E1); a half-open provider is a warning, not "down" (E4); the
feed's events carry their tone in the daemon's own vocabulary (E7); an order of stopped on-demand models says a
request starts them (D6)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from coderouterd.admin.views import _skipping, order_words
from coderouterd.admin.words import Kind, Problem, state_word
from coderouterd.admin.words import event_tone as tone
from coderouterd.guards.apply import BudgetHooks
from coderouterd.guards.budget import Budget, BudgetSkips
from coderouterd.providers.errors import BUDGET, UpstreamError
from coderouterd.routing.availability import Availability, Code
from coderouterd.state.events import BreakerTransition, HealthTransition, ProcessEvent, ProcessEventName
from coderouterd.upstream.breaker import BreakerState
from tests.support.routing import Routing, chain_config


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _a(code: Code, available: bool, words: str = "w") -> Availability:
    return Availability("p", available, code, words)


# -- the word ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("available", [True, False])
def test_half_open_is_a_trial_and_a_warning_never_down(available):
    """E4: the page drew a half-open provider the daemon routes a trial to as "down: unhealthy" in red, from its
    health word (UNHEALTHY while the breaker recovers). The word comes from the verdict's code instead."""
    w = state_word(_a(Code.HALF_OPEN, available))
    assert w.kind is Kind.WARN and w.problem is None and w.word.startswith("half-open")
    assert ("next request is its trial" in w.word) is available
    assert w.takes_traffic is available


def test_every_code_has_a_word_and_only_outages_are_down():
    passing = {Code.ON_DEMAND: ("stopped: starts on demand", Kind.IDLE),
               Code.STARTING: ("process starting", Kind.WARN),
               Code.RETRY_AFTER: ("waiting: the upstream asked us to", Kind.WARN),
               Code.DEGRADED: ("degraded", Kind.WARN), Code.KEPT_IN_ROTATION: ("kept in rotation", Kind.WARN),
               Code.OK: ("healthy", Kind.OK)}
    down = {Code.BREAKER_OPEN: "down: breaker open", Code.CANNOT_START: "down: cannot start",
            Code.MEMORY_COOLDOWN: "down: memory cooldown", Code.UNHEALTHY: "down: unhealthy",
            Code.PANIC: "panic: tried anyway"}
    for code in Code:
        w = state_word(_a(code, code in (Code.OK, Code.DEGRADED, Code.KEPT_IN_ROTATION, Code.PANIC)))
        assert w.code is code and w.word, code
        if code in passing:
            assert (w.word, w.kind, w.problem) == (*passing[code], None), code
        elif code in down:
            assert (w.word, w.kind, w.problem) == (down[code], Kind.BAD, Problem.DOWN), code
        elif code in (Code.BUDGET, Code.BUDGET_SKIPPED):
            assert (w.kind, w.problem) == (Kind.BAD, Problem.BUDGET), code


def test_not_ready_reads_the_process_lifecycle():
    assert state_word(_a(Code.NOT_READY, False), process_state="starting").word == "process starting"
    assert state_word(_a(Code.NOT_READY, False), process_state="starting").kind is Kind.WARN
    fatal = state_word(_a(Code.NOT_READY, False), process_state="fatal")
    assert (fatal.word, fatal.kind, fatal.problem) == ("down: process fatal", Kind.BAD, Problem.DOWN)


def test_routed_while_unhealthy_is_bad_and_says_it_is_still_routed():
    w = state_word(_a(Code.UNHEALTHY, True))
    assert (w.word, w.kind, w.problem, w.takes_traffic) == ("unhealthy, still routed", Kind.BAD, Problem.DOWN, True)


def test_near_the_cap_and_a_missing_key_are_words_of_a_provider_that_takes_traffic():
    near = state_word(_a(Code.OK, True), budget_ratio=0.85, warn_ratio=0.8)
    assert (near.word, near.kind, near.problem) == ("near its cap", Kind.WARN, Problem.BUDGET)
    assert state_word(_a(Code.OK, True), budget_ratio=0.5, warn_ratio=0.8).word == "healthy"
    key = state_word(_a(Code.OK, True), key_problem="no key: $K is not set")
    assert (key.word, key.kind, key.problem) == ("no key", Kind.BAD, Problem.KEY)
    # Skipped on every request is worse than near the cap: the ratio does not hide it (E1).
    skipped = state_word(_a(Code.BUDGET_SKIPPED, True), budget_ratio=0.99)
    assert (skipped.word, skipped.takes_traffic) == ("skipped: over its budget", False)


# -- the budget's skips (E1) -----------------------------------------------------------------------------------

def test_skips_are_counted_in_a_window_on_the_injected_clock():
    clock = Clock()
    skips = BudgetSkips(window_s=600, clock=clock)
    assert skips.every("p") is None and skips.recent("p") is None
    for _ in range(41):
        skips.skipped("p", 0.31, 0.008)
        clock.t += 1
    assert skips.every("p") == "requests estimated over $0.0080 are skipped (41 in the last 10 min)"
    r = skips.recent("p")
    assert r is not None and (r.count, r.least_usd, r.admitted) == (41, 0.31, False)
    clock.t += 570  # skips at 1000..1040, now 1611: the eleven before 1011 leave the window
    assert skips.recent("p").count == 30
    clock.t += 100  # all of them
    assert skips.every("p") is None and skips.recent("p") is None


def test_one_request_served_in_the_window_means_not_every_one_was_skipped():
    clock = Clock()
    skips = BudgetSkips(window_s=600, clock=clock)
    skips.skipped("p", 0.5, None)  # a shared ledger does not say what is left: the least estimate is named
    assert skips.every("p") == "requests estimated over $0.5000 are skipped (1 in the last 10 min)"
    skips.admitted("p")
    assert skips.every("p") is None
    assert skips.recent("p").words().endswith("(1 in the last 10 min, others served)")
    clock.t += 601  # the admission is old news too, with the skip
    assert skips.recent("p") is None
    skips.skipped("p", 0.2, 0.01)
    assert skips.every("p") is not None


def test_a_provider_never_skipped_costs_a_lookup():
    skips = BudgetSkips(clock=Clock())
    skips.admitted("p")  # admissions of a provider never skipped are not even timed
    assert skips._admitted == {} and skips.every("p") is None


class _Store:
    def __init__(self) -> None:
        self.data: dict = {}

    def get(self, ns, key, default=None):
        return self.data.get((ns, key), default)

    def set(self, ns, key, value) -> None:
        self.data[(ns, key)] = value

    def items(self, ns):
        return {k: v for (n, k), v in self.data.items() if n == ns}


def _paid(name: str, *, cap: float, output: float) -> SimpleNamespace:
    cost = SimpleNamespace(input=0.0, output=output, cache_read=0.0, cache_write=0.0)
    return SimpleNamespace(name=name, cfg=SimpleNamespace(paid=True, monthly_budget_usd=cap, cost=cost),
                           estimate_tokens=lambda n: n)


def test_a_reservation_refused_for_its_estimate_is_counted_and_the_verdict_says_so():
    """The E1 scene: $0.008 left of a $1 cap, every request's worst case ($0.31) over it. The verdict keeps it
    routed (a smaller request may fit) with code budget_skipped and the skips in words; every view reads that."""
    clock = Clock()
    budget = Budget(_Store(), clock=lambda: 1_780_000_000.0)
    prov = _paid("pricey", cap=1.0, output=75.0)
    budget.configure({"pricey": prov.cfg}, global_cap_usd=0, warn_ratio=0.8)
    budget.record("pricey", 0.992)
    hooks = BudgetHooks(budget, BudgetSkips(clock=clock))
    r = Routing(chain_config("pricey", "local"), budget=hooks)
    assert r.router.availability("pricey").code is Code.OK  # nothing asked yet: nothing skipped
    req = SimpleNamespace(body={"max_tokens": 4096}, raw=b"x" * 40, key=None)
    for _ in range(3):
        with pytest.raises(UpstreamError) as e:
            asyncio.run(hooks.reserve(prov, req))
        assert e.value.reason == BUDGET
    a = r.router.availability("pricey")
    assert (a.available, a.code, a.takes_traffic) == (True, Code.BUDGET_SKIPPED, False)
    assert a.words == "requests estimated over $0.0080 are skipped (3 in the last 10 min)"
    # A request small enough is admitted: the provider is served again, and no longer "skipping everything".
    res = asyncio.run(hooks.reserve(prov, SimpleNamespace(body={"max_tokens": 10}, raw=b"x", key=None)))
    assert res is not None
    assert r.router.availability("pricey").code is Code.OK


def test_a_refusal_by_reservations_in_flight_is_not_a_skip_of_the_provider():
    clock = Clock()
    budget = Budget(_Store(), clock=lambda: 1_780_000_000.0)
    prov = _paid("pricey", cap=1.0, output=75.0)
    budget.configure({"pricey": prov.cfg}, global_cap_usd=0, warn_ratio=0.8)
    hooks = BudgetHooks(budget, BudgetSkips(clock=clock))
    req = SimpleNamespace(body={"max_tokens": 8000}, raw=b"x", key=None)  # $0.60 of a $1 cap
    first = asyncio.run(hooks.reserve(prov, req))
    assert first is not None
    with pytest.raises(UpstreamError):  # the second does not fit beside the first, but would alone
        asyncio.run(hooks.reserve(prov, req))
    assert hooks.skips.recent("pricey") is None


def test_the_order_lists_a_provider_skipped_on_every_request_with_the_skips():
    answers = {"pricey": Availability("pricey", True, Code.BUDGET_SKIPPED, "requests estimated over $0.0080 are "
                                      "skipped (41 in the last 10 min)"),
               "local": Availability("local", True, Code.OK, "can take traffic")}
    order, skips = _skipping(["pricey", "local"], [], answers)
    assert order == ["local"]
    assert skips == [{"provider": "pricey", "outcome": "skipped", "reason": "budget",
                      "message": "pricey: requests estimated over $0.0080 are skipped (41 in the last 10 min)"}]
    assert order_words(order, skips, answers) == "local"


def test_a_provider_another_profile_excludes_stays_in_the_order_of_a_profile_that_routes_it():
    """The verdicts are the active profile's (health_action = "exclude": an unhealthy provider is out); a profile
    with health_action = "warn" still routes it, and its planner says so. Only a budget skip, which is the same for
    every profile, moves a routed provider to the skips: anything else is not this profile's "budget"."""
    answers = {"flaky": Availability("flaky", False, Code.UNHEALTHY, "3 probes failed"),
               "local": Availability("local", True, Code.OK, "can take traffic")}
    order, skips = _skipping(["flaky", "local"], [], answers)
    assert order == ["flaky", "local"] and skips == []


def test_an_order_of_stopped_on_demand_models_says_a_request_starts_them():
    """D6: `corectl status` said "none available" for a profile whose on-demand model is stopped."""
    answers = {"coder": Availability("coder", False, Code.ON_DEMAND, "coder's managed process is stopped"),
               "dead": Availability("dead", False, Code.BREAKER_OPEN, "breaker open")}
    skips = [{"provider": "coder", "reason": "not_ready"}, {"provider": "dead", "reason": "breaker_open"}]
    assert order_words([], skips, answers) == "coder (stopped: a request starts it on demand)"
    assert order_words([], skips[1:], answers) == "none available"


# -- the feed's tones (E7) -------------------------------------------------------------------------------------

def test_events_carry_their_tone_in_the_daemons_own_words():
    """E7: recoveries and an idle-stopped model were drawn in red: the events carry HEALTHY, the page compared with
    "healthy". The tone is decided where the words are the daemon's own."""
    def event_tone(ev):  # as the feed calls it: the event's kind and fields (the bus's, or the audit log's)
        return tone(ev.kind, {n: getattr(ev, n) for n in ("new", "event") if hasattr(ev, n)})

    assert event_tone(HealthTransition(provider="p", old="UNHEALTHY", new="HEALTHY")) is Kind.OK
    assert event_tone(HealthTransition(provider="p", old="UNKNOWN", new="HEALTHY")) is Kind.OK
    assert event_tone(HealthTransition(provider="p", old="HEALTHY", new="DEGRADED")) is Kind.WARN
    assert event_tone(HealthTransition(provider="p", old="HEALTHY", new="UNHEALTHY")) is Kind.BAD
    assert event_tone(BreakerTransition(provider="p", old="half_open", new=str(BreakerState.CLOSED))) is Kind.OK
    assert event_tone(BreakerTransition(provider="p", old="open", new=str(BreakerState.HALF_OPEN))) is Kind.WARN
    assert event_tone(BreakerTransition(provider="p", old="closed", new=str(BreakerState.OPEN))) is Kind.BAD
    stopped = ProcessEvent(provider="p", process="m", event=ProcessEventName.STOPPED, detail="reason: idle")
    assert event_tone(stopped) is Kind.IDLE
    for ok in (ProcessEventName.READY, ProcessEventName.REJOINED):
        assert event_tone(ProcessEvent(provider="p", process="m", event=ok)) is Kind.OK
    for bad in (ProcessEventName.EXITED, ProcessEventName.FATAL, ProcessEventName.RESTARTING):
        assert event_tone(ProcessEvent(provider="p", process="m", event=bad)) is Kind.BAD
    # The audit log's record of the same event (its plain names) reads the same.
    assert tone("health_transition", {"new": "HEALTHY"}) is Kind.OK
    assert tone("process", {"event": "stopped"}) is Kind.IDLE and tone("process", {"event": "?"}) is None
