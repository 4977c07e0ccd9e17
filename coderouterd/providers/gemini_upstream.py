"""Strategies for a Gemini API upstream (`kind = "gemini"`), one per client wire.

- Gemini clients: a pass-through. The client's body goes up as its bytes (the model is in the URL, so nothing in
  the body changes) and the answers come back as the upstream wrote them, `thoughtSignature`s and every other
  part field included; only `modelVersion` names the model as the client asked for it. Gemini 3 refuses a turn
  whose function call lost its signature, so nothing here may rewrite a part; a call that never had one (another
  upstream made it) gets Google's placeholder for calls made elsewhere, and only then is the body rebuilt.
- Anthropic, chat and Responses clients: their chat form goes up as a Gemini request
  (translate/chat_request_to_gemini.py) and each Gemini response comes back as chat chunks
  (translate/gemini_answer_to_chat.py), which the translators those clients already have turn into their wire.

A Gemini stream has no closing event: the last response carries `finishReason`, then the body ends. So the
closing output of every translated strategy is written at the end of the body (eof), and a body that ends
without a finish reason is a cut stream.
"""

from __future__ import annotations

from typing import Any, Unpack

import orjson

from ..servers.gemini import method_path
from ..translate.answer_observe import observe_openai
from ..translate.anthropic_request_to_openai import request_to_openai
from ..translate.chat_request_to_gemini import SKIP_SIGNATURE, CallSignatures, chat_to_gemini, thinking_config
from ..translate.gemini_answer_to_chat import (
    GeminiStreamToChat,
    blocked,
    chat_usage,
    gemini_response_to_chat,
    usage_as_anthropic,
)
from ..translate.openai_answer_to_anthropic import OpenAIStreamToAnthropic, response_to_anthropic
from ..translate.responses_objects import chat_completion_to_response
from ..translate.responses_stream import encode_all as encode_responses
from ..translate.tool_repair_wire import OpenAIStreamRepair
from ..translate.unsigned_thinking import UpstreamSignatures
from ..wire.sse import DONE, encode_data
from .anthropic_strategies import AnthropicToOpenAIUpstream
from .errors import DISCONNECT, UpstreamError, stream_error_reason
from .responses_strategies import _ResponsesStrategy
from .strategy import Strategy, StrategyOptions
from .upstream_answer import loads_object, not_an_answer, wrong_shape

_EVENT_END = b"\r\n\r\n"  # Gemini's own SSE framing (and the Gemini ingress's)


def _in_band_error(obj: dict, *, after_content: bool) -> UpstreamError | None:
    """An error object where a response should be (Gemini sends one as an SSE event when a stream fails)."""
    err = obj.get("error")
    if err is None or obj.get("candidates"):
        return None
    message = str(err.get("message") or err) if isinstance(err, dict) else str(err)
    return UpstreamError(stream_error_reason(message), message=message, after_content=after_content)


def _response_object(obj: object, raw: str | bytes, *, after_content: bool) -> dict:
    """A parsed GenerateContentResponse of the shape its readers need, else the upstream's failure."""
    if not isinstance(obj, dict):
        raise not_an_answer("no GenerateContentResponse", raw)
    err = _in_band_error(obj, after_content=after_content)
    if err is not None:
        raise err
    cands = obj.get("candidates")
    if cands is None:
        if "usageMetadata" in obj or blocked(obj):
            return obj
        raise wrong_shape("a GenerateContentResponse without candidates", after_content=after_content)
    if not isinstance(cands, list) or not all(isinstance(c, dict) for c in cands):
        raise wrong_shape("candidates that are not a list of objects", after_content=after_content)
    content = cands[0].get("content") if cands else None
    if content is not None and not (isinstance(content, dict) and isinstance(content.get("parts", []), list)):
        raise wrong_shape("a candidate whose content has no parts list", after_content=after_content)
    return obj


def _unsigned_calls_signed(body: dict) -> dict | None:
    """`body` with Google's placeholder for calls made elsewhere on each model turn whose first function call
    carries no thoughtSignature; None when every such call is signed (the body then goes up as its bytes).

    A Gemini client's history holds unsigned calls when another upstream made them (a session that failed over
    from a local model, or a route that sent some turns elsewhere): this daemon answered it in Gemini's shape but
    had no signature to give. Gemini 3 refuses such a turn outright; the placeholder is what Google documents for
    it. A signature the client sent is never touched."""
    contents = body.get("contents")
    if not isinstance(contents, list):
        return None
    fixed: list | None = None
    for i, content in enumerate(contents):
        if not isinstance(content, dict) or content.get("role") != "model" or not isinstance(content.get("parts"),
                                                                                               list):
            continue
        parts = content["parts"]
        first = next((j for j, p in enumerate(parts) if isinstance(p, dict) and "functionCall" in p), None)
        if first is None or parts[first].get("thoughtSignature"):
            continue
        if fixed is None:
            fixed = list(contents)
        signed = list(parts)
        signed[first] = {**parts[first], "thoughtSignature": SKIP_SIGNATURE}
        fixed[i] = {**content, "parts": signed}
    return None if fixed is None else {**body, "contents": fixed}


class _GeminiAnswers(Strategy):
    """What every strategy on a Gemini upstream shares: the URL, reading Gemini responses (as chat chunks, through
    one translator), usage, what was produced (a cut stream is billed for it), drift observation and repair."""

    upstream_wire = "gemini"
    # The provider's memory of its calls' signatures (set on the class its adapter hands out: one per provider).
    call_signatures: CallSignatures | None = None

    # `kw`: Any, as cooperative keywords are (the next class in the MRO takes what it takes).
    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.g2c = GeminiStreamToChat(self.answer_model, self.call_signatures)
        # Tool calls written as text are repaired on the chat chunks (the base would build an Anthropic-wire one).
        self.repair = OpenAIStreamRepair(self.repair_tools) if self.repair_tools else None

    def path(self) -> str:
        return method_path(self.model, False)

    def url_path(self, stream: bool) -> str:
        return method_path(self.model, stream)

    def _gemini_request(self, chat: dict) -> bytes:
        return orjson.dumps(chat_to_gemini(chat, self.call_signatures, self.model))

    def _note_usage(self) -> None:
        meta = self.g2c.meta
        if meta:
            self.usage = usage_as_anthropic(meta)
            self.raw_usage = chat_usage(meta)  # prompt_tokens_details.cached_tokens: what affinity reads
            self.produced.reported = True
            self.produced.reported_at = self.produced.chars

    def _read_chunks(self, data: str, *, after_content: bool) -> tuple[dict, list[dict]]:
        """One streamed Gemini response, parsed and checked, and as chat chunks: observed, counted, repaired."""
        obj = _response_object(orjson.loads(data), data, after_content=after_content)
        out: list[dict] = []
        for chunk in self.g2c.feed(obj):
            self.produced.openai(chunk)
            if self.answer is not None:
                observe_openai(self.answer, chunk)
            out.extend(self.repair.feed(chunk) if self.repair is not None else (chunk,))
        self._note_usage()
        return obj, out

    def _closing_chunks(self) -> list[dict]:
        """At the end of the body: whatever repair held back, then the finishing chunk (with the usage). The
        finishing chunk goes through the repair, which releases what it held and says tool_calls when it made a
        call of text (Gemini's own finish reason knows nothing of it)."""
        finish = self.g2c.finish()
        if not isinstance(self.repair, OpenAIStreamRepair):
            return finish
        out = [c for chunk in finish for c in self.repair.feed(chunk)]
        return out + self.repair.flush()

    def _completion(self, body: bytes) -> dict:
        """A whole Gemini answer as a chat completion (tool calls written as text repaired)."""
        resp = _response_object(loads_object(body, "GenerateContentResponse"), body, after_content=False)
        completion = gemini_response_to_chat(resp, self.answer_model, self.call_signatures)
        self.usage = usage_as_anthropic(resp.get("usageMetadata"))
        self.raw_usage = completion.get("usage")
        self._repair_openai_body(completion)
        return completion

    def _cut(self) -> UpstreamError:
        return UpstreamError(DISCONNECT, message="upstream closed the stream before its finishReason",
                             after_content=self.g2c.started_content)


class GeminiPassthrough(_GeminiAnswers):
    """Gemini client -> Gemini upstream: the client's bytes up, the upstream's responses down, untouched but for
    the model's name."""

    def __init__(self, *, native: Any, provider_name: str = "", **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        self.rq = native
        # Relayed bytes are not rewritten: no repair of text tool calls here (the parts are the client's answer).
        self.repair = None
        self.repair_tools = None
        # Responses with nothing in them yet (an empty text part, usage alone) wait for the next one with content:
        # relayed alone, they would commit the client to this upstream before it said anything, and an error
        # right after could no longer fail over.
        self._held_back: list[bytes] = []

    def request(self, raw: bytes, stream: bool) -> bytes:
        signed = _unsigned_calls_signed(self.rq.body)
        if signed is not None:
            return orjson.dumps(signed)
        return self.rq.raw or orjson.dumps(self.rq.body)

    def _renamed(self, data: bytes, obj: dict) -> bytes:
        current = obj.get("modelVersion")
        if not isinstance(current, str) or current == self.answer_model:
            return data
        old = b'"modelVersion":' + orjson.dumps(current)
        if old in data:
            return data.replace(old, b'"modelVersion":' + orjson.dumps(self.answer_model), 1)
        obj["modelVersion"] = self.answer_model
        return orjson.dumps(obj)

    def response(self, body: bytes) -> bytes:
        resp = _response_object(loads_object(body, "GenerateContentResponse"), body, after_content=False)
        self.g2c.feed(resp)
        self._note_usage()
        if self.answer is not None:
            observe_openai(self.answer, gemini_response_to_chat(resp, self.answer_model))
        return self._renamed(body, resp)

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[bytes] = []
        for _name, data in events:
            if not data:
                continue
            obj, chunks = self._read_chunks(data, after_content=self.started_content)
            self._held_back.append(b"data: " + self._renamed(data.encode(), obj) + _EVENT_END)
            if chunks or self.g2c.finish_reason:
                self.started_content = True
                out.extend(self._held_back)
                self._held_back.clear()
        return b"".join(out)

    def eof(self) -> bytes:
        if self.g2c.finish_reason:
            self.done = True
            return b"".join(self._held_back)
        raise self._cut()


class OpenAIToGemini(_GeminiAnswers):
    """Chat client -> Gemini upstream."""

    def __init__(self, **kw: Unpack[StrategyOptions]) -> None:
        super().__init__(**kw)
        so = self.client_body.get("stream_options") or {}
        self.client_wants_usage = bool(so.get("include_usage"))

    def request(self, raw: bytes, stream: bool) -> bytes:
        return self._gemini_request(self.client_body)

    def response(self, body: bytes) -> bytes:
        return orjson.dumps(self._completion(body))

    def _encode(self, chunks: list[dict]) -> list[bytes]:
        # The usage chunk only for a client that asked for it (stream_options.include_usage).
        return [encode_data(c) for c in chunks if self.client_wants_usage or "usage" not in c]

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[bytes] = []
        for _name, data in events:
            if data:
                out.extend(self._encode(self._read_chunks(data, after_content=self.started_content)[1]))
        self.started_content = self.g2c.started_content
        return b"".join(out)

    def eof(self) -> bytes:
        if not self.g2c.finish_reason:
            raise self._cut()
        self.done = True
        return b"".join(self._encode(self._closing_chunks())) + DONE


class AnthropicToGemini(_GeminiAnswers, AnthropicToOpenAIUpstream):
    """Anthropic Messages client -> Gemini upstream, through the chat form (the chat -> Anthropic half is the
    OpenAI upstream's)."""

    def __init__(self, *, signatures: UpstreamSignatures | None = None, **kw: Any) -> None:
        # `signatures`: Anthropic thinking signatures mean nothing to Gemini (its own travel in thoughtSignature).
        super().__init__(**kw)

    def request(self, raw: bytes, stream: bool) -> bytes:
        chat, self.warnings = request_to_openai(self.client_body, self.model, stream=stream)
        body = chat_to_gemini(chat, self.call_signatures, self.model)
        thinking = thinking_config(self.client_body.get("thinking"))
        if thinking is not None:
            body.setdefault("generationConfig", {})["thinkingConfig"] = thinking
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        completion = self._completion(body)
        msg = response_to_anthropic(completion, self.answer_model,
                                    stop_sequences=self.client_body.get("stop_sequences"))
        if self.usage:
            msg["usage"] = dict(self.usage)
        return orjson.dumps(msg)

    def _feed(self, chunks: list[dict], out: list[bytes]) -> None:
        for chunk in chunks:
            out.extend(self._encode(self.translator.feed(chunk)))

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        chunks = [c for _name, data in events if data
                  for c in self._read_chunks(data, after_content=self.started_content)[1]]
        if not self._started and self.g2c.meta:
            # Gemini's first response already counts the prompt: message_start says it, as the Messages API does.
            # (Nothing has been fed yet, so the translator is made again with it.)
            self.translator = OpenAIStreamToAnthropic(
                self.answer_model, input_tokens=usage_as_anthropic(self.g2c.meta)["input_tokens"])
        out = self._opening()
        self._feed(chunks, out)
        self.started_content = self.translator.started_content
        return b"".join(out)

    def eof(self) -> bytes:
        if not self.g2c.finish_reason:
            raise self._cut()
        out: list[bytes] = []
        self._feed(self._closing_chunks(), out)
        out.extend(self._encode(self.translator.finish()))
        self.done = True
        return b"".join(out)


class ResponsesToGemini(_ResponsesStrategy, _GeminiAnswers):
    """Responses client -> Gemini upstream, through the chat form."""

    def request(self, raw: bytes, stream: bool) -> bytes:
        return self._gemini_request(self.client_body)

    def response(self, body: bytes) -> bytes:
        return orjson.dumps(chat_completion_to_response(self.rq, self._completion(body), self.tr.model))

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out = self._batch()
        for _name, data in events:
            if data:
                for chunk in self._read_chunks(data, after_content=self.delivered)[1]:
                    self.tr.feed(chunk, out)
        self._sync()
        return encode_responses(out)

    def eof(self) -> bytes:
        if not self.g2c.finish_reason:
            raise self._cut()
        return self._closing(self._closing_chunks())


def gemini_upstream_strategy(ingress: str, signatures: CallSignatures) -> type[Strategy]:
    """The strategy for a client of `ingress` on a Gemini upstream whose calls' signatures `signatures` keeps
    (bound to the class: the executor builds strategies from the class alone)."""
    by_ingress: dict[str, type[_GeminiAnswers]] = {"gemini": GeminiPassthrough, "anthropic": AnthropicToGemini,
                                                   "responses": ResponsesToGemini}
    base = by_ingress.get(ingress, OpenAIToGemini)
    return type(base.__name__, (base,), {"call_signatures": signatures, "__doc__": base.__doc__})
