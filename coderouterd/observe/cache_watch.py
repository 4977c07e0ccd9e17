"""A prompt cache that is written and never read costs the write premium for nothing (Claude Code's per-turn
attribution header does that to every request): after an unbroken streak of writes on one route, say so once."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..state import CacheIneffective

log = logging.getLogger("coderouterd")

# A route that wrote the cache this many times in a row without a single read gets one warning.
CACHE_WRITE_STREAK = 10


class CacheWatch:
    def __init__(self, publish: Callable[[object], None]) -> None:
        self._publish = publish
        # (provider, profile) -> cache writes in a row with no read; -1 once warned
        self._streak: dict[tuple[str, str], int] = {}
        self._extra: dict[tuple[str, str], float] = {}

    def observe(self, provider: str, profile: str, usage: dict, cost) -> None:
        """One served request's usage; `cost` is the provider's declared prices."""
        if not (usage.get("cache_creation_input_tokens") or usage.get("cache_read_input_tokens")):
            return
        key = (provider, profile)
        streak = self._streak.get(key, 0)
        if usage.get("cache_read_input_tokens"):
            if streak >= 0:
                self._streak[key] = 0
                self._extra[key] = 0.0
            return
        if streak < 0:
            return
        # What the writes cost beyond plain input: the premium paid for a cache that is never used.
        premium = max(0.0, cost.cache_write - cost.input) * usage["cache_creation_input_tokens"] / 1e6
        self._extra[key] = self._extra.get(key, 0.0) + premium
        streak += 1
        if streak >= CACHE_WRITE_STREAK:
            self._publish(CacheIneffective(provider=provider, profile=profile, writes=streak,
                                           extra_cost_usd=round(self._extra[key], 6)))
            log.warning("prompt cache on %s (profile %s) was written %d times in a row and never read; "
                        "for Claude Code set CLAUDE_CODE_ATTRIBUTION_HEADER=0", provider, profile, streak)
            streak = -1
        self._streak[key] = streak
