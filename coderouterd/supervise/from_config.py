"""The daemon's managed backends: building supervisor specs from config, persisting pids for adoption after
a crash, applying config reloads, and the start/stop/restart actions corectl asks for."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..config import state_dir
from ..kvcache.budget import too_small
from ..kvcache.disk import slot_dir
from ..providers.pinning import is_local
from ..servers.llamacpp import saves_to, with_slot_save_path
from ..state.events import ProcessEventName
from ..tasks import TaskSet
from ..upstream.lifecycle import Phase
from ..upstream.upstream import Upstreams
from . import adopt, memory
from .ondemand import OnDemand, Rules, Settings, StartFailed
from .registry import Supervisor
from .residency import Resident
from .spec import EventCallback, ExternalProcessError, ProcessSpec, ProcessState

if TYPE_CHECKING:
    from pathlib import Path

    from ..config.schema import ConfigModel
    from ..state.memory import MemoryStore
    from ..state.store import Store
    from .process import BeforeStopCallback, ManagedProcess

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
                               # An on-demand process waits for the request that needs it.
                               autostart=p.autostart and p.start == "always", stop_timeout_s=p.stop_timeout_s,
                               start_timeout_s=p.start_timeout_s, startsecs=p.startsecs,
                               max_restarts=p.max_restarts, restart_window_s=p.restart_window_s,
                               healthy_after_s=p.healthy_after_s or None, adopt=p.adopt)
            out[name] = (spec, [])
        out[name][1].append(provider)
    return out


def slot_budget_notes(cfg: ConfigModel) -> dict[str, str]:
    """Managed llama-servers one of whose slot files, with the slot full, would not fit affinity.max_saved_mb:
    every such save is written and deleted at once (issue 43, D5). For start-up and `config check`; reads the
    models' headers (blocking: in a thread)."""
    a = cfg.affinity
    if not (a.enabled and a.manage_slot_save) or a.max_saved_slots <= 0:
        return {}
    directory = slot_dir(state_dir(cfg))
    out = {}
    for name, (spec, _) in specs_from_config(cfg).items():
        if saves_to(spec.command, directory):
            file_bytes, tokens = memory.slot_file_estimate(spec.command, spec.cwd)
            note = too_small(a.max_saved_mb, name, file_bytes, tokens)
            if note is not None:
                out[name] = note
    return out


def ambiguous_hosts(cfg: ConfigModel) -> list[str]:
    """Managed providers whose base_url names a host that is several addresses of this machine (`localhost`:
    127.0.0.1 and ::1): the server listens on one, and any local user may listen on another of the same port. Their
    connections are held to what the server was verified to hold (providers/pinning.py); the note says how to name
    one address and leave nothing to choose. For --check, `config check` and the start-up log; resolves names and
    lists this machine's addresses (blocking: in a thread on the daemon's loop)."""
    mine = adopt.machine_addresses()
    notes = []
    for name, pcfg in cfg.providers.items():
        if cfg.process_for(name) is None:
            continue
        parts = urlsplit(pcfg.base_url)
        host = parts.hostname
        if not host or _is_address(host):
            continue
        local = sorted(a for a in adopt.resolve(host) if is_local(a, mine))
        if len(local) < 2:
            continue
        one = "127.0.0.1" if "127.0.0.1" in local else next((a for a in local if ":" not in a), local[0])
        netloc = (f"[{one}]" if ":" in one else one) + (f":{parts.port}" if parts.port else "")
        suggested = urlunsplit(parts._replace(netloc=netloc))
        notes.append(f"provider {name}: base_url {pcfg.base_url} names {host}, which is {len(local)} addresses of "
                     f"this machine ({', '.join(local)}): another local user could listen on one its server leaves "
                     f"free. coderouterd sends requests only where the server listened when it became ready; to "
                     f"leave nothing to chance, write base_url = \"{suggested}\" (and --host {one} in the server's "
                     f"command, {one} in ready_url)")
    return notes


def _is_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def residents_from_config(cfg: ConfigModel, estimates: dict[str, float]) -> dict[str, tuple[Resident, Settings]]:
    """What the on-demand scheduler knows of each process: memory (configured, else estimated), pinned, idle."""
    out: dict[str, tuple[Resident, Settings]] = {}
    for provider in cfg.providers:
        found = cfg.process_for(provider)
        if found is None or found[0] in out:
            continue
        name, p = found
        served = [q for q, c in cfg.providers.items() if (f := cfg.process_for(q)) is not None and f[0] == name]
        # A stop to make room waits for the requests in flight as long as their own timeouts let them run.
        drain = max(cfg.providers[q].timeouts.total for q in served)
        out[name] = (Resident(name, memory_mb=p.memory_mb or estimates.get(name, 0.0), pinned=p.pinned,
                              idle_stop_s=p.idle_stop_s),
                     Settings(on_demand=p.start == "on_demand", stop_timeout_s=p.stop_timeout_s,
                              start_timeout_s=p.start_timeout_s, room_drain_s=drain))
    return out


def estimate_memory(cfg: ConfigModel) -> dict[str, float]:
    """process -> estimated MB for those without memory_mb. Blocking (stat, GGUF header): run in a thread."""
    out = {}
    for name, (spec, providers) in specs_from_config(cfg).items():
        found = cfg.process_for(providers[0])
        if found is not None and not found[1].memory_mb:
            out[name] = memory.estimate_mb(spec.command, spec.cwd)
    return out


class SupervisorEffects:
    """The on-demand scheduler's effects (ondemand.Effects) on the real supervisor."""

    def __init__(self, supervisor: Supervisor) -> None:
        self.sup = supervisor

    def _procs(self) -> list[ManagedProcess]:
        return [self.sup.get(n) for n in self.sup.names()]

    def holding(self) -> Collection[str]:
        return {mp.name for mp in self._procs() if mp.state not in (ProcessState.STOPPED, ProcessState.FATAL)}

    def ready(self) -> Collection[str]:
        return {mp.name for mp in self._procs() if mp.state is ProcessState.READY}

    def external(self) -> Collection[str]:
        return {mp.name for mp in self._procs() if mp.external}

    def stopped(self, name: str) -> bool:
        return name in self.sup.names() and self.sup.get(name).state is ProcessState.STOPPED

    def providers_of(self, name: str) -> list[str]:
        return self.sup.providers_of(name)

    async def start(self, name: str, wait: bool = True) -> str | None:
        mp = self.sup.get(name)
        await mp.start()
        if not wait and mp.state is not ProcessState.FATAL:
            return None
        if await mp.wait_ready(mp.spec.start_timeout_s):
            return None
        if mp.state is ProcessState.FATAL:
            return mp.fatal_reason or "fatal"
        return f"not ready within start_timeout_s = {mp.spec.start_timeout_s:g} ({mp.state.value})"

    async def wait_ready(self, name: str) -> None:
        mp = self.sup.get(name)
        await mp.wait_ready(mp.spec.start_timeout_s)

    async def stop(self, name: str, reason: str) -> None:
        try:
            await self.sup.get(name).stop(reason=reason)
        except ExternalProcessError as e:
            log.warning("%s", e)

class Processes:
    def __init__(self, log_dir: Path, store: Store | MemoryStore, on_event: EventCallback | None,
                 before_stop: BeforeStopCallback | None = None, *,
                 upstreams: Upstreams) -> None:
        """`before_stop(process, reason)`: awaited before each planned stop (prefix affinity saves the server's
        slots there: kvcache/cache.py). `upstreams`: the registry the supervisor's events move first (routing
        reads it), before `on_event` (audit, self-healing) hears them."""
        self.store = store
        self.upstreams = upstreams
        self._on_event = on_event
        self.supervisor = Supervisor(log_dir=log_dir, on_event=self._event, record=self._record,
                                     lookup=self._lookup, before_stop=before_stop)
        # Local models on demand, within [models] memory_budget_mb: every start and stop that is not the
        # supervisor's own restart goes through it. It is the upstreams' starter.
        self.scheduler = OnDemand(SupervisorEffects(self.supervisor), clock=time.monotonic,
                                  process_of=self._process_of, upstreams=upstreams)
        # Starts that run on their own (the first start of every autostarted process, those a reload adds):
        # shutdown cancels them before it stops the processes.
        self._starts = TaskSet()

    def _event(self, name: str, event: ProcessEventName, pid: int | None, detail: str) -> None:
        """A process event: its providers' upstreams move first (the one place routing learns of it), then
        the daemon hears it (audit, self-healing, what a fresh server holds)."""
        try:
            mp = self.supervisor.get(name)
        except KeyError:
            mp = None
        wait_s = mp.spec.start_timeout_s if mp is not None else 0.0
        self.upstreams.process_event(name, event, self.supervisor.providers_of(name), detail, wait_s=wait_s,
                                     on_demand=self.scheduler.on_demand(name))
        if self._on_event is not None:
            self._on_event(name, event, pid, detail)

    def _process_of(self, provider: str) -> str | None:
        mp = self.supervisor.for_provider(provider)
        return mp.name if mp is not None else None

    async def configure(self, cfg: ConfigModel) -> None:
        """The scheduler's view of the configured processes; memory estimates are read off the loop."""
        estimates = await asyncio.to_thread(estimate_memory, cfg)
        self.scheduler.configure(cfg.models.memory_budget_mb, residents_from_config(cfg, estimates),
                                 Rules(hold_s=cfg.models.swap_hold_s, min_resident_s=cfg.models.min_resident_s))

    async def adopt_leftovers(self) -> set[str]:
        """Servers a killed coderouterd left running are adopted before anything starts, and count against the
        budget from then on (issue 43, D2). Returns the names of the processes adopted."""
        adopted = await self.supervisor.adopt_leftovers()
        for name, rss_mb in adopted.items():
            self.scheduler.adopt_running(name, rss_mb)
        return set(adopted)

    def await_first_starts(self, cfg: ConfigModel) -> None:
        """Before the proxy answers (and for the processes a reload adds): a process started with the daemon is
        waited for by a request that arrives first (not tried at once and counted as a failure); an on-demand one
        is not routed to until a request has started it. Only processes not started yet, whose providers routing
        still takes for up."""
        for name, (spec, providers) in specs_from_config(cfg).items():
            mp = self.supervisor.get(name) if name in self.supervisor.names() else None
            if mp is None or mp.state is not ProcessState.STOPPED or mp.pid is not None or \
                    any(self.upstreams.get(p).phase is not Phase.RESIDENT for p in providers):
                continue
            found = cfg.process_for(providers[0])
            if spec.autostart:
                self.upstreams.awaited(providers, name, spec.start_timeout_s)
            elif found is not None and found[1].start == "on_demand":
                self.upstreams.stopped(providers, name, on_demand=True, first=True)

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
        await self.configure(cfg)
        self.scheduler.start_idle_watch()
        changed = self.apply(cfg)
        self.await_first_starts(cfg)
        for name in changed:
            spec, providers = wanted[name]
            mp = await self.supervisor.replace(spec, providers=providers)
            mp.last_stop_reason = "reload"
            if spec.autostart:
                await self._ensure(name)
        for name, (spec, _) in wanted.items():
            mp = self.supervisor.get(name)
            if spec.autostart and mp.state == "stopped" and mp.pid is None:
                self._starts.spawn(self._ensure(name), name=f"start:{name}")

    async def _ensure(self, name: str) -> None:
        """Start within the budget; not waiting for readiness (a starting process counts against it already)."""
        try:
            await self.scheduler.ensure(name, wait=False)
        except StartFailed as e:
            log.error("%s: not started: %s", name, e)

    async def _start_all(self) -> None:
        if self.scheduler.budget_mb <= 0:
            await self.supervisor.start_all()  # nothing to count: all at once, each adopting what already runs
        else:
            # Within a budget, one at a time: each start sees what the ones before it hold.
            for name in self.supervisor.names():
                if self.supervisor.get(name).spec.autostart:
                    await self._ensure(name)

    def start_background(self) -> None:
        # Big models load slowly: the proxy serves (and fails over) while managed backends come up.
        self._starts.spawn(self._start_all(), name="start-all")
        self.scheduler.start_idle_watch()

    def snapshot(self) -> dict[str, Any]:
        """The resident models against the budget (admin API, /metrics, corectl status and models)."""
        return self.scheduler.snapshot()

    def resolve(self, name: str) -> ManagedProcess | None:
        """A managed process by its own name or by the name of a provider it serves."""
        if name in self.supervisor.names():
            return self.supervisor.get(name)
        return self.supervisor.for_provider(name)

    async def action(self, name: str, action: str) -> dict:
        mp = self.resolve(name)
        if mp is None:
            raise KeyError(name)
        if action == "start":
            if mp.external:
                await mp.start()
            else:  # a fatal one too: started again by hand (its failures forgotten), within the budget
                try:
                    await self.scheduler.ensure(mp.spec.name, wait=False)  # within the budget: makes room first
                except StartFailed as e:
                    return {"ok": False, "message": f"{mp.spec.name} not started: {e}", "process": mp.snapshot()}
        elif action == "stop":
            if mp.external:
                await mp.stop()  # raises ExternalProcessError, which says where to stop it
            await self.scheduler.stop(mp.spec.name, "manual")  # pinned too: by hand is by hand
        elif action == "restart" and mp.state in (ProcessState.STOPPED, ProcessState.FATAL) and not mp.external:
            # Nothing runs: a restart is a start, and a start counts against the budget (making room first).
            try:
                await self.scheduler.ensure(mp.spec.name, wait=False)
            except StartFailed as e:
                return {"ok": False, "message": f"{mp.spec.name} not started: {e}", "process": mp.snapshot()}
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
        await self.scheduler.close()
        await self.supervisor.shutdown()
