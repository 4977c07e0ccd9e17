"""Refused requests in the journal: one definition of what a refusal is, read the same way by `corectl usage`, the
dashboard's Keys view (SQL, journal_reader.py) and /metrics (Python, observe/metrics.py), and the one way to
journal a request refused before it had a route (a key that is missing, unknown, revoked, expired, out of scope,
over its budget or its rate).

A refusal is a row no provider served, and that either carries a `key_*` reason or ended in 401, 402 (a budget
spent) or 403, or in a 429 that nothing was tried or skipped for (the router's own limit, not an upstream's).
Its reason is its error class (its status, when it has none).

Whoever refuses calls `refusal_event(...)` and publishes it on the bus (`daemon.telemetry.publish`): the row is
written by the writer thread, like every other, and counted by the metrics sink in the same batch.

A refusal that names no key (none was sent, or one no key matches) is not journaled: it is nobody's usage, and
anyone who can reach the port could fill the journal with them. It is counted all the same, on /metrics
(`coderouter_refusals_total{key=""}`), from an `UnnamedRefusal` event, and audited by the key gate (bounded)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .events import Event, RequestFinished

# The reasons a team key's refusal is journaled with (error_class). Others may be added: every `key_*` class
# counts as a refusal.
KEY_MISSING = "key_missing"  # 401: no key where one is required
KEY_UNKNOWN = "key_unknown"  # 401: no such key (or a wrong secret: the two are not told apart)
KEY_REVOKED = "key_revoked"  # 401
KEY_EXPIRED = "key_expired"  # 401
KEY_SCOPE = "key_scope"  # 403: a profile or model the key may not use
KEY_BUDGET = "key_budget"  # the key's monthly budget is spent
KEY_RPM = "key_rpm"  # 429
KEY_TPM = "key_tpm"  # 429
KEY_CONCURRENCY = "key_concurrency"  # 429
REFUSAL_PREFIX = "key_"

_REFUSAL_STATUSES = frozenset({401, 402, 403})

# The same predicate in SQL, over a journal row (both SQLite and PostgreSQL speak it).
REFUSAL_SQL = ("(provider IS NULL AND (substr(COALESCE(error_class, ''), 1, 4) = 'key_'"
               " OR COALESCE(status, 0) IN (401, 402, 403)"
               " OR (COALESCE(status, 0) = 429 AND COALESCE(attempts, '[]') = '[]')))")
REASON_SQL = "COALESCE(error_class, CAST(status AS TEXT))"


def refusal_event(*, request_id: str, ingress: str, status: int, reason: str, key_name: str | None = None,
                  model: str = "", profile: str = "", latency_ms: float = 0.0,
                  streaming: bool = False, ts: float | None = None) -> RequestFinished:
    """The journal row of a request refused before routing. `reason` is its error class (one of the KEY_*
    above for a team key's refusal); `key_name` the key's name when it is known (never the secret; None for a
    missing or unknown key). `model` is the client's string: clip it (ids.clip) before handing it in. `ts`:
    when it was refused (default: now)."""
    ev = RequestFinished(request_id=request_id, ingress=ingress, profile=profile, provider=None,
                         model_requested=model, status=status, error_class=reason, latency_ms=latency_ms,
                         streaming=streaming, key_name=key_name)
    if ts is not None:
        ev.ts = ts
    return ev


@dataclass(slots=True)
class UnnamedRefusal(Event):
    """A refusal no key is named in (KEY_MISSING, KEY_UNKNOWN): counted by /metrics, never journaled."""

    kind: ClassVar[str] = "unnamed_refusal"

    reason: str


# The key gate's words (ingress/auth.py KeyRefusal.reason) as journal reasons.
_GATE_WORDS = {"no_key": KEY_MISSING, "unknown": KEY_UNKNOWN, "revoked": KEY_REVOKED, "expired": KEY_EXPIRED,
               "scope": KEY_SCOPE}


def gate_reason(word: str) -> str:
    """A key refusal's reason as the journal and /metrics name it: `key_*`."""
    return _GATE_WORDS.get(word) or (word if word.startswith(REFUSAL_PREFIX) else REFUSAL_PREFIX + word)


def is_refusal(provider: str | None, status: int, error_class: str | None, attempts: list[Any]) -> bool:
    """REFUSAL_SQL in Python, for an event or a decoded row."""
    if provider:
        return False
    if error_class is not None and error_class.startswith(REFUSAL_PREFIX):
        return True
    return status in _REFUSAL_STATUSES or (status == 429 and not attempts)


def reason_of(status: int, error_class: str | None) -> str:
    return error_class if error_class is not None else str(status)
