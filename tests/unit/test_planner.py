from enum import Enum

import orjson
import pytest

from coderouterd.routing.adaptive import AdaptiveOrderer, AdaptiveSettings, ProviderStats
from coderouterd.routing.breaker import BreakerRegistry, BreakerState
from coderouterd.routing.clock import ManualClock
from coderouterd.routing.planner import SKIP_REASONS, ProviderFacts, RequestFeatures, plan

CHAIN = ["a", "b", "c"]


def facts(**per_provider):
    out = {p: ProviderFacts(name=p, vision=True, context_window=100_000) for p in CHAIN}
    for name, changes in per_provider.items():
        for key, value in changes.items():
            setattr(out[name], key, value)
    return out


def run(features=None, *, f=None, breakers=None, health=None, action="exclude", **kw):
    return plan(
        CHAIN,
        f or facts(),
        features or RequestFeatures(),
        breakers=breakers or BreakerRegistry(clock=ManualClock()),
        health=health or {},
        health_action=action,
        **kw,
    )


def open_breaker(name, retry_after=None):
    reg = BreakerRegistry(failures=1, recovery_s=30, clock=ManualClock())
    reg.get(name).record_failure(retry_after=retry_after)
    return reg


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
    p = run(features, f=facts(b=provider_changes))
    assert p.candidates == ["a", "c"]
    assert len(p.skips) == 1
    skip = p.skips[0]
    assert (skip.provider, skip.reason) == ("b", reason)
    assert words in skip.message and "b" in skip.message
    # Same provider facts, request without the feature: no gate.
    assert run(RequestFeatures(), f=facts(b=provider_changes)).candidates == CHAIN


def test_thinking_is_not_a_gate_unless_required():
    assert run(RequestFeatures(), f=facts(b={"thinking": False})).candidates == CHAIN


@pytest.mark.parametrize(
    "tokens, window, gated", [(32_768, 32_768, False), (32_769, 32_768, True), (10**7, 0, False)]
)
def test_context_gate_boundary_and_unknown_window(tokens, window, gated):
    p = run(RequestFeatures(estimated_tokens=tokens), f=facts(a={"context_window": window}))
    assert ("a" not in p.candidates) is gated


def test_budget_gate_uses_the_hook():
    asked = []

    def budget_ok(name):
        asked.append(name)
        return name != "a"

    p = run(budget_ok=budget_ok)
    assert p.candidates == ["b", "c"]
    assert (p.skips[0].provider, p.skips[0].reason) == ("a", "budget")
    assert sorted(asked) == CHAIN


def test_breaker_open_is_skipped_half_open_is_planned():
    reg = open_breaker("b", retry_after=45)
    p = run(breakers=reg)
    assert p.candidates == ["a", "c"]
    assert p.skips[0].reason == "breaker_open" and "45.0s" in p.skips[0].message

    reg2 = BreakerRegistry(failures=1, recovery_s=30, clock=(clock := ManualClock()))
    reg2.get("b").record_failure()
    clock.advance(30)
    p2 = run(breakers=reg2)
    assert p2.candidates == CHAIN
    assert reg2.get("b").state is BreakerState.HALF_OPEN
    # Planning does not consume the one trial: the executor's allow() does.
    assert reg2.get("b").allow() and not reg2.get("b").allow()


class Health(Enum):
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"


@pytest.mark.parametrize(
    "action, candidates, skipped, note",
    [
        ("exclude", ["b", "c"], ["a"], None),
        ("demote", ["b", "c", "a"], [], {"provider": "a", "moved": "back"}),
        ("warn", ["a", "b", "c"], [], {"provider": "a", "moved": "none"}),
    ],
)
@pytest.mark.parametrize("value", ["UNHEALTHY", "unhealthy", Health.UNHEALTHY])
def test_health_actions(action, candidates, skipped, note, value):
    p = run(health={"a": value, "b": "HEALTHY"}, action=action)
    assert p.candidates == candidates
    assert [s.provider for s in p.skips] == skipped
    if skipped:
        assert p.skips[0].reason == "unhealthy" and "health_action is exclude" in p.skips[0].message
    if note:
        assert {k: p.order_notes[0][k] for k in note} == note
        assert action in p.order_notes[0]["why"]


def test_degraded_is_noted_but_not_acted_on():
    p = run(health={"a": "DEGRADED"}, action="exclude")
    assert p.candidates == CHAIN
    assert p.order_notes == [{"provider": "a", "moved": "none", "why": "health DEGRADED"}]


def test_invalid_health_action():
    with pytest.raises(ValueError):
        run(action="panic")


def test_all_gated_plan_explains_every_skip():
    f = facts(a={"tools": False}, b={"tools": True}, c={"tools": True})
    reg = open_breaker("c")
    p = run(
        RequestFeatures(has_tools=True),
        f=f,
        breakers=reg,
        health={"b": "UNHEALTHY"},
        action="exclude",
    )
    assert p.candidates == [] and p.empty
    ex = orjson.loads(orjson.dumps(p.explain()))
    assert ex["all_gated"] is True and ex["candidates"] == []
    assert [(s["provider"], s["reason"]) for s in ex["skips"]] == [
        ("a", "tools"),
        ("b", "unhealthy"),
        ("c", "breaker_open"),
    ]
    assert ex["summary"].startswith("no provider can serve this request: a: request uses tools")
    assert all(s["reason"] in SKIP_REASONS for s in ex["skips"])


def test_capability_reason_is_reported_before_transient_state():
    p = run(RequestFeatures(has_tools=True), f=facts(a={"tools": False}), breakers=open_breaker("a"))
    assert p.skips[0].reason == "tools"


def test_unknown_provider_gets_default_facts_and_duplicates_collapse():
    p = plan(
        ["x", "x", "y"],
        {"y": ProviderFacts("y", tools=True)},
        RequestFeatures(has_tools=True),
        breakers=BreakerRegistry(clock=ManualClock()),
        health={},
        health_action="warn",
    )
    assert p.candidates == ["x", "y"]
    assert p.skips == []


def test_images_never_gate_a_provider():
    # Declared without vision, the provider still serves: the executor replaces the images by a note.
    p = plan(["x", "y"], {"x": ProviderFacts("x", vision=False), "y": ProviderFacts("y")},
             RequestFeatures(), breakers=BreakerRegistry(clock=ManualClock()), health={},
             health_action="exclude")
    assert p.candidates == ["x", "y"] and p.skips == []


def adaptive(clock):
    settings = AdaptiveSettings()
    stats = ProviderStats(settings, clock)
    return stats, AdaptiveOrderer(stats, settings, clock)


def test_adaptive_then_health_then_gates():
    clock = ManualClock()
    stats, orderer = adaptive(clock)
    for _ in range(3):
        stats.record("a", latency_s=0.9, ok=True)
        stats.record("b", latency_s=0.3, ok=True)
        stats.record("c", latency_s=0.3, ok=True)
    p = run(
        RequestFeatures(has_tools=True),
        f=facts(c={"tools": False}),
        health={"b": "UNHEALTHY"},
        action="demote",
        orderer=orderer,
    )
    # adaptive: b c a -> demote b: c a b -> gate c
    assert p.candidates == ["a", "b"]
    assert [s.provider for s in p.skips] == ["c"]
    assert [(n["provider"], n["moved"]) for n in p.order_notes] == [("a", "back"), ("b", "back")]
    assert p.explain()["order"][0]["why"] == "median 0.90s >= 1.5x peers 0.30s"


def test_planner_feeds_ineligibility_to_the_debounce():
    clock = ManualClock()
    settings = AdaptiveSettings(window_s=10.0)
    stats = ProviderStats(settings, clock)
    orderer = AdaptiveOrderer(stats, settings, clock)
    for p_name, lat in (("a", 0.9), ("b", 0.3), ("c", 0.3)):
        for _ in range(3):
            stats.record(p_name, latency_s=lat, ok=True)
    assert run(orderer=orderer).candidates == ["b", "c", "a"]
    clock.advance(11)
    for p_name, lat in (("a", 0.3), ("b", 0.3), ("c", 0.9)):
        for _ in range(3):
            stats.record(p_name, latency_s=lat, ok=True)
    assert run(orderer=orderer).candidates == ["b", "c", "a"]  # held by debounce
    # b becomes unusable: the held order would lead with slow c, so the planner re-orders now.
    assert run(orderer=orderer, breakers=open_breaker("b")).candidates == ["a", "c"]
