"""Adaptive routing: rolling latency/error figures per provider, a debounced reorder per profile, and the
schedule of light probes that keeps figures fresh for providers a fallback chain rarely reaches."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from statistics import median
from typing import TypedDict

from ..upstream.clock import Clock, SystemClock


@dataclass
class AdaptiveSettings:
    window_s: float = 60.0
    latency_ratio: float = 1.5
    min_latency_samples: int = 3
    error_rate: float = 0.10
    min_error_samples: int = 5
    debounce_s: float = 30.0
    probe_interval_s: float = 15.0
    max_probes_per_minute: int = 4
    probe_paid: bool = False
    # Probing an idle chain buys nothing: figures only need to be fresh while traffic is being routed.
    probe_only_when_active: bool = True
    # Bounds memory and the cost of a median on a very busy provider; the window still applies.
    max_samples: int = 2048


# Relative tolerance for threshold comparisons, so 0.45 vs 1.5 x 0.30 counts as "at the threshold"
# despite binary floating point.
_EPS = 1e-9


def _p95(sorted_values: list[float]) -> float:
    # Nearest-rank percentile: always an observed value, which is what an operator expects to see.
    rank = math.ceil(0.95 * len(sorted_values))
    return sorted_values[max(0, rank - 1)]


class Figures(TypedDict):
    """One provider's window of samples, as the orderer, the admin view and `corectl status` read it."""

    samples: int
    latency_samples: int  # successful samples with a latency: what the median and p95 are taken over
    probes: int
    median_s: float | None
    p95_s: float | None
    error_rate: float | None
    errors: int
    last_sample_age_s: float | None


def _no_figures() -> Figures:
    return {"samples": 0, "latency_samples": 0, "probes": 0, "median_s": None, "p95_s": None, "error_rate": None,
            "errors": 0, "last_sample_age_s": None}


class _Series:
    __slots__ = ("samples", "version", "_cache_version", "_cache", "_lat_version", "_latencies")

    def __init__(self, maxlen: int) -> None:
        # (monotonic time, latency or None, ok, probe)
        self.samples: deque[tuple[float, float | None, bool, bool]] = deque(maxlen=maxlen)
        self.version = 0
        self._cache_version = -1
        self._cache: Figures = _no_figures()  # last_sample_age_s is filled in per read
        self._lat_version = -1
        self._latencies: list[float] = []

    def prune(self, cutoff: float) -> None:
        samples = self.samples
        changed = False
        while samples and samples[0][0] < cutoff:
            samples.popleft()
            changed = True
        if changed:
            self.version += 1

    def latencies(self) -> list[float]:
        """Sorted latencies of successful samples. A failure's latency (a fast 500, a 300 s timeout)
        says nothing about how quickly the provider answers, so it is left out."""
        if self._lat_version != self.version:
            self._latencies = sorted(lat for _, lat, ok, _ in self.samples if ok and lat is not None)
            self._lat_version = self.version
        return self._latencies

    def figures(self, now: float) -> Figures:
        if self._cache_version != self.version:
            samples = self.samples
            n = len(samples)
            errors = sum(1 for s in samples if not s[2])
            lats = self.latencies()
            self._cache = {
                "samples": n,
                "latency_samples": len(lats),
                "probes": sum(1 for s in samples if s[3]),
                "median_s": median(lats) if lats else None,
                "p95_s": _p95(lats) if lats else None,
                "error_rate": (errors / n) if n else None,
                "errors": errors,
                "last_sample_age_s": None,
            }
            self._cache_version = self.version
        out = self._cache.copy()
        out["last_sample_age_s"] = (now - self.samples[-1][0]) if self.samples else None
        return out

    def last_real_sample(self) -> float | None:
        for t, _, _, probe in reversed(self.samples):
            if not probe:
                return t
        return None


class ProviderStats:
    """Samples per provider over a rolling window; one instance is shared by all profiles."""

    def __init__(self, settings: AdaptiveSettings, clock: Clock | None = None) -> None:
        self.settings = settings
        self._clock: Clock = clock or SystemClock()
        self._series: dict[str, _Series] = {}

    def record(self, provider: str, *, latency_s: float | None, ok: bool, probe: bool = False) -> None:
        if latency_s is not None and (not math.isfinite(latency_s) or latency_s < 0):
            latency_s = None
        series = self._series.get(provider)
        if series is None:
            series = self._series[provider] = _Series(max(1, self.settings.max_samples))
        now = self._clock.now()
        series.samples.append((now, latency_s, bool(ok), bool(probe)))
        series.version += 1
        series.prune(now - self.settings.window_s)

    def _fresh(self, provider: str) -> _Series | None:
        series = self._series.get(provider)
        if series is not None:
            series.prune(self._clock.now() - self.settings.window_s)
        return series

    def figures(self, provider: str) -> Figures:
        series = self._fresh(provider)
        if series is None:
            return _no_figures()
        return series.figures(self._clock.now())

    def all_figures(self) -> dict[str, Figures]:
        return {name: self.figures(name) for name in self._series}

    def latencies(self, provider: str) -> list[float]:
        """Sorted in-window latencies of successful samples (read-only view)."""
        series = self._fresh(provider)
        return series.latencies() if series is not None else []

    def last_real_sample_age(self, provider: str) -> float | None:
        series = self._fresh(provider)
        if series is None:
            return None
        t = series.last_real_sample()
        return None if t is None else self._clock.now() - t

    def forget(self, provider: str) -> None:
        self._series.pop(provider, None)


@dataclass
class _ChainState:
    chain: tuple[str, ...]
    effective: list[str]
    reasons: list[dict[str, object]]
    changed_at: float
    ineligible: frozenset[str]


class AdaptiveOrderer:
    """The effective order of one profile's chain. Holds debounce state, so one instance per profile."""

    def __init__(self, stats: ProviderStats, settings: AdaptiveSettings, clock: Clock | None = None) -> None:
        self.stats = stats
        self.settings = settings
        self._clock: Clock = clock or SystemClock()
        self._state: _ChainState | None = None

    def order(
        self, chain: list[str], *, ineligible: Collection[str] = ()
    ) -> tuple[list[str], list[dict[str, object]]]:
        """Return (effective order, reasons). `ineligible` names providers that cannot be used right now
        (breaker open, excluded by health, out of budget): a provider newly in that set lifts the debounce,
        because the order that was being held may now put a poor provider first."""
        chain = list(dict.fromkeys(chain))
        desired, reasons = self.desired(chain)
        now = self._clock.now()
        key = tuple(chain)
        in_chain = frozenset(p for p in ineligible if p in key)
        state = self._state
        if state is None or state.chain != key:
            state = self._state = _ChainState(key, list(chain), [], -math.inf, frozenset())
        newly_ineligible = in_chain - state.ineligible
        state.ineligible = in_chain

        if desired == state.effective:
            state.reasons = reasons
            return list(desired), [dict(r) for r in reasons]
        since = now - state.changed_at
        if since < self.settings.debounce_s and not newly_ineligible:
            held = [dict(r) for r in state.reasons]
            for p in desired:
                if desired.index(p) != state.effective.index(p):
                    held.append(
                        {
                            "provider": p,
                            "moved": "held",
                            "why": f"debounce: order changed {since:.1f}s ago (< {self.settings.debounce_s:g}s)",
                        }
                    )
            return list(state.effective), held
        state.effective = list(desired)
        state.reasons = reasons
        state.changed_at = now
        return list(desired), [dict(r) for r in reasons]

    def desired(self, chain: list[str]) -> tuple[list[str], list[dict[str, object]]]:
        """The order the current figures call for, without debounce."""
        s = self.settings
        lat = {p: self.stats.latencies(p) for p in chain}
        slow: dict[str, str] = {}
        for p in chain:
            mine = lat[p]
            if len(mine) < s.min_latency_samples:
                continue
            # Peers with too few samples are noise, not a baseline.
            pool = sorted(v for q in chain if q != p and len(lat[q]) >= s.min_latency_samples for v in lat[q])
            if not pool:
                continue
            mine_med = median(mine)
            peer_med = median(pool)
            if mine_med > 0 and mine_med >= s.latency_ratio * peer_med * (1 - _EPS):
                slow[p] = f"median {mine_med:.2f}s >= {s.latency_ratio:g}x peers {peer_med:.2f}s"

        reasons: list[dict[str, object]] = []
        moved: list[str] = []
        for p in chain:
            whys = []
            if p in slow:
                whys.append(slow[p])
            fig = self.stats.figures(p)
            n, errors = fig["samples"], fig["errors"]
            if n >= s.min_error_samples and n and errors / n >= s.error_rate * (1 - _EPS):
                whys.append(f"error rate {errors / n:.0%} >= {s.error_rate:.0%} ({errors}/{n})")
            if whys:
                moved.append(p)
                reasons.append({"provider": p, "moved": "back", "why": "; ".join(whys)})
        keep = [p for p in chain if p not in moved]
        return keep + moved, reasons


class ProbeScheduler:
    """Decides which providers need a light probe; the caller performs it and records the sample
    with `ProviderStats.record(..., probe=True)`."""

    def __init__(self, stats: ProviderStats, settings: AdaptiveSettings, clock: Clock | None = None) -> None:
        self.stats = stats
        self.settings = settings
        self._clock: Clock = clock or SystemClock()
        self._probes: dict[str, deque[float]] = {}

    def due(self, chain: list[str], paid: dict[str, bool]) -> list[str]:
        s = self.settings
        chain = list(dict.fromkeys(chain))
        if len(chain) < 2 or s.max_probes_per_minute <= 0:
            # A comparison needs peers; a single provider is measured by its own traffic.
            return []
        now = self._clock.now()
        if s.probe_only_when_active and not self._active(chain):
            return []
        out: list[str] = []
        for p in chain:
            if paid.get(p, False) and not s.probe_paid:
                continue
            age = self.stats.figures(p)["last_sample_age_s"]
            if age is not None and age < s.probe_interval_s:
                continue
            marks = self._marks(p, now)
            # The last mark also covers a probe still in flight, which has not produced a sample yet.
            if marks and now - marks[-1] < s.probe_interval_s:
                continue
            if len(marks) >= s.max_probes_per_minute:
                continue
            out.append(p)
        return out

    def mark_probed(self, provider: str) -> None:
        now = self._clock.now()
        self._marks(provider, now).append(now)

    def probes_last_minute(self, provider: str) -> int:
        return len(self._marks(provider, self._clock.now()))

    def _marks(self, provider: str, now: float) -> deque[float]:
        marks = self._probes.get(provider)
        if marks is None:
            marks = self._probes[provider] = deque()
        while marks and marks[0] <= now - 60.0:
            marks.popleft()
        return marks

    def _active(self, chain: Iterable[str]) -> bool:
        return any(self.stats.last_real_sample_age(p) is not None for p in chain)
