"""Typed events: everything notable the daemon does, as small dataclasses.

Producers build an event and hand it to the bus; sinks (journal, audit, metrics, log) decide what
to keep. Each class declares `kind` (stable wire name, used in the audit log and for sink filters)
and `audited` (whether the audit log keeps it). `ts` is wall-clock seconds taken at construction,
so an event written later by the writer thread still carries the moment it happened.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


@dataclass(slots=True)
class Event:
    kind: ClassVar[str] = "event"
    audited: ClassVar[bool] = False

    ts: float = field(default_factory=time.time, kw_only=True)

    def to_dict(self) -> dict[str, Any]:
        cls = type(self)
        names = _FIELD_NAMES.get(cls)
        if names is None:
            names = tuple(f.name for f in fields(cls))
            _FIELD_NAMES[cls] = names
        out: dict[str, Any] = {"kind": cls.kind}
        for name in names:
            out[name] = getattr(self, name)
        return out


@dataclass(slots=True)
class RequestFinished(Event):
    kind: ClassVar[str] = "request_finished"

    request_id: str
    ingress: str
    profile: str
    provider: str | None  # None: no provider served it
    attempts: list[dict] = field(default_factory=list)
    model_requested: str = ""
    model_used: str = ""
    status: int = 200
    error_class: str | None = None
    latency_ms: float = 0.0
    ttfb_ms: float | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    cost_usd: float = 0.0
    streaming: bool = False
    fallback_count: int = 0
    race_outcome: str | None = None
    # The client's session key when its wire has one (Codex: prompt_cache_key).
    session_key: str | None = None
    # The router's own share of the latency: total minus the time spent waiting on upstreams.
    overhead_ms: float = 0.0
    # Prefix affinity: hashed session key, lane, backend slot, and the cached tokens the index predicted.
    session: str | None = None
    lane: str | None = None
    slot: int | None = None
    predicted_tokens: int | None = None
    cache_bust: str | None = None  # the segment named by the cache-bust detector
    # Tool-call repair was applied to the served answer (tools offered, provider's tool_repair on).
    tool_repair: bool = False
    # Settles of shared-ledger reservations ({rid, period, budgets, actual}); empty with the local ledger.
    settles: list[dict] = field(default_factory=list)
    # Some of the tokens above are our estimate (a stream cut before the upstream reported its usage).
    usage_estimated: bool = False
    # The team key that admitted it (its name, never the secret); None: an operator key or open loopback.
    key_name: str | None = None

    @property
    def audited(self) -> bool:  # type: ignore[override]
        # A plain success is journal material only; a request that needed the fallback chain or
        # ended in a server-side failure is worth reading later.
        return self.fallback_count > 0 or self.status >= 500


def moved_past(attempts: list, served: bool) -> list:
    """The attempts a request failed over from: real failures only. A race loser was cancelled because another
    provider won (outcome `lost`) and a client that left cancelled the last one (`cancelled`): neither is a
    failover. When nothing served the request, its last failure was the end, not a move past.
    The journal's fallback_count, the fallback_used audit record and coderouter_failovers_total all use this.
    Takes the routing's typed attempts or their recorded dicts."""
    failed = [a for a in attempts if (a.get("outcome") if isinstance(a, dict) else a.outcome) == "failed"]
    return failed if served else failed[:-1]


@dataclass(slots=True)
class FallbackUsed(Event):
    kind: ClassVar[str] = "fallback_used"
    audited: ClassVar[bool] = True

    request_id: str
    profile: str
    chain: list[dict] = field(default_factory=list)


@dataclass(slots=True)
class BreakerTransition(Event):
    kind: ClassVar[str] = "breaker_transition"
    audited: ClassVar[bool] = True

    provider: str
    old: str
    new: str
    reason: str = ""


@dataclass(slots=True)
class HealthTransition(Event):
    kind: ClassVar[str] = "health_transition"
    audited: ClassVar[bool] = True

    provider: str
    old: str
    new: str
    reason: str = ""


@dataclass(slots=True)
class GuardFired(Event):
    kind: ClassVar[str] = "guard_fired"
    audited: ClassVar[bool] = True

    request_id: str | None
    guard: str
    action: str
    detail: dict = field(default_factory=dict)


@dataclass(slots=True)
class ToolRepaired(Event):
    """Tool calls a model wrote as text were turned into real tool calls for the client."""

    kind: ClassVar[str] = "tool_repaired"
    audited: ClassVar[bool] = True

    request_id: str
    provider: str
    model: str
    calls: int
    formats: list[str] = field(default_factory=list)
    streaming: bool = False


@dataclass(slots=True)
class DriftDetected(Event):
    """A local provider's recent answers drifted from its own normal (see quality/drift.py)."""

    kind: ClassVar[str] = "drift_detected"
    audited: ClassVar[bool] = True

    provider: str
    model: str
    score: float
    signals: dict = field(default_factory=dict)
    action: str = "warn"


@dataclass(slots=True)
class DriftAction(Event):
    kind: ClassVar[str] = "drift_action"
    audited: ClassVar[bool] = True

    provider: str
    model: str
    action: str  # demote | reload
    ok: bool = True
    detail: str = ""


@dataclass(slots=True)
class DriftRecovered(Event):
    kind: ClassVar[str] = "drift_recovered"
    audited: ClassVar[bool] = True

    provider: str
    model: str


@dataclass(slots=True)
class MemoryPressure(Event):
    """Available memory on this machine crossed the configured threshold (both edges are recorded)."""

    kind: ClassVar[str] = "memory_pressure"
    audited: ClassVar[bool] = True

    available_bytes: int
    threshold_bytes: int
    low: bool


@dataclass(slots=True)
class CacheIneffective(Event):
    """A route that writes the prompt cache on every request and never reads it: paying the cache-write
    premium for nothing (on Claude Code, usually a system prompt that changes every call)."""

    kind: ClassVar[str] = "cache_ineffective"
    audited: ClassVar[bool] = True

    provider: str
    profile: str
    writes: int
    extra_cost_usd: float = 0.0


@dataclass(slots=True)
class CacheBust(Event):
    """A turn that reused far less of its prompt prefix than its lane's previous turn promised, and the first
    segment that differed (`system[0] changed`, `tools changed`, `message 14 rewritten`) or the backend."""

    kind: ClassVar[str] = "cache_bust"
    audited: ClassVar[bool] = True

    request_id: str
    provider: str
    lane: str
    session: str
    segment: str
    cause: str
    expected_tokens: int = 0
    cached_tokens: int = 0


@dataclass(slots=True)
class SlotBudgetTooSmall(Event):
    """affinity.max_saved_mb is smaller than one slot file of a managed llama-server: every such save is written
    and deleted at once (kvcache/budget.py). Said once at start-up."""

    kind: ClassVar[str] = "slot_budget_too_small"
    audited: ClassVar[bool] = True

    process: str
    note: str


@dataclass(slots=True)
class BudgetWarning(Event):
    kind: ClassVar[str] = "budget_warning"
    audited: ClassVar[bool] = True

    provider: str
    spent_usd: float
    cap_usd: float
    ratio: float


@dataclass(slots=True)
class BudgetBlocked(Event):
    kind: ClassVar[str] = "budget_blocked"
    audited: ClassVar[bool] = True

    provider: str
    spent_usd: float
    cap_usd: float


@dataclass(slots=True)
class ConfigReloaded(Event):
    kind: ClassVar[str] = "config_reloaded"
    audited: ClassVar[bool] = True

    path: str
    changed: list[str] = field(default_factory=list)


@dataclass(slots=True)
class ConfigRejected(Event):
    kind: ClassVar[str] = "config_rejected"
    audited: ClassVar[bool] = True

    path: str
    reason: str


@dataclass(slots=True)
class ProfileSwitched(Event):
    kind: ClassVar[str] = "profile_switched"
    audited: ClassVar[bool] = True

    old: str | None
    new: str
    source: str = ""


class ProcessEventName(enum.StrEnum):
    """What happens to a managed process, as recorded in the audit log (`kind: process`). Members are strings,
    so consumers may compare with plain names; producers use the members."""

    STARTED = "started"
    READY = "ready"
    EXITED = "exited"
    RESTARTING = "restarting"
    RESTART_SKIPPED = "restart_skipped"
    FATAL = "fatal"
    ADOPTED = "adopted"
    STOPPED = "stopped"
    # from self-healing: taken out of routing, and back in after a good probe
    EXCLUDED = "excluded"
    REJOINED = "rejoined"


# Every name a process event can carry: the supervisor's and self-healing's, one enum for both.
PROCESS_EVENTS = frozenset(ProcessEventName)


@dataclass(slots=True)
class ProcessEvent(Event):
    kind: ClassVar[str] = "process"
    audited: ClassVar[bool] = True

    provider: str
    process: str
    event: ProcessEventName  # a str enum: it reaches the audit log as its plain name
    pid: int | None = None
    detail: str | dict = ""
    # A process serving several providers has its event recorded once per provider; only the first copy is
    # primary, so counters (restarts per process) count the process's event once.
    primary: bool = True


@dataclass(slots=True)
class RecoveryProbe(Event):
    kind: ClassVar[str] = "recovery_probe"
    # Routine: each probe of a recovering backend. The audit keeps the transitions (health, process) only.
    audited: ClassVar[bool] = False

    provider: str
    ok: bool
    attempt: int
    next_in_s: float | None = None


@dataclass(slots=True)
class DaemonLifecycle(Event):
    kind: ClassVar[str] = "daemon"
    audited: ClassVar[bool] = True

    event: str  # "start" | "stop"
    pid: int
    version: str = ""


@dataclass(slots=True)
class PersistenceFault(Event):
    kind: ClassVar[str] = "persistence_fault"
    audited: ClassVar[bool] = True

    component: str
    problem: str
    # True on the event that reports the end of an outage, so the audit trail shows both edges.
    recovered: bool = False


@dataclass(slots=True)
class KeyChanged(Event):
    """A team key was created, updated, rotated, revoked, or reached its expiry (issue 41). Names the key, never
    its secret; `detail` says what changed (settings, the rotation's grace)."""

    kind: ClassVar[str] = "key"
    audited: ClassVar[bool] = True

    name: str
    action: str  # created | updated | rotated | revoked | expired | deleted
    prefix: str = ""
    detail: dict = field(default_factory=dict)
    source: str = "corectl"


@dataclass(slots=True)
class AuthRefused(Event):
    """A request refused for its key (401 or 403). Bounded by keys/throttle.py: at most one line per (reason,
    key, source) a minute. `key` is a team key's name when one was recognised, never what was presented."""

    kind: ClassVar[str] = "auth_refused"
    audited: ClassVar[bool] = True

    reason: str  # no_key | unknown | revoked | expired | scope
    source: str
    key: str | None = None
    status: int = 401
    path: str = ""
    repeats: int = 0  # refusals of the same kind folded into this line since the previous one


@dataclass(slots=True)
class AuthThrottled(Event):
    """One source kept failing authentication and is being slowed down: one line per episode."""

    kind: ClassVar[str] = "auth_throttled"
    audited: ClassVar[bool] = True

    source: str
    failures: int
    delay_s: float


@dataclass(slots=True)
class KeyRateLimited(Event):
    """A team key's request refused for its rpm, tpm or concurrency. Every refusal is an event (metrics count
    them); the audit log keeps at most one line per key per minute (state/audit.py), with how many it stands for."""

    kind: ClassVar[str] = "key_rate_limited"
    audited: ClassVar[bool] = True

    key: str  # the key's name, never its secret
    limit: str  # rpm | tpm | concurrency
    allowed: int
    retry_after_s: float
    request_id: str = ""
    message: str = ""


EVENT_TYPES: dict[str, type[Event]] = {
    cls.kind: cls
    for cls in (
        RequestFinished,
        FallbackUsed,
        BreakerTransition,
        HealthTransition,
        GuardFired,
        ToolRepaired,
        DriftDetected,
        DriftAction,
        DriftRecovered,
        MemoryPressure,
        CacheIneffective,
        CacheBust,
        SlotBudgetTooSmall,
        BudgetWarning,
        BudgetBlocked,
        ConfigReloaded,
        ConfigRejected,
        ProfileSwitched,
        ProcessEvent,
        RecoveryProbe,
        DaemonLifecycle,
        PersistenceFault,
        KeyRateLimited,
        KeyChanged,
        AuthRefused,
        AuthThrottled,
    )
}


def event_kinds() -> list[str]:
    """The kind of every event the daemon can record (what `corectl audit tail --kind` accepts)."""
    return sorted(EVENT_TYPES)
