"""Strategies for clients of Anthropic's Messages API (Claude Code, the Anthropic SDK): one per upstream wire. An
Anthropic upstream's events are relayed as they came (checked, thinking signatures recorded, the model renamed);
a chat upstream's chunks are translated into Messages events as they come."""

from __future__ import annotations

from typing import Unpack

import orjson

from ..translate.answer_observe import observe_anthropic, observe_openai
from ..translate.anthropic_request_to_openai import force_named_tool_as_required, request_to_openai
from ..translate.openai_answer_to_anthropic import OpenAIStreamToAnthropic, response_to_anthropic
from ..translate.tool_repair_wire import OpenAIStreamRepair
from ..translate.unsigned_thinking import UpstreamSignatures, unsigned_thinking_fix
from ..wire.answer_shapes import check_chat_chunk, check_messages_event
from ..wire.sse import encode_event
from .answer_model import renamed, renamed_text
from .errors import DISCONNECT, UpstreamError
from .strategy import Strategy, StrategyOptions
from .upstream_answer import anthropic_message, not_an_answer, openai_completion, stream_error, wrong_shape

_PING = encode_event({"type": "ping"})
_MESSAGE_STOP = encode_event({"type": "message_stop"})
# Anthropic events the repair adapter rewrites; the rest keep their bytes.
_REPAIR_SEES = frozenset({"content_block_start", "content_block_delta", "content_block_stop", "message_delta"})


def _may_sign(name: str | None, data: str) -> bool:
    """An event that may carry a thinking signature (a substring test; most deltas are text)."""
    if name == "content_block_delta":
        return '"signature_delta"' in data
    return name == "content_block_start" and '"redacted_thinking"' in data


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
                raise not_an_answer("a stream that does not open with message_start", f"{name}: {data}")
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
                raise wrong_shape(problem, after_content=self.started_content)
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
                    raise not_an_answer("a message_start without its message", data)
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
                raise stream_error(err.get("message", "upstream error"),
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
                raise wrong_shape(problem, after_content=tr.started_content)
            if "error" in obj and not obj.get("choices"):
                err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
                raise stream_error(err.get("message", "upstream error"),
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
