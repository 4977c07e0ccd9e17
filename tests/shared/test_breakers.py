"""Shared breakers on a real PostgreSQL, two instances in one process (each with its own routing state and
connections): a breaker opened on one is seen by the other through NOTIFY, and through the poll when the LISTEN
connection is cut; only one instance holds the half-open trial."""

from __future__ import annotations

import asyncio
import time

import psycopg

from coderouterd.cluster.breakers import SharedBreakers
from coderouterd.config.loader import parse_config_text
from coderouterd.routing.state import RoutingState
from coderouterd.state.shared.db import Database
from coderouterd.state.shared.schema import migrate
from coderouterd.tasks import TaskSet
from coderouterd.upstream.breaker import BreakerState

TOML = """
[breaker]
failures = 2
recovery_s = 0.6

[providers.up]
kind = "openai"
base_url = "http://127.0.0.1:9/v1"

[profiles.default]
providers = ["up"]
"""


class Instance:
    def __init__(self, dsn: str, name: str, *, poll_s: float = 0.3) -> None:
        self.tasks = TaskSet()
        self.routing = RoutingState(parse_config_text(TOML, "test"))
        self.db = Database(dsn, timeout_s=0.05, tasks=self.tasks)
        self.shared = SharedBreakers(self.db, self.routing, instance=name, poll_s=poll_s, lease_s=5,
                                     tasks=self.tasks)

    async def start(self) -> Instance:
        await self.db.open()
        await self.db.run(lambda c: c.execute("SELECT 1"))
        await self.shared.start()
        return self

    async def stop(self) -> None:
        await self.shared.stop()
        await self.tasks.close()
        await self.db.close()

    def breaker(self):
        return self.routing.breakers.get("up")

    def fail(self, n: int) -> None:
        for _ in range(n):
            self.breaker().record_failure(reason="test")


# Every wait here has this ceiling: it only turns a hang into a failure (what is waited for takes milliseconds
# idle). Which path carried a change is set by the intervals (a poll far away), never by timing the wait.
CEILING_S = 30.0


async def _until(pred, timeout: float = CEILING_S) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.005)


async def _migrated(dsn):
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as c:
        await migrate(c)


def test_an_open_breaker_reaches_the_peer_by_notify_then_by_poll(pg_dsn):
    async def go():
        await _migrated(pg_dsn)
        # The poll is an hour away, 100x beyond the ceiling: only NOTIFY can carry the change in time.
        a = await Instance(pg_dsn, "a", poll_s=3600).start()
        b = await Instance(pg_dsn, "b", poll_s=3600).start()
        try:
            await _until(lambda: a.shared.listening and b.shared.listening)
            a.fail(2)
            assert a.breaker().state is BreakerState.OPEN
            await _until(lambda: b.breaker().state is not BreakerState.CLOSED)
            # Closed again by a's trial after recovery: b follows. After the recovery time one of them holds the
            # probe lease (allow() refuses both until then); its trial succeeds; both close.
            trial: list = []
            await _until(lambda: trial or [trial.append(i) for i in (a, b) if i.breaker().allow()])
            assert len(trial) == 1
            trial[0].breaker().record_success()
            await _until(lambda: a.breaker().state is BreakerState.CLOSED and b.breaker().state is BreakerState.CLOSED)
        finally:
            await a.stop()
            await b.stop()

    asyncio.run(go())


def test_the_poll_is_the_backstop_when_listen_is_cut(pg_dsn):
    async def go():
        await _migrated(pg_dsn)
        a = await Instance(pg_dsn, "a").start()
        b = await Instance(pg_dsn, "b", poll_s=0.3).start()
        try:
            await _until(lambda: b.shared.listening)
            # b's LISTEN connection is cut, and cannot come back: its reconnects are refused while a moves.
            b.db.connect = _refused
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                          " WHERE application_name = 'coderouter-listen-b'")
            await _until(lambda: not b.shared.listening)
            a.fail(2)
            # b has no LISTEN connection (checked below, after the fact): only its poll can bring the change.
            await _until(lambda: b.breaker().state is not BreakerState.CLOSED)
            return b.shared.listening
        finally:
            await a.stop()
            await b.stop()

    assert not asyncio.run(go())


async def _refused():
    raise OSError("refused by the test")


def test_only_one_instance_sends_the_half_open_trial(pg_dsn):
    async def go():
        await _migrated(pg_dsn)
        insts = [await Instance(pg_dsn, n).start() for n in ("a", "b", "c")]
        try:
            insts[0].fail(2)
            await _until(lambda: all(i.breaker().state is not BreakerState.CLOSED for i in insts))
            # Once the recovery time has passed, every instance sees half-open (waited for, not slept through).
            await _until(lambda: all(i.breaker().state is BreakerState.HALF_OPEN for i in insts))
            # Every instance asks, several times, while the leases are settled.
            admitted: set[str] = set()
            for _ in range(40):
                for i in insts:
                    if i.breaker().allow():
                        admitted.add(i.shared.instance)
                await asyncio.sleep(0.01)
            return admitted
        finally:
            for i in insts:
                await i.stop()

    assert len(asyncio.run(go())) == 1


def test_without_the_database_each_breaker_is_local(pg_dsn):
    async def go():
        await _migrated(pg_dsn)
        a = await Instance(pg_dsn, "a").start()
        try:
            a.fail(2)
            await _until(lambda: a.shared.versions.get("up", 0) > 0)
            a.db.up = False  # what the heartbeat concludes when the database stops answering
            # The server is really still up: a heartbeat or poll that succeeds meanwhile would mark it up again
            # (a flake under load). Down stays down for the rest of this test.
            a.db._up = lambda: None  # type: ignore[method-assign]
            await _until(lambda: a.breaker().state is BreakerState.HALF_OPEN)  # the recovery time has passed
            return a.breaker().allow()  # no lease can be had: the local trial goes ahead
        finally:
            await a.stop()

    assert asyncio.run(go()) is True
