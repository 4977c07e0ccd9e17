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
"""

from __future__ import annotations

from dataclasses import dataclass, field

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

    def as_dict(self) -> dict:
        """For the status: the learnt cost of copying 1,000 and 10,000 tokens."""
        return {f"copy_{n}_s": round(c, 4) if (c := self.copy_s(n)) is not None else None for n in (1000, 10000)}
