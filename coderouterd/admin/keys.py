"""Admin endpoints for team keys (`corectl keys ...`): list, show, create, update, rotate, revoke.

The secret appears in exactly two answers, create's and rotate's, and nowhere else: never logged, never stored."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import APIRouter

from ..keys.record import KeySettingsError, parse_expiry
from ..keys.service import KeyProblem
from . import apitype
from .errors import ANSWER, REFUSALS, AdminError, AdminRoute

if TYPE_CHECKING:
    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only


def _settings(body: apitype.KeySettings) -> dict[str, Any]:
    changes = body.changes()
    changes.pop("name", None)
    if "expires" in changes:
        text = changes.pop("expires")
        try:
            changes["expires_at"] = parse_expiry(text) if text is not None else None
        except KeySettingsError as e:
            raise AdminError(400, str(e)) from None
    return changes


def _problem(e: KeyProblem) -> AdminError:
    return AdminError(e.status, str(e))


def key_routes(daemon: Daemon) -> APIRouter:
    r = APIRouter(route_class=AdminRoute, responses=REFUSALS)

    @r.get("/v1/keys", response_model=apitype.KeysAnswer, **ANSWER)
    async def list_keys():
        service = daemon.key_service
        try:
            items = await service.listing()
        except KeyProblem as e:
            raise _problem(e) from None
        return {"required": daemon.keys.required, "counts": daemon.keys.counts(), "keys": items}

    @r.get("/v1/keys/{name}", response_model=apitype.KeyAnswer, **ANSWER)
    async def show_key(name: str):
        service = daemon.key_service
        try:
            return {"ok": True, "record": await service.show(name)}
        except KeyProblem as e:
            raise _problem(e) from None

    @r.post("/v1/keys", response_model=apitype.KeySecretAnswer, **ANSWER)
    async def create_key(body: apitype.KeyCreateRequest):
        service = daemon.key_service
        try:
            rec, secret = await service.create(body.name, _settings(body))
        except KeyProblem as e:
            raise _problem(e) from None
        return {"ok": True, "key": secret, "record": service.public(rec, service.now())}

    @r.post("/v1/keys/{name}/update", response_model=apitype.KeyAnswer, **ANSWER)
    async def update_key(name: str, body: apitype.KeySettings):
        service = daemon.key_service
        try:
            rec = await service.update(name, _settings(body))
        except KeyProblem as e:
            raise _problem(e) from None
        return {"ok": True, "record": service.public(rec, service.now())}

    @r.post("/v1/keys/{name}/rotate", response_model=apitype.KeySecretAnswer, **ANSWER)
    async def rotate_key(name: str, body: apitype.KeyRotateRequest):
        service = daemon.key_service
        try:
            rec, secret = await service.rotate(name, float(body.grace_s))
        except KeyProblem as e:
            raise _problem(e) from None
        return {"ok": True, "key": secret, "record": service.public(rec, service.now())}

    @r.post("/v1/keys/{name}/revoke", response_model=apitype.KeyAnswer, **ANSWER)
    async def revoke_key(name: str):
        service = daemon.key_service
        try:
            rec = await service.revoke(name)
        except KeyProblem as e:
            raise _problem(e) from None
        return {"ok": True, "record": service.public(rec, service.now())}

    @r.post("/v1/keys/{name}/delete", response_model=apitype.KeyDeleteAnswer, **ANSWER)
    async def delete_key(name: str):
        service = daemon.key_service
        try:
            await service.delete(name)
        except KeyProblem as e:
            raise _problem(e) from None
        return {"ok": True, "name": name, "required": daemon.keys.required}

    return r
