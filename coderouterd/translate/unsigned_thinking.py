"""Thinking blocks an Anthropic upstream did not sign never go back to it.

A local model's reasoning reaches an Anthropic client as `thinking` blocks carrying SYNTHETIC_SIGNATURE (local
backends cannot sign), and the client echoes them on later turns. When such a turn goes to an Anthropic
upstream, the real API checks every signature and refuses the whole request ("Invalid signature in thinking
block"), so a fallback in the middle of a conversation would fail. Before the body goes up:

- an unsigned block in an earlier turn is dropped: the API never shows a previous turn's thinking to the model;
- in the turn in progress (the last assistant message, when it called a tool) the model should still see it,
  so it becomes a text block;
- with thinking on, the API wants that turn to open with a signed thinking block; when it no longer can, thinking
  is switched off for this request (and with it `clear_thinking` context edits, which require thinking on).

Hot path: the body is only walked when its bytes carry our marker or an empty signature."""

from __future__ import annotations

import re

from .openai_to_anthropic import SYNTHETIC_SIGNATURE

_MARK = SYNTHETIC_SIGNATURE.encode()
_EMPTY_SIGNATURE = re.compile(rb'"signature"\s*:\s*""')
_THINKING_FIRST = ("thinking", "redacted_thinking")


def may_carry_unsigned(raw: bytes) -> bool:
    return _MARK in raw or _EMPTY_SIGNATURE.search(raw) is not None


def _unsigned(block) -> bool:
    if not isinstance(block, dict) or block.get("type") != "thinking":
        return False
    sig = block.get("signature")
    return not isinstance(sig, str) or not sig or sig == SYNTHETIC_SIGNATURE


def _calls_tool(content: list) -> bool:
    return any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)


def without_unsigned_thinking(body: dict) -> dict | None:
    """A copy of the Messages `body` an Anthropic upstream accepts, or None when nothing needed to change."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    last = next((i for i in range(len(messages) - 1, -1, -1)
                 if isinstance(messages[i], dict) and messages[i].get("role") == "assistant"), -1)
    out: list = []
    changed = False
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) and msg.get("role") == "assistant" else None
        if not isinstance(content, list) or not any(_unsigned(b) for b in content):
            out.append(msg)
            continue
        changed = True
        in_progress = i == last and _calls_tool(content)
        kept = []
        for b in content:
            if not _unsigned(b):
                kept.append(b)
            elif in_progress and isinstance(b.get("thinking"), str) and b["thinking"].strip():
                kept.append({"type": "text", "text": b["thinking"]})
        if kept:  # an assistant turn that was only unsigned thinking goes; the API merges the turns around it
            out.append({**msg, "content": kept})
    if not changed:
        return None
    fixed = {**body, "messages": out}
    _thinking_off_if_unopened(fixed, out)
    return fixed


def _thinking_off_if_unopened(body: dict, messages: list) -> None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") == "disabled":
        return
    last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "assistant"), None)
    content = last.get("content") if last is not None else None
    if not isinstance(content, list) or not _calls_tool(content):
        return
    first = content[0] if content else None
    if isinstance(first, dict) and first.get("type") in _THINKING_FIRST:
        return
    body.pop("thinking", None)
    cm = body.get("context_management")
    if isinstance(cm, dict) and isinstance(cm.get("edits"), list):
        edits = [e for e in cm["edits"] if not (isinstance(e, dict) and str(e.get("type", "")).startswith(
            "clear_thinking"))]
        if edits:
            body["context_management"] = {**cm, "edits": edits}
        else:
            body.pop("context_management", None)
