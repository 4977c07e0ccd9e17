"""What the strategies of clients served through the chat form share (Gemini and Responses clients, whatever the
upstream): their answer is built from chat chunks by one translator, `self.tr`, so a stream ends the same way for
both, and a chat upstream's request, whole answer and chunks are read the same way for both. The per-batch
`events` stay in each strategy: this base adds no call to a chunk's path."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

import orjson

from ..translate.answer_observe import observe_openai
from ..translate.anthropic_request_to_openai import force_named_tool_as_required
from ..translate.openai_answer_to_anthropic import anthropic_usage
from ..translate.tool_repair_wire import OpenAIStreamRepair
from ..wire.answer_shapes import check_chat_chunk
from .errors import DISCONNECT, UpstreamError, stream_error_reason
from .strategy import Strategy
from .upstream_answer import openai_completion, wrong_shape


class ChatChunkTranslator(Protocol):
    """What the end of a stream reads of a translator from chat chunks to the client's events."""

    finish_reason: str | None
    started_content: bool

    def feed(self, chunk: dict, out: list[dict] | None = ...) -> list[dict]: ...

    def finish(self, out: list[dict] | None = ...) -> list[dict]: ...


T = TypeVar("T", bound=ChatChunkTranslator)


class ThroughChatForm(Strategy, Generic[T]):
    """Subclasses set `tr` and `encode_events` (their client's encoding of a list of events)."""

    tr: T
    encode_events: Callable[[list[dict]], bytes]

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
            raise wrong_shape(problem, after_content=after_content)
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

    def _batch(self) -> list[dict]:
        """A new list for the events of one batch (a subclass may sync state first)."""
        return []

    def _finish(self, out: list[dict]) -> None:
        """The closing events, after the last chunk."""
        self.tr.finish(out)
        self.done = True

    def _flush_repair(self, out: list[dict]) -> None:
        """The tool calls a streaming repair still holds at the end of an OpenAI upstream's stream."""
        if isinstance(self.repair, OpenAIStreamRepair):
            for chunk in self.repair.flush():
                self.tr.feed(chunk, out)

    def _closing(self, chunks: Iterable[dict]) -> bytes:
        """The last events of a stream whose upstream ended without its end marker but complete: those of the
        chat chunks that close it (`chunks`), then the closing events, encoded."""
        out = self._batch()
        for chunk in chunks:
            self.tr.feed(chunk, out)
        self._finish(out)
        return self.encode_events(out)

    def _cut_before(self, end: str) -> UpstreamError:
        return UpstreamError(DISCONNECT, message=f"upstream closed the stream before {end}",
                             after_content=self.tr.started_content)

    def _chat_eof(self) -> bytes:
        """A chat-completions upstream's stream that ended without [DONE]."""
        if self.tr.finish_reason:  # some servers end the body without [DONE]; the answer was complete
            return self._closing(self.repair.flush() if isinstance(self.repair, OpenAIStreamRepair) else ())
        raise self._cut_before("it finished")

    def _messages_eof(self, complete: bool, closing_chunks: Callable[[], Iterable[dict]]) -> bytes:
        """An Anthropic upstream's stream that ended without message_stop: closed when `complete`, with the chat
        chunks `closing_chunks` gives."""
        if complete:
            return self._closing(closing_chunks())
        raise self._cut_before("message_stop")
