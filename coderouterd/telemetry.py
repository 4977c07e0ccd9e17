"""Where the daemon's events go: the bus, the SQLite store (KV + journal), the audit log.

The request path only builds one RequestFinished event and publishes it (an O(1) queue append); every write
happens in the bus's writer thread. What each part persists is theirs to say (persisted.py for routing,
affinity and the active profile; observe/ for the request record)."""

from __future__ import annotations

import logging
from pathlib import Path

from .state import AuditLog, EventBus, RequestFinished, Store
from .state.memory import MemoryStore

log = logging.getLogger("coderouterd")


class Telemetry:
    """The bus always runs (metrics feed on it); the store, journal and audit log only with [state] enabled
    and a usable state directory. `unusable` (serve.py found the directory so) means memory-only state,
    reported in status."""

    def __init__(self, state_dir: Path, config, *, unusable: str | None = None) -> None:
        self.state_dir = state_dir
        self.bus = EventBus()
        st = config.state
        self.unusable = unusable
        self.enabled = st.enabled and unusable is None
        self.store = Store(state_dir / "state.db", bus=self.bus, flush_interval_s=st.flush_interval_s,
                           journal_retention_days=st.journal_retention_days) if self.enabled else MemoryStore()
        self.audit: AuditLog | None = None
        # The local journal a shared backend ships from (None: no local journal to ship).
        self.journal_path: Path | None = state_dir / "state.db" if self.enabled else None
        self._config = config

    def start(self) -> None:
        store = self.store
        if not isinstance(store, Store):  # not enabled: state in memory only
            self.bus.start()
            return
        try:
            self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            log.error("state directory %s is unusable: %s (serving without persistence)", self.state_dir, e)
        store.open()
        if not store.healthy:
            log.error("state store unusable: %s (serving on, retrying)", store.problem)
        st = self._config.state
        self.audit = AuditLog(self.state_dir, max_bytes=int(st.audit_max_mb * 1024 * 1024), keep=st.audit_keep,
                              bus=self.bus)
        self.bus.subscribe(store.journal_sink(), kinds={RequestFinished.kind})
        self.bus.subscribe(self.audit.sink)
        self.bus.start()

    def stop(self) -> None:
        self.bus.stop()
        if isinstance(self.store, Store):  # enabled
            self.store.close()
        if self.audit is not None:
            self.audit.close()

    def publish(self, event) -> None:
        self.bus.publish(event)
