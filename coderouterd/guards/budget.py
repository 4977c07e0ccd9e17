"""Monthly spend ledger: per provider and global, per calendar month (UTC), persisted as it changes.

A request to a paid provider first reserves its worst-case cost, then settles the actual cost once
usage is known (or cancels). Caps are checked against settled spend plus outstanding reservations,
so concurrent requests cannot jointly overshoot a cap. Everything runs on the event loop with no
awaits inside, which makes check-and-reserve atomic without a lock.

Only providers declared `paid` with a non-zero price are ever blocked, and only their spend counts
toward the global cap: the spend of free providers is recorded for reporting, never charged.

A request admitted by a team key (keys/model.py) also counts toward the key's own budget ("key:<name>"): it must
fit every budget that applies, the key's, its provider's and the global one, and the key's spend is kept (capped
or not) so it survives restarts like the others. Only billable spend counts toward a key, as toward the global cap.

Store layout (namespace "budget"): "<YYYY-MM>:<provider>", "<YYYY-MM>:*" and "<YYYY-MM>:key:<name>" hold the settled
USD of that month as a number; "<YYYY-MM>/notices" remembers which warnings were already published, so
a restart does not repeat them.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from coderouterd.state.events import BudgetBlocked, BudgetWarning, Event

log = logging.getLogger(__name__)

NAMESPACE = "budget"
GLOBAL = "*"
# A team key's budget: "key:<name>" (in the store, the shared ledger and refusals' words).
KEY_PREFIX = "key:"
# Sums of float prices drift by ~1e-16; a cap filled exactly must not read as overshot.
_EPS = 1e-9
_PER = 1_000_000.0


@dataclass(slots=True, eq=False)
class Reservation:
    provider: str
    estimate_usd: float
    billable: bool
    done: bool = False
    key: str | None = None  # the team key whose budget it also holds (only when billable)


def _price(cost: Any, name: str) -> float:
    value = cost.get(name) if isinstance(cost, Mapping) else getattr(cost, name, None)
    try:
        return max(float(value or 0.0), 0.0)
    except (TypeError, ValueError):
        return 0.0


def _has_prices(cost: Any) -> bool:
    return cost is not None and any(_price(cost, n) > 0 for n in ("input", "output", "cache_read", "cache_write"))


def _usd(value: Any) -> float:
    """Non-negative finite USD; anything else counts as nothing rather than poisoning the totals."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) and v > 0 else 0.0


def _small(usd: float) -> str:
    """An amount that may be a fraction of a cent, readable: 0.05, 0.0012, 3.2e-05."""
    return f"{usd:.2f}" if usd >= 0.1 else f"{usd:.2g}"


def key_budget(name: str) -> str:
    return KEY_PREFIX + name


def budget_words(budget: str) -> str:
    """How a refusal names a budget: "global", "'provider'", "team key 'alice'"."""
    if budget == GLOBAL:
        return "global"
    if budget.startswith(KEY_PREFIX):
        return f"team key {budget[len(KEY_PREFIX):]!r}"
    return repr(budget)


def zero_words(key: str) -> str:
    """A key whose monthly budget is 0: it may use free providers only (retrying cannot change that)."""
    return f"the team key {key!r} has a monthly budget of 0 USD: it may use free providers only"


SKIP_WINDOW_S = 600.0  # the window the budget's skips are counted over: "(41 in the last 10 min)"
_MAX_SKIPS = 10_000  # per provider: a bound on memory however fast requests come


@dataclass(frozen=True, slots=True)
class SkipCount:
    """One provider's budget skips in the window: how many, the least estimate skipped, what was left then, and
    whether any request got through in the window."""

    count: int
    least_usd: float
    left_usd: float | None
    admitted: bool
    window_s: float

    def words(self) -> str:
        over = self.left_usd if self.left_usd is not None else self.least_usd
        window = f"{self.window_s / 60:.0f} min" if self.window_s >= 60 else f"{self.window_s:.0f} s"
        return (f"requests estimated over ${over:.4f} are skipped ({self.count} in the last {window}"
                f"{'' if not self.admitted else ', others served'})")


class BudgetSkips:
    """Requests the budget refused a provider because their worst-case cost exceeded what is left of a cap, counted
    per provider in a sliding window, with the last admission. A provider skipped for budget on every request is
    otherwise invisible: its cap is not spent ("near its cap") and it stays in every order (issue 43, E1).

    `every` is asked for each provider of a chain on every request: a dict lookup while nothing was skipped."""

    def __init__(self, *, window_s: float = SKIP_WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s = float(window_s)
        self._clock = clock
        self._skips: dict[str, deque[float]] = {}
        self._least: dict[str, float] = {}
        self._left: dict[str, float | None] = {}
        self._admitted: dict[str, float] = {}

    def skipped(self, provider: str, estimate_usd: float, left_usd: float | None) -> None:
        now = self._clock()
        q = self._skips.get(provider)
        if q is None:
            q = self._skips[provider] = deque(maxlen=_MAX_SKIPS)
        else:
            self._cut(q, now)
        if not q:
            self._least.pop(provider, None)
        q.append(now)
        est = _usd(estimate_usd)
        least = self._least.get(provider)
        self._least[provider] = est if least is None else min(least, est)
        self._left[provider] = None if left_usd is None else max(_usd(left_usd), 0.0)

    def admitted(self, provider: str) -> None:
        if provider in self._skips:  # only a provider that was ever skipped needs its admissions timed
            self._admitted[provider] = self._clock()

    def recent(self, provider: str) -> SkipCount | None:
        """The skips of the window, or None when there were none."""
        q = self._skips.get(provider)
        if q is None:
            return None
        now = self._clock()
        self._cut(q, now)
        if not q:  # the window passed with no skip: forgotten, admissions included
            del self._skips[provider]
            self._admitted.pop(provider, None)
            return None
        at = self._admitted.get(provider)
        return SkipCount(len(q), self._least.get(provider, 0.0), self._left.get(provider),
                         at is not None and at >= now - self.window_s, self.window_s)

    def every(self, provider: str) -> str | None:
        """The words when every request that reached the provider's budget in the window was skipped, else None."""
        if provider not in self._skips:
            return None
        r = self.recent(provider)
        return r.words() if r is not None and not r.admitted else None

    def _cut(self, q: deque[float], now: float) -> None:
        cut = now - self.window_s
        while q and q[0] < cut:
            q.popleft()


def _month_bounds(ts: float) -> tuple[str, float, float]:
    dt = datetime.fromtimestamp(ts, UTC)
    start = datetime(dt.year, dt.month, 1, tzinfo=UTC)
    end = datetime(dt.year + (dt.month == 12), dt.month % 12 + 1, 1, tzinfo=UTC)
    return f"{dt.year:04d}-{dt.month:02d}", start.timestamp(), end.timestamp()


class Budget:
    def __init__(
        self,
        store,
        *,
        global_cap_usd: float = 0.0,
        warn_ratio: float = 0.8,
        publish: Callable[[Event], None] | None = None,
        clock: Callable[[], float] = time.time,
    ):
        """No I/O here: the month's totals are read from the store on first use (every query rolls the month
        first), so the store must be open by then, not yet when this is built."""
        self._store = store
        self._publish_fn = publish
        self._clock = clock
        self._global_cap = _usd(global_cap_usd)
        self._warn_ratio = float(warn_ratio)
        self._caps: dict[str, float] = {}
        self._billable: dict[str, bool] = {}
        self._reserved: dict[str, float] = {}
        self._reserved_global = 0.0
        # Reservations taken and not yet settled or cancelled: each belongs to one attempt in flight (issue 41: a
        # reservation outliving its request lowers what is left for everyone until a restart).
        self.outstanding = 0
        self._month = ""
        self._month_start = math.inf
        self._month_end = -math.inf
        self._spent: dict[str, float] = {}
        self._spent_global = 0.0
        self._warned: set[str] = set()
        self._blocked: set[str] = set()
        # Team keys' settled spend this month and their outstanding reservations, by key name.
        self._key_spent: dict[str, float] = {}
        self._key_reserved: dict[str, float] = {}

    # -- configuration --------------------------------------------------------------------------------------

    def configure(self, providers: Mapping[str, Any], *, global_cap_usd: float, warn_ratio: float) -> None:
        """Apply (re)loaded config; spend already past a new, lower threshold is reported now."""
        caps: dict[str, float] = {}
        billable: dict[str, bool] = {}
        for name, cfg in providers.items():
            billable[name] = bool(getattr(cfg, "paid", False)) and _has_prices(getattr(cfg, "cost", None))
            cap = _usd(getattr(cfg, "monthly_budget_usd", 0.0))
            if cap > 0:
                caps[name] = cap
                if not billable[name]:
                    # The one misconfiguration that silently costs money: say so at every (re)load.
                    log.warning(
                        "provider %s has monthly_budget_usd=%g but is not paid=true with a non-zero cost;"
                        " the cap is not enforced", name, cap,
                    )
        self._caps = caps
        self._billable = billable
        self._global_cap = _usd(global_cap_usd)
        self._warn_ratio = float(warn_ratio)
        self._roll()
        for name in sorted(billable):
            if billable[name]:
                self._check_thresholds(name)
        self._check_thresholds(GLOBAL)

    # -- queries --------------------------------------------------------------------------------------------

    def is_billable(self, provider: str) -> bool:
        return self._billable.get(provider, False)

    def cap(self, provider: str) -> float:
        """The provider's own monthly cap in USD ("*": the global one); 0 = none."""
        return self._global_cap if provider == GLOBAL else self._caps.get(provider, 0.0)

    @property
    def warn_ratio(self) -> float:
        return self._warn_ratio

    def period(self) -> tuple[str, float]:
        """The current month ("YYYY-MM") and when it ends (epoch seconds)."""
        self._roll()
        return self._month, self._month_end

    def allowed(self, provider: str) -> bool:
        if not self._billable.get(provider, False):
            return True  # asked for every provider of the chain on every request: a free one reads nothing more
        self._roll()
        over = self._over(provider, 0.0, with_reserved=True)
        if over is None:
            return True
        self._refused(provider, over, 0.0)
        return False

    def spent_cap(self, provider: str) -> str | None:
        """Why `provider` stays refused until the month ends, or None: the cap (its own or the global one) is
        spent by settled requests alone, so retrying cannot help. A refusal caused by other requests' in-flight
        reservations is not this (it clears in seconds). Only the refusal path calls this."""
        self._roll()
        if not self._billable.get(provider, False):
            return None
        key = self._over(provider, 0.0, with_reserved=False)
        if key is None:
            return None
        cap, spent = self._cap_and_spent(key)
        name = budget_words(key)
        resets = datetime.fromtimestamp(self._month_end, UTC).strftime("%Y-%m-%d %H:%M UTC")
        return f"the {name} monthly budget is spent ({spent:.2f} of {cap:.2f} USD); it resets {resets}"

    def too_dear(self, provider: str, estimate_usd: float, *, key: str | None = None,
                 key_cap: float | None = None) -> str | None:
        """Why a request estimated at `estimate_usd` cannot fit what is left of a cap before it resets, counting
        settled spend only (others' reservations clear in seconds): retrying the same request cannot help, so
        the client must be told, not asked to come back. None when it would fit an idle ledger. `key`: the team
        key that admitted the request, whose own cap (`key_cap`: None = none, 0 = free providers only) applies too."""
        self._roll()
        if not self._billable.get(provider, False):
            return None
        est = _usd(estimate_usd)
        over = self._over(provider, est, with_reserved=False)
        if over is None and key is not None and self._key_over(key, key_cap, est, with_reserved=False):
            over = key_budget(key)
            if _usd(key_cap) <= 0:
                return zero_words(key)
        if over is None:
            return None
        cap, spent = self._cap_and_spent(over, key_cap)
        name = budget_words(over)
        resets = datetime.fromtimestamp(self._month_end, UTC).strftime("%Y-%m-%d %H:%M UTC")
        if spent >= cap - _EPS:
            return f"the {name} monthly budget is spent ({spent:.2f} of {cap:.2f} USD); it resets {resets}"
        return (f"this request may cost up to {_small(est)} USD, more than the {_small(max(cap - spent, 0.0))} USD left of "
                f"the {name} monthly budget ({spent:.2f} of {cap:.2f} USD spent; lower max_tokens or wait for the "
                f"reset {resets})")

    def left(self, provider: str) -> float | None:
        """What is left (settled spend only) of the tightest cap over `provider`, or None when none applies."""
        self._roll()
        if not self._billable.get(provider, False):
            return None
        lefts = [cap - spent for cap, spent in ((self._caps.get(provider, 0.0), self._spent.get(provider, 0.0)),
                                                (self._global_cap, self._spent_global)) if cap > 0]
        return max(min(lefts), 0.0) if lefts else None

    def spent(self, provider: str | None = None) -> float:
        self._roll()
        if provider is None:
            return self._spent_global
        return self._spent.get(provider, 0.0)

    def key_spent(self, key: str) -> float:
        """A team key's settled spend this month (USD)."""
        self._roll()
        return self._key_spent.get(key, 0.0)

    def snapshot(self) -> dict:
        self._roll()
        names = sorted({*self._billable, *self._caps, *self._spent, *self._reserved})
        providers = {}
        for name in names:
            spent = self._spent.get(name, 0.0)
            cap = self._caps.get(name, 0.0)
            billable = self._billable.get(name, False)
            providers[name] = {
                "spent": spent,
                "cap": cap,
                "ratio": spent / cap if cap > 0 else None,
                "reserved": self._reserved.get(name, 0.0),
                "blocked": billable and self._over(name, 0.0, with_reserved=True) is not None,
            }
        cap = self._global_cap
        return {
            "month": self._month,
            "global": {
                "spent": self._spent_global,
                "cap": cap,
                "ratio": self._spent_global / cap if cap > 0 else None,
                "reserved": self._reserved_global,
                "blocked": cap > 0 and self._spent_global + self._reserved_global >= cap - _EPS,
            },
            "providers": providers,
            "keys": {k: {"spent": self._key_spent.get(k, 0.0), "reserved": self._key_reserved.get(k, 0.0)}
                     for k in sorted({*self._key_spent, *self._key_reserved})},
        }

    @staticmethod
    def estimate(provider_cfg: Any, input_tokens: int, max_tokens: int) -> float:
        """Worst case for a reservation: every input token at the dearest input price (a cache write
        usually), and the full max_tokens of output."""
        cost = getattr(provider_cfg, "cost", provider_cfg)
        if cost is None:
            return 0.0
        p_in = max(_price(cost, "input"), _price(cost, "cache_write"), _price(cost, "cache_read"))
        return (max(int(input_tokens), 0) * p_in + max(int(max_tokens), 0) * _price(cost, "output")) / _PER

    # -- reservations ---------------------------------------------------------------------------------------

    def reserve(self, provider: str, estimate_usd: float, *, key: str | None = None,
                key_cap: float | None = None) -> Reservation | None:
        """Hold `estimate_usd` against the caps, or None when that would exceed one. No await may come
        between the check and the booking: this is what keeps concurrent requests under the cap. `key`: the
        team key that admitted the request; its budget (`key_cap`: None = none, its spend still kept; 0 = free
        providers only) applies too."""
        self._roll()
        est = _usd(estimate_usd)
        billable = self._billable.get(provider, False)
        if billable:
            over = self._over(provider, est, with_reserved=True)
            if over is not None:
                self._refused(provider, over, est)
                return None
            if key is not None:
                if self._key_over(key, key_cap, est, with_reserved=True):
                    return None
                self._key_reserved[key] = self._key_reserved.get(key, 0.0) + est
            self._reserved_global += est
        self._reserved[provider] = self._reserved.get(provider, 0.0) + est
        self.outstanding += 1
        return Reservation(provider=provider, estimate_usd=est, billable=billable,
                           key=key if billable else None)

    def settle(self, reservation: Reservation, actual_usd: float) -> None:
        """Replace the held estimate with the actual cost; settling twice is a no-op."""
        if reservation.done:
            return
        self._release(reservation)
        self._add(reservation.provider, _usd(actual_usd), reservation.billable, reservation.key)

    def cancel(self, reservation: Reservation) -> None:
        if not reservation.done:
            self._release(reservation)

    def record(self, provider: str, actual_usd: float) -> None:
        """Add spend that had no reservation (e.g. a request that bypassed the planner)."""
        self._add(provider, _usd(actual_usd), self._billable.get(provider, False))

    # -- internals ------------------------------------------------------------------------------------------

    def _release(self, reservation: Reservation) -> None:
        reservation.done = True
        self.outstanding -= 1
        name = reservation.provider
        left = self._reserved.get(name, 0.0) - reservation.estimate_usd
        if left > _EPS:
            self._reserved[name] = left
        else:
            self._reserved.pop(name, None)
        if reservation.billable:
            self._reserved_global = max(self._reserved_global - reservation.estimate_usd, 0.0)
            if self._reserved_global <= _EPS:
                self._reserved_global = 0.0
        key = reservation.key
        if key is not None:
            held = self._key_reserved.get(key, 0.0) - reservation.estimate_usd
            if held > _EPS:
                self._key_reserved[key] = held
            else:
                self._key_reserved.pop(key, None)

    def _add(self, provider: str, actual: float, counts_globally: bool, key: str | None = None) -> None:
        self._roll()
        if actual <= 0:
            return
        month = self._month
        if key is not None and counts_globally:
            spent = self._key_spent[key] = self._key_spent.get(key, 0.0) + actual
            self._store.set(NAMESPACE, f"{month}:{key_budget(key)}", spent)
        total = self._spent.get(provider, 0.0) + actual
        self._spent[provider] = total
        self._store.set(NAMESPACE, f"{month}:{provider}", total)
        if counts_globally:
            self._spent_global += actual
            self._store.set(NAMESPACE, f"{month}:{GLOBAL}", self._spent_global)
            self._check_thresholds(provider)
            self._check_thresholds(GLOBAL)

    def _over(self, provider: str, extra: float, *, with_reserved: bool) -> str | None:
        """Which cap (the provider's name, or "*") `extra` more USD would break, if any."""
        cap = self._caps.get(provider, 0.0)
        if cap > 0:
            used = self._spent.get(provider, 0.0) + (self._reserved.get(provider, 0.0) if with_reserved else 0.0)
            if used >= cap - _EPS or used + extra > cap + _EPS:
                return provider
        cap = self._global_cap
        if cap > 0:
            used = self._spent_global + (self._reserved_global if with_reserved else 0.0)
            if used >= cap - _EPS or used + extra > cap + _EPS:
                return GLOBAL
        return None

    def _key_over(self, key: str, cap: float | None, extra: float, *, with_reserved: bool) -> bool:
        if cap is None:
            return False
        cap = _usd(cap)
        used = self._key_spent.get(key, 0.0) + (self._key_reserved.get(key, 0.0) if with_reserved else 0.0)
        return used >= cap - _EPS or used + extra > cap + _EPS

    def _refused(self, provider: str, over: str, extra: float) -> None:
        # A refusal caused only by other requests' in-flight reservations is momentary congestion;
        # the once-a-month audit event is kept for the cap really being spent.
        if self._over(provider, extra, with_reserved=False) is None:
            log.debug("budget: %s refused while reservations are outstanding", provider)
            return
        self._notify_blocked(over)

    def _cap_and_spent(self, key: str, key_cap: float | None = None) -> tuple[float, float]:
        if key == GLOBAL:
            return self._global_cap, self._spent_global
        if key.startswith(KEY_PREFIX):
            return _usd(key_cap or 0.0), self._key_spent.get(key[len(KEY_PREFIX):], 0.0)
        return self._caps.get(key, 0.0), self._spent.get(key, 0.0)

    def _check_thresholds(self, key: str) -> None:
        cap, spent = self._cap_and_spent(key)
        if cap <= 0:
            return
        ratio = spent / cap
        if ratio >= self._warn_ratio - _EPS and key not in self._warned:
            self._warned.add(key)
            self._save_notices()
            self._publish(BudgetWarning(provider=key, spent_usd=spent, cap_usd=cap, ratio=ratio))
        if spent >= cap - _EPS:
            self._notify_blocked(key)

    def _notify_blocked(self, key: str) -> None:
        if key in self._blocked:
            return
        self._blocked.add(key)
        self._save_notices()
        cap, spent = self._cap_and_spent(key)
        log.warning("budget: %s reached its monthly cap (%.4f of %.2f USD); skipping it", key, spent, cap)
        self._publish(BudgetBlocked(provider=key, spent_usd=spent, cap_usd=cap))

    def _save_notices(self) -> None:
        self._store.set(
            NAMESPACE, f"{self._month}/notices", {"warned": sorted(self._warned), "blocked": sorted(self._blocked)}
        )

    def _publish(self, event: Event) -> None:
        if self._publish_fn is None:
            return
        try:
            self._publish_fn(event)
        except Exception:  # a broken sink must not fail the request that crossed a threshold
            log.exception("budget: publishing %s failed", event.kind)

    def _roll(self) -> None:
        """Switch to the current calendar month when the clock has left the loaded one."""
        now = self._clock()
        if self._month_start <= now < self._month_end:
            return
        self._month, self._month_start, self._month_end = _month_bounds(now)
        self._spent = {}
        self._spent_global = 0.0
        self._warned = set()
        self._blocked = set()
        self._key_spent = {}
        prefix = f"{self._month}:"
        for key, value in self._store.items(NAMESPACE).items():
            if key.startswith(prefix):
                name = key[len(prefix):]
                if name.startswith(KEY_PREFIX):
                    if _usd(value) > 0:
                        self._key_spent[name[len(KEY_PREFIX):]] = _usd(value)
                elif name == GLOBAL:
                    self._spent_global = _usd(value)
                elif _usd(value) > 0:
                    self._spent[name] = _usd(value)
            elif key == f"{self._month}/notices" and isinstance(value, dict):
                self._warned = {str(k) for k in value.get("warned") or ()}
                self._blocked = {str(k) for k in value.get("blocked") or ()}


# ("YYYY-MM", start, end) of the UTC month holding a time: the period every cap counts in, for readers outside the
# ledger (the dashboard's cost per day).
month_bounds = _month_bounds
