"""A tool call's arguments as the upstream wrote them (a JSON string, sometimes broken) -> the dict Anthropic wants:
trivially broken JSON repaired (code fences, trailing commas, output cut off mid-arguments, double encoding),
anything else {}. Used by both directions: an OpenAI answer to an Anthropic client
(openai_answer_to_anthropic.py) and an OpenAI request's history to an Anthropic upstream
(openai_request_to_anthropic.py)."""

from __future__ import annotations

import json
import logging
import re

import orjson

# The translator's logger: this line was its own before the repair was split from it, and log readers (and
# the name in each line) still know it by that name.
log = logging.getLogger("coderouterd.translate.openai_answer_to_anthropic")

_FENCE = re.compile(r"^```[a-zA-Z]*\s*(.*?)\s*```$", re.S)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def _loads_object(text: str) -> dict | None:
    try:
        value = json.loads(text, strict=False)  # strict=False: raw newlines inside strings
    except (ValueError, RecursionError):  # RecursionError: nested deeper than the interpreter's stack allows
        return None
    if isinstance(value, str):  # double-encoded arguments
        return _loads_object(value) if value.strip().startswith("{") else None
    if not isinstance(value, dict):
        return None
    try:  # what orjson could not read (too deep for it) would fail again when the request is serialised
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return None
    return value


def _close_truncated(text: str) -> str:
    """Close an unterminated string and any open brackets (output cut off mid-arguments)."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    if escaped:
        text = text[:-1]
    if in_string:
        text += '"'
    return text + "".join(reversed(stack))


def parse_tool_arguments(raw: object) -> dict:
    """Arguments string -> dict; trivially broken JSON is repaired, anything else becomes {}."""
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str) or not raw.strip():
        return {}
    text = raw.strip()
    try:
        value = orjson.loads(text)
        if isinstance(value, dict):
            return value
    except orjson.JSONDecodeError:
        pass
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    closed = _close_truncated(text)
    for attempt in (text, _TRAILING_COMMA.sub(r"\1", text), closed, _TRAILING_COMMA.sub(r"\1", closed)):
        value = _loads_object(attempt)
        if value is not None:
            return value
    log.warning("tool call arguments are not valid JSON (%d chars); using {}", len(raw))  # no values in logs
    return {}
