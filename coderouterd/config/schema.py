"""The configuration schema: the TOML keys users and scripts rely on (see config.example.toml)."""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .kinds import ALWAYS_LOCAL, DEFAULT_BASE_URL, KEYED_HOSTS, SERVES_RESPONSES

# Every timeout and interval lies between 10 ms and one day: `inf`, `1e308` or a typo'd exponent would
# otherwise reach asyncio timers and sleeps (an inf timeout turned each request into a 500, an inf flush
# interval killed the store's thread).
MIN_S = 0.01
DAY_S = 86_400.0


def seconds(default: float, *, zero_ok: bool = False):
    """A duration key: 10 ms .. 1 day, or 0 where 0 means "off"."""
    return Field(default, ge=0 if zero_ok else MIN_S, le=DAY_S)


Seconds = Annotated[float, Field(ge=MIN_S, le=DAY_S)]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo in a config file must not be silently ignored. No inf/nan anywhere.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8088, ge=0, le=65535)
    api_keys: list[str] = []
    max_body_mb: float = Field(32, gt=0, le=1024)
    default_profile: str = "default"
    ping_interval_s: float = seconds(15.0)
    # A streaming request holds its HTTP status this long waiting for the first upstream event, so that an
    # early failure is still a real HTTP error (or a silent failover) rather than an error event.
    stream_hold_s: float = seconds(1.0, zero_ok=True)
    drain_timeout_s: float = seconds(10.0, zero_ok=True)
    log_level: str = "info"
    # Connection limits (see ingress/protocol.py): request head size, slow clients, idle keep-alive, and how
    # many connections are served at once (beyond it: 503, /healthz still answered).
    max_header_kb: int = Field(64, ge=1, le=1024)
    max_header_line_kb: int = Field(64, ge=1, le=1024)
    header_timeout_s: float = seconds(20.0)
    body_timeout_s: float = seconds(30.0)
    keep_alive_s: float = seconds(75.0)
    max_connections: int = Field(512, ge=1, le=100_000)
    # The read-only web dashboard at /ui on this port (README: "The dashboard"); false answers /ui with 404.
    dashboard: bool = True
    # Browsers are not callers (ingress/browsers.py): extra Host names this daemon answers to (its own loopback
    # names and listen address always; "name" matches any port, "name:port" that port only; "*" turns the Host
    # check off), and the web origins allowed to call the API with CORS (none by default).
    allowed_hosts: list[str] = []
    cors_origins: list[str] = []

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        for i, h in enumerate(hosts):
            if h == "*":
                continue
            if not h or h != h.strip() or "/" in h or "@" in h or not (h.isascii() and h.isprintable()):
                raise ValueError(f"[{i}] {h!r} is not a host name: give a bare name or name:port, like "
                                 "'coderouter.lan' or 'coderouter.lan:8088' (no scheme, no path)")
        return [h.lower() for h in hosts]

    @field_validator("cors_origins")
    @classmethod
    def _origins(cls, origins: list[str]) -> list[str]:
        for i, o in enumerate(origins):
            if o.strip() in ("*", "null"):
                raise ValueError(f"[{i}] {o!r} would let any web page spend this daemon's budget; name each "
                                 "origin, like 'http://localhost:5173'")
            scheme, sep, rest = o.strip().partition("://")
            if not sep or scheme.lower() not in ("http", "https") or not rest or "/" in rest.rstrip("/"):
                raise ValueError(f"[{i}] {o!r} is not a web origin: give scheme://host[:port], like "
                                 "'http://localhost:5173'")
        return origins

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, keys: list[str]) -> list[str]:
        # An empty key would match a request that sends none: auth silently off.
        for i, k in enumerate(keys):
            if not k.strip():
                raise ValueError(f"[{i}] is empty or whitespace; remove it or set a real key")
            if k != k.strip():
                raise ValueError(f"[{i}] has leading or trailing whitespace, which no client can send")
            # HTTP header values are bytes read as Latin-1; a non-ASCII or control character in a key could
            # never compare equal to what a client sends.
            if not (k.isascii() and k.isprintable()):
                raise ValueError(f"[{i}] contains a non-ASCII or control character, which no client can send in "
                                 "a header; use printable ASCII only")
        return keys

    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


class AdminConfig(_Strict):
    socket: str = ""


class StateConfig(_Strict):
    dir: str = ""
    # false = no SQLite store, journal or audit log (state lives in memory only); for benchmarks and read-only hosts.
    enabled: bool = True
    journal_retention_days: float = Field(90, gt=0, le=36_500)
    audit_max_mb: float = Field(10, gt=0, le=100_000)
    audit_keep: int = Field(3, ge=1, le=1000)
    flush_interval_s: float = seconds(1.0)
    # Where budgets, breakers and the journal are shared (README: Several machines). "sqlite": this machine
    # only, nothing leaves it. "postgres": several instances share one ledger, breakers and journal; the
    # local SQLite store stays (the journal is written there first and shipped).
    backend: Literal["sqlite", "postgres"] = "sqlite"
    # postgresql://user:password@host/db. Prefer `dsn_env`, the name of an environment variable holding it,
    # so the password is not in the file. Neither is ever logged or shown with its password.
    dsn: str = Field("", repr=False)
    dsn_env: str = ""
    # This instance's name in the shared state (journal rows, reservations, heartbeats). Empty: a name made
    # once from the host name and kept in the state directory, so it survives restarts.
    instance: str = Field("", max_length=64)
    # The most a shared-state call may add to a request; beyond it the request goes on with the local
    # fallback (budgets: a conservative share of the remainder; breakers: local).
    shared_timeout_ms: float = Field(50.0, ge=1, le=10_000)
    # Reservations of an instance that stopped renewing them (kill -9) are reclaimed this long after.
    lease_s: float = Field(30.0, ge=1, le=3600)
    # Heartbeat and lease renewal; instances silent for 3 beats count as gone.
    heartbeat_s: float = Field(2.0, ge=0.1, le=600)
    # Shared breaker state is re-read this often even without notifications (a lost LISTEN connection).
    poll_s: float = Field(2.0, ge=0.05, le=600)
    # The local journal is shipped to the shared one in batches this often.
    ship_interval_s: float = Field(1.0, ge=0.05, le=600)

    @model_validator(mode="after")
    def _shared_needs_dsn(self):
        if self.backend == "postgres" and not (self.dsn or self.dsn_env):
            raise ValueError('backend = "postgres" needs dsn or dsn_env')
        if self.dsn and self.dsn_env:
            raise ValueError("set dsn or dsn_env, not both")
        return self


class Capabilities(_Strict):
    tools: bool = True
    thinking: bool = True
    # Unset = unknown: images are forwarded. false = images are replaced by a short text note (never refused).
    # kind = "anthropic" providers take images. `corectl doctor` tests a backend with a 1x1 PNG.
    vision: bool | None = None


class Cost(_Strict):
    input: float = Field(0.0, ge=0, le=1e6)
    output: float = Field(0.0, ge=0, le=1e6)
    cache_read: float = Field(0.0, ge=0, le=1e6)
    cache_write: float = Field(0.0, ge=0, le=1e6)


class Timeouts(_Strict):
    connect: float = seconds(5.0)
    first_byte: float = seconds(300.0)
    idle: float = seconds(120.0)
    total: float = seconds(1800.0)


class ProcessConfig(_Strict):
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = {}
    cwd: str | None = None
    ready_url: str | None = None
    autostart: bool = True
    stop_timeout_s: float = seconds(10.0)
    start_timeout_s: float = seconds(120.0)
    startsecs: float = seconds(1.0, zero_ok=True)
    max_restarts: int = Field(5, ge=0, le=10_000)
    restart_window_s: float = seconds(300.0)
    # Ready this long without a crash and the restart back-off starts over (supervisord's model). 0: the
    # longest back-off step.
    healthy_after_s: float = seconds(0.0, zero_ok=True)
    # On demand (README: Several local models): "always" runs it with the daemon; "on_demand" starts it when
    # the first request needs it. idle_stop_s > 0 stops it after that long without a request (it is started
    # again by the next one). memory_mb is what it holds once loaded (0 = estimated from its -m/--model file
    # and the KV cache of its context), counted against [models] memory_budget_mb. pinned: never stopped to
    # make room for another (a stop by hand still stops it).
    start: Literal["always", "on_demand"] = "always"
    idle_stop_s: float = seconds(0.0, zero_ok=True)
    memory_mb: float = Field(0.0, ge=0, le=100_000_000)
    pinned: bool = False
    # Something already answering ready_url at start: "verify" adopts it only if it runs this command as the
    # daemon's user; "never" refuses it. A refused listener marks the provider down, naming the port's owner.
    adopt: Literal["verify", "never"] = "verify"


class ProviderConfig(_Strict):
    kind: Literal["openai", "anthropic", "ollama", "gemini"] = "openai"
    base_url: str
    model: str = ""
    default_model: str = ""
    api_key_env: str = ""
    forward_client_key: bool = False
    paid: bool = False
    context_window: int = Field(0, ge=0, le=100_000_000)
    capabilities: Capabilities = Capabilities()
    cost: Cost = Cost()
    monthly_budget_usd: float = Field(0.0, ge=0, le=1e9)
    timeouts: Timeouts = Timeouts()
    headers: dict[str, str] = {}
    # The upstream serves the OpenAI Responses API itself (POST {base_url}/responses): Responses requests are
    # forwarded to it as they came instead of being translated (kind must be "openai").
    serves_responses: bool = False
    # Either an inline process block, or the name of a shared [processes.NAME] entry.
    process: ProcessConfig | str | None = None
    restart_command: list[str] = []
    # Prefix affinity on this provider (slot choice on llama-server, canonical prompt); see [affinity].
    affinity: bool = True
    # Tool calls the model writes as text (<tool_call>…, [TOOL_CALLS]…) become real tool calls.
    # "auto": on for local providers (see is_local), "on": for any provider, "off": never.
    tool_repair: Literal["auto", "on", "off"] = "auto"
    # Whether this backend runs here (memory pressure, drift, tool repair "auto"); unset = guessed from kind,
    # process block and base_url host.
    local: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _default_base_url(cls, data: object) -> object:
        """A hosted API's own address when base_url is left out (kind = "gemini")."""
        if isinstance(data, dict) and "base_url" not in data and data.get("kind") in DEFAULT_BASE_URL:
            return {**data, "base_url": DEFAULT_BASE_URL[data["kind"]]}
        return data

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/")

    @model_validator(mode="after")
    def _responses_only_openai(self):
        if self.serves_responses and self.kind not in SERVES_RESPONSES:
            raise ValueError('serves_responses needs kind = "openai" (the Responses API is an OpenAI wire)')
        keyed = KEYED_HOSTS.get(self.kind)
        if keyed and not self.api_key_env and (urlsplit(self.base_url).hostname or "").endswith(keyed):
            raise ValueError(f'kind = "{self.kind}" at {keyed.lstrip(".")} needs api_key_env (the environment '
                             'variable holding its API key)')
        return self

    def is_local(self) -> bool:
        """A backend on this machine or this network: Ollama, a supervised process, or a loopback/private host."""
        if self.local is not None:
            return self.local
        if self.process is not None:
            return True
        # Asked on every request (tool repair, drift): the URL is parsed once per (kind, base_url).
        key = (self.kind, self.base_url)
        local = _LOCAL_BY_URL.get(key)
        if local is None:
            local = _LOCAL_BY_URL[key] = self.kind in ALWAYS_LOCAL or _host_is_local(self.base_url)
        return local


_LOCAL_BY_URL: dict[tuple[str, str], bool] = {}


def _host_is_local(base_url: str) -> bool:
    host = urlsplit(base_url).hostname or ""
    if host == "localhost" or host.endswith(".local"):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return False
    return addr.is_loopback or addr.is_private or addr.is_link_local


class ToolLoopConfig(_Strict):
    action: Literal["warn", "inject", "break"] = "warn"
    threshold: int = Field(3, ge=2, le=1000)
    window: int = Field(5, ge=2, le=1000)
    max_tool_calls: int = Field(0, ge=0, le=100_000)  # 0 = no cap


class ProfileConfig(_Strict):
    providers: list[str] = Field(min_length=1)
    mode: Literal["fallback", "race"] = "fallback"
    race_width: int = Field(2, ge=2, le=32)
    race_delay_ms: float = Field(0, ge=0, le=DAY_S * 1000)
    adaptive: bool = False
    health_action: Literal["warn", "demote", "exclude"] = "exclude"
    # No longer used (kept so that configs naming it still load; `coderouterd --check` and the start-up log say so):
    # `[breaker] failures` is the one count of failures that takes a provider out, for the breaker and health alike.
    health_threshold: int | None = Field(None, ge=1, le=1000)
    # Serve the user first: when every provider is skipped only for transient reasons (breaker open, excluded as
    # unhealthy), try them anyway, best first, marked `panic`. false = answer 529/503 at once instead.
    panic: bool = True
    tool_loop: ToolLoopConfig = ToolLoopConfig()
    # What to do when a local provider's answers drift (see [drift]): warn (audit + log), demote (move it to
    # the back of this profile's chain for drift.cooldown_s), reload (unload and reload its model).
    drift_action: Literal["off", "warn", "demote", "reload"] = "warn"
    # Under memory pressure on this machine (see [memory]): warn only, or try remote providers before local ones.
    memory_action: Literal["warn", "prefer_remote"] = "warn"
    # A local provider whose process is stopped (on demand, or stopped when idle) is started by the request.
    # "failover": while it starts, the request goes to the next provider of the chain at once, and waits for
    # the start only when nothing after it can serve. "wait": the request waits for the local model.
    on_demand_start: Literal["failover", "wait"] = "failover"
    # The output limit of a request that names none (guards/output_limit.py): Copilot CLI's chat and Responses
    # requests carry no max_tokens, and a small local model that loops then writes until its context is full.
    # None: the upstream's own default. Never lowers a limit the client asked for.
    default_max_tokens: int | None = Field(None, ge=1, le=10_000_000)


class RouteConfig(_Strict):
    model: str
    profile: str


class BreakerConfig(_Strict):
    failures: int = Field(3, ge=1, le=1000)
    recovery_s: float = seconds(30.0)
    # Each failed half-open trial doubles the time out (recovery_s, 2x, 4x, ...) up to this; never below recovery_s.
    max_recovery_s: float = seconds(300.0)
    # At most this share of the configured providers out of rotation at once (Envoy's max_ejection_percent); one
    # may always go out. A provider whose failures would take one more out stays in, and `corectl status` says so.
    # An upstream's retry-after is honoured beyond it: an explicit "wait N s" is a fact, and it ends by itself.
    max_ejection_percent: int = Field(100, ge=0, le=100)


class AdaptiveConfig(_Strict):
    window_s: float = seconds(60.0)
    latency_ratio: float = Field(1.5, gt=1, le=1000)
    min_latency_samples: int = Field(3, ge=1, le=100_000)
    error_rate: float = Field(0.10, gt=0, le=1)
    min_error_samples: int = Field(5, ge=1, le=100_000)
    debounce_s: float = seconds(30.0, zero_ok=True)
    probe_interval_s: float = seconds(15.0)
    max_probes_per_minute: int = Field(4, ge=0, le=600)
    probe_paid: bool = False


class DriftConfig(_Strict):
    """Thresholds of drift detection over each local provider+model's recent answers."""

    window: int = Field(20, ge=4)
    recent: int = Field(5, ge=2)
    min_fill: int = Field(8, ge=3)
    empty_rate: float = Field(0.6, gt=0, le=1)
    repetition_rate: float = Field(0.6, gt=0, le=1)
    collapse_ratio: float = Field(0.2, gt=0, lt=1)
    length_stop_rate: float = Field(0.6, gt=0, le=1)
    # Accepted so configs that set it still load; unused since errors stopped counting as drift (issue 43, E6).
    error_rate: float = Field(0.6, gt=0, le=1)
    cooldown_s: float = Field(300.0, ge=0)

    @model_validator(mode="after")
    def _sizes(self) -> DriftConfig:
        if self.recent >= self.window:
            raise ValueError("drift.recent must be smaller than drift.window")
        return self


class MemoryConfig(_Strict):
    # Below this much available memory the machine is under pressure (0 = do not sample).
    low_available_mb: float = Field(2048, ge=0)
    sample_interval_s: float = Field(5.0, gt=0)
    # A provider whose backend said it ran out of memory is not tried for this long.
    cooldown_s: float = Field(60.0, gt=0)


class ModelsConfig(_Strict):
    """Local models as a set (README: Several local models)."""

    # What the managed processes may hold together, in MB (0 = no limit). Starting one that would exceed it
    # first stops the least recently used unpinned ones.
    memory_budget_mb: float = Field(0.0, ge=0, le=100_000_000)
    # Swaps only when they pay. A request for a stopped model may be held this long while the resident one is
    # busy, so that the requests for each are gathered and served together by one swap (background requests,
    # no tools, never stop a busy model). A model started for requests stays at least min_resident_s before it
    # is stopped for another or for idleness (hysteresis against A B A B).
    swap_hold_s: float = seconds(5.0, zero_ok=True)
    min_resident_s: float = seconds(5.0, zero_ok=True)


class HealthConfig(_Strict):
    probe_interval_s: float = seconds(30.0)
    recovery_backoff_s: list[Seconds] = Field([30, 60, 120, 300], max_length=100)


class BudgetConfig(_Strict):
    global_monthly_usd: float = Field(0.0, ge=0, le=1e9)
    warn_ratio: float = Field(0.8, gt=0, le=1)


class MetricsConfig(_Strict):
    bearer_token: str = ""


class AffinityConfig(_Strict):
    """Prefix affinity: send each turn where its prompt prefix is already cached (README: Prefix affinity)."""

    enabled: bool = True
    # Regular expressions (multi-line) removed from system[0] for every upstream except the real Anthropic API:
    # values that change per request and would make every prefix cache miss.
    strip_patterns: list[str] = ["^x-anthropic-billing-header:.*$"]
    # A turn that reused at least this many tokens (and over 10%) less than its lane's previous prompt on the
    # same backend is reported as a cache bust.
    bust_min_tokens: int = Field(1024, ge=1, le=100_000_000)
    # A new lane copies another slot's shared prefix (save + restore) when that saves at least this much.
    clone_min_tokens: int = Field(2048, ge=1, le=100_000_000)
    probe_timeout_s: float = seconds(2.0)
    # Slot files kept per server (--slot-save-path): each holds a slot's KV cache, which can be gigabytes; the
    # oldest saved lane's file is reused beyond this. 0 = never save (evicted lanes start over).
    max_saved_slots: int = Field(8, ge=0, le=10_000)
    # A managed llama-server (a provider's `process`) gets --slot-save-path <state dir>/slots unless it sets one.
    manage_slot_save: bool = True
    # Managed servers' slots survive stops and crashes (kvcache/cache.py): a lane idle this long is saved in the
    # background (0 = never; a kill -9 then loses every lane's cache), and every slot holding a lane's prefix is
    # saved before a planned stop, for at most save_before_stop_s (then the server stops anyway).
    save_idle_after_s: float = seconds(10.0, zero_ok=True)
    save_before_stop_s: float = seconds(30.0, zero_ok=True)
    # Disk budget for coderouterd's slot files (all servers together): the oldest, least valuable go first.
    max_saved_mb: float = Field(8192, ge=0, le=100_000_000)

    @field_validator("strip_patterns")
    @classmethod
    def _patterns(cls, v: list[str]) -> list[str]:
        import re

        for p in v:
            try:
                re.compile(p)
            except re.error as e:
                raise ValueError(f"invalid pattern {p!r}: {e}") from None
        return v


class ConfigModel(_Strict):
    server: ServerConfig = ServerConfig()
    admin: AdminConfig = AdminConfig()
    state: StateConfig = StateConfig()
    providers: dict[str, ProviderConfig] = {}
    processes: dict[str, ProcessConfig] = {}
    profiles: dict[str, ProfileConfig] = {}
    routes: list[RouteConfig] = []
    breaker: BreakerConfig = BreakerConfig()
    adaptive: AdaptiveConfig = AdaptiveConfig()
    health: HealthConfig = HealthConfig()
    drift: DriftConfig = DriftConfig()
    memory: MemoryConfig = MemoryConfig()
    models: ModelsConfig = ModelsConfig()
    budget: BudgetConfig = BudgetConfig()
    metrics: MetricsConfig = MetricsConfig()
    affinity: AffinityConfig = AffinityConfig()

    @model_validator(mode="after")
    def _references(self) -> ConfigModel:
        problems: list[str] = []
        if not self.providers:
            problems.append("providers: at least one provider is required")
        if not self.profiles:
            problems.append("profiles: at least one profile is required")
        for pname, prof in self.profiles.items():
            for i, prov in enumerate(prof.providers):
                if prov not in self.providers:
                    problems.append(
                        f"profiles.{pname}.providers[{i}]: unknown provider {prov!r}"
                        f" (known: {', '.join(sorted(self.providers)) or 'none'})"
                    )
                elif prov in prof.providers[:i]:
                    # A second entry is never tried (a provider is attempted once per request): a typo for
                    # another name, most likely.
                    first = prof.providers.index(prov)
                    problems.append(f"profiles.{pname}.providers[{i}]: {prov!r} is already listed at [{first}]")
        for i, route in enumerate(self.routes):
            if route.profile not in self.profiles:
                problems.append(f"routes[{i}].profile: unknown profile {route.profile!r}")
        if self.profiles and self.server.default_profile not in self.profiles:
            problems.append(
                f"server.default_profile: unknown profile {self.server.default_profile!r}"
                f" (known: {', '.join(sorted(self.profiles))})"
            )
        for name, pcfg in self.providers.items():
            if isinstance(pcfg.process, str) and pcfg.process not in self.processes:
                problems.append(f"providers.{name}.process: unknown process {pcfg.process!r}")
        if not self.server.is_loopback() and not self.server.api_keys:
            problems.append(
                f"server.api_keys: binding {self.server.host!r} (not loopback) requires client api_keys"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def unused_settings(self) -> list[str]:
        """Settings that still load but no longer do anything, each with what replaced it."""
        return [f"profiles.{name}.health_threshold is no longer used: [breaker] failures ({self.breaker.failures}) "
                "is the one count of failures that takes a provider out, for its breaker and its health alike"
                for name, prof in self.profiles.items() if prof.health_threshold is not None]

    def process_for(self, provider: str) -> tuple[str, ProcessConfig] | None:
        """The process that serves a provider, as (process id, spec); shared processes keep their own name."""
        p = self.providers[provider].process
        if p is None:
            return None
        if isinstance(p, str):
            return p, self.processes[p]
        return provider, p
