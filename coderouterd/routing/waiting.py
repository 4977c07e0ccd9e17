"""Waiting on something before any upstream answers (a lease on a managed process starting, on demand or
restarting: upstream/upstream.py), the way the executor waits for an upstream's first byte: a streaming client gets
its 200 once the stream's hold is over, then keep-alive pings, so Claude Code's idle watchdog never fires during a
model's load. Only the Exchange's public steps are used (`steps.Steps`) (`hold_remaining`, `commit_early`,
`ping`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .steps import Steps


async def pinging(ex: Steps, aw: Awaitable[object], provider: str, timeout: float | None = None) -> None:
    """Wait for `aw` (up to `timeout`, then TimeoutError), pinging a streaming client meanwhile. `provider`
    names the stream's opening if it must be sent first."""
    task = asyncio.ensure_future(aw)
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    try:
        while not task.done():
            step = ex.server.ping_interval_s
            if ex.req.stream and not ex.committed:
                hold = ex.hold_remaining()
                if hold <= 0:
                    await ex.commit_early(provider, ())
                    continue
                step = min(step, hold)
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError
                step = min(step, left)
            done, _ = await asyncio.wait((task,), timeout=step)
            if not done and ex.req.stream and ex.committed:
                await ex.ping()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
