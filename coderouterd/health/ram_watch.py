"""The RAM watcher: memory pressure on this machine, where the local model servers run. Here beside the
provider health monitor because it says whether the local providers can serve; unrelated to the in-memory
store of state/memory.py.

Reactive: an upstream error that says the backend ran out of memory is classified `memory_pressure`
(`providers.errors.is_memory_error`); the router gives that provider a cooldown and the request fails over.
Proactive: available memory is sampled (psutil, in a thread); below the threshold the daemon warns, shows
it, and profiles with `memory_action = "prefer_remote"` try remote providers before local ones until memory
recovers (`adjust_order`, consulted by the router). `check_fits` lets `corectl models load` refuse a model
larger than what is available.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..state.events import MemoryPressure

if TYPE_CHECKING:
    from ..config.schema import ConfigModel, ProfileConfig

log = logging.getLogger("coderouterd")

# Test seam: a file holding the available memory in bytes replaces psutil (e2e tests fake low memory).
PROBE_FILE_ENV = "CODEROUTER_MEMORY_PROBE_FILE"


def available_bytes() -> int:
    path = os.environ.get(PROBE_FILE_ENV)
    if path:
        with open(path) as f:
            return int(f.read().strip())
    import psutil

    return int(psutil.virtual_memory().available)


def gb(n: int | float) -> str:
    return f"{n / 1e9:.1f} GB"


class RamWatch:
    """Samples available memory every `interval_s` and keeps the last figure and whether it is low."""

    def __init__(self, *, low_mb: float, interval_s: float, publish: Callable | None = None,
                 probe: Callable[[], int] = available_bytes) -> None:
        self.low_bytes = int(low_mb * 1e6)
        self.interval_s = interval_s
        self.publish = publish
        self.probe = probe
        self.available: int | None = None
        self.low = False
        self.sampled_at: float | None = None
        self._task: asyncio.Task | None = None

    def reconfigure(self, cfg: ConfigModel) -> None:
        self.low_bytes = int(cfg.memory.low_available_mb * 1e6)
        self.interval_s = cfg.memory.sample_interval_s

    def start(self) -> None:
        if self._task is None and self.low_bytes > 0:
            self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                self.update(await asyncio.to_thread(self.probe))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a failed sample must not end the watch
                log.debug("memory sample failed: %s", e)
            await asyncio.sleep(self.interval_s)

    def update(self, available: int) -> None:
        self.available = available
        self.sampled_at = time.time()
        low = available < self.low_bytes
        if low != self.low:
            self.low = low
            if low:
                log.warning("memory pressure: %s available (threshold %s)", gb(available), gb(self.low_bytes))
            else:
                log.info("memory pressure over: %s available", gb(available))
            if self.publish is not None:
                self.publish(MemoryPressure(available_bytes=available, threshold_bytes=self.low_bytes, low=low))

    def adjust_order(self, profile: ProfileConfig, candidates: list[str], is_local: Callable[[str], bool]) -> list[dict]:
        """Under pressure, `prefer_remote` profiles try remote providers first (order kept within each group)."""
        if not self.low or getattr(profile, "memory_action", "warn") != "prefer_remote":
            return []
        local = [c for c in candidates if is_local(c)]
        remote = [c for c in candidates if not is_local(c)]
        if not local or not remote or candidates[:len(remote)] == remote:
            return []
        candidates[:] = remote + local
        why = f"memory pressure: {gb(self.available or 0)} available (memory_action=prefer_remote)"
        return [{"provider": p, "moved": "back", "why": why} for p in local]

    def snapshot(self) -> dict:
        return {"available_bytes": self.available, "threshold_bytes": self.low_bytes, "low": self.low,
                "sampled_at": self.sampled_at}

    async def check_fits(self, size: int | None) -> str | None:
        """None when a model of `size` bytes fits in available memory (or either is unknown), else why not."""
        if not size:
            return None
        try:
            available = await asyncio.to_thread(self.probe)
        except Exception:  # unknown: do not refuse on a guess
            return None
        self.update(available)
        if size <= available:
            return None
        return (f"the model needs {gb(size)} but only {gb(available)} is available ({gb(size - available)} "
                f"missing); free memory or unload another model, or pass --force")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
