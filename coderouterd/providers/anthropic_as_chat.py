"""An Anthropic Messages upstream seen as a chat-completions one, for every client served in the chat form (OpenAI
clients, and Responses and Gemini clients through it): the chat body goes up as Messages, the answer and the
stream's events come back as a chat completion and chat chunks, for the client's own strategy to encode."""

from __future__ import annotations

from typing import Unpack

import orjson

from ..translate.answer_observe import observe_anthropic
from ..translate.anthropic_answer_to_openai import AnthropicStreamToOpenAI, anthropic_response_to_openai
from ..translate.openai_request_to_anthropic import openai_request_to_anthropic
from ..wire.answer_shapes import check_messages_event
from .errors import DISCONNECT, UpstreamError
from .strategy import Strategy, StrategyOptions
from .upstream_answer import anthropic_message, stream_error, wrong_shape


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
                raise wrong_shape(problem, after_content=self._after_content())
            etype = name or obj.get("type")
            if etype == "error":
                err = obj.get("error") or {}
                raise stream_error(err.get("message", "upstream error"),
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
