"""A profile's default output limit (`[profiles.X] default_max_tokens`) for a request that names none.

Copilot CLI sends no `max_tokens` on the chat wire and no `max_output_tokens` on the Responses wire; neither do
many OpenAI SDK scripts. A hosted API then applies its own cap, but a local llama.cpp server has none (its
n_predict is unlimited): a small model that starts repeating itself writes until its context is full, minutes of
a GPU for nothing. The profile's default is set before routing, only when the client named no limit of its own,
and the request's trace says so (`corectl explain`: a guard line).

Each ingress names the limit its own way. The router holds the Responses and Gemini ingresses as their chat
translation (`req.body`), and a passthrough upstream (a Responses server, a Gemini one) is sent the client's own
body (`req.native`): both get it. An Anthropic Messages request always has one (the API requires `max_tokens`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from ..routing.executor import Exchange

GUARD_NAME = "output_limit"
# Every name a chat body may carry its limit under (the OpenAI wire has two).
_CHAT_KEYS = ("max_tokens", "max_completion_tokens")


def apply_default_max_tokens(ex: Exchange) -> int | None:
    """Set the profile's default output limit on a request that names none: the limit set, or None when the
    profile has no default, the client named its own, or the wire requires one (Anthropic)."""
    limit = ex.profile.default_max_tokens
    req = ex.req
    if limit is None or req.ingress == "anthropic" or any(req.body.get(k) is not None for k in _CHAT_KEYS):
        return None
    req.body["max_tokens"] = limit
    req.raw = orjson.dumps(req.body)  # as the tool-loop guard's rewrite: sizes and affinity read the body sent
    _set_native(req.ingress, req.native, limit)
    ex.record.guard_fired({"guard": GUARD_NAME, "action": "default",
                           "message": f"max_tokens {limit} from profile {ex.profile_name!r} (the client sent none)"})
    return limit


def _set_native(ingress: str, native: object, limit: int) -> None:
    """The client's own body, for an upstream that serves its API itself (ResponsesPassthrough sends it)."""
    body = getattr(native, "body", None)
    if not isinstance(body, dict):
        return
    if ingress == "responses":
        body["max_output_tokens"] = limit
    elif ingress == "gemini":
        gen = body.get("generationConfig")
        body["generationConfig"] = {**(gen if isinstance(gen, dict) else {}), "maxOutputTokens": limit}
    else:
        return
    if getattr(native, "raw", b""):
        native.raw = orjson.dumps(body)  # type: ignore[attr-defined]
