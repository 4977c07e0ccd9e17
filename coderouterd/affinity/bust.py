"""Cache-bust detection: a turn that reused far less than expected, and the segment that made it so.

What a turn should reuse is known without asking the backend: the lane's previous turn is in the cache (that
is what the slot assignment is for), so everything up to the first segment that differs from that turn
should come back as cached. When the client changed something early in the prompt (a system prompt that
embeds the time, reordered tools, a rewritten old message), the first differing segment says where; when
nothing differed, the backend dropped the prefix itself (evicted, restarted, or a slot we do not control).
"""

from __future__ import annotations

from dataclasses import dataclass

from .canonical import Prompt, common_prefix

# Share of the previous prompt a turn may fail to reuse before it counts as a bust (templates re-render the
# last assistant turn, tokenizers merge differently at the boundary).
LOSS_TOLERANCE = 0.1


@dataclass(frozen=True, slots=True)
class Bust:
    segment: str  # "system[0] changed", "tools changed", "message 14 rewritten", or the backend's doing
    cause: str  # "request" | "backend"
    expected_tokens: int
    cached_tokens: int


def describe(label: str) -> str:
    if label.startswith("message"):
        return f"{label} rewritten"
    return f"{label} changed"


def first_difference(previous: Prompt, current: Prompt) -> str | None:
    """The first segment of `previous` that `current` does not repeat, or None when `current` extends it."""
    k = common_prefix(previous.digests, current.digests)
    if k >= len(previous.digests):
        return None
    if k < len(current.labels):
        return describe(current.labels[k])
    return f"history truncated after {current.labels[-1]}" if current.labels else "prompt emptied"


def detect(previous: Prompt | None, current: Prompt, *, cached_tokens: int, previous_tokens: int,
           min_tokens: int) -> Bust | None:
    """`previous`: the lane's last prompt on this backend (None on a lane's first turn) and the prompt tokens
    the backend reported for it: all of them should be cached now. A bust is a loss of at least
    `min_tokens` and of more than LOSS_TOLERANCE of that (tokenizer and template noise stays below it)."""
    if previous is None or not previous.digests or cached_tokens < 0 or previous_tokens <= 0:
        return None
    lost = previous_tokens - cached_tokens
    if lost < min_tokens or lost <= LOSS_TOLERANCE * previous_tokens:
        return None
    where = first_difference(previous, current)
    if where is not None:
        return Bust(where, "request", previous_tokens, cached_tokens)
    return Bust("prefix dropped by the backend (evicted, restarted or a slot shared with another client)",
                "backend", previous_tokens, cached_tokens)
