"""Background tasks with an owner: every task the daemon starts outside a request is tracked here, and
shutdown cancels and awaits them all, so none outlives the daemon or dies with its exception unseen."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

log = logging.getLogger("coderouterd")


class TaskSet:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    def spawn(self, coro: Coroutine, *, name: str | None = None) -> asyncio.Task:
        if self._closed:
            coro.close()
            raise RuntimeError("task set is closed")
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed: %r", task.get_name(), task.exception())

    def __len__(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel every task still running and wait for each to end."""
        self._closed = True
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
