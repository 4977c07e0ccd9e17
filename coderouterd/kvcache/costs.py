"""What a slot save and a slot restore cost on one server, learnt from its own answers. Pure.

A new lane is seeded by copying another slot's KV cache (save it, restore it into the new lane's slot) only when
that is cheaper than the server computing the shared prefix again (affinity/slots.py asks, affinity/service.py
compares with the prefill speed the server's `timings` report). A copy moves the donor slot's whole cache, not
only the shared prefix, and each action has a fixed part (the HTTP round trip, opening the file) besides the
part that grows with the tokens: so each cost is a line, seconds = fixed + per_token x tokens, fitted to the
measured actions by least squares over exponentially weighted sums (recent actions count more: the disk's page
cache warms and cools). Until a server has answered two actions of a kind of different sizes, the line is the
one point it has through the origin; until it has answered one, the cost is unknown (None) and the caller
tries a copy to learn it.

What was learnt outlives the daemon: kvcache/cache.py puts it in each server's persisted affinity snapshot, under
the key it was learnt for (`cost_key`: the model file, context per slot and build the server's /props named), and
gives it back to a server only when that server names the same key (another model's slots are another size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .files import key_from_props

DECAY = 0.8  # weight kept by the older samples at each new one


@dataclass(slots=True)
class Line:
    """Exponentially weighted least squares of seconds against tokens."""

    w: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0
    n: int = 0

    def add(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds < 0:
            return
        d = DECAY if self.n else 0.0
        self.w = self.w * d + 1.0
        self.x = self.x * d + tokens
        self.y = self.y * d + seconds
        self.xx = self.xx * d + tokens * tokens
        self.xy = self.xy * d + tokens * seconds
        self.n += 1

    def to_list(self) -> list:
        return [self.w, self.x, self.y, self.xx, self.xy, self.n]

    @classmethod
    def from_list(cls, raw: object) -> Line:
        """From `to_list()`; ValueError on anything else (a damaged or hand-edited state)."""
        if not isinstance(raw, list) or len(raw) != 6 or isinstance(raw[5], bool) or not isinstance(raw[5], int):
            raise ValueError("not a cost line")
        sums = [float(v) for v in raw[:5]]
        if not all(math.isfinite(v) and v >= 0 for v in sums) or raw[5] < 0 or (raw[5] and sums[0] <= 0):
            raise ValueError("not a cost line")
        w, x, y, xx, xy = sums
        return cls(w, x, y, xx, xy, raw[5])

    def at(self, tokens: float) -> float | None:
        """Expected seconds for `tokens`, None when never measured."""
        if not self.n:
            return None
        mx, my = self.x / self.w, self.y / self.w
        var = self.xx / self.w - mx * mx
        if var <= max(1.0, 1e-6 * mx * mx):  # one size seen: proportional through that point
            return my * tokens / mx if mx > 0 else my
        slope = max(0.0, (self.xy / self.w - mx * my) / var)
        fixed = max(0.0, my - slope * mx)
        return fixed + slope * tokens


@dataclass(slots=True)
class CopyCosts:
    save: Line = field(default_factory=Line)
    restore: Line = field(default_factory=Line)

    def copy_s(self, tokens: float) -> float | None:
        """Seconds to save a slot of `tokens` and restore it into another; None until both were measured."""
        s, r = self.save.at(tokens), self.restore.at(tokens)
        return None if s is None or r is None else s + r

    def snapshot(self, key: str) -> dict:
        return {"key": key, "save": self.save.to_list(), "restore": self.restore.to_list()}

    @classmethod
    def from_snapshot(cls, snap: object) -> tuple[str, CopyCosts] | None:
        """(the key they were learnt for, the costs) from `snapshot()`; None from anything else."""
        if not isinstance(snap, dict) or not isinstance(snap.get("key"), str) or not snap["key"]:
            return None
        try:
            return snap["key"], cls(Line.from_list(snap.get("save")), Line.from_list(snap.get("restore")))
        except (TypeError, ValueError):
            return None

    def as_dict(self) -> dict:
        """For the status: the learnt cost of copying 1,000 and 10,000 tokens."""
        return {f"copy_{n}_s": round(c, 4) if (c := self.copy_s(n)) is not None else None for n in (1000, 10000)}


def cost_key(props: object) -> str | None:
    """What a server's copy costs are learnt for, from its /props: the model file, the context per slot and the
    build (the slot files' key without the model file's stat: a server on another machine has no file here to
    stat). None when /props names no model or no context: such costs are kept for this run only."""
    key = key_from_props(props, None, None) if isinstance(props, dict) else None
    return key.digest() if key is not None and key.model else None
