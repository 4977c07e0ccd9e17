"""Drift detection: a local model that was answering well and no longer does (empty answers, answers that
collapse in length, loop, stop calling tools, or hit the length limit), per provider and model.

A failed request is an error, not drift (issue 43, E6): an error sample is never part of a window. A server that
answers 500s is the breaker's and adaptive routing's to count (it errs; it does not answer worse), and would
otherwise be drawn as a drifting model, filed under whichever model served in the end.

Pure: samples in, transitions out; the clock is the caller's. Acting on a transition (warn, demote, reload)
is `quality/drift_actions.py`'s job.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_left, insort
from collections import OrderedDict, deque
from dataclasses import dataclass, field

# What an answer looked like is measured where answers are read (providers, translate), below this layer.
from ..translate.answer_stats import AnswerStats as AnswerStats  # re-exported for drift's users
from ..translate.answer_stats import DriftSample


@dataclass(frozen=True, slots=True)
class DriftSettings:
    window: int = 20  # answers kept per provider+model
    recent: int = 5  # the newest answers judged against the rest
    min_fill: int = 8  # no verdict before this many answers
    empty_rate: float = 0.6
    repetition_rate: float = 0.6
    repetition_level: float = 0.5  # an answer at least this repetitive counts as looping
    collapse_ratio: float = 0.2  # recent median length below this share of the earlier median
    collapse_min_chars: int = 200  # ... when the earlier median was at least this long
    tool_silence_min: int = 3  # tool-offering answers needed on each side
    tool_rate_before: float = 0.5
    length_stop_rate: float = 0.6


@dataclass(slots=True)
class Verdict:
    signals: dict[str, float] = field(default_factory=dict)  # fired signal -> its value
    score: float = 0.0  # 0..1: the strongest signal relative to its threshold (1 = at threshold or above)
    samples: int = 0

    @property
    def drifting(self) -> bool:
        return bool(self.signals)


class _Earlier:
    """What the verdict reads of the answers before the recent ones: the lengths of those with a length (sorted,
    for the median) and how often tools were offered and called. Kept up to date one answer at a time by a
    window as answers move through it, so a verdict costs O(recent), not O(window) (issue 36)."""

    __slots__ = ("lengths", "offered", "used")

    def __init__(self) -> None:
        self.lengths: list[int] = []
        self.offered = 0
        self.used = 0

    def add(self, s: DriftSample) -> None:
        if s.length:
            insort(self.lengths, s.length)
        if s.tools_offered:
            self.offered += 1
            self.used += s.tool_called

    def remove(self, s: DriftSample) -> None:
        if s.length:
            del self.lengths[bisect_left(self.lengths, s.length)]
        if s.tools_offered:
            self.offered -= 1
            self.used -= s.tool_called


def _median_of_sorted(xs: list[int]) -> float:
    """statistics.median of a list already sorted (the same value: the middle one, or the mean of the two), without
    its copy and sort on every answer."""
    n = len(xs)
    i = n // 2
    return xs[i] if n % 2 else (xs[i - 1] + xs[i]) / 2


def judge(samples: list[DriftSample], cfg: DriftSettings) -> Verdict:
    """The verdict over one window (oldest first); its error samples are left out (no drift)."""
    samples = [s for s in samples if not s.error]
    earlier = _Earlier()
    for s in samples[:max(0, len(samples) - cfg.recent)]:
        earlier.add(s)
    return _verdict(samples[-cfg.recent:] if len(samples) > cfg.recent else samples, earlier, len(samples), cfg)


def _verdict(recent_samples, earlier: _Earlier, n: int, cfg: DriftSettings) -> Verdict:
    """`recent_samples`: the newest `cfg.recent` answers of a window of `n`; `earlier`: the ones before them."""
    r = cfg.recent
    if n < max(cfg.min_fill, r + 1):
        return Verdict(samples=n)
    level = cfg.repetition_level
    empty = looping = length_stops = 0
    digests: list[int] = []
    ok_recent: list[int] = []
    offered_recent = used_recent = 0
    for s in recent_samples:
        length = s.length
        if length:
            digests.append(s.digest)
            ok_recent.append(length)
        elif not s.tool_called:
            empty += 1  # DriftSample.empty, inline
        if s.repetition >= level:
            looping += 1
        if s.length_stop:
            length_stops += 1
        if s.tools_offered:
            offered_recent += 1
            used_recent += s.tool_called
    # (signal, value, threshold), in the order the verdict lists them
    checks = [("empty", empty / r, cfg.empty_rate)]
    repeats = len(digests) - len(set(digests))
    checks.append(("repetition", max(looping / r, (repeats + 1) / r if repeats else 0.0), cfg.repetition_rate))
    checks.append(("length_stops", length_stops / r, cfg.length_stop_rate))
    # Empty answers are their own signal: only answers with a length count towards a collapse.
    ok_before = earlier.lengths  # kept sorted
    if len(ok_before) >= r and len(ok_recent) >= max(2, r // 2):
        base = _median_of_sorted(ok_before)
        if base >= cfg.collapse_min_chars:
            ok_recent.sort()
            ratio = _median_of_sorted(ok_recent) / base
            # value grows as the length shrinks: 1 - ratio, fired below the collapse ratio
            checks.append(("length_collapse", 1 - ratio, 1 - cfg.collapse_ratio))
    offered_before = earlier.offered
    if offered_before >= cfg.tool_silence_min and offered_recent >= cfg.tool_silence_min:
        if earlier.used / offered_before >= cfg.tool_rate_before:
            checks.append(("tool_silence", 1 - used_recent / offered_recent, 1.0))
    # Fired: at or over its threshold. Score: the strongest signal relative to its threshold, at most 1.
    fired: dict[str, float] = {}
    score: float | None = None
    for k, v, t in checks:
        if v >= t and v > 0:
            fired[k] = round(v, 3)
        if t > 0:
            x = min(1.0, v / t)
            if score is None or x > score:
                score = x
    if score is None:
        score = 0.0
    return Verdict(signals=fired, score=round(score, 3), samples=n)


# Model names come from clients (a pass-through provider serves whatever is asked for), so what is kept per
# name is bounded: so many models per provider, least recently seen forgotten first, and names this long at most.
MAX_MODELS = 64
MAX_MODEL_KEY = 256
_KEY_HEAD = MAX_MODEL_KEY - 17  # the rest: "~" and 16 hex digits of a digest of the whole name


def model_key(model: str) -> str:
    """The name a model's window is kept (and reported) under: itself, or a head plus a digest of the whole
    (so two long names that differ only at the end keep separate windows)."""
    if len(model) <= MAX_MODEL_KEY:
        return model
    digest = hashlib.blake2b(model.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
    return f"{model[:_KEY_HEAD]}~{digest}"


class _Track:
    """One provider+model's window, with the earlier part's figures kept as answers move through it."""

    __slots__ = ("window", "verdict", "earlier", "recent")

    def __init__(self, size: int) -> None:
        self.window: deque[DriftSample] = deque(maxlen=size)
        self.verdict: Verdict | None = None
        self.earlier = _Earlier()
        self.recent = 0  # the `recent` setting `earlier` was kept for (a reload of the settings may change it)

    def push(self, sample: DriftSample, cfg: DriftSettings) -> Verdict:
        """Append an answer and judge the window: O(recent) when the split is the one `earlier` was kept for."""
        w = self.window
        r = cfg.recent
        if r != self.recent:
            w.append(sample)
            self.recent = r
            self.earlier = earlier = _Earlier()
            for s in list(w)[:max(0, len(w) - r)]:
                earlier.add(s)
        else:
            earlier = self.earlier
            if len(w) == w.maxlen and len(w) > r:
                earlier.remove(w[0])  # the oldest answer leaves the window (it was an earlier one)
            w.append(sample)
            if len(w) > r:
                earlier.add(w[-r - 1])  # the answer that is no longer one of the recent ones
        recent = [w[i] for i in range(max(0, len(w) - r), len(w))]
        self.verdict = verdict = _verdict(recent, earlier, len(w), cfg)
        return verdict


class DriftDetector:
    """Rolling windows per (provider, model), at most MAX_MODELS per provider (LRU). `observe` returns
    "detected" / "recovered" on a change of verdict, else None."""

    def __init__(self, settings: DriftSettings | None = None) -> None:
        self.settings = settings or DriftSettings()
        self._tracks: dict[str, OrderedDict[str, _Track]] = {}

    def observe(self, provider: str, model: str, sample: DriftSample) -> str | None:
        return self.observe_judged(provider, model, sample)[0]

    def observe_judged(self, provider: str, model: str, sample: DriftSample) -> tuple[str | None, Verdict]:
        """`observe`, and the window's verdict after this answer (what `verdict` would look up again). An error
        sample changes nothing: errors are not drift."""
        if sample.error:
            return None, self.verdict(provider, model)
        key = model_key(model)
        tracks = self._tracks.get(provider)
        if tracks is None:
            tracks = self._tracks[provider] = OrderedDict()
        t = tracks.get(key)
        if t is None:
            if len(tracks) >= MAX_MODELS:
                tracks.popitem(last=False)
            t = tracks[key] = _Track(self.settings.window)
        else:
            tracks.move_to_end(key)
        before = t.verdict
        verdict = t.push(sample, self.settings)
        was = before is not None and before.drifting
        if verdict.drifting and not was:
            return "detected", verdict
        if was and not verdict.drifting:
            return "recovered", verdict
        return None, verdict

    def verdict(self, provider: str, model: str) -> Verdict:
        tracks = self._tracks.get(provider)
        t = tracks.get(model_key(model)) if tracks is not None else None
        return (t.verdict if t is not None else None) or Verdict()

    def models(self, provider: str) -> list[str]:
        """The model keys with a window for this provider, least recently seen first."""
        return list(self._tracks.get(provider, ()))

    def reset(self, provider: str, model: str | None = None) -> None:
        """Forget the window (after a reload the model starts afresh)."""
        if model is None:
            self._tracks.pop(provider, None)
        else:
            tracks = self._tracks.get(provider)
            if tracks is not None:
                tracks.pop(model_key(model), None)

    def snapshot(self, provider: str) -> dict:
        """The worst verdict over this provider's models, for `corectl status`."""
        mine = [(k, t.verdict) for k, t in self._tracks.get(provider, {}).items() if t.verdict is not None]
        if not mine:
            return {"score": 0.0, "signals": {}, "model": None, "samples": 0}
        model, v = max(mine, key=lambda kv: (kv[1].drifting, kv[1].score))
        return {"score": v.score, "signals": dict(v.signals), "model": model, "samples": v.samples}
