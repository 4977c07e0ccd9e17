"""Issue 41 on the shared ledger (a real PostgreSQL): no reservation outlives its request, for every way a request
ends; a hold nobody tracks is not renewed (it runs out with its lease and is reclaimed); an allowance never
refuses a request that fits."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from coderouterd.cluster.budget import SharedBudget
from coderouterd.guards.budget import Budget
from coderouterd.state.memory import MemoryStore
from coderouterd.state.shared import ledger
from coderouterd.state.shared.db import Database
from coderouterd.state.shared.instances import Instances
from coderouterd.state.shared.schema import migrate
from coderouterd.tasks import TaskSet
from tests.support.reservations import ENDINGS, end_request, providers_cfg
from tests.support.wait import wait_for


async def _shared(dsn, providers, *, cap=10.0, lease_s=30.0, name="i1"):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await migrate(c)
    tasks = TaskSet()
    db = Database(dsn, timeout_s=2.0, tasks=tasks)
    await db.open()
    await db.run(lambda c: c.execute("SELECT 1"))
    sb = SharedBudget(Budget(MemoryStore()), db, instance=name, lease_s=lease_s, tasks=tasks,
                      live_instances=lambda: 1, poll_s=60)
    sb.configure(providers, global_cap_usd=cap, warn_ratio=0.8)
    await sb.start()
    return sb, tasks, db


async def _close(sb, tasks, db):
    await sb.release_allowances()
    await sb.drain(10)
    await tasks.close()
    await db.close()


def _open_rows(dsn) -> set[str]:
    with psycopg.connect(dsn) as c:
        return {r[0] for r in c.execute("SELECT id FROM cr_reservation WHERE settled_at IS NULL"
                                        " AND reclaimed_at IS NULL").fetchall()}


@pytest.mark.parametrize("name", sorted(ENDINGS))
def test_no_reservation_outlives_its_request(pg_dsn, name):
    chain, extra, _ = ENDINGS[name]

    async def go():
        sb, tasks, db = await _shared(pg_dsn, providers_cfg(chain, extra))
        try:
            ex, _sink = await end_request(name, sb)
            in_flight = sb.in_flight()
            assert await sb.drain(10)
            allowances = {a.rid for a in sb.allowances.values()}
            return ex, in_flight, allowances, set(sb.held)
        finally:
            await _close(sb, tasks, db)

    ex, in_flight, allowances, held = asyncio.run(go())
    assert in_flight == [], name
    # Once the settles are in, the ledger holds the instance's allowances and nothing else; after the stop, nothing.
    assert held == allowances
    assert _open_rows(pg_dsn) == set()
    with psycopg.connect(pg_dsn) as c:
        reserved = dict(c.execute("SELECT budget, reserved FROM cr_ledger").fetchall())
        spent = dict(c.execute("SELECT budget, spent FROM cr_ledger").fetchall())
    assert set(reserved.values()) <= {0}, reserved
    if name in ("served", "served_stream", "skipped", "failed_over", "race_served", "race_same_tick", "client_gone",
                "broke_mid_stream", "garbled_usage"):
        assert spent["*"] > 0, spent  # settled with its cost
    if name == "client_gone":
        assert ex.record.usage_estimated and ex.record.answered_by == "a"
        assert ex.record.settles and ex.record.settles[0]["actual"] > 0


def test_a_hold_nobody_tracks_is_not_renewed_and_is_reclaimed(pg_dsn):
    """Before issue 41 the heartbeat renewed every open row under this process's id prefix: a hold its process
    lost track of was kept for the life of the process. Now only the ids the budget still holds are renewed."""
    chain, extra, _ = ENDINGS["served"]

    async def go():
        sb, tasks, db = await _shared(pg_dsn, providers_cfg(chain, extra), lease_s=1.0)
        inst = Instances(db, instance="i1", heartbeat_s=0.2, lease_s=1.0, version="t", boot=sb._boot)
        inst.held = sb.held_ids
        try:
            tracked = await sb.reserve("a", 0.01)
            assert tracked is not None
            orphan = f"i1:{sb._boot}:orphan"  # this process's id, but nobody here knows of it
            period, _ = sb.local.period()
            assert await db.run(lambda c: ledger.reserve(c, rid=orphan, instance="i1", period=period,
                                                         budgets=sb._keys("a"), amount=ledger.to_nano(0.5),
                                                         lease_s=1.0)) is None

            async def beat_until_reclaimed() -> None:
                for _ in range(150):
                    await inst.beat_once()
                    if orphan not in _open_rows(pg_dsn):
                        return
                    await asyncio.sleep(0.1)

            await beat_until_reclaimed()
            still_open = _open_rows(pg_dsn)
            sb.settle(tracked, 0.001)
            await sb.drain(10)
            return orphan, tracked.rid, still_open
        finally:
            await _close(sb, tasks, db)

    orphan, tracked, still_open = asyncio.run(go())
    assert orphan not in still_open  # ran out with its lease, reclaimed by the heartbeat's reclaim
    assert tracked in still_open  # the request's own hold, renewed all along
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT reclaimed_at IS NOT NULL FROM cr_reservation WHERE id = %s",
                         (orphan,)).fetchone()[0]


def test_an_allowance_never_refuses_a_request_that_fits(pg_dsn):
    """Cap $1, nothing spent: the instance's allowance holds a tenth of it. A request estimated at $0.95 fits the
    cap; it used to be refused because the allowance's own hold counted against it."""
    chain, extra, _ = ENDINGS["served"]

    async def go():
        sb, tasks, db = await _shared(pg_dsn, providers_cfg(chain, extra), cap=1.0)
        try:
            assert ledger.to_usd(sb.allowances["a"].amount) == pytest.approx(0.1)
            res = await sb.reserve("a", 0.95)
            assert res is not None and not res.offline
            too_much = await sb.reserve("a", 0.1)  # what is left is 0.05: refused, allowance or not
            sb.settle(res, 0.9)
            await sb.drain(10)
            await sb.refresh()
            await sb.drain(10)
            return too_much, {a.rid for a in sb.allowances.values()}
        finally:
            await _close(sb, tasks, db)

    too_much, _ = asyncio.run(go())
    assert too_much is None
    with psycopg.connect(pg_dsn) as c:
        spent, reserved, cap = c.execute("SELECT spent, reserved, cap FROM cr_ledger WHERE budget = '*'").fetchone()
    assert spent == ledger.to_nano(0.9) and reserved == 0 and cap == ledger.to_nano(1.0)
    assert wait_for(lambda: _open_rows(pg_dsn) == set(), 5)


DAEMON = """
[server]
port = {PORT}

[state]
backend = "postgres"
dsn_env = "CR_TEST_DSN"
instance = "solo"
heartbeat_s = 0.5
ship_interval_s = 0.2
shared_timeout_ms = 500

[budget]
global_monthly_usd = 50.0

[providers.paid]
kind = "openai"
base_url = "@URL@/v1"
model = "m"
paid = true
cost = { input = 3.0, output = 15.0 }
monthly_budget_usd = 20.0

[profiles.default]
providers = ["paid"]
"""


def test_a_client_gone_mid_stream_on_shared_state(tmp_path, pg_dsn):
    """The daemon on PostgreSQL: a client leaves a slow paid stream. The shipped journal row names the provider
    with the estimated tokens (marked), the ledger charged them, and the only open hold left is the allowance."""
    import openai

    from tests.fakes.runner import FakeServer
    from tests.support.daemon import DaemonProcess

    with FakeServer("openai", name="paid", models=["m"], behaviour="slow_stream;n=400;delay=0.02") as up:
        d = DaemonProcess(DAEMON.replace("@URL@", up.url), tmp_path / "solo", env={"CR_TEST_DSN": pg_dsn}).start()
        try:
            client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0)
            stream = client.chat.completions.create(model="m", max_tokens=4000, stream=True,
                                                    messages=[{"role": "user", "content": "write at length"}])
            request_id = stream.response.headers["x-request-id"]
            seen = 0
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    seen += 1
                    if seen >= 20:
                        break
            stream.close()

            def shipped():
                with psycopg.connect(pg_dsn) as c:
                    return c.execute("SELECT provider, input_tokens, output_tokens, usage_estimated, cost_usd,"
                                     " error_class FROM cr_journal WHERE request_id = %s", (request_id,)).fetchone()

            assert wait_for(lambda: shipped() is not None, 30)
            provider, tin, tout, estimated, cost, error_class = shipped()
            assert (provider, estimated, error_class) == ("paid", 1, "client_disconnected")
            assert tin > 0 and 20 <= tout < 800 and cost > 0

            def charged():
                with psycopg.connect(pg_dsn) as c:
                    return dict(c.execute("SELECT budget, spent FROM cr_ledger").fetchall())

            assert wait_for(lambda: charged().get("paid", 0) == ledger.to_nano(cost), 30), (charged(), cost)
            assert charged()["*"] == charged()["paid"]
            # What is still open in the ledger is this instance's allowance (its id says so), no request's hold.
            assert wait_for(lambda: all(rid.rsplit(":", 1)[-1].startswith("a") for rid in _open_rows(pg_dsn)), 10), \
                _open_rows(pg_dsn)
        finally:
            d.stop()
    assert wait_for(lambda: _open_rows(pg_dsn) == set(), 10)  # a clean stop gives the allowance back
