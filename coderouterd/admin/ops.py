"""Admin endpoints for operating the daemon: providers, managed processes, model control, recent requests.

Registered on the admin app by create_admin_app. Like the rest of the admin API, handlers are `async def` and
run on the daemon's loop, so they read the daemon's state without racing the proxy."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from ..providers.errors import UpstreamError
from ..providers.models_control import (
    BackendUnreachable,
    ModelControlError,
    list_models,
    load_model,
    unload_model,
)
from ..supervise import ExternalProcessError
from .api import _json_body, _runtime
from .asgi import AdminApp, AdminError

PROCESS_ACTIONS = ("start", "stop", "restart")
DEFAULT_REQUESTS = 50
# A start can wait for readiness, but not for longer than a large model's cold load.
MAX_WAIT_S = 600.0


def _provider(runtime, name: str):
    p = runtime.providers.get(name)
    if p is None:
        valid = sorted(runtime.providers)
        raise AdminError(404, f"unknown provider {name!r}; valid providers: {', '.join(valid)}",
                         valid_providers=valid)
    return p


def _process_names(daemon) -> list[str]:
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


def _model_args(body: dict) -> tuple[str, str]:
    provider, model = body.get("provider"), body.get("model")
    if not isinstance(provider, str) or not provider:
        raise AdminError(400, "provider: required, a provider name (string)")
    if not isinstance(model, str) or not model:
        raise AdminError(400, "model: required, a model id (string)")
    return provider, model


def register_ops(app: AdminApp, daemon) -> None:
    @app.get("/v1/providers")
    async def providers(_req):
        _runtime(daemon)
        status = daemon.status()
        procs = status.get("processes") or {}
        by_provider = {p: name for name, snap in procs.items() for p in snap.get("providers", [])}
        spend = (status.get("budget") or {}).get("providers", {})
        health = status.get("health") or {}
        out = []
        for p in status["providers"]:
            name = p["name"]
            proc = by_provider.get(name)
            out.append({**p, "health_detail": health.get(name), "budget": spend.get(name),
                        "process": proc, "process_state": procs[proc]["state"] if proc else None})
        return {"providers": out, "stats_window_s": status.get("stats_window_s")}

    @app.get("/v1/processes")
    async def processes(_req):
        _runtime(daemon)
        return {"processes": daemon.status().get("processes") or {}, "names": _process_names(daemon)}

    @app.post("/v1/processes/{name}/{action}")
    async def process_action(request):
        name, action = request.params["name"], request.params["action"]
        _runtime(daemon)
        if action not in PROCESS_ACTIONS:
            raise AdminError(404, f"unknown process action {action!r}; expected one of {', '.join(PROCESS_ACTIONS)}")
        raw = await request.body()
        body = await _json_body(request) if raw.strip() else {}
        wait = body.get("wait_s", 0)
        if not isinstance(wait, int | float) or isinstance(wait, bool) or wait < 0:
            raise AdminError(400, "wait_s: must be a number of seconds >= 0")
        procs = daemon.processes
        mp = procs.resolve(name) if procs is not None else None
        if mp is None:
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

    @app.get("/v1/models")
    async def models(req):
        provider = req.query.get("provider")
        runtime = _runtime(daemon)
        if provider is not None:
            p = _provider(runtime, provider)
            try:
                return {"providers": [await list_models(p)]}
            except _BACKEND_ERRORS as e:
                raise _unreachable(p, e) from None
            except ModelControlError as e:
                raise AdminError(502, f"{provider}: {e} ({p.cfg.base_url})", provider=provider) from None
        names = list(runtime.providers)
        results = await asyncio.gather(*(list_models(runtime.providers[n]) for n in names), return_exceptions=True)
        out = []
        for name, res in zip(names, results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                p = runtime.providers[name]
                problem = _backend_problem(p, res) if isinstance(res, _BACKEND_ERRORS) else str(res)
                out.append({"provider": name, "error": problem, "models": []})
            else:
                out.append(res)
        return {"providers": out}

    async def _control(request, fn, *, check_memory: bool = False):
        runtime = _runtime(daemon)
        body = await _json_body(request)
        name, model = _model_args(body)
        p = _provider(runtime, name)
        try:
            if check_memory and not body.get("force") and p.cfg.is_local():
                await _refuse_if_too_large(p, name, model)
            return await fn(p, model)
        except _BACKEND_ERRORS as e:
            raise _unreachable(p, e) from None
        except ModelControlError as e:
            raise AdminError(422, f"{name}: {e}", provider=name, model=model) from None

    async def _refuse_if_too_large(p, name: str, model: str) -> None:
        listed = await list_models(p)
        size = next((m.get("size") for m in listed["models"] if m.get("id") == model), None)
        why = await daemon.memory.check_fits(size if isinstance(size, int) else None)
        if why:
            raise AdminError(409, f"{name}: not loading {model}: {why}", provider=name, model=model,
                             model_bytes=size, available_bytes=daemon.memory.available)

    @app.post("/v1/models/load")
    async def models_load(request):
        return await _control(request, load_model, check_memory=True)

    @app.post("/v1/models/unload")
    async def models_unload(request):
        return await _control(request, unload_model)

    @app.get("/v1/requests")
    async def requests(req):
        limit = req.query_int("limit", DEFAULT_REQUESTS)
        if limit < 0:
            raise AdminError(400, "limit: must be >= 0")
        recent = daemon.recent
        out = []
        # Newest last in the OrderedDict; iterate from the end and stop early.
        for rid in reversed(recent):
            if len(out) >= limit:
                break
            out.append(recent[rid])
        return {"requests": out, "kept": len(recent)}

    @app.get("/v1/requests/{request_id}")
    async def request_trace(req):
        request_id = req.params["request_id"]
        trace = daemon.recent.get(request_id)
        if trace is None:
            raise AdminError(404, f"request {request_id!r} is not among the {len(daemon.recent)} recent requests "
                                  "coderouterd keeps in memory", request_id=request_id)
        return trace
