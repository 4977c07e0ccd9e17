"""The control plane's one map: every endpoint as (method, path) -> Handler, served by both surfaces.

The admin socket (admin/api.py) turns each entry into a FastAPI route; the dashboard (ui/app.py, raw ASGI, no
FastAPI) serves the entries marked for the browser under /ui/api/<browser name>, and refuses the others. Neither
surface has routes of its own besides the dashboard's live feed (a stream, not an answer), so a new panel costs
one handler here, its model and its JS. tests/unit/test_handlers.py proves both surfaces serve exactly this table.

A handler is `async def fn(c: Ctx, <parameters>)`: its parameters after the first are the endpoint's path
parameters (named in the path), query parameters (plain annotations, constraints as annotated_types) and a body
(a pydantic model). It returns its answer model, or a dict of it, or `Status(body, code)` for an answer that is not
a 200; it refuses with AdminError. It never imports FastAPI: the dashboard serves it without.

Handlers are `async def` on purpose: they run on the loop thread, so they never race the proxy over the daemon's
state."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

from annotated_types import Ge, Le
from pydantic import BaseModel, ValidationError

from ..config import ConfigError, load_config
from ..reload import apply_reload
from ..runtime import UnknownProfile
from ..state.journal_reader import JournalUnreadable
from . import apitype, history, inflight, key_usage, keys, ops, shared_words, views
from . import now as now_view
from .context import AdminError, Ctx, Status
from .version import API_VERSION

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

__all__ = ["HANDLERS", "Ctx", "Handler", "Status", "call", "find_any", "find_browser"]

log = logging.getLogger("coderouterd.admin")


Fn = Callable[..., Awaitable[Any]]


@dataclass(frozen=True)
class Handler:
    method: str
    path: str  # the admin socket's path; path parameters as {name}
    fn: Fn
    model: type[BaseModel]
    # Its name under /ui/api/ when the browser may call it (a GET that reads only); None: the socket's alone.
    browser: str | None = None
    responses: dict[int | str, dict[str, Any]] = field(default_factory=dict)  # further answers, for /openapi.json

    def parameters(self) -> list[inspect.Parameter]:
        """The endpoint's parameters: the handler's after its Ctx, annotations resolved."""
        sig = inspect.signature(self.fn, eval_str=False)
        scope = inspect.unwrap(self.fn).__globals__  # where its (string) annotations were written
        out = []
        for p in list(sig.parameters.values())[1:]:
            ann = p.annotation
            if isinstance(ann, str):
                ann = eval(ann, scope)  # noqa: S307 - our own annotations, in our own modules
            out.append(p.replace(annotation=ann))
        return out


async def call(h: Handler, c: Ctx, params: dict[str, Any]) -> Any:
    """Run one handler as either surface does. A journal being recovered or moved aside is a 503 the page and
    corectl both show, not a 500."""
    try:
        return await h.fn(c, **params)
    except JournalUnreadable as e:
        raise AdminError(503, f"cannot read the journal right now: {e.detail}") from None


@functools.cache
def _pattern(template: str) -> re.Pattern[str]:
    """A browser name with {params} as a regex; the last parameter takes the rest (a request id may hold '/')."""
    parts = re.split(r"(\{\w+\})", template)
    rx = ""
    for i, part in enumerate(parts):
        if part.startswith("{") and part.endswith("}"):
            rx += f"(?P<{part[1:-1]}>{'.+' if i == len(parts) - 2 else '[^/]+'})"
        else:
            rx += re.escape(part)
    return re.compile(rx + r"\Z")


def find_browser(name: str) -> tuple[Handler, dict[str, str]] | None:
    """The handler the browser asks for by its name under /ui/api/, and its path parameters."""
    for h in HANDLERS.values():
        if h.browser is not None:
            m = _pattern(h.browser).match(name)
            if m:
                return h, m.groupdict()
    return None


def find_any(method: str, path: str) -> Handler | None:
    """The handler at an admin path, whatever its browser mark (to refuse one not marked, by name)."""
    for h in HANDLERS.values():
        if h.method == method and _pattern(h.path).match(path):
            return h
    return None


# -- daemon: status, profiles, reload, config check ---------------------------------------------------------

async def status(c: Ctx) -> apitype.Status:
    return views.status(c.daemon, admin_socket=str(c.admin_socket), api_version=API_VERSION)


async def profiles(c: Ctx) -> apitype.ProfilesAnswer:
    return views.profiles_answer(c.daemon)


async def profile(c: Ctx, name: str) -> dict[str, Any]:
    d = c.daemon
    runtime = d.runtime
    prof = runtime.config.profiles.get(name)
    if prof is None:
        raise AdminError(404, str(UnknownProfile(name, runtime.profile_names)), valid_profiles=runtime.profile_names)
    return {
        "name": name,
        "active": name == d.active_profile,
        "default": name == runtime.config.server.default_profile,
        # health_threshold is no longer used: the breaker's count is what takes a provider out, for every profile.
        "settings": {**prof.model_dump(exclude={"health_threshold"}),
                     "out_after_failures": runtime.config.breaker.failures},
        **views.effective(d, name, prof),
        "providers": [_provider_brief(d, p) for p in prof.providers],
        "routes": [r.model for r in runtime.config.routes if r.profile == name],
    }


def _provider_brief(d: Daemon, name: str) -> dict[str, Any]:
    cfg = d.runtime.providers[name].cfg
    return {"name": name, "kind": cfg.kind, "base_url": cfg.base_url, "model": cfg.model, "paid": cfg.paid}


async def use_profile(c: Ctx, body: apitype.UseProfileRequest) -> dict[str, Any]:
    try:
        old, new = c.daemon.use_profile(body.name, source="corectl")
    except UnknownProfile as e:
        raise AdminError(404, str(e), valid_profiles=e.valid) from None
    if old != new:
        log.info("active profile: %s -> %s (corectl)", old, new)
    return {"ok": True, "previous": old, "active": new}


async def reload(c: Ctx) -> dict[str, Any] | Status:
    d = c.daemon
    result = await apply_reload(d, "corectl")
    result.setdefault("path", d.config_path)
    if not result.get("ok"):
        return Status(result, 422)
    return result


async def config_check(c: Ctx) -> dict[str, Any]:
    d = c.daemon
    path = d.config_path
    if d.runtime.loaded.is_embedded:
        return {"ok": True, "path": path, "message": "running on the embedded default"}
    try:
        loaded = await asyncio.to_thread(load_config, path)
    except ConfigError as e:
        return {"ok": False, "path": path, "error": str(e)}
    return {"ok": True, "path": loaded.path, "providers": sorted(loaded.model.providers),
            "profiles": sorted(loaded.model.profiles)}


# -- history and the dashboard's own views ------------------------------------------------------------------

def _range(range: str) -> str:
    if range not in history.RANGES:
        raise AdminError(400, f"unknown range {range!r}; expected one of {', '.join(history.RANGES)}",
                         valid=list(history.RANGES))
    return range


async def history_spend(c: Ctx) -> apitype.SpendAnswer:
    return await history.spend(c.daemon)


async def history_trends(c: Ctx, range: str = history.DEFAULT_RANGE) -> apitype.TrendsAnswer:
    return await history.trends(c.daemon, _range(range))


async def history_keys(c: Ctx, range: str = history.DEFAULT_RANGE) -> apitype.KeyUsageAnswer:
    try:
        return await key_usage.daemon_keys(c.daemon, range)
    except ValidationError:
        raise  # our fault (a 500), not the caller's
    except ValueError as e:
        raise AdminError(400, str(e), valid=list(history.RANGES)) from None


async def history_requests(c: Ctx, profile: str | None = None, provider: str | None = None,
                           outcome: str | None = None, key: str | None = None,
                           limit: Annotated[int, Ge(1), Le(history.MAX_REQUESTS)] = ops.DEFAULT_REQUESTS,
                           before: float | None = None, since: float | None = None,
                           ) -> apitype.HistoryRequestsAnswer:
    """The journal's last requests, filtered; `before` pages back, `since` is the time filter."""
    try:
        return await history.requests(c.daemon, profile=profile, provider=provider, outcome=outcome, limit=limit,
                                      key=key, before=before, since=since)
    except ValidationError:
        raise  # a journal row that does not fit the model is our fault (a 500), not the caller's
    except ValueError as e:
        raise AdminError(400, str(e)) from None


async def history_trace(c: Ctx, request_id: str) -> apitype.DashboardTrace:
    """One request's trace from memory while the daemon holds it, else from the journal."""
    found = await history.trace(c.daemon, request_id)
    if found is None:
        raise AdminError(404, f"request {request_id[:100]!r} is neither in coderouterd's memory nor in the journal",
                         request_id=request_id[:100])
    return found


async def now(c: Ctx) -> apitype.DashboardNow:
    d = c.daemon
    await d.live.load_history(d.telemetry)
    answer = await now_view.now(d)
    if answer.shared is not None:
        # The driver's text stays as `problem`; the page shows what it means (issue 43, E16).
        answer.shared.meaning = shared_words.meaning(answer.shared.problem)
    return answer


async def requests_now(c: Ctx) -> inflight.InFlightAnswer:
    return inflight.answer(c.daemon)


# -- the table ------------------------------------------------------------------------------------------------

_REFUSED_RELOAD: dict[int | str, dict[str, Any]] = {422: {"model": apitype.ReloadAnswer, "description": "refused; the running config stays"}}

_ENTRIES = [
    Handler("GET", "/v1/status", status, apitype.Status),
    Handler("GET", "/v1/profiles", profiles, apitype.ProfilesAnswer, browser="profiles"),
    Handler("GET", "/v1/profiles/{name}", profile, apitype.ProfileDetail),
    Handler("POST", "/v1/profile/use", use_profile, apitype.UseProfileAnswer),
    Handler("POST", "/v1/reload", reload, apitype.ReloadAnswer, responses=_REFUSED_RELOAD),
    Handler("GET", "/v1/config/check", config_check, apitype.ConfigCheckAnswer),
    Handler("GET", "/v1/providers", ops.providers, apitype.ProvidersAnswer),
    Handler("GET", "/v1/processes", ops.processes, apitype.ProcessesAnswer),
    Handler("POST", "/v1/processes/{name}/{action}", ops.process_action, apitype.ProcessActionAnswer),
    Handler("GET", "/v1/models", ops.models, apitype.ModelsAnswer),
    Handler("POST", "/v1/models/load", ops.models_load, apitype.ModelControlAnswer),
    Handler("POST", "/v1/models/unload", ops.models_unload, apitype.ModelControlAnswer),
    Handler("GET", "/v1/requests", ops.requests, apitype.RequestsAnswer),
    Handler("GET", "/v1/requests/{request_id}", ops.request_trace, apitype.Trace),
    Handler("GET", "/v1/now", now, apitype.DashboardNow, browser="now"),
    Handler("GET", "/v1/now/requests", requests_now, inflight.InFlightAnswer, browser="inflight"),
    Handler("GET", "/v1/history/spend", history_spend, apitype.SpendAnswer, browser="spend"),
    Handler("GET", "/v1/history/trends", history_trends, apitype.TrendsAnswer, browser="trends"),
    Handler("GET", "/v1/history/keys", history_keys, apitype.KeyUsageAnswer, browser="keys"),
    Handler("GET", "/v1/history/requests", history_requests, apitype.HistoryRequestsAnswer, browser="requests"),
    Handler("GET", "/v1/history/requests/{request_id}", history_trace, apitype.DashboardTrace,
            browser="requests/{request_id}"),
    Handler("GET", "/v1/keys", keys.list_keys, apitype.KeysAnswer),
    Handler("GET", "/v1/keys/{name}", keys.show_key, apitype.KeyAnswer),
    Handler("POST", "/v1/keys", keys.create_key, apitype.KeySecretAnswer),
    Handler("POST", "/v1/keys/{name}/update", keys.update_key, apitype.KeyAnswer),
    Handler("POST", "/v1/keys/{name}/rotate", keys.rotate_key, apitype.KeySecretAnswer),
    Handler("POST", "/v1/keys/{name}/revoke", keys.revoke_key, apitype.KeyAnswer),
    Handler("POST", "/v1/keys/{name}/delete", keys.delete_key, apitype.KeyDeleteAnswer),
]

HANDLERS: dict[tuple[str, str], Handler] = {(h.method, h.path): h for h in _ENTRIES}
assert len(HANDLERS) == len(_ENTRIES), "one handler per (method, path)"
# The browser reads only: a handler that changes something is never marked for it.
assert all(h.method == "GET" for h in HANDLERS.values() if h.browser), "the dashboard is read-only"
