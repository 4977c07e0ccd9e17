"""One upstream connection pool (an aiohttp session) with an owner-side lifetime: leased by each upstream call,
retired by a config reload that replaced it, closed exactly once.

A reload that changes a provider's endpoint settings gives it a new pool, but requests that started on the old
runtime may still be streaming through the old one (or even open a fallback attempt on it). So a retired pool is
closed when its last lease ends, at once when it has none, and at shutdown whatever is left. Closing twice is
harmless but never happens: `close()` drops the session it closed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .pinning import Verified
from .upstream_session import UpstreamSession

log = logging.getLogger("coderouterd")


class Pool:
    def __init__(self, connect_timeout: float, *,
                 pinned: tuple[str, Callable[[], Verified | None]] | None = None) -> None:
        """`pinned`: a managed provider's (name, what its server's last READY verified): its connections go only to
        the addresses its server held then (pinning.py). None: connections go wherever the host name resolves."""
        self.connect_timeout = connect_timeout
        self.pinned = pinned
        self._session: UpstreamSession | None = None  # made on first use (aiohttp is imported late)
        self.leases = 0
        self.retired = False
        self.sessions_opened = 0
        self.sessions_closed = 0
        self._closing: set[asyncio.Task] = set()

    def session(self) -> UpstreamSession:
        s = self._session
        if s is None or s.closed:
            import aiohttp

            connector: aiohttp.TCPConnector
            if self.pinned is None:
                connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300)
            else:
                from .pinned_connector import PinnedConnector

                connector = PinnedConnector(*self.pinned, limit=0, keepalive_timeout=60, ttl_dns_cache=300)
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout)
            s = self._session = UpstreamSession(aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=True, skip_auto_headers=("User-Agent",)
            ))
            self.sessions_opened += 1
        return s

    @property
    def open(self) -> bool:
        return self._session is not None and not self._session.closed

    # -- leases: one per upstream call, from open() to close() ------------------------------------------------

    def acquire(self) -> None:
        self.leases += 1

    def release(self) -> None:
        self.leases -= 1
        if self.leases <= 0:
            self.leases = 0
            if self.retired:
                self._close_soon()

    def retire(self) -> None:
        """A reload replaced this pool: close it once nothing uses it any more."""
        self.retired = True
        if self.leases == 0:
            self._close_soon()

    # -- closing --------------------------------------------------------------------------------------------

    def _close_soon(self) -> None:
        # Called from synchronous code (a call's close()); the session's close is a coroutine.
        if not self.open:
            return
        try:
            task = asyncio.get_running_loop().create_task(self._close_if_unused())
        except RuntimeError:  # no loop: nothing can have used the session in this thread either
            return
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _close_if_unused(self) -> None:
        # A call of the old runtime (a fallback attempt of a request that started before the reload) may have
        # leased the pool between the last release and this task: closing now would cut its request in flight
        # (the soak saw "Session is closed" answered as a 500). Its own release schedules the close again.
        if self.leases == 0:
            await self.close()

    async def close(self) -> None:
        s, self._session = self._session, None
        if s is not None and not s.closed:
            self.sessions_closed += 1
            await s.close()

    async def drain(self) -> None:
        """Shutdown: wait for closes already under way, then close the session if it is still open."""
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
        await self.close()
