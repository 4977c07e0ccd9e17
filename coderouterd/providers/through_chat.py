"""What the strategies of clients served through the chat form share (Gemini and Responses clients, whatever the
upstream): their answer is built from chat chunks by one translator, `self.tr`, so a stream ends the same way for
both. The per-batch `events` stay in each strategy: this base adds no call to a chunk's path."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, Protocol, TypeVar

from ..translate.tool_repair_wire import OpenAIStreamRepair
from .errors import DISCONNECT, UpstreamError
from .strategies import Strategy


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
