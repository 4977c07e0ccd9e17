"""The daemon's managed backends: building supervisor specs from config, persisting pids for adoption after
a crash, applying config reloads, and the start/stop/restart actions corectl asks for."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from ..affinity.slot_save import slot_dir, with_slot_save_path
from ..config import state_dir
from ..tasks import TaskSet
from .registry import Supervisor
from .spec import ProcessSpec

if TYPE_CHECKING:
    from ..config.schema import ConfigModel

log = logging.getLogger("coderouterd")

NS_PROCESSES = "processes"


def specs_from_config(cfg: ConfigModel) -> dict[str, tuple[ProcessSpec, list[str]]]:
    """process id -> (spec, providers served). A shared [processes.NAME] is declared once, referenced by many."""
    out: dict[str, tuple[ProcessSpec, list[str]]] = {}
    for provider in cfg.providers:
        found = cfg.process_for(provider)
        if found is None:
            continue
        name, p = found
        if name not in out:
            command = list(p.command)
            if cfg.affinity.enabled and cfg.affinity.manage_slot_save and cfg.providers[provider].affinity:
                command = with_slot_save_path(command, slot_dir(state_dir(cfg)))
            spec = ProcessSpec(name=name, command=command, env=dict(p.env), cwd=p.cwd or None,
                               ready_url=p.ready_url,
                               autostart=p.autostart, stop_timeout_s=p.stop_timeout_s,
                               start_timeout_s=p.start_timeout_s, startsecs=p.startsecs,
                               max_restarts=p.max_restarts, restart_window_s=p.restart_window_s,
                               healthy_after_s=p.healthy_after_s or None, adopt=p.adopt)
            out[name] = (spec, [])
        out[name][1].append(provider)
    return out


class Processes:
    def __init__(self, log_dir, store, on_event, before_stop=None) -> None:
        """`before_stop(process, reason)`: awaited before each planned stop (prefix affinity saves the server's
        slots there: affinity/warm.py)."""
        self.store = store
        self.supervisor = Supervisor(log_dir=log_dir, on_event=on_event, record=self._record, lookup=self._lookup,
                                     before_stop=before_stop)
        # Starts that run on their own (the first start of every autostarted process, those a reload adds):
        # shutdown cancels them before it stops the processes.
        self._starts = TaskSet()

    @staticmethod
    def autostarted(cfg: ConfigModel) -> list[tuple[list[str], float]]:
        """(providers, start timeout) of each process started with the daemon: requests may wait for it."""
        return [(providers, spec.start_timeout_s) for spec, providers in specs_from_config(cfg).values()
                if spec.autostart]

    async def _record(self, name: str, info: dict | None) -> None:
        if info is None:
            self.store.delete(NS_PROCESSES, name)
        else:
            self.store.set(NS_PROCESSES, name, info)
        # A pid must be on disk before a crash of ours could orphan its process; the write is off the loop.
        await asyncio.to_thread(self.store.flush)

    def _lookup(self, name: str) -> dict | None:
        return self.store.get(NS_PROCESSES, name)

    def apply(self, cfg: ConfigModel) -> list[str]:
        """Register the configured processes. Returns the names that need a (re)start."""
        wanted = specs_from_config(cfg)
        changed = []
        for name, (spec, providers) in wanted.items():
            try:
                self.supervisor.add(spec, providers=providers)
            except ValueError:
                changed.append(name)
                continue
            for p in providers:
                self.supervisor.bind(p, name)
        return changed

    async def reload(self, cfg: ConfigModel) -> None:
        wanted = specs_from_config(cfg)
        for name in list(self.supervisor.names()):
            if name not in wanted:
                await self.supervisor.remove(name)
        for name in self.apply(cfg):
            spec, providers = wanted[name]
            await self.supervisor.remove(name)
            mp = self.supervisor.add(spec, providers=providers)
            if spec.autostart:
                await mp.start()
        for name, (spec, _) in wanted.items():
            mp = self.supervisor.get(name)
            if spec.autostart and mp.state == "stopped" and mp.pid is None:
                self._starts.spawn(mp.start(), name=f"start:{name}")

    def start_background(self) -> None:
        # Big models load slowly: the proxy serves (and fails over) while managed backends come up.
        self._starts.spawn(self.supervisor.start_all(), name="start-all")

    def resolve(self, name: str):
        """A managed process by its own name or by the name of a provider it serves."""
        if name in self.supervisor.names():
            return self.supervisor.get(name)
        return self.supervisor.for_provider(name)

    async def action(self, name: str, action: str) -> dict:
        mp = self.resolve(name)
        if mp is None:
            raise KeyError(name)
        if action == "start":
            await mp.start()
        elif action == "stop":
            await mp.stop("manual")
        elif action == "restart":
            ok = await mp.restart("corectl restart")
            if not ok:
                return {"ok": False, "message": f"a restart of {mp.spec.name} is already in progress",
                        "process": mp.snapshot()}
        else:
            raise ValueError(action)
        return {"ok": True, "process": mp.snapshot()}

    async def shutdown(self) -> None:
        await self._starts.close()
        await self.supervisor.shutdown()
