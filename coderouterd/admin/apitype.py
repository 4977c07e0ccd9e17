"""The admin API's contract, shared by the daemon (which serves it) and corectl (its one client): tailscale's
`apitype` pattern, as pydantic models.

Request bodies are validated by these models (a bad body is a 400 naming the field); answers are declared as
the routes' response models, so /openapi.json describes them, and corectl validates what it reads with the
same classes. Answers may carry fields beyond the ones named here (extra="allow"): the models name what
corectl relies on, and a newer daemon may add more without breaking an older corectl.

The daemon sends its API_VERSION (version.py) on every answer (header API_VERSION_HEADER); corectl refuses to
talk to a daemon of another version instead of misreading its answers, which happens after an upgrade until
the running daemon is restarted. `corectl status` and the other fast-path commands do not import this module
(pydantic costs that path ~100 ms of its 250 ms budget; see docs/decisions.md)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from .version import API_VERSION, API_VERSION_HEADER

__all__ = ["API_VERSION", "API_VERSION_HEADER"]  # and the models below

Name = Annotated[str, StringConstraints(strict=True, min_length=1)]


class ApiRequest(BaseModel):
    """A request body. Unknown fields are ignored, as an older daemon ignores what a newer corectl adds."""

    model_config = ConfigDict(extra="ignore")


class Answer(BaseModel):
    """An answer: the fields corectl relies on, and whatever else the daemon sends."""

    model_config = ConfigDict(extra="allow")


# -- requests ------------------------------------------------------------------------------------------------

class UseProfileRequest(ApiRequest):
    name: Name = Field(description="a profile name")


class ProcessActionRequest(ApiRequest):
    wait_s: Annotated[float, Field(strict=True, ge=0)] = Field(
        0, description="seconds to wait for the process to be ready, >= 0")


class ModelControlRequest(ApiRequest):
    provider: Name = Field(description="a provider name")
    model: Name = Field(description="a model id")
    force: StrictBool = Field(False, description="load even when the memory check says it does not fit")


# -- status, profiles ----------------------------------------------------------------------------------------

class ProviderAvailability(Answer):
    """Can the provider take traffic now, and if not why (routing/availability.py): `code` is a short bounded word
    (the /metrics label), `why` the reason in words."""

    available: bool
    code: str
    why: str
    failures: int = 0  # the one count of consecutive failures (real requests and probes)
    retry_in_s: float | None = None


class ProviderState(Answer):
    """The one state word for a provider (admin/words.py), computed once in the daemon: the page and corectl print
    `word` in the colour `kind` says and list `problem` in the attention strip; `code` is the availability code
    /metrics labels it with."""

    word: str
    kind: str  # ok | warn | idle | bad
    problem: str | None = None  # down | budget | key
    code: str
    takes_traffic: bool


class BreakerStatus(Answer):
    """A provider's circuit breaker (routing/breaker.py's snapshot)."""

    state: str = "closed"  # closed | open | half_open
    consecutive_failures: int = 0
    opened_at: float | None = None
    retry_at: float | None = None  # epoch seconds, while open
    retry_in_s: float | None = None
    trial_in_flight: bool = False
    retry_after_only: bool = False
    ejections: int = 0
    kept_in_rotation: str | None = None


class Figures(Answer):
    """A provider's figures over the stats window (routing/adaptive.py)."""

    samples: int = 0
    latency_samples: int = 0
    probes: int = 0
    median_s: float | None = None
    p95_s: float | None = None
    error_rate: float | None = None
    errors: int = 0
    last_sample_age_s: float | None = None


class ServerFacts(Answer):
    """What the provider's server said of itself (providers/server_info.py)."""

    kind: str
    context_window: int | None = None
    context_source: str | None = None
    slots: int | None = None


class Probe(Answer):
    ok: bool
    detail: str | None = None
    at: float | None = None
    seconds: float | None = None


class AuthRefusal(Answer):
    status: int
    at: float | None = None


class HealthDetail(Answer):
    """The health monitor's view of a provider: its health word, the one failure count, its last probe."""

    state: str = "unknown"
    consecutive_failures: int = 0
    last_probe: Probe | None = None
    auth: AuthRefusal | None = None


class BudgetSkipLine(Answer):
    """Requests the budget skipped for their worst-case cost in the window (guards/budget.BudgetSkips)."""

    count: int
    least_usd: float
    left_usd: float | None = None
    admitted: bool  # some request got through in the window too
    window_s: float
    words: str


class BudgetLine(Answer):
    """One budget's month: a provider's, or the global one."""

    spent: float = 0.0
    cap: float = 0.0  # 0: no cap
    ratio: float | None = None
    reserved: float = 0.0
    blocked: bool = False


class ProviderBudgetLine(BudgetLine):
    skipped: BudgetSkipLine | None = None  # the budget's skips of the window (None: none)


class KeySpend(Answer):
    spent: float = 0.0
    reserved: float = 0.0


class BudgetStatus(Answer):
    month: str
    global_: BudgetLine = Field(alias="global")
    providers: dict[str, ProviderBudgetLine] = {}
    keys: dict[str, KeySpend] = {}


class StoreStatus(Answer):
    enabled: bool
    healthy: bool
    problem: str | None = None


class SharedPeer(Answer):
    instance: str
    host: str | None = None
    beat_age_s: float | None = None


class SharedJournal(Answer):
    shipped: int = 0
    behind: int = 0
    last_ship: float | None = None
    problem: str | None = None


class SharedBudgetState(Answer):
    settles_queued: int = 0


class SharedBreakers(Answer):
    listening: bool = False
    last_poll: float | None = None


class SharedStatus(Answer):
    """[state] backend = "postgres": where (never with its password), up or not, the live instances, journal lag."""

    backend: str = "postgres"
    where: str = ""
    instance: str | None = None
    up: bool
    problem: str | None = None  # the driver's text
    meaning: str | None = None  # what it means, in a few words (the dashboard's: admin/shared_words.py)
    down_since: float | None = None
    schema_: int | None = Field(None, alias="schema")
    heartbeat_age_s: float | None = None
    instances: list[SharedPeer] = []
    journal: SharedJournal | None = None
    budget: SharedBudgetState | None = None
    breakers: SharedBreakers | None = None


class Listen(Answer):
    host: str
    port: int
    url: str


class Route(Answer):
    model: str
    profile: str


class DaemonInfo(Answer):
    """Who and where the daemon is, and its configuration's identity."""

    version: str
    pid: int
    started_at: float
    uptime_s: float
    listen: Listen
    config_path: str | None = None
    embedded_config: bool = False
    active_profile: str
    default_profile: str
    last_reload_error: str | None = None
    stats_window_s: float | None = None
    routes: list[Route] = []
    state_dir: str | None = None


class ModelsMemory(Answer):
    """Local models against [models] memory_budget_mb."""

    memory_budget_mb: float = 0.0
    memory_held_mb: float = 0.0
    resident: list[str] = []
    swaps: int = 0
    waiting: int = 0
    saved_lanes: dict[str, int] = {}
    saved_bytes: int = 0


class KeysStatus(Answer):
    required: bool
    team_keys_required: bool = False
    counts: dict[str, int] = {}
    operator_keys: int = 0
    storage: str | None = None


class ReplicaLoad(Answer):
    processing: int
    slots: int
    held_tokens: int | None = None  # the most tokens any of its slots holds
    age_s: float = 0.0
    picks: int = 0


class ProviderStatus(Answer):
    name: str
    kind: str
    base_url: str
    model: str | None = None
    paid: bool = False
    key_problem: str | None = None  # "no key: $NAME is not set" when its api_key_env is unset
    availability: ProviderAvailability | None = None  # None only from an older daemon
    state: ProviderState | None = None  # the one word to print (None only from an older daemon)
    breaker: BreakerStatus = BreakerStatus()
    health: str = "unknown"
    figures: Figures = Figures()
    # The window requests are routed by (configured, else as the server reports it); None = unknown.
    context_window: int | None = None
    configured_context_window: int | None = None
    server: ServerFacts | None = None  # what the server said: kind, context_window, context_source, slots
    # A balance profile's replica (routing/balance.py): its own /slots as last read (None: not read lately).
    replica: ReplicaLoad | None = None


class ProviderRow(ProviderStatus):
    """A provider as GET /v1/providers shows it: its status and what serves or limits it."""

    health_detail: HealthDetail | None = None
    budget: ProviderBudgetLine | None = None
    process: str | None = None
    process_state: str | None = None


class Skipped(Answer):
    """A provider an order leaves out, and why: the planner's skip (the same words `corectl explain` shows)."""

    provider: str
    outcome: str = "skipped"
    reason: str = ""  # always set by the planner; a default all the same, so an odd journal row still reads
    message: str | None = None


class OrderNote(Answer):
    provider: str
    moved: str | None = None
    why: str = ""


class ProfileStatus(Answer):
    name: str
    active: bool
    providers: list[str]
    mode: str
    adaptive: bool = False
    health_action: str | None = None
    effective_order: list[str]
    # The order in words: "a > b", "local starts on demand", "none available" (the daemon's, printed as is)
    order_words: str | None = None
    skips: list[Skipped] = []
    order_notes: list[OrderNote] = []


class ProcessNow(Answer):
    """A managed process as the dashboard shows it: the supervisor's snapshot, why it last stopped, its log's
    last line."""

    name: str | None = None
    state: str
    pid: int | None = None
    log: str | None = None  # its log file
    uptime_s: float | None = None
    restarts_total: int = 0
    last_exit_code: int | None = None
    last_exit: str | None = None  # "exited with code 1", "killed by SIGKILL"
    last_log_line: str | None = None
    fatal_reason: str | None = None
    providers: list[str] = []
    recovering: bool = False
    next_probe_at: float | None = None
    # Local models on demand (README: Several local models)
    resident: bool = False  # holds its memory (running, starting or still stopping)
    memory_mb: float = 0.0  # configured or estimated; counted against [models] memory_budget_mb
    pinned: bool = False
    start: str = "always"  # always | on_demand
    idle_stop_in_s: float | None = None  # until its idle stop, if nothing uses it
    waiting: int = 0  # requests held for their turn at it (it is stopped, or being swapped in)
    load_s: float | None = None  # its load time, learned from its own starts
    hold_s: float | None = None  # its requests are held to save a swap this long at most (load times, swap_hold_s)
    held: str | None = None  # why, in words: "held to save a swap (~0.6 s: the load times learned) until ..."
    last_stop_reason: str | None = None  # idle, room for X, manual, reload, crash, shutdown


class Status(DaemonInfo):
    api_version: int
    admin_socket: str
    providers: list[ProviderStatus]
    profiles: list[ProfileStatus]
    store: StoreStatus
    processes: dict[str, ProcessNow] = {}
    # Local models against [models] memory_budget_mb: budget, held, resident names (None: no managed process)
    models: ModelsMemory | None = None
    health: dict[str, HealthDetail] = {}
    budget: BudgetStatus | None = None
    # [state] backend = "postgres": where, up or not, the live instances, journal lag (None: this machine only)
    shared: SharedStatus | None = None
    # Keys: required or not, how many team keys, what other machines get (None: an older daemon)
    keys: KeysStatus | None = None


class ProfilesAnswer(Answer):
    active: str
    default: str
    profiles: list[ProfileStatus]


class ProviderBrief(Answer):
    name: str
    kind: str
    base_url: str
    model: str | None = None
    paid: bool = False


class ProfileDetail(Answer):
    name: str
    active: bool
    default: bool
    settings: dict[str, Any]
    effective_order: list[str]
    order_words: str | None = None
    skips: list[Skipped] = []
    order_notes: list[OrderNote] = []
    providers: list[ProviderBrief]
    routes: list[str] = []


class UseProfileAnswer(Answer):
    ok: bool
    previous: str
    active: str


class ReloadAnswer(Answer):
    ok: bool
    path: str | None = None
    changed: list[str] = []
    message: str | None = None
    error: str | None = None


class ConfigCheckAnswer(Answer):
    ok: bool
    path: str | None = None
    message: str | None = None
    error: str | None = None
    providers: list[str] = []
    profiles: list[str] = []


# -- providers, processes, models ----------------------------------------------------------------------------

class ProvidersAnswer(Answer):
    providers: list[ProviderRow]
    stats_window_s: float | None = None


class ProcessesAnswer(Answer):
    processes: dict[str, ProcessNow]
    names: list[str]  # every name `corectl restart NAME` accepts


class ProcessActionAnswer(Answer):
    ok: bool
    action: str
    process: ProcessNow | None = None
    ready: bool | None = None  # only when the caller waited for readiness
    message: str | None = None


class ModelEntry(Answer):
    # As the backend lists it: any of these may be missing from a backend's own answer.
    id: str | None = None
    loaded: bool | None = None
    size: int | None = None
    max_context_length: int | None = None
    instances: list[Any] = []


class ProviderModels(Answer):
    provider: str
    backend: str | None = None
    models: list[ModelEntry] = []
    context_window: int | None = None  # per request, as routed by (configured, else the server's)
    error: str | None = None  # the backend could not be asked (one line, names its URL)
    # A managed process's word for its model, when the backend is not asked or cannot say (D6): "stopped: starts
    # on demand", "resident"
    process_word: str | None = None


class ResidentProcess(Answer):
    state: str | None = None
    providers: list[str] | None = None
    resident: bool = False
    memory_mb: float = 0.0
    pinned: bool = False
    start: str = "always"
    idle_stop_in_s: float | None = None
    waiting: int = 0
    load_s: float | None = None
    hold_s: float | None = None
    held: str | None = None
    last_stop_reason: str | None = None


class Residency(Answer):
    memory_budget_mb: float = 0.0
    memory_held_mb: float = 0.0
    swaps: int = 0
    processes: dict[str, ResidentProcess] = {}


class ModelsAnswer(Answer):
    providers: list[ProviderModels]
    # Managed local models: each process's residency, memory and idle time, against the budget
    resident: Residency | None = None


class ModelControlAnswer(Answer):
    provider: str
    backend: str | None = None
    model: str
    loaded: bool | None = None
    already_loaded: bool | None = None
    already_unloaded: bool | None = None
    load_time_seconds: float | None = None
    instances: list[Any] = []


# -- recent requests -----------------------------------------------------------------------------------------

class Trace(Answer):
    request_id: str
    ts: float | None = None
    ingress: str | None = None
    key: str | None = None  # the team key that admitted it (its name); None: no team key
    stream: bool | None = None
    model_requested: str | None = None
    model_used: str | None = None
    profile: str | None = None
    mode: str | None = None
    candidates: list[str] | None = None
    effective_order: list[str] | None = None
    order_notes: list[OrderNote] | None = None
    skips: list[Skipped] = []
    attempts: list[dict[str, Any]] = []
    served_by: str | None = None
    status: int | None = None
    error_class: str | None = None
    race_outcome: str | None = None
    latency_ms: float | None = None
    ttfb_ms: float | None = None
    usage: dict[str, Any] | None = None
    usage_estimated: bool = False  # some of `usage` is our estimate (a stream cut before the upstream reported it)
    cost_usd: float | None = None
    guards: list[dict[str, Any]] = []  # guards that fired: guard, action (warn | inject | break), detail
    dashboard_url: str | None = None  # this trace on the dashboard (/ui#/requests/ID); None when it is off


class RequestsAnswer(Answer):
    requests: list[Trace]
    kept: int


# -- history (the journal's trends; the dashboard shows the same answers) --------------------------------------

class SpendAnswer(Answer):
    month: str  # YYYY-MM, UTC: the budget's period
    days: list[float]  # each UTC day's start, epoch seconds
    today: int  # index of today in `days`
    # provider -> daily (USD per day, None after today), spent, reserved (in flight), cap (None: no cap), ratio
    providers: dict[str, dict[str, Any]]
    global_: BudgetLine | None = Field(None, alias="global")
    journal: bool  # false: [state] is off, no history


class TrendsAnswer(Answer):
    range: str
    t: list[float]  # bucket starts, epoch seconds
    step_s: float
    # provider -> ttft_p50, ttft_p95, total_p50, total_p95 (ms), cache_hit_ratio (0..1), requests, input_tokens,
    # output_tokens, cached_tokens (cache reads), tokens_per_s (output over generation time): one per bucket.
    # int first: a count stays a count (3, not 3.0) on the wire.
    providers: dict[str, dict[str, list[int | float | None]]]
    unserved: list[int] = []  # requests no provider served, per bucket (never drawn as a provider)
    busts: list[dict[str, Any]] = []  # newest first: ts, request_id, provider, profile, segment, cached_tokens
    journal: bool
    first_ts: float | None = None  # the oldest request in the window (None: none in it)


class RequestBrief(Answer):
    request_id: str
    ts: float | None = None
    profile: str | None = None
    provider: str | None = None
    status: int | None = None
    error_class: str | None = None
    latency_ms: float | None = None
    ttfb_ms: float | None = None
    cost_usd: float | None = None
    key_name: str | None = None  # the team key's name
    reason: str = ""  # a short why from its skips and attempts ("fast http_500, paid skipped (budget)")


class KeyUsage(Answer):
    """One team key in the dashboard's Keys view (admin/key_usage.py)."""

    name: str
    state: str  # active | expired | revoked | unknown (in the journal, not in the key directory)
    spend_usd: float  # this month (UTC), from the journal
    cap_usd: float | None = None  # its monthly budget; None: none of its own
    ratio: float | None = None
    requests: int  # this month, refusals included
    refused: int
    refusals: dict[str, int] = {}  # this month, by reason
    series: dict[str, list[int]]  # requests, refusals: one per bucket of the window (KeyUsageAnswer.t)
    rate: dict[str, Any]  # rpm, tpm (the journal's last 60 s) and their limits, concurrency_limit
    blocked: bool
    blocked_by: str | None = None  # "its monthly cap", or the refusal reason of the last minute
    last_used: float | None = None
    expires_at: float | None = None
    revoked_at: float | None = None


class KeyUsageAnswer(Answer):
    month: str
    range: str
    t: list[float]
    step_s: float
    keys: list[KeyUsage]
    attention: list[dict[str, Any]]  # kind (key_cap | key_blocked | key_expiring), key, text
    journal: bool
    registry: bool  # false: no key directory was handed in (caps, limits and expiry unknown)
    now: float
    source: str = "local"  # which journal: local, shared, or local while the shared one cannot be read


class HistoryRequestsAnswer(Answer):
    source: str  # "journal", or "memory" when [state] is off
    requests: list[RequestBrief]  # newest first


class ErrorAnswer(Answer):
    """Every refusal: a one-line reason, and fields that help the caller (valid names, the process, ...)."""

    error: str


# -- the dashboard (/ui/api/*: the answers above, and these) ----------------------------------------------------

class FeedEvent(Answer):
    """One item of the live feed (ui/feed.py): its kind, when, and that kind's metadata fields."""

    kind: str
    ts: float
    # How the page draws a state change (admin/words.event_tone): ok | warn | idle | bad; None for other kinds
    tone: str | None = None


class DashboardNow(Answer):
    daemon: DaemonInfo
    providers: list[ProviderRow]
    processes: dict[str, ProcessNow]
    store: StoreStatus
    shared: SharedStatus | None = None  # [state] backend = "postgres": up, problem, down_since (None: local)
    in_flight: dict[str, int] = {}
    viewers: int = 0
    events: list[FeedEvent] = []  # the newest notable events (no finished requests), oldest first
    budget_warn_ratio: float = 0.8  # [budget] warn_ratio: a provider this near its cap needs attention
    budget_global: BudgetLine | None = None  # the cap over every paid provider: spent, cap, ratio, blocked
    # Resident local models against [models] memory_budget_mb: budget, held, resident (None: no managed process)
    models: ModelsMemory | None = None


class DashboardTrace(Answer):
    trace: Trace
    source: str  # "memory" (the full trace) or "journal"


# -- team keys (corectl keys ...) ----------------------------------------------------------------------------

class KeySettings(ApiRequest):
    """The limits and scope of a team key. In an update, a field left out stays as it is and null clears it."""

    monthly_usd: Annotated[float, Field(strict=False, ge=0, le=1e9)] | None = Field(
        None, description="the key's own monthly budget in USD (null: none)")
    rpm: Annotated[int, Field(strict=True, ge=1, le=10**9)] | None = Field(
        None, description="requests in any 60-second window (null: no limit)")
    tpm: Annotated[int, Field(strict=True, ge=1, le=10**9)] | None = Field(
        None, description="input + output tokens in any 60-second window (null: no limit)")
    concurrency: Annotated[int, Field(strict=True, ge=1, le=10**9)] | None = Field(
        None, description="requests in flight at once (null: no limit)")
    profiles: list[Name] | None = Field(None, description="profiles the key may use (null or []: any)")
    models: list[Name] | None = Field(None, description="fnmatch globs over the requested model (null or []: any)")
    expires: str | None = Field(None, description="ISO-8601 date or date-time the key stops working (null: never)")
    note: str | None = Field(None, description="free text for the operator")

    def changes(self) -> dict[str, Any]:
        """The settings this body sets (explicitly, null included), `expires` still as text."""
        return {name: getattr(self, name) for name in self.model_fields_set}


class KeyCreateRequest(KeySettings):
    name: Name = Field(description="the key's name: 1 to 32 letters, digits, '.', '_' or '-'")


class KeyRotateRequest(ApiRequest):
    grace_s: Annotated[float, Field(strict=False, ge=0, le=30 * 86400)] = Field(
        0, description="seconds the old secret keeps working")


class KeyInfo(Answer):
    name: str
    prefix: str
    state: str  # active | expired | revoked
    scope: str
    monthly_usd: float | None = None
    rpm: int | None = None
    tpm: int | None = None
    concurrency: int | None = None
    profiles: list[str] = []
    models: list[str] = []
    expires_at: float | None = None
    note: str = ""
    created_at: float = 0.0
    revoked_at: float | None = None
    last_used: float | None = None
    previous_secret_until: float | None = None


class KeysAnswer(Answer):
    required: bool
    counts: dict[str, int]
    keys: list[KeyInfo]


class KeySecretAnswer(Answer):
    """create and rotate: the secret, shown this once."""

    ok: bool
    key: str
    record: KeyInfo


class KeyAnswer(Answer):
    ok: bool
    record: KeyInfo


class KeyDeleteAnswer(Answer):
    ok: bool
    name: str
    required: bool  # whether keys are still required (False: none left, loopback open again)
