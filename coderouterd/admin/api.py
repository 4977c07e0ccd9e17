"""The admin API's routes, served on the Unix socket by server.AdminServer.

Handlers are `async def` on purpose: they run on the loop thread, so they never race the proxy over the
daemon's state."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import orjson

from ..config import ConfigError, load_config
from ..live_config import UnknownProfile
from ..reload import apply_reload
from .asgi import AdminApp, AdminError, AdminRequest
from .version import API_VERSION

__all__ = ["API_VERSION", "create_admin_app"]

log = logging.getLogger("coderouterd.admin")



async def _json_body(request: AdminRequest) -> dict:
    raw = await request.body()
    if not raw:
        raise AdminError(400, "request body must be a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise AdminError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise AdminError(400, "request body must be a JSON object")
    return body


def _runtime(daemon):
    runtime = daemon.runtime
    if runtime is None:
        raise AdminError(503, "coderouterd is still starting")
    return runtime


def _profile_detail(daemon, name: str) -> dict:
    runtime = _runtime(daemon)
    prof = runtime.config.profiles.get(name)
    if prof is None:
        raise AdminError(404, str(UnknownProfile(name, runtime.profile_names)), valid_profiles=runtime.profile_names)
    plan = daemon.router.effective_order(name, prof, runtime).explain()
    return {
        "name": name,
        "active": name == daemon.active_profile,
        "default": name == runtime.config.server.default_profile,
        "settings": prof.model_dump(),
        "effective_order": plan["candidates"],
        "skips": plan["skips"],
        "order_notes": plan["order"],
        "providers": [_provider_brief(runtime, p) for p in prof.providers],
        "routes": [r.model for r in runtime.config.routes if r.profile == name],
    }


def _provider_brief(runtime, name: str) -> dict:
    c = runtime.providers[name].cfg
    return {"name": name, "kind": c.kind, "base_url": c.base_url, "model": c.model, "paid": c.paid}


def create_admin_app(daemon, socket_path: Path) -> AdminApp:
    app = AdminApp(api_version=API_VERSION)

    @app.get("/v1/status")
    async def status(_req):
        _runtime(daemon)
        out = daemon.status()
        out["admin_socket"] = str(socket_path)
        out["api_version"] = API_VERSION
        return out

    @app.get("/v1/profiles")
    async def profiles(_req):
        runtime = _runtime(daemon)
        return {"active": daemon.active_profile, "default": runtime.config.server.default_profile,
                "profiles": daemon.status()["profiles"]}

    @app.get("/v1/profiles/{name}")
    async def profile(req):
        return _profile_detail(daemon, req.params["name"])

    @app.post("/v1/profile/use")
    async def use_profile(request):
        body = await _json_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise AdminError(400, "name: required, a profile name (string)")
        _runtime(daemon)
        try:
            old, new = daemon.use_profile(name, source="corectl")
        except UnknownProfile as e:
            raise AdminError(404, str(e), valid_profiles=e.valid) from None
        if old != new:
            log.info("active profile: %s -> %s (corectl)", old, new)
        return {"ok": True, "previous": old, "active": new}

    @app.post("/v1/reload")
    async def reload(_req):
        _runtime(daemon)
        result = await apply_reload(daemon, "corectl")
        result.setdefault("path", daemon.config_path)
        if not result.get("ok"):
            return 422, result
        return result

    @app.get("/v1/config/check")
    async def config_check(_req):
        path = daemon.config_path
        if daemon.runtime is not None and daemon.runtime.loaded.is_embedded:
            return {"ok": True, "path": path, "message": "running on the embedded default"}
        try:
            loaded = await asyncio.to_thread(load_config, path)
        except ConfigError as e:
            return {"ok": False, "path": path, "error": str(e)}
        return {"ok": True, "path": loaded.path, "providers": sorted(loaded.model.providers),
                "profiles": sorted(loaded.model.profiles)}

    from .ops import register_ops  # here, not at the top: ops imports this module's helpers
    register_ops(app, daemon)
    return app


