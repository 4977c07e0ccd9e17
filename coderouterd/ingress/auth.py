"""The client key check, shared by the proxy's routes and the dashboard (one definition, so they cannot drift):
operator keys (`[server] api_keys`, no limits) and team keys (coderouterd/keys, `corectl keys`)."""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..keys.record import iso
from ..keys.registry import Check, KeyRegistry
from ..keys.throttle import FailureThrottle, RefusalLog
from ..state.events import AuthRefused, AuthThrottled

if TYPE_CHECKING:
    from ..keys.model import TeamKey
    from .responder import Responder

# Where clients send a key: x-api-key (Anthropic's SDK, Claude Code), Authorization: Bearer (OpenAI's SDKs,
# Codex, opencode), x-goog-api-key (Gemini's). None of them ever goes upstream (dispatch.py drops them).
KEY_HEADERS = ("x-api-key", "authorization", "x-goog-api-key")


def presented_key(headers: dict[str, str]) -> str:
    """The key a caller sent: x-api-key, else Authorization: Bearer, else x-goog-api-key. Surrounding whitespace
    is not part of a key (config refuses keys that have it)."""
    given = (headers.get("x-api-key") or "").strip()
    if given:
        return given
    auth = headers.get("authorization") or ""
    if auth[:7].lower() == "bearer ":
        given = auth[7:].strip()
        if given:
            return given
    return (headers.get("x-goog-api-key") or "").strip()


def key_accepted(given: str, keys: list[str]) -> bool:
    """Whether `given` is one of `keys`, in constant time per key (no early exit on the first differing byte)."""
    return any(hmac.compare_digest(given.encode(), k.encode()) for k in keys)


@dataclass(frozen=True, slots=True)
class KeyRefusal:
    status: int  # 401 or 403
    message: str
    reason: str  # no_key | unknown | revoked | expired | scope (the audit line's word)
    key: str | None = None  # the team key's name when one was recognised

    @property
    def error_type(self) -> str:
        return "authentication_error" if self.status == 401 else "permission_error"


_NO_KEY = KeyRefusal(401, "this coderouterd requires an API key: send yours as x-api-key or Authorization: "
                          "Bearer (the router's operator gives each user one with `corectl keys create`)", "no_key")
_UNKNOWN = KeyRefusal(401, "invalid API key for this coderouterd", "unknown")
_OPERATOR_ONLY = KeyRefusal(401, "missing or invalid API key for this coderouterd", "unknown")


def scope_refusal(key: TeamKey, profile: str, model: str) -> KeyRefusal | None:
    """403 when `key` may not use `profile` or the model asked for."""
    if not key.allows_profile(profile):
        what = f"profile {profile!r}"
    elif not key.allows_model(model):
        what = f"model {model[:200]!r}"
    else:
        return None
    return KeyRefusal(403, f"key {key.name!r} may not use {what}; it may use {key.scope_words()}", "scope", key.name)


class KeyGate:
    """Who may call: the decision for one request's headers, and how a refusal is answered (after the source's
    delay, with a bounded audit line)."""

    def __init__(self, registry: KeyRegistry, publish: Callable[[Any], None], *,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self._publish = publish
        self._clock = clock
        self.throttle = FailureThrottle(clock=monotonic)
        self.refusals = RefusalLog(clock=monotonic)
        self.refused = 0  # since start, for status

    def required(self, api_keys: list[str]) -> bool:
        return self.registry.required or bool(api_keys)

    def admit(self, headers: dict[str, str], api_keys: list[str]) -> tuple[KeyRefusal | None, TeamKey | None]:
        """(None, the team key or None for an operator key) when the request may go on, else (why not, None).
        Called only when a key is required (`required`)."""
        given = presented_key(headers)
        if api_keys and given and key_accepted(given, api_keys):
            return None, None
        registry = self.registry
        if not registry.required:
            return (_OPERATOR_ONLY if given else _NO_KEY), None
        verdict, key = registry.check(given, self._clock())
        if verdict is Check.OK:
            return None, key
        if verdict is Check.NO_KEY:
            return _NO_KEY, None
        if key is None:
            return _UNKNOWN, None
        if verdict is Check.REVOKED:
            return KeyRefusal(401, f"key {key.name!r} was revoked at {iso(key.revoked_at)}", "revoked", key.name), None
        return KeyRefusal(401, f"key {key.name!r} expired at {iso(key.expires_at)}; ask the router's operator to "
                               "extend it (`corectl keys update --expires`)", "expired", key.name), None

    async def refuse(self, r: Responder, refusal: KeyRefusal, source: str, path: str) -> None:
        """Answer a refusal in the caller's shape. An authentication failure (401) counts against its source,
        which waits its delay first; a 403 (a valid key outside its scope) does not: it is no guess."""
        await self._counted(refusal, source, path)
        await r.error(refusal.status, refusal.message, error_type=refusal.error_type)

    async def failed_elsewhere(self, source: str, path: str) -> None:
        """A key refused outside the proxy's routes (the dashboard's login form and API, which answer in their
        own way): counted against its source and audited like any 401, and returns after the source's delay."""
        await self._counted(_UNKNOWN, source, path)

    async def _counted(self, refusal: KeyRefusal, source: str, path: str) -> None:
        self.refused += 1
        if refusal.status == 401:
            delay, episode = self.throttle.failed(source)
            if episode is not None:
                self._publish(AuthThrottled(source=source, failures=episode, delay_s=round(delay, 3)))
        else:
            delay = 0.0
        folded = self.refusals.record(refusal.reason, refusal.key, source)
        if folded is not None:
            self._publish(AuthRefused(reason=refusal.reason, source=source, key=refusal.key, status=refusal.status,
                                      path=_printable(path[:100]), repeats=folded))
        if delay > 0:
            import asyncio

            await asyncio.sleep(delay)


def _printable(text: str) -> str:
    """A client-supplied path as the audit log keeps it: no control character reaches a terminal that shows it."""
    return text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)


def source_of(scope: Mapping[str, Any]) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"
