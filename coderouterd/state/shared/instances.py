"""Instances know each other: a heartbeat row each, which also renews the leases of the holds this instance still
has a use for (by id) and reclaims the leases that ran out (peers that stopped renewing, holds nobody tracks). The
heartbeat is also how a database that went
down is noticed to be back (the request path does not try it while it is down)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from . import ledger
from .db import Database, Unavailable

if TYPE_CHECKING:
    from .db import Conn

log = logging.getLogger("coderouterd.shared")

# A peer that missed this many beats is gone (for `corectl status` and the offline share's divisor).
MISSED_BEATS = 3


async def beat(conn: Conn, *, instance: str, pid: int, version: str, info: dict) -> None:
    await conn.execute(
        "INSERT INTO cr_instance (instance, host, pid, version, info) VALUES (%s, %s, %s, %s, %s)"
        " ON CONFLICT (instance) DO UPDATE SET host = EXCLUDED.host, pid = EXCLUDED.pid,"
        " version = EXCLUDED.version, info = EXCLUDED.info, beat_at = now(),"
        " started_at = CASE WHEN cr_instance.pid = EXCLUDED.pid THEN cr_instance.started_at ELSE now() END",
        (instance, socket.gethostname(), pid, version, orjson.dumps(info).decode()))


async def live(conn: Conn, *, within_s: float) -> list[dict]:
    cur = await conn.execute(
        "SELECT instance, host, pid, version, extract(epoch FROM started_at), extract(epoch FROM beat_at),"
        " extract(epoch FROM now() - beat_at), info FROM cr_instance"
        " WHERE beat_at > now() - make_interval(secs => %s) ORDER BY instance", (float(within_s),))
    return [{"instance": r[0], "host": r[1], "pid": r[2], "version": r[3], "started_at": float(r[4]),
             "beat_at": float(r[5]), "beat_age_s": round(float(r[6]), 3), **(r[7] or {})}
            for r in await cur.fetchall()]


class Instances:
    def __init__(self, db: Database, *, instance: str, heartbeat_s: float, lease_s: float, version: str,
                 info: Callable[[], dict] | None = None, boot: str = "") -> None:
        self.db = db
        self.instance = instance
        self.prefix = f"{instance}:{boot}:"  # this process's reservation ids (SharedBudget makes them so)
        # The ids of the holds to renew (SharedBudget.held_ids), set once the budget exists; none before.
        self.held: Callable[[], list[str]] = list
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.version = version
        self._info = info or dict
        self.peers: list[dict] = []
        self.last_beat: float | None = None
        self.reclaimed = 0

    def live_count(self) -> int:
        return max(len(self.peers), 1)

    async def beat_once(self) -> None:
        within = self.heartbeat_s * MISSED_BEATS
        info = self._info()
        ids = self.held()

        async def work(conn: Conn) -> tuple[int, list[dict[str, Any]]]:
            await beat(conn, instance=self.instance, pid=os.getpid(), version=self.version, info=info)
            await ledger.renew(conn, instance=self.instance, ids=ids, lease_s=self.lease_s)
            n = await ledger.reclaim(conn)
            return n, await live(conn, within_s=within)

        n, peers = await self.db.run(work, timeout_s=max(self.heartbeat_s, 1.0))
        if n:
            self.reclaimed += n
            log.warning("shared budget: reclaimed %d reservation(s) whose instance stopped renewing them", n)
        self.peers = peers
        self.last_beat = time.time()

    async def run(self) -> None:
        while True:
            try:
                await self.beat_once()
            except Unavailable:
                pass  # db.run logged the transition; the next beat tries again
            await asyncio.sleep(self.heartbeat_s)

    async def leave(self) -> None:
        """A clean stop: gone from the live list at once, not after three missed beats."""
        try:
            await self.db.run(lambda c: c.execute("UPDATE cr_instance SET beat_at = 'epoch' WHERE instance = %s",
                                                  (self.instance,)), timeout_s=1.0)
        except Unavailable:
            pass
