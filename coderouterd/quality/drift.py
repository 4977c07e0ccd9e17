"""Drift detection: a local model that was answering well and no longer does (empty answers, answers that
collapse in length, loop, stop calling tools, hit the length limit, or fail), per provider and model.

Pure: samples in, transitions out; the clock is the caller's. Acting on a transition (warn, demote, reload)
is `quality/drift_actions.py`'s job.
"""

from __future__ import annotations

import hashlib
import statistics
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
    error_rate: float = 0.6


@dataclass(slots=True)
class Verdict:
    signals: dict[str, float] = field(default_factory=dict)  # fired signal -> its value
    score: float = 0.0  # 0..1: the strongest signal relative to its threshold (1 = at threshold or above)
    samples: int = 0

    @property
    def drifting(self) -> bool:
        return bool(self.signals)


def judge(samples: list[DriftSample], cfg: DriftSettings) -> Verdict:
    """One pass over the window (this runs after every answer of a local model)."""
    n = len(samples)
    if n < max(cfg.min_fill, cfg.recent + 1):
        return Verdict(samples=n)
    split = n - cfg.recent
    empty = looping = length_stops = errors = 0
    digests: list[int] = []
    ok_before: list[int] = []
    ok_recent: list[int] = []
    offered_before = used_before = offered_recent = used_recent = 0
    for i, s in enumerate(samples):
        recent = i >= split
        if s.error:
            if recent:
                errors += 1
            continue
        if recent:
            if s.empty:
                empty += 1
            if s.repetition >= cfg.repetition_level:
                looping += 1
            if s.length_stop:
                length_stops += 1
            if s.length:
                digests.append(s.digest)
                ok_recent.append(s.length)
            if s.tools_offered:
                offered_recent += 1
                used_recent += s.tool_called
        else:
            if s.length:
                ok_before.append(s.length)
            if s.tools_offered:
                offered_before += 1
                used_before += s.tool_called
    r = cfg.recent
    values: dict[str, tuple[float, float]] = {}  # signal -> (value, threshold)
    values["empty"] = (empty / r, cfg.empty_rate)
    repeats = len(digests) - len(set(digests))
    values["repetition"] = (max(looping / r, (repeats + 1) / r if repeats else 0.0), cfg.repetition_rate)
    values["length_stops"] = (length_stops / r, cfg.length_stop_rate)
    values["errors"] = (errors / r, cfg.error_rate)
    # Empty answers are their own signal: only answers with a length count towards a collapse.
    if len(ok_before) >= r and len(ok_recent) >= max(2, r // 2):
        base = statistics.median(ok_before)
        if base >= cfg.collapse_min_chars:
            ratio = statistics.median(ok_recent) / base
            # value grows as the length shrinks: 1 - ratio, fired below the collapse ratio
            values["length_collapse"] = (1 - ratio, 1 - cfg.collapse_ratio)
    if offered_before >= cfg.tool_silence_min and offered_recent >= cfg.tool_silence_min:
        if used_before / offered_before >= cfg.tool_rate_before:
            values["tool_silence"] = (1 - used_recent / offered_recent, 1.0)
    fired = {k: round(v, 3) for k, (v, t) in values.items() if v >= t and v > 0}
    score = max((min(1.0, v / t) for v, t in values.values() if t > 0), default=0.0)
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
    __slots__ = ("window", "verdict")

    def __init__(self, size: int) -> None:
        self.window: deque[DriftSample] = deque(maxlen=size)
        self.verdict: Verdict | None = None


class DriftDetector:
    """Rolling windows per (provider, model), at most MAX_MODELS per provider (LRU). `observe` returns
    "detected" / "recovered" on a change of verdict, else None."""

    def __init__(self, settings: DriftSettings | None = None) -> None:
        self.settings = settings or DriftSettings()
        self._tracks: dict[str, OrderedDict[str, _Track]] = {}

    def observe(self, provider: str, model: str, sample: DriftSample) -> str | None:
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
        t.window.append(sample)
        before = t.verdict
        verdict = t.verdict = judge(list(t.window), self.settings)
        was = before is not None and before.drifting
        if verdict.drifting and not was:
            return "detected"
        if was and not verdict.drifting:
            return "recovered"
        return None

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
