"""Prometheus metrics, fed from the event bus in its writer thread (never on the request path), plus gauges
read at scrape time (budget spend, managed processes, and each configured provider's breaker, health and
lifecycle: there from the start, not only once a provider has changed state)."""

from __future__ import annotations

import hmac
from collections import Counter as Counter_
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..routing.state import DEGRADED, HEALTHY, UNHEALTHY
from ..state.events import (
    GuardFired,
    ProcessEvent,
    ProcessEventName,
    RequestFinished,
    moved_past,
)
from ..state.refusals import UnnamedRefusal, is_refusal, reason_of
from ..upstream.lifecycle import Phase

if TYPE_CHECKING:
    from ..affinity.service import Affinity
    from ..routing.router import Router
    from ..runtime import Runtime
    from ..supervise.from_config import Processes

# The kinds are the event classes' own constants: a hand-typed "process_event" once matched nothing, and
# the restart counter stayed absent for the daemon's whole life.
_REQUEST, _PROCESS, _GUARD = RequestFinished.kind, ProcessEvent.kind, GuardFired.kind
_UNNAMED = UnnamedRefusal.kind
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1)
_BREAKER_VALUE = {"closed": 0, "half_open": 1, "open": 2}
_HEALTH_VALUE = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}


class Snapshotted(Protocol):
    def snapshot(self) -> dict[str, Any]: ...


class MetricsSource(Protocol):
    """What /metrics reads at scrape time: the daemon hands itself in (it is above observe/, which names it by
    this protocol rather than importing it back)."""

    @property
    def runtime(self) -> Runtime: ...

    @property
    def budget(self) -> Snapshotted: ...

    @property
    def processes(self) -> Processes | None: ...

    @property
    def affinity(self) -> Affinity: ...

    @property
    def in_flight(self) -> dict[str, int]: ...

    @property
    def browser_refused(self) -> dict[str, int]: ...

    @property
    def router(self) -> Router: ...

    @property
    def active_profile(self) -> str: ...


class Metrics:
    # `key`: the team key's name on requests, tokens, cost and refusals; "" for a request no team key came with
    # (Prometheus reads an empty label as an absent one, so queries written before keys existed still match).
    def __init__(self, daemon: MetricsSource) -> None:
        self.daemon = daemon
        r = self.registry = CollectorRegistry()
        self.requests = Counter("coderouter_requests_total", "Requests served", ["ingress", "profile", "provider",
                                                                                "status", "key"], registry=r)
        self.attempts = Counter("coderouter_attempts_total", "Upstream attempts by outcome and reason",
                                ["provider", "outcome", "reason"], registry=r)
        self.failovers = Counter("coderouter_failovers_total", "Requests that moved past a failed provider",
                                 ["profile", "reason"], registry=r)
        self.latency = Histogram("coderouter_request_duration_seconds", "End-to-end request latency",
                                 ["ingress", "provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttfb = Histogram("coderouter_time_to_first_byte_seconds", "Upstream time to first byte",
                              ["provider"], buckets=_LATENCY_BUCKETS, registry=r)
        self.overhead = Histogram("coderouter_overhead_seconds", "Router overhead: latency minus upstream wait",
                                  ["ingress"], buckets=_OVERHEAD_BUCKETS, registry=r)
        self.tokens = Counter("coderouter_tokens_total", "Tokens by kind", ["provider", "kind", "key"], registry=r)
        self.cost = Counter("coderouter_cost_usd_total", "Spend in USD from declared prices", ["provider", "key"],
                            registry=r)
        self.refusals = Counter("coderouter_refusals_total", "Requests refused before a provider served them: a "
                                "team key's refusal (key_*), a spent budget, a 401/403, the router's own 429",
                                ["key", "reason"], registry=r)
        self.restarts = Counter("coderouter_process_restarts_total", "Managed process restarts", ["process"],
                                registry=r)
        self.guards = Counter("coderouter_guard_fired_total", "Guards fired", ["guard", "action"], registry=r)
        self.cache_busts = Counter("coderouter_cache_busts_total", "Turns that reused far less prefix than expected",
                                   ["provider", "cause"], registry=r)
        r.register(_ScrapeTimeCollector(daemon))

    def sink(self, events: list) -> None:
        # Counters are summed per batch first: one labels()/inc() per label set instead of per request keeps
        # the writer thread (which shares the GIL with the proxy) cheap.
        requests: Counter_ = Counter_()
        attempts: Counter_ = Counter_()
        failovers: Counter_ = Counter_()
        tokens: Counter_ = Counter_()
        refusals: Counter_ = Counter_()
        cost: dict[tuple[str, str], float] = {}
        # The histograms' labelled children, looked up once per batch: `labels()` (a lock, a validation) cost more
        # than the observation itself, three times per request.
        latency: dict[tuple[str, str], Any] = {}
        ttfb: dict[str, Any] = {}
        overhead: dict[str, Any] = {}
        for ev in events:
            kind = ev.kind
            if kind == _REQUEST:
                prov = ev.provider or "none"
                ingress = ev.ingress
                key = ev.key_name or ""
                requests[(ingress, ev.profile, prov, str(ev.status), key)] += 1
                child = latency.get((ingress, prov))
                if child is None:
                    child = latency[(ingress, prov)] = self.latency.labels(ingress, prov)
                child.observe(ev.latency_ms / 1000)
                if ev.ttfb_ms is not None and ev.provider:
                    child = ttfb.get(prov)
                    if child is None:
                        child = ttfb[prov] = self.ttfb.labels(prov)
                    child.observe(ev.ttfb_ms / 1000)
                child = overhead.get(ingress)
                if child is None:
                    child = overhead[ingress] = self.overhead.labels(ingress)
                child.observe(max(0.0, ev.overhead_ms) / 1000)
                for a in ev.attempts:
                    attempts[(a["provider"], a["outcome"], a["reason"])] += 1
                for a in moved_past(ev.attempts, bool(ev.provider)):
                    failovers[(ev.profile, a["reason"])] += 1
                if ev.provider:
                    for k, v in (("input", ev.input_tokens), ("output", ev.output_tokens),
                                 ("cache_read", ev.cache_read_tokens), ("cache_write", ev.cache_write_tokens)):
                        if v:
                            tokens[(prov, k, key)] += v
                    if ev.cost_usd:
                        cost[(prov, key)] = cost.get((prov, key), 0.0) + ev.cost_usd
                elif ev.status >= 400 and is_refusal(None, ev.status, ev.error_class, ev.attempts):
                    refusals[(key, reason_of(ev.status, ev.error_class))] += 1
            elif kind == _PROCESS and ev.event == ProcessEventName.RESTARTING and ev.primary:
                self.restarts.labels(ev.process or ev.provider).inc()
            elif kind == _GUARD:
                self.guards.labels(ev.guard, ev.action).inc()
            elif kind == "cache_bust":
                self.cache_busts.labels(ev.provider, ev.cause).inc()
            elif kind == _UNNAMED:
                refusals[("", ev.reason)] += 1
        # The requests counter moves last: a scrape runs on the loop while this runs in the writer thread, so a
        # scraper that sees a batch's requests must also see that batch's attempts, failovers, tokens and cost.
        for labels, usd in cost.items():
            self.cost.labels(*labels).inc(usd)
        for metric, counts in ((self.attempts, attempts), (self.failovers, failovers), (self.tokens, tokens),
                               (self.refusals, refusals), (self.requests, requests)):
            for labels, n in counts.items():
                metric.labels(*labels).inc(n)

    def authorized(self, scope) -> bool:
        token = self.daemon.runtime.config.metrics.bearer_token
        if not token:
            return True
        for k, v in scope["headers"]:
            if k == b"authorization":
                given = v.decode("latin-1")
                return given.lower().startswith("bearer ") and hmac.compare_digest(given[7:].strip().encode(),
                                                                                    token.encode())
        return False

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _ScrapeTimeCollector:
    """Figures that are cheapest to read when someone asks: budget spend and managed process state."""

    def __init__(self, daemon: MetricsSource) -> None:
        self.daemon = daemon

    def collect(self):
        spend = GaugeMetricFamily("coderouter_budget_spend_usd", "Spend this calendar month", labels=["provider"])
        cap = GaugeMetricFamily("coderouter_budget_cap_usd", "Monthly cap (0 = none)", labels=["provider"])
        snap = self.daemon.budget.snapshot()
        for name, b in snap.get("providers", {}).items():
            spend.add_metric([name], b.get("spent") or 0.0)
            cap.add_metric([name], b.get("cap") or 0.0)
        g = snap.get("global", {})
        spend.add_metric(["*"], g.get("spent") or 0.0)
        cap.add_metric(["*"], g.get("cap") or 0.0)
        yield spend
        yield cap
        up = GaugeMetricFamily("coderouter_process_up", "Managed process ready (1) or not (0)", labels=["process"])
        procs = self.daemon.processes
        if procs is not None:
            for name, snap in procs.supervisor.snapshot().items():
                up.add_metric([name], 1.0 if snap.get("state") == "ready" else 0.0)
        yield up
        yield from self._models()
        # Prefix affinity: token-weighted prompt cache hit ratio, from what each backend reported it reused.
        prompt = CounterMetricFamily("coderouter_prefix_prompt_tokens", "Prompt tokens on backends that report "
                                     "their prompt cache", labels=["provider"])
        cached = CounterMetricFamily("coderouter_prefix_cached_tokens", "Prompt tokens served from the backend's "
                                     "prefix cache", labels=["provider"])
        ratio = GaugeMetricFamily("coderouter_prefix_cache_hit_ratio", "Cached / prompt tokens (token-weighted)",
                                  labels=["provider"])
        for name, p in self.daemon.affinity.index.providers.items():
            if not p.prompt_tokens:
                continue
            prompt.add_metric([name], p.prompt_tokens)
            cached.add_metric([name], p.cached_tokens)
            ratio.add_metric([name], p.cached_tokens / p.prompt_tokens)
        yield prompt
        yield cached
        yield ratio
        yield from _slot_files(self.daemon.affinity.warm)
        yield _availability(self.daemon)
        yield from _upstreams(self.daemon)
        in_flight = GaugeMetricFamily("coderouter_requests_in_flight", "Model requests being served now",
                                      labels=["ingress"])
        for ingress, n in sorted(self.daemon.in_flight.items()):
            in_flight.add_metric([ingress], n)
        yield in_flight
        refused = CounterMetricFamily("coderouter_browser_refused", "Requests refused as a web page's: a foreign "
                                      "Host, a cross-site Origin, or a body not declared as JSON", labels=["reason"])
        for reason, n in sorted(self.daemon.browser_refused.items()):
            refused.add_metric([reason], n)
        yield refused

    def _models(self):
        """Local models on demand: what is resident, the memory held against the budget, idle time to each
        stop, and why each last stopped (idle, room for X, reload, crash, manual)."""
        procs = self.daemon.processes
        if procs is None:
            return
        snap = procs.snapshot()
        budget = GaugeMetricFamily("coderouter_models_memory_budget_mb", "[models] memory_budget_mb (0 = no limit)")
        budget.add_metric([], snap["memory_budget_mb"])
        held = GaugeMetricFamily("coderouter_models_memory_held_mb", "Memory held by resident managed processes")
        held.add_metric([], snap["memory_held_mb"])
        resident = GaugeMetricFamily("coderouter_process_resident", "Managed process holds its memory (1) or not",
                                     labels=["process"])
        mem = GaugeMetricFamily("coderouter_process_memory_mb", "Memory a managed process holds once loaded "
                                "(configured or estimated)", labels=["process"])
        idle = GaugeMetricFamily("coderouter_process_idle_stop_in_seconds", "Seconds until the idle stop, if "
                                 "nothing uses it", labels=["process"])
        last = GaugeMetricFamily("coderouter_process_last_stop", "The reason of the last stop (value 1)",
                                 labels=["process", "reason"])
        waiting = GaugeMetricFamily("coderouter_process_waiting_requests", "Requests held for their turn at a "
                                    "stopped model (swap_hold_s, a busy model, a load under way)",
                                    labels=["process"])
        load = GaugeMetricFamily("coderouter_process_load_seconds", "Load time learned from its own starts",
                                 labels=["process"])
        swaps = CounterMetricFamily("coderouter_models_swaps", "Starts that stopped another model to make room")
        swaps.add_metric([], snap.get("swaps", 0))
        sup = procs.supervisor.snapshot()
        for name, p in snap["processes"].items():
            resident.add_metric([name], 1.0 if p["resident"] else 0.0)
            mem.add_metric([name], p["memory_mb"])
            if p["idle_stop_in_s"] is not None:
                idle.add_metric([name], p["idle_stop_in_s"])
            reason = (sup.get(name) or {}).get("last_stop_reason")
            if reason:
                last.add_metric([name, reason], 1.0)
            waiting.add_metric([name], p.get("waiting", 0))
            if p.get("load_s") is not None:
                load.add_metric([name], p["load_s"])
        yield from (budget, held, resident, mem, idle, last, waiting, load, swaps)

def _availability(daemon: MetricsSource) -> GaugeMetricFamily:
    """Whether each provider can take traffic (1) or not (0), labelled with why as a short code (the words are in
    `corectl status` and the dashboard): the same answer, from routing/availability.py."""
    fam = GaugeMetricFamily("coderouter_provider_available", "Provider can take traffic now (1) or not (0); "
                            "reason: ok, degraded, kept_in_rotation, half_open, unhealthy, held, breaker_open, "
                            "retry_after, memory_cooldown, budget, budget_skipped, not_ready, starting, on_demand, "
                            "cannot_start, panic",
                            labels=["provider", "reason"])
    for name, a in daemon.router.providers_availability(daemon.runtime, daemon.active_profile).items():
        fam.add_metric([name, a.code.value], 1.0 if a.available else 0.0)
    return fam


def _upstreams(daemon: MetricsSource):
    """Every configured provider's breaker, health and lifecycle, read from its Upstream at scrape time (E14: a
    provider that never changed state is there too, closed and healthy, rather than absent)."""
    breaker = GaugeMetricFamily("coderouter_breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open",
                                labels=["provider"])
    health = GaugeMetricFamily("coderouter_health_state", "Health: 0 healthy, 1 degraded, 2 unhealthy",
                               labels=["provider"])
    phase = GaugeMetricFamily("coderouter_upstream_lifecycle", "The upstream's lifecycle phase (value 1): "
                              + ", ".join(p.value for p in Phase), labels=["provider", "phase"])
    in_flight = GaugeMetricFamily("coderouter_upstream_in_flight", "Requests in flight on the upstream (the one "
                                  "count residency and affinity read)", labels=["provider"])
    providers = daemon.runtime.providers
    if providers:
        state = daemon.router.state
        for name in providers:
            up = state.upstream(name)
            breaker.add_metric([name], _BREAKER_VALUE.get(str(up.breaker.state), 0))
            health.add_metric([name], _HEALTH_VALUE.get(state.health_of(name) or HEALTHY, 0))
            phase.add_metric([name, up.phase.value], 1.0)
            in_flight.add_metric([name], up.in_flight)
    yield from (breaker, health, phase, in_flight)


def _slot_files(warm):
    """Managed llama-servers' slot saves and restores (kvcache/): what keeping caches warm costs."""
    fams = {
        "saves": CounterMetricFamily("coderouter_slot_saves", "Slot KV caches saved to disk", labels=["provider"]),
        "save_bytes": CounterMetricFamily("coderouter_slot_save_bytes", "Bytes of slot KV caches written",
                                          labels=["provider"]),
        "save_s": CounterMetricFamily("coderouter_slot_save_seconds", "Time spent saving slots",
                                      labels=["provider"]),
        "restores": CounterMetricFamily("coderouter_slot_restores", "Slot KV caches restored from disk",
                                        labels=["provider"]),
        "restore_bytes": CounterMetricFamily("coderouter_slot_restore_bytes", "Bytes of slot KV caches read",
                                             labels=["provider"]),
        "restore_s": CounterMetricFamily("coderouter_slot_restore_seconds", "Time spent restoring slots",
                                         labels=["provider"]),
    }
    failures = CounterMetricFamily("coderouter_slot_action_failures", "Slot saves and restores the server refused "
                                   "or did not answer", labels=["provider", "action"])
    # Restores checked, not trusted (kvcache/cache.py): refused before the server saw the file (its size is not
    # its sidecar's, or it is gone), or accepted by the server and disproved by the answer's cached tokens.
    unproven = CounterMetricFamily("coderouter_slot_restores_unproven", "Slot restores that did not bring the "
                                   "lane's cache back", labels=["provider", "why"])
    for name, st in sorted(warm.stats.items()):
        for field, fam in fams.items():
            fam.add_metric([name], getattr(st, field))
        failures.add_metric([name, "save"], st.save_failures)
        failures.add_metric([name, "restore"], st.restore_failures)
        unproven.add_metric([name, "refused"], st.restores_refused)
        unproven.add_metric([name, "not_taken"], st.restores_not_taken)
    yield from fams.values()
    yield failures
    yield unproven
    disk = GaugeMetricFamily("coderouter_slot_files_bytes", "Disk held by coderouterd's slot files (max_saved_mb)")
    disk.add_metric([], warm.disk_bytes)
    yield disk
