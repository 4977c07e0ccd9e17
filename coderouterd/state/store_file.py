"""The store's SQLite file: opened private (0600, no symlink at it or its -wal/-shm), checked (quick_check),
in WAL mode, migrated to the current schema; a corrupt one moved aside with its -wal/-shm, the newest
KEEP_CORRUPT_COPIES kept. `Store` (store.py) owns the connection and everything written through it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from coderouterd import private_fs
from coderouterd.state.journal import (
    JOURNAL_AFFINITY_DDL,
    JOURNAL_DDL,
    JOURNAL_KEY_DDL,
    JOURNAL_SETTLES_DDL,
    JOURNAL_USAGE_ESTIMATED_DDL,
)

# The store's logger: these lines were the store's before this module was split from it, and log readers
# (and the name in each line) still know them by it.
log = logging.getLogger("coderouterd.state.store")

# Each entry upgrades the schema by one version; never edit a shipped entry, append a new one.
MIGRATIONS: list[tuple[str, ...]] = [
    (
        "CREATE TABLE IF NOT EXISTS kv (namespace TEXT NOT NULL, key TEXT NOT NULL,"
        " value_json TEXT NOT NULL, updated_at REAL NOT NULL, PRIMARY KEY (namespace, key))",
        *JOURNAL_DDL,
    ),
    # The client's own conversation key (Codex's prompt_cache_key), to follow one session in the journal.
    ("ALTER TABLE journal ADD COLUMN session_key TEXT",),
    JOURNAL_AFFINITY_DDL,
    JOURNAL_SETTLES_DDL,
    JOURNAL_USAGE_ESTIMATED_DDL,
    JOURNAL_KEY_DDL,
]

KEEP_CORRUPT_COPIES = 3
# Truncate the -wal back to this after a checkpoint, so space a burst took is given back to a nearly full disk.
WAL_SIZE_LIMIT = 256 << 10
WAL_CHECKPOINT_PAGES = 32


class Corrupt(Exception):
    pass


def is_corruption(exc: BaseException) -> bool:
    msg = str(exc).lower()
    return isinstance(exc, Corrupt) or "not a database" in msg or "malformed" in msg


def migrate(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    current = row[0] or 0
    for version in range(current + 1, len(MIGRATIONS) + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in MIGRATIONS[version - 1]:
                conn.execute(stmt)
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version,))
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise


def open_checked(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    if path.is_dir():
        raise sqlite3.OperationalError("path is a directory")
    prepare_files(path)
    conn = sqlite3.connect(
        str(path), timeout=busy_timeout_ms / 1000.0, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        result = conn.execute("PRAGMA quick_check").fetchone()
        if not result or result[0] != "ok":
            raise Corrupt(f"quick_check: {result[0] if result else 'no result'}")
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode: a power cut may lose the last commits, but never corrupts, and a
        # process kill loses nothing that was committed.
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_SIZE_LIMIT}")
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
        migrate(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def prepare_files(path: Path) -> None:
    """SQLite follows symlinks and creates files with the umask: refuse a link at the database or its
    -wal/-shm, and create the database 0600 ourselves (SQLite gives -wal and -shm the database's mode)."""
    for suffix in ("-wal", "-shm"):
        private_fs.check_not_link(path.with_name(path.name + suffix))
    os.close(private_fs.open_private(path, os.O_RDWR | os.O_CREAT))


def move_aside(path: Path) -> Path | None:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    for n in itertools.count(1):
        target = path.with_name(f"{path.name}.corrupt-{stamp}" + (f"-{n}" if n > 1 else ""))
        if not target.exists():
            break
    try:
        path.rename(target)
    except OSError as exc:
        log.error("cannot move corrupt database %s aside: %s", path, exc)
        return None
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            try:
                side.rename(target.with_name(target.name + suffix))
            except OSError:
                # A stale -wal would be replayed into the fresh database; better gone.
                side.unlink(missing_ok=True)
    prune_corrupt_copies(path)
    return target


def prune_corrupt_copies(path: Path) -> None:
    """Keep the newest KEEP_CORRUPT_COPIES moved-aside databases (with their -wal/-shm): a disk that keeps
    corrupting the file must not fill up with copies."""
    groups: dict[str, list[Path]] = {}
    for p in path.parent.glob(f"{path.name}.corrupt-*"):
        base = p.name[:-4] if p.name.endswith(("-wal", "-shm")) else p.name
        groups.setdefault(base, []).append(p)

    def age_key(base: str) -> tuple[str, int]:
        stamp, _, n = base.rpartition(".corrupt-")[2].partition("-")
        return stamp, int(n) if n.isdigit() else 1

    for base in sorted(groups, key=age_key)[:-KEEP_CORRUPT_COPIES]:
        for p in groups[base]:
            with contextlib.suppress(OSError):
                p.unlink()
