"""Team keys in the shared database ([state] backend = "postgres"): every instance sees the same keys.

- `cr_key`: one row per key (its record as JSON, never a secret), a `version` from one sequence bumped by every
  change. A change is compare-and-set on the version the changing instance last saw.
- `cr_key_meta`: the hash key, made by whichever instance gets there first; every instance hashes with it, so a
  secret made on one verifies on all.
- Each instance re-reads `SELECT max(version), count(*)` every POLL_S and reloads the rows when it moved: a key
  created, changed or revoked anywhere is in force everywhere within POLL_S plus one query (the issue asks for
  2 s). Requests never wait on the database: they read the in-memory registry.
- What was last read is cached in the local state store, so an instance restarted while the database is down
  still knows the keys (and still refuses the revoked ones it knew of).
- Last use is written behind (keys/service.py), to its own column: it does not bump the version, so it never
  makes the other instances reload."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from ..keys.hashing import new_hash_key
from ..keys.record import KeyRecord
from ..keys.service import KeyProblem
from ..state.shared.db import Database, Unavailable

if TYPE_CHECKING:
    from ..keys.registry import KeyRegistry
    from ..state.shared.db import Conn
    from ..tasks import TaskSet

log = logging.getLogger("coderouterd.shared")

POLL_S = 0.5
NS_CACHE = "keys_cache"

_INSERT = ("INSERT INTO cr_key (name, version, record, expiry_noted) VALUES (%(n)s, nextval('cr_key_version'),"
           " %(r)s, %(e)s) ON CONFLICT (name) DO NOTHING RETURNING version")
_UPDATE = ("UPDATE cr_key SET version = nextval('cr_key_version'), record = %(r)s, expiry_noted = %(e)s,"
           " updated_at = now() WHERE name = %(n)s AND version = %(v)s RETURNING version")
_SELECT = "SELECT name, version, record, last_used, expiry_noted FROM cr_key"


class SharedKeyStorage:
    kind = "postgres"

    def __init__(self, db: Database, store: Any, registry: KeyRegistry, *, tasks: TaskSet,
                 poll_s: float = POLL_S) -> None:
        self.db = db
        self.store = store
        self.registry = registry
        self._tasks = tasks
        self.poll_s = poll_s
        self._seen: tuple[int, int] | None = None  # (max version, count) last loaded
        self.joined = False
        self.hash_key_hex: str | None = None
        self.last_poll: float | None = None

    # -- start ----------------------------------------------------------------------------------------------

    def load(self) -> None:
        """The keys last read from the database, from the local cache (nothing before the first join)."""
        cached = self.store.get(NS_CACHE, "snapshot")
        if not isinstance(cached, dict):
            # Whether keys exist is unknown until the database answers: closed meanwhile, never open (the door a
            # team's keys closed must not open because this instance has not read them yet).
            self.registry.close_until_loaded()
            return
        try:
            key = bytes.fromhex(cached["hash_key"])
            records = [KeyRecord.from_dict(r, version=int(r.get("version", 0))) for r in cached["records"]]
        except (KeyError, TypeError, ValueError):
            log.warning("shared keys: the local cache is unreadable; waiting for the database")
            self.registry.close_until_loaded()
            return
        self.registry.set_hash_key(key)
        self.hash_key_hex = key.hex()
        self.registry.replace(records)

    async def start(self) -> None:
        """Once the schema is there: the hash key, the keys, then the poll."""
        try:
            await self.db.run(self._join, timeout_s=10.0)
        except Unavailable as e:
            log.warning("shared keys: cannot read the keys yet (%s); using the last known ones", e)
        self._tasks.spawn(self._poll_loop(), name="shared-keys-poll")

    async def _join(self, conn: Conn) -> None:
        await conn.execute("INSERT INTO cr_key_meta (id, hash_key) VALUES (1, %s) ON CONFLICT DO NOTHING",
                           (new_hash_key().hex(),))
        cur = await conn.execute("SELECT hash_key FROM cr_key_meta WHERE id = 1")
        row = await cur.fetchone()
        assert row is not None
        self._seen = None
        # The hash key and the records change together (no await between): a database recreated since the cache
        # was written has another hash key, and its records only match it.
        await self._reload(conn, hash_key=row[0])
        self.joined = True

    async def _poll_loop(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                await self.poll_once()
            except Unavailable:
                pass

    async def poll_once(self) -> None:
        async def check(conn: Conn) -> None:
            if not self.joined:
                await self._join(conn)
                return
            cur = await conn.execute("SELECT coalesce(max(version), 0), count(*) FROM cr_key")
            row = await cur.fetchone()
            seen = (int(row[0]), int(row[1])) if row else (0, 0)
            if seen != self._seen:
                await self._reload(conn)

        await self.db.run(check, timeout_s=max(self.poll_s * 2, 1.0))
        self.last_poll = time.time()

    async def _reload(self, conn: Conn, *, hash_key: str | None = None) -> None:
        cur = await conn.execute(_SELECT)
        rows = await cur.fetchall()
        if hash_key is not None:
            self.registry.set_hash_key(bytes.fromhex(hash_key))
            self.hash_key_hex = hash_key
        records = [_record(row) for row in rows]
        top = max((r.version for r in records), default=0)
        self._seen = (top, len(records))
        # A use noted here since the last write-behind stays newer than the table's: keep the larger.
        current = {r.name: r for r in self.registry.records()}
        merged = []
        for r in records:
            mine = current.get(r.name)
            if mine is not None and mine.last_used and (r.last_used is None or mine.last_used > r.last_used):
                r = replace(r, last_used=mine.last_used)
            merged.append(r)
        self.registry.replace(merged)
        self._cache(merged)

    def _cache(self, records: list[KeyRecord]) -> None:
        if self.hash_key_hex is None:
            return
        self.store.set(NS_CACHE, "snapshot", {
            "hash_key": self.hash_key_hex, "records": [{**r.to_dict(), "version": r.version} for r in records]})

    # -- writes (the admin API's) ------------------------------------------------------------------------------

    async def save(self, rec: KeyRecord, *, previous: KeyRecord | None) -> KeyRecord:
        if not self.joined:
            raise KeyProblem(503, f"the shared database ({self.db.where}) has not been reached yet; keys can be "
                                  "changed once it is")
        params = {"n": rec.name, "r": orjson.dumps(rec.to_dict()).decode(), "e": rec.expiry_noted,
                  "v": previous.version if previous is not None else 0}

        async def write(conn: Conn) -> int | None:
            if previous is None:
                cur = await conn.execute(_INSERT, params)
            else:
                cur = await conn.execute(_UPDATE, params)
            row = await cur.fetchone()
            return int(row[0]) if row else None

        try:
            version = await self.db.run(write, timeout_s=5.0)
        except Unavailable as e:
            raise KeyProblem(503, f"the shared database ({self.db.where}) is unreachable ({e}); keys cannot be "
                                  "changed until it is back") from None
        if version is None:
            self._tasks.spawn(self._refresh_quietly(), name="shared-keys-refresh")
            what = "was created" if previous is None else "was changed"
            raise KeyProblem(409, f"key {rec.name!r} {what} on another instance meanwhile; look again "
                                  "(`corectl keys show`) and retry")
        saved = replace(rec, version=version)
        self._cache([*(r for r in self.registry.records() if r.name != rec.name), saved])
        return saved

    async def delete(self, rec: KeyRecord) -> None:
        async def remove(conn: Conn) -> bool:
            cur = await conn.execute("DELETE FROM cr_key WHERE name = %s AND version = %s RETURNING 1",
                                     (rec.name, rec.version))
            return await cur.fetchone() is not None

        try:
            gone = await self.db.run(remove, timeout_s=5.0)
        except Unavailable as e:
            raise KeyProblem(503, f"the shared database ({self.db.where}) is unreachable ({e}); keys cannot be "
                                  "changed until it is back") from None
        if not gone:
            self._tasks.spawn(self._refresh_quietly(), name="shared-keys-refresh")
            raise KeyProblem(409, f"key {rec.name!r} was changed on another instance meanwhile; look again and retry")
        self._cache([r for r in self.registry.records() if r.name != rec.name])

    async def _refresh_quietly(self) -> None:
        try:
            await self.db.run(self._force_reload, timeout_s=5.0)
        except Unavailable:
            pass

    async def _force_reload(self, conn: Conn) -> None:
        self._seen = None
        await self._reload(conn)

    async def fresh(self) -> list[KeyRecord] | None:
        if not self.joined:
            return None

        async def read(conn: Conn) -> list[KeyRecord]:
            cur = await conn.execute(_SELECT)
            return [_record(row) for row in await cur.fetchall()]

        try:
            return await self.db.run(read, timeout_s=2.0)
        except Unavailable:
            return None  # the last known keys, as the request path sees them

    async def write_used(self, used: dict[str, float]) -> None:
        async def write(conn: Conn) -> None:
            async with conn.transaction():
                for name, ts in sorted(used.items()):
                    await conn.execute("UPDATE cr_key SET last_used = greatest(coalesce(last_used, 0), %s)"
                                       " WHERE name = %s", (ts, name))

        await self.db.run(write, timeout_s=5.0)

    async def claim_expiry(self, rec: KeyRecord) -> bool:
        async def claim(conn: Conn) -> bool:
            cur = await conn.execute("UPDATE cr_key SET expiry_noted = true WHERE name = %s AND NOT expiry_noted"
                                     " RETURNING 1", (rec.name,))
            return await cur.fetchone() is not None

        won = await self.db.run(claim, timeout_s=5.0)
        current = self.registry.get(rec.name)
        if current is not None:
            self.registry.put(replace(current, expiry_noted=True))
        return bool(won)

    def status(self) -> dict[str, Any]:
        return {"joined": self.joined, "last_poll": self.last_poll, "version": self._seen[0] if self._seen else None}


def _record(row: tuple[Any, ...]) -> KeyRecord:
    name, version, record, last_used, expiry_noted = row
    data = record if isinstance(record, dict) else orjson.loads(record)
    data = {**data, "name": name, "last_used": last_used, "expiry_noted": bool(expiry_noted)}
    return KeyRecord.from_dict(data, version=int(version))
