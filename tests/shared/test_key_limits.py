"""Team keys' limits across three instances on a real PostgreSQL (issue 41): a key's rpm, tpm and concurrency
belong to the key, not to the instance; a key's monthly budget holds with 0 overspend however the requests are
spread; and with the database unreachable each instance spends only what it holds in advance, so no number of
instances cut off at once can exceed a key's limits."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from coderouterd.cluster import key_limits as shared_limits
from coderouterd.cluster.budget import SharedBudget
from coderouterd.cluster.key_limits import SharedKeyLimits
from coderouterd.guards.budget import Budget
from coderouterd.keys.limits import Admission, Refusal
from coderouterd.keys.model import TeamKey
from coderouterd.state.memory import MemoryStore
from coderouterd.state.shared import ledger
from coderouterd.state.shared.db import Database
from coderouterd.state.shared.schema import migrate
from coderouterd.tasks import TaskSet


@pytest.fixture(autouse=True)
def long_window(monkeypatch):
    """The database counts a key's window over SPAN_S; an hour here, so that however slow the machine, every
    request of a test falls in one window and the count it asserts cannot depend on the clock."""
    monkeypatch.setattr(shared_limits, "SPAN_S", 3600.0)


class Paid:
    paid = True
    monthly_budget_usd = 0.0

    class cost:  # noqa: N801
        input = 0.0
        output = 1.0
        cache_read = 0.0
        cache_write = 0.0


async def _instance(dsn, name, *, live=3):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await migrate(c)
    tasks = TaskSet()
    db = Database(dsn, timeout_s=1.0, tasks=tasks)
    await db.open()
    await db.run(lambda c: c.execute("SELECT 1"))
    limits = SharedKeyLimits(db, instance=name, lease_s=30, tasks=tasks, live_instances=lambda: live)
    sb = SharedBudget(Budget(MemoryStore()), db, instance=name, lease_s=30, tasks=tasks,
                      live_instances=lambda: live, poll_s=60)
    sb.configure({"paid": Paid}, global_cap_usd=100.0, warn_ratio=0.8)
    await sb.start()
    return limits, sb, tasks, db


async def _close(insts):
    for limits, sb, tasks, db in insts:
        if db.up:
            await limits.stop()
        await sb.release_allowances()
        await sb.drain(5)
        await tasks.close()
        await db.close()


def _rows(dsn):
    with psycopg.connect(dsn) as c:
        return {r[0]: r[1:] for r in c.execute("SELECT budget, spent, reserved, cap FROM cr_ledger").fetchall()}


def test_rpm_belongs_to_the_key_across_three_instances(pg_dsn):
    key = TeamKey("alice", "crk_x", rpm=30)
    other = TeamKey("bob", "crk_y", rpm=5)

    async def go():
        insts = [await _instance(pg_dsn, f"i{k}") for k in range(3)]
        try:
            served = {"alice": 0, "bob": 0}
            refusals = []
            for i in range(120):  # round robin, as a load balancer would spread one client's requests
                limits = insts[i % 3][0]
                for k in (key, other):
                    got = await limits.admit(k, 10)
                    if isinstance(got, Admission):
                        served[k.name] += 1
                        limits.release(got, 10)
                    else:
                        refusals.append(got)
            asked = sum(limits.asked for limits, *_ in insts)
            return served, refusals, asked
        finally:
            await _close(insts)

    served, refusals, asked = asyncio.run(go())
    assert served == {"alice": 30, "bob": 5}  # at most N in the window (here: exactly, nothing wasted)
    assert all(r.limit == "rpm" and r.retry_after_s >= 1 and "across all instances" in r.message
               for r in refusals if r.key == "alice" and "across" in r.message)
    # Chunks taken ahead: alice's 30 requests did not each wait for the database.
    assert asked < 30 + 5 + len(refusals)


def test_concurrency_and_tpm_across_instances(pg_dsn):
    busy = TeamKey("carol", "crk_z", concurrency=4)
    tokens = TeamKey("dave", "crk_w", tpm=1000)

    async def go():
        insts = [await _instance(pg_dsn, f"i{k}") for k in range(3)]
        try:
            held = []
            for i in range(9):
                got = await insts[i % 3][0].admit(busy, 1)
                if isinstance(got, Admission):
                    held.append((insts[i % 3][0], got))
            in_flight = len(held)
            limits, adm = held[0]
            limits.release(adm, None)
            asked = limits.asked
            again = await limits.admit(busy, 1)  # the slot this instance holds is reused without a round trip
            reused = isinstance(again, Admission) and limits.asked == asked
            # tpm: 300-token requests on every instance; settled with real counts (100 each).
            admitted = 0
            for i in range(12):
                got = await insts[i % 3][0].admit(tokens, 300)
                if isinstance(got, Admission):
                    admitted += 1
                    insts[i % 3][0].release(got, 100)
            return in_flight, reused, admitted
        finally:
            await _close(insts)

    in_flight, reused, admitted = asyncio.run(go())
    assert in_flight == 4
    assert reused
    # 1000 tokens in the window: granted in chunks of at least 300, the unused rest of a chunk goes back only when
    # its life is over, so fewer than 1000/100 fit, and never more than 1000/300 + the settled corrections allow.
    assert 3 <= admitted <= 10


def test_a_key_budget_holds_across_three_instances_with_zero_overspend(pg_dsn):
    async def go():
        insts = [await _instance(pg_dsn, f"i{k}") for k in range(3)]
        try:
            async def one(i):
                sb = insts[i % 3][1]
                res = await sb.reserve("paid", 0.03, key="erin", key_cap=1.0)
                if res is None:
                    return 0
                await asyncio.sleep(0)
                sb.settle(res, 0.03)
                return 1

            served = sum(await asyncio.gather(*(one(i) for i in range(90))))
            for _, sb, _, _ in insts:
                await sb.drain(5)
            for _, sb, _, _ in insts:  # once every settle has landed
                await sb.refresh()
            # A request dearer than what is left of the key's budget is told so, naming the key, cap and spend.
            why = insts[0][1].too_dear("paid", 0.2, key="erin", key_cap=1.0)
            # A key whose budget is 0 may use free providers only: refused without asking the ledger.
            zero = await insts[1][1].reserve("paid", 0.01, key="intern", key_cap=0.0)
            zero_why = insts[1][1].too_dear("paid", 0.01, key="intern", key_cap=0.0)
            return served, why, zero, zero_why
        finally:
            await _close(insts)

    served, why, zero, zero_why = asyncio.run(go())
    spent, reserved, cap = _rows(pg_dsn)["key:erin"]
    assert cap == ledger.to_nano(1.0)
    assert spent == served * ledger.to_nano(0.03) <= cap  # 0 overspend
    assert served >= 30  # and the cap is used (33 fit; allowances hold a little back)
    assert why is not None and "team key 'erin'" in why and f"{spent / 1e9:.2f} of 1.00 USD" in why
    assert zero is None and "free providers only" in zero_why
    # The key's spend counted toward the global budget too.
    assert _rows(pg_dsn)["*"][0] == spent


def test_database_unreachable_each_instance_spends_only_what_it_holds(pg_dsn):
    """The database stops answering all three instances at once: a key's budget is drawn from the key's
    allowances and its rpm from the chunks in hand; together they stay within the key's limits, and the spend
    reaches the ledger when it is back."""
    key = TeamKey("frank", "crk_v", rpm=48, monthly_usd=0.9)

    async def go():
        insts = [await _instance(pg_dsn, f"i{k}") for k in range(3)]
        try:
            for limits, sb, _, _ in insts:  # online first: each has seen the key (chunks, allowances)
                got = await limits.admit(key, 1)
                assert isinstance(got, Admission)
                limits.release(got, 1)
                res = await sb.reserve("paid", 0.01, key="frank", key_cap=0.9)
                assert res is not None
                sb.settle(res, 0.01)
                await sb.drain(5)
            for _, sb, _, _ in insts:
                await sb.refresh()  # tends the key's allowance
            for _, _, _, db in insts:
                db.up = False
            served_rpm, spent_blind, offline_refusals = 0, 0, []
            for _ in range(40):
                for limits, sb, _, _ in insts:
                    got = await limits.admit(key, 1)
                    if isinstance(got, Admission):
                        served_rpm += 1
                    else:
                        offline_refusals.append(got)
                    res = await sb.reserve("paid", 0.01, key="frank", key_cap=0.9)
                    if res is not None:
                        assert res.offline and res.key_parent
                        sb.settle(res, 0.01)
                        spent_blind += 1
            for _, _, _, db in insts:
                db.up = True
            for _, sb, _, _ in insts:
                await sb.drain(5)
            return served_rpm, spent_blind, offline_refusals
        finally:
            await _close(insts)

    served_rpm, spent_blind, refusals = asyncio.run(go())
    # Chunks of 48 / (3 instances × 4) = 4: each instance used one online and may use its other 3 blind (while the
    # chunk lives), never more: the key's rpm holds with all three cut off.
    assert served_rpm <= 3 * 3
    assert refusals and all(isinstance(r, Refusal) for r in refusals)
    assert any("cannot be asked now" in r.message for r in refusals)
    spent, reserved, cap = _rows(pg_dsn)["key:frank"]
    assert spent_blind > 0  # the allowances served while the database was away
    assert spent == (3 + spent_blind) * ledger.to_nano(0.01) <= cap
    assert reserved == 0  # every allowance given back at the stop


def test_an_offline_key_settle_in_the_journal_reaches_the_ledger_once(pg_dsn):
    """An offline request of a key settles in two parts (its provider's, its key's); the journal row keeps both
    (`more`), and the shipper applying the row again changes nothing."""
    async def go():
        insts = [await _instance(pg_dsn, "solo", live=1)]
        limits, sb, tasks, db = insts[0]
        try:
            res = await sb.reserve("paid", 0.01, key="gail", key_cap=5.0)  # the key is seen: its allowance
            sb.settle(res, 0.01)
            await sb.drain(5)
            await sb.refresh()
            db.up = False
            blind = await sb.reserve("paid", 0.02, key="gail", key_cap=5.0)
            assert blind is not None and blind.offline and blind.parent and blind.key_parent
            record = sb.settle(blind, 0.02)
            db.up = True
            await sb.drain(5)
            async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as c:
                await ledger.apply_many(c, "solo", [record])  # the shipper's backstop: a no-op now
            return record
        finally:
            await _close(insts)

    record = asyncio.run(go())
    assert [b for b, _ in record["budgets"]] == ["*", "paid"]
    assert [b for b, _ in record["more"][0]["budgets"]] == ["key:gail"]
    rows = _rows(pg_dsn)
    assert rows["key:gail"][0] == ledger.to_nano(0.03)  # 0.01 online + 0.02 blind, each once
    assert rows["*"][0] == ledger.to_nano(0.03)
    assert rows["key:gail"][1] == 0 and rows["*"][1] == 0  # every hold given back at the stop
