"""A team key's rate limits on this instance: rpm and tpm over a sliding 60-second window, and requests in flight.

Admission is synchronous and takes no lock: it runs on the event loop with no await between the check and the
booking, like the budget's reserve. A request without a key never reaches this module (the caller checks
`req.key is None` first). The windows are exact: every admitted request (or its tokens) is an entry kept until
it is 60 s old, so "at most N in any 60-second window" holds by construction and a burst of N at once fits.

tpm counts input plus output tokens. At admission only an estimate exists: the prompt's size, plus the output
the request may produce, at most OUTPUT_GUESS (clients ask for 32k-64k max_tokens and use a fraction: the full
figure would refuse requests that fit). When the request ends its entry is corrected to the real counts, so the
window holds what was really used; an estimate that was low costs the next requests, not the limit.

Shared state (several instances) wraps this with a gate that holds leases in the database (cluster/key_limits.py);
this module never imports it (keys/ sits below cluster/)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .model import TeamKey

WINDOW_S = 60.0
# The output tokens a request is assumed to produce at admission (capped by its own max_tokens); settled later.
OUTPUT_GUESS = 1024
# Keys not seen for this long lose their state (their windows are empty by then anyway).
IDLE_FORGET_S = 600.0

RPM, TPM, CONCURRENCY = "rpm", "tpm", "concurrency"


class Window:
    """Amounts admitted in the last WINDOW_S seconds, oldest first. Entries are [time, amount] lists so a settle
    can correct its own entry while it is still in the window."""

    __slots__ = ("entries", "total")

    def __init__(self) -> None:
        self.entries: deque[list[float]] = deque()
        self.total = 0.0

    def expire(self, now: float) -> None:
        entries = self.entries
        edge = now - WINDOW_S
        while entries and entries[0][0] <= edge:
            self.total -= entries.popleft()[1]
        if not entries:
            self.total = 0.0  # no float residue once empty

    def used(self, now: float) -> float:
        self.expire(now)
        return self.total

    def add(self, now: float, amount: float) -> list[float]:
        entry = [now, float(amount)]
        self.entries.append(entry)
        self.total += amount
        return entry

    def correct(self, entry: list[float], amount: float, now: float) -> None:
        """Set an entry's amount (a settle). An entry already out of the window changes nothing."""
        self.expire(now)
        if entry[0] > now - WINDOW_S:
            self.total += amount - entry[1]
            entry[1] = float(amount)

    def wait_for(self, now: float, need: float, limit: float) -> float:
        """Seconds until `need` more fits under `limit` (0 when it fits now; inf when it never can)."""
        if need > limit:
            return math.inf
        excess = self.used(now) + need - limit
        if excess <= 0:
            return 0.0
        for t, amount in self.entries:
            excess -= amount
            if excess <= 0:
                return max(t + WINDOW_S - now, 0.0)
        return WINDOW_S

    def reset_in(self, now: float) -> float:
        """Seconds until the window is empty again (what "reset" headers announce)."""
        self.expire(now)
        return max(self.entries[-1][0] + WINDOW_S - now, 0.0) if self.entries else 0.0


class KeyState:
    """One key's windows and its requests in flight on this instance."""

    __slots__ = ("requests", "tokens", "in_flight", "seen")

    def __init__(self, now: float) -> None:
        self.requests = Window()
        self.tokens = Window()
        self.in_flight = 0
        self.seen = now


@dataclass(slots=True)
class Refusal:
    """Why a key's request is refused now, with what the rate-limit headers announce."""

    key: str
    limit: str  # RPM | TPM | CONCURRENCY
    allowed: int
    retry_after_s: float  # inf: this request can never fit (its estimate alone is over the tpm)
    message: str
    requests: tuple[int, int, float] | None = None  # (limit, remaining, reset in s) when the key has an rpm
    tokens: tuple[int, int, float] | None = None  # likewise for tpm

    @property
    def final(self) -> bool:
        return math.isinf(self.retry_after_s)

    def retry_after_header(self) -> int:
        """Whole seconds, at least 1 (a client told 0 comes straight back)."""
        return max(1, math.ceil(self.retry_after_s)) if not self.final else int(WINDOW_S)


@dataclass(slots=True, eq=False)
class Admission:
    """A request admitted under a key: what its end gives back (`KeyLimits.release`)."""

    key: str
    state: KeyState
    tokens_entry: list[float] | None
    estimate: int
    counted_in_flight: bool
    done: bool = False
    shared: object = None  # the shared gate's part (cluster/key_limits.py), None on one instance


def estimate_tokens(estimated_input: int, max_tokens: object) -> int:
    """The tokens a request is counted for at admission: its prompt, plus the output it may produce (up to
    OUTPUT_GUESS)."""
    try:
        out = int(max_tokens) if max_tokens is not None else OUTPUT_GUESS  # type: ignore[call-overload]
    except (TypeError, ValueError):
        out = OUTPUT_GUESS
    return max(int(estimated_input), 0) + min(max(out, 0), OUTPUT_GUESS)


class KeyLimits:
    """Every key's limits on this instance. `clock`: monotonic seconds (tests inject one)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.states: dict[str, KeyState] = {}
        self._swept = clock()

    def state(self, name: str) -> KeyState:
        now = self.clock()
        st = self.states.get(name)
        if st is None:
            if now - self._swept > IDLE_FORGET_S:
                self._sweep(now)
            st = self.states[name] = KeyState(now)
        st.seen = now
        return st

    def limited(self, key: TeamKey) -> bool:
        return key.rpm is not None or key.tpm is not None or key.concurrency is not None

    def check(self, key: TeamKey, tokens: int) -> Refusal | None:
        """Whether a request of `tokens` (estimated) fits the key's limits now; books nothing."""
        st = self.state(key.name)
        now = self.clock()
        if key.concurrency is not None and st.in_flight >= key.concurrency:
            return self._refusal(key, st, CONCURRENCY, key.concurrency, 1.0, now,
                                 f"{st.in_flight} requests in flight, its limit is {key.concurrency}")
        if key.rpm is not None:
            wait = st.requests.wait_for(now, 1, key.rpm)
            if wait > 0:
                return self._refusal(key, st, RPM, key.rpm, wait, now,
                                     f"{key.rpm} requests per minute used")
        if key.tpm is not None:
            wait = st.tokens.wait_for(now, tokens, key.tpm)
            if wait > 0:
                if math.isinf(wait):
                    words = (f"this request's ~{tokens} tokens (prompt plus expected output) exceed its whole "
                             f"limit of {key.tpm} tokens per minute; send a smaller request")
                else:
                    words = (f"{int(st.tokens.used(now))} of {key.tpm} tokens per minute used, this request needs "
                             f"~{tokens}")
                return self._refusal(key, st, TPM, key.tpm, wait, now, words)
        return None

    def admit(self, key: TeamKey, tokens: int) -> Admission | Refusal:
        """Check and book in one step (no await between them)."""
        refused = self.check(key, tokens)
        if refused is not None:
            return refused
        return self.book(key, tokens)

    def book(self, key: TeamKey, tokens: int) -> Admission:
        st = self.state(key.name)
        now = self.clock()
        if key.rpm is not None:
            st.requests.add(now, 1)
        entry = st.tokens.add(now, tokens) if key.tpm is not None else None
        counted = key.concurrency is not None
        if counted:
            st.in_flight += 1
        return Admission(key.name, st, entry, tokens, counted)

    def release(self, adm: Admission, actual_tokens: int | None) -> None:
        """The request ended: its slot is free, its tokens corrected to the real count (None: keep the estimate,
        nothing better is known). Releasing twice is a no-op."""
        if adm.done:
            return
        adm.done = True
        st = adm.state
        if adm.counted_in_flight:
            st.in_flight = max(st.in_flight - 1, 0)
        if adm.tokens_entry is not None and actual_tokens is not None:
            st.tokens.correct(adm.tokens_entry, max(int(actual_tokens), 0), self.clock())

    def usage(self, key: TeamKey) -> dict:
        """The key's rate now against its limits (status, dashboard)."""
        st = self.states.get(key.name)
        now = self.clock()
        return {
            "rpm": {"used": int(st.requests.used(now)) if st else 0, "limit": key.rpm},
            "tpm": {"used": int(st.tokens.used(now)) if st else 0, "limit": key.tpm},
            "concurrency": {"used": st.in_flight if st else 0, "limit": key.concurrency},
        }

    def _refusal(self, key: TeamKey, st: KeyState, limit: str, allowed: int, wait: float, now: float,
                 words: str) -> Refusal:
        requests = tokens = None
        if key.rpm is not None:
            used = int(st.requests.used(now))
            requests = (key.rpm, max(key.rpm - used, 0), st.requests.reset_in(now))
        if key.tpm is not None:
            used = int(st.tokens.used(now))
            tokens = (key.tpm, max(key.tpm - used, 0), st.tokens.reset_in(now))
        if limit == CONCURRENCY:
            what = "is at its concurrency limit"
        else:
            what = f"is over its {limit} limit"
        tail = "" if math.isinf(wait) else f"; retry in {max(1, math.ceil(wait))} s"
        return Refusal(key.name, limit, allowed, wait, f"team key '{key.name}' {what} ({words}){tail}",
                       requests=requests, tokens=tokens)

    def _sweep(self, now: float) -> None:
        self._swept = now
        for name in [n for n, s in self.states.items() if s.in_flight == 0 and now - s.seen > IDLE_FORGET_S]:
            del self.states[name]
