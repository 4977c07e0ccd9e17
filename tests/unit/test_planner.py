"""The planner on the real thing: a routing state built from a config, the availability judge the router uses
(routing/availability.py) and failures reported as the router reports them, on an injected manual clock."""

from enum import Enum

import orjson
import pytest

from coderouterd.providers.errors import UpstreamError
from coderouterd.routing.adaptive import AdaptiveOrderer, AdaptiveSettings, ProviderStats
from coderouterd.routing.availability import judge
from coderouterd.routing.planner import SKIP_REASONS, ProviderFacts, RequestFeatures, plan
from coderouterd.upstream.breaker import BreakerState
from tests.support.routing import Routing, chain_config

CHAIN = ["a", "b", "c"]


def facts(**per_provider):
    out = {p: ProviderFacts(name=p, vision=True, context_window=100_000) for p in CHAIN}
    for name, changes in per_provider.items():
        for key, value in changes.items():
            setattr(out[name], key, value)
    return out


def routing(*names: str, failures: int = 1, budget=None) -> Routing:
    return Routing(chain_config(*(names or CHAIN), breaker_failures=failures), budget=budget)


def run(r: Routing | None = None, features=None, *, f=None, action="exclude", chain=None, health=None, **kw):
    """Plan as Router.plan does: the judge over the routing state's sources, the state's health for the order."""
    r = r or routing()
    sources = r.router.sources
    return plan(
        list(chain or CHAIN),
        f if f is not None else facts(),
        features or RequestFeatures(),
        judge=lambda p: judge(p, sources, health_action=action),
        health=r.state.health if health is None else health,
        health_action=action,
        **kw,
    )


def fail(r: Routing, name: str, e: UpstreamError | None = None) -> None:
    """A real request failed, reported as the executor reports it."""
    r.router.report_failure(name, e or UpstreamError("http_500", status=500), 0.01)


def unhealthy(r: Routing, name: str, how: str = "probes") -> None:
    """UNHEALTHY the real ways: failed probes up to the threshold (the breaker stays closed), or self-healing's
    hold."""
    if how == "probes":
        for _ in range(r.breaker(name).failures):
            r.state.probe_failed(name, "probe failed: cannot connect")
        assert r.breaker(name).state is BreakerState.CLOSED
    else:
        r.state.hold(name, "process llama exited: code 1")
    assert r.state.health_of(name) == "UNHEALTHY"


class _Budget:
    def __init__(self, over: set[str]) -> None:
        self.over = over
        self.asked: list[str] = []

    def allowed(self, provider: str) -> bool:
        self.asked.append(provider)
        return provider not in self.over

    def spent_cap(self, provider: str) -> str | None:
        return f"{provider} spent $5.00 of its $5.00 monthly cap" if provider in self.over else None


def test_everything_eligible_keeps_chain_order():
    p = run()
    assert p.candidates == CHAIN and p.skips == [] and p.order_notes == []
    assert p.explain()["summary"] == "trying a, b, c"


@pytest.mark.parametrize(
    "features, provider_changes, reason, words",
    [
        (RequestFeatures(has_tools=True), {"tools": False}, "tools", "capabilities.tools = false"),
        (RequestFeatures(thinking_required=True), {"thinking": False}, "thinking", "requires thinking"),
        (RequestFeatures(estimated_tokens=40_000), {"context_window": 32_768}, "context", "~40,000 tokens"),
    ],
)
def test_capability_gates(features, provider_changes, reason, words):
    p = run(None, features, f=facts(b=provider_changes))
    assert p.candidates == ["a", "c"]
    assert len(p.skips) == 1
    skip = p.skips[0]
    assert (skip.provider, skip.reason) == ("b", reason)
    assert words in skip.message and "b" in skip.message
    # Same provider facts, request without the feature: no gate.
    assert run(None, RequestFeatures(), f=facts(b=provider_changes)).candidates == CHAIN


def test_thinking_is_not_a_gate_unless_required():
    assert run(None, RequestFeatures(), f=facts(b={"thinking": False})).candidates == CHAIN


@pytest.mark.parametrize(
    "tokens, window, gated", [(32_768, 32_768, False), (32_769, 32_768, True), (10**7, 0, False)]
)
def test_context_gate_boundary_and_unknown_window(tokens, window, gated):
    p = run(None, RequestFeatures(estimated_tokens=tokens), f=facts(a={"context_window": window}))
    assert ("a" not in p.candidates) is gated


def test_budget_gate_asks_the_budget_for_every_provider():
    budget = _Budget({"a"})
    p = run(routing(budget=budget))
    assert p.candidates == ["b", "c"]
    skip = p.skips[0]
    assert (skip.provider, skip.reason) == ("a", "budget")
    assert skip.message == "a: budget exhausted: a spent $5.00 of its $5.00 monthly cap"
    assert not skip.transient  # over budget is not "not now": panic does not try it
    assert sorted(budget.asked) == CHAIN


def test_breaker_open_is_skipped_half_open_is_planned():
    r = routing(failures=2)
    fail(r, "b", UpstreamError("rate_limited", status=429, retry_after=45.0))  # opens it below the threshold
    fail(r, "c")
    fail(r, "c")
    p = run(r)
    assert p.candidates == ["a"]
    assert [(s.provider, s.reason, s.message) for s in p.skips] == [
        ("b", "breaker_open", "b: the upstream asked us to wait, retry in 45 s"),
        ("c", "breaker_open", "c: breaker open after 2 failures, retry in 30 s"),
    ]
    assert all(s.transient for s in p.skips)

    r.clock.advance(30)  # c's recovery time passed: the next request is its trial
    p2 = run(r)
    assert p2.candidates == ["a", "c"]
    assert r.breaker("c").state is BreakerState.HALF_OPEN
    # Planning does not consume the one trial: the executor's allow() does.
    assert r.breaker("c").allow() and not r.breaker("c").allow()
    # With the trial in flight, the next plan skips c until the trial answers.
    (_b, c) = run(r).skips
    assert (c.provider, c.reason) == ("c", "breaker_open") and "trial request is in flight" in c.message


def test_a_memory_cooldown_is_its_own_reason():
    r = routing()
    r.router.memory_cooldown_s = 30.0
    fail(r, "a", UpstreamError("memory_pressure", status=500, message="out of memory"))
    p = run(r)
    assert p.candidates == ["b", "c"]
    assert (p.skips[0].reason, p.skips[0].message) == ("memory_cooldown",
                                                       "a: held: memory cooldown 30 s (a ran out of memory)")


class Health(Enum):
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"


def _as_given(value: str, form: str):
    # Health may reach the planner as the state's word, a lowercase string or an Enum from the health monitor.
    return {"state": value, "lower": value.lower(), "enum": Health.__members__.get(value, value)}[form]


@pytest.mark.parametrize(
    "action, candidates, skipped, note",
    [
        ("exclude", ["b", "c"], ["a"], None),
        ("demote", ["b", "c", "a"], [], {"provider": "a", "moved": "back"}),
        ("warn", ["a", "b", "c"], [], {"provider": "a", "moved": "none"}),
    ],
)
@pytest.mark.parametrize("how", ["probes", "hold"])
@pytest.mark.parametrize("form", ["state", "lower", "enum"])
def test_health_actions(action, candidates, skipped, note, how, form):
    r = routing(failures=2)
    unhealthy(r, "a", how)
    r.state.reachable("b", "probe ok")  # b: HEALTHY, said so
    health = {name: _as_given(word, form) for name, word in r.state.health.items()}
    p = run(r, action=action, health=health)
    assert p.candidates == candidates
    assert [s.provider for s in p.skips] == skipped
    if skipped:
        words = ("a: unhealthy after 2 failures" if how == "probes"
                 else "a: held by self-healing (process llama exited: code 1)")
        assert (p.skips[0].reason, p.skips[0].message) == ("unhealthy", words)
        assert p.skips[0].transient
    if note:
        assert {k: p.order_notes[0][k] for k in note} == note
        assert p.order_notes[0]["why"] == f"health UNHEALTHY (health_action={action})"
    else:
        assert p.order_notes == []


def test_degraded_is_noted_but_not_acted_on():
    r = routing(failures=3)
    r.state.probe_failed("a", "probe failed")
    assert r.state.health_of("a") == "DEGRADED"
    p = run(r, action="exclude")
    assert p.candidates == CHAIN
    assert p.order_notes == [{"provider": "a", "moved": "none", "why": "health DEGRADED"}]


def test_invalid_health_action():
    with pytest.raises(ValueError):
        run(action="panic")


def test_all_gated_plan_explains_every_skip():
    r = routing()
    unhealthy(r, "b")
    fail(r, "c")
    f = facts(a={"tools": False}, b={"tools": True}, c={"tools": True})
    p = run(r, RequestFeatures(has_tools=True), f=f, action="exclude")
    assert p.candidates == [] and p.empty
    ex = orjson.loads(orjson.dumps(p.explain()))
    assert ex["all_gated"] is True and ex["candidates"] == []
    assert [(s["provider"], s["reason"]) for s in ex["skips"]] == [
        ("a", "tools"),
        ("b", "unhealthy"),
        ("c", "breaker_open"),
    ]
    # Each provider named once: a skip's message that starts with its name is not prefixed again.
    assert ex["summary"] == ("no provider can serve this request: a: request uses tools but a has "
                             "capabilities.tools = false; b: unhealthy after 1 failure; "
                             "c: breaker open after 1 failure, retry in 30 s")
    assert [s["message"] for s in ex["skips"]] == [
        "request uses tools but a has capabilities.tools = false",
        "b: unhealthy after 1 failure",
        "c: breaker open after 1 failure, retry in 30 s",
    ]
    assert all(s["reason"] in SKIP_REASONS for s in ex["skips"])


def test_capability_reason_is_reported_before_transient_state():
    r = routing()
    fail(r, "a")
    p = run(r, RequestFeatures(has_tools=True), f=facts(a={"tools": False}))
    assert [(s.provider, s.reason) for s in p.skips] == [("a", "tools")]


def test_unknown_provider_gets_default_facts_and_duplicates_collapse():
    r = routing("x", "y")
    p = run(r, RequestFeatures(has_tools=True), f={"y": ProviderFacts("y", tools=True)}, chain=["x", "x", "y"],
            action="warn")
    assert p.candidates == ["x", "y"]
    assert p.skips == []


def test_images_never_gate_a_provider():
    # Declared without vision, the provider still serves: the executor replaces the images by a note.
    r = routing("x", "y")
    p = run(r, f={"x": ProviderFacts("x", vision=False), "y": ProviderFacts("y")}, chain=["x", "y"])
    assert p.candidates == ["x", "y"] and p.skips == []


def adaptive(r: Routing, settings: AdaptiveSettings | None = None):
    settings = settings or AdaptiveSettings()
    stats = ProviderStats(settings, r.clock)
    return stats, AdaptiveOrderer(stats, settings, r.clock)


def test_adaptive_then_health_then_gates():
    r = routing(failures=2)
    stats, orderer = adaptive(r)
    for _ in range(3):
        stats.record("a", latency_s=0.9, ok=True)
        stats.record("b", latency_s=0.3, ok=True)
        stats.record("c", latency_s=0.3, ok=True)
    unhealthy(r, "b")
    p = run(r, RequestFeatures(has_tools=True), f=facts(c={"tools": False}), action="demote", orderer=orderer)
    # adaptive: b c a -> demote b: c a b -> gate c
    assert p.candidates == ["a", "b"]
    assert [s.provider for s in p.skips] == ["c"]
    assert [(n["provider"], n["moved"]) for n in p.order_notes] == [("a", "back"), ("b", "back")]
    assert p.explain()["order"][0]["why"] == "median 0.90s >= 1.5x peers 0.30s"


def test_planner_feeds_ineligibility_to_the_debounce():
    r = routing()
    stats, orderer = adaptive(r, AdaptiveSettings(window_s=10.0))
    for p_name, lat in (("a", 0.9), ("b", 0.3), ("c", 0.3)):
        for _ in range(3):
            stats.record(p_name, latency_s=lat, ok=True)
    assert run(r, orderer=orderer).candidates == ["b", "c", "a"]
    r.clock.advance(11)
    for p_name, lat in (("a", 0.3), ("b", 0.3), ("c", 0.9)):
        for _ in range(3):
            stats.record(p_name, latency_s=lat, ok=True)
    assert run(r, orderer=orderer).candidates == ["b", "c", "a"]  # held by debounce
    # b becomes unusable: the held order would lead with slow c, so the planner re-orders now.
    fail(r, "b")
    assert run(r, orderer=orderer).candidates == ["a", "c"]


def test_a_process_that_cannot_start_keeps_its_own_words():
    """The client's answer quotes them as they are (routing/replies.cannot_start); they name the process."""
    r = routing()
    why = "managed process llama cannot start: no such file; fix it"
    r.state.upstreams.stopped(["a"], "llama", on_demand=True, first=True)
    r.state.upstreams.cannot_start(["a"], why)
    p = run(r)
    assert [(s.provider, s.reason, s.message) for s in p.skips] == [("a", "cannot_start", why)]
