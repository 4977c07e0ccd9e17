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


class Produced:
    """What an upstream has produced so far, for a stream cut before its end (the client left, the upstream broke):
    the characters of its content (text, reasoning, tool arguments) and where in them the upstream last reported
    its usage. A paid upstream bills what it generated whether or not the stream finished (issue 41), so a cut
    stream is settled and journaled with the upstream's own count where it covers everything produced, and with
    an estimate (chars / 4) of what came after its last report otherwise."""

    __slots__ = ("chars", "reported", "reported_at")

    def __init__(self) -> None:
        self.chars = 0
        self.reported = False  # the upstream reported usage at all
        self.reported_at = -1  # `chars` when it last did

    @property
    def covered(self) -> bool:
        """The upstream's last usage report came after the last content it produced (continuous usage)."""
        return self.reported and self.reported_at >= self.chars

    def openai(self, obj: dict) -> None:
        """A chat.completion chunk (an OpenAI-wire upstream). On every streamed event: the common case (a text
        delta) is one lookup past the delta."""
        choices = obj.get("choices")
        if choices:
            ch = choices[0]
            d = ch.get("delta") if (ch.get("index") or 0) == 0 else None
            if d:
                v = d.get("content")
                if v.__class__ is str and v:
                    self.chars += len(v)
                else:  # also beside an empty content: servers send "" with reasoning or tool calls
                    v = d.get("reasoning_content") or d.get("reasoning")
                    if v.__class__ is str:
                        self.chars += len(v)
                    for tc in d.get("tool_calls") or ():
                        args = (tc.get("function") or {}).get("arguments") if tc.__class__ is dict else None
                        if args.__class__ is str:
                            self.chars += len(args)
        if obj.get("usage"):
            self.reported = True
            self.reported_at = self.chars

    def anthropic(self, name: str | None, obj: dict) -> None:
        """A Messages stream event (an Anthropic-wire upstream)."""
        etype = name or obj.get("type")
        if etype == "content_block_delta":
            d = obj.get("delta")
            if d:
                v = d.get("text")
                if v is None:
                    v = d.get("partial_json") or d.get("thinking")
                if v.__class__ is str:
                    self.chars += len(v)
        elif etype == "message_start":
            if (obj.get("message") or {}).get("usage"):
                self.reported = True
                self.reported_at = self.chars
        elif etype == "message_delta" and obj.get("usage"):
            self.reported = True
            self.reported_at = self.chars

    def responses(self, etype: str | None, obj: dict) -> None:
        """A Responses stream event: every `*.delta` carries produced text (output, reasoning, arguments)."""
        if etype and etype.endswith(".delta"):
            v = obj.get("delta")
            if isinstance(v, str):
                self.chars += len(v)


def cut_usage(produced: Produced, usage: dict, input_estimate: int) -> tuple[dict, bool]:
    """The usage to settle and journal for a stream cut before its end, and whether any of it is our estimate.
    `usage`: what the upstream reported (Anthropic's shape), `input_estimate`: the prompt's tokens by our
    estimate, used only when the upstream reported none."""
    if produced.covered and usage.get("output_tokens"):
        return dict(usage), False
    out = dict(usage) if produced.reported else {}
    if not any(out.get(k) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")):
        out["input_tokens"] = max(int(input_estimate), 0)
    out["output_tokens"] = max(int(out.get("output_tokens") or 0), -(-produced.chars // 4), 1)
    return out, True
