"""Issue 41: no reservation outlives its request, on the local ledger (SQLite), for every way a request ends:
served, skipped, refused, failed over, cancelled, the client gone, and the race's own endings (a client leaving
while a participant is launched, a winner in the same tick as a failure that would end the request)."""

from __future__ import annotations

import asyncio

import pytest

from coderouterd.guards.budget import Budget
from coderouterd.providers.errors import DISCONNECT
from coderouterd.routing.attempts import Outcome
from coderouterd.state.store import Store
from tests.support.reservations import ENDINGS, end_request, providers_cfg


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_no_reservation_outlives_its_request(tmp_path, name):
    chain, extra, _ = ENDINGS[name]

    async def go():
        store = Store(tmp_path / "state.db")
        budget = Budget(store)
        budget.configure(providers_cfg(chain, extra), global_cap_usd=10.0, warn_ratio=0.8)
        ex, sink = await end_request(name, budget)
        return budget, ex, sink

    budget, ex, sink = asyncio.run(go())
    snap = budget.snapshot()
    assert budget.outstanding == 0, name
    assert snap["global"]["reserved"] == 0 and all(p["reserved"] == 0 for p in snap["providers"].values()), snap
    record = ex.record
    if name in ("served", "served_stream", "skipped", "failed_over", "race_served", "race_same_tick",
                "garbled_usage"):
        assert record.served_by in ("a", "b") and record.status == 200
        assert budget.spent(record.served_by) > 0  # settled with its cost, not merely given back
    if name == "skipped":
        assert [s.reason for s in record.skips] == ["budget"]
    if name == "refused":
        assert record.served_by is None and record.status in (402, 503) and not record.attempts
    if name == "race_same_tick":
        assert record.served_by == "a"  # the winner is served; the other's 400 ends nothing
    if name == "race_client_gone_while_launching":
        assert {a.outcome for a in record.attempts} == {Outcome.CANCELLED}
        assert len(record.attempts) == 2
    if name == "broke_mid_stream":
        assert record.status == 200 and record.error_class == DISCONNECT and record.answered_by == "a"
        assert record.usage_estimated and record.usage["output_tokens"] >= 1 and budget.spent("a") > 0
    if name == "client_gone":
        # The upstream's content had been produced: it is billed (our estimate), and the record names it.
        assert record.answered_by == "a" and record.usage_estimated
        assert record.usage["output_tokens"] >= 1 and record.usage["input_tokens"] >= 1
        assert budget.spent("a") > 0
