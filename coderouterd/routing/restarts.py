"""A managed server that died under a request's attempt is waited for and the request sent again, not dropped.

The connection was refused or dropped before the client saw any of the answer, and nothing else served: the
supervisor restarts the process (or, stopped on demand, the request starts it). The request takes a lease on
that start and waits for it within the process's start timeout, as for any start (executor.py's waits, with
keep-alive pings for a streaming client), then tries the provider again, once. The server that comes up is a
fresh one: affinity forgot its slots at the start, so the placement of the retry restores the lane's saved slot
file before the request is resent (issue 44: the QA saw that turn recompute 6.75x its new tokens).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..providers.errors import CONNECT, DISCONNECT, UpstreamError
from ..upstream.lifecycle import Phase

if TYPE_CHECKING:
    from ..providers.provider import Provider
    from ..upstream.upstream import Lease
    from .exchange_router import ExchangeRouter

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


async def restart_leases(router: ExchangeRouter, died: list[str], *, background: bool,
                         have: dict[str, Lease]) -> dict[str, Lease]:
    """Leases on the starts of the processes that died under this request (those not leased already): each one
    that is coming back (restarting, or startable on demand) within its start timeout."""
    out: dict[str, Lease] = {}
    for name in dict.fromkeys(died):
        if name in have:
            continue
        lease = router.lease(name, background=background)
        life = lease.upstream.life
        if life.phase is Phase.RESIDENT:
            await life.left(Phase.RESIDENT, EXIT_NEWS_S)
        if lease.want():
            out[name] = lease
    return out
