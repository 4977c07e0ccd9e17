"""Separating ``<think>…</think>`` reasoning from visible text.

Backends that leave reasoning in ``content`` (llama.cpp ``--reasoning-format none``, many GGUF
templates) wrap it in think tags; Anthropic clients expect it in a separate thinking block.
"""

from __future__ import annotations

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


def _partial_tag_len(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def _append(out: list[tuple[str, str]], kind: str, piece: str) -> None:
    if not piece:
        return
    if out and out[-1][0] == kind:
        out[-1] = (kind, out[-1][1] + piece)
    else:
        out.append((kind, piece))


class ThinkTagSplitter:
    """Streaming splitter; tags may be cut across chunks at any character.

    Whitespace that only frames the reasoning (the newline after ``<think>``, the blank lines
    before ``</think>`` and before the answer) is dropped so blocks do not start or end blank.
    ``start_in_think`` serves templates that put ``<think>`` in the prompt, so the model's output
    holds only the closing tag.
    """

    __slots__ = ("_in_think", "_pending", "_strip", "_text_seen")

    def __init__(self, *, start_in_think: bool = False) -> None:
        self._in_think = start_in_think
        self._pending = ""
        self._strip = start_in_think
        self._text_seen = False

    @property
    def in_think(self) -> bool:
        return self._in_think

    @property
    def passes_through(self) -> bool:
        """Text without a "<" would come out unchanged: callers may skip feed() for it (the common case)."""
        return not self._in_think and not self._pending and not self._strip

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if not text:
            return out
        buf = self._pending + text
        self._pending = ""
        while True:
            tag = CLOSE_TAG if self._in_think else OPEN_TAG
            idx = buf.find(tag)
            if idx < 0:
                break
            before = buf[:idx]
            if self._in_think:
                before = before.rstrip()
            self._emit(out, before)
            buf = buf[idx + len(tag) :]
            self._in_think = not self._in_think
            # Strip leading whitespace of each reasoning section, and of the answer only when no
            # visible text came before it (otherwise that whitespace may separate words).
            self._strip = self._in_think or not self._text_seen
        hold = _partial_tag_len(buf, CLOSE_TAG if self._in_think else OPEN_TAG)
        if self._in_think:
            # Trailing whitespace of reasoning is held too: it is dropped if the close tag follows.
            body = buf[: len(buf) - hold]
            hold += len(body) - len(body.rstrip())
        if hold:
            self._pending = buf[len(buf) - hold :]
            buf = buf[: len(buf) - hold]
        self._emit(out, buf)
        return out

    def flush(self) -> list[tuple[str, str]]:
        """Emit what was held back; the splitter stays usable (its mode is kept)."""
        out: list[tuple[str, str]] = []
        pending, self._pending = self._pending, ""
        if self._in_think:
            pending = pending.rstrip()
        self._emit(out, pending)
        return out

    def _emit(self, out: list[tuple[str, str]], piece: str) -> None:
        if self._strip:
            piece = piece.lstrip()
            if not piece:
                return
            self._strip = False
        if not piece:
            return
        if self._in_think:
            _append(out, "thinking", piece)
        else:
            self._text_seen = True
            _append(out, "text", piece)


def split_think_tags(text: str) -> tuple[str, str]:
    """Non-streaming split into (thinking, visible_text).

    A close tag with no open tag before it means the template opened the reasoning in the
    prompt, so everything before it is reasoning.
    """
    if not text:
        return "", ""
    close = text.find(CLOSE_TAG)
    opened = text.find(OPEN_TAG)
    start_in_think = close >= 0 and (opened < 0 or opened > close)
    splitter = ThinkTagSplitter(start_in_think=start_in_think)
    parts = splitter.feed(text)
    for kind, piece in splitter.flush():
        _append(parts, kind, piece)
    thinking = "\n\n".join(p for k, p in parts if k == "thinking")
    visible = "".join(p for k, p in parts if k == "text")
    return thinking, visible
