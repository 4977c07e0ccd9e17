"""Team keys' limits on one instance: the sliding windows (injected clock), bursts, tpm settled with real counts,
concurrency, the 429's headers, the audit log's one line per key per minute, and a key's monthly budget in the
local ledger (fits every budget that applies, refused naming the key, its cap and spend, kept across restarts)."""

import asyncio
import math
from datetime import UTC, datetime

import orjson
import pytest

from coderouterd.config.schema import Cost, ProviderConfig
from coderouterd.guards.budget import Budget
from coderouterd.guards.key_limits import rate_headers, used_tokens
from coderouterd.keys.limits import OUTPUT_GUESS, Admission, KeyLimits, Refusal, Window, estimate_tokens
from coderouterd.keys.model import TeamKey
from coderouterd.state.audit import AuditLog
from coderouterd.state.events import KeyRateLimited
from coderouterd.state.store import Store


class Tick:
    def __init__(self, t=1000.0):
        self.t = t

    def __call__(self):
        return self.t


def _key(**kw):
    return TeamKey(name=kw.pop("name", "alice"), prefix="crk_abcd", **kw)


# -- windows --------------------------------------------------------------------------------------------------


def test_rpm_allows_a_burst_of_n_then_refuses_until_the_oldest_leaves_the_window():
    clock = Tick()
    limits = KeyLimits(clock)
    key = _key(rpm=5)
    got = [limits.admit(key, 10) for _ in range(5)]
    assert all(isinstance(a, Admission) for a in got)  # a burst of N at once
    refused = limits.admit(key, 10)
    assert isinstance(refused, Refusal) and refused.limit == "rpm"
    assert refused.retry_after_s == pytest.approx(60.0)
    assert "alice" in refused.message and "rpm" in refused.message
    clock.t += 59.9
    assert isinstance(limits.admit(key, 10), Refusal)  # still inside the window of the burst
    clock.t += 0.1
    assert isinstance(limits.admit(key, 10), Admission)  # the burst is 60 s old: gone


def test_rpm_never_more_than_n_in_any_60_second_window():
    clock = Tick()
    limits = KeyLimits(clock)
    key = _key(rpm=7)
    admitted = []
    for step in range(1200):  # 10 minutes of a client asking every 0.5 s
        clock.t = 1000.0 + step * 0.5
        if isinstance(limits.admit(key, 1), Admission):
            admitted.append(clock.t)
    for i, t in enumerate(admitted):
        in_window = [u for u in admitted[i:] if u < t + 60.0]
        assert len(in_window) <= 7
    assert len(admitted) >= 7 * 9  # and the limit is used, not starved


def test_window_wait_for_counts_what_must_leave():
    clock = Tick(0.0)
    w = Window()
    w.add(0.0, 30)
    w.add(10.0, 30)
    w.add(20.0, 30)
    assert w.wait_for(25.0, 10, 100) == 0.0
    assert w.wait_for(25.0, 40, 100) == pytest.approx(35.0)  # the first entry must leave (at 60)
    assert w.wait_for(25.0, 60, 100) == pytest.approx(45.0)  # the first two
    assert math.isinf(w.wait_for(25.0, 101, 100))
    assert w.reset_in(25.0) == pytest.approx(55.0)
    del clock


def test_tpm_estimate_is_settled_with_the_real_count():
    clock = Tick()
    limits = KeyLimits(clock)
    key = _key(tpm=3000)
    first = limits.admit(key, 2000)
    assert isinstance(first, Admission)
    assert isinstance(limits.admit(key, 1500), Refusal)  # 2000 + 1500 > 3000
    limits.release(first, 400)  # the answer was short: the window holds what was used
    assert limits.usage(key)["tpm"]["used"] == 400
    second = limits.admit(key, 1500)
    assert isinstance(second, Admission)
    limits.release(second, 2500)  # longer than estimated: the window counts the real figure
    assert limits.usage(key)["tpm"]["used"] == 2900
    refused = limits.admit(key, 200)
    assert isinstance(refused, Refusal) and refused.limit == "tpm" and not refused.final
    limits.release(second, 1)  # released twice: no change
    assert limits.usage(key)["tpm"]["used"] == 2900


def test_tpm_settle_after_the_window_changes_nothing():
    clock = Tick()
    limits = KeyLimits(clock)
    key = _key(tpm=1000)
    adm = limits.admit(key, 900)
    clock.t += 61.0  # a long stream: its entry left the window before it ended
    assert isinstance(adm, Admission)
    limits.release(adm, 5000)
    assert limits.usage(key)["tpm"]["used"] == 0
    assert isinstance(limits.admit(key, 900), Admission)


def test_a_request_over_the_whole_tpm_is_told_not_to_retry():
    limits = KeyLimits(Tick())
    refused = limits.admit(_key(tpm=500), 800)
    assert isinstance(refused, Refusal) and refused.final
    h = rate_headers(refused, "anthropic", now=0.0)
    assert h["x-should-retry"] == "false"
    assert "retry-after" not in h  # no time to wait for: retrying cannot help it
    assert "800" in refused.message and "500" in refused.message


def test_estimate_caps_the_expected_output():
    assert estimate_tokens(100, 64000) == 100 + OUTPUT_GUESS
    assert estimate_tokens(100, 200) == 300
    assert estimate_tokens(100, None) == 100 + OUTPUT_GUESS
    assert estimate_tokens(100, "nonsense") == 100 + OUTPUT_GUESS
    assert used_tokens({"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100}) == 115
    assert used_tokens({}) is None and used_tokens(None) is None


def test_concurrency_counts_requests_in_flight():
    limits = KeyLimits(Tick())
    key = _key(concurrency=2)
    a, b = limits.admit(key, 1), limits.admit(key, 1)
    assert isinstance(a, Admission) and isinstance(b, Admission)
    refused = limits.admit(key, 1)
    assert isinstance(refused, Refusal) and refused.limit == "concurrency" and refused.retry_after_header() == 1
    limits.release(a, None)
    limits.release(a, None)  # twice: frees one slot, not two
    assert isinstance(limits.admit(key, 1), Admission)
    assert isinstance(limits.admit(key, 1), Refusal)


def test_keys_do_not_share_windows_and_a_key_without_limits_is_not_limited():
    limits = KeyLimits(Tick())
    assert not limits.limited(_key())
    a, b = _key(name="a", rpm=1), _key(name="b", rpm=1)
    assert isinstance(limits.admit(a, 1), Admission)
    assert isinstance(limits.admit(b, 1), Admission)
    assert isinstance(limits.admit(a, 1), Refusal)


def test_a_changed_limit_applies_to_the_next_request():
    limits = KeyLimits(Tick())
    assert isinstance(limits.admit(_key(rpm=1), 1), Admission)
    assert isinstance(limits.admit(_key(rpm=1), 1), Refusal)
    assert isinstance(limits.admit(_key(rpm=2), 1), Admission)  # `keys update` raised it


# -- headers --------------------------------------------------------------------------------------------------


def test_headers_in_each_wire():
    clock = Tick()
    limits = KeyLimits(clock)
    key = _key(rpm=2, tpm=10_000)
    limits.admit(key, 100)
    clock.t += 10
    limits.admit(key, 100)
    refused = limits.admit(key, 100)
    assert isinstance(refused, Refusal)
    now = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    a = rate_headers(refused, "anthropic", now=now)
    assert a["retry-after"] == "50"
    assert a["anthropic-ratelimit-requests-limit"] == "2"
    assert a["anthropic-ratelimit-requests-remaining"] == "0"
    assert a["anthropic-ratelimit-requests-reset"] == "2026-01-01T00:01:00Z"  # the last entry's 60 s
    assert a["anthropic-ratelimit-tokens-limit"] == "10000"
    assert a["anthropic-ratelimit-tokens-remaining"] == "9800"
    assert "x-should-retry" not in a
    o = rate_headers(refused, "openai", now=now)
    assert o["retry-after"] == "50"
    assert o["x-ratelimit-limit-requests"] == "2" and o["x-ratelimit-remaining-requests"] == "0"
    assert o["x-ratelimit-reset-requests"] == "1m0s"
    assert o["x-ratelimit-limit-tokens"] == "10000" and o["x-ratelimit-remaining-tokens"] == "9800"
    assert not any(k.startswith("anthropic-") for k in o)


# -- audit: one line per key per minute ------------------------------------------------------------------------


def test_rate_limit_refusals_write_one_audit_line_per_key_per_minute(tmp_path):
    audit = AuditLog(tmp_path)
    t0 = 1_800_000_000.0

    def ev(key, dt):
        return KeyRateLimited(key=key, limit="rpm", allowed=5, retry_after_s=3.0, ts=t0 + dt)

    audit.sink([ev("alice", 0), ev("alice", 1), ev("bob", 2), ev("alice", 30), ev("alice", 59.9)])
    audit.sink([ev("alice", 60.0), ev("alice", 61), ev("bob", 70)])
    audit.close()
    lines = [orjson.loads(x) for x in (tmp_path / "audit.jsonl").read_bytes().splitlines()]
    assert [(r["key"], r.get("refusals_since_last_line", 0)) for r in lines] == [
        ("alice", 0), ("bob", 0), ("alice", 3), ("bob", 0)]
    assert all(r["kind"] == "key_rate_limited" for r in lines)


# -- a key's budget in the local ledger ------------------------------------------------------------------------

PRICES = Cost(input=3.0, output=15.0)


def _budget(store, *, global_cap=0.0, provider_cap=0.0):
    b = Budget(store, clock=lambda: datetime(2026, 3, 10, tzinfo=UTC).timestamp())
    b.configure({"claude": ProviderConfig(base_url="https://api.example.com", paid=True, cost=PRICES,
                                          monthly_budget_usd=provider_cap),
                 "local": ProviderConfig(base_url="http://127.0.0.1:1")},
                global_cap_usd=global_cap, warn_ratio=0.8)
    return b


def test_a_key_budget_holds_concurrent_reservations_and_names_the_key(tmp_path):
    store = Store(tmp_path / "s.db")
    budget = _budget(store, global_cap=100.0)

    async def request(i):
        res = budget.reserve("claude", 0.3, key="alice", key_cap=1.0)
        if res is None:
            return False
        await asyncio.sleep(0)
        budget.settle(res, 0.3)
        return True

    async def main():
        return await asyncio.gather(*(request(i) for i in range(10)))

    assert sum(asyncio.run(main())) == 3  # 3 × 0.3 fit in 1.0; the 4th would not
    assert budget.key_spent("alice") == pytest.approx(0.9)
    assert budget.spent() == pytest.approx(0.9)  # the global cap counts it too
    # Another key, or no key, is not held by alice's cap.
    assert budget.reserve("claude", 0.3, key="bob", key_cap=1.0) is not None
    assert budget.reserve("claude", 0.3) is not None
    why = budget.too_dear("claude", 0.3, key="alice", key_cap=1.0)
    assert why is not None and "team key 'alice'" in why and "0.90 of 1.00 USD" in why
    # A free provider is never refused for a key's budget, and charges it nothing.
    free = budget.reserve("local", 5.0, key="alice", key_cap=1.0)
    assert free is not None
    budget.settle(free, 5.0)
    assert budget.key_spent("alice") == pytest.approx(0.9)


def test_a_request_must_fit_every_budget(tmp_path):
    budget = _budget(Store(tmp_path / "s.db"), global_cap=10.0, provider_cap=0.5)
    assert budget.reserve("claude", 0.6, key="alice", key_cap=5.0) is None  # the provider's cap refuses
    assert "'claude'" in (budget.too_dear("claude", 0.6, key="alice", key_cap=5.0) or "")
    res = budget.reserve("claude", 0.4, key="alice", key_cap=0.45)
    assert res is not None
    assert budget.reserve("claude", 0.1, key="alice", key_cap=0.45) is None  # the key's cap: 0.4 held + 0.1
    budget.cancel(res)
    assert budget.snapshot()["keys"] == {}  # nothing held, nothing spent


def test_a_key_spend_survives_a_restart(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, flush_interval_s=60)
    store.open()
    budget = _budget(store)
    res = budget.reserve("claude", 0.5, key="alice", key_cap=2.0)
    assert res is not None
    budget.settle(res, 1.25)
    store.close()
    again = Store(path, flush_interval_s=60)
    again.open()
    try:
        budget2 = _budget(again)
        assert budget2.key_spent("alice") == pytest.approx(1.25)
        assert budget2.snapshot()["keys"]["alice"]["spent"] == pytest.approx(1.25)
        assert "providers" in budget2.snapshot() and "key:alice" not in budget2.snapshot()["providers"]
        assert budget2.reserve("claude", 1.0, key="alice", key_cap=2.0) is None  # 1.25 + 1.0 > 2.0
    finally:
        again.close()


def test_a_key_with_a_zero_budget_may_use_free_providers_only(tmp_path):
    budget = _budget(Store(tmp_path / "s.db"))
    assert budget.reserve("claude", 0.01, key="intern", key_cap=0.0) is None
    why = budget.too_dear("claude", 0.01, key="intern", key_cap=0.0)
    assert why is not None and "team key 'intern'" in why and "free providers only" in why
    assert budget.reserve("local", 0.0, key="intern", key_cap=0.0) is not None
    # None is no budget of its own: only the other caps apply, and its spend is still kept.
    res = budget.reserve("claude", 0.01, key="lead", key_cap=None)
    assert res is not None
    budget.settle(res, 0.02)
    assert budget.key_spent("lead") == pytest.approx(0.02)
