"""Context overflow: recognising it in any server's error, reading its numbers, and saying it to a client.

Each kind module says how its overflow errors read (`overflow_markers`, `overflow_wordings`, typed fields);
this module asks all of them, because an OpenAI-compatible URL does not say which server answered. A number
is only reported when the server's own wording places it: a full wording first (prompt and limit together),
then single numbers in unambiguous phrases; anything else is 0, "unknown", never a guess."""

from __future__ import annotations

import re

import orjson

from . import KINDS

# Statuses whose errors are never overflows, even when the message mentions a context.
_NOT_OVERFLOW_STATUS = frozenset({401, 403, 404, 429})
_CODES = frozenset({"context_length_exceeded"})

_MARKERS = tuple(dict.fromkeys(m for k in KINDS for m in k.overflow_markers))
_WORDINGS = tuple(w for k in KINDS for w in k.overflow_wordings)
# One number each, where the phrase leaves no doubt which number it is.
_LIMIT_ALONE = tuple(re.compile(p) for p in (
    r"tokens? > ([\d,]+) maximum",
    r"maximum context length is ([\d,]+)",
    r"context length of (?:only )?([\d,]+)",
    r"context (?:window|size|length)(?: of| is)?:? ([\d,]+)",
    r"n_ctx(?:_slot)?\s*[=:]?\s*([\d,]+)",
))
_PROMPT_ALONE = tuple(re.compile(p) for p in (
    r"n_prompt_tokens\s*[=:]?\s*([\d,]+)",
    r"prompt (?:has|is|of) ([\d,]+) tokens",
    r"prompt contains (?:at least )?([\d,]+)",
    r"([\d,]+) input tokens",
))


def _int(text: str | None) -> int:
    return int(text.replace(",", "")) if text else 0


def _first(patterns, text: str) -> int:
    for p in patterns:
        m = p.search(text)
        if m:
            return _int(m.group(1))
    return 0


def numbers(message: str) -> tuple[int, int]:
    """(prompt tokens, limit) as the message states them; 0 for what it does not state."""
    text = message.lower()
    for w in _WORDINGS:
        m = w.search(text)
        if m:
            groups = m.groupdict()
            return _int(groups.get("prompt")), _int(groups.get("limit"))
    return _first(_PROMPT_ALONE, text), _first(_LIMIT_ALONE, text)


def _error_object(body) -> tuple[dict, dict] | None:
    """(the whole body, its error object) for any error shape: {"error": {...}}, {"error": "..."}, a bare
    {"message": ...}, JSON text, or plain text."""
    if isinstance(body, (bytes, bytearray)):
        body = body.decode("utf-8", "replace")
    if isinstance(body, str):
        try:
            parsed = orjson.loads(body)
        except orjson.JSONDecodeError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else {"error": {"message": body}}
    if not isinstance(body, dict):
        return None
    err = body.get("error", body)
    if isinstance(err, str):
        err = {"message": err}
    return (body, err) if isinstance(err, dict) else None


def parse(status: int, body) -> tuple[int, int] | None:
    """(prompt tokens, limit) when `body` reports a context overflow, each 0 when the server did not say;
    None when it is some other error."""
    if status in _NOT_OVERFLOW_STATUS:
        return None
    found = _error_object(body)
    if found is None:
        return None
    body, err = found
    message = str(err.get("message") or body.get("message") or "")
    typed = next((t for k in KINDS if (t := k.typed_overflow(err)) is not None), None)
    etype, code = str(err.get("type") or ""), str(err.get("code") or "")
    lowered = message.lower()
    if typed is None and etype != "exceed_context_size_error" and code not in _CODES and \
            not any(marker in lowered for marker in _MARKERS):
        return None
    prompt, limit = numbers(message)
    if typed is not None:
        prompt, limit = typed[0] or prompt, typed[1] or limit
    return prompt, limit


def client_message(prompt: int, limit: int, upstream: str = "") -> str:
    """What a client is told. Claude Code compacts on "prompt is too long" and reads "N tokens > M maximum"
    to size the compaction, so the numbers appear in that form only when the server gave both (and they
    agree); otherwise the message says which are unknown instead of inventing them."""
    if prompt and limit and prompt >= limit:  # llama-server refuses at equality: no room for one token
        return f"prompt is too long: {prompt} tokens > {limit} maximum"
    if prompt and limit:  # the prompt fits, the output it asked for does not (vLLM, OpenAI count both)
        return (f"prompt is too long: {prompt} tokens leave no room for the requested output in the {limit}-token "
                "context window")
    if limit:
        said = f"; the server said: {upstream}" if upstream else ""
        return f"prompt is too long: over the {limit}-token context window (the prompt's token count is unknown)" \
               + said
    if prompt:
        return f"prompt is too long: {prompt} tokens (the context window is unknown)"
    said = f": {upstream}" if upstream else ""
    return f"prompt is too long (the server did not say by how much){said}"
