"""Whether what an upstream answered with a 200 is an answer: a whole chat completion or Messages answer parsed and
its shape checked, and the errors that say it is not (the upstream's failure, so the request fails over). Every
strategy, whatever its wire pair, reads upstream answers through these."""

from __future__ import annotations

import orjson

from ..wire.answer_shapes import check_chat_completion, check_message
from .errors import BAD_RESPONSE, UpstreamError, stream_error_reason


def stream_error(message: object, *, after_content: bool = False, error_type: str | None = None) -> UpstreamError:
    """An error the upstream reported inside its stream (out-of-memory ones are memory_pressure)."""
    text = str(message)
    return UpstreamError(stream_error_reason(text), message=text, after_content=after_content, error_type=error_type)


# Same-wire passthrough relays bytes it does not translate, so it must check that they are an answer at all: a 200
# with HTML, `null` or SSE garbage is the upstream's failure (it falls over), never the client's success. Beyond
# that, what is relayed must have the shape its client reads (wire/answer_shapes.py: `{"choices":[]}` or a tool
# call without a name is no answer either), checked on what is parsed anyway.

def not_an_answer(what: str, raw: bytes | str) -> UpstreamError:
    head = raw[:60] if isinstance(raw, bytes) else raw[:60].encode()
    return UpstreamError(BAD_RESPONSE, message=f"upstream answered 200 with {what}: {head!r}")


def wrong_shape(problem: str, *, after_content: bool = False) -> UpstreamError:
    return UpstreamError(BAD_RESPONSE, message=f"upstream answered 200 with {problem}"[:300],
                         after_content=after_content)


def loads_object(body: bytes, expected: str) -> dict:
    """The body as a JSON object, or the upstream's failure (an error object it sent with a 200 included)."""
    if body[:1] != b"{" and body.lstrip()[:1] != b"{":  # not an object: no need to parse it to know
        raise not_an_answer(f"no {expected}", body)
    try:
        resp = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise not_an_answer(f"no {expected} (not JSON)", body) from None
    if not isinstance(resp, dict):
        raise not_an_answer(f"no {expected}", body)
    return resp


def _error_in_body(resp: dict) -> UpstreamError | None:
    """An error object sent with a 200 (some servers do): the upstream's failure, with its message."""
    err = resp.get("error")
    if err is None or resp.get("choices") or resp.get("type") == "message":
        return None
    message = err.get("message", err) if isinstance(err, dict) else err
    return stream_error(message, error_type=err.get("type") if isinstance(err, dict) else None)


def openai_completion(body: bytes) -> dict:
    """A whole chat completion, parsed, of the shape its clients read; else the upstream's failure."""
    resp = loads_object(body, "chat completion")
    if not isinstance(resp.get("choices"), list):
        raise _error_in_body(resp) or not_an_answer("no chat completion (no choices)", body)
    problem = check_chat_completion(resp)
    if problem:
        raise wrong_shape(problem)
    return resp


def anthropic_message(body: bytes) -> dict:
    """A whole Messages answer, parsed, of the shape its clients read; else the upstream's failure."""
    resp = loads_object(body, "message")
    if resp.get("type") != "message" or not isinstance(resp.get("content"), list):
        raise _error_in_body(resp) or not_an_answer("no message (type and content)", body)
    problem = check_message(resp)
    if problem:
        raise wrong_shape(problem)
    return resp
