"""Server-sent events: encoding for both wire dialects and an incremental parser.

Anthropic clients dispatch on the ``event:`` line, so every Anthropic event carries one; OpenAI
streams are bare ``data:`` lines ending in ``[DONE]``.
"""

from __future__ import annotations

import re

import orjson

DONE: bytes = b"data: [DONE]\n\n"

# A lone "\r" is a line end too (per the SSE grammar), so all three forms are matched.
_EOL = re.compile(rb"\r\n|\r|\n")

# Bounds on what a peer can make us hold (issue 23: a stream with no newline, or data lines with no blank line,
# grew without end). Far above any real event: a whole tool call's arguments come in many small events.
MAX_LINE_BYTES = 4 * 1024 * 1024  # a line still waiting for its end
MAX_EVENT_BYTES = 4 * 1024 * 1024  # the data of one event, its data: lines together


class EventTooLarge(ValueError):
    """A line or an event passed its bound: the stream is not one we read any further."""


def encode_event(event: dict) -> bytes:
    """Anthropic framing: ``event: <type>`` + ``data: <compact json>``."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def encode_data(obj: dict) -> bytes:
    """OpenAI framing: a single ``data:`` line."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class SSEParser:
    """Incremental SSE parser; chunks may split lines, CRLF pairs or UTF-8 sequences anywhere.

    Lines are decoded only once complete, so a multibyte character split across chunks is never
    seen half-way. Fields other than ``event`` and ``data`` (``id``, ``retry``) are irrelevant to
    a proxy and ignored.
    """

    __slots__ = ("_buf", "_scan", "_event", "_data", "_first_line", "_size", "max_line", "max_event")

    def __init__(self, *, max_line: int = MAX_LINE_BYTES, max_event: int = MAX_EVENT_BYTES) -> None:
        self._buf = bytearray()
        self._scan = 0  # bytes before this offset are known to hold no line end
        self._event: str | None = None
        self._data: list[str] = []
        self._size = 0  # characters in _data: a running count, so the bound costs one addition per line
        self._first_line = True
        self.max_line = max_line
        self.max_event = max_event

    def feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        try:
            return self._feed(chunk)
        except EventTooLarge:
            # The traceback keeps _feed's frame, whose locals name the buffer and the event's data: emptied in
            # place, so whoever keeps the exception for a while does not keep megabytes with it.
            self.discard()
            raise

    def _feed(self, chunk: bytes) -> list[tuple[str | None, str]]:
        out: list[tuple[str | None, str]] = []
        if not chunk:
            return out
        if not self._buf and b"\r" not in chunk:
            return self._feed_lf(chunk, out)
        buf = self._buf
        buf += chunk
        start = 0
        pos = self._scan
        end = len(buf)
        while True:
            m = _EOL.search(buf, pos)
            if m is None:
                break
            if m.end() == end and buf[m.start()] == 0x0D and m.end() - m.start() == 1:
                # A trailing "\r" may be the first half of "\r\n": wait for the next byte.
                break
            self._line(bytes(buf[start : m.start()]), out)
            start = pos = m.end()
        if start:
            del buf[:start]
        if len(buf) - buf.endswith(b"\r") > self.max_line:  # a last "\r" is that line's end
            raise EventTooLarge(f"an event-stream line longer than {self.max_line} bytes")
        self._scan = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        return out

    def _feed_lf(self, chunk: bytes, out: list[tuple[str | None, str]]) -> list[tuple[str | None, str]]:
        """The common case (nothing buffered, "\n" line ends only): the complete lines are decoded at once and
        split in C, instead of one regex search, copy and decode per line; a burst of 20 events is one read."""
        complete, sep, tail = chunk.rpartition(b"\n")
        if sep:
            text = complete.decode("utf-8", "replace")
            if self._first_line:
                self._first_line = False
                if text.startswith("\ufeff"):
                    text = text[1:]
            data = self._data
            size = self._size
            for line in text.split("\n"):
                if not line:
                    if data:
                        out.append((self._event, "\n".join(data)))
                        data = self._data = []
                        size = 0
                    self._event = None
                elif line.startswith("data:"):
                    value = line[6:] if line.startswith(" ", 5) else line[5:]
                    data.append(value)
                    size += len(value)
                    if size > self.max_event:
                        raise EventTooLarge(f"an event larger than {self.max_event} bytes")
                elif line.startswith("event:"):
                    self._event = line[7:] if line.startswith(" ", 6) else line[6:]
                elif line[0] != ":":
                    self._size = size
                    self._field(line)
                    data, size = self._data, self._size
            self._size = size
        if tail:
            self._buf += tail
            if len(self._buf) > self.max_line:
                raise EventTooLarge(f"an event-stream line longer than {self.max_line} bytes")
            self._scan = len(self._buf)
        return out

    def discard(self) -> None:
        """Drop what is buffered (after EventTooLarge: up to the limit of a line or an event). Emptied in place:
        other references to the buffer or the data list (a traceback's frame) see them empty too."""
        self._buf.clear()
        self._data.clear()
        self._size = 0
        self._scan = 0

    def flush(self) -> list[tuple[str | None, str]]:
        """End of stream: a last line or event without its terminating blank line still counts."""
        out: list[tuple[str | None, str]] = []
        if self._buf:
            tail = bytes(self._buf)
            self._buf.clear()
            self._scan = 0
            if tail.endswith(b"\r"):
                tail = tail[:-1]
            if tail:
                self._line(tail, out)
        self._dispatch(out)
        return out

    def _line(self, raw: bytes, out: list[tuple[str | None, str]]) -> None:
        line = raw.decode("utf-8", "replace")
        if self._first_line:
            self._first_line = False
            if line.startswith("\ufeff"):
                line = line[1:]
        if not line:
            self._dispatch(out)
            return
        if line[0] == ":":
            return
        self._field(line)

    def _field(self, line: str) -> None:
        name, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._size += len(value)
            if self._size > self.max_event:
                raise EventTooLarge(f"an event larger than {self.max_event} bytes")
        elif name == "event":
            self._event = value

    def _dispatch(self, out: list[tuple[str | None, str]]) -> None:
        if self._data:
            out.append((self._event, "\n".join(self._data)))
            self._data = []
        self._size = 0
        self._event = None
