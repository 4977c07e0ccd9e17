"""The status view-model: what `corectl status` and the admin endpoints show, built from the daemon's parts.

One function per section, so each endpoint computes only what it returns: `/v1/profiles` plans the profiles
(the costly part: every profile's effective order), `/v1/providers` reads breakers, stats and health, and
neither builds the other's section. `status()` is every section together, for `/v1/status`."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..config.envfile import missing_keys
from . import apitype

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only


def daemon_info(daemon: Daemon) -> dict:
    """Who and where the daemon is, and its configuration's identity (cheap: no provider is looked at)."""
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


def providers(daemon: Daemon) -> list[dict]:
    """Each provider with whether it can take traffic and why not (routing/availability.py: the one answer), its
    breaker, health, figures and the local-model extras."""
    runtime, router, routing = daemon.runtime, daemon.router, daemon.routing
    no_key = missing_keys({n: p.cfg for n, p in runtime.providers.items()})
    answers = router.providers_availability(runtime, daemon.active_profile)
    out = []
    for name, p in runtime.providers.items():
        c = p.cfg
        answer = answers.get(name)
        out.append({
            "name": name, "kind": c.kind, "base_url": c.base_url, "model": c.model, "paid": c.paid,
            "availability": answer.as_dict() if answer is not None else None,
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


def provider_rows(daemon: Daemon) -> list[dict]:
    """Each provider as GET /v1/providers and the dashboard show it: its status, its health detail, its month's
    spend, and the managed process serving it."""
    procs = processes(daemon)
    by_provider = {p: name for name, snap in procs.items() for p in snap.get("providers", [])}
    spend = budget(daemon).get("providers", {})
    detail = health(daemon)
    out = []
    for p in providers(daemon):
        name = p["name"]
        proc = by_provider.get(name)
        out.append({**p, "health_detail": detail.get(name), "budget": spend.get(name),
                    "process": proc, "process_state": procs[proc]["state"] if proc else None})
    return out


def profiles(daemon: Daemon) -> list[dict]:
    """Each profile with its effective order: this plans every profile, so only endpoints that show it call it."""
    runtime, router = daemon.runtime, daemon.router
    out = []
    for name in runtime.profile_names:
        prof = runtime.config.profiles[name]
        plan = router.effective_order(name, prof, runtime).explain()
        out.append({
            "name": name, "active": name == daemon.active_profile, "providers": list(prof.providers),
            "mode": prof.mode, "adaptive": prof.adaptive, "health_action": prof.health_action,
            "effective_order": plan["candidates"], "skips": plan["skips"], "order_notes": plan["order"],
        })
    return out


def profiles_answer(daemon: Daemon) -> apitype.ProfilesAnswer:
    """GET /v1/profiles and the dashboard's /ui/api/profiles: the active and default profile, and every profile."""
    return apitype.ProfilesAnswer.model_validate({"active": daemon.active_profile,
                                                  "default": daemon.runtime.config.server.default_profile,
                                                  "profiles": profiles(daemon)})


def store(daemon: Daemon) -> dict:
    """Whether state is persisted, and what is wrong with the state directory if anything."""
    t = daemon.telemetry
    problems = [t.unusable,
                f"state database: {t.store.problem}" if not t.store.healthy else None,
                f"audit log: {t.audit.problem}" if t.audit is not None and not t.audit.healthy else None]
    if not t.store.healthy and t.store.dropped_this_outage:
        problems.append(f"{t.store.dropped_this_outage} journal rows dropped so far (the oldest waiting)")
    found = [p for p in problems if p]
    return {"enabled": t.enabled, "healthy": not found, "problem": "; ".join(found) or None}


def processes(daemon: Daemon) -> dict[str, dict]:
    """Managed processes by name, each with whether self-healing is probing it and when next."""
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


def models_memory(daemon: Daemon) -> dict | None:
    """The memory budget of local models: what is held against it (None: no managed process)."""
    if daemon.processes is None:
        return None
    snap = daemon.processes.snapshot()
    # Saved caches: the lanes each llama-server can get back from disk after a stop, and the disk they hold.
    saved = {name: len(pp.slots.saved) for name, pp in daemon.affinity.index.providers.items()
             if pp.slots is not None and pp.slots.saved}
    return {"memory_budget_mb": snap["memory_budget_mb"], "memory_held_mb": snap["memory_held_mb"],
            "resident": sorted(n for n, p in snap["processes"].items() if p["resident"]),
            "saved_lanes": saved, "saved_bytes": daemon.affinity.warm.disk_bytes}


def health(daemon: Daemon) -> dict:
    return daemon.health.snapshot() if daemon.health is not None else {}


def budget(daemon: Daemon) -> dict:
    return daemon.budget.snapshot()


def status(daemon: Daemon) -> dict:
    """Everything `corectl status` shows, as JSON-ready data."""
    return {
        **daemon_info(daemon),
        "providers": providers(daemon),
        "profiles": profiles(daemon),
        "store": store(daemon),
        "processes": processes(daemon),
        "models": models_memory(daemon),
        "health": health(daemon),
        "budget": budget(daemon),
        "memory": daemon.ram_watch.snapshot(),
        "shared": shared(daemon),
        "keys": keys(daemon),
    }


def keys(daemon: Daemon) -> dict:
    """Team and operator keys (`corectl keys`): required or not, how many, what other machines get (N13)."""
    from ..ingress.browsers import remote_access

    server = daemon.runtime.config.server
    return {"required": daemon.keys.required or bool(server.api_keys), "team_keys_required": daemon.keys.required,
            "counts": daemon.keys.counts(), "operator_keys": len(server.api_keys),
            "storage": daemon.key_service.storage.kind, "refused": daemon.key_gate.refused,
            "remote_access": remote_access(daemon.listen[0], server.allowed_hosts)}


def shared(daemon) -> dict | None:
    """The shared state (several instances, README: Several machines): None with the local backend."""
    return daemon.shared.status()
