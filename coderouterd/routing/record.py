"""One request's record: what everybody who looks at a request reads (its route headers, the journal, the decision
trace for `corectl explain`, the drift detector, the log line), apart from the routine that serves the request
(`Exchange`, routing/executor.py) and fills the record as it goes.

The record is written only through its own methods, each named for what happened (`skipped`, `attempted`,
`served`, ...): no other module assigns or mutates a field of it (tests/unit/test_routing_seams.py). Its outcome
-- the status the client got and the error class -- is set only by `end`, and the first end stands except where
a later one is meant to replace it (see `end`). Observers receive the record, never the Exchange, once the
answer is out; nothing they do writes to it, so they may run in any order (the cost is computed by whoever
renders it and passed in: `trace(latency_s, cost_usd=)`).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from ..ids import new_id
from .attempts import Attempt, Outcome
from .planner import Skip

if TYPE_CHECKING:
    from ..affinity.service import Ticket
    from ..providers.strategies import Strategy
    from ..translate.answer_stats import DriftSample
    from .generation import Generation
    from .planner import Plan
    from .request import ClientRequest

CLIENT_DISCONNECTED = "client_disconnected"
INTERNAL_ERROR = "internal_error"


class RecordEnded(RuntimeError):
    """A second `end` that is not one of the intended replacements: a bug in whoever ended the request."""


class RequestRecord:
    """What one request did, for whoever reads it: the request and its profile, the plan, the typed skips and
    attempts in order, who served it with which model and usage, the outcome, timings, the race's outcome,
    panic, routing notes, affinity's ticket, tool-call repair and the drift sample of the answer."""

    __slots__ = ("req", "runtime", "profile_name", "profile", "_message_id", "plan", "skips", "attempts", "notes",
                 "settles", "panic", "served_by", "model_used", "usage", "usage_estimated", "_status", "_error_class", "ttfb",
                 "upstream_wait_s", "race_outcome", "affinity", "repair_applied", "tools_repaired",
                 "repair_formats", "drift_sample", "answered_by", "guards")

    def __init__(self, req: ClientRequest, runtime: Generation, profile_name: str) -> None:
        self.req = req  # the request as routing saw it: its id, wire, model asked for, stream, start times
        self.runtime = runtime  # the configuration generation it was served under (prices, provider kinds)
        self.profile_name = profile_name
        self.profile = runtime.config.profiles[profile_name]
        self._message_id: str | None = None  # see message_id
        self.plan: Plan | None = None
        self.skips: list[Skip] = []
        self.attempts: list[Attempt] = []
        self.notes: list[dict] = []  # what routing did to the request on the way (panic, images omitted, waits)
        self.settles: list[dict] = []  # shared-ledger settles, journaled with the request (see state/shared)
        self.panic = False
        self.served_by: str | None = None
        # The provider whose own error answer ended the request (a context overflow, a 4xx passed on, a stream
        # that broke): it did reach a server, and the journal names it.
        self.answered_by: str | None = None
        self.model_used: str | None = None
        self.usage: dict = {}
        # Some of `usage` is our estimate, not the upstream's count (a stream cut before the upstream reported it).
        self.usage_estimated = False
        self._status = 0  # 0 until `end`
        self._error_class: str | None = None
        self.ttfb: float | None = None
        self.upstream_wait_s = 0.0
        self.race_outcome: str | None = None
        self.affinity: Ticket | None = None  # session, lane, canonical prompt, what affinity did
        # Tool-call repair on the answer that was served: applied at all, calls repaired, their formats.
        self.repair_applied = False
        self.tools_repaired = 0
        self.repair_formats: list[str] = []
        self.drift_sample: DriftSample | None = None  # of the served answer (local providers)
        # Guards that fired on this request (guard, action, their detail): a tool loop warned, injected or stopped.
        self.guards: list[dict] = []

    # -- the outcome ----------------------------------------------------------------------------------------

    @property
    def status(self) -> int:
        """The HTTP status the client got (200 for a stream that failed after its 200 went out); 0 until `end`."""
        return self._status

    @property
    def error_class(self) -> str | None:
        """None when the request was served; else why not (an error kind, an upstream failure's reason,
        `client_disconnected`, `internal_error`, a guard's name)."""
        return self._error_class

    @property
    def request_id(self) -> str:
        return self.req.request_id

    @property
    def message_id(self) -> str:
        """The answer's id when coderouterd opens the stream itself (a stream whose hold expired): made on first
        use, so the requests that never need one (nearly all) never pay for it."""
        mid = self._message_id
        if mid is None:
            mid = self._message_id = new_id("msg")
        return mid

    def end(self, status: int, error_class: str | None) -> None:
        """The request's outcome: the status the client got (or was being sent) and its error class, None when
        it was served. The only way to set either.

        The first end stands. Two later ones replace it, on purpose:
        - `internal_error`: our own exception came after it; the record says what went wrong, whatever the
          client had been answered (a bug must show in the journal);
        - `client_disconnected` over anything but a success: the client left before it had its whole answer.
          After a success it is ignored: a client that closes right after [DONE] was served, and the record
          keeps the usage the upstream reported.
        Any other second end raises RecordEnded and leaves the first outcome as it was."""
        if status <= 0:
            raise ValueError(f"an ended request has an HTTP status, not {status}")
        if self._status and error_class != INTERNAL_ERROR:
            if error_class != CLIENT_DISCONNECTED:
                raise RecordEnded(f"request {self.req.request_id} already ended ({self._status}, "
                                  f"{self._error_class}); a second end ({status}, {error_class}) is not one that "
                                  "replaces it")
            if self._status == 200 and self._error_class is None:
                return  # served whole before the client left
        self._status = status
        self._error_class = error_class

    # -- what routing did, as it happens (called by the Exchange) -------------------------------------------

    def set_affinity(self, ticket: Ticket | None) -> None:
        self.affinity = ticket

    def planned(self, plan: Plan) -> None:
        self.plan = plan
        self.skips = list(plan.skips)

    def skipped(self, skip: Skip) -> None:
        self.skips.append(skip)

    def attempted(self, provider: str, outcome: Outcome, reason: str, status: int | None, started: float,
                  message: str = "", panic: bool = False) -> None:
        """One attempt ended (`started`: its time.monotonic() at admission)."""
        self.attempts.append(Attempt(provider, outcome, reason, status, round((time.monotonic() - started) * 1000, 2),
                                     message[:300], panic))

    def panicked(self, transient: list[Skip]) -> None:
        """Every provider was skipped, `transient` ones for a passing reason: they are tried anyway (panic)."""
        self.panic = True
        self.skips = [s for s in self.skips if not s.transient]
        why = ", ".join(f"{s.provider} ({s.reason})" for s in transient)
        self.notes.append({"provider": "*", "moved": "none", "panic": True,
                           "why": f"panic: every provider was skipped for a transient reason ({why}); "
                                  "tried anyway, best first"})

    def waited_for(self, up: list[str], waited_s: float) -> None:
        """Managed providers that were starting are up after `waited_s`: they are no longer skipped as not ready."""
        self.skips = [s for s in self.skips if not (s.provider in up and s.reason == "not_ready")]
        self.notes.append({"provider": up[0], "moved": "none", "waited_s": round(waited_s, 3),
                           "why": f"waited for {', '.join(up)} to be ready (managed process starting); "
                                  "nothing else could serve"})

    def cannot_start(self, provider: str, why: str) -> None:
        """A provider skipped as not ready turned out unable to start (fatal, no room): its skip says so."""
        self.skips = [Skip(s.provider, "cannot_start", why, overridable=False)
                      if s.provider == provider and s.reason == "not_ready" else s for s in self.skips]

    def note(self, note: dict) -> None:
        """Something routing did to the request on the way (e.g. images omitted for a provider)."""
        self.notes.append(note)

    def guard_fired(self, entry: dict) -> None:
        """A guard acted on this request (guards/apply.py): guard, action, message and its detail."""
        self.guards.append(entry)

    def chose_model(self, model: str) -> None:
        self.model_used = model

    def set_ttfb(self, ttfb: float | None) -> None:
        self.ttfb = ttfb

    def served(self, provider: str, strategy: Strategy) -> None:
        """`provider` served the request (its translation strategy holds the usage and the repair done): a
        success, and the end of the request (200)."""
        self.served_by = provider
        self.usage = strategy.usage or {}
        self.repair_applied = strategy.repair_tools is not None
        self.tools_repaired = strategy.repaired
        self.repair_formats = strategy.repair_formats
        self.end(200, None)

    def cut(self, provider: str, usage: dict, estimated: bool) -> None:
        """The request ended (the client left, the upstream broke) while `provider` was streaming its answer: what
        it produced until then was billed, and is the request's usage; `estimated` when the upstream had not
        reported all of it. The provider is named as the one that answered, not as a success."""
        if self.answered_by is None:
            self.answered_by = provider
        self.usage = usage
        self.usage_estimated = estimated

    def ended_by_last_attempt(self) -> None:
        """The last attempt's own error answer ends the request: its provider answered, and is named for it."""
        if self.attempts:
            self.answered_by = self.attempts[-1].provider

    def sampled_drift(self, sample: DriftSample | None) -> None:
        self.drift_sample = sample

    def waited_upstream(self, seconds: float) -> None:
        self.upstream_wait_s += seconds

    def settled(self, settle: dict) -> None:
        self.settles.append(settle)

    def race_won(self, winner: str, after_s: float) -> None:
        lost = [a.provider for a in self.attempts if a.outcome == "lost"]
        self.race_outcome = f"winner={winner} after {after_s * 1000:.1f}ms" + (
            f"; losers={','.join(lost)}" if lost else "")

    def race_unwon(self, *, more_to_try: bool) -> None:
        """Every participant failed; `more_to_try`: providers not raced are tried in order next."""
        self.race_outcome = "no_winner_fallback" if more_to_try else "no_winner"

    # -- what it shows --------------------------------------------------------------------------------------

    def skips_and_attempts(self) -> list[Skip | Attempt]:
        """The whole decision trace in order, typed: what was skipped (and why), then each attempt."""
        return [*self.skips, *self.attempts]

    def trace(self, latency_s: float, *, cost_usd: float) -> dict:
        """The decision trace of this request, for `corectl explain` and GET /v1/requests/{id}. `cost_usd` is
        what the answer cost (observe/request_record.request_cost): the record does not price itself."""
        plan = self.plan
        req = self.req
        return {
            "request_id": req.request_id, "ts": req.wall_started, "ingress": req.ingress,
            "key": req.key.name if req.key is not None else None,  # the team key's name, never its secret
            # The model of the attempt that served it: a request nobody served used no model (the last one
            # tried is in its attempt, not named as the request's).
            "stream": req.stream, "model_requested": req.model,
            "model_used": self.model_used if self.served_by is not None else None,
            "profile": self.profile_name, "mode": self.profile.mode,
            "candidates": list(self.profile.providers),
            # None: never planned (a guard answered first), which is not "no provider was available".
            "effective_order": list(plan.candidates) if plan is not None else None,
            "order_notes": (list(plan.order_notes) if plan is not None else []) + list(self.notes),
            "skips": [s.as_dict() for s in self.skips], "attempts": [a.as_dict() for a in self.attempts],
            "served_by": self.served_by, "panic": self.panic,
            "status": self._status, "error_class": self._error_class, "race_outcome": self.race_outcome,
            "latency_ms": round(latency_s * 1000, 3),
            "ttfb_ms": round(self.ttfb * 1000, 3) if self.ttfb is not None else None,
            "usage": dict(self.usage), "usage_estimated": self.usage_estimated, "cost_usd": cost_usd,
            "notes": list(getattr(req.native, "notes", ())),
            "affinity": self.affinity.note() if self.affinity is not None else None,
            "guards": list(self.guards),
            "tool_repair": {"applied": self.repair_applied, "repaired": self.tools_repaired,
                            "formats": list(self.repair_formats)},
        }

    def attempts_header(self, serving: str | None = None) -> str:
        """`x-coderouter-attempts`. `serving` is the header part of the provider a stream is committed to,
        which has not finished when the header goes out."""
        parts = [f"{s.provider}:skipped:{s.reason}" for s in self.skips]
        parts += [a.header_part() for a in self.attempts]
        if serving:
            parts.append(serving)
        return ",".join(parts)

    def route_headers(self, provider: str | None, serving: str | None = None) -> dict[str, str]:
        h = {"x-coderouter-profile": self.profile_name, "x-coderouter-attempts": self.attempts_header(serving)}
        if provider:
            h["x-coderouter-provider"] = provider
        return h

    def failure_summary(self) -> str:
        """Each skip and failed attempt with its cause, for the error that says nobody served the request."""
        parts = [f"{s.provider}: skipped ({s.reason}: {s.message})" for s in self.skips]
        for a in self.attempts:
            if a.outcome is not Outcome.OK:
                parts.append(f"{a.provider}: {a.reason}" + (f" ({a.message})" if a.message else ""))
        return "; ".join(parts)
