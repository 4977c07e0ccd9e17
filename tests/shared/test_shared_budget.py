"""The budget guard over the shared ledger, on a real PostgreSQL: reservations through the pool, settles off the
request path, and the allowance that keeps requests served (and the cap kept) while the ledger cannot answer."""

from __future__ import annotations

import asyncio

import psycopg

from coderouterd.cluster.budget import SharedBudget
from coderouterd.guards.budget import Budget
from coderouterd.state.memory import MemoryStore
from coderouterd.state.shared import ledger
from coderouterd.state.shared.db import Database
from coderouterd.state.shared.schema import migrate
from coderouterd.tasks import TaskSet


class Paid:
    paid = True
    monthly_budget_usd = 0.0

    class cost:  # noqa: N801
        input = 0.0
        output = 1.0
        cache_read = 0.0
        cache_write = 0.0


async def _budget(dsn, name="i1", *, cap=10.0, timeout_s=1.0, live=1):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await migrate(c)
    tasks = TaskSet()
    db = Database(dsn, timeout_s=timeout_s, tasks=tasks)
    await db.open()
    await db.run(lambda c: c.execute("SELECT 1"))
    sb = SharedBudget(Budget(MemoryStore()), db, instance=name, lease_s=30, tasks=tasks, live_instances=lambda: live,
                      poll_s=60)
    sb.configure({"paid": Paid}, global_cap_usd=cap, warn_ratio=0.8)
    await sb.start()
    return sb, tasks, db


def _ledger(dsn):
    with psycopg.connect(dsn) as c:
        return {r[0]: r[1:] for r in c.execute("SELECT budget, spent, reserved, cap FROM cr_ledger").fetchall()}


def test_reserve_settle_and_the_allowance(pg_dsn):
    async def go():
        sb, tasks, db = await _budget(pg_dsn, cap=10.0)
        try:
            # A tenth of what is left (one live instance) is held in advance as this instance's allowance.
            assert ledger.to_usd(sb.allowances["paid"].amount) == 1.0
            res = await sb.reserve("paid", 2.0)
            assert res is not None and not res.offline
            record = sb.settle(res, 1.5)
            assert record["rid"] == res.rid and record["actual"] == ledger.to_nano(1.5)
            await sb.drain(5)
            online = _ledger(pg_dsn)["*"]
            await sb.refresh()
            # A request dearer than what is left of the shared cap is told so (not asked to retry).
            assert "more than" in sb.too_dear("paid", 9.0) and sb.too_dear("paid", 1.0) is None
            # The ledger stops answering (down): requests draw on the allowance, up to it and no further.
            db.up = False
            drawn = [await sb.reserve("paid", 0.3) for _ in range(4)]
            assert [r is not None for r in drawn] == [True, True, True, False]
            assert all(r.offline and r.parent == sb.allowances["paid"].rid for r in drawn[:3])
            assert sb._left("paid") == ledger.to_nano(0.1)
            for r in drawn[:3]:
                sb.settle(r, 0.25)
            db.up = True  # back: the queued settles charge the ledger, from the allowance's hold
            await sb.drain(5)
            await sb.refresh()  # the next read re-takes the allowance (0.9 of its 1.0 drawn)
            await sb.drain(5)
            return online, _ledger(pg_dsn)["*"], sb.allowances["paid"].amount
        finally:
            await sb.release_allowances()
            await sb.drain(5)
            await tasks.close()
            await db.close()

    online, after, allowance = asyncio.run(go())
    assert online[0] == ledger.to_nano(1.5)
    assert after[0] == ledger.to_nano(1.5 + 0.75)  # every cent spent blind reached the ledger
    # What is held: only an allowance (the spent one, 0.9 of 1.0 drawn, was given back and a new one taken).
    assert after[1] == allowance
    assert after[0] + after[1] <= after[2]
    final = _ledger(pg_dsn)["*"]
    assert final[1] == 0  # a clean stop gives the allowance back


def test_instances_cut_off_together_cannot_overshoot(pg_dsn):
    """Three instances lose the ledger at once and spend blind: each within its allowance, which the ledger
    holds, so the cap stands."""
    async def go():
        insts = [await _budget(pg_dsn, f"i{k}", cap=3.0, live=3) for k in range(3)]
        try:
            served = 0
            for _sb, _, db in insts:
                db.up = False
            for _ in range(100):
                for sb, _, _ in insts:
                    r = await sb.reserve("paid", 0.01)
                    if r is not None:
                        sb.settle(r, 0.01)
                        served += 1
            for sb, _, db in insts:
                db.up = True
                await sb.drain(5)
            return served
        finally:
            for sb, tasks, db in insts:
                await sb.release_allowances()
                await sb.drain(5)
                await tasks.close()
                await db.close()

    served = asyncio.run(go())
    spent, reserved, cap = _ledger(pg_dsn)["*"]
    assert served > 0 and spent == served * ledger.to_nano(0.01)
    assert spent <= cap and reserved == 0


def test_a_stop_waits_for_an_allowance_being_taken_and_gives_it_back(pg_dsn):
    """A refresh re-taking the allowance is waiting on the ledger when the daemon stops: the stop (give the
    allowances back, then drain the settles) waits for it, so what it took is given back too, not left held
    until its lease runs out."""
    async def go():
        sb, tasks, db = await _budget(pg_dsn, cap=10.0)
        entered, gate = asyncio.Event(), asyncio.Event()
        run = db.run

        async def held_reserve(fn):
            if getattr(fn, "func", None) == sb._reserve_row:
                entered.set()
                await gate.wait()
            return await run(fn)

        try:
            sb._drawn["paid"] = sb.allowances["paid"].amount  # all drawn: the next refresh re-takes it
            db.run = held_reserve
            refresh = asyncio.create_task(sb.refresh())
            await asyncio.wait_for(entered.wait(), 10)

            async def stop():
                await sb.release_allowances()
                return await sb.drain(5)

            stopping = asyncio.create_task(stop())
            await asyncio.sleep(0.3)
            waited = not stopping.done()
            gate.set()
            drained = await stopping
            await refresh
            return waited, drained
        finally:
            gate.set()
            await tasks.close()
            await db.close()

    waited, drained = asyncio.run(go())
    assert waited and drained
    assert _ledger(pg_dsn)["*"][1] == 0  # nothing held after a clean stop
