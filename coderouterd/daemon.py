"""Composition root: builds every part of the daemon from the configuration and owns their lifetimes."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import TYPE_CHECKING

from . import __version__
from .affinity.service import Affinity
from .after_response import AfterResponse
from .cluster.backend import build as build_backend
from .config import ConfigError, LoadedConfig, load_config, state_dir
from .guards.apply import BudgetHooks, apply_tool_loop, warn_tool_loop
from .guards.key_limits import KeyGuard
from .guards.output_limit import apply_default_max_tokens
from .health.process_news import ProcessNews
from .health.ram_watch import RamWatch
from .ingress.auth import KeyGate
from .keys.registry import KeyRegistry
from .keys.service import KeyService
from .observe.finish import RequestFinisher
from .observe.metrics_http import LazyMetrics
from .observe.request_record import RequestRecorder
from .observe.traces import RecentTraces
from .persisted import PersistedState
from .providers.pinning import NOT_READY, Verified
from .providers.server_info import ServerDirectory
from .quality.drift_actions import DriftManager
from .reload import changed_sections, listener_change_refused, shared_state_change_refused, warn_reload_risks
from .routing.router import Router
from .routing.state import RoutingState
from .runtime import Runtime, UnknownProfile, build_runtime, close_pools
from .state import ConfigRejected, ConfigReloaded, DaemonLifecycle, ProfileSwitched
from .state.repair_stats import RepairStats
from .tasks import TaskSet
from .telemetry import Telemetry
from .ui.feed import LiveFeed
from .warmup import warm_imports

if TYPE_CHECKING:
    from .cluster.budget import SharedBudget
    from .config.schema import ConfigModel
    from .guards.budget import Budget
    from .health.monitor import HealthMonitor
    from .health.selfheal import SelfHealer
    from .ingress.protocol import Limits
    from .routing.executor import Exchange
    from .routing.record import RequestRecord
    from .supervise.from_config import Processes
    from .supervise.registry import Supervisor

log = logging.getLogger("coderouterd")


class Daemon:
    def __init__(self, loaded: LoadedConfig, *, state_unusable: str | None = None,
                 connection_limits: Limits | None = None) -> None:
        """`state_unusable`: why the state directory cannot be used (serve.py found it so), for memory-only
        state reported in status; None when it can. `connection_limits`: the proxy's ingress.protocol.Limits,
        which a reload updates (None when no proxy listens, as in tests)."""
        self.version = __version__
        self.pid = os.getpid()
        self.started_at = time.time()
        self._loaded = loaded
        cfg = loaded.model
        # Built whole here, started in startup(): the constructors do no I/O. Only what is imported and built
        # once the proxy listens (the health monitor and self-healer, _start_background) and what the config
        # may not have (managed processes) is None, typed so.
        # A managed provider's pool connects only where its server's READY check saw it listen (issue 43, N9).
        self.runtime: Runtime = build_runtime(loaded, pins=self._verified_listeners)
        self.telemetry = t = Telemetry(state_dir(cfg), cfg, unusable=state_unusable)
        self.persisted = persisted = PersistedState(t.store, t.publish)
        self.routing = RoutingState(cfg, on_breaker=persisted.breaker_moved, on_health=persisted.health_moved)
        self.tasks = TaskSet()  # every background task outside a request, awaited at shutdown
        # What is shared with other instances (README: Several machines): nothing with the default backend.
        self.shared = build_backend(cfg.state, state_dir=t.state_dir, version=self.version, tasks=self.tasks,
                                    publish=t.publish, journal_db=t.journal_path,
                                    info=self._shared_info)
        self.shared.attach_routing(self.routing)
        # finish(ex) and other bookkeeping run here, once the answer is out (see after_response.py)
        self.after_response = AfterResponse()
        # Prefix affinity; its index is restored from the store once the store is open (startup).
        # What each provider's server says about itself (kind, context window, slots): the context gate and
        # prefix affinity share it, so each server is asked once.
        self.servers = ServerDirectory(timeout_s=cfg.affinity.probe_timeout_s)
        self.affinity = Affinity(cfg, publish=t.publish, persist=persisted.affinity_changed, servers=self.servers,
                                 in_flight=lambda name: self.routing.upstream(name).in_flight)
        # The shared ledger's with [state] backend = "postgres"; reads its month from the store on first use (once
        # startup() has opened the store and configured it).
        self.budget: Budget | SharedBudget = self.shared.budget(t.store, t.publish)
        # Team keys' rpm, tpm and concurrency: this instance's windows, or leases across instances (postgres).
        self.key_guard = KeyGuard(self.shared.key_limits(), t.publish)
        # Team keys (issue 41): the registry requests are checked against, filled from the store at startup (and
        # kept fresh from the shared database with [state] backend = "postgres").
        self.keys = KeyRegistry()
        self.key_gate = KeyGate(self.keys, t.publish)
        self.key_service = KeyService(self.keys, self.shared.key_storage(t.store, self.keys), t.publish)
        self.active_profile = loaded.model.server.default_profile
        self.listen = (loaded.model.server.host, loaded.model.server.port)
        self.last_reload_error: str | None = None
        self.connection_limits = connection_limits
        self.started = False  # startup() has run to its end: the store is open, a reload may apply
        self._shut_down = False
        self.recent = RecentTraces()  # request id -> decision trace, newest last, for `corectl explain`
        self._recorder = RequestRecorder(t.publish)
        # ingress -> model requests being served now (the proxy counts them in and out on the event loop)
        self.in_flight: dict[str, int] = {"anthropic": 0, "openai": 0, "responses": 0, "gemini": 0}
        self.requests_now: dict[str, RequestRecord] = {}  # request id -> its record while served (admin/inflight.py)
        # Requests refused at the edge as a browser's (ingress/browsers.py), by reason: shown in /metrics.
        self.browser_refused: dict[str, int] = {"host": 0, "origin": 0, "content_type": 0}
        self.health: HealthMonitor | None = None  # once the proxy listens (_start_background)
        self.selfheal: SelfHealer | None = None  # likewise
        self.processes: Processes | None = None  # when any provider has a process block
        # What a process event says beyond routing (audit, a fresh server's hooks), from the first event on: the
        # upstreams registry hears each event first (supervise/from_config.Processes), self-healing after.
        self.process_news = ProcessNews(supervisor=self._supervisor, publish=t.publish,
                                        fresh_start=self.affinity.server_restarted, ready=self._server_ready)
        self._served: dict[str, list[str]] = {}  # process -> the providers it serves (kvcache/'s saves)
        self.metrics = LazyMetrics(self)
        self.metrics_endpoint = self.metrics.endpoint  # GET /metrics (ingress dispatches it)
        self.repair_stats = RepairStats()
        # The dashboard's live feed (ui/feed.py): fed by the bus's writer thread, idle while nobody watches.
        self.live = LiveFeed()
        self.ram_watch = RamWatch(low_mb=cfg.memory.low_available_mb, interval_s=cfg.memory.sample_interval_s,
                                  publish=t.publish)
        self.drift = DriftManager(lambda: self.runtime, healer=lambda: self.selfheal, publish=t.publish)
        self.router = Router(self.routing, budget=BudgetHooks(self.budget), affinity=self.affinity,
                             servers=self.servers, memory_cooldown_s=cfg.memory.cooldown_s,
                             order_adjusters=[self.drift.adjust_order, self._memory_order])
        self._finisher = RequestFinisher(self._recorder, self.recent, drift=self.drift)
        self._background: asyncio.Task | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def startup(self) -> None:
        t = self.telemetry
        t.bus.subscribe(self.metrics.sink)
        t.bus.subscribe(self.repair_stats.sink)
        t.start()
        # After the journal's sink (subscribed by start()): a browser told of a request finds its row already written.
        t.bus.subscribe(self.live.sink)
        cfg = self._loaded.model
        self.persisted.restore_routing(self.routing,
                                       managed={p for p in cfg.providers if cfg.process_for(p) is not None})
        self.persisted.restore_affinity(self.affinity)
        warn_reload_risks(cfg)
        self.load_persisted_profile()
        if _has_processes(cfg):
            await self._start_processes(cfg)
        t.publish(DaemonLifecycle(event="start", pid=self.pid, version=self.version))
        self._configure_budget(cfg)
        self.key_service.storage.load()
        self._log_access(cfg)
        await self.shared.start()
        self.tasks.spawn(self.key_service.run(), name="keys")
        self._background = self.tasks.spawn(self._start_background(), name="start-background")
        self.started = True

    async def _start_processes(self, cfg: ConfigModel) -> None:
        """The managed processes and their on-demand scheduler exist before the proxy answers: a request that
        arrives first can start an on-demand model, and waits for an autostarted one instead of being tried at
        once and counted as a failure. Nothing is spawned here (start_background does, once self-healing, which
        receives the supervisor's events after the upstreams registry, exists)."""
        from .kvcache.disk import ensure_slot_dir
        from .supervise.from_config import Processes, ambiguous_hosts, slot_budget_notes

        if cfg.affinity.enabled and cfg.affinity.manage_slot_save:
            await asyncio.to_thread(ensure_slot_dir, state_dir(cfg))
            self.affinity.kvcache.tell_budget(await asyncio.to_thread(slot_budget_notes, cfg))
        for note in await asyncio.to_thread(ambiguous_hosts, cfg):  # once, at start (resolves names: off the loop)
            log.warning("%s", note)
        processes = self.processes = Processes(state_dir(cfg) / "logs", self.telemetry.store,
                                               on_event=self._process_event,
                                               before_stop=self.affinity.warm.before_stop,
                                               upstreams=self.routing.upstreams)
        processes.apply(cfg)
        self._wire_warm(cfg)
        await processes.configure(cfg)
        # Before the proxy answers: a request must never start a model beside one a killed daemon left running.
        # An adopted process is running: await_first_starts leaves it (and its upstreams) as it is.
        await processes.adopt_leftovers()
        processes.await_first_starts(cfg)

    def _process_event(self, name, event, pid, detail) -> None:
        """After the upstreams registry (routing) has heard it: the audit and hooks, then self-healing (which
        finds what it missed in the registry when it starts)."""
        self.process_news(name, event, pid, detail)
        if self.selfheal is not None:
            self.selfheal.react(name, event, detail)

    async def _start_background(self) -> None:
        """What can wait until the proxy answers: the upstream HTTP stack and everything that probes or
        supervises. Imported in a thread (~0.3 s of CPU for aiohttp alone), so /healthz answers meanwhile;
        a request that arrives first simply waits for the import it needs."""
        await asyncio.to_thread(warm_imports)
        from .health.monitor import HealthMonitor
        from .health.selfheal import SelfHealer

        t = self.telemetry
        self.health = health = HealthMonitor(self.routing, lambda: self.runtime, tasks=self.tasks)
        # Its process news (audit, hooks) is the daemon's, from the first event on: it only reacts (react).
        self.selfheal = selfheal = SelfHealer(self.routing, health, supervisor=self._supervisor,
                                              runtime=lambda: self.runtime, publish=t.publish)
        selfheal.start()
        if self.processes is not None:
            self.processes.start_background()
        health.start()
        self.ram_watch.start()
        self.servers.start(self.runtime.providers.values())
        from .interpreter import settle

        settle()

    def _log_access(self, cfg: ConfigModel) -> None:
        """Who may call, said once at start: team keys required or not, and what other machines get (N13)."""
        from .ingress.browsers import remote_access

        counts = self.keys.counts()
        if self.keys.required:
            log.info("team keys: %d active, %d expired, %d revoked; every request needs a key (loopback included)",
                     counts["active"], counts["expired"], counts["revoked"])
        log.info("%s", remote_access(cfg.server.host, cfg.server.allowed_hosts))

    def _shared_info(self) -> dict:
        """What this instance's heartbeat row says about it, beyond its name and pid."""
        return {"listen": f"{self.listen[0]}:{self.listen[1]}"}

    def _supervisor(self) -> Supervisor | None:
        return self.processes.supervisor if self.processes is not None else None

    def _verified_listeners(self, provider: str) -> Verified | None:
        """What the last READY of a managed provider's server verified it holds (providers/pinning.py); nothing
        while its process is not known yet."""
        mp = self.processes.supervisor.for_provider(provider) if self.processes is not None else None
        return mp.verified() if mp is not None else NOT_READY

    # -- control (called by the admin API) -------------------------------------------------------------------

    @property
    def config_path(self) -> str:
        return self._loaded.path

    def use_profile(self, name: str, source: str = "corectl") -> tuple[str, str]:
        """Switch the active profile for new requests. Returns (old, new). Raises UnknownProfile."""
        runtime = self.runtime
        if name not in runtime.config.profiles:
            raise UnknownProfile(name, runtime.profile_names)
        old = self.active_profile
        self.active_profile = name
        self.persist_active_profile()
        self._publish(ProfileSwitched(old=old, new=name, source=source))
        return old, name

    def persist_active_profile(self) -> None:
        """Keep the active profile across restarts, in the state store (written by its own thread, within the
        flush interval; never on the event loop, never raising)."""
        self.persisted.set_active_profile(self.active_profile)

    def load_persisted_profile(self) -> str | None:
        """At start: take the profile chosen by `corectl profile use` before the restart, if the current
        config still has it. Returns the profile applied, or None."""
        name = self.persisted.active_profile()
        if name is None:
            return None
        if name not in self._loaded.model.profiles:
            log.warning("persisted active profile %r is not in the configuration; using %r", name,
                        self.active_profile)
            return None
        self.active_profile = name
        log.info("active profile %r (restored)", name)
        return name

    async def reload(self, source: str = "corectl") -> dict:
        """Re-read the config file and swap it in atomically. The old config stays on any error."""
        if self._loaded.is_embedded:
            return {"ok": True, "changed": [], "message": "running on the embedded default; nothing to reload"}
        try:
            # Reading and validating the file happens in a thread; only the swap runs on the event loop.
            loaded = await asyncio.to_thread(load_config, self._loaded.path)
        except ConfigError as e:
            return self._reject_reload(str(e))
        refused = (listener_change_refused(self.listen, loaded.model.server)
                   or shared_state_change_refused(self._loaded.model.state, loaded.model.state))
        if refused:
            return self._reject_reload(f"{self._loaded.path}: {refused}")
        old = self.runtime
        changed = changed_sections(old.config, loaded.model)
        self.runtime = build_runtime(loaded, previous=old, pins=self._verified_listeners)
        warn_reload_risks(loaded.model)
        self._loaded = loaded
        self.router.reconfigure(loaded.model)
        if self.health is not None:  # started: ask new or moved servers now (the upstream stack is loaded)
            self.servers.start(self.runtime.providers.values())
        self.drift.reconfigure(loaded.model)
        self.ram_watch.reconfigure(loaded.model)
        if self.connection_limits is not None:
            self.connection_limits.update(loaded.model.server)
        self._configure_budget(loaded.model)
        self.last_reload_error = None
        self._reload_processes(loaded.model)
        self._publish(ConfigReloaded(path=loaded.path, changed=changed))
        if self.active_profile not in loaded.model.profiles:
            fallback = loaded.model.server.default_profile
            log.warning("active profile %r disappeared in the reload; falling back to %r", self.active_profile, fallback)
            self.active_profile = fallback
            self.persist_active_profile()
        return {"ok": True, "changed": changed}

    def reload_failed(self, reason: str) -> None:
        """A reload ended in our own error (the watcher reports it); status shows it as last_reload_error."""
        self.last_reload_error = reason

    def _reject_reload(self, reason: str) -> dict:
        # apply_reload logs the outcome (one line); status shows it as last_reload_error.
        self.last_reload_error = reason
        self._publish(ConfigRejected(path=self._loaded.path, reason=reason))
        return {"ok": False, "error": reason}

    def _server_ready(self, providers: list[str]) -> None:
        """A managed server answers: ask it now what it is (context window, slots), whatever an earlier probe of
        the starting process concluded."""
        for name in providers:
            p = self.runtime.providers.get(name)
            if p is not None:
                self.servers.forget(name)
                self.servers.refresh(p)

    def _publish(self, event) -> None:
        self.telemetry.publish(event)

    def _reload_processes(self, cfg: ConfigModel) -> None:
        if self.processes is None and _has_processes(cfg):
            from .supervise.from_config import Processes

            self.processes = Processes(state_dir(cfg) / "logs", self.telemetry.store, on_event=self._process_event,
                                       before_stop=self.affinity.warm.before_stop, upstreams=self.routing.upstreams)
        if self.processes is not None:
            self._wire_warm(cfg)
            self.tasks.spawn(self.processes.reload(cfg), name="processes-reload")

    def _wire_warm(self, cfg: ConfigModel) -> None:
        """Which providers' slot files live in coderouterd's slot directory (their server was given it), so
        kvcache/ saves their slots before stops and when idle, and restores them after."""
        from .kvcache.disk import slot_dir
        from .servers.llamacpp import saves_to
        from .supervise.from_config import specs_from_config

        directory = slot_dir(state_dir(cfg))
        specs = specs_from_config(cfg)
        managed = {p for spec, providers in specs.values() if saves_to(spec.command, directory) for p in providers}
        # Which providers a process serves, kept from the previous config too: a reload stops a process it dropped
        # or changed (saving its slots first) after the supervisor has forgotten what it served.
        self._served.update({name: list(providers) for name, (_, providers) in specs.items()})
        served = self._served
        warm = self.affinity.warm
        warm.wire(directory=directory if managed else None, provider=lambda name: self.runtime.providers.get(name),
                  served_by=lambda process: served.get(process, []), managed=managed.__contains__)
        if managed:
            warm.start()  # the background saves, and the disk budget over what a previous run left

    async def shutdown(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self.after_response.drain()
        if self._background is not None and not self._background.done():
            self._background.cancel()
            await asyncio.gather(self._background, return_exceptions=True)
        await self.ram_watch.stop()
        await self.drift.stop()
        if self.selfheal is not None:
            await self.selfheal.stop()
        await self.shared.stop()  # settles queued, the journal's last batch shipped, gone from the live list
        await self.tasks.close()
        await self.affinity.stop()
        await self.router.balancer.stop()  # its /slots readings use the providers' pools, closed below
        await self.servers.stop()
        if self.processes is not None:
            await self.processes.shutdown()
        await close_pools(self.runtime)
        self.after_response.drain()  # requests the server finished while the parts above stopped
        self.affinity.flush()
        self.telemetry.publish(DaemonLifecycle(event="stop", pid=self.pid, version=self.version))
        self.telemetry.stop()

    def _memory_order(self, profile, candidates: list[str]) -> list[dict]:
        if not self.ram_watch.low:  # no pressure (nearly always): nothing to move, no closure to build
            return []
        providers = self.runtime.providers
        return self.ram_watch.adjust_order(profile, candidates,
                                           lambda name: name in providers and providers[name].cfg.is_local())

    # -- request hooks --------------------------------------------------------------------------------------

    def _configure_budget(self, cfg: ConfigModel) -> None:
        self.budget.configure(cfg.providers, global_cap_usd=cfg.budget.global_monthly_usd,
                              warn_ratio=cfg.budget.warn_ratio)

    async def guard_request(self, ex: Exchange) -> bool:
        """Guards that act before routing. True when a guard already answered the request."""
        apply_default_max_tokens(ex)  # first: a key's token estimate reads the limit the request will carry
        if ex.req.key is not None and await self.key_guard.admit(ex):
            return True
        return await apply_tool_loop(ex, self.telemetry.publish)

    def guard_after_answer(self, ex: Exchange) -> None:
        """Guards that only report (the tool-loop guard with action = warn): run once the answer is out, from
        the deferred bookkeeping, before the request's record is finished."""
        warn_tool_loop(ex, self.telemetry.publish)

    def finish(self, record: RequestRecord) -> None:
        """After every request (ingress calls it with the request's record): see observe/finish.py."""
        self._finisher(record)


def _has_processes(cfg: ConfigModel) -> bool:
    # Checked without importing the supervisor: most setups own no process, and start-up time matters.
    return any(p.process is not None for p in cfg.providers.values())
