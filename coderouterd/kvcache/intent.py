"""What kvcache is asked to do with a server's slots (`Intent`), and what came of it (`Outcome`, `Restore`).

Three callers, one path (kvcache/cache.py `execute`): a request's placement (save the evicted lane, restore the
returning one, or copy a shared prefix through a scratch file), the background saver (one idle lane), and the
supervisor's hook before a planned stop (every unsaved lane, one at a time)."""

from __future__ import annotations

from dataclasses import dataclass

REQUEST = "request"
IDLE = "idle"
BEFORE_STOP = "before_stop"


@dataclass(frozen=True, slots=True)
class Intent:
    why: str  # REQUEST | IDLE | BEFORE_STOP
    # (slot, file) to save, in order; file None: the file of the slot's lane, taken from the pool now.
    saves: tuple[tuple[int, str | None], ...] = ()
    restore: tuple[int, str] | None = None  # then restore this file into this slot


@dataclass(slots=True)
class Restore:
    """One restore and what became of it. `problem`: why it did not happen (refused before the server saw it,
    or the server failed it). Otherwise the server said yes, which is not proof (llama.cpp #26676): the answer's
    cached tokens decide `outcome` (kvcache/cache.py `prove`)."""

    filename: str
    tokens: int = 0  # what the file holds, as the server (n_restored) or its sidecar says; 0 unknown
    problem: str | None = None
    outcome: str = "pending"  # pending | taken | did not take | refused | failed
    expected_tokens: int | None = None
    cached_tokens: int | None = None

    def as_dict(self) -> dict:
        return {"file": self.filename, "outcome": self.outcome, "problem": self.problem, "tokens": self.tokens,
                "expected_tokens": self.expected_tokens, "cached_tokens": self.cached_tokens}

    def describe(self) -> str:
        """As a cache bust's segment names it (the journal's cache_bust column, `corectl explain`)."""
        if self.outcome == "did not take":
            return (f"slot restore did not take ({self.cached_tokens or 0:,} of {self.expected_tokens or 0:,} "
                    f"tokens came back cached)")
        return f"slot restore {self.outcome} ({self.problem})"


@dataclass(slots=True)
class Outcome:
    saved: int = 0
    save_failed: bool = False  # a save failed: those after it were not tried
    restore: Restore | None = None

    @property
    def restored(self) -> bool:
        return self.restore is not None and self.restore.problem is None
