"""The admin API: a FastAPI app served on the Unix socket by server.AdminServer, built on the first admin request.

Its routes are the handler table (handlers.py), one FastAPI route per entry: FastAPI reads each handler's
parameters (path, query, body) from its signature, validates them, and documents them in /openapi.json. Request
bodies and answers are the pydantic models of apitype.py (shared with corectl); errors keep the admin API's own
shape (errors.py)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, FastAPI

from .context import Ctx, Status
from .errors import ANSWER, REFUSALS, AdminRoute, JSONAnswer, install
from .handlers import HANDLERS, Handler, call
from .version import API_VERSION

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

__all__ = ["API_VERSION", "create_admin_app"]


def _endpoint(h: Handler, ctx: Ctx) -> Any:
    """The route's function: the handler's own parameters (after its Ctx), so FastAPI parses exactly those."""

    async def endpoint(**params: Any) -> Any:
        answer = await call(h, ctx, params)
        if isinstance(answer, Status):
            return JSONAnswer(answer.body, status_code=answer.status)
        return answer

    endpoint.__signature__ = inspect.Signature(h.parameters())  # type: ignore[attr-defined]
    endpoint.__name__ = h.fn.__name__
    endpoint.__doc__ = h.fn.__doc__
    return endpoint


def table_routes(daemon: Daemon, socket_path: Path) -> APIRouter:
    r = APIRouter(route_class=AdminRoute, responses=REFUSALS)
    ctx = Ctx(daemon, socket_path)
    for h in HANDLERS.values():
        r.add_api_route(h.path, _endpoint(h, ctx), methods=[h.method], response_model=h.model,
                        responses=h.responses or None, **ANSWER)
    return r


def create_admin_app(daemon: Daemon, socket_path: Path) -> FastAPI:
    app = FastAPI(title="coderouterd admin API", version=str(API_VERSION), openapi_url="/openapi.json",
                  docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None)
    install(app)
    app.include_router(table_routes(daemon, socket_path))
    return app
