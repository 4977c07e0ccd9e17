"""The background saver: a lane idle for `save_idle_after_s` is saved, one slot per server per pass, while that
server serves nothing, so a kill -9 of the server costs at most the lanes that were busy.

Typed against the public face of kvcache/cache.py (`SaverHost`) and acting only through its `execute`, as a
request and the save before a stop do.

It never holds a slot: a save is only started while the server has no request in flight, and the slot stays
free in the table. A request that arrives during one is sent at once and the server runs it right after that
one save (llama-server handles slot actions in its own task loop): it waits for at most one file, never for a
queue of them. Skipping the save instead would need a cancel the server does not have."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from .files import TableView, to_save
from .intent import IDLE, Intent, Outcome

if TYPE_CHECKING:
    from ..providers.provider import Provider

log = logging.getLogger("coderouterd.kvcache")

IDLE_TICK_S = 1.0


class SaverHost(Protocol):
    """What the saver asks of kvcache (kvcache/cache.KVCache)."""

    @property
    def idle_after_s(self) -> float: ...

    def names(self) -> list[str]: ...

    def busy(self, name: str) -> bool: ...

    def savable(self, name: str) -> tuple[Provider, TableView] | None: ...

    async def execute(self, provider: Provider, intent: Intent) -> Outcome: ...


class IdleSaver:
    def __init__(self, cache: SaverHost, clock: Callable[[], float]) -> None:
        self.cache = cache
        self.clock = clock

    async def run(self) -> None:
        while True:
            after = self.cache.idle_after_s
            await asyncio.sleep(IDLE_TICK_S if after <= 0 else min(IDLE_TICK_S, after / 2))
            try:
                await self.one_pass()
            except Exception:
                log.exception("background slot save failed")

    async def one_pass(self) -> None:
        """One slot per server whose lanes went idle, while it serves nothing."""
        after = self.cache.idle_after_s
        if after <= 0:
            return
        for name in self.cache.names():
            found = self.cache.savable(name)
            if found is None or self.cache.busy(name):
                continue
            provider, table = found
            todo = to_save(table, now=self.clock(), idle_after_s=after)
            if todo:
                await self.cache.execute(provider, Intent(IDLE, ((todo[0], None),)))
