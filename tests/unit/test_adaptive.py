import orjson
import pytest

from coderouterd.routing.adaptive import AdaptiveOrderer, AdaptiveSettings, ProbeScheduler, ProviderStats
from coderouterd.upstream.clock import ManualClock


def setup(**overrides):
    settings = AdaptiveSettings(**overrides)
    clock = ManualClock()
    stats = ProviderStats(settings, clock)
    return settings, clock, stats, AdaptiveOrderer(stats, settings, clock)


def feed(stats, provider, latencies, ok=True, probe=False):
    for lat in latencies:
        stats.record(provider, latency_s=lat, ok=ok, probe=probe)


def test_figures_median_p95_errors_and_age():
    _, clock, stats, _ = setup()
    feed(stats, "a", [0.1 * i for i in range(1, 21)])
    stats.record("a", latency_s=9.0, ok=False)  # a failure's latency is not a latency sample
    stats.record("a", latency_s=None, ok=False)
    clock.advance(2)
    f = stats.figures("a")
    assert f["samples"] == 22 and f["latency_samples"] == 20
    assert f["median_s"] == pytest.approx(1.05)
    assert f["p95_s"] == pytest.approx(1.9)
    assert f["errors"] == 2 and f["error_rate"] == pytest.approx(2 / 22)
    assert f["last_sample_age_s"] == pytest.approx(2)
    assert orjson.loads(orjson.dumps(stats.all_figures()))["a"]["samples"] == 22


def test_unknown_provider_figures_are_empty():
    _, _, stats, _ = setup()
    assert stats.figures("x") == {
        "samples": 0,
        "latency_samples": 0,
        "probes": 0,
        "median_s": None,
        "p95_s": None,
        "error_rate": None,
        "errors": 0,
        "last_sample_age_s": None,
    }


def test_window_expiry_drops_old_samples():
    _, clock, stats, orderer = setup()
    feed(stats, "a", [0.9, 0.9, 0.9])
    feed(stats, "b", [0.3, 0.3, 0.3])
    assert orderer.order(["a", "b"])[0] == ["b", "a"]
    clock.advance(59.9)
    assert stats.figures("a")["samples"] == 3
    clock.advance(0.2)
    assert stats.figures("a")["samples"] == 0
    assert stats.figures("a")["last_sample_age_s"] is None
    # With no figures the desired order is the configured one again.
    assert orderer.desired(["a", "b"]) == (["a", "b"], [])


def test_max_samples_bounds_memory():
    _, _, stats, _ = setup(max_samples=10)
    feed(stats, "a", [1.0] * 50)
    assert stats.figures("a")["samples"] == 10


@pytest.mark.parametrize(
    "slow, moved",
    [(0.447, False), (0.45, True), (0.60, True)],  # 1.49x, exactly 1.5x, 2x of 0.30
)
def test_latency_ratio_boundary(slow, moved):
    _, _, stats, orderer = setup()
    feed(stats, "a", [slow] * 3)
    feed(stats, "b", [0.30] * 3)
    order, reasons = orderer.order(["a", "b"])
    if moved:
        assert order == ["b", "a"]
        assert reasons == [
            {"provider": "a", "moved": "back", "why": f"median {slow:.2f}s >= 1.5x peers 0.30s"}
        ]
    else:
        assert order == ["a", "b"] and reasons == []


def test_reason_text_matches_contract():
    _, _, stats, orderer = setup()
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.3] * 3)
    assert orderer.order(["a", "b"])[1][0]["why"] == "median 0.90s >= 1.5x peers 0.30s"


@pytest.mark.parametrize("a_samples, b_samples, moved", [(2, 3, False), (3, 2, False), (3, 3, True)])
def test_min_latency_samples_for_provider_and_peers(a_samples, b_samples, moved):
    _, _, stats, orderer = setup()
    feed(stats, "a", [1.0] * a_samples)
    feed(stats, "b", [0.1] * b_samples)
    assert orderer.order(["a", "b"])[0] == (["b", "a"] if moved else ["a", "b"])


def test_peers_are_pooled_and_underfed_peers_ignored():
    _, _, stats, orderer = setup()
    feed(stats, "a", [0.5] * 3)
    feed(stats, "b", [0.2] * 3)
    feed(stats, "c", [0.4] * 3)
    # a against the pooled peers [0.2 x3, 0.4 x3]: median 0.30, and 0.50 >= 1.5 x 0.30.
    feed(stats, "d", [0.01] * 2)  # too few samples to count as a peer
    order, reasons = orderer.order(["a", "b", "c", "d"])
    assert order == ["b", "c", "d", "a"]
    assert reasons[0]["why"] == "median 0.50s >= 1.5x peers 0.30s"


def test_peers_are_limited_to_the_chain():
    _, _, stats, orderer = setup()
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.8] * 3)
    feed(stats, "elsewhere", [0.1] * 10)
    assert orderer.order(["a", "b"])[0] == ["a", "b"]


@pytest.mark.parametrize(
    "errors, total, moved",
    [(1, 4, False), (1, 10, True), (1, 11, False), (3, 5, True)],
)
def test_error_rate_path(errors, total, moved):
    _, _, stats, orderer = setup()
    for i in range(total):
        stats.record("a", latency_s=0.1, ok=i >= errors)
    order, reasons = orderer.order(["a", "b"])
    assert order == (["b", "a"] if moved else ["a", "b"])
    if moved:
        rate = errors / total
        assert reasons[0]["why"] == f"error rate {rate:.0%} >= 10% ({errors}/{total})"


def test_both_reasons_are_reported_once():
    _, _, stats, orderer = setup()
    feed(stats, "a", [0.9] * 5)
    feed(stats, "a", [None], ok=False)
    feed(stats, "b", [0.3] * 3)
    _, reasons = orderer.order(["a", "b"])
    assert len(reasons) == 1
    assert "median 0.90s" in reasons[0]["why"] and "error rate 17%" in reasons[0]["why"]


def test_thresholds_are_parameters():
    _, _, stats, orderer = setup(latency_ratio=3.0, min_latency_samples=1)
    feed(stats, "a", [0.9])
    feed(stats, "b", [0.3])
    assert orderer.order(["a", "b"])[0] == ["b", "a"]
    feed(stats, "a", [0.8])
    assert orderer.desired(["a", "b"])[0] == ["a", "b"]


def test_debounce_prevents_flapping():
    _, clock, stats, orderer = setup(window_s=10.0, debounce_s=30.0)
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.3] * 3)
    assert orderer.order(["a", "b"])[0] == ["b", "a"]

    clock.advance(11)  # old samples gone; now b is the slow one
    feed(stats, "a", [0.3] * 3)
    feed(stats, "b", [0.9] * 3)
    order, notes = orderer.order(["a", "b"])
    assert order == ["b", "a"]
    assert {n["moved"] for n in notes} == {"back", "held"}
    assert any(
        n["moved"] == "held" and n["why"].startswith("debounce: order changed 11.0s ago") for n in notes
    )

    clock.advance(18.9)  # 29.9 s since the change
    feed(stats, "a", [0.3] * 3)
    assert orderer.order(["a", "b"])[0] == ["b", "a"]
    clock.advance(0.1)
    assert orderer.order(["a", "b"])[0] == ["a", "b"]
    # ... and the change just made is itself held for debounce_s.
    clock.advance(1)
    feed(stats, "a", [0.9] * 6)
    feed(stats, "b", [0.1] * 6)
    assert orderer.desired(["a", "b"])[0] == ["b", "a"]
    assert orderer.order(["a", "b"])[0] == ["a", "b"]


def test_first_reorder_is_not_debounced_and_zero_debounce_follows_figures():
    _, clock, stats, orderer = setup(window_s=5.0, debounce_s=0.0)
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.3] * 3)
    assert orderer.order(["a", "b"])[0] == ["b", "a"]
    clock.advance(6)
    feed(stats, "a", [0.3] * 3)
    feed(stats, "b", [0.9] * 3)
    assert orderer.order(["a", "b"])[0] == ["a", "b"]


def test_newly_ineligible_provider_lifts_the_debounce():
    _, clock, stats, orderer = setup(window_s=10.0)
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.3] * 3)
    feed(stats, "c", [0.3] * 3)
    assert orderer.order(["a", "b", "c"])[0] == ["b", "c", "a"]
    clock.advance(11)
    feed(stats, "a", [0.3] * 3)
    feed(stats, "b", [0.3] * 3)
    feed(stats, "c", [0.9] * 3)
    assert orderer.order(["a", "b", "c"])[0] == ["b", "c", "a"]
    # b's breaker opens: the held order would now put slow c first, so re-evaluate at once.
    assert orderer.order(["a", "b", "c"], ineligible={"b"})[0] == ["a", "b", "c"]
    # b staying ineligible is not news: the debounce applies again.
    feed(stats, "a", [2.0] * 9)
    assert orderer.order(["a", "b", "c"], ineligible={"b"})[0] == ["a", "b", "c"]


def test_chain_change_resets_debounce_state():
    _, _, stats, orderer = setup()
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.3] * 3)
    assert orderer.order(["a", "b"])[0] == ["b", "a"]
    assert orderer.order(["b", "a"])[0] == ["b", "a"]
    assert orderer.order(["a", "b", "c"])[0] == ["b", "c", "a"]


def test_stats_are_shared_across_profiles():
    settings, clock, stats, fast_profile = setup()
    other_profile = AdaptiveOrderer(stats, settings, clock)
    feed(stats, "a", [0.9] * 3)
    feed(stats, "b", [0.3] * 3)
    assert fast_profile.order(["a", "b"])[0] == ["b", "a"]
    assert other_profile.order(["a", "b", "x"])[0] == ["b", "x", "a"]


def probe_setup(**overrides):
    settings, clock, stats, _ = setup(**overrides)
    return settings, clock, stats, ProbeScheduler(stats, settings, clock)


def test_probes_keep_fallback_peers_fresh():
    _, clock, stats, sched = probe_setup()
    assert sched.due(["a", "b"], {}) == []  # idle chain: nothing to compare yet
    stats.record("a", latency_s=0.2, ok=True)
    assert sched.due(["a", "b"], {}) == ["b"]  # a has a fresh real sample
    sched.mark_probed("b")
    assert sched.due(["a", "b"], {}) == []  # probe in flight
    stats.record("b", latency_s=0.3, ok=True, probe=True)
    assert stats.figures("b")["probes"] == 1
    clock.advance(14.9)
    assert sched.due(["a", "b"], {}) == []
    clock.advance(0.1)
    assert sched.due(["a", "b"], {}) == ["a", "b"]


def test_probe_rate_is_bounded_per_minute():
    _, clock, stats, sched = probe_setup(probe_interval_s=1.0, max_probes_per_minute=4, window_s=600)
    stats.record("a", latency_s=0.2, ok=True)
    probed = 0
    for _ in range(60):
        stats.record("a", latency_s=0.2, ok=True)
        if "b" in sched.due(["a", "b"], {}):
            sched.mark_probed("b")
            probed += 1
        clock.advance(1.0)
    assert probed == 4
    # Probes went out at t=0..3; at t=60 the first has aged out of the minute, so one more is allowed.
    assert sched.probes_last_minute("b") == 3
    stats.record("a", latency_s=0.2, ok=True)
    assert sched.due(["a", "b"], {}) == ["b"]


@pytest.mark.parametrize("probe_paid, expected", [(False, ["c"]), (True, ["b", "c"])])
def test_paid_providers_are_not_probed_unless_allowed(probe_paid, expected):
    _, _, stats, sched = probe_setup(probe_paid=probe_paid)
    stats.record("a", latency_s=0.2, ok=True)
    assert sched.due(["a", "b", "c"], {"b": True, "c": False}) == expected


@pytest.mark.parametrize(
    "chain, overrides, expected",
    [
        (["a"], {}, []),  # no peers to compare with
        (["a", "b"], {"max_probes_per_minute": 0}, []),
        (["a", "b"], {"probe_only_when_active": False}, ["a", "b"]),
    ],
)
def test_probe_edge_cases(chain, overrides, expected):
    _, _, _, sched = probe_setup(**overrides)
    assert sched.due(chain, {}) == expected


def test_only_probe_samples_do_not_keep_a_chain_active():
    _, clock, stats, sched = probe_setup()
    stats.record("a", latency_s=0.2, ok=True)
    clock.advance(61)
    stats.record("b", latency_s=0.2, ok=True, probe=True)
    clock.advance(15)
    assert sched.due(["a", "b"], {}) == []
