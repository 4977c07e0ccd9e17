"""Per (client wire, upstream wire) pair: how to build the upstream request and turn its answer into the
client's wire. Same-wire pairs pass bytes through; the others translate incrementally."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, Required, TypedDict, Unpack

import orjson

from ..translate.answer_observe import observe_anthropic, observe_openai
from ..translate.answer_stats import AnswerStats, DriftSample, Produced
from ..translate.anthropic_answer_to_openai import AnthropicStreamToOpenAI, anthropic_response_to_openai
from ..translate.anthropic_request_to_openai import force_named_tool_as_required, request_to_openai
from ..translate.openai_answer_to_anthropic import (
    OpenAIStreamToAnthropic,
    anthropic_usage,
    response_to_anthropic,
)
from ..translate.openai_request_to_anthropic import openai_request_to_anthropic
from ..translate.tool_repair import ToolSpec
from ..translate.tool_repair_wire import (
    AnthropicStreamRepair,
    OpenAIStreamRepair,
    repair_anthropic_message,
    repair_openai_completion,
)
from ..translate.unsigned_thinking import UpstreamSignatures, unsigned_thinking_fix
from ..wire.answer_shapes import check_chat_chunk, check_chat_completion, check_message, check_messages_event
from ..wire.sse import DONE, encode_data, encode_event
from .answer_model import renamed, renamed_text
from .errors import BAD_RESPONSE, DISCONNECT, UpstreamError, stream_error_reason

_PING = encode_event({"type": "ping"})
_MESSAGE_STOP = encode_event({"type": "message_stop"})
# Anthropic events the repair adapter rewrites; the rest keep their bytes.
_REPAIR_SEES = frozenset({"content_block_start", "content_block_delta", "content_block_stop", "message_delta"})


def _may_sign(name: str | None, data: str) -> bool:
    """An event that may carry a thinking signature (a substring test; most deltas are text)."""
    if name == "content_block_delta":
        return '"signature_delta"' in data
    return name == "content_block_start" and '"redacted_thinking"' in data


def _stream_error(message: object, *, after_content: bool = False, error_type: str | None = None) -> UpstreamError:
    """An error the upstream reported inside its stream (out-of-memory ones are memory_pressure)."""
    text = str(message)
    return UpstreamError(stream_error_reason(text), message=text, after_content=after_content, error_type=error_type)


# Same-wire passthrough relays bytes it does not translate, so it must check that they are an answer at all: a 200
# with HTML, `null` or SSE garbage is the upstream's failure (it falls over), never the client's success. Beyond
# that, what is relayed must have the shape its client reads (wire/answer_shapes.py: `{"choices":[]}` or a tool
# call without a name is no answer either), checked on what is parsed anyway.

def _not_an_answer(what: str, raw: bytes | str) -> UpstreamError:
    head = raw[:60] if isinstance(raw, bytes) else raw[:60].encode()
    return UpstreamError(BAD_RESPONSE, message=f"upstream answered 200 with {what}: {head!r}")


def _wrong_shape(problem: str, *, after_content: bool = False) -> UpstreamError:
    return UpstreamError(BAD_RESPONSE, message=f"upstream answered 200 with {problem}"[:300],
                         after_content=after_content)


def _loads_object(body: bytes, expected: str) -> dict:
    """The body as a JSON object, or the upstream's failure (an error object it sent with a 200 included)."""
    if body[:1] != b"{" and body.lstrip()[:1] != b"{":  # not an object: no need to parse it to know
        raise _not_an_answer(f"no {expected}", body)
    try:
        resp = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise _not_an_answer(f"no {expected} (not JSON)", body) from None
    if not isinstance(resp, dict):
        raise _not_an_answer(f"no {expected}", body)
    return resp


def _error_in_body(resp: dict) -> UpstreamError | None:
    """An error object sent with a 200 (some servers do): the upstream's failure, with its message."""
    err = resp.get("error")
    if err is None or resp.get("choices") or resp.get("type") == "message":
        return None
    message = err.get("message", err) if isinstance(err, dict) else err
    return _stream_error(message, error_type=err.get("type") if isinstance(err, dict) else None)


def openai_completion(body: bytes) -> dict:
    """A whole chat completion, parsed, of the shape its clients read; else the upstream's failure."""
    resp = _loads_object(body, "chat completion")
    if not isinstance(resp.get("choices"), list):
        raise _error_in_body(resp) or _not_an_answer("no chat completion (no choices)", body)
    problem = check_chat_completion(resp)
    if problem:
        raise _wrong_shape(problem)
    return resp


def anthropic_message(body: bytes) -> dict:
    """A whole Messages answer, parsed, of the shape its clients read; else the upstream's failure."""
    resp = _loads_object(body, "message")
    if resp.get("type") != "message" or not isinstance(resp.get("content"), list):
        raise _error_in_body(resp) or _not_an_answer("no message (type and content)", body)
    problem = check_message(resp)
    if problem:
        raise _wrong_shape(problem)
    return resp


class StrategyOptions(TypedDict, total=False):
    """Strategy's own keywords, as a subclass passes them on (`**kw: Unpack[StrategyOptions]`)."""

    model: Required[str]
    skip_prologue: Required[bool]
    client_body: Required[dict]
    repair_tools: Mapping[str, ToolSpec] | None
    observe: bool
    named_tool_choice: bool
    answer_model: str


class Strategy(ABC):
    """Stream state for one attempt. events() returns the bytes to send to the client for a batch of parsed
    SSE events; `done` is set when the upstream finished cleanly.

    With `repair_tools` (the tools the request offered, when the provider's tool_repair applies), tool calls
    the model wrote as text are repaired on the upstream's wire, before any translation; `repaired` and
    `repair_formats` tell what was done."""

    # The upstream's message format (an adapter's `wire`): "openai" chat completions or "anthropic" Messages.
    upstream_wire = "openai"
    done = False
    started_content = False
    usage: dict
    # What an OpenAI-wire backend said about its prompt cache: the raw `usage` (prompt_tokens_details) and
    # llama.cpp's `timings` (cache_n, prompt_n, prompt_ms). Read by prefix affinity after the answer.
    raw_usage: dict | None = None
    timings: dict | None = None
    # The answer's closing output, already built, leaving one write at a time (next_held); the answer is done
    # once it is out. Each item becomes bytes through `encode_held`.
    held: list | None = None

    def __init__(self, *, model: str, skip_prologue: bool, client_body: dict,
                 repair_tools: Mapping[str, ToolSpec] | None = None, observe: bool = False,
                 named_tool_choice: bool = True, answer_model: str = "") -> None:
        self.model = model  # what the upstream is asked for
        self.answer_model = answer_model or model  # what the client's answer names (providers/answer_model.py)
        # False: the upstream reads tool_choice only as a string (servers/llamacpp.py); see request bodies.
        self.named_tool_choice = named_tool_choice
        # Figures about the answer for drift detection (local providers only: a hosted API does not drift).
        self.answer = AnswerStats() if observe else None
        # What the upstream produced so far: a stream cut before its end is still billed (routing/executor.py).
        self.produced = Produced()
        self.skip_prologue = skip_prologue
        self.client_body = client_body
        self.usage = {}
        self.repair_tools = repair_tools or None
        self.repair = None
        if self.repair_tools:
            cls = OpenAIStreamRepair if self.upstream_wire == "openai" else AnthropicStreamRepair
            self.repair = cls(self.repair_tools)
        self._repaired_whole: list = []  # non-streaming answers

    @property
    def repaired(self) -> int:
        return len(self._repaired_whole) + (self.repair.repaired if self.repair is not None else 0)

    @property
    def repair_formats(self) -> list[str]:
        formats = [c.format for c in self._repaired_whole]
        return formats + (self.repair.formats if self.repair is not None else [])

    def drift_sample(self, *, tools_offered: bool, prompt_key: int = 0) -> DriftSample | None:
        if self.answer is None:
            return None
        if self.repaired:
            self.answer.tool_called = True  # the model did call, in text
        return self.answer.sample(tools_offered=tools_offered, prompt_key=prompt_key)

    def _repair_openai_body(self, resp: dict) -> None:
        if self.answer is not None:
            observe_openai(self.answer, resp)
        if self.repair_tools:
            self._repaired_whole = repair_openai_completion(resp, self.repair_tools)

    def _translated_chat_request(self, stream: bool) -> bytes:
        """For an ingress the router holds as its chat translation (Responses, Gemini), to a chat upstream: that
        translation as it is, with the model, stream and usage options set."""
        body = dict(self.client_body)
        body["model"] = self.model
        body["stream"] = stream
        if stream:
            body["stream_options"] = {"include_usage": True}
        if not self.named_tool_choice:
            body = force_named_tool_as_required(body)
        return orjson.dumps(body)

    def _translated_chat_completion(self, body: bytes) -> dict:
        """A chat upstream's whole answer for such an ingress: parsed, its usage noted, tool calls the model wrote
        as text repaired. The ingress renders it in its own wire."""
        completion = openai_completion(body)
        self.raw_usage, self.timings = completion.get("usage"), completion.get("timings")
        self.usage = anthropic_usage(completion.get("usage"), timings=completion.get("timings")) \
            if completion.get("usage") else {}
        self._repair_openai_body(completion)
        return completion

    def _translated_chat_chunk(self, data: str, out: list, feed: Callable[[dict, list], object], *,
                               after_content: bool) -> None:
        """One chunk of a chat upstream's stream for such an ingress: its shape checked, an in-band error raised,
        what it produced counted (a cut stream is billed for it), observed, repaired, handed to the ingress's
        translator (`feed`), and its usage and timings noted."""
        obj = orjson.loads(data)
        problem = check_chat_chunk(obj)
        if problem:
            raise _wrong_shape(problem, after_content=after_content)
        if "error" in obj and not obj.get("choices"):
            err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            message = str(err.get("message", "upstream error"))
            raise UpstreamError(stream_error_reason(message), message=message, after_content=after_content)
        self.produced.openai(obj)
        if self.answer is not None:
            observe_openai(self.answer, obj)
        if self.repair is not None:
            for chunk in self.repair.feed(obj):
                feed(chunk, out)
        else:
            feed(obj, out)
        if obj.get("usage"):
            self.raw_usage = obj["usage"]
            self.usage = anthropic_usage(obj["usage"], timings=obj.get("timings"))
        if "timings" in obj:
            self.timings = obj["timings"]

    def _repair_anthropic_body(self, resp: dict) -> None:
        if self.answer is not None:
            observe_anthropic(self.answer, resp)
        if self.repair_tools:
            self._repaired_whole = repair_anthropic_message(resp, self.repair_tools)

    def path(self) -> str:
        return "/chat/completions" if self.upstream_wire == "openai" else "/messages"

    def url_path(self, stream: bool) -> str:
        """The path under the adapter's api_base for this attempt (a wire whose URL says streaming overrides it)."""
        return self.path()

    # What every strategy does (each subclass has its own, which the ABC enforces at construction): the upstream's request body from the client's, a whole
    # answer on the client's wire, a batch of the upstream's SSE events, and the end of the upstream's stream.

    @abstractmethod
    def request(self, raw: bytes, stream: bool) -> bytes:
        ...

    @abstractmethod
    def response(self, body: bytes) -> bytes:
        ...

    @abstractmethod
    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        ...

    @abstractmethod
    def eof(self) -> bytes:
        ...

    def next_held(self) -> bytes:
        held = self.held
        assert held
        data = self.encode_held(held.pop(0))
        if not held:
            self.held = None
            self.done = True
        return data

    def encode_held(self, item: Any) -> bytes:  # bytes here; a subclass that holds other items encodes them
        return item


class OpenAIPassthrough(Strategy):
    """OpenAI client -> OpenAI upstream: forward each event's data verbatim. Usage is always requested upstream
    (exact accounting) and its extra chunk is hidden from clients that did not ask for it."""

    def __init__(self, **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        so = self.client_body.get("stream_options") or {}
        self.client_wants_usage = bool(so.get("include_usage"))
        self.finished = False  # a choice carried its finish_reason
        self._opened = False  # the first event was a chat chunk

    def request(self, raw: bytes, stream: bool) -> bytes:
        body = dict(self.client_body)
        body["model"] = self.model
        if "max_completion_tokens" in body and "max_tokens" not in body:
            # Local servers (llama.cpp, LM Studio, Ollama) read max_tokens; OpenAI's newer name is ignored there.
            body["max_tokens"] = body["max_completion_tokens"]
        if stream:
            so = dict(body.get("stream_options") or {})
            so["include_usage"] = True
            body["stream_options"] = so
        if not self.named_tool_choice:
            body = force_named_tool_as_required(body)
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        resp = openai_completion(body)
        u = resp.get("usage")
        self.timings = resp.get("timings")
        self.raw_usage = u if isinstance(u, dict) else None
        self.usage = anthropic_usage(u, timings=self.timings) if isinstance(u, dict) and u else {}
        if self.repair_tools or self.answer is not None:
            self._repair_openai_body(resp)
            if self._repaired_whole:
                resp["model"] = self.answer_model
                return orjson.dumps(resp)
        return renamed(body, resp.get("model"), self.answer_model)

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[bytes] = []
        for _name, data in events:
            if data == "[DONE]" and self._opened:
                self.done = True
                if isinstance(self.repair, OpenAIStreamRepair):  # an OpenAI upstream
                    out.extend(encode_data(c) for c in self.repair.flush())
                out.append(DONE)
                continue
            obj = orjson.loads(data) if self._opened else self._opening(data)
            problem = check_chat_chunk(obj)
            if problem:
                raise _wrong_shape(problem, after_content=self.started_content)
            if "error" in obj and not obj.get("choices"):
                err = obj["error"]
                message = err.get("message", err) if isinstance(err, dict) else err
                raise _stream_error(message, after_content=self.started_content)
            self.produced.openai(obj)
            if self.answer is not None:
                observe_openai(self.answer, obj)
            chunks = self.repair.feed(obj) if self.repair is not None else None
            if chunks is not None and (len(chunks) != 1 or chunks[0] is not obj):
                for c in chunks:  # rewritten by the repair: re-encoded
                    if self._note_chunk(c):
                        if "model" in c:
                            c["model"] = self.answer_model
                        out.append(encode_data(c))
                continue
            if self._note_chunk(obj):
                out.append(b"data: " + renamed_text(data, obj.get("model"), self.answer_model).encode() + b"\n\n")
        return b"".join(out)

    def _opening(self, data: str) -> dict:
        """The first event, parsed. A chat stream opens with a chunk (a JSON object with `choices`) or an error
        object; anything else ([DONE] included) is not a stream of this protocol."""
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and (isinstance(obj.get("choices"), list) or "error" in obj):
            self._opened = True
            return obj
        raise _not_an_answer("a stream that does not open with a chat completion chunk", data)

    def _note_chunk(self, obj: dict) -> bool:
        """Record usage, finish and content; False for a usage-only chunk the client did not ask for."""
        u = obj.get("usage")
        if "timings" in obj:
            self.timings = obj["timings"]
        if u:
            self.raw_usage = u
            self.usage = anthropic_usage(u, timings=obj.get("timings"))
        choices = obj.get("choices")
        if not choices:
            return self.client_wants_usage
        c0 = choices[0]
        if c0.get("finish_reason"):
            self.finished = True
        if not self.started_content:
            d = c0.get("delta") or {}
            if d.get("content") or d.get("tool_calls") or d.get("reasoning_content") or d.get("reasoning"):
                self.started_content = True
        return True

    def eof(self) -> bytes:
        if self.finished:  # some servers end the body without [DONE]; the answer was complete
            self.done = True
            if isinstance(self.repair, OpenAIStreamRepair):  # an OpenAI upstream
                return b"".join(encode_data(c) for c in self.repair.flush()) + DONE
            return DONE
        raise UpstreamError(DISCONNECT, message="upstream closed the stream before [DONE]",
                            after_content=self.started_content)


class AnthropicPassthrough(Strategy):
    """Anthropic client -> Anthropic upstream: the body goes untouched (except model), events verbatim."""

    upstream_wire = "anthropic"
    _stop_reason_seen = False  # a message_delta came: the answer is complete but for its message_stop
    _opened = False  # the stream opened as the protocol says (message_start, or an error)

    def __init__(self, *, signatures: UpstreamSignatures | None = None, **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        # Which thinking blocks this upstream signed (recorded from its answers) and which another did.
        self.signatures = signatures

    def _check_opening(self, events: list[tuple[str | None, str]]) -> None:
        """A Messages stream opens with message_start (pings aside) or reports an error; anything else is not a
        stream of this protocol. Checked until the first event that is not a ping."""
        for name, data in events:
            if name == "ping":
                continue
            if name not in ("message_start", "error"):
                raise _not_an_answer("a stream that does not open with message_start", f"{name}: {data}")
            self._opened = True
            return

    def request(self, raw: bytes, stream: bool) -> bytes:
        # Reasoning a local provider (or another Anthropic upstream) gave earlier in the conversation carries no
        # signature this upstream made.
        fixed = unsigned_thinking_fix(self.client_body, raw, self.signatures)
        if fixed is None and self.client_body.get("model") == self.model:
            return raw
        body = fixed if fixed is not None else dict(self.client_body)
        body["model"] = self.model
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        resp = anthropic_message(body)
        u = resp.get("usage")
        self.usage = u if isinstance(u, dict) else {}
        if self.signatures is not None:
            for block in resp["content"]:
                self.signatures.record_block(block)
        if self.repair_tools or self.answer is not None:
            self._repair_anthropic_body(resp)
            if self._repaired_whole:
                resp["model"] = self.answer_model
                return orjson.dumps(resp)
        return renamed(body, resp.get("model"), self.answer_model)

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        if not self._opened and events:
            self._check_opening(events)
        out = []
        for name, data in events:
            if name == "ping":
                out.append(_PING)
                continue
            # Every event is parsed for its shape (one parse, reused below): relayed bytes are the client's answer.
            obj = orjson.loads(data)
            problem = check_messages_event(name, obj)
            if problem:
                raise _wrong_shape(problem, after_content=self.started_content)
            self.produced.anthropic(name, obj)
            if name == "message_delta":
                self._stop_reason_seen = True
            elif self.signatures is not None and _may_sign(name, data):
                self._record_signature(name, obj)
            if self.answer is not None and name in _REPAIR_SEES:
                observe_anthropic(self.answer, obj)
            if self.repair is not None and name in _REPAIR_SEES:
                if name == "message_delta":
                    self.usage.update(obj.get("usage") or {})
                evs = self.repair.feed(obj)
                if len(evs) == 1 and evs[0] is obj:
                    if name == "content_block_start":
                        self.started_content = True
                    elif name == "message_start":
                        data = renamed_text(data, (obj.get("message") or {}).get("model"), self.answer_model,
                                            inside="message")
                    out.append(b"event: " + name.encode() + b"\ndata: " + data.encode() + b"\n\n")
                    continue
                for ev in evs:
                    if ev.get("type") == "content_block_start":
                        self.started_content = True
                    elif isinstance(ev.get("message"), dict) and "model" in ev["message"]:
                        ev["message"]["model"] = self.answer_model
                    out.append(encode_event(ev))
                continue
            if name == "message_start":
                msg = obj.get("message")
                if not isinstance(msg, dict):
                    raise _not_an_answer("a message_start without its message", data)
                self.usage.update(msg.get("usage") or {})
                if self.skip_prologue:
                    continue
                data = renamed_text(data, msg.get("model"), self.answer_model, inside="message")
            elif name == "content_block_start":
                self.started_content = True
            elif name == "message_delta":
                self.usage.update(obj.get("usage") or {})
            elif name == "message_stop":
                self.done = True
            elif name == "error":
                err = obj.get("error") or {}
                raise _stream_error(err.get("message", "upstream error"),
                                    error_type=err.get("type"), after_content=self.started_content)
            out.append(b"event: " + (name or "").encode() + b"\ndata: " + data.encode() + b"\n\n")
        return b"".join(out)

    def _record_signature(self, name: str | None, obj: dict) -> None:
        if self.signatures is None:
            return
        if name == "content_block_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "signature_delta":
                self.signatures.record(delta.get("signature"))
        else:
            self.signatures.record_block(obj.get("content_block"))

    def eof(self) -> bytes:
        if self._stop_reason_seen and self.started_content:
            # Ended after message_delta (stop reason and usage) without message_stop: the answer is complete, and
            # the client gets the message_stop its parser waits for. message_start's usage (output_tokens: 1) is
            # no sign of completeness: a stream cut inside a content block has it too, and is a failure.
            self.done = True
            return _MESSAGE_STOP
        raise UpstreamError(DISCONNECT, message="upstream closed the stream before message_stop",
                            after_content=self.started_content)


class AnthropicToOpenAIUpstream(Strategy):
    """Anthropic client -> OpenAI upstream (the common local case)."""

    def __init__(self, *, input_tokens: int = 0, **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        self.warnings: list[str] = []
        self.translator = OpenAIStreamToAnthropic(self.answer_model, input_tokens=input_tokens)
        self._started = False

    def request(self, raw: bytes, stream: bool) -> bytes:
        body, self.warnings = request_to_openai(self.client_body, self.model, stream=stream)
        if not self.named_tool_choice:
            body = force_named_tool_as_required(body)
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        resp = openai_completion(body)
        self.raw_usage, self.timings = resp.get("usage"), resp.get("timings")
        self._repair_openai_body(resp)
        msg = response_to_anthropic(resp, self.answer_model, stop_sequences=self.client_body.get("stop_sequences"))
        self.usage = msg.get("usage") or {}
        return orjson.dumps(msg)

    def _encode(self, evs: list[dict]) -> list[bytes]:
        return [encode_event(e) for e in evs]

    def _opening(self) -> list[bytes]:
        """message_start and a ping before the first batch; none when the sink already sent its own."""
        if self._started:
            return []
        self._started = True
        start = self.translator.start()
        return [] if self.skip_prologue else self._encode(start)

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[bytes] = self._opening()
        tr = self.translator
        for _name, data in events:
            if data == "[DONE]":
                self._flush_repair(out)
                out.extend(self._encode(tr.finish()))
                self.done = True
                continue
            obj = orjson.loads(data)
            problem = check_chat_chunk(obj)
            if problem:
                raise _wrong_shape(problem, after_content=tr.started_content)
            if "error" in obj and not obj.get("choices"):
                err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
                raise _stream_error(err.get("message", "upstream error"),
                                    after_content=tr.started_content)
            if "usage" in obj and obj["usage"]:
                self.raw_usage = obj["usage"]
            if "timings" in obj:
                self.timings = obj["timings"]
            self.produced.openai(obj)
            if self.answer is not None:
                observe_openai(self.answer, obj)
            if self.repair is not None:
                for c in self.repair.feed(obj):
                    out.extend(self._encode(tr.feed(c)))
                continue
            out.extend(self._encode(tr.feed(obj)))
        self.started_content = tr.started_content
        self.usage = tr.usage
        return b"".join(out)

    def _flush_repair(self, out: list[bytes]) -> None:
        if isinstance(self.repair, OpenAIStreamRepair):  # an OpenAI upstream
            for c in self.repair.flush():
                out.extend(self._encode(self.translator.feed(c)))

    def eof(self) -> bytes:
        # Some servers omit [DONE]; a stream that already reported its finish reason is complete.
        if self.translator.finish_reason:
            self.done = True
            parts: list[bytes] = []
            self._flush_repair(parts)
            out = b"".join(parts) + b"".join(self._encode(self.translator.finish()))
            self.usage = self.translator.usage
            return out
        raise UpstreamError(DISCONNECT, message="upstream closed the stream before it finished",
                            after_content=self.translator.started_content)


class AnthropicUpstreamAsChat(Strategy):
    """An Anthropic upstream for a client served in the chat-completions form (OpenAI clients, and Responses
    clients through it): the chat body goes up as Messages, the answer and the stream come back as a chat
    completion and chat chunks. Subclasses encode those for their client."""

    upstream_wire = "anthropic"

    def __init__(self, *, include_usage: bool, **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        self.a2o = AnthropicStreamToOpenAI(self.answer_model, include_usage=include_usage)

    def request(self, raw: bytes, stream: bool) -> bytes:
        body = openai_request_to_anthropic(self.client_body, self.model)
        body["stream"] = stream
        return orjson.dumps(body)

    def _completion(self, body: bytes) -> dict:
        """A whole Messages answer (tool calls written as text repaired) as a chat completion."""
        resp = anthropic_message(body)
        self.usage = resp.get("usage") or {}
        self._repair_anthropic_body(resp)
        return anthropic_response_to_openai(resp, self.answer_model)

    def _after_content(self) -> bool:
        """Whether the client has seen content: an error after that cannot fail over."""
        return self.a2o.started_content

    def _chat_chunks(self, events: list[tuple[str | None, str]]) -> tuple[list[dict], bool]:
        """Chat chunks for a batch of Anthropic events, and whether message_stop ended the stream (its closing
        chunks included)."""
        chunks: list[dict] = []
        stopped = False
        for name, data in events:
            if name == "ping" or not data:
                continue
            obj = orjson.loads(data)
            problem = check_messages_event(name, obj)
            if problem:
                raise _wrong_shape(problem, after_content=self._after_content())
            etype = name or obj.get("type")
            if etype == "error":
                err = obj.get("error") or {}
                raise _stream_error(err.get("message", "upstream error"),
                                    error_type=err.get("type"), after_content=self._after_content())
            self.produced.anthropic(etype, obj)
            if self.answer is not None or self.repair is not None:
                obj = obj if "type" in obj else {**obj, "type": etype}
                if self.answer is not None:
                    observe_anthropic(self.answer, obj)
            for ev in self.repair.feed(obj) if self.repair is not None else (obj,):
                chunks.extend(self.a2o.feed(ev))
            if etype == "message_stop":
                chunks.extend(self.a2o.finish())
                stopped = True
        self.usage = self.a2o.usage
        return chunks, stopped

    def _complete_without_stop(self) -> bool:
        """A stream that ended after content and its message_delta but without message_stop: complete enough.
        Usage alone is no sign: message_start carries output_tokens too, and a stream cut inside a block has it."""
        return self.a2o.started_content and self.a2o.stop_reason_seen

    def _no_stop(self) -> UpstreamError:
        return UpstreamError(DISCONNECT, message="upstream closed the stream before message_stop",
                             after_content=self.a2o.started_content)


class OpenAIToAnthropicUpstream(AnthropicUpstreamAsChat):
    """OpenAI client -> Anthropic upstream."""

    def __init__(self, **kw: Unpack[StrategyOptions]) -> None:
        so = kw["client_body"].get("stream_options") or {}
        super().__init__(include_usage=bool(so.get("include_usage")), **kw)

    def response(self, body: bytes) -> bytes:
        return orjson.dumps(self._completion(body))

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        chunks, stopped = self._chat_chunks(events)
        out = [encode_data(c) for c in chunks]
        if stopped:
            out.append(DONE)
            self.done = True
        self.started_content = self.a2o.started_content
        return b"".join(out)

    def eof(self) -> bytes:
        if self._complete_without_stop():
            self.done = True
            return b"".join(encode_data(c) for c in self.a2o.finish()) + DONE
        raise self._no_stop()


def strategy_for(ingress: str, upstream_wire: str) -> type[Strategy]:
    """By (client wire, upstream wire) for the chat ingresses; callers go through their provider's adapter
    (`adapter.strategy_for`), which takes Responses clients to responses_strategies.py (built on this module,
    so this module does not import it)."""
    if ingress in ("responses", "gemini"):
        raise ValueError(f"{ingress} clients: {ingress}_strategies.{ingress}_strategy_for")
    if ingress == "anthropic":
        return AnthropicPassthrough if upstream_wire == "anthropic" else AnthropicToOpenAIUpstream
    return OpenAIToAnthropicUpstream if upstream_wire == "anthropic" else OpenAIPassthrough
