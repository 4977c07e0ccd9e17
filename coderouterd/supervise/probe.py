"""Watching one instance of a managed process from outside: when it is ready, and when a process we did not spawn
has gone.

Readiness is polled (an HTTP GET of ready_url, at growing intervals up to start_timeout_s), and whoever answers
must be the tree we started; an adopted process cannot be wait()ed on, so psutil is polled until it is gone.
Apart from the state machine (process.py) because these only observe: they return what they saw, and the
state machine's helper tasks post it as a message, so a probe can never move a state itself.
"""

from __future__ import annotations

import asyncio

from . import adopt, tree
from .spec import PROBE_TIMEOUT_S, ProcessSpec, http_ready

ADOPTED_POLL_S = 0.5  # a process we did not spawn cannot be wait()ed on; psutil is polled instead
READY_POLL_FIRST_S = 0.1
READY_POLL_MAX_S = 2.0


async def until_gone(pid: int, ctime: float) -> None:
    """Returns once the process that had `pid` at `ctime` has exited (or is a zombie)."""
    while await asyncio.to_thread(tree.process_alive, pid, ctime):  # reads /proc: off the loop
        await asyncio.sleep(ADOPTED_POLL_S)


async def until_ready(spec: ProcessSpec, pid: int, ctime: float | None) -> adopt.Verdict | None:
    """Once the instance started as (pid, ctime) is ready: whether the answer was its own (a refused verdict names
    the impostor). None when it was not ready within start_timeout_s. Without a ready_url, startsecs of life
    count as ready."""
    url = spec.ready_url
    if not url:
        await asyncio.sleep(spec.startsecs)
        return adopt.Verdict(True, f"no ready_url; running for {spec.startsecs:g}s")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + spec.start_timeout_s
    delay = READY_POLL_FIRST_S
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return None
        if await http_ready(url, min(PROBE_TIMEOUT_S, remaining)):
            # Whoever answered must be the server we started: another user may have bound the port between
            # our spawn and our child's bind, and would then be sent every prompt (issue 43, N9).
            return await asyncio.to_thread(adopt.serves_from_tree, url, pid, ctime)
        await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
        delay = min(delay * 2, READY_POLL_MAX_S)
