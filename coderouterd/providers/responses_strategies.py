"""Strategies for clients of the Responses API (Codex CLI): one per kind of upstream.

- chat-completions upstream (local servers): the canonical chat body goes up, chat chunks come back as
  Responses events;
- Anthropic upstream: the chat body is translated on to Messages, and the Anthropic stream is turned into chat
  chunks and then into Responses events (one Responses grammar, in translate/responses_stream.py);
- an upstream that serves the Responses API itself (`serves_responses = true`): the client's body goes up as it
  came and events come back verbatim.
"""

from __future__ import annotations

from typing import Any, Required, Unpack

import orjson

from ..allocator import released
from ..translate.responses_objects import chat_completion_to_response
from ..translate.responses_request import ResponsesRequest
from ..translate.responses_stream import ChatStreamToResponses, encode, encode_all
from ..wire.answer_shapes import check_response, check_responses_event
from .anthropic_as_chat import AnthropicUpstreamAsChat
from .errors import DISCONNECT, STREAM_ERROR, TOO_LARGE, UpstreamError
from .limits import MAX_ANSWER_BYTES, size_text
from .strategy import Strategy, StrategyOptions
from .through_chat import ThroughChatForm
from .upstream_answer import loads_object, wrong_shape

# The closing events of an answer with this much text leave one write each, encoded only when the one before is
# out: they repeat the text four times, and encoded and written together they took ~9x the text at once.
_CLOSE_ONE_BY_ONE = 1 << 20

# Prefix of an encrypted reasoning blob as this daemon hands it to the client: which provider issued it, so it
# goes back only there (another upstream cannot decrypt it and would reject the whole request).
_ENC_TAG = "coderouter:"


class ResponsesOptions(StrategyOptions, total=False):
    """A Responses strategy's keywords: Strategy's, and the client's own request."""

    native: Required[ResponsesRequest]
    provider_name: str


class _ResponsesStrategy(ThroughChatForm[ChatStreamToResponses]):
    encode_events = staticmethod(encode_all)

    # `kw`: Any, as cooperative keywords are: what the next class in the MRO takes (Strategy, or
    # AnthropicUpstreamAsChat's include_usage for ResponsesToAnthropic).
    def __init__(self, *, native: ResponsesRequest, provider_name: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.rq = native
        # Content went out in an earlier batch. An error in the same batch as the first content still leaves
        # the request free to fail over: the client has seen nothing of that batch.
        self.delivered = False
        self.provider_name = provider_name
        self.tr = ChatStreamToResponses(native, self.rq.body.get("model") or self.answer_model,
                                        skip_prologue=self.skip_prologue)
        # What the closing events may repeat: the bound of a whole answer that is not streamed (limits.py).
        self.max_kept = MAX_ANSWER_BYTES
        self.finished = False  # the closing events are built (sent, or held for next_held)

    def _sync(self) -> None:
        """After each batch: what the client has seen, and the bound on what the closing events will repeat.

        The closing events (each item's .done, response.completed) carry the whole answer, so the translator
        keeps its text: within the bound of a whole answer that is not streamed, or the stream ends here with
        response.failed saying why (the batch's events are dropped: the client's numbering stays whole)."""
        tr = self.tr
        tr.compact()
        if tr.kept > self.max_kept and not self.finished:  # a batch that also ended it: already built, send it
            released(tr.kept)
            raise UpstreamError(TOO_LARGE, message=f"answer longer than {size_text(self.max_kept)}, the most "
                                f"kept for one answer (its closing events repeat it whole); the stream ends here",
                                after_content=self.delivered)
        self.started_content = tr.started_content
        self.delivered = self.started_content

    def _batch(self) -> list[dict]:
        """A new list for one batch of events, after syncing what a commit may have told us meanwhile."""
        if not self.tr.started:
            # A commit may have told us after construction that the opening pair is already out.
            self.tr.skip_prologue = self.skip_prologue
        return []

    def _finish(self, out: list[dict]) -> None:
        mark = len(out)
        self.tr.finish(out)
        self.finished = True
        if self.tr.kept >= _CLOSE_ONE_BY_ONE:
            self.held = out[mark:]  # Call.read hands them out one at a time; done after the last
            del out[mark:]
        else:
            self.done = True
        released(self.tr.kept * 4)  # the closing events repeat the text four times: a big answer asks a trim

    def encode_held(self, item: dict) -> bytes:
        return encode(item)


class ResponsesToChat(_ResponsesStrategy):
    """Responses client -> chat-completions upstream."""

    def request(self, raw: bytes, stream: bool) -> bytes:
        return self._translated_chat_request(stream)

    def response(self, body: bytes) -> bytes:
        completion = self._translated_chat_completion(body)  # tool calls written as text become function_call items
        return orjson.dumps(chat_completion_to_response(self.rq, completion, self.tr.model))

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out = self._batch()
        tr = self.tr
        for _name, data in events:
            if data == "[DONE]":
                self._flush_repair(out)
                self._finish(out)
                continue
            if not data:
                continue
            self._translated_chat_chunk(data, out, tr.feed, after_content=self.delivered)
        self._sync()
        return encode_all(out)

    def eof(self) -> bytes:
        return self._chat_eof()


class ResponsesToAnthropic(_ResponsesStrategy, AnthropicUpstreamAsChat):
    """Responses client -> Anthropic Messages upstream, through the chat form."""

    def __init__(self, **kw: Unpack[ResponsesOptions]) -> None:
        super().__init__(include_usage=True, **kw)

    def response(self, body: bytes) -> bytes:
        return orjson.dumps(chat_completion_to_response(self.rq, self._completion(body), self.tr.model))

    def _after_content(self) -> bool:
        return self.delivered

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out = self._batch()
        chunks, stopped = self._chat_chunks(events)
        for chunk in chunks:
            self.tr.feed(chunk, out)
        if stopped:
            self._finish(out)
        self._sync()
        return encode_all(out)

    def eof(self) -> bytes:
        return self._messages_eof(self._complete_without_stop(), self.a2o.finish)


def _usage_from_responses(u: dict | None) -> dict:
    u = u or {}
    cached = int((u.get("input_tokens_details") or {}).get("cached_tokens") or 0)
    return {"input_tokens": max(0, int(u.get("input_tokens") or 0) - cached),
            "output_tokens": int(u.get("output_tokens") or 0), "cache_read_input_tokens": cached}


def _retag(obj: object, provider: str) -> None:
    """Mark every encrypted reasoning blob in an upstream object with the provider that issued it."""
    if isinstance(obj, dict):
        enc = obj.get("encrypted_content")
        if obj.get("type") == "reasoning" and isinstance(enc, str) and enc:
            obj["encrypted_content"] = f"{_ENC_TAG}{provider}:{enc}"
        for v in obj.values():
            if isinstance(v, (dict, list)):
                _retag(v, provider)
    elif isinstance(obj, list):
        for v in obj:
            _retag(v, provider)


def own_reasoning_only(items: list, provider: str) -> list:
    """The input items with encrypted reasoning kept only where `provider` issued it (tag removed); other
    encrypted blobs are dropped, and a reasoning item left with nothing readable goes too."""
    mine = f"{_ENC_TAG}{provider}:"
    out = []
    for item in items:
        if isinstance(item, dict) and item.get("type") == "reasoning" and item.get("encrypted_content"):
            item = dict(item)
            enc = item.pop("encrypted_content")
            if isinstance(enc, str) and enc.startswith(mine):
                item["encrypted_content"] = enc[len(mine):]
            elif not item.get("summary") and not item.get("content"):
                continue
        out.append(item)
    return out


class ResponsesPassthrough(_ResponsesStrategy):
    """Responses client -> an upstream serving the Responses API: the body as it came, events verbatim (only
    the opening pair is dropped when this daemon already sent its own, and issued reasoning is tagged)."""

    def path(self) -> str:
        return "/responses"

    def request(self, raw: bytes, stream: bool) -> bytes:
        body = self.rq.body
        if body.get("model") == self.model and not self.rq.has_encrypted_reasoning and self.rq.raw:
            return self.rq.raw
        body = dict(body)
        body["model"] = self.model
        if self.rq.has_encrypted_reasoning and isinstance(body.get("input"), list):
            body["input"] = own_reasoning_only(body["input"], self.provider_name)
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        resp = loads_object(body, "response")
        problem = check_response(resp)
        if problem:
            raise wrong_shape(problem)
        self.usage = _usage_from_responses(resp.get("usage"))
        if b'"encrypted_content"' in body:
            _retag(resp, self.provider_name)
            return orjson.dumps(resp)
        return body

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[bytes] = []
        for name, data in events:
            if not data or data == "[DONE]":
                continue
            # Every event is parsed for its shape (one parse, reused below): relayed bytes are the client's answer.
            obj = orjson.loads(data)
            problem = check_responses_event(name, obj)
            if problem:
                raise wrong_shape(problem, after_content=self.delivered)
            etype = name or obj.get("type")
            if etype in ("response.created", "response.in_progress") and self.skip_prologue:
                continue
            if etype == "error":
                err = obj.get("error") if isinstance(obj.get("error"), dict) else obj
                raise UpstreamError(STREAM_ERROR, message=str(err.get("message", "upstream error")),
                                    after_content=self.delivered)
            self.produced.responses(etype, obj)
            if etype == "response.output_item.added":
                self.started_content = True
            if etype in ("response.completed", "response.incomplete", "response.failed"):
                self.usage = _usage_from_responses((obj.get("response") or {}).get("usage"))
                self.done = True
            if '"encrypted_content"' in data:
                _retag(obj, self.provider_name)
                data = orjson.dumps(obj).decode()
            out.append(b"event: " + (etype or "").encode() + b"\ndata: " + data.encode() + b"\n\n")
        self.delivered = self.started_content
        return b"".join(out)

    def eof(self) -> bytes:
        raise UpstreamError(DISCONNECT, message="upstream closed the stream before response.completed",
                            after_content=self.started_content)


def responses_strategy_for(upstream_wire: str, serves_responses: bool) -> type[Strategy]:
    if serves_responses:
        return ResponsesPassthrough
    return ResponsesToAnthropic if upstream_wire == "anthropic" else ResponsesToChat
