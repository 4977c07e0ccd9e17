"""The set of supervised processes, and which providers each one serves.

Processes are keyed by their own id, not by provider: two providers (say a coder model and a
chat model) can be served by one `ollama serve`, and restarting "both" must restart it once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Unpack

from . import tree
from .process import ManagedProcess, ProcessOptions
from .spec import ProcessSpec

log = logging.getLogger("coderouterd.supervise")
_MB = 1024 * 1024


class Supervisor:
    def __init__(self, *, log_dir: Path, **options: Unpack[ProcessOptions]) -> None:
        """`options`: what every process made here gets (ManagedProcess's keywords, and its defaults)."""
        self._log_dir = Path(log_dir)
        self._options = options
        self._processes: dict[str, ManagedProcess] = {}
        self._providers: dict[str, str] = {}

    def add(self, spec: ProcessSpec, *, providers: Iterable[str] = ()) -> ManagedProcess:
        """Register a process (idempotent for an identical spec) and the providers it serves."""
        existing = self._processes.get(spec.name)
        if existing is not None:
            if existing.spec != spec:
                raise ValueError(f"process {spec.name!r} is already defined with a different spec")
            proc = existing
        else:
            proc = ManagedProcess(spec, log_dir=self._log_dir, **self._options)
            self._processes[spec.name] = proc
        for provider in providers:
            self.bind(provider, spec.name)
        return proc

    def bind(self, provider: str, name: str) -> None:
        if name not in self._processes:
            raise KeyError(f"unknown process {name!r}")
        self._providers[provider] = name

    def get(self, name: str) -> ManagedProcess:
        try:
            return self._processes[name]
        except KeyError:
            raise KeyError(f"unknown process {name!r}; known: {', '.join(self.names()) or 'none'}") from None

    def for_provider(self, provider: str) -> ManagedProcess | None:
        name = self._providers.get(provider)
        return self._processes.get(name) if name is not None else None

    def providers_of(self, name: str) -> list[str]:
        return sorted(p for p, n in self._providers.items() if n == name)

    def names(self) -> list[str]:
        return sorted(self._processes)

    async def remove(self, name: str, reason: str = "reload") -> None:
        """Stop (if ours) and forget a process, e.g. when a reload drops its provider."""
        proc = self._processes.pop(name, None)
        if proc is None:
            return
        self._providers = {p: n for p, n in self._providers.items() if n != name}
        await proc.close(reason)

    async def replace(self, spec: ProcessSpec, *, providers: Iterable[str] = (), reason: str = "reload"
                      ) -> ManagedProcess:
        """Put a new process in the place of the one of the same name (a reload changed its spec), then stop the
        old one. The new one is registered first: whoever the old one's closing wakes (a recovery waiting for it
        to start) finds its successor, not a gap. The new one is not started here, so the two never share a port."""
        old = self._processes.pop(spec.name, None)
        self._providers = {p: n for p, n in self._providers.items() if n != spec.name}
        new = self.add(spec, providers=providers)
        if old is not None:
            await old.close(reason)
        return new

    async def start_all(self) -> None:
        """Start the autostart processes concurrently; each adopts what already runs."""
        procs = [p for p in self._processes.values() if p.spec.autostart]
        results = await asyncio.gather(*(p.start() for p in procs), return_exceptions=True)
        for proc, result in zip(procs, results, strict=True):
            if isinstance(result, BaseException):
                log.error("%s: start failed: %s", proc.name, result)

    async def adopt_leftovers(self) -> dict[str, float | None]:
        """Adopt, concurrently, every server a previous coderouterd left running (supervise/process.py `adopt`),
        started with the daemon or on demand alike. Returns each adopted process's measured rss in MB (None when
        it cannot be read), for the memory budget."""
        procs = list(self._processes.values())
        results = await asyncio.gather(*(p.adopt() for p in procs), return_exceptions=True)
        out: dict[str, float | None] = {}
        for proc, result in zip(procs, results, strict=True):
            if isinstance(result, BaseException):
                log.error("%s: adoption of a running server failed: %s", proc.name, result)
            elif result:
                rss = await asyncio.to_thread(tree.UsageMeter().measure, proc.pid) if proc.pid else None
                out[proc.name] = round(rss[0] / _MB, 1) if rss and rss[0] else None
        return out

    async def shutdown(self) -> None:
        """Stop every process tree this daemon owns, concurrently; external backends stay up."""
        procs = list(self._processes.values())
        results = await asyncio.gather(*(p.close("shutdown") for p in procs), return_exceptions=True)
        for proc, result in zip(procs, results, strict=True):
            if isinstance(result, BaseException):
                log.error("%s: shutdown failed: %s", proc.name, result)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        out = {}
        for name in self.names():
            snap = self._processes[name].snapshot()
            snap["providers"] = self.providers_of(name)
            out[name] = snap
        return out
