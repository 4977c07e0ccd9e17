"""The status view-model: what `corectl status` and the admin endpoints show, built from the daemon's parts.

One function per section, so each endpoint computes only what it returns: `/v1/profiles` plans the profiles
(the costly part: every profile's effective order), `/v1/providers` reads breakers, stats and health, and
neither builds the other's section. `status()` is every section together, for `/v1/status`.

Each section is an apitype model (typed, the same classes corectl validates with), built from the parts' own
snapshots. A provider's state word is computed here once (admin/words.py) and printed as is by the dashboard
and corectl."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from ..config.envfile import missing_keys
from ..guards.budget import BudgetSkips
from ..routing.availability import Availability, Code
from . import apitype
from .words import state_word

if TYPE_CHECKING:
    from ..config import ProfileConfig
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only


def daemon_info(daemon: Daemon) -> apitype.DaemonInfo:
    """Who and where the daemon is, and its configuration's identity (cheap: no provider is looked at)."""
    return apitype.DaemonInfo.model_validate(_daemon_info(daemon))


def _daemon_info(daemon: Daemon) -> dict[str, Any]:
    cfg = daemon.runtime.config
    host, port = daemon.listen
    url_host = f"[{host}]" if ":" in host else host
    t = daemon.telemetry
    return {
        "version": daemon.version,
        "pid": daemon.pid,
        "started_at": daemon.started_at,
        "uptime_s": time.time() - daemon.started_at,
        "listen": {"host": host, "port": port, "url": f"http://{url_host}:{port}"},
        "config_path": daemon.config_path,
        "embedded_config": daemon.runtime.loaded.is_embedded,
        "active_profile": daemon.active_profile,
        "default_profile": cfg.server.default_profile,
        "last_reload_error": daemon.last_reload_error,
        "stats_window_s": cfg.adaptive.window_s,
        "routes": [{"model": r.model, "profile": r.profile} for r in cfg.routes],
        "state_dir": str(t.state_dir),
    }


def _process_of(daemon: Daemon) -> dict[str, tuple[str, str]]:
    """provider -> (its managed process's name, that process's state)."""
    if daemon.processes is None:
        return {}
    return {p: (name, snap["state"]) for name, snap in daemon.processes.supervisor.snapshot().items()
            for p in snap.get("providers", [])}


def providers(daemon: Daemon) -> list[apitype.ProviderStatus]:
    """Each provider with whether it can take traffic and why not (routing/availability.py: the one answer), its
    one state word, its breaker, health, figures and the local-model extras."""
    return [apitype.ProviderStatus.model_validate(p) for p in _providers(daemon)]


def _providers(daemon: Daemon, procs: Mapping[str, tuple[str, str]] | None = None,
               spend: Mapping[str, apitype.ProviderBudgetLine] | None = None) -> list[dict[str, Any]]:
    runtime, router, routing = daemon.runtime, daemon.router, daemon.routing
    no_key = missing_keys({n: p.cfg for n, p in runtime.providers.items()})
    answers = router.providers_availability(runtime, daemon.active_profile)
    procs = _process_of(daemon) if procs is None else procs
    spend = budget(daemon).providers if spend is None else spend
    warn_ratio = daemon.runtime.config.budget.warn_ratio
    out = []
    for name, p in runtime.providers.items():
        c = p.cfg
        answer = answers.get(name)
        proc = procs.get(name)
        line = spend.get(name)
        word = state_word(answer, process_state=proc[1] if proc else None, key_problem=no_key.get(name),
                          budget_ratio=line.ratio if line is not None else None,
                          warn_ratio=warn_ratio) if answer is not None else None
        out.append({
            "name": name, "kind": c.kind, "base_url": c.base_url, "model": c.model, "paid": c.paid,
            "availability": answer.as_dict() if answer is not None else None,
            "state": word.as_dict() if word is not None else None,
            "key_problem": no_key.get(name),
            "breaker": router.breakers.get(name).snapshot(),
            "health": routing.health_of(name) or "unknown",
            "auth": routing.auth_state(name),
            "figures": router.stats.figures(name),
            "cache": daemon.affinity.provider_status(name),
            "context_window": router.context_window(p) or None,
            "configured_context_window": c.context_window or None,
            "server": server.as_dict() if (server := daemon.servers.info(p)) is not None else None,
            "tool_repair": {"mode": c.tool_repair, "local": c.is_local(), **daemon.repair_stats.snapshot(name)},
            "drift": daemon.drift.snapshot(name) if c.is_local() else None,
        })
    return out


def provider_rows(daemon: Daemon) -> list[apitype.ProviderRow]:
    """Each provider as GET /v1/providers and the dashboard show it: its status, its health detail, its month's
    spend, and the managed process serving it."""
    procs = _process_of(daemon)
    spend = budget(daemon).providers
    detail = health(daemon)
    out = []
    for p in _providers(daemon, procs, spend):
        name = p["name"]
        proc = procs.get(name)
        line = spend.get(name)
        out.append(apitype.ProviderRow.model_validate({
            **p, "health_detail": detail.get(name), "budget": line, "process": proc[0] if proc else None,
            "process_state": proc[1] if proc else None}))
    return out


def profiles(daemon: Daemon) -> list[apitype.ProfileStatus]:
    """Each profile with its effective order: this plans every profile, so only endpoints that show it call it.

    The order is the planner's, with two corrections of what it means for a reader: a provider the budget skipped
    on every recent request is listed with the skips (its words, as `corectl explain` gives them), not as taking
    traffic (E1); and a chain whose only providers are stopped on demand says that a request starts them, not
    that none is available (D6)."""
    runtime = daemon.runtime
    answers = daemon.router.providers_availability(runtime, daemon.active_profile)
    out = []
    for name in runtime.profile_names:
        prof = runtime.config.profiles[name]
        out.append(apitype.ProfileStatus.model_validate({
            "name": name, "active": name == daemon.active_profile, "providers": list(prof.providers),
            "mode": prof.mode, "adaptive": prof.adaptive, "health_action": prof.health_action,
            **effective(daemon, name, prof, answers)}))
    return out


def effective(daemon: Daemon, name: str, prof: ProfileConfig,
              answers: Mapping[str, Availability] | None = None) -> dict[str, Any]:
    """A profile's effective order now, in the planner's terms and in words: effective_order, order_words, skips,
    order_notes (`profiles` and GET /v1/profiles/NAME)."""
    runtime, router = daemon.runtime, daemon.router
    if answers is None:
        answers = router.providers_availability(runtime, daemon.active_profile)
    plan = router.effective_order(name, prof, runtime).explain()
    order, skips = _skipping(list(cast(list[str], plan["candidates"])),
                             list(cast(list[dict[str, Any]], plan["skips"])), answers)
    return {"effective_order": order, "order_words": order_words(order, skips, answers), "skips": skips,
            "order_notes": plan["order"]}


def _skipping(order: list[str], skips: list[dict[str, Any]],
              answers: Mapping[str, Availability]) -> tuple[list[str], list[dict[str, Any]]]:
    """Move the providers that are routed but get nothing (every recent request skipped for budget) to the skips."""
    # By the budget skip alone: the verdicts are the active profile's (its health_action, its panic), and this
    # profile's planner may route a provider they call out; only a budget skip is the same for every profile.
    out = [p for p in order if (a := answers.get(p)) is None or a.code is not Code.BUDGET_SKIPPED]
    for p in order:
        if p not in out:
            a = answers[p]
            skips.append({"provider": p, "outcome": "skipped", "reason": "budget", "message": f"{p}: {a.words}"})
    return out, skips


def order_words(order: list[str], skips: list[dict[str, Any]], answers: Mapping[str, Availability]) -> str:
    """An effective order in words, as `corectl status` and the Profiles view print it."""
    if order:
        return " > ".join(order)
    waking = [s["provider"] for s in skips if (a := answers.get(s["provider"])) is not None
              and a.code is Code.ON_DEMAND]
    if waking:
        return f"{' > '.join(waking)} (stopped: a request starts {'it' if len(waking) == 1 else 'them'} on demand)"
    return "none available"


def profiles_answer(daemon: Daemon) -> apitype.ProfilesAnswer:
    """GET /v1/profiles and the dashboard's /ui/api/profiles: the active and default profile, and every profile."""
    return apitype.ProfilesAnswer(active=daemon.active_profile, default=daemon.runtime.config.server.default_profile,
                                  profiles=profiles(daemon))


def store(daemon: Daemon) -> apitype.StoreStatus:
    """Whether state is persisted, and what is wrong with the state directory if anything."""
    t = daemon.telemetry
    problems = [t.unusable,
                f"state database: {t.store.problem}" if not t.store.healthy else None,
                f"audit log: {t.audit.problem}" if t.audit is not None and not t.audit.healthy else None]
    if not t.store.healthy and t.store.dropped_this_outage:
        problems.append(f"{t.store.dropped_this_outage} journal rows dropped so far (the oldest waiting)")
    found = [p for p in problems if p]
    return apitype.StoreStatus(enabled=t.enabled, healthy=not found, problem="; ".join(found) or None)


def processes(daemon: Daemon) -> dict[str, apitype.ProcessNow]:
    """Managed processes by name, each with whether self-healing is probing it and when next."""
    return {name: apitype.ProcessNow.model_validate(snap) for name, snap in _processes(daemon).items()}


def _processes(daemon: Daemon) -> dict[str, dict[str, Any]]:
    if daemon.processes is None:
        return {}
    procs = daemon.processes.supervisor.snapshot()
    recovering = daemon.selfheal.snapshot() if daemon.selfheal is not None else {}
    resident = daemon.processes.snapshot()["processes"]
    for name, snap in procs.items():
        # On demand and the memory budget: resident or not, what it holds, when it stops if left idle.
        snap.update(resident.get(name) or {})
        # A process serving several providers is probed for each; the soonest probe is the one to show.
        times = [recovering[p]["next_probe_at"] for p in snap["providers"]
                 if p in recovering and recovering[p]["next_probe_at"] is not None]
        snap["recovering"] = any(p in recovering for p in snap["providers"])
        snap["next_probe_at"] = min(times) if times else None
    return procs


def models_memory(daemon: Daemon) -> apitype.ModelsMemory | None:
    """The memory budget of local models: what is held against it (None: no managed process)."""
    if daemon.processes is None:
        return None
    snap = daemon.processes.snapshot()
    # Saved caches: the lanes each llama-server can get back from disk after a stop, and the disk they hold.
    saved = {name: len(pp.slots.saved) for name, pp in daemon.affinity.index.providers.items()
             if pp.slots is not None and pp.slots.saved}
    return apitype.ModelsMemory(
        memory_budget_mb=snap["memory_budget_mb"], memory_held_mb=snap["memory_held_mb"],
        resident=sorted(n for n, p in snap["processes"].items() if p["resident"]), swaps=snap.get("swaps", 0),
        waiting=sum(p.get("waiting", 0) for p in snap["processes"].values()), saved_lanes=saved,
        saved_bytes=daemon.affinity.warm.disk_bytes)


def health(daemon: Daemon) -> dict[str, apitype.HealthDetail]:
    snap = daemon.health.snapshot() if daemon.health is not None else {}
    return {name: apitype.HealthDetail.model_validate(h) for name, h in snap.items()}


def budget(daemon: Daemon) -> apitype.BudgetStatus:
    """The month's spend against the caps, and each provider's budget skips of the window (guards/budget.py)."""
    snap = daemon.budget.snapshot()
    # The skips are counted where reservations are refused (guards/apply.BudgetHooks), which routing reads.
    skips: BudgetSkips | None = getattr(daemon.router.sources.budget, "skips", None)
    if skips is not None:
        for name, line in snap.get("providers", {}).items():
            r = skips.recent(name)
            if r is not None:
                line["skipped"] = {"count": r.count, "least_usd": r.least_usd, "left_usd": r.left_usd,
                                   "admitted": r.admitted, "window_s": r.window_s, "words": r.words()}
    return apitype.BudgetStatus.model_validate(snap)


def status(daemon: Daemon, *, admin_socket: str, api_version: int) -> apitype.Status:
    """Everything `corectl status` shows."""
    procs = _process_of(daemon)
    ledger = budget(daemon)
    return apitype.Status.model_validate({
        **_daemon_info(daemon),
        "api_version": api_version,
        "admin_socket": admin_socket,
        "providers": _providers(daemon, procs, ledger.providers),
        "profiles": profiles(daemon),
        "store": store(daemon),
        "processes": _processes(daemon),
        "models": models_memory(daemon),
        "health": health(daemon),
        "budget": ledger,
        "memory": daemon.ram_watch.snapshot(),
        "shared": shared(daemon),
        "keys": keys(daemon),
    })


def keys(daemon: Daemon) -> apitype.KeysStatus:
    """Team and operator keys (`corectl keys`): required or not, how many, what other machines get (N13)."""
    from ..ingress.browsers import remote_access

    server = daemon.runtime.config.server
    return apitype.KeysStatus.model_validate({
        "required": daemon.keys.required or bool(server.api_keys), "team_keys_required": daemon.keys.required,
        "counts": daemon.keys.counts(), "operator_keys": len(server.api_keys),
        "storage": daemon.key_service.storage.kind, "refused": daemon.key_gate.refused,
        "remote_access": remote_access(daemon.listen[0], server.allowed_hosts)})


def shared(daemon: Daemon) -> apitype.SharedStatus | None:
    """The shared state (several instances, README: Several machines): None with the local backend."""
    s = daemon.shared.status()
    return apitype.SharedStatus.model_validate(s) if s is not None else None
