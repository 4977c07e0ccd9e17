"""The admin API: a FastAPI app served on the Unix socket by server.AdminServer, built on the first admin request.

Request bodies and answers are the pydantic models of apitype.py (shared with corectl); errors keep the admin
API's own shape (errors.py). Handlers compute only what they return (views.py has one function per section).
They are `async def` on purpose: they run on the loop thread, so they never race the proxy over the daemon's
state."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import APIRouter, FastAPI

from ..config import ConfigError, load_config
from ..reload import apply_reload
from ..runtime import UnknownProfile
from . import apitype, views
from .errors import ANSWER, REFUSALS, AdminError, AdminRoute, JSONAnswer, install
from .version import API_VERSION

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only
    from ..runtime import Runtime

__all__ = ["API_VERSION", "create_admin_app"]

log = logging.getLogger("coderouterd.admin")

def _profile_detail(daemon: Daemon, name: str) -> dict:
    runtime = daemon.runtime
    prof = runtime.config.profiles.get(name)
    if prof is None:
        raise AdminError(404, str(UnknownProfile(name, runtime.profile_names)), valid_profiles=runtime.profile_names)
    plan = daemon.router.effective_order(name, prof, runtime).explain()
    return {
        "name": name,
        "active": name == daemon.active_profile,
        "default": name == runtime.config.server.default_profile,
        # health_threshold is no longer used: the breaker's count is what takes a provider out, for every profile.
        "settings": {**prof.model_dump(exclude={"health_threshold"}),
                     "out_after_failures": runtime.config.breaker.failures},
        "effective_order": plan["candidates"],
        "skips": plan["skips"],
        "order_notes": plan["order"],
        "providers": [_provider_brief(runtime, p) for p in prof.providers],
        "routes": [r.model for r in runtime.config.routes if r.profile == name],
    }


def _provider_brief(runtime: Runtime, name: str) -> dict:
    c = runtime.providers[name].cfg
    return {"name": name, "kind": c.kind, "base_url": c.base_url, "model": c.model, "paid": c.paid}


def daemon_routes(daemon: Daemon, socket_path: Path) -> APIRouter:
    """Status, profiles, reload and the config check."""
    r = APIRouter(route_class=AdminRoute, responses=REFUSALS)

    @r.get("/v1/status", response_model=apitype.Status, **ANSWER)
    async def status():
        return {**views.status(daemon), "admin_socket": str(socket_path), "api_version": API_VERSION}

    @r.get("/v1/profiles", response_model=apitype.ProfilesAnswer, **ANSWER)
    async def profiles() -> apitype.ProfilesAnswer:
        return views.profiles_answer(daemon)

    @r.get("/v1/profiles/{name}", response_model=apitype.ProfileDetail, **ANSWER)
    async def profile(name: str):
        return _profile_detail(daemon, name)

    @r.post("/v1/profile/use", response_model=apitype.UseProfileAnswer, **ANSWER)
    async def use_profile(body: apitype.UseProfileRequest):
        try:
            old, new = daemon.use_profile(body.name, source="corectl")
        except UnknownProfile as e:
            raise AdminError(404, str(e), valid_profiles=e.valid) from None
        if old != new:
            log.info("active profile: %s -> %s (corectl)", old, new)
        return {"ok": True, "previous": old, "active": new}

    @r.post("/v1/reload", response_model=apitype.ReloadAnswer, **ANSWER,
            responses={422: {"model": apitype.ReloadAnswer, "description": "refused; the running config stays"}})
    async def reload():
        result = await apply_reload(daemon, "corectl")
        result.setdefault("path", daemon.config_path)
        if not result.get("ok"):
            return JSONAnswer(result, status_code=422)
        return result

    @r.get("/v1/config/check", response_model=apitype.ConfigCheckAnswer, **ANSWER)
    async def config_check():
        path = daemon.config_path
        if daemon.runtime.loaded.is_embedded:
            return {"ok": True, "path": path, "message": "running on the embedded default"}
        try:
            loaded = await asyncio.to_thread(load_config, path)
        except ConfigError as e:
            return {"ok": False, "path": path, "error": str(e)}
        return {"ok": True, "path": loaded.path, "providers": sorted(loaded.model.providers),
                "profiles": sorted(loaded.model.profiles)}

    return r


def create_admin_app(daemon: Daemon, socket_path: Path) -> FastAPI:
    from .keys import key_routes
    from .ops import ops_routes

    app = FastAPI(title="coderouterd admin API", version=str(API_VERSION), openapi_url="/openapi.json",
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    install(app)
    app.include_router(daemon_routes(daemon, socket_path))
    app.include_router(ops_routes(daemon))
    app.include_router(key_routes(daemon))
    return app
