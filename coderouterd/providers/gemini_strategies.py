"""Strategies for clients of the Gemini API (Gemini CLI, google-genai): one per kind of upstream.

- chat-completions upstream (local servers, OpenAI): the canonical chat body goes up, chat chunks come back as
  Gemini responses;
- Anthropic upstream: the chat body is translated on to Messages (a JSON answer asked for through a forced tool,
  as local Anthropic-compatible servers have no structured output), and the Anthropic stream is turned into chat
  chunks and then into Gemini responses (one Gemini grammar, in translate/gemini_answer.py).

Every strategy writes SSE `data:` events; the Gemini responder rewrites them as a JSON array for a client that
did not ask for `alt=sse`.
"""

from __future__ import annotations

from typing import Any, Required, Unpack

import orjson

from ..translate.gemini_answer import (
    ChatStreamToGemini,
    chat_completion_to_gemini,
    encode_all,
    json_tool_schema,
)
from ..translate.gemini_request import JSON_TOOL, GeminiRequest
from ..translate.openai_request_to_anthropic import openai_request_to_anthropic
from .anthropic_as_chat import AnthropicUpstreamAsChat
from .strategy import Strategy, StrategyOptions
from .through_chat import ThroughChatForm


class GeminiOptions(StrategyOptions, total=False):
    """A Gemini strategy's keywords: Strategy's, and the client's own request."""

    native: Required[GeminiRequest]
    provider_name: str


class _GeminiStrategy(ThroughChatForm[ChatStreamToGemini]):
    encode_events = staticmethod(encode_all)

    # `kw`: Any, as cooperative keywords are: what the next class in the MRO takes (Strategy, or
    # AnthropicUpstreamAsChat's include_usage for GeminiToAnthropic).
    def __init__(self, *, native: GeminiRequest, provider_name: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.rq = native
        self.provider_name = provider_name
        self.tr = ChatStreamToGemini(native, self.answer_model)
        # Content went out in an earlier batch. An error in the same batch as the first content still leaves
        # the request free to fail over: the client has seen nothing of that batch.
        self.delivered = False

    def _sync(self) -> None:
        self.started_content = self.tr.started_content
        self.delivered = self.started_content


class GeminiToChat(_GeminiStrategy):
    """Gemini client -> chat-completions upstream."""

    def request(self, raw: bytes, stream: bool) -> bytes:
        return self._translated_chat_request(stream)

    def response(self, body: bytes) -> bytes:
        completion = self._translated_chat_completion(body)  # tool calls written as text become function calls
        return orjson.dumps(chat_completion_to_gemini(self.rq, completion, self.tr.model))

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[dict] = []
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


class GeminiToAnthropic(_GeminiStrategy, AnthropicUpstreamAsChat):
    """Gemini client -> Anthropic Messages upstream, through the chat form."""

    def __init__(self, **kw: Unpack[GeminiOptions]) -> None:
        super().__init__(include_usage=True, **kw)

    def request(self, raw: bytes, stream: bool) -> bytes:
        body = openai_request_to_anthropic(self.client_body, self.model)
        body["stream"] = stream
        rq = self.rq
        if rq.json_schema is not None and not body.get("tools"):
            # A JSON answer through a forced tool: Anthropic-compatible local servers have no structured output,
            # every Messages upstream has tools. Its arguments come back as the answer's text.
            body.pop("output_config", None)
            body["tools"] = [{"name": JSON_TOOL, "description": "Give the answer as this JSON object.",
                              "input_schema": json_tool_schema(rq.json_schema)}]
            body["tool_choice"] = {"type": "tool", "name": JSON_TOOL}
            body.pop("thinking", None)  # a forced tool and thinking do not go together on the Messages API
        return orjson.dumps(body)

    def response(self, body: bytes) -> bytes:
        return orjson.dumps(chat_completion_to_gemini(self.rq, self._completion(body), self.tr.model))

    def _after_content(self) -> bool:
        return self.delivered

    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        out: list[dict] = []
        chunks, stopped = self._chat_chunks(events)
        u = self.a2o.usage  # message_start's counts, once it came
        self.tr.prompt_hint = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"]
        for chunk in chunks:
            self.tr.feed(chunk, out)
        if stopped:
            self._finish(out)
        self._sync()
        return encode_all(out)

    def eof(self) -> bytes:
        return self._messages_eof(self._complete_without_stop(), self.a2o.finish)


def gemini_strategy_for(upstream_wire: str) -> type[Strategy]:
    return GeminiToAnthropic if upstream_wire == "anthropic" else GeminiToChat
