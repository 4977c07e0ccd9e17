"""Planning and outcome reporting over the routing state: the executor asks for a plan, admits each attempt, and
reports how it ended. What counts against a provider is decided here and in providers/errors.py, nowhere else:
only the backend's own failures count; errors the request caused and our own exceptions never do."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import replace
from inspect import isawaitable
from typing import TYPE_CHECKING, Protocol

from ..affinity.service import Affinity, Placement, Ticket
from ..providers.errors import MEMORY_PRESSURE, UpstreamError
from ..providers.server_info import ServerDirectory
from ..translate.unsigned_thinking import SignatureBook, UpstreamSignatures
from ..upstream.breaker import BreakerRegistry, BreakerState
from ..upstream.lifecycle import Phase
from ..upstream.upstream import CLOSED, PANIC, TRIAL, Lease, Starter
from .adaptive import AdaptiveOrderer, ProbeScheduler, ProviderStats
from .availability import Availability, Sources, judge, judge_chain
from .balance import Balancer, apply_balance
from .context_count import count_over_window, learned_estimates
from .planner import Plan, ProviderFacts, RequestFeatures, plan
from .request import ClientRequest
from .state import RoutingState

if TYPE_CHECKING:
    from ..config.schema import ConfigModel, ProfileConfig
    from ..providers.provider import Provider
    from ..providers.strategies import Strategy
    from .generation import Generation

# The request a status view plans with: its plan is shown, never sent (a balance profile counts no pick for it).
STATUS_REQUEST = "status"

__all__ = ["CLOSED", "PANIC", "TRIAL", "BudgetGate", "OrderAdjuster", "Router"]


class BudgetGate(Protocol):
    """What the router asks of the budget (guards/apply.py's BudgetHooks)."""

    def allowed(self, provider: str) -> bool: ...

    def spent_cap(self, provider: str) -> str | None: ...

    def reserve(self, provider: Provider, req: ClientRequest) -> Awaitable[object | None] | object | None:
        """A reservation (None: nothing to reserve), or an awaitable of one (a shared ledger)."""
        ...

    def settle(self, reservation: object, provider: Provider, usage: dict | None) -> dict | None: ...


# An order adjuster: (profile, candidates) -> order notes, reordering the candidates in place.
OrderAdjuster = Callable[["ProfileConfig", list[str]], list[dict]]


class Router:
    def __init__(self, state: RoutingState, *, budget: BudgetGate | None = None, affinity: Affinity | None = None,
                 servers: ServerDirectory | None = None, memory_cooldown_s: float = 60.0,
                 order_adjusters: Sequence[OrderAdjuster] = ()) -> None:
        """`budget`: guards.apply.BudgetHooks (allowed / reserve / settle), or None when nothing is paid for.
        `affinity`: prefix affinity (session lanes, slots, prefix index), or None.
        `servers`: what each provider's server reports about itself; its context window gates requests
        for providers whose config leaves context_window unset. None: configured windows only.
        `memory_cooldown_s`: how long a provider that ran out of memory is not tried.
        `order_adjusters`: consulted after planning, in order: (profile config, candidates) -> order notes;
        each may reorder the candidates in place. Guards that move providers (drift demotion, memory
        pressure) plug in here."""
        self.state = state
        self._upstreams = state.upstreams
        self._budget = budget
        self.affinity = affinity
        self.servers = servers
        self._orderers: dict[str, AdaptiveOrderer] = {}
        self.memory_cooldown_s = memory_cooldown_s
        self.order_adjusters = tuple(order_adjusters)
        # Which Anthropic upstream signed each thinking block relayed, so none goes to another (process-wide:
        # a conversation moves between providers and profiles).
        self.thinking_signatures = SignatureBook()
        self.balancer = Balancer()  # mode = "balance": the replicas' load, polled from their /slots
        # What an attempt needs to know of its provider, and prefix affinity as an attempt uses it: the two
        # narrow views an exchange gets (routing/exchange_router.py), not the directory or the index themselves.
        self.attempt = AttemptFacts(servers, self.thinking_signatures)
        self.placement = AffinityPlacement(affinity, self.balancer) if affinity is not None else None
        # What "why no traffic" reads (routing/availability.py), besides the state and budget above.
        # The upstream's last probe (the health monitor's) gives the words of a probe streak. Built once, not per plan.
        self.sources = Sources(routing=state, budget=budget, demand=lambda: self.demand,
                               last_probe=lambda name: state.upstream(name).last_probe)
        # Facts with the context windows servers report, per (provider, window) set: the same dict for every
        # request until a window or the generation changes (no copy of the facts per request).
        self._reported: tuple[Generation | None, dict[tuple[tuple[str, int], ...], dict[str, ProviderFacts]]] = (
            None, {})

    def availability(self, provider: str, *, health_action: str = "exclude") -> Availability:
        """Can `provider` take traffic now, and if not, why: the one answer every view shows."""
        return judge(provider, self.sources, health_action=health_action)

    def chain_availability(self, profile: ProfileConfig) -> dict[str, Availability]:
        """The answer for each provider of a profile's chain, panic included (none can take traffic: those out for
        a passing reason are tried anyway)."""
        return judge_chain(list(profile.providers), self.sources, health_action=profile.health_action,
                           panic=profile.panic)

    def providers_availability(self, runtime: Generation, active_profile: str) -> dict[str, Availability]:
        """Every provider's answer, as `corectl status`, the dashboard and /metrics show it: the active profile's
        chain as that profile routes (its health_action, panic), any other provider by the first profile that
        names it (or as `exclude` would, if none does)."""
        profiles = runtime.config.profiles
        active = profiles.get(active_profile)
        out = dict(self.chain_availability(active)) if active is not None else {}
        for name in runtime.providers:
            if name not in out:
                action = next((p.health_action for p in profiles.values() if name in p.providers), "exclude")
                out[name] = self.availability(name, health_action=action)
        return {name: out[name] for name in runtime.providers if name in out}

    @property
    def demand(self) -> Starter | None:
        """Local models on demand (supervise/ondemand.py), once managed processes exist: it registers itself with
        the upstreams as the one that starts a stopped process for a request. None: no managed process."""
        return self.state.upstreams.starter

    def lease(self, provider: str, *, background: bool = False) -> Lease:
        """A request's hold on one upstream (upstream/upstream.py): the only way it waits for a process, is admitted
        through the breaker and is counted in flight."""
        return self._upstreams.lease(provider, background)

    def reconfigure(self, config: ConfigModel) -> None:
        self.state.reconfigure(config)
        self.memory_cooldown_s = config.memory.cooldown_s
        if self.affinity is not None:
            self.affinity.configure(config)

    @property
    def breakers(self) -> BreakerRegistry:
        return self.state.breakers

    @property
    def stats(self) -> ProviderStats:
        return self.state.stats

    @property
    def probes(self) -> ProbeScheduler:
        return self.state.probes

    def orderer(self, profile: str) -> AdaptiveOrderer:
        o = self._orderers.get(profile)
        if o is None:
            o = self._orderers[profile] = AdaptiveOrderer(self.state.stats, self.state.settings, self.state.clock)
        return o

    @staticmethod
    def facts(providers: dict[str, Provider]) -> dict[str, ProviderFacts]:
        """What the planner knows of each provider from its config (the generation keeps them: Runtime.facts)."""
        out = {}
        for name, p in providers.items():
            c = p.cfg
            out[name] = ProviderFacts(name=name, tools=c.capabilities.tools, vision=c.capabilities.vision,
                                      thinking=c.capabilities.thinking, context_window=c.context_window, paid=c.paid)
        return out

    def context_window(self, provider: Provider) -> int:
        """The window a provider is routed by: configured, else as its server reports it (0 = unknown)."""
        return self.attempt.context_window(provider)

    def named_tool_choice(self, provider: Provider) -> bool:
        """Whether the provider's server reads OpenAI's named tool choice (servers/base.py)."""
        return self.attempt.named_tool_choice(provider)

    def start_eta(self, provider: str) -> float | None:
        """Seconds until the provider's process, being started, should be ready: by the load time learned from its
        own starts, else the rest of its start window (when it has come up or failed, at the latest); None when
        it is not starting (Retry-After on a 529/503 the start made)."""
        ups = self._upstreams
        if provider not in ups or ups.get(provider).phase is not Phase.STARTING:
            return None  # nothing under way: what a scheduler remembers of an earlier start says nothing now
        demand = self.demand
        learned = demand.start_eta(provider) if demand is not None else None
        return learned if learned is not None else self.state.start_left(provider)

    def _facts(self, runtime: Generation, names: Iterable[str]) -> dict[str, ProviderFacts]:
        """The runtime's facts, with the context window the server reports where the config left it unset.
        Never waits: a server not heard from yet is asked in the background and not gated meanwhile."""
        facts = runtime.facts
        if self.servers is None:
            return facts
        reported: list[tuple[str, int]] | None = None
        for name in names:
            f, provider = facts.get(name), runtime.providers.get(name)
            if f is None or provider is None or f.context_window:
                continue
            window = self.servers.context_window(provider)
            if window:
                if reported is None:
                    reported = []
                reported.append((name, window))
        if reported is None:
            return facts
        key = tuple(reported)
        generation, known = self._reported
        if generation is not runtime:
            known = {}
            self._reported = (runtime, known)
        out = known.get(key)
        if out is None:
            out = dict(facts)
            for name, window in reported:
                out[name] = replace(facts[name], context_window=window, window_reported=True)
            if len(known) >= 64:  # windows change rarely; a bound all the same
                known.clear()
            known[key] = out
        return out

    async def route(self, profile_name: str, profile: ProfileConfig, runtime: Generation,
                    req: ClientRequest) -> tuple[Plan, Ticket | None]:
        """A request's plan and its prefix-affinity ticket (None: no affinity, or nothing to place by): the
        ticket first (the plan may prefer what is cached for it), then the prompt counted by the servers that can
        count it where the estimate would skip them, then the plan."""
        placement = self.placement
        ticket = placement.ticket(req) if placement is not None else None
        counts = await self.server_counts(profile, runtime, req)
        return self.plan(profile_name, profile, runtime, req, ticket=ticket, counts=counts), ticket

    def plan(self, profile_name: str, profile: ProfileConfig, runtime: Generation, req: ClientRequest,
             ticket: Ticket | None = None, counts: dict[str, int] | None = None) -> Plan:
        """`counts`: prompt tokens by a provider's own server (`server_counts`), which the gate trusts over any
        estimate."""
        tokens_for = learned_estimates(runtime, profile.providers, req)
        if counts:
            tokens_for = {**tokens_for, **counts}
        features = RequestFeatures(
            has_tools=req.has_tools(),
            thinking_required=req.thinking_required,
            estimated_tokens=req.estimated_tokens(),
            tokens_for=tokens_for,
            counted=frozenset(counts or ()),
        )
        st = self.state
        facts = self._facts(runtime, profile.providers)
        sources = self.sources
        p = plan(
            list(profile.providers), facts, features,
            judge=lambda name: judge(name, sources, health_action=profile.health_action),
            health=st.health, health_action=profile.health_action,
            orderer=self.orderer(profile_name) if profile.adaptive else None,
        )
        down = st.down  # judged not ready by the availability answer above (its process is not up)
        if not p.candidates:
            self._try_reported_windows(p, facts, down)
        if ticket is not None and self.affinity is not None and (profile.mode == "race" or profile.adaptive):
            self._prefer_cached(p, ticket, runtime, self.affinity)
        if profile.mode == "balance":
            apply_balance(self.balancer, p, ticket, self.affinity.index if self.affinity else None, runtime.providers,
                          self.servers, pick=req.request_id != STATUS_REQUEST)
        for adjust in self.order_adjusters:
            p.order_notes.extend(adjust(profile, p.candidates))
        return p

    async def server_counts(self, profile: ProfileConfig, runtime: Generation, req: ClientRequest) -> dict[str, int]:
        """The prompt counted by the servers of the chain that the estimate would skip and that can count
        (llama-server): only a prompt that cannot fit by the server's own count is sent elsewhere."""
        return await count_over_window(self, runtime, profile.providers, req)

    @staticmethod
    def _try_reported_windows(p: Plan, facts: dict[str, ProviderFacts], down: frozenset[str]) -> None:
        """Nobody left, and some were skipped only because the prompt's estimate exceeds the window their
        server reports: try those anyway, in chain order. The estimate is rough; the server's own refusal
        carries the real numbers ("prompt is too long: N tokens > M maximum", which Claude Code compacts by),
        where a refusal of ours could only say "no provider"."""
        reported = [s for s in p.skips if s.reason == "context" and s.provider not in down
                    and (f := facts.get(s.provider)) is not None and f.window_reported]
        for s in reported:
            p.skips.remove(s)
            p.candidates.append(s.provider)
            p.order_notes.append({"provider": s.provider, "moved": "none",
                                  "why": f"{s.message}; tried anyway: no other provider, and the server's own "
                                         "answer says by how much"})

    def _prefer_cached(self, p: Plan, ticket: Ticket, runtime: Generation, affinity: Affinity) -> None:
        """Among providers the profile treats as equals (race, adaptive order), the one expected to answer
        first given what it has cached leads. Providers adaptive or health moved back stay behind."""
        moved_back = {n["provider"] for n in p.order_notes if n.get("moved") == "back"}
        equals = [c for c in p.candidates if c not in moved_back]
        rest = [c for c in p.candidates if c in moved_back]
        order, notes = affinity.prefer(equals, ticket, lambda n: runtime.providers[n].cfg.affinity)
        p.candidates = order + rest
        p.order_notes.extend(notes)

    def effective_order(self, profile_name: str, profile: ProfileConfig, runtime: Generation) -> Plan:
        return self.plan(profile_name, profile, runtime, ClientRequest(
            ingress="anthropic", body={}, raw=b"", headers={}, stream=False, model="", request_id=STATUS_REQUEST))

    def panic_order(self, names: list[str]) -> list[str]:
        """Best first among providers that are all skipped for transient reasons: a closed breaker (merely
        unhealthy) before a half-open one before an open one, sooner reopening first; the plan's order breaks
        ties."""
        rank = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}

        def key(item: tuple[int, str]) -> tuple[int, float, int]:
            i, name = item
            br = self.state.breakers.get(name)
            return rank[br.state], br.retry_in_s or 0.0, i

        return [n for _i, n in sorted(enumerate(names), key=key)]

    # -- admission (the lease admits through the breaker: upstream/upstream.py) --------------------------------

    async def reserve(self, provider: Provider, req: ClientRequest) -> object | None:
        """A budget reservation for a paid attempt (None when unpaid). Raises UpstreamError(BUDGET) if refused.
        Awaited: a shared ledger answers over the network; the local one answers without suspending."""
        if self._budget is None:
            return None
        res = self._budget.reserve(provider, req)
        return await res if isawaitable(res) else res

    def spent_cap(self, provider: str) -> str | None:
        """Why a budget-skipped provider cannot come back before its cap resets, or None (see Budget.spent_cap)."""
        return self._budget.spent_cap(provider) if self._budget is not None else None

    def settle(self, reservation: object | None, provider: Provider, usage: dict | None) -> dict | None:
        """Settle with the real cost; a shared ledger answers with the settle's record for the journal."""
        if self._budget is not None and reservation is not None:
            return self._budget.settle(reservation, provider, usage)
        return None

    # -- outcomes -------------------------------------------------------------------------------------------

    def report(self, provider: str, admission: str, elapsed_s: float, error: UpstreamError | None = None) -> None:
        """How an attempt ended: served (`error` None; `elapsed_s` its latency, the first byte's) or failed."""
        if error is not None:
            self.report_failure(provider, error, elapsed_s, admission)
            return
        br = self.state.breakers.get(provider)
        if admission == PANIC and br.state is not BreakerState.CLOSED:
            # A real generation served now, while the breaker refused: the best proof there is.
            br.reset("a panic attempt succeeded")
        else:
            br.record_success()
        self.state.stats.record(provider, latency_s=elapsed_s, ok=True)
        self.state.passive_success(provider)  # health follows the breaker it just told

    def report_success(self, provider: str, latency_s: float, admission: str = CLOSED) -> None:
        self.report(provider, admission, latency_s)

    def report_failure(self, provider: str, e: UpstreamError, elapsed_s: float, admission: str = CLOSED) -> None:
        st = self.state
        br = st.breakers.get(provider)
        if e.counts_against_provider:
            retry_after = e.retry_after
            if retry_after is None and e.reason == MEMORY_PRESSURE:
                retry_after = self.memory_cooldown_s  # out of memory: give the backend time to free it
            if admission != PANIC or br.state is BreakerState.CLOSED:
                st.passive_failure(provider, retry_after=retry_after, reason=e.label)
            else:
                # Tried in panic while its breaker refused: counted, but the breaker's trial decides, so the
                # count and the verdict never part (they once did: two counters, one of them moving).
                st.panic_failure(provider)
            st.stats.record(provider, latency_s=elapsed_s, ok=False)
            return
        if e.auth_failure:
            # A refused key is the provider's configuration, not its health: in its error figures and an
            # `auth` state, while the chain moves on.
            st.stats.record(provider, latency_s=elapsed_s, ok=False)
            assert e.status is not None  # 401 or 403
            st.auth_refused(provider, e.status)
        if admission == TRIAL:
            if e.provider_answered:
                br.record_success()  # it answered: alive; the trial closes the breaker
            else:
                br.release()


class AttemptFacts:
    """What an attempt needs to know of its provider: the context window it is routed by, whether its server reads a
    named tool choice, and which thinking signatures it may be sent back."""

    __slots__ = ("_servers", "_signatures")

    def __init__(self, servers: ServerDirectory | None, signatures: SignatureBook) -> None:
        self._servers = servers
        self._signatures = signatures

    def context_window(self, provider: Provider) -> int:
        """Configured, else as its server reports it (0 = unknown)."""
        if self._servers is None:
            return provider.cfg.context_window
        return self._servers.context_window(provider)

    def named_tool_choice(self, provider: Provider) -> bool:
        return self._servers is None or self._servers.named_tool_choice(provider)

    def signatures_for(self, signer: str) -> UpstreamSignatures:
        """The thinking signatures an Anthropic upstream (`signer`, its origin) may be sent back."""
        return self._signatures.for_upstream(signer)


class AffinityPlacement:
    """Prefix affinity as one request uses it: its ticket, its body per provider, an attempt's slot and its end."""

    __slots__ = ("_aff", "_balancer")

    def __init__(self, affinity: Affinity, balancer: Balancer) -> None:
        self._aff = affinity
        self._balancer = balancer

    def ticket(self, req: ClientRequest) -> Ticket | None:
        return self._aff.ticket(req, prompt_cache_key=req.session_key())

    def body_for(self, ticket: Ticket, provider: Provider, req: ClientRequest) -> tuple[dict, bytes]:
        """The request's body as this provider is sent it under prefix affinity."""
        return self._aff.body_for(ticket, provider, req)

    async def place(self, ticket: Ticket, provider: Provider) -> Placement | None:
        # balance: a lane moving off a replica that went down takes its saved slot file along
        return await self._aff.place(ticket, provider,
                                     follow=self._balancer.follower(ticket, provider.name, self._aff.kvcache))

    def finish(self, ticket: Ticket | None, placement: Placement, provider: Provider, *, ok: bool,
               strategy: Strategy, request_id: str) -> None:
        """The attempt `place` placed is over: its slot is free again, and a success teaches the index."""
        self._aff.finish(ticket, placement, provider, ok=ok, strategy=strategy, request_id=request_id)

    def died(self, ticket: Ticket, provider: str) -> None:
        """`provider`'s managed server died under an attempt: the lane's saved slot file follows the request to
        whichever server serves its next attempt (the restart of the same one: nothing moves)."""
        self._balancer.moving(ticket, provider)

    def learn_unplaced(self, ticket: Ticket, provider: Provider, *, strategy: Strategy, request_id: str) -> None:
        """A success never placed (a race winner): what it cached still teaches the index."""
        aff = self._aff
        aff.finish(ticket, aff.unplaced(ticket, provider), provider, ok=True, strategy=strategy,
                   request_id=request_id)
