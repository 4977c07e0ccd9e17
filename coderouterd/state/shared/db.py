"""The connection pool to the shared database, whether it is up, and the bound on what it may cost a request.

Every call from the request path goes through `bounded`: it waits at most `timeout_s` and then lets the caller
fall back, while the statement itself runs on to its end in its own task (cancelling a statement half-way
would leave its connection in doubt; the caller is told what the late result was through `late`)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .dsn import redact

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from psycopg import AsyncConnection, AsyncCursor
    from psycopg_pool import AsyncConnectionPool

    from ...tasks import TaskSet

    # A connection as every statement of state/shared and cluster/ is handed it (rows as tuples).
    Conn = AsyncConnection[Any]

log = logging.getLogger("coderouterd.shared")


async def scalar(cur: AsyncCursor[Any]) -> Any:
    """The first column of the one row a statement always answers (a function call, a count, RETURNING on a
    row known to exist). No row is our own bug, said as such rather than as a subscript of None."""
    row = await cur.fetchone()
    if row is None:
        raise RuntimeError("a statement that always answers one row answered none")
    return row[0]


class Unavailable(Exception):
    """The shared database did not answer in time, or not at all: use the local fallback."""


class Database:
    def __init__(self, dsn: str, *, timeout_s: float, tasks: TaskSet, max_size: int = 4) -> None:
        self._dsn = dsn
        self.where = redact(dsn)
        self.timeout_s = timeout_s
        self._tasks = tasks  # a TaskSet: statements outliving their caller's patience are still owned
        self._max = max_size
        self.pool: AsyncConnectionPool | None = None
        self.up = False
        self.problem: str | None = "not connected yet"
        self.down_since: float | None = time.time()
        self._listeners: list[Callable[[bool], None]] = []

    def on_change(self, fn: Callable[[bool], None]) -> None:
        """fn(up) whenever the database goes from up to down or back (budgets reconcile on the way back)."""
        self._listeners.append(fn)

    async def open(self) -> None:
        from psycopg_pool import AsyncConnectionPool

        # autocommit: each function call is its own transaction; explicit ones use conn.transaction().
        self.pool = pool = AsyncConnectionPool(self._dsn, min_size=1, max_size=self._max, open=False,
                                        kwargs={"autocommit": True, "connect_timeout": 5},
                                        reconnect_timeout=86_400,  # keep trying: the database comes back
                                        name="coderouter-shared")
        await pool.open(wait=False)

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close(timeout=2)

    def connect(self) -> Coroutine[Any, Any, Conn]:
        """A dedicated connection outside the pool (the LISTEN connection, migrations)."""
        import psycopg

        return psycopg.AsyncConnection.connect(self._dsn, autocommit=True, connect_timeout=5)

    async def run(self, fn: Callable[[Any], Awaitable[Any]], *, timeout_s: float | None = None) -> Any:
        """fn(conn) on a pooled connection, off the request path (background work): waits as long as it takes
        up to `timeout_s` (default 10 s) and raises Unavailable on any database error."""
        pool = self.pool
        if pool is None:
            raise Unavailable("not opened")
        try:
            async with pool.connection(timeout=timeout_s or 10.0) as conn:
                result = await fn(conn)
        except Exception as e:  # psycopg.Error, PoolTimeout, OSError: all mean "not now"
            self._down(e)
            raise Unavailable(str(e)) from e
        self._up()
        return result

    async def bounded(self, fn: Callable[[Any], Awaitable[Any]], *,
                      late: Callable[[Any], None] | None = None,
                      wait_longer: Callable[[], bool] | None = None) -> Any:
        """fn(conn), but the caller waits at most `timeout_s`: on the request path. Past that it raises
        Unavailable; the statement finishes in the background and `late(result)` is called with its result.
        While the database is known to be down this fails at once: the heartbeat finds out when it is back."""
        if not self.up:
            raise Unavailable(self.problem or "shared state is down")
        task = self._tasks.spawn(self._settled(fn), name="shared-call")

        def finished(t: asyncio.Task) -> None:
            if t.cancelled():
                return
            ok, value = t.result()
            if ok and late is not None:
                try:
                    late(value)
                except Exception:
                    log.exception("shared state: handling a late answer failed")

        try:
            done, _ = await asyncio.wait({task}, timeout=self.timeout_s)
            if not done and wait_longer is not None and wait_longer():
                # The caller has no fallback that could serve (no allowance yet): a late answer beats a refusal.
                done, _ = await asyncio.wait({task}, timeout=max(self.timeout_s * 20, 1.0))
        except asyncio.CancelledError:
            task.add_done_callback(finished)  # the caller left (client gone): what it was granted goes back
            raise
        if task in done:
            ok, value = task.result()
            if ok:
                return value
            raise value
        task.add_done_callback(finished)
        log.debug("shared state: a call exceeded %.0f ms", self.timeout_s * 1000)
        raise Unavailable(f"no answer within {self.timeout_s * 1000:.0f} ms")

    async def _settled(self, fn: Callable[[Any], Awaitable[Any]]) -> tuple[bool, Any]:
        # The outcome as a value: a refusal of the database is news for the caller, not a failed task.
        try:
            return True, await self.run(fn, timeout_s=max(self.timeout_s * 20, 1.0))
        except Unavailable as e:
            return False, e

    # -- up / down ------------------------------------------------------------------------------------------

    def _up(self) -> None:
        if self.up:
            return
        self.up = True
        was = self.down_since
        self.problem = None
        self.down_since = None
        if was is not None:
            log.info("shared state: %s reachable", self.where)
        for fn in self._listeners:
            fn(True)

    def _down(self, e: BaseException) -> None:
        # The message of a psycopg error may quote the DSN's parameters but never its password; still, only
        # its first line goes out.
        self.problem = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
        if not self.up:
            return
        self.up = False
        self.down_since = time.time()
        log.warning("shared state: %s unreachable (%s); budgets use the local share, breakers are local",
                    self.where, self.problem)
        for fn in self._listeners:
            fn(False)

