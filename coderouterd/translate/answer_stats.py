"""What an answer looked like, measured while it streams (AnswerStats) and handed to drift detection as a
DriftSample. Here, below providers/ and quality/, because the strategies that read answers fill it and
quality/drift.py judges it: neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, slots=True)
class DriftSample:
    length: int = 0  # visible characters of the answer (text and tool arguments)
    repetition: float = 0.0  # 0..1, share of the answer that repeats itself (see AnswerStats.repetition)
    digest: int = 0  # of the answer's text: the same answer again and again is a loop too
    tools_offered: bool = False
    tool_called: bool = False
    length_stop: bool = False
    error: bool = False

    @property
    def empty(self) -> bool:
        return not self.error and self.length == 0 and not self.tool_called


_KEEP_CHARS = 8192
_LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def client_limit(body: dict) -> int | None:
    """The output limit the client asked for, if any (each wire names it its own way)."""
    for key in _LIMIT_KEYS:
        v = body.get(key)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def without_client_cut(sample: DriftSample, limit: int | None, output_tokens: int) -> DriftSample:
    """An answer cut by the client's own max_tokens is what the client asked for, not a model drifting: its length
    stop counts only when the answer ended short of that limit (or no limit was asked). Without a reported output
    count the cut is taken as the client's: drift acts on a server (demote, reload), so doubt spares it."""
    if sample.length_stop and limit is not None and (not output_tokens or output_tokens >= limit):
        return replace(sample, length_stop=False)
    return sample


class AnswerStats:
    """Cheap per-answer figures gathered while the answer streams: visible length, whether a tool was called,
    the finish, and the first 8 KB of text for the repetition check at the end."""

    __slots__ = ("length", "tool_called", "length_stop", "_parts", "_kept")

    def __init__(self) -> None:
        self.length = 0
        self.tool_called = False
        self.length_stop = False
        self._parts: list[str] = []
        self._kept = 0

    def text(self, piece: str) -> None:
        self.length += len(piece)
        if self._kept < _KEEP_CHARS:
            self._parts.append(piece)
            self._kept += len(piece)

    def arguments(self, piece: str) -> None:
        self.length += len(piece)

    def finish(self, reason: str | None) -> None:
        if reason in ("length", "max_tokens"):
            self.length_stop = True

    def repetition(self) -> float:
        """Share of repeated lines (a model looping on the same lines); for answers with few lines, of repeated
        word 4-grams (looping inside one line)."""
        text = "".join(self._parts)
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        if len(lines) >= 6:
            return 1 - len(set(lines)) / len(lines)
        words = text.split()
        if len(words) < 24:
            return 0.0
        grams = [tuple(words[i:i + 4]) for i in range(len(words) - 3)]
        return 1 - len(set(grams)) / len(grams)

    def sample(self, *, tools_offered: bool, prompt_key: int = 0) -> DriftSample:
        """`prompt_key` names what was asked: the same answer to different questions ("OK", "Done.") is no
        loop; the same answer to the same question, again and again, is."""
        text = "".join(self._parts)
        return DriftSample(length=self.length, repetition=self.repetition(),
                           digest=hash((prompt_key, text)) if text else 0,
                           tools_offered=tools_offered, tool_called=self.tool_called, length_stop=self.length_stop)
