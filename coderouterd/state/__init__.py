"""State and history: typed events, the bus that carries them, SQLite store, journal, audit log."""

from coderouterd.state.audit import AuditLog, follow_audit, read_audit
from coderouterd.state.bus import EventBus
from coderouterd.state.cost import cache_savings_usd, cost_usd
from coderouterd.state.events import (
    BreakerTransition,
    BudgetBlocked,
    BudgetWarning,
    CacheBust,
    CacheIneffective,
    ConfigRejected,
    ConfigReloaded,
    DaemonLifecycle,
    Event,
    FallbackUsed,
    GuardFired,
    HealthTransition,
    PersistenceFault,
    ProcessEvent,
    ProfileSwitched,
    RecoveryProbe,
    RequestFinished,
    event_kinds,
)
from coderouterd.state.journal import export_rows
from coderouterd.state.journal_reader import JournalReader, JournalUnreadable, SqliteJournal, journal_rows
from coderouterd.state.replay import compare
from coderouterd.state.store import Store

__all__ = [
    "AuditLog",
    "BreakerTransition",
    "BudgetBlocked",
    "BudgetWarning",
    "CacheBust",
    "CacheIneffective",
    "ConfigRejected",
    "ConfigReloaded",
    "DaemonLifecycle",
    "Event",
    "EventBus",
    "FallbackUsed",
    "GuardFired",
    "HealthTransition",
    "JournalReader",
    "JournalUnreadable",
    "PersistenceFault",
    "ProcessEvent",
    "ProfileSwitched",
    "RecoveryProbe",
    "RequestFinished",
    "SqliteJournal",
    "Store",
    "cache_savings_usd",
    "compare",
    "cost_usd",
    "event_kinds",
    "export_rows",
    "follow_audit",
    "journal_rows",
    "read_audit",
]
