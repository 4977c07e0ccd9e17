"""Breakers seen by every instance: one row per provider with a version.

A move made here (open, or closed by a trial) is written compare-and-set on the version this instance last
saw, and announced with NOTIFY in the same statement (delivered at commit). Each instance keeps one LISTEN
connection and applies what peers announce; because a notification sent while that connection was down is
lost for good, every instance also re-reads the rows every `poll_s`.

Only verdicts are shared (open, closed). Half-open is each instance's own view of an open breaker whose
recovery time has passed, and the trial it allows is arbitrated by a probe lease in the row: only the holder
sends it, so a recovering upstream gets one trial, not one per instance. While the database is unreachable
each instance's breakers are its own again (the gate lets the local trial through)."""

from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from ..state.shared.db import Database, Unavailable
from ..upstream.breaker import BreakerSnapshot, BreakerState

if TYPE_CHECKING:
    from ..routing.state import RoutingState
    from ..state.shared.db import Conn
    from ..tasks import TaskSet

log = logging.getLogger("coderouterd.shared")

CHANNEL = "cr_breaker"
_SHARED = (BreakerState.OPEN, BreakerState.CLOSED)

# One statement: the compare-and-set and its announcement commit together or not at all.
_CAS = (
    "WITH u AS (UPDATE cr_breaker SET version = version + 1, state = %(state)s, snapshot = %(snap)s,"
    " instance = %(me)s, updated_at = now(), probe_holder = NULL, probe_until = NULL"
    " WHERE provider = %(p)s AND version = %(v)s RETURNING version)"
    " SELECT version, pg_notify('" + CHANNEL + "', json_build_object('p', %(p)s::text, 'v', version,"
    " 'i', %(me)s::text, 's', %(snap)s::jsonb)::text) FROM u"
)
_INSERT = (
    "WITH u AS (INSERT INTO cr_breaker (provider, version, state, snapshot, instance)"
    " VALUES (%(p)s, 1, %(state)s, %(snap)s, %(me)s) ON CONFLICT DO NOTHING RETURNING version)"
    " SELECT version, pg_notify('" + CHANNEL + "', json_build_object('p', %(p)s::text, 'v', version,"
    " 'i', %(me)s::text, 's', %(snap)s::jsonb)::text) FROM u"
)
_PROBE = (
    "UPDATE cr_breaker SET probe_holder = %(me)s, probe_until = now() + make_interval(secs => %(lease)s)"
    " WHERE provider = %(p)s AND version = %(v)s AND state = 'open'"
    " AND (probe_holder IS NULL OR probe_holder = %(me)s OR probe_until < now())"
    " RETURNING extract(epoch FROM probe_until - now())"
)


class SharedBreakers:
    def __init__(self, db: Database, routing: RoutingState, *, instance: str, poll_s: float, lease_s: float,
                 tasks: TaskSet) -> None:
        self.db = db
        self.routing = routing
        self.instance = instance
        self.poll_s = poll_s
        self.lease_s = lease_s
        self._tasks = tasks
        self.versions: dict[str, int] = {}  # provider -> the row version this instance's breaker reflects
        self._probe_until: dict[str, float] = {}  # provider -> monotonic end of the probe lease we hold
        self._acquiring: set[str] = set()
        self._writes: asyncio.Queue | None = None
        self._listen_conn: Conn | None = None
        self.listening = False
        self.adopted = 0
        self.conflicts = 0
        self.last_poll: float | None = None
        routing.watch_breakers(self._moved)
        routing.set_trial_gate(self._may_probe)

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        writes: asyncio.Queue = asyncio.Queue()
        self._writes = writes
        await self.poll_once()
        self._tasks.spawn(self._write_loop(writes), name="shared-breaker-write")
        self._tasks.spawn(self._listen_loop(), name="shared-breaker-listen")
        self._tasks.spawn(self._poll_loop(), name="shared-breaker-poll")

    async def stop(self) -> None:
        conn = self._listen_conn
        if conn is not None:
            try:
                await conn.close()
            except Exception:
                pass

    def status(self) -> dict:
        return {"listening": self.listening, "last_poll": self.last_poll, "versions": dict(self.versions),
                "adopted": self.adopted, "conflicts": self.conflicts,
                "probe_held": sorted(p for p, t in self._probe_until.items() if t > time.monotonic())}

    # -- moves made here ------------------------------------------------------------------------------------

    def _moved(self, name: str, snapshot: BreakerSnapshot, old: BreakerState, new: BreakerState, reason: str) -> None:
        if new not in _SHARED or self._writes is None:
            return
        self._probe_until.pop(name, None)
        self._writes.put_nowait((name, snapshot, new))

    async def _write_loop(self, q: asyncio.Queue) -> None:
        while True:
            name, snap, state = await q.get()
            try:
                await self.db.run(partial(self._write, name, snap, state))
            except Unavailable:
                pass  # local until the database returns; the poll then brings this instance back in line

    async def _write(self, name: str, snap: BreakerSnapshot, state: BreakerState, conn: Conn) -> None:
        for _attempt in range(3):
            known = self.versions.get(name, 0)
            params = {"p": name, "v": known, "state": state.value, "snap": orjson.dumps(snap).decode(),
                      "me": self.instance}
            cur = await conn.execute(_CAS if known else _INSERT, params)
            row = await cur.fetchone()
            if row is not None:
                self.versions[name] = row[0]
                if state is BreakerState.OPEN:
                    self._schedule_probe(name)
                return
            # Someone moved it first. Their row is newer news, except that failures seen here are evidence:
            # an open decided here is written on top of a peer's closed, anything else takes the peer's row.
            self.conflicts += 1
            cur = await conn.execute("SELECT version, state, snapshot, instance FROM cr_breaker WHERE provider = %s",
                                     (name,))
            current = await cur.fetchone()
            if current is None:
                self.versions[name] = 0
                continue
            version, their_state, their_snap, _who = current
            if state is BreakerState.OPEN and their_state != BreakerState.OPEN.value:
                self.versions[name] = version
                continue
            self._adopt(name, version, their_snap, "a peer decided first")
            return

    # -- moves made elsewhere -------------------------------------------------------------------------------

    def _adopt(self, name: str, version: int, snap: dict, why: str) -> None:
        if version <= self.versions.get(name, 0):
            return
        self.versions[name] = version
        self._probe_until.pop(name, None)
        try:
            state = self.routing.adopt_breaker(name, snap, f"shared: {why}")
            self.adopted += 1
        except ValueError as e:
            log.warning("shared breaker for %s ignored: %s", name, e)
            return
        if state is BreakerState.OPEN:
            self._schedule_probe(name)

    async def _listen_loop(self) -> None:
        delay = 0.2
        while True:
            try:
                conn = await self.db.connect()
                self._listen_conn = conn
                await conn.execute("SELECT set_config('application_name', %s, false)",
                                   (f"coderouter-listen-{self.instance}"[:63],))
                await conn.execute("LISTEN " + CHANNEL)
                self.listening = True
                delay = 0.2
                await self.poll_once()  # what was announced while we were not listening
                async for note in conn.notifies():
                    self._notified(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if self.listening:
                    log.warning("shared breakers: LISTEN connection lost (%s); polling every %g s until it is back",
                                type(e).__name__, self.poll_s)
                else:
                    log.debug("shared breakers: LISTEN failed: %s", e)
            finally:
                self.listening = False
                held, self._listen_conn = self._listen_conn, None
                if held is not None:
                    try:
                        await held.close()
                    except Exception:
                        pass
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _notified(self, payload: str) -> None:
        try:
            msg = orjson.loads(payload)
            name, version, who, snap = msg["p"], int(msg["v"]), msg["i"], msg["s"]
        except (ValueError, KeyError, TypeError):
            return
        if who == self.instance:
            return
        self._adopt(name, version, snap, f"{who} (notified)")

    async def poll_once(self) -> None:
        async def read(conn: Conn) -> list[tuple[Any, ...]]:
            cur = await conn.execute("SELECT provider, version, snapshot, instance FROM cr_breaker")
            return await cur.fetchall()

        try:
            rows = await self.db.run(read, timeout_s=max(self.poll_s, 1.0))
        except Unavailable:
            return
        self.last_poll = time.time()
        for name, version, snap, who in rows:
            if who != self.instance or version > self.versions.get(name, 0):
                self._adopt(name, version, snap, f"{who} (polled)")

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            await self.poll_once()

    # -- the half-open probe lease --------------------------------------------------------------------------

    def _schedule_probe(self, name: str) -> None:
        """Ask for the probe lease when the open breaker's recovery time comes, so the holder is known before
        the first request wants to try (asking only then would turn that request away)."""
        retry_in = self.routing.breakers.get(name).retry_in_s
        if retry_in is None:
            return
        loop = asyncio.get_running_loop()
        loop.call_later(max(retry_in - 0.02, 0.0), self._want_probe, name)

    def _want_probe(self, name: str) -> None:
        version = self.versions.get(name, 0)
        if version and name not in self._acquiring and self.db.up:
            self._acquiring.add(name)
            try:
                self._tasks.spawn(self._acquire(name, version), name="shared-breaker-probe")
            except RuntimeError:  # stopping
                self._acquiring.discard(name)

    def _may_probe(self, name: str) -> bool:
        """The breaker's trial gate (sync, on the request path): True when this instance holds the probe lease,
        or when there is nothing to arbitrate (no shared row, or the database is unreachable)."""
        version = self.versions.get(name, 0)
        if version == 0 or not self.db.up:
            return True
        if self._probe_until.get(name, 0.0) > time.monotonic():
            return True
        self._want_probe(name)  # a holder whose lease ran out without a trial: anyone may take it now
        return False

    async def _acquire(self, name: str, version: int) -> None:
        try:
            async def take(conn: Conn) -> tuple[Any, ...] | None:
                cur = await conn.execute(_PROBE, {"p": name, "v": version, "me": self.instance,
                                                  "lease": float(self.lease_s)})
                return await cur.fetchone()

            row = await self.db.run(take, timeout_s=max(self.lease_s / 4, 1.0))
            if row is not None and self.versions.get(name, 0) == version:
                self._probe_until[name] = time.monotonic() + max(float(row[0]) - 0.5, 0.0)
        except Unavailable:
            pass
        finally:
            self._acquiring.discard(name)
