"""Admin endpoints for operating the daemon: providers, managed processes, model control, recent requests.

Included in the admin app by create_admin_app. Like the rest of the admin API, handlers are `async def` and
run on the daemon's loop, so they read the daemon's state without racing the proxy."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING
from urllib.parse import quote

import aiohttp
import orjson
from fastapi import APIRouter, Query

from ..providers.errors import UpstreamError
from ..providers.models_control import (
    BackendUnreachable,
    ModelControlError,
    list_models,
    load_model,
    unload_model,
)
from ..supervise import ExternalProcessError
from . import apitype, history, key_usage, views
from .errors import ANSWER, REFUSALS, AdminError, AdminRoute

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only
    from ..runtime import Runtime

PROCESS_ACTIONS = ("start", "stop", "restart")
DEFAULT_REQUESTS = 50
# A start can wait for readiness, but not for longer than a large model's cold load.
MAX_WAIT_S = 600.0


def _provider(runtime: Runtime, name: str):
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


def _backend_problem(p, exc: BaseException) -> str:
    """What went wrong talking to provider `p`, naming its URL (the provider's name is the caller's prefix)."""
    url = p.cfg.base_url
    if isinstance(exc, UpstreamError) and exc.reason != "connect_error":
        return f"{exc.message} ({url})"
    if isinstance(exc, orjson.JSONDecodeError):
        return f"the backend's answer is not JSON ({url})"
    detail = exc.message if isinstance(exc, UpstreamError) else (str(exc) or type(exc).__name__)
    return f"cannot reach the backend at {url} ({detail})"


def _unreachable(p, exc: BaseException) -> AdminError:
    return AdminError(502, f"{p.name}: {_backend_problem(p, exc)}", provider=p.name, base_url=p.cfg.base_url)


def ops_routes(daemon: Daemon) -> APIRouter:
    r = APIRouter(route_class=AdminRoute, responses=REFUSALS)

    @r.get("/v1/providers", response_model=apitype.ProvidersAnswer, **ANSWER)
    async def providers():
        runtime = daemon.runtime
        return {"providers": views.provider_rows(daemon), "stats_window_s": runtime.config.adaptive.window_s}

    @r.get("/v1/processes", response_model=apitype.ProcessesAnswer, **ANSWER)
    async def processes():
        return {"processes": views.processes(daemon), "names": _process_names(daemon)}

    @r.post("/v1/processes/{name}/{action}", response_model=apitype.ProcessActionAnswer, **ANSWER)
    async def process_action(name: str, action: str, body: apitype.ProcessActionRequest | None = None):
        if action not in PROCESS_ACTIONS:
            raise AdminError(404, f"unknown process action {action!r}; expected one of {', '.join(PROCESS_ACTIONS)}")
        wait = body.wait_s if body is not None else 0.0
        procs = daemon.processes
        mp = procs.resolve(name) if procs is not None else None
        if procs is None or mp is None:
            valid = _process_names(daemon)
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

    @r.get("/v1/models", response_model=apitype.ModelsAnswer, **ANSWER)
    async def models(provider: str | None = None):
        runtime = daemon.runtime
        if provider is not None:
            p = _provider(runtime, provider)
            try:
                return {"providers": [_with_window(p, await list_models(p))]}
            except _BACKEND_ERRORS as e:
                raise _unreachable(p, e) from None
            except ModelControlError as e:
                raise AdminError(502, f"{provider}: {e} ({p.cfg.base_url})", provider=provider) from None
        stopped = _stopped_processes()
        names = [n for n in runtime.providers if n not in stopped]
        results = await asyncio.gather(*(list_models(runtime.providers[n]) for n in names), return_exceptions=True)
        # A stopped managed process is not asked (it would only refuse the connection): what it is, is said.
        out: list[dict] = [{"provider": n, "error": why, "models": []} for n, why in stopped.items()]
        for name, res in zip(names, results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                p = runtime.providers[name]
                problem = _backend_problem(p, res) if isinstance(res, _BACKEND_ERRORS) else str(res)
                out.append({"provider": name, "error": problem, "models": []})
            else:
                out.append(_with_window(runtime.providers[name], res))
        return {"providers": out, "resident": _resident()}

    def _stopped_processes() -> dict[str, str]:
        procs = daemon.processes
        if procs is None:
            return {}
        out = {}
        for name, snap in procs.supervisor.snapshot().items():
            if snap["state"] not in ("stopped", "fatal"):
                continue
            for provider in snap["providers"]:
                why = snap.get("fatal_reason") or ("the next request that needs it starts it"
                                                   if procs.scheduler.can_start(provider)
                                                   else f"`corectl start {name}` starts it")
                out[provider] = f"managed process {name} is {snap['state']}: {why}"
        return out

    def _resident() -> dict | None:
        procs = daemon.processes
        if procs is None:
            return None
        snap = procs.snapshot()
        sup = procs.supervisor.snapshot()
        for name, p in snap["processes"].items():
            s = sup.get(name) or {}
            p.update(state=s.get("state"), providers=s.get("providers"), last_stop_reason=s.get("last_stop_reason"))
        return snap

    def _with_window(p, listed: dict) -> dict:
        """The context a request gets on this provider, next to its models (from config or its server)."""
        window = daemon.router.context_window(p)
        return {**listed, "context_window": window or None}

    async def _control(body: apitype.ModelControlRequest, fn, *, check_memory: bool = False):
        runtime = daemon.runtime
        name, model = body.provider, body.model
        p = _provider(runtime, name)
        try:
            if check_memory and not body.force and p.cfg.is_local():
                await _refuse_if_too_large(p, name, model)
            return await fn(p, model)
        except _BACKEND_ERRORS as e:
            raise _unreachable(p, e) from None
        except ModelControlError as e:
            raise AdminError(422, f"{name}: {e}", provider=name, model=model) from None

    async def _refuse_if_too_large(p, name: str, model: str) -> None:
        listed = await list_models(p)
        size = next((m.get("size") for m in listed["models"] if m.get("id") == model), None)
        why = await daemon.ram_watch.check_fits(size if isinstance(size, int) else None)
        if why:
            raise AdminError(409, f"{name}: not loading {model}: {why}", provider=name, model=model,
                             model_bytes=size, available_bytes=daemon.ram_watch.available)

    @r.post("/v1/models/load", response_model=apitype.ModelControlAnswer, **ANSWER)
    async def models_load(body: apitype.ModelControlRequest):
        return await _control(body, load_model, check_memory=True)

    @r.post("/v1/models/unload", response_model=apitype.ModelControlAnswer, **ANSWER)
    async def models_unload(body: apitype.ModelControlRequest):
        return await _control(body, unload_model)

    @r.get("/v1/requests", response_model=apitype.RequestsAnswer, **ANSWER)
    async def requests(limit: int = Query(DEFAULT_REQUESTS, ge=0)):
        recent = daemon.recent
        out: list[dict] = []
        # Newest last in the OrderedDict; iterate from the end and stop early.
        for rid in reversed(recent):
            if len(out) >= limit:
                break
            out.append(recent[rid])
        return {"requests": out, "kept": len(recent)}

    @r.get("/v1/history/spend", response_model=apitype.SpendAnswer, **ANSWER)
    async def history_spend():
        return await history.spend(daemon)

    @r.get("/v1/history/trends", response_model=apitype.TrendsAnswer, **ANSWER)
    async def history_trends(range: str = Query(history.DEFAULT_RANGE)):
        if range not in history.RANGES:
            raise AdminError(400, f"unknown range {range!r}; expected one of {', '.join(history.RANGES)}",
                             valid=list(history.RANGES))
        return await history.trends(daemon, range)

    @r.get("/v1/history/keys", response_model=apitype.KeyUsageAnswer, **ANSWER)
    async def history_keys(range: str = Query(history.DEFAULT_RANGE)):
        try:
            return await key_usage.daemon_keys(daemon, range)
        except ValueError as e:
            raise AdminError(400, str(e), valid=list(history.RANGES)) from None

    @r.get("/v1/history/requests", response_model=apitype.HistoryRequestsAnswer, **ANSWER)
    async def history_requests(profile: str | None = None, provider: str | None = None,
                               outcome: str | None = None, key: str | None = None,
                               limit: int = Query(DEFAULT_REQUESTS, ge=1, le=history.MAX_REQUESTS)):
        try:
            return await history.requests(daemon, profile=profile, provider=provider, outcome=outcome, limit=limit,
                                          key=key)
        except ValueError as e:
            raise AdminError(400, str(e)) from None

    @r.get("/v1/requests/{request_id}", response_model=apitype.Trace, **ANSWER)
    async def request_trace(request_id: str):
        trace = daemon.recent.get(request_id)
        if trace is None:
            raise AdminError(404, f"request {request_id!r} is not among the {len(daemon.recent)} recent requests "
                                  "coderouterd keeps in memory", request_id=request_id)
        link = dashboard_url(daemon, request_id)
        return {**trace, "dashboard_url": link} if link else trace

    return r


def dashboard_url(daemon, request_id: str) -> str | None:
    """The request's trace on the dashboard (`/ui#/requests/ID`), which `corectl explain` prints; None when the
    dashboard is off."""
    if not daemon.runtime.config.server.dashboard:
        return None
    host, port = daemon.listen
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{port}/ui#/requests/{quote(request_id, safe='')}"
