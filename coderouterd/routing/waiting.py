"""Waiting on something before any upstream answers (a managed process starting, on demand or restarting), the way
the executor waits for an upstream's first byte: a streaming client gets its 200 once the stream's hold is over,
then keep-alive pings, so Claude Code's idle watchdog never fires during a model's load. Only the Exchange's
public steps are used (`steps.Steps`) (`hold_remaining`, `commit_early`, `ping`, `try_in_order`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..providers.errors import UpstreamError
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


async def wait_for_restart(ex: Steps, errors: list[UpstreamError]) -> bool:
    """Nothing else could serve, and a managed process of this profile is starting or restarting (its model
    loading, or the supervisor bringing it back after a crash): wait for it, within its start timeout, then try
    it. True when the client has been answered."""
    router = ex.router
    deadline = None
    for _ in range(3):  # a process that dies again as soon as it is ready is not waited for forever
        coming = [n for n in ex.profile.providers if router.coming_within(n) > 0 and n in ex.runtime.providers]
        if not coming:
            return False
        now = time.monotonic()
        if deadline is None:
            deadline = now + max(router.coming_within(n) for n in coming)
        waited = time.monotonic()
        up = await wait_up(ex, coming, deadline - now)
        if not up:
            return False
        ex.record.waited_for(up, time.monotonic() - waited)
        if await ex.try_in_order(up, errors):
            return True
    return False


async def wait_up(ex: Steps, coming: list[str], timeout: float) -> list[str]:
    """The routing state's wait for providers whose process is starting or restarting, pinging meanwhile."""
    box: list[list[str]] = []

    async def wait() -> None:
        box.append(await ex.router.wait_up(coming, timeout))

    try:
        await pinging(ex, wait(), coming[0], timeout + 1.0)
    except TimeoutError:
        return []
    return box[0] if box else []
