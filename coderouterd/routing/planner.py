"""The routing plan for one request: which providers to try, in which order, and why others were skipped.

Pure: asks the availability judge handed in (routing/availability.py) and reads the health handed in; performs no
I/O. Planning consumes nothing: the executor still calls `CircuitBreaker.allow()` right before each attempt, so a
half-open provider admits exactly one trial.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from .adaptive import AdaptiveOrderer
from .availability import PASSING, SKIP_REASON, Availability, Code
from .state import DEGRADED, HEALTHY, UNHEALTHY

HEALTH_ACTIONS = ("warn", "demote", "exclude")
SKIP_REASONS = ("tools", "thinking", "context", "budget", "breaker_open", "memory_cooldown", "unhealthy", "not_ready",
                "cannot_start")


@dataclass
class ProviderFacts:
    name: str
    tools: bool = True
    # None = not declared: images are forwarded. False: images are replaced by a note (see translate/images.py),
    # never a reason to skip the provider.
    vision: bool | None = None
    thinking: bool = True
    context_window: int = 0  # 0 = unknown: no context gate
    window_reported: bool = False  # the window is what the server reports (the config left it unset)
    paid: bool = False


@dataclass
class RequestFeatures:
    has_tools: bool = False
    # No has_images: images never gate a provider (the executor replaces them for vision = false), so the
    # request is not walked for them here.
    # Thinking enabled on a request is a preference: a provider without thinking still answers. Only a
    # caller that cannot accept an answer without reasoning sets this.
    thinking_required: bool = False
    estimated_tokens: int = 0
    # Per provider, where better known than the one estimate above: from the chars-per-token ratio its server's
    # reported prompt_tokens taught, or its server's own count of this very prompt (those named in `counted`).
    tokens_for: Mapping[str, int] = field(default_factory=dict)
    counted: frozenset[str] = frozenset()


# Skips that say "not now" rather than "not this request": when every provider of a chain is skipped only for
# these, the executor tries them anyway (panic mode) instead of routing nowhere.
TRANSIENT_SKIPS = frozenset({"breaker_open", "memory_cooldown", "unhealthy"})


@dataclass
class Skip:
    provider: str
    reason: str
    message: str
    # False for a transient reason that still must not be overridden (a managed process that is not running).
    overridable: bool = True
    # A context skip's numbers (the prompt's tokens, the window), for the client's "prompt is too long" answer.
    tokens: int = 0
    window: int = 0
    # When the skip passes, as far as is known (an open breaker's reopening, a start's remaining time): Retry-After.
    retry_in_s: float | None = None

    @property
    def transient(self) -> bool:
        return self.reason in TRANSIENT_SKIPS and self.overridable

    def as_dict(self, *, message: bool = True) -> dict[str, str]:
        """JSON at the edges (trace, journal, admin answer); in one decision trace with `Attempt.as_dict`."""
        d = {"provider": self.provider, "outcome": "skipped", "reason": self.reason}
        if message:
            d["message"] = self.message
        return d


@dataclass
class Plan:
    candidates: list[str]
    skips: list[Skip] = field(default_factory=list)
    order_notes: list[dict[str, object]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.candidates

    def explain(self) -> dict[str, object]:
        out: dict[str, object] = {
            "candidates": list(self.candidates),
            "skips": [s.as_dict() for s in self.skips],
            "order": [dict(n) for n in self.order_notes],
            "all_gated": not self.candidates,
        }
        if self.candidates:
            out["summary"] = f"trying {', '.join(self.candidates)}"
        elif self.skips:
            out["summary"] = "no provider can serve this request: " + "; ".join(
                s.message if _names_itself(s.provider, s.message) else f"{s.provider}: {s.message}"
                for s in self.skips
            )
        else:
            out["summary"] = "no provider can serve this request: the chain is empty"
        return out


def _names_itself(provider: str, message: str) -> bool:
    return message.startswith((f"{provider}: ", f"{provider}'s "))


def _skip_words(provider: str, a: Availability) -> str:
    """A skip's message says which provider it is about: availability's words, with the provider's name in front
    unless they start with it. A process that cannot start keeps its own words: the client's answer quotes
    them as they are (routing/replies.cannot_start), and they name the process, which may not be the provider."""
    if a.code is Code.CANNOT_START or _names_itself(provider, a.words):
        return a.words
    return f"{provider}: {a.words}"


def _health_word(value: object) -> str:
    # Health may arrive as a plain string or as an Enum from the health monitor.
    raw = getattr(value, "value", value)
    return str(raw).upper() if raw is not None else HEALTHY


def plan(
    chain: list[str],
    facts: dict[str, ProviderFacts],
    features: RequestFeatures,
    *,
    judge: Callable[[str], Availability],
    health: Mapping[str, str],
    health_action: str,
    orderer: AdaptiveOrderer | None = None,
) -> Plan:
    """`judge`: the one answer to "can it take traffic now" (routing/availability.py). It decides every gate that
    is about the provider rather than the request (budget, breaker, cooldown, health, its process), with its
    words; the planner adds the request's own gates (capabilities, context) and the order."""
    if health_action not in HEALTH_ACTIONS:
        raise ValueError(f"health_action must be one of {', '.join(HEALTH_ACTIONS)}, got {health_action!r}")
    chain = list(dict.fromkeys(chain))
    # Judged once per provider, used for both the adaptive debounce and the gates.
    answers = {p: judge(p) for p in chain}
    out = {p for p, a in answers.items() if not a.available}
    notes: list[dict[str, object]] = []
    order = chain
    if orderer is not None:
        order, adaptive_notes = orderer.order(chain, ineligible=out)
        notes.extend(adaptive_notes)
    order = _health_order(order, health, health_action, notes)
    candidates: list[str] = []
    skips: list[Skip] = []
    for p in order:
        skip = _capability_gate(p, facts.get(p) or ProviderFacts(name=p), features)
        a = answers[p]
        if skip is None and not a.available:
            skip = Skip(p, SKIP_REASON.get(a.code, "unhealthy"), _skip_words(p, a), overridable=a.code in PASSING,
                        retry_in_s=a.retry_in_s)
        if skip is None:
            candidates.append(p)
        else:
            skips.append(skip)
    return Plan(candidates=candidates, skips=skips, order_notes=notes)


def _health_order(order: list[str], health: Mapping[str, str], health_action: str,
                  notes: list[dict[str, object]]) -> list[str]:
    """UNHEALTHY providers move back (demote) or stay with a note (warn); DEGRADED ones get a note."""
    demoted: list[str] = []
    for p in order:
        word = _health_word(health.get(p))
        if word == UNHEALTHY and health_action == "demote":
            demoted.append(p)
            notes.append({"provider": p, "moved": "back", "why": "health UNHEALTHY (health_action=demote)"})
        elif word == UNHEALTHY and health_action == "warn":
            notes.append({"provider": p, "moved": "none", "why": "health UNHEALTHY (health_action=warn)"})
        elif word == DEGRADED:
            notes.append({"provider": p, "moved": "none", "why": "health DEGRADED"})
    if demoted:
        order = [p for p in order if p not in demoted] + demoted
    return order


def _capability_gate(p: str, f: ProviderFacts, req: RequestFeatures) -> Skip | None:
    # Capability gates first: they are permanent for this request and the most useful thing to report.
    if req.has_tools and not f.tools:
        return Skip(p, "tools", f"request uses tools but {p} has capabilities.tools = false")
    if req.thinking_required and not f.thinking:
        return Skip(p, "thinking", f"request requires thinking but {p} has capabilities.thinking = false")
    need = req.tokens_for.get(p, req.estimated_tokens)
    if f.context_window > 0 and need > f.context_window:
        counted = p in req.counted
        return Skip(
            p,
            "context",
            f"request needs {'' if counted else '~'}{need:,} tokens{' by its server’s count' if counted else ''}, "
            f"over {p}'s context window of {f.context_window:,}"
            + (" (as its server reports it)" if f.window_reported else ""),
            tokens=need, window=f.context_window,
        )
    return None
