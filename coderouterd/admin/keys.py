"""Admin handlers (entries of the table in handlers.py) for team keys (`corectl keys ...`): list, show,
create, update, rotate, revoke.

The secret appears in exactly two answers, create's and rotate's, and nowhere else: never logged, never stored."""

from __future__ import annotations

from typing import Any

from ..keys.record import KeySettingsError, parse_expiry
from ..keys.service import KeyProblem
from . import apitype
from .context import AdminError, Ctx


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


async def list_keys(c: Ctx) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        items = await service.listing()
    except KeyProblem as e:
        raise _problem(e) from None
    return {"required": c.daemon.keys.required, "counts": c.daemon.keys.counts(), "keys": items}


async def show_key(c: Ctx, name: str) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        return {"ok": True, "record": await service.show(name)}
    except KeyProblem as e:
        raise _problem(e) from None


async def create_key(c: Ctx, body: apitype.KeyCreateRequest) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        rec, secret = await service.create(body.name, _settings(body))
    except KeyProblem as e:
        raise _problem(e) from None
    return {"ok": True, "key": secret, "record": service.public(rec, service.now())}


async def update_key(c: Ctx, name: str, body: apitype.KeySettings) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        rec = await service.update(name, _settings(body))
    except KeyProblem as e:
        raise _problem(e) from None
    return {"ok": True, "record": service.public(rec, service.now())}


async def rotate_key(c: Ctx, name: str, body: apitype.KeyRotateRequest) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        rec, secret = await service.rotate(name, float(body.grace_s))
    except KeyProblem as e:
        raise _problem(e) from None
    return {"ok": True, "key": secret, "record": service.public(rec, service.now())}


async def revoke_key(c: Ctx, name: str) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        rec = await service.revoke(name)
    except KeyProblem as e:
        raise _problem(e) from None
    return {"ok": True, "record": service.public(rec, service.now())}


async def delete_key(c: Ctx, name: str) -> dict[str, Any]:
    service = c.daemon.key_service
    try:
        await service.delete(name)
    except KeyProblem as e:
        raise _problem(e) from None
    return {"ok": True, "name": name, "required": c.daemon.keys.required}
