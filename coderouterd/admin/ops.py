"""Admin handlers for operating the daemon: providers, managed processes, model control, recent requests.

Entries of the one handler table (handlers.py). Like the rest of the admin API, handlers are `async def` and
run on the daemon's loop, so they read the daemon's state without racing the proxy."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import quote

import aiohttp
import orjson
from annotated_types import Ge

from ..providers.errors import UpstreamError
from ..providers.models_control import (
    BackendUnreachable,
    ModelControlError,
    list_models,
    load_model,
    unload_model,
)
from ..supervise import ExternalProcessError
from . import apitype, views
from .context import AdminError, Ctx

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only
    from ..providers.provider import Provider
    from ..runtime import Runtime

PROCESS_ACTIONS = ("start", "stop", "restart")
DEFAULT_REQUESTS = 50
# A start can wait for readiness, but not for longer than a large model's cold load.
MAX_WAIT_S = 600.0


def _provider(runtime: Runtime, name: str) -> Provider:
    p = runtime.providers.get(name)
    if p is None:
        valid = sorted(runtime.providers)
        raise AdminError(404, f"unknown provider {name!r}; valid providers: {', '.join(valid)}",
                         valid_providers=valid)
    return p


def _process_names(daemon: Daemon) -> list[str]:
    """Every name `corectl restart NAME` accepts: process names and the providers they serve."""
    if daemon.processes is None:
        return []
    sup = daemon.processes.supervisor
    names = set(sup.names())
    for name in sup.names():
        names.update(sup.providers_of(name))
    return sorted(names)


# What talking to a backend can raise besides an answer: one line for the user, never a traceback in the log.
_BACKEND_ERRORS = (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError, UpstreamError,
                   BackendUnreachable)


def _backend_problem(p: Provider, exc: BaseException) -> str:
    """What went wrong talking to provider `p`, naming its URL (the provider's name is the caller's prefix)."""
    url = p.cfg.base_url
    if isinstance(exc, UpstreamError) and exc.reason != "connect_error":
        return f"{exc.message} ({url})"
    if isinstance(exc, orjson.JSONDecodeError):
        return f"the backend's answer is not JSON ({url})"
    detail = exc.message if isinstance(exc, UpstreamError) else (str(exc) or type(exc).__name__)
    return f"cannot reach the backend at {url} ({detail})"


def _unreachable(p: Provider, exc: BaseException) -> AdminError:
    return AdminError(502, f"{p.name}: {_backend_problem(p, exc)}", provider=p.name, base_url=p.cfg.base_url)


async def providers(c: Ctx) -> dict[str, Any]:
    d = c.daemon
    return {"providers": views.provider_rows(d), "stats_window_s": d.runtime.config.adaptive.window_s}


async def processes(c: Ctx) -> dict[str, Any]:
    return {"processes": views.processes(c.daemon), "names": _process_names(c.daemon)}


async def process_action(c: Ctx, name: str, action: str,
                         body: apitype.ProcessActionRequest | None = None) -> dict[str, Any]:
    if action not in PROCESS_ACTIONS:
        raise AdminError(404, f"unknown process action {action!r}; expected one of {', '.join(PROCESS_ACTIONS)}")
    wait = body.wait_s if body is not None else 0.0
    procs = c.daemon.processes
    mp = procs.resolve(name) if procs is not None else None
    if procs is None or mp is None:
        valid = _process_names(c.daemon)
        listed = ", ".join(valid) if valid else "none (no provider has a [process] block)"
        raise AdminError(404, f"no managed process {name!r}; valid names: {listed}", valid=valid)
    try:
        result = await procs.action(name, action)
    except ExternalProcessError as e:
        raise AdminError(409, str(e), process=mp.snapshot()) from None
    if not result.get("ok"):
        raise AdminError(409, result.get("message") or f"{action} refused", process=result.get("process"))
    if action != "stop" and wait > 0:
        # Readiness is what the user asked for, not the spawn: a model server can take a while to load.
        result["ready"] = await mp.wait_ready(min(float(wait), MAX_WAIT_S))
        result["process"] = mp.snapshot()
    result["action"] = action
    return result


async def models(c: Ctx, provider: str | None = None) -> dict[str, Any]:
    daemon = c.daemon
    runtime = daemon.runtime
    if provider is not None:
        p = _provider(runtime, provider)
        try:
            return {"providers": [_with_window(daemon, p, await list_models(p))]}
        except _BACKEND_ERRORS as e:
            raise _unreachable(p, e) from None
        except ModelControlError as e:
            raise AdminError(502, f"{provider}: {e} ({p.cfg.base_url})", provider=provider) from None
    stopped = _stopped_processes(daemon)
    names = [n for n in runtime.providers if n not in stopped]
    results = await asyncio.gather(*(list_models(runtime.providers[n]) for n in names), return_exceptions=True)
    # A stopped managed process is not asked (it would only refuse the connection): what it is, is said. Stopped
    # on demand or by hand is its rest, not an error (D6); only a process that cannot start is one.
    out: list[dict] = []
    for n, (why, word) in stopped.items():
        model = runtime.providers[n].cfg.model
        if word is None:
            out.append({"provider": n, "error": why, "models": []})
        else:
            out.append({"provider": n, "models": [{"id": model, "loaded": False}] if model else [],
                        "process_word": word})
    running = _running_processes(daemon)
    for name, res in zip(names, results, strict=True):
        if isinstance(res, BaseException):
            if not isinstance(res, Exception):
                raise res
            p = runtime.providers[name]
            problem = _backend_problem(p, res) if isinstance(res, _BACKEND_ERRORS) else str(res)
            out.append({"provider": name, "error": problem, "models": []})
        elif name in running:
            # A managed server that is ready holds the one model it was started with, whether or not its API says
            # "loaded" (llama-server does not): resident, not "unknown".
            listed = {**res, "models": [{**m, "loaded": True} if m.get("loaded") is None else m
                                        for m in res.get("models") or []], "process_word": "resident"}
            out.append(_with_window(daemon, runtime.providers[name], listed))
        else:
            out.append(_with_window(daemon, runtime.providers[name], res))
    return {"providers": out, "resident": _resident(daemon)}


def _stopped_processes(daemon: Daemon) -> dict[str, tuple[str, str | None]]:
    """provider -> (why its managed process is not running, its word: None when it cannot start)."""
    procs = daemon.processes
    if procs is None:
        return {}
    out: dict[str, tuple[str, str | None]] = {}
    for name, snap in procs.supervisor.snapshot().items():
        if snap["state"] not in ("stopped", "fatal"):
            continue
        for provider in snap["providers"]:
            on_demand = procs.scheduler.can_start(provider)
            why = snap.get("fatal_reason") or ("the next request that needs it starts it" if on_demand
                                               else f"`corectl start {name}` starts it")
            word = None if snap["state"] == "fatal" else (
                "stopped: starts on demand" if on_demand else f"stopped: `corectl start {name}` starts it")
            out[provider] = (f"managed process {name} is {snap['state']}: {why}", word)
    return out


def _running_processes(daemon: Daemon) -> set[str]:
    """Providers whose managed process is ready: their model is resident."""
    procs = daemon.processes
    if procs is None:
        return set()
    return {p for snap in procs.supervisor.snapshot().values() if snap["state"] == "ready"
            for p in snap["providers"]}


def _resident(daemon: Daemon) -> dict | None:
    procs = daemon.processes
    if procs is None:
        return None
    snap = procs.snapshot()
    sup = procs.supervisor.snapshot()
    for name, p in snap["processes"].items():
        s = sup.get(name) or {}
        p.update(state=s.get("state"), providers=s.get("providers"), last_stop_reason=s.get("last_stop_reason"))
    return snap


def _with_window(daemon: Daemon, p: Provider, listed: dict[str, Any]) -> dict[str, Any]:
    """The context a request gets on this provider, next to its models (from config or its server)."""
    window = daemon.router.context_window(p)
    return {**listed, "context_window": window or None}


async def _control(daemon: Daemon, body: apitype.ModelControlRequest,
                   fn: Callable[[Provider, str], Awaitable[dict[str, Any]]], *,
                   check_memory: bool = False) -> dict[str, Any]:
    name, model = body.provider, body.model
    p = _provider(daemon.runtime, name)
    try:
        if check_memory and not body.force and p.cfg.is_local():
            await _refuse_if_too_large(daemon, p, name, model)
        return await fn(p, model)
    except _BACKEND_ERRORS as e:
        raise _unreachable(p, e) from None
    except ModelControlError as e:
        raise AdminError(422, f"{name}: {e}", provider=name, model=model) from None


async def _refuse_if_too_large(daemon: Daemon, p: Provider, name: str, model: str) -> None:
    listed = await list_models(p)
    size = next((m.get("size") for m in listed["models"] if m.get("id") == model), None)
    why = await daemon.ram_watch.check_fits(size if isinstance(size, int) else None)
    if why:
        raise AdminError(409, f"{name}: not loading {model}: {why}", provider=name, model=model,
                         model_bytes=size, available_bytes=daemon.ram_watch.available)


async def models_load(c: Ctx, body: apitype.ModelControlRequest) -> dict[str, Any]:
    return await _control(c.daemon, body, load_model, check_memory=True)


async def models_unload(c: Ctx, body: apitype.ModelControlRequest) -> dict[str, Any]:
    return await _control(c.daemon, body, unload_model)


async def requests(c: Ctx, limit: Annotated[int, Ge(0)] = DEFAULT_REQUESTS) -> dict[str, Any]:
    recent = c.daemon.recent
    out: list[dict] = []
    # Newest last in the OrderedDict; iterate from the end and stop early.
    for rid in reversed(recent):
        if len(out) >= limit:
            break
        out.append(recent[rid])
    return {"requests": out, "kept": len(recent)}


async def request_trace(c: Ctx, request_id: str) -> dict[str, Any]:
    daemon = c.daemon
    trace = daemon.recent.get(request_id)
    if trace is None:
        raise AdminError(404, f"request {request_id!r} is not among the {len(daemon.recent)} recent requests "
                              "coderouterd keeps in memory", request_id=request_id)
    link = dashboard_url(daemon, request_id)
    return {**trace, "dashboard_url": link} if link else trace


def dashboard_url(daemon: Daemon, request_id: str) -> str | None:
    """The request's trace on the dashboard (`/ui#/requests/ID`), which `corectl explain` prints; None when the
    dashboard is off."""
    if not daemon.runtime.config.server.dashboard:
        return None
    host, port = daemon.listen
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/ui#/requests/{quote(request_id, safe='')}"
