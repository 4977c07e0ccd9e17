"""The request as the router sees it, whatever wire it came in on."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..keys.model import TeamKey


@dataclass(slots=True)
class ClientRequest:
    ingress: str  # "anthropic" | "openai" | "responses" | "gemini" (the last two: body is their chat translation)
    body: dict
    raw: bytes
    headers: dict[str, str]
    stream: bool
    model: str
    request_id: str
    # Set by a caller that cannot accept an answer without reasoning; `thinking` on a request is a preference.
    thinking_required: bool = False
    started: float = field(default_factory=time.monotonic)
    wall_started: float = field(default_factory=time.time)
    # The ingress's own view when `body` is a translation of what the client sent (Responses: the
    # ResponsesRequest with the client's body and what is needed to answer it in its wire).
    native: object = None
    # The team key that admitted it (coderouterd/keys), None for an operator key or an open loopback. Its name is
    # what the journal, metrics and refusals carry; the secret never leaves the ingress.
    key: TeamKey | None = None
    # What the key's rate limits booked for this request (keys/limits.py's Admission), given back when it ends.
    limits: object = None

    def session_key(self) -> str | None:
        return getattr(self.native, "session_key", None)

    def has_tools(self) -> bool:
        return bool(self.body.get("tools"))

    def is_background(self) -> bool:
        """A side call nobody watches: no tools and no assistant turn yet (Claude Code's titles and topic checks,
        a session's name). Anything with tools (an agent, a sub-agent) or a conversation under way (a chat client's
        later turns, a compaction the user waits for) is foreground: the on-demand scheduler never stops a busy
        model for a background request (supervise/turns.py), so a request a person waits on must not be one."""
        if self.body.get("tools") or self.body.get("functions"):
            return False
        messages = self.body.get("messages")
        if not isinstance(messages, list):
            return True
        return not any(type(m) is dict and m.get("role") == "assistant" for m in messages)

    def has_images(self) -> bool:
        # Cheap byte scan first: most requests carry no image at all.
        if self.ingress == "anthropic":
            return b'"image"' in self.raw and _anthropic_has_image(self.body.get("messages") or [])
        if self.ingress == "responses":
            # Codex's tool descriptions mention images; only a real input_image part counts. raw: the client's
            # Responses body, or the chat body once a guard rewrote it (default_max_tokens, a tool-loop note).
            return (b'"input_image"' in self.raw or b'"image_url"' in self.raw) \
                and _chat_has_image(self.body.get("messages") or [])
        if self.ingress == "gemini":
            # raw: the client's Gemini body, or the chat body once a guard rewrote it
            return (b'"inlineData"' in self.raw or b'"fileData"' in self.raw or b'"image_url"' in self.raw) \
                and _chat_has_image(self.body.get("messages") or [])
        return b'"image_url"' in self.raw

    def thinking_requested(self) -> bool:
        t = self.body.get("thinking")
        return isinstance(t, dict) and t.get("type") in ("enabled", "adaptive")

    def estimated_tokens(self, chars_per_token: float = 4.0) -> int:
        return int(len(self.raw) / chars_per_token)


def _chat_has_image(messages: list) -> bool:
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        if isinstance(c, list) and any(isinstance(p, dict) and p.get("type") == "image_url" for p in c):
            return True
    return False


def _anthropic_has_image(messages: list) -> bool:
    for m in messages:
        c = m.get("content") if isinstance(m, dict) else None
        if not isinstance(c, list):
            continue
        for b in c:
            if not isinstance(b, dict):
                continue
            if b.get("type") == "image":
                return True
            if b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                if any(isinstance(x, dict) and x.get("type") == "image" for x in b["content"]):
                    return True
    return False
