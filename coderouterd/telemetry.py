"""Where the daemon's events go: the bus, the SQLite store (KV + journal), the audit log.

The request path only builds one RequestFinished event and publishes it (an O(1) queue append); every write
happens in the bus's writer thread. Persistent router state (breakers, health) is mirrored into the store as
it changes, so a kill -9 loses at most the store's flush interval."""

from __future__ import annotations

import logging
from pathlib import Path

from .ids import MAX_STORED_CHARS, clip
from .state import (
    AuditLog,
    BreakerTransition,
    CacheIneffective,
    EventBus,
    FallbackUsed,
    HealthTransition,
    RequestFinished,
    Store,
    cost_usd,
)
from .state.events import ToolRepaired, moved_past
from .state.memory import MemoryStore

log = logging.getLogger("coderouterd")

NS_BREAKERS = "breakers"
NS_HEALTH = "health"
NS_DAEMON = "daemon"
NS_AFFINITY = "affinity"


# A route that wrote the cache this many times in a row without a single read gets one warning.
CACHE_WRITE_STREAK = 10


class Telemetry:
    """The bus always runs (metrics feed on it); the store, journal and audit log only with [state] enabled."""

    def __init__(self, state_dir: Path, config, *, unusable: str | None = None) -> None:
        self.state_dir = state_dir
        self.bus = EventBus()
        st = config.state
        # An unusable state directory (serve.py found it so) means memory-only state, reported in status.
        self.unusable = unusable
        self.enabled = st.enabled and unusable is None
        self.store = Store(state_dir / "state.db", bus=self.bus, flush_interval_s=st.flush_interval_s,
                           journal_retention_days=st.journal_retention_days) if st.enabled else MemoryStore()
        self.audit: AuditLog | None = None
        self._config = config
        # (provider, profile) -> cache writes in a row with no read; -1 once warned
        self._cache_streak: dict[tuple[str, str], int] = {}
        self._cache_extra: dict[tuple[str, str], float] = {}

    def use_memory_only(self, reason: str) -> None:
        """The state directory is unusable (serve.py found it so): no SQLite store, journal or audit; status
        reports `reason`. Called before start()."""
        self.unusable = reason
        self.enabled = False
        self.store = MemoryStore()

    def start(self) -> None:
        if not self.enabled:
            self.bus.start()
            return
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            log.error("state directory %s is unusable: %s (serving without persistence)", self.state_dir, e)
        self.store.open()
        if not self.store.healthy:
            log.error("state store unusable: %s (serving on, retrying)", self.store.problem)
        st = self._config.state
        self.audit = AuditLog(self.state_dir, max_bytes=int(st.audit_max_mb * 1024 * 1024), keep=st.audit_keep,
                              bus=self.bus)
        self.bus.subscribe(self.store.journal_sink(), kinds={RequestFinished.kind})
        self.bus.subscribe(self.audit.sink)
        self.bus.start()

    def stop(self) -> None:
        self.bus.stop()
        if self.enabled:
            self.store.close()
        if self.audit is not None:
            self.audit.close()

    def publish(self, event) -> None:
        self.bus.publish(event)

    # -- router state that must survive restarts -------------------------------------------------------------

    def breaker_moved(self, name: str, snapshot: dict, old, new, reason: str) -> None:
        self.store.set(NS_BREAKERS, name, snapshot)
        self.bus.publish(BreakerTransition(provider=name, old=str(old), new=str(new), reason=reason))

    def health_moved(self, provider: str, old: str, new: str, reason: str) -> None:
        self.store.set(NS_HEALTH, provider, new)
        self.bus.publish(HealthTransition(provider=provider, old=old, new=new, reason=reason))

    def restore_routing(self, state, managed: set[str] | frozenset = frozenset()) -> None:
        """Load the breakers and health a previous process persisted into the routing state. Not the health of
        `managed` providers: theirs restarts from their own process's readiness (out of routing until it is
        ready, then probed at once); a saved UNHEALTHY from before a crash would otherwise outlive the restart
        until the next probe tick."""
        health = {}
        for name, value in self.store.items(NS_HEALTH).items():
            if name in managed:
                self.store.delete(NS_HEALTH, name)
            else:
                health[name] = value
        for name in state.restore(self.store.items(NS_BREAKERS), health):
            self.store.delete(NS_BREAKERS, name)

    def wire_affinity(self, affinity) -> None:
        """Prefix index restored from the store; its changes and cache-bust events go back through us."""
        affinity.restore(self.store.items(NS_AFFINITY))
        affinity.persist = lambda provider, snap: self.store.set(NS_AFFINITY, provider, snap)
        affinity.publish = self.bus.publish

    # -- requests -------------------------------------------------------------------------------------------

    def request_finished(self, ex, latency_s: float) -> None:
        u = ex.usage or {}
        provider = ex.served_by
        cost = 0.0
        if provider is not None:
            cfg = ex.runtime.providers[provider].cfg
            if cfg.cost.input or cfg.cost.output or cfg.cost.cache_read or cfg.cost.cache_write:
                cost = cost_usd(u, cfg.cost)
        ex.cost_usd = cost
        fallback_count = len(moved_past(ex.attempts, provider is not None))
        attempts = _bounded(ex.skips_and_attempts())
        self.bus.publish(RequestFinished(
            request_id=ex.req.request_id, ingress=ex.req.ingress, profile=ex.profile_name, provider=provider,
            attempts=attempts, model_requested=clip(ex.req.model), model_used=clip(ex.model_used or ""),
            status=ex.status,
            error_class=ex.error_class, latency_ms=round(latency_s * 1000, 3),
            ttfb_ms=round(ex.ttfb * 1000, 3) if ex.ttfb is not None else None,
            input_tokens=u.get("input_tokens") or 0, output_tokens=u.get("output_tokens") or 0,
            cache_read_tokens=u.get("cache_read_input_tokens") or 0,
            cache_write_tokens=u.get("cache_creation_input_tokens") or 0,
            cost_usd=cost, streaming=ex.req.stream, fallback_count=fallback_count, race_outcome=ex.race_outcome,
            overhead_ms=round(max(0.0, latency_s - ex.upstream_wait_s) * 1000, 3),
            session_key=_clip_opt(ex.req.session_key()),
            **_affinity_fields(ex.affinity),
            tool_repair=ex.repair_applied,
        ))
        if ex.tools_repaired and provider is not None:
            self.bus.publish(ToolRepaired(request_id=ex.req.request_id, provider=provider,
                                          model=ex.model_used or "", calls=ex.tools_repaired,
                                          formats=sorted(set(ex.repair_formats)), streaming=ex.req.stream))
        if fallback_count:
            self.bus.publish(FallbackUsed(request_id=ex.req.request_id, profile=ex.profile_name, chain=attempts))
        if provider is not None and (u.get("cache_creation_input_tokens") or u.get("cache_read_input_tokens")):
            self._watch_cache(provider, ex.profile_name, u, ex.runtime.providers[provider].cfg.cost)

    def _watch_cache(self, provider: str, profile: str, usage: dict, cost) -> None:
        key = (provider, profile)
        streak = self._cache_streak.get(key, 0)
        if usage.get("cache_read_input_tokens"):
            if streak >= 0:
                self._cache_streak[key] = 0
                self._cache_extra[key] = 0.0
            return
        if streak < 0:
            return
        # What the writes cost beyond plain input: the premium paid for a cache that is never used.
        premium = max(0.0, cost.cache_write - cost.input) * usage["cache_creation_input_tokens"] / 1e6
        self._cache_extra[key] = self._cache_extra.get(key, 0.0) + premium
        streak += 1
        if streak >= CACHE_WRITE_STREAK:
            self.bus.publish(CacheIneffective(provider=provider, profile=profile, writes=streak,
                                              extra_cost_usd=round(self._cache_extra[key], 6)))
            log.warning("prompt cache on %s (profile %s) was written %d times in a row and never read; "
                        "for Claude Code set CLAUDE_CODE_ATTRIBUTION_HEADER=0", provider, profile, streak)
            streak = -1
        self._cache_streak[key] = streak


def _affinity_fields(ticket) -> dict:
    if ticket is None:
        return {}
    return {"session": ticket.session.hashed, "lane": ticket.lane_label, "slot": ticket.slot,
            "predicted_tokens": ticket.predicted_tokens,
            "cache_bust": ticket.bust.segment if ticket.bust is not None else None}


def _clip_opt(s: str | None) -> str | None:
    return clip(s) if isinstance(s, str) else s


def _bounded(attempts: list[dict]) -> list[dict]:
    """Attempt records as stored: an upstream's error message can echo the client's input (a 3 MB model name),
    so every string in them is cut like the other client strings."""
    for a in attempts:
        for k, v in a.items():
            if isinstance(v, str) and len(v) > MAX_STORED_CHARS:
                a[k] = clip(v)
    return attempts
