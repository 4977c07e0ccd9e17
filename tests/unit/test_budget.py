import asyncio
import random
from datetime import UTC, datetime

import pytest

from coderouterd.config.schema import Cost, ProviderConfig
from coderouterd.guards.budget import Budget
from coderouterd.state.events import BudgetBlocked, BudgetWarning
from coderouterd.state.store import Store


class Clock:
    def __init__(self, *args):
        self.t = datetime(*args, tzinfo=UTC).timestamp()

    def set(self, *args):
        self.t = datetime(*args, tzinfo=UTC).timestamp()

    def __call__(self):
        return self.t


PRICES = Cost(input=3.0, output=15.0, cache_read=0.3, cache_write=3.75)


def _paid(cap=0.0, **kw):
    return ProviderConfig(base_url="https://api.example.com", paid=True, cost=PRICES, monthly_budget_usd=cap, **kw)


def _local(**kw):
    return ProviderConfig(base_url="http://127.0.0.1:11434", **kw)


def _budget(tmp_path, providers, *, global_cap=0.0, warn_ratio=0.8, clock=None, store=None):
    events = []
    store = store if store is not None else Store(tmp_path / "state.db")
    budget = Budget(store, global_cap_usd=global_cap, warn_ratio=warn_ratio, publish=events.append,
                    clock=clock or Clock(2025, 5, 14, 12))
    budget.configure(providers, global_cap_usd=global_cap, warn_ratio=warn_ratio)
    return budget, events, store


def _kinds(events):
    return [(type(e).__name__, e.provider) for e in events]


def test_concurrent_reservations_never_overshoot_the_cap(tmp_path):
    budget, events, _ = _budget(tmp_path, {"claude": _paid(cap=1.0), "local": _local()})
    high_water = 0.0

    async def request(i):
        nonlocal high_water
        res = budget.reserve("claude", 0.1)
        if res is None:
            return False
        for _ in range(random.Random(i).randint(1, 4)):
            await asyncio.sleep(0)
        assert budget.spent("claude") + budget.snapshot()["providers"]["claude"]["reserved"] <= 1.0 + 1e-9
        budget.settle(res, 0.1 if i % 3 else 0.07)
        high_water = max(high_water, budget.spent("claude"))
        return True

    async def main():
        return await asyncio.gather(*(request(i) for i in range(32)))

    served = asyncio.run(main())
    assert sum(served) == 10  # exactly as many 0.1 reservations as fit in 1.0, all at once
    assert high_water <= 1.0 + 1e-9
    assert budget.snapshot()["providers"]["claude"]["reserved"] == 0.0
    # Some settled below the estimate, so room opened up again after the burst.
    assert budget.allowed("claude") and budget.reserve("claude", 0.05) is not None
    # Refusals caused by in-flight reservations alone are not a spent budget: nothing audited.
    assert not any(isinstance(e, BudgetBlocked) for e in events)


def test_concurrent_reservations_against_the_global_cap(tmp_path):
    providers = {"a": _paid(), "b": _paid(), "free": _local()}
    budget, _, _ = _budget(tmp_path, providers, global_cap=2.0)

    async def request(i):
        name = ("a", "b", "free")[i % 3]
        res = budget.reserve(name, 0.25)
        if res is None:
            return None
        await asyncio.sleep(0)
        budget.settle(res, 0.25)
        return name

    async def main():
        return await asyncio.gather(*(request(i) for i in range(32)))

    served = asyncio.run(main())
    assert served.count("free") == 10  # free is never refused and never charged to the global cap
    assert served.count("a") + served.count("b") == 8
    assert budget.spent() == pytest.approx(2.0)
    assert budget.spent("free") == pytest.approx(2.5)


def test_reservation_lifecycle(tmp_path):
    budget, events, _ = _budget(tmp_path, {"claude": _paid(cap=1.0)})
    held = budget.reserve("claude", 0.6)
    assert budget.reserve("claude", 0.5) is None  # 0.6 held + 0.5 > 1.0
    assert budget.allowed("claude")
    second = budget.reserve("claude", 0.4)
    assert second is not None and not budget.allowed("claude")  # fully held, nothing spent yet
    assert budget.snapshot()["providers"]["claude"]["blocked"] is True
    budget.cancel(second)
    budget.cancel(second)  # idempotent
    assert budget.allowed("claude")
    budget.settle(held, 0.2)
    budget.settle(held, 0.2)  # settling twice must not charge twice
    assert budget.spent("claude") == pytest.approx(0.2)
    assert budget.snapshot()["providers"]["claude"]["reserved"] == 0.0
    assert events == []


def test_warning_and_block_published_once_per_month(tmp_path):
    clock = Clock(2025, 5, 14, 12)
    budget, events, _ = _budget(tmp_path, {"claude": _paid(cap=10.0)}, clock=clock)
    budget.record("claude", 5.0)
    assert events == []
    budget.settle(budget.reserve("claude", 4.0), 3.5)  # 85%: crosses 80%
    assert _kinds(events) == [("BudgetWarning", "claude")]
    w = events[0]
    assert (w.spent_usd, w.cap_usd, w.ratio) == pytest.approx((8.5, 10.0, 0.85))
    budget.record("claude", 0.5)
    assert len(events) == 1  # still above the threshold: no second warning
    assert budget.reserve("claude", 1.5) is None  # the estimate really does not fit the spend
    assert _kinds(events)[1:] == [("BudgetBlocked", "claude")]
    budget.record("claude", 1.0)
    assert not budget.allowed("claude") and budget.reserve("claude", 0.01) is None
    assert len(events) == 2  # blocked is announced once, not per refused request
    assert events[1].cap_usd == 10.0

    clock.set(2025, 6, 1, 0, 0, 1)
    assert budget.allowed("claude") and budget.spent("claude") == 0.0
    budget.record("claude", 9.0)
    assert _kinds(events)[2:] == [("BudgetWarning", "claude")]


def test_spend_reaching_the_cap_announces_the_block_when_settled(tmp_path):
    budget, events, _ = _budget(tmp_path, {"claude": _paid(cap=1.0)})
    budget.settle(budget.reserve("claude", 0.5), 1.2)  # actual usage beat the estimate
    assert _kinds(events) == [("BudgetWarning", "claude"), ("BudgetBlocked", "claude")]
    assert not budget.allowed("claude")


def test_month_rollover_starts_at_zero_and_keeps_history(tmp_path):
    clock = Clock(2025, 12, 31, 23, 59, 59)
    budget, _, store = _budget(tmp_path, {"claude": _paid(cap=1.0)}, global_cap=5.0, clock=clock)
    budget.record("claude", 1.0)
    inflight = budget.reserve("other", 0.0)
    assert not budget.allowed("claude") and budget.snapshot()["month"] == "2025-12"
    clock.set(2026, 1, 1)
    assert budget.allowed("claude")
    assert budget.spent("claude") == 0.0 and budget.spent() == 0.0
    assert budget.snapshot()["month"] == "2026-01"
    budget.settle(inflight, 0.0)
    budget.record("claude", 0.25)
    assert store.get("budget", "2025-12:claude") == 1.0
    assert store.get("budget", "2025-12:*") == 1.0
    assert store.get("budget", "2026-01:claude") == 0.25
    # A clock stepping back (NTP) finds the old month's totals again.
    clock.set(2025, 12, 31, 23)
    assert budget.spent("claude") == 1.0


def test_state_survives_a_restart_through_a_real_store(tmp_path):
    path = tmp_path / "state" / "state.db"
    clock = Clock(2025, 5, 14, 12)
    providers = {"claude": _paid(cap=10.0), "local": _local()}
    store = Store(path, flush_interval_s=60)
    store.open()
    budget, events, _ = _budget(tmp_path, providers, global_cap=20.0, clock=clock, store=store)
    budget.record("claude", 8.5)
    budget.record("local", 0.0)
    assert _kinds(events) == [("BudgetWarning", "claude")]
    store.close()

    again = Store(path, flush_interval_s=60)
    again.open()
    try:
        budget2, events2, _ = _budget(tmp_path, providers, global_cap=20.0, clock=clock, store=again)
        assert budget2.spent("claude") == pytest.approx(8.5)
        assert budget2.spent() == pytest.approx(8.5)
        assert events2 == []  # the warning was already given this month
        budget2.record("claude", 2.0)
        assert _kinds(events2) == [("BudgetBlocked", "claude")]
        assert not budget2.allowed("claude")
    finally:
        again.close()


def test_zero_cost_and_unpaid_providers_are_never_blocked(tmp_path):
    providers = {
        "local": _local(monthly_budget_usd=1.0),
        "free_priced": ProviderConfig(base_url="https://openrouter.ai/api", cost=PRICES, monthly_budget_usd=1.0),
        "paid_free": ProviderConfig(base_url="https://x.example", paid=True, monthly_budget_usd=1.0),
    }
    budget, events, _ = _budget(tmp_path, providers, global_cap=1.0)
    for name in providers:
        for _ in range(5):
            res = budget.reserve(name, 10.0)
            assert res is not None and budget.allowed(name)
            budget.settle(res, 3.0)
        assert budget.spent(name) == pytest.approx(15.0)
    assert budget.spent() == 0.0  # nothing real was charged
    assert events == []
    snap = budget.snapshot()
    assert not any(p["blocked"] for p in snap["providers"].values()) and not snap["global"]["blocked"]


def test_global_cap_blocks_every_paid_provider(tmp_path):
    providers = {"a": _paid(), "b": _paid(cap=100.0), "local": _local()}
    budget, events, _ = _budget(tmp_path, providers, global_cap=2.0)
    budget.record("a", 1.7)
    assert _kinds(events) == [("BudgetWarning", "*")]
    assert budget.reserve("b", 0.5) is None
    assert budget.allowed("b")
    budget.record("a", 0.3)
    assert not budget.allowed("a") and not budget.allowed("b") and budget.allowed("local")
    assert _kinds(events)[1:] == [("BudgetBlocked", "*")]
    assert budget.spent("b") == 0.0 and budget.spent() == pytest.approx(2.0)


def test_configure_reports_spend_already_past_a_lowered_cap(tmp_path):
    budget, events, _ = _budget(tmp_path, {"claude": _paid(cap=100.0)})
    budget.record("claude", 9.0)
    assert events == []
    budget.configure({"claude": _paid(cap=10.0)}, global_cap_usd=0.0, warn_ratio=0.8)
    assert _kinds(events) == [("BudgetWarning", "claude")]
    budget.configure({"claude": _paid(cap=8.0)}, global_cap_usd=0.0, warn_ratio=0.8)
    assert _kinds(events)[1:] == [("BudgetBlocked", "claude")]
    budget.configure({"claude": _paid(cap=0.0)}, global_cap_usd=0.0, warn_ratio=0.8)
    assert budget.allowed("claude")  # no cap, no block


def test_snapshot_shape(tmp_path):
    budget, _, _ = _budget(tmp_path, {"claude": _paid(cap=10.0), "local": _local()}, global_cap=40.0)
    budget.record("claude", 2.5)
    budget.reserve("claude", 1.0)
    snap = budget.snapshot()
    assert snap["month"] == "2025-05"
    assert snap["global"] == {"spent": 2.5, "cap": 40.0, "ratio": 2.5 / 40.0, "reserved": 1.0, "blocked": False}
    assert snap["providers"]["claude"] == {"spent": 2.5, "cap": 10.0, "ratio": 0.25, "reserved": 1.0,
                                           "blocked": False}
    assert snap["providers"]["local"] == {"spent": 0.0, "cap": 0.0, "ratio": None, "reserved": 0.0,
                                          "blocked": False}


def test_estimate_is_the_worst_case():
    cfg = _paid()
    # 10k input at the cache-write price (the dearest input) + 2k output.
    assert Budget.estimate(cfg, 10_000, 2_000) == pytest.approx((10_000 * 3.75 + 2_000 * 15.0) / 1e6)
    assert Budget.estimate(_local(), 10_000, 2_000) == 0.0
    assert Budget.estimate(None, 10, 10) == 0.0
    assert Budget.estimate({"input": 1.0, "output": 2.0}, 1_000_000, 500_000) == pytest.approx(2.0)
    assert Budget.estimate(cfg, -5, -5) == 0.0


def test_bad_values_and_a_broken_publisher_are_survived(tmp_path):
    store = Store(tmp_path / "s.db")
    store.set("budget", "2025-05:claude", "garbage")
    store.set("budget", "2025-05:*", 1.5)
    store.set("budget", "2025-05/notices", ["not", "a", "dict"])

    def explode(event):
        raise RuntimeError("sink down")

    budget = Budget(store, publish=explode, clock=Clock(2025, 5, 2))
    budget.configure({"claude": _paid(cap=1.0)}, global_cap_usd=0.0, warn_ratio=0.5)
    assert budget.spent("claude") == 0.0 and budget.spent() == 1.5
    for bad in (float("nan"), float("inf"), -3.0, "x"):
        budget.record("claude", bad)
    assert budget.spent("claude") == 0.0
    assert budget.reserve("claude", float("nan")).estimate_usd == 0.0
    budget.record("claude", 1.0)  # crosses both thresholds; the publisher raises, the ledger does not
    assert not budget.allowed("claude")
    assert store.get("budget", "2025-05/notices") == {"warned": ["claude"], "blocked": ["claude"]}


def test_warning_event_types(tmp_path):
    budget, events, _ = _budget(tmp_path, {"claude": _paid(cap=1.0)}, warn_ratio=0.5)
    budget.record("claude", 0.5)
    assert isinstance(events[0], BudgetWarning) and events[0].to_dict()["kind"] == "budget_warning"


def test_spent_cap_names_the_budget_the_cap_and_the_reset_only_when_settled_spend_fills_it(tmp_path):
    """Issue 23 item 7: a cap spent until next month is told apart from momentary congestion (reservations)."""
    providers = {"claude": _paid(cap=1.0), "other": _paid(), "local": _local()}
    budget, _, _ = _budget(tmp_path, providers, global_cap=5.0, clock=Clock(2025, 12, 30, 8))
    held = budget.reserve("claude", 1.0)
    assert not budget.allowed("claude") and budget.spent_cap("claude") is None  # in flight: clears by itself
    budget.settle(held, 1.0)
    why = budget.spent_cap("claude")
    assert why == "the 'claude' monthly budget is spent (1.00 of 1.00 USD); it resets 2026-01-01 00:00 UTC"
    assert budget.spent_cap("other") is None and budget.spent_cap("local") is None
    budget.record("other", 4.0)
    assert budget.spent_cap("other") == ("the global monthly budget is spent (5.00 of 5.00 USD); it resets"
                                         " 2026-01-01 00:00 UTC")


def test_too_dear_is_a_request_that_cannot_fit_what_settled_spend_left(tmp_path):
    """A nearly spent cap: this request's own worst case is more than is left, whatever is in flight."""
    providers = {"claude": _paid(cap=1.0), "local": _local()}
    budget, _, _ = _budget(tmp_path, providers, global_cap=0.0, clock=Clock(2025, 12, 30, 8))
    budget.record("claude", 0.99)
    why = budget.too_dear("claude", 0.05)
    assert why is not None and why.startswith("this request may cost up to 0.05 USD, more than the 0.01 USD "
                                              "left of the 'claude' monthly budget (0.99 of 1.00 USD spent")
    assert why.endswith("reset 2026-01-01 00:00 UTC)")
    assert budget.too_dear("claude", 0.005) is None  # fits
    held = budget.reserve("claude", 0.009)
    assert budget.reserve("claude", 0.005) is None and budget.too_dear("claude", 0.005) is None  # congestion only
    budget.cancel(held)
    assert budget.too_dear("local", 100.0) is None
