"""The client key check, shared by the proxy's routes and the dashboard (one definition, so they cannot drift)."""

from __future__ import annotations

import hmac


def presented_key(headers: dict[str, str]) -> str:
    """The key a caller sent: x-api-key, else x-goog-api-key (the Gemini API's; its `?key=` arrives as this
    header too, ingress/gemini.py), else Authorization: Bearer. Surrounding whitespace is not part of a key
    (config refuses keys that have it)."""
    given = (headers.get("x-api-key") or headers.get("x-goog-api-key") or "").strip()
    auth = headers.get("authorization") or ""
    if auth.lower().startswith("bearer "):
        given = given or auth[7:].strip()
    return given


def key_accepted(given: str, keys: list[str]) -> bool:
    """Whether `given` is one of `keys`, in constant time per key (no early exit on the first differing byte)."""
    return any(hmac.compare_digest(given.encode(), k.encode()) for k in keys)
