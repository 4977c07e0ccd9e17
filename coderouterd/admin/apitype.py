"""The admin API's contract, shared by the daemon (which serves it) and corectl (its one client).

The daemon sends its API_VERSION (version.py) on every answer (header API_VERSION_HEADER); corectl refuses to talk
to a daemon of another version instead of misreading its answers, which happens after an upgrade until the
running daemon is restarted.

The shapes below name the fields corectl relies on; answers may carry more (total=False)."""

from __future__ import annotations

from typing import Any, TypedDict

from .version import API_VERSION, API_VERSION_HEADER

__all__ = ["API_VERSION", "API_VERSION_HEADER"]  # and the shapes below


class ProviderStatus(TypedDict, total=False):
    name: str
    kind: str
    base_url: str
    model: str
    paid: bool
    key_problem: str | None  # "no key: $NAME is not set" when its api_key_env is unset
    breaker: dict[str, Any]
    health: str
    figures: dict[str, Any]
    # GET /v1/providers adds:
    health_detail: dict[str, Any] | None
    budget: dict[str, Any] | None
    process: str | None
    process_state: str | None


class ProfileStatus(TypedDict, total=False):
    name: str
    active: bool
    providers: list[str]
    mode: str
    adaptive: bool
    health_action: str
    effective_order: list[str]
    skips: list[dict[str, Any]]
    order_notes: list[dict[str, Any]]


class Status(TypedDict, total=False):
    api_version: int
    version: str
    pid: int
    started_at: float
    uptime_s: float
    listen: dict[str, Any]
    config_path: str
    embedded_config: bool
    admin_socket: str
    active_profile: str
    default_profile: str
    last_reload_error: str | None
    stats_window_s: float
    providers: list[ProviderStatus]
    profiles: list[ProfileStatus]
    routes: list[dict[str, str]]
    state_dir: str
    store: dict[str, Any]
    processes: dict[str, dict[str, Any]]
    health: dict[str, Any]
    budget: dict[str, Any] | None


class ProfilesAnswer(TypedDict):
    active: str
    default: str
    profiles: list[ProfileStatus]


class ProfileDetail(TypedDict, total=False):
    name: str
    active: bool
    default: bool
    settings: dict[str, Any]
    effective_order: list[str]
    skips: list[dict[str, Any]]
    order_notes: list[dict[str, Any]]
    providers: list[ProviderStatus]
    routes: list[str]


class UseProfileAnswer(TypedDict):
    ok: bool
    previous: str
    active: str


class ReloadAnswer(TypedDict, total=False):
    ok: bool
    path: str
    changed: list[str]
    message: str
    error: str


class ConfigCheckAnswer(TypedDict, total=False):
    ok: bool
    path: str
    message: str
    error: str
    providers: list[str]
    profiles: list[str]


class ProvidersAnswer(TypedDict):
    providers: list[ProviderStatus]
    stats_window_s: float | None


class ProcessesAnswer(TypedDict):
    processes: dict[str, dict[str, Any]]
    names: list[str]  # every name `corectl restart NAME` accepts


class ProcessActionAnswer(TypedDict, total=False):
    ok: bool
    action: str
    process: dict[str, Any]
    ready: bool
    message: str


class ModelEntry(TypedDict, total=False):
    id: str
    loaded: bool | None
    size: int
    max_context_length: int
    instances: list[str]


class ProviderModels(TypedDict, total=False):
    provider: str
    backend: str
    models: list[ModelEntry]
    error: str  # the backend could not be asked (one line, names its URL)


class ModelsAnswer(TypedDict):
    providers: list[ProviderModels]


class ModelControlAnswer(TypedDict, total=False):
    provider: str
    backend: str
    model: str
    loaded: bool
    already_loaded: bool
    already_unloaded: bool
    load_time_seconds: float
    instances: list[str]


class Trace(TypedDict, total=False):
    request_id: str
    ts: float
    ingress: str
    stream: bool
    model_requested: str
    model_used: str
    profile: str
    mode: str | None
    candidates: list[str] | None
    effective_order: list[str] | None
    order_notes: list[dict[str, Any]] | None
    skips: list[dict[str, Any]]
    attempts: list[dict[str, Any]]
    served_by: str | None
    status: int
    error_class: str | None
    race_outcome: str | None
    latency_ms: float | None
    ttfb_ms: float | None
    usage: dict[str, Any]
    cost_usd: float | None


class RequestsAnswer(TypedDict):
    requests: list[Trace]
    kept: int
