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

_MARKERS = tuple(dict.fromkeys([*(m for k in KINDS for m in k.overflow_markers), "exceed context limit"]))
# Wordings that split the request into its prompt and its requested output, read before the kinds' own: OpenAI's
# and vLLM's "you requested N tokens (P in the messages, M in the completion)" (N counts the output: P is the
# prompt), and Anthropic's own "input length and `max_tokens` exceed context limit: P + M > L".
_SPLIT = (
    re.compile(r"maximum context length is (?P<limit>[\d,]+) tokens.*\((?P<prompt>[\d,]+) in the messages, "
               r"[\d,]+ in the completion\)"),
    re.compile(r"input length and `max_tokens` exceed context limit: (?P<prompt>[\d,]+) \+ [\d,]+ > "
               r"(?P<limit>[\d,]+)"),
)
_WORDINGS = _SPLIT + tuple(w for k in KINDS for w in k.overflow_wordings)
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


# What Claude Code acts on, read from its own code (cli of @anthropic-ai/claude-code 2.1.197, tests/clients):
#   - it lowers max_tokens and retries only on a 400 whose message matches
#       /input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)/
#     (the retry asks for max(3000, limit - input - 1000) output tokens; below 3000 it gives up);
#   - it compacts only on a message containing "prompt is too long", sized by
#       /prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)/i
# Those are the Anthropic API's own wordings for the two cases, so the Anthropic ingress says exactly them.
ANTHROPIC_OUTPUT_ROOM = ("input length and `max_tokens` exceed context limit: {prompt} + {output} > {limit}, "
                         "decrease input length or `max_tokens` and try again")


def client_message(prompt: int, limit: int, upstream: str = "", *, max_tokens: int = 0,
                   wire: str = "anthropic") -> str:
    """What a client is told, in its own API's wording (`wire`: anthropic, openai, responses, gemini). A prompt at
    or over the window is "too long" (compact); a prompt that fits with an output that does not is the output's
    overflow (lower max_tokens), stated only when the numbers are the server's (and `max_tokens` the request's);
    otherwise the message says which are unknown instead of inventing them."""
    if wire in ("openai", "responses"):
        return _openai_message(prompt, limit, upstream, max_tokens)
    if wire == "gemini":
        return _gemini_message(prompt, limit, upstream, max_tokens)
    if prompt and limit and prompt >= limit:  # llama-server refuses at equality: no room for one token
        return f"prompt is too long: {prompt} tokens > {limit} maximum"
    if prompt and limit:  # the prompt fits, the output it asked for does not (vLLM, OpenAI count both)
        if max_tokens and prompt + max_tokens > limit:
            return ANTHROPIC_OUTPUT_ROOM.format(prompt=prompt, output=max_tokens, limit=limit)
        return (f"input length and `max_tokens` exceed context limit: {prompt} input tokens leave no room for the "
                f"requested output in the {limit}-token context window")
    if limit:
        said = f"; the server said: {upstream}" if upstream else ""
        return f"prompt is too long: over the {limit}-token context window (the prompt's token count is unknown)" \
               + said
    if prompt:
        return f"prompt is too long: {prompt} tokens (the context window is unknown)"
    said = f": {upstream}" if upstream else ""
    return f"prompt is too long (the server did not say by how much){said}"


def _openai_message(prompt: int, limit: int, upstream: str, max_tokens: int) -> str:
    """OpenAI's own wordings (its clients read the code, `context_length_exceeded`; people read these)."""
    if prompt and limit and prompt >= limit:
        return (f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
                f"{prompt} tokens. Please reduce the length of the messages.")
    if prompt and limit and max_tokens and prompt + max_tokens > limit:
        return (f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, {max_tokens} in the completion). Please "
                "reduce the length of the messages or completion.")
    if limit:
        said = f" The server said: {upstream}" if upstream else ""
        return (f"This model's maximum context length is {limit} tokens, and this request does not fit in it"
                + (f" ({prompt} tokens in the messages)." if prompt else " (the prompt's token count is unknown).")
                + said)
    said = f" The server said: {upstream}" if upstream else ""
    return "This request exceeds the model's context length (the server did not say by how much)." + said


def _gemini_message(prompt: int, limit: int, upstream: str, max_tokens: int) -> str:
    """Gemini's own wording of an input over the window, and the same form for an output that does not fit."""
    if prompt and limit and prompt >= limit:
        return f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({limit})."
    if prompt and limit and max_tokens and prompt + max_tokens > limit:
        return (f"The input token count ({prompt}) plus maxOutputTokens ({max_tokens}) exceeds the maximum number "
                f"of tokens allowed ({limit}).")
    said = f" The server said: {upstream}" if upstream else ""
    known = f" ({limit} tokens)" if limit else ""
    return f"The request exceeds the model's context window{known}." + said
