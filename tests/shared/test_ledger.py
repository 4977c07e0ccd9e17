"""The shared budget ledger on a real PostgreSQL: migrations once under the lock, guarded reservations that
cannot overspend under concurrency, settle exactly once, leases reclaimed by a peer."""

from __future__ import annotations

import asyncio
import time

import psycopg

from coderouterd.state.shared import ledger
from coderouterd.state.shared.schema import LATEST, migrate

USD = ledger.NANO


def run(coro):
    return asyncio.run(coro)


async def _conn(dsn):
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


async def _migrated(dsn):
    async with await _conn(dsn) as c:
        await migrate(c)


async def _row(dsn, budget, period="2026-12"):
    async with await _conn(dsn) as c:
        return (await ledger.rows(c, period)).get(budget)


def test_concurrent_starts_migrate_once(pg_dsn):
    async def go():
        conns = [await _conn(pg_dsn) for _ in range(6)]
        try:
            results = await asyncio.gather(*(migrate(c) for c in conns))
        finally:
            for c in conns:
                await c.close()
        return results

    results = run(go())
    # Exactly one start found an empty database; the others waited on the lock and found it done.
    assert sorted(found for found, _ in results) == [0] + [LATEST] * 5
    assert all(now == LATEST for _, now in results)
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT count(*) FROM cr_schema").fetchone()[0] == LATEST


def test_a_newer_schema_is_refused(pg_dsn):
    run(_migrated(pg_dsn))
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("INSERT INTO cr_schema (version) VALUES (%s)", (LATEST + 1,))

    async def go():
        async with await _conn(pg_dsn) as c:
            await migrate(c)

    import pytest

    from coderouterd.state.shared.schema import SchemaTooNew

    with pytest.raises(SchemaTooNew):
        run(go())


def test_concurrent_reservations_never_exceed_the_cap(pg_dsn):
    """64 reservations of $0.37 at once, over 16 connections, against a $10 cap: exactly 27 fit, never 28."""
    run(_migrated(pg_dsn))
    amount = ledger.to_nano(0.37)
    cap = 10 * USD

    async def go():
        conns = [await _conn(pg_dsn) for _ in range(16)]
        locks = [asyncio.Lock() for _ in conns]

        async def one(i):
            async with locks[i % 16]:
                return await ledger.reserve(conns[i % 16], rid=f"r{i}", instance=f"i{i % 4}", period="2026-12",
                                            budgets=[("claude", 0), ("*", cap)], amount=amount, lease_s=30)

        try:
            return await asyncio.gather(*(one(i) for i in range(64)))
        finally:
            for c in conns:
                await c.close()

    refused = run(go())
    granted = sum(r is None for r in refused)
    assert granted == 27  # 27 * 0.37 = 9.99
    assert set(r for r in refused if r is not None) == {"*"}
    g = run(_row(pg_dsn, "*"))
    assert g.reserved == 27 * amount <= cap and g.spent == 0
    # The provider's row was not left holding the refused reservations' amounts.
    assert run(_row(pg_dsn, "claude")).reserved == 27 * amount


def test_settle_moves_the_hold_to_spent_once(pg_dsn):
    run(_migrated(pg_dsn))

    async def go():
        async with await _conn(pg_dsn) as c:
            b = [("*", 5 * USD), ("claude", 2 * USD)]
            assert await ledger.reserve(c, rid="a", instance="i1", period="2026-12", budgets=b,
                                        amount=USD, lease_s=30) is None
            assert await ledger.settle(c, rid="a", instance="i1", period="2026-12", budgets=b,
                                       actual=ledger.to_nano(0.25)) is True
            # A retried settle (its answer lost) charges nothing more.
            assert await ledger.settle(c, rid="a", instance="i1", period="2026-12", budgets=b,
                                       actual=ledger.to_nano(0.25)) is False
            rows = await ledger.rows(c, "2026-12")
            # The provider's own cap refuses what the global one would still take.
            refused = await ledger.reserve(c, rid="b", instance="i1", period="2026-12", budgets=b,
                                           amount=2 * USD, lease_s=30)
            return rows, refused, await ledger.rows(c, "2026-12")

    rows, refused, after = run(go())
    for name in ("*", "claude"):
        assert rows[name].spent == ledger.to_nano(0.25) and rows[name].reserved == 0
    assert refused == "claude"
    assert after["*"].reserved == 0  # the global hold taken before the refusal was undone


def test_a_period_is_its_own_row(pg_dsn):
    """A new month starts from zero by its key: nothing resets the old one, nothing can erase the new one."""
    run(_migrated(pg_dsn))

    async def go():
        async with await _conn(pg_dsn) as c:
            b = [("*", 1 * USD)]
            assert await ledger.reserve(c, rid="n1", instance="i", period="2026-11", budgets=b, amount=USD,
                                        lease_s=30) is None
            await ledger.settle(c, rid="n1", instance="i", period="2026-11", budgets=b, actual=USD)
            nov_full = await ledger.reserve(c, rid="n2", instance="i", period="2026-11", budgets=b, amount=1,
                                            lease_s=30)
            dec = await ledger.reserve(c, rid="d1", instance="i", period="2026-12", budgets=b, amount=USD,
                                       lease_s=30)
            return nov_full, dec

    assert run(go()) == ("*", None)


def test_expired_leases_are_reclaimed_by_any_peer(pg_dsn):
    run(_migrated(pg_dsn))
    b = [("*", 10 * USD)]

    async def go():
        async with await _conn(pg_dsn) as dead, await _conn(pg_dsn) as peer:
            # "dead" holds two reservations with a 1 s lease and never renews them (kill -9).
            for rid in ("x1", "x2"):
                assert await ledger.reserve(dead, rid=rid, instance="dead", period="2026-12", budgets=b,
                                            amount=3 * USD, lease_s=1) is None
            # A live instance renews its own, so it survives the same wait.
            assert await ledger.reserve(peer, rid="p1", instance="peer", period="2026-12", budgets=b,
                                        amount=USD, lease_s=1) is None
            assert await ledger.reclaim(peer) == 0  # not yet
            # The dead leases' lapse is waited for (a 30 s ceiling), not slept through; the peer renews just
            # before each reclaim, one call apart against its 1 s lease (100x+ a loaded call).
            deadline = time.monotonic() + 30
            n = 0
            while n < 2:
                assert time.monotonic() < deadline, f"reclaimed {n} of 2"
                await asyncio.sleep(0.2)
                await ledger.renew(peer, instance="peer", prefix="p", lease_s=1)
                n += await ledger.reclaim(peer)
            held = (await ledger.rows(peer, "2026-12"))["*"].reserved
            # The dead instance's request finished after all (its settle arrives late): the cost is charged,
            # the hold is not removed twice.
            await ledger.settle(peer, rid="x1", instance="dead", period="2026-12", budgets=b, actual=USD // 2)
            return n, held, (await ledger.rows(peer, "2026-12"))["*"]

    n, held, row = run(go())
    assert n == 2
    assert held == USD  # only the live instance's hold is left
    assert row.reserved == USD and row.spent == USD // 2


def test_offline_settle_charges_without_a_hold(pg_dsn):
    """A reservation made while the database was unreachable has no row: its settle charges the cost."""
    run(_migrated(pg_dsn))

    async def go():
        async with await _conn(pg_dsn) as c:
            b = [("*", 10 * USD), ("claude", 0)]
            await ledger.settle(c, rid="off1", instance="i", period="2026-12", budgets=b, actual=2 * USD)
            await ledger.settle(c, rid="off1", instance="i", period="2026-12", budgets=b, actual=2 * USD)
            return await ledger.rows(c, "2026-12")

    rows = run(go())
    assert rows["*"].spent == 2 * USD and rows["*"].reserved == 0 and rows["*"].cap == 10 * USD
    assert rows["claude"].spent == 2 * USD


def test_a_reload_cannot_move_the_shared_state():
    """Where state is shared is fixed at start: a reload that changes it is refused (the old config stays)."""
    from coderouterd.config.schema import StateConfig
    from coderouterd.reload import shared_state_change_refused

    old = StateConfig(backend="postgres", dsn_env="A")
    assert shared_state_change_refused(old, StateConfig(backend="postgres", dsn_env="A", poll_s=5)) is None
    why = shared_state_change_refused(old, StateConfig(backend="postgres", dsn_env="B"))
    assert "state.dsn_env" in why and "restart" in why
    assert "state.backend" in shared_state_change_refused(old, StateConfig())


def test_the_password_is_never_shown():
    from coderouterd.state.shared.dsn import redact

    assert redact("postgresql://bob:s3cret@db.example:5432/cr") == "postgresql://bob:***@db.example:5432/cr"
    assert "s3cret" not in redact("postgresql://db/cr?user=bob&password=s3cret&sslmode=require")
    assert redact("host=db user=bob password='s 3cret' dbname=cr") == "host=db user=bob password=*** dbname=cr"
    assert redact("postgresql://bob@/cr?host=/tmp") == "postgresql://bob@/cr?host=/tmp"


def test_a_shared_backend_that_cannot_start_is_refused_at_start(tmp_path):
    """An unset dsn_env variable is a configuration error (exit 2, named), not a database that is down."""
    import os
    import subprocess
    import sys

    from tests.support.daemon import ROOT

    cfg = tmp_path / "c.toml"
    cfg.write_text('[state]\nbackend = "postgres"\ndsn_env = "CR_NOT_SET_ANYWHERE"\n\n'
                   '[providers.p]\nkind = "openai"\nbase_url = "http://127.0.0.1:9/v1"\n\n'
                   '[profiles.default]\nproviders = ["p"]\n')
    env = {k: v for k, v in os.environ.items() if k != "CR_NOT_SET_ANYWHERE"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(cfg), "--check"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "CR_NOT_SET_ANYWHERE is not set" in r.stderr
