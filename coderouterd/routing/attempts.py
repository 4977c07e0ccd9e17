"""What each attempt at a provider did, typed: `Attempt` and its `Outcome`. (`Skip` lives with the planner that
makes it; both are kept, in order, by the request's record, routing/record.py.)

They travel as they are through routing and telemetry; `as_dict` is for the JSON edges (journal, admin API)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    """How one attempt at one provider ended."""

    OK = "ok"
    FAILED = "failed"  # the upstream answered with an error or broke (see `reason`)
    CANCELLED = "cancelled"  # the client went away
    LOST = "lost"  # a race participant that was beaten and cancelled
    ERROR = "error"  # our own exception while serving it: never counts against the provider


@dataclass(slots=True)
class Attempt:
    provider: str
    outcome: Outcome
    reason: str
    status: int | None
    ms: float
    message: str = ""
    # Tried although every provider was skipped for a transient reason (see Exchange.run): Envoy's panic mode.
    panic: bool = False

    def as_dict(self, *, message: bool = True) -> dict:
        d = {"provider": self.provider, "outcome": str(self.outcome), "reason": self.reason, "status": self.status,
             "ms": self.ms}
        if message:
            d["message"] = self.message
        if self.panic:
            d["panic"] = True
        return d

    def header_part(self) -> str:
        """This attempt in `x-coderouter-attempts`: `name:ok`, `name:http_500`, `name:panic:ok`, ..."""
        result = "ok" if self.outcome is Outcome.OK else self.reason
        return f"{self.provider}:panic:{result}" if self.panic else f"{self.provider}:{result}"
