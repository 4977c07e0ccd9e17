"""A request's leases on the managed processes it waits for: started for it (on demand, or stopped when idle or
for room), starting or restarting already, or restarting because the server died under one of its attempts.

The Exchange (executor.py) decides when to wait; this is what the waits are. Each process is waited for through
its lease (upstream/upstream.py: the only way a request waits for a process), with keep-alive pings for a
streaming client (waiting.py), within its deadline; the providers that came up are then tried in order through
the Exchange's public steps (`steps.Steps`), and every lease is given back when the request is done with it.

A managed server that died under an attempt (its connection refused or dropped before any content reached the
client) while nothing else served: the supervisor restarts it (or, stopped on demand, the request starts it),
and the request is sent again, once. The server that comes up is a fresh one: affinity forgot its slots at the
start, so the retry's placement restores the lane's saved slot file before resending (issue 44: the QA saw that
turn recompute 6.75x its new tokens).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from ..providers.errors import CONNECT, DISCONNECT, UpstreamError
from ..upstream.lifecycle import Phase
from .waiting import pinging

if TYPE_CHECKING:
    from ..providers.provider import Provider
    from ..upstream.upstream import Lease
    from .planner import Skip
    from .steps import Steps

# How long the supervisor may take to hear of an exit the request saw first (its child watcher runs on the same
# loop: a moment in practice). A managed server that refused or dropped a connection while still alive costs the
# request this long before it is answered with the error, and only when nothing else could serve it.
EXIT_NEWS_S = 2.0


def died_under(provider: Provider, e: UpstreamError, committed: bool) -> bool:
    """The attempt failed as a process that died fails (refused or dropped before any content reached the
    client), on a provider whose process coderouterd manages."""
    if e.reason not in (CONNECT, DISCONNECT) or (e.after_content and committed):
        return False
    return provider.cfg.process is not None


class Starts:
    """provider -> this request's lease on its process's start; given back when the request is done with it."""

    __slots__ = ("ex", "leases", "died")

    def __init__(self, ex: Steps) -> None:
        self.ex = ex
        self.leases: dict[str, Lease] = {}
        # provider -> its lifecycle's count of moves when its managed process died under an attempt of this request
        self.died: dict[str, int] = {}

    def __bool__(self) -> bool:
        return bool(self.leases)

    def give_back(self) -> None:
        """Every turn taken and not used goes back (the request is served, elsewhere or here, or gone)."""
        for lease in self.leases.values():
            lease.give_back()
        self.leases.clear()

    def demand(self, skips: list[Skip], ahead_of: list[str] | None = None) -> None:
        """Processes of this chain that are stopped and may be started by a request (on demand, or stopped when
        idle or for room) are started now, in the background, and those starting are noted: whether this request
        waits for them is decided later (on_demand_start). `ahead_of`: only those before the first of these
        candidates in the chain's order. One behind the provider that serves is wanted only once those ahead have
        failed: a turn for it would stop the model serving this request (and again after it, as a start nobody
        waits for)."""
        if not skips:  # nearly every request: nothing skipped, nothing to start
            return
        ex = self.ex
        chain = list(ex.profile.providers)
        first = chain.index(ahead_of[0]) if ahead_of and ahead_of[0] in chain else len(chain)
        for s in skips:
            if ahead_of is not None and s.provider in chain and chain.index(s.provider) >= first:
                continue
            if s.reason in ("not_ready", "cannot_start") and s.provider not in self.leases \
                    and s.provider in ex.runtime.providers:
                lease = ex.router.lease(s.provider, background=ex.req.is_background())
                if lease.want():
                    self.leases[s.provider] = lease

    def again(self, name: str, lease: Lease) -> None:
        """An attempt's process is being stopped: its lease goes back, and a turn is taken for its next start."""
        if self.leases.pop(name, None) is not None:
            lease.give_back()
        fresh = self.ex.router.lease(name, background=self.ex.req.is_background())
        if fresh.want():
            self.leases[name] = fresh

    async def restarts(self) -> None:
        """Leases on the restarts of the processes that died under this request's attempts (once per request):
        each one that is coming back (restarting, or startable on demand) within its start timeout."""
        died, self.died = self.died, {}
        for name, moves in died.items():
            if name in self.leases:
                continue
            lease = self.ex.router.lease(name, background=self.ex.req.is_background())
            life = lease.upstream.life
            if life.phase is Phase.RESIDENT and life.moves == moves:
                await life.left(Phase.RESIDENT, EXIT_NEWS_S)
            # Back already (it restarted while other providers were tried): a fresh server, tried at once. Without
            # this the request waited for exit news that came long ago, and was answered the error.
            if lease.back(moves) or lease.want():
                self.leases[name] = lease

    def dead(self, name: str, lease: Lease) -> None:
        """`name`'s managed process died under an attempt (`died_under`): tried once more when it is back."""
        self.died.setdefault(name, lease.upstream.life.moves)

    def ahead(self, names: list[str]) -> list[str]:
        """Providers being started for us that come before the first candidate in the chain's order."""
        chain = list(self.ex.profile.providers)
        first = chain.index(names[0]) if names and names[0] in chain else len(chain)
        return [p for p in self.leases if p in chain and chain.index(p) < first]

    def _deadline(self, providers: list[str]) -> float:
        """How long this request waits for the processes of `providers`: a start for it, within its providers'
        first-byte timeout; a start or restart the supervisor runs, within that process's start timeout."""
        ex = self.ex
        now = time.monotonic()
        ends = [ex.req.started + ex.runtime.providers[p].cfg.timeouts.first_byte
                for p in providers if p in ex.runtime.providers and (lease := self.leases.get(p)) is not None
                and lease.turn is not None]
        ends += [now + lease.starting for p in providers if (lease := self.leases.get(p)) is not None
                 and lease.turn is None and lease.starting]
        return max(ends, default=now)

    async def wait(self, providers: list[str], errors: list[UpstreamError]) -> bool:
        """Wait on our leases of the processes started for this request or starting (a streaming client gets its
        200 and pings meanwhile), then try each that came up. A process is kept for a turn it admitted until the
        request begins there, so one try is enough; a turn taken again (a stop by hand got there first) is waited
        for again, within the request's deadline. True when the client has been answered."""
        ex = self.ex
        deadline = self._deadline(providers)
        while True:
            # Up (and kept for us) already (it came up while other providers were tried): tried at once.
            up = [p for p, lease in self.leases.items() if p in providers and lease.admitted()]
            if up:
                ex.record.waited_for(up, 0.0)
                if await self._try(up, errors):
                    return True
                continue
            waiting = {p: lease for p, lease in self.leases.items() if p in providers and lease.waiting()}
            if not waiting:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                ex.record.note({"provider": next(iter(waiting)), "moved": "none",
                                "why": "its turn did not come within its first-byte timeout"})
                return False
            started = time.monotonic()
            try:
                await pinging(ex, _first_of([lease.wait(left) for lease in waiting.values()]),
                              next(iter(waiting)), left)
            except TimeoutError:
                continue  # the deadline check above says so
            up = [p for p, lease in waiting.items() if lease.admitted()]
            if not up:
                if all(not lease.waiting() for lease in waiting.values()):
                    return False  # could not start: routing says why
                continue
            ex.record.waited_for(up, time.monotonic() - started)
            if await self._try(up, errors):
                return True

    async def _try(self, up: list[str], errors: list[UpstreamError]) -> bool:
        """Try the providers whose process came up. A lease not used by its attempt (skipped before it began: a
        breaker, a budget) is given back at once: its model is not kept for a request that will not come back
        to it."""
        before = {p: self.leases.get(p) for p in up}
        if await self.ex.try_in_order(up, errors):
            return True
        for p, lease in before.items():
            if lease is not None and self.leases.get(p) is lease:
                del self.leases[p]
                lease.give_back()
        return False


async def _first_of(waits: list[Coroutine[Any, Any, None]]) -> None:
    """Until the first of these waits ends (the rest are cancelled)."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
