"""The router's live state, shared by every profile: circuit breakers, latency/error figures, health,
adaptive orderers. The executor asks it for a plan and reports each attempt's outcome back."""

from __future__ import annotations

from collections.abc import Callable

from ..affinity.service import Affinity
from ..providers.errors import UpstreamError
from .adaptive import AdaptiveOrderer, AdaptiveSettings, ProbeScheduler, ProviderStats
from .breaker import BreakerRegistry, BreakerState
from .clock import Clock, SystemClock
from .planner import Plan, ProviderFacts, RequestFeatures, Skip, plan
from .request import ClientRequest


class Router:
    def __init__(self, config, *, clock: Clock | None = None,
                 on_breaker: Callable[[str, BreakerState, BreakerState, str], None] | None = None) -> None:
        self.clock = clock or SystemClock()
        self._on_breaker = on_breaker
        self.breakers = BreakerRegistry(failures=config.breaker.failures, recovery_s=config.breaker.recovery_s,
                                        clock=self.clock, on_transition=self._breaker_moved)
        self.settings = AdaptiveSettings(**config.adaptive.model_dump())
        self.stats = ProviderStats(self.settings, self.clock)
        self.probes = ProbeScheduler(self.stats, self.settings, self.clock)
        self._orderers: dict[str, AdaptiveOrderer] = {}
        # provider -> HEALTHY | DEGRADED | UNHEALTHY, written by the health monitor and self-healing.
        self.health: dict[str, str] = {}
        # provider -> bool, asked before planning a paid provider (the budget guard plugs in here).
        self.budget_ok: Callable[[str], bool] | None = None
        self.budget_hooks = None  # guards.apply.BudgetHooks when budgets are configured
        self.passive_failures: dict[str, int] = {}
        # Providers whose managed process is not ready (starting, restarting, stopped, fatal): never attempted.
        self.down: set[str] = set()
        self.on_passive: Callable[[str, int], None] | None = None
        # Prefix affinity (session lanes, slots, prefix index); its publish/persist are set by the daemon.
        self.affinity = Affinity(config)

    def _breaker_moved(self, name, old, new, reason) -> None:
        if self._on_breaker is not None:
            self._on_breaker(name, old, new, reason)

    def reconfigure(self, config) -> None:
        self.breakers.configure(config.breaker.failures, config.breaker.recovery_s)
        new = AdaptiveSettings(**config.adaptive.model_dump())
        for k, v in vars(new).items():
            setattr(self.settings, k, v)
        self.affinity.configure(config)

    def orderer(self, profile: str) -> AdaptiveOrderer:
        o = self._orderers.get(profile)
        if o is None:
            o = self._orderers[profile] = AdaptiveOrderer(self.stats, self.settings, self.clock)
        return o

    @staticmethod
    def facts(runtime) -> dict[str, ProviderFacts]:
        out = {}
        for name, p in runtime.providers.items():
            c = p.cfg
            out[name] = ProviderFacts(name=name, tools=c.capabilities.tools, vision=c.capabilities.vision,
                                      thinking=c.capabilities.thinking, context_window=c.context_window, paid=c.paid)
        return out

    def plan(self, profile_name: str, profile, runtime, req: ClientRequest, ticket=None) -> Plan:
        features = RequestFeatures(
            has_tools=req.has_tools(),
            has_images=req.has_images(),
            thinking_required=False,
            estimated_tokens=req.estimated_tokens(),
        )
        p = plan(
            list(profile.providers), runtime.facts, features,
            breakers=self.breakers, health=self.health, health_action=profile.health_action,
            orderer=self.orderer(profile_name) if profile.adaptive else None,
            budget_ok=self.budget_ok,
        )
        if self.down:
            for name in [c for c in p.candidates if c in self.down]:
                p.candidates.remove(name)
                p.skips.append(Skip(name, "unhealthy", f"{name}'s managed process is not ready"))
        if ticket is not None and (profile.mode == "race" or profile.adaptive):
            self._prefer_cached(p, ticket, runtime)
        return p

    def _prefer_cached(self, p: Plan, ticket, runtime) -> None:
        """Among providers the profile treats as equals (race, adaptive order), the one expected to answer
        first given what it has cached leads. Providers adaptive or health moved back stay behind."""
        moved_back = {n["provider"] for n in p.order_notes if n.get("moved") == "back"}
        equals = [c for c in p.candidates if c not in moved_back]
        rest = [c for c in p.candidates if c in moved_back]
        order, notes = self.affinity.prefer(equals, ticket, lambda n: runtime.providers[n].cfg.affinity)
        p.candidates = order + rest
        p.order_notes.extend(notes)

    def effective_order(self, profile_name: str, profile, runtime) -> Plan:
        return self.plan(profile_name, profile, runtime, ClientRequest(
            ingress="anthropic", body={}, raw=b"", headers={}, stream=False, model="", request_id="status"))

    # -- outcomes -------------------------------------------------------------------------------------------

    def admit(self, provider: str) -> bool:
        return self.breakers.get(provider).allow()

    def release(self, provider: str) -> None:
        self.breakers.get(provider).release()

    def report_success(self, provider: str, latency_s: float) -> None:
        self.breakers.get(provider).record_success()
        self.stats.record(provider, latency_s=latency_s, ok=True)
        # A real success clears passive failures, and also a DEGRADED/UNHEALTHY left by an earlier probe.
        if self.passive_failures.get(provider) or self.health.get(provider, "HEALTHY") != "HEALTHY":
            self.passive_failures[provider] = 0
            if self.on_passive is not None:
                self.on_passive(provider, 0)

    def report_failure(self, provider: str, e: UpstreamError, elapsed_s: float) -> None:
        br = self.breakers.get(provider)
        if e.counts_against_provider:
            br.record_failure(retry_after=e.retry_after, reason=e.label)
            self.stats.record(provider, latency_s=elapsed_s, ok=False)
            n = self.passive_failures.get(provider, 0) + 1
            self.passive_failures[provider] = n
            if self.on_passive is not None:
                self.on_passive(provider, n)
        else:
            br.release()

    def report_probe(self, provider: str, latency_s: float | None, ok: bool) -> None:
        self.stats.record(provider, latency_s=latency_s, ok=ok, probe=True)
