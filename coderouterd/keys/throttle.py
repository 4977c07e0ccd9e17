"""Repeated authentication failures from one source: slowed down within a bound, recorded once per episode.

Each source address has a failure score that halves every HALF_LIFE_S. Past FREE failures, each refusal is
answered after a delay that doubles per further failure, capped at MAX_DELAY_S: a script retrying with a wrong
key slows to one answer every couple of seconds per connection, while nobody is ever locked out (a correct key
is checked and served at once, whatever its source's score: the delay applies to refusals only, and other
sources are untouched). An episode starts when a source first crosses FREE and ends once its score has decayed
below 1; its start writes one audit line.

The tables are bounded (MAX_SOURCES): past that, sources whose score has decayed are dropped, then the oldest.
An IPv6 source counts as its /64 (one host usually holds a whole /64, and could otherwise change address per
guess). Pure and clock-injected."""

from __future__ import annotations

import time
from collections.abc import Callable

FREE = 5.0  # failures allowed before any delay (a user fixing a typo in their config)
BASE_DELAY_S = 0.1
MAX_DELAY_S = 2.0
HALF_LIFE_S = 60.0
MAX_SOURCES = 4096
REFUSAL_EVERY_S = 60.0  # one audit line per (reason, key, source) per this long
REFUSAL_LINES_PER_MINUTE = 60  # and at most this many refusal lines a minute in all (many sources at once)


class FailureThrottle:
    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._scores: dict[str, tuple[float, float, bool]] = {}  # source -> (score, when, in an episode)

    def _decayed(self, source: str, now: float) -> tuple[float, bool]:
        entry = self._scores.get(source)
        if entry is None:
            return 0.0, False
        score, when, episode = entry
        score *= 0.5 ** (max(now - when, 0.0) / HALF_LIFE_S)
        if score < 1.0:
            episode = False
        return score, episode

    def failed(self, source: str) -> tuple[float, int | None]:
        """A refusal from `source`: (seconds to wait before answering it, the failure count when this starts
        an episode, else None)."""
        source = source_key(source)
        now = self._clock()
        score, episode = self._decayed(source, now)
        score += 1.0
        started = None
        if score > FREE and not episode:
            episode = True
            started = int(round(score))
        self._scores.pop(source, None)  # re-inserted last: the dict's order is least recently failed first
        self._scores[source] = (score, now, episode)
        if len(self._scores) > MAX_SOURCES:
            self._prune(now)
        return self.delay_for(score), started

    @staticmethod
    def delay_for(score: float) -> float:
        if score <= FREE:
            return 0.0
        return min(MAX_DELAY_S, BASE_DELAY_S * 2.0 ** (score - FREE - 1.0))

    def delay(self, source: str) -> float:
        return self.delay_for(self._decayed(source_key(source), self._clock())[0])

    def _prune(self, now: float) -> None:
        for source in [s for s in self._scores if self._decayed(s, now)[0] < 1.0]:
            del self._scores[source]
        while len(self._scores) > MAX_SOURCES:
            del self._scores[next(iter(self._scores))]

    def __len__(self) -> int:
        return len(self._scores)


def source_key(source: str) -> str:
    """What a source is counted as: its address, or its /64 for IPv6."""
    if ":" not in source:
        return source
    import ipaddress

    try:
        return str(ipaddress.IPv6Network(f"{source}/64", strict=False))
    except ValueError:
        return source


class RefusalLog:
    """Which refusals get an audit line: the first of each (reason, key, source) in REFUSAL_EVERY_S, and no more
    than REFUSAL_LINES_PER_MINUTE in all; the ones in between are counted and reported on the next line."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._last: dict[tuple[str, str, str], tuple[float, int]] = {}  # -> (when recorded, folded since)
        self._minute = (float("-inf"), 0)  # (start of the current minute, lines written in it)
        self.folded_over_cap = 0  # refusals past the overall cap, reported on the next line written

    def record(self, reason: str, key: str | None, source: str) -> int | None:
        """None: fold this one into the next line. Else: record it, with this many folded before it."""
        now = self._clock()
        k = (reason, key or "", source_key(source))
        last = self._last.get(k)
        if last is not None and now - last[0] < REFUSAL_EVERY_S:
            self._last[k] = (last[0], last[1] + 1)
            return None
        start, lines = self._minute
        if now - start >= 60.0:
            start, lines = now, 0
        if lines >= REFUSAL_LINES_PER_MINUTE:
            self._minute = (start, lines)
            self.folded_over_cap += 1
            return None
        self._minute = (start, lines + 1)
        self._last.pop(k, None)
        self._last[k] = (now, 0)
        if len(self._last) > MAX_SOURCES:
            for old in [x for x, (when, _n) in self._last.items() if now - when >= REFUSAL_EVERY_S]:
                del self._last[old]
            while len(self._last) > MAX_SOURCES:
                del self._last[next(iter(self._last))]
        over, self.folded_over_cap = self.folded_over_cap, 0
        return (last[1] if last is not None else 0) + over
