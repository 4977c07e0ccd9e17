import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from coderouterd.state.bus import EventBus
from coderouterd.state.events import PersistenceFault
from coderouterd.state.store import Store

REPO = Path(__file__).resolve().parents[2]


def _collecting_bus():
    """A bus that is never started: flush() hands events over inline."""
    bus = EventBus()
    seen = []
    bus.subscribe(seen.extend)
    return bus, seen


def _faults(bus, seen):
    bus.flush()
    return [e for e in seen if isinstance(e, PersistenceFault)]


def _db_kv(path):
    conn = sqlite3.connect(path)
    try:
        return {(ns, k): v for ns, k, v in conn.execute("SELECT namespace, key, value_json FROM kv")}
    finally:
        conn.close()


def _wait_for(pred, timeout=3.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def test_values_survive_reopen_and_deletes_persist(tmp_path):
    path = tmp_path / "state" / "state.db"
    store = Store(path, flush_interval_s=60)
    store.open()
    assert store.healthy and store.problem is None
    store.set("budget", "anthropic", {"spent_usd": 1.25, "month": "2025-05"})
    store.set("profile", "active", "coding")
    store.set("health", "ollama", "up")
    store.delete("health", "ollama")
    assert store.get("budget", "anthropic") == {"spent_usd": 1.25, "month": "2025-05"}
    assert store.get("health", "ollama", "gone") == "gone"
    store.close()

    again = Store(path)
    again.open()
    assert again.get("budget", "anthropic")["spent_usd"] == 1.25
    assert again.items("profile") == {"active": "coding"}
    assert again.items("health") == {}
    again.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] >= 1
    conn.close()


def test_many_sets_become_one_transaction(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, flush_interval_s=60)
    store.open()
    commits = []
    store._conn.set_trace_callback(lambda sql: commits.append(sql) if sql.strip().upper() == "COMMIT" else None)
    for i in range(1000):
        store.set("counters", f"k{i % 100}", i)
    assert _db_kv(path) == {}  # nothing reaches disk before the flush
    store.flush()
    assert len(commits) == 1
    kv = _db_kv(path)
    assert len(kv) == 100 and kv[("counters", "k99")] == "999"
    store.close()


def test_background_thread_flushes_within_interval(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, flush_interval_s=0.02)
    store.open()
    store.set("exclusions", "lmstudio", {"until": 123})
    assert _wait_for(lambda: ("exclusions", "lmstudio") in _db_kv(path))
    store.close()


CHILD = """
import sys, time
from pathlib import Path
from coderouterd.state.store import Store
store = Store(Path(sys.argv[1]), flush_interval_s=0.01)
store.open()
store.set("proc", "pid", 4242)
store.flush()
print("ready", flush=True)
i = 0
while True:
    i += 1
    store.set("counter", "n", i)
    store.set("counter", f"k{i % 50}", "x" * 200)
    time.sleep(0.0005)
"""


def test_kill_9_keeps_everything_flushed(tmp_path):
    path = tmp_path / "state.db"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        seen = {}

        def counter_moved():
            conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
            try:
                row = conn.execute("SELECT value_json FROM kv WHERE namespace='counter' AND key='n'").fetchone()
            finally:
                conn.close()
            seen["n"] = int(row[0]) if row else 0
            return seen["n"] > 20

        assert _wait_for(counter_moved, timeout=5)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(5)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        child.stdout.close()

    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store = Store(path)
    store.open()
    assert store.healthy
    assert store.get("proc", "pid") == 4242
    assert store.get("counter", "n") >= seen["n"]
    store.close()


def test_unusable_directory_keeps_memory_state_and_reports_once(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    bus, seen = _collecting_bus()
    store = Store(blocker / "state.db", flush_interval_s=60, bus=bus)
    store.open()
    assert not store.healthy
    assert "state directory" in store.problem
    store.set("profile", "active", "coding")
    store.flush()
    store.flush()
    assert store.get("profile", "active") == "coding"
    faults = _faults(bus, seen)
    assert len(faults) == 1 and faults[0].component == "store" and not faults[0].recovered

    # The directory becomes usable: the next retry persists what was kept in memory.
    blocker.unlink()
    store.flush()
    assert store.healthy and store.problem is None
    store.close()
    assert _db_kv(blocker / "state.db")[("profile", "active")] == '"coding"'
    faults = _faults(bus, seen)
    assert [f.recovered for f in faults] == [False, True]


def test_db_path_that_is_a_directory(tmp_path):
    path = tmp_path / "state.db"
    path.mkdir()
    store = Store(path, flush_interval_s=60)
    store.open()
    assert store.healthy is False and "directory" in store.problem
    store.set("a", "b", 1)
    store.flush()
    assert store.get("a", "b") == 1
    store.close()
    assert path.is_dir()


def test_corrupt_file_is_moved_aside_never_deleted(tmp_path):
    path = tmp_path / "state.db"
    garbage = b"this is not sqlite at all " * 200
    path.write_bytes(garbage)
    bus, seen = _collecting_bus()
    store = Store(path, flush_interval_s=60, bus=bus)
    store.open()
    assert store.healthy
    aside = list(tmp_path.glob("state.db.corrupt-*"))
    assert len(aside) == 1 and aside[0].read_bytes() == garbage
    store.set("k", "v", [1, 2])
    store.close()
    assert _db_kv(path) == {("k", "v"): "[1,2]"}
    faults = _faults(bus, seen)
    assert len(faults) == 1 and "corrupt" in faults[0].problem


def test_locked_database_goes_unhealthy_then_recovers(tmp_path):
    path = tmp_path / "state.db"
    bus, seen = _collecting_bus()
    store = Store(path, flush_interval_s=60, bus=bus, busy_timeout_ms=20)
    store.open()
    store.set("budget", "x", 1)
    store.flush()

    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")
    store.set("budget", "x", 2)
    store.flush()
    assert not store.healthy and "locked" in store.problem
    assert store.get("budget", "x") == 2
    other.execute("COMMIT")
    other.close()

    store.flush()
    assert store.healthy
    assert _db_kv(path)[("budget", "x")] == "2"
    store.close()
    assert [f.recovered for f in _faults(bus, seen)] == [False, True]


def test_locked_at_open_merges_disk_and_memory_later(tmp_path):
    path = tmp_path / "state.db"
    first = Store(path)
    first.open()
    first.set("ns", "a", 1)
    first.set("ns", "b", 2)
    first.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=DELETE")  # so an exclusive lock also shuts out readers
    conn.execute("BEGIN EXCLUSIVE")

    store = Store(path, flush_interval_s=60, busy_timeout_ms=20)
    store.open()
    assert not store.healthy and "locked" in store.problem
    assert store.get("ns", "a") is None
    store.set("ns", "b", 3)
    conn.execute("COMMIT")
    conn.close()

    store.flush()
    assert store.healthy
    assert store.items("ns") == {"a": 1, "b": 3}  # memory wins over what was on disk
    store.close()
    assert _db_kv(path)[("ns", "b")] == "3"


def test_disk_full_is_survived(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path, flush_interval_s=60)
    store.open()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    store.set("big", "blob", "x" * 200_000)
    store.flush()
    assert not store.healthy and "full" in store.problem
    store._conn.execute("PRAGMA max_page_count = 1000000")
    store.flush()
    assert store.healthy
    store.close()
    assert len(_db_kv(path)[("big", "blob")]) == 200_002


def test_background_retries_wait_for_retry_interval(tmp_path):
    now = [1000.0]
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    store = Store(blocker / "state.db", flush_interval_s=0.005, retry_s=5.0, clock=lambda: now[0])
    store.open()
    store.set("a", "b", 1)
    assert not store.healthy
    blocker.unlink()
    time.sleep(0.1)  # many background ticks, all before the retry is due
    assert not store.healthy
    now[0] += 5.0
    assert _wait_for(lambda: store.healthy)
    assert _wait_for(lambda: ("a", "b") in _db_kv(blocker / "state.db"))
    store.close()


def test_bad_values_never_raise(tmp_path):
    store = Store(tmp_path / "s.db", flush_interval_s=60)
    store.open()
    store.set("x", "y", object())
    assert store.get("x", "y") is None
    store.flush()
    assert store.healthy
    store.close()


def test_damaged_pages_fail_quick_check_and_are_moved_aside(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    store.open()
    for i in range(3000):
        store.set("ns", f"k{i}", "v" * 100)
    store.close()
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    with open(path, "r+b") as f:
        f.seek(4096 * 3)
        f.write(b"\xa5" * 4096 * 2)

    store = Store(path, flush_interval_s=60)
    store.open()
    assert store.healthy
    assert len(list(tmp_path.glob("state.db.corrupt-*"))) == 1
    store.set("ns", "fresh", True)
    store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    assert _db_kv(path) == {("ns", "fresh"): "true"}


def test_disk_full_status_changes_only_on_real_transitions(tmp_path):
    """Small journal rows still fit while a big value does not: that is still one outage, not a flap."""
    from coderouterd.state.events import RequestFinished

    now = [1000.0]
    path = tmp_path / "state.db"
    bus, seen = _collecting_bus()
    store = Store(path, flush_interval_s=60, bus=bus, retry_s=5.0, clock=lambda: now[0])
    store.open()
    sink = store.journal_sink()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages + 3}")
    store.set("big", "blob", "x" * 200_000)
    for i in range(6):
        store.flush()
        assert not store.healthy
        now[0] += 5.0
        sink([RequestFinished(request_id=f"r{i}", ingress="anthropic", profile="p", provider="x", attempts=[],
                              model_requested="m", model_used="m", status=200)])
        assert not store.healthy, f"flapped to healthy at round {i}"
    store._conn.execute("PRAGMA max_page_count = 1000000")
    now[0] += 5.0
    store.flush()
    assert store.healthy
    store.close()
    assert [f.recovered for f in _faults(bus, seen)] == [False, True]


def test_only_the_newest_three_corrupt_copies_are_kept(tmp_path):
    from coderouterd.state.store_file import KEEP_CORRUPT_COPIES

    path = tmp_path / "state.db"
    old = ["20260101T000000Z", "20260102T000000Z", "20260103T000000Z", "20260104T000000Z"]
    for stamp in old:
        (tmp_path / f"state.db.corrupt-{stamp}").write_bytes(b"old")
        (tmp_path / f"state.db.corrupt-{stamp}-wal").write_bytes(b"old")
    path.write_bytes(b"not sqlite " * 100)
    store = Store(path, flush_interval_s=60)
    store.open()
    assert store.healthy
    store.close()
    left = sorted(p.name for p in tmp_path.glob("state.db.corrupt-*") if not p.name.endswith("-wal"))
    assert len(left) == KEEP_CORRUPT_COPIES == 3
    assert left[:2] == ["state.db.corrupt-20260103T000000Z", "state.db.corrupt-20260104T000000Z"]
    assert not (tmp_path / "state.db.corrupt-20260101T000000Z-wal").exists()


# -- disk full: recover with as little free space as the data needs, and say what was lost (issue 23) ---------

def _finished(i: int):
    from coderouterd.state.events import RequestFinished

    return RequestFinished(request_id=f"req_{i:020d}", ingress="anthropic", profile="default", provider="local",
                           attempts=[{"provider": "local", "outcome": "ok", "ms": 12.5}], model_requested="m",
                           model_used="m", status=200, latency_ms=100.0, input_tokens=1000, output_tokens=10)


def _journal_count(path) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("SELECT COUNT(*) FROM journal").fetchone()[0]
    finally:
        conn.close()


def test_a_backlog_is_written_in_batches_so_a_little_space_makes_progress(tmp_path):
    now = [1000.0]
    path = tmp_path / "state.db"
    store = Store(path, flush_interval_s=60, retry_s=5.0, clock=lambda: now[0])
    store.open()
    sink = store.journal_sink()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")  # full: not one more page
    sink([_finished(i) for i in range(3000)])
    assert not store.healthy and "full" in store.problem
    store._conn.execute(f"PRAGMA max_page_count = {pages + 60}")  # room for some of the backlog, not all of it
    now[0] += 5.0
    store.flush()
    written = 3000 - len(store._pending_journal)
    assert 0 < written < 3000, written  # one transaction of the whole backlog would have written nothing
    assert not store.healthy
    store._conn.execute("PRAGMA max_page_count = 1000000")
    now[0] += 5.0
    store.flush()
    assert store.healthy
    store.close()
    assert _journal_count(path) == 3000


def test_rows_dropped_in_an_outage_are_counted_in_status_and_in_the_recovery(tmp_path):
    from coderouterd.admin import views

    now = [1000.0]
    bus, seen = _collecting_bus()
    path = tmp_path / "state.db"
    store = Store(path, flush_interval_s=60, retry_s=5.0, clock=lambda: now[0], bus=bus, max_pending_journal=100)
    store.open()
    sink = store.journal_sink()
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")
    sink([_finished(i) for i in range(250)])
    assert store.dropped_this_outage == 150 and store.dropped_journal_rows == 150

    class _Telemetry:
        unusable = None
        audit = None
        enabled = True

    class _Daemon:
        telemetry = _Telemetry()

    _Daemon.telemetry.store = store
    shown = views.store(_Daemon())
    assert not shown.healthy and shown.problem is not None and "150 journal rows dropped so far" in shown.problem

    store._conn.execute("PRAGMA max_page_count = 1000000")
    now[0] += 5.0
    store.flush()
    assert store.healthy and store.dropped_this_outage == 0 and views.store(_Daemon()).healthy
    recovered = [f for f in _faults(bus, seen) if f.recovered]
    assert len(recovered) == 1 and "150 journal rows dropped" in recovered[0].problem
    store.close()
    assert _journal_count(path) == 100  # the newest 100 were kept


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_on_a_really_full_disk_the_store_recovers_with_about_the_space_its_data_needs(tmp_path):
    """A real filesystem that fills up (a small tmpfs): the WAL is checkpointed and truncated as batches go,
    so the space needed to recover is the backlog's own size, not that plus a WAL copy of it."""
    import pytest

    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, "8m"):
        pytest.skip("needs root and a mountable tmpfs for a real disk-full")
    try:
        now = [1000.0]
        store = Store(mnt / "state.db", flush_interval_s=3600, retry_s=5.0, clock=lambda: now[0])
        store.open()
        sink = store.journal_sink()
        with open(mnt / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        for i in range(0, 8000, 200):
            now[0] += 5.0
            sink([_finished(j) for j in range(i, i + 200)])
        assert not store.healthy and len(store._pending_journal) == 8000
        size = os.path.getsize(mnt / "filler")
        freed = 0
        while not store.healthy and freed < size:
            freed += 128 << 10
            os.truncate(mnt / "filler", size - freed)
            now[0] += 5.0
            store.flush()
        assert store.healthy
        db = os.path.getsize(mnt / "state.db")
        wal = mnt / "state.db-wal"
        wal_size = os.path.getsize(wal) if wal.exists() else 0
        # Everything is in the database proper (not parked in the WAL waiting for a checkpoint that needs the
        # same space again), and recovering took little more than that.
        assert wal_size <= 512 << 10, wal_size
        assert freed <= db + (768 << 10), (freed, db)
        store.close()
        assert _journal_count(mnt / "state.db") == 8000
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
