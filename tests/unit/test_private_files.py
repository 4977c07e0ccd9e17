"""Issue 23 item 9: nothing the daemon writes follows a symlink planted by another user, directories others
can write to are refused, and the files are created 0600. Tests run as root here, where permission bits do
not stop anything: what is tested is ownership, modes and O_NOFOLLOW/O_EXCL, which apply to root too."""

import os
import stat

import pytest

from coderouterd import discovery, private_fs
from coderouterd.admin.server import AdminSocketError, bind_admin_socket, ensure_private_dir
from coderouterd.state.audit import AuditLog
from coderouterd.state.dir_lock import LOCK_NAME, StateLock
from coderouterd.state.events import ProfileSwitched
from coderouterd.state.store import Store
from coderouterd.supervise.logs import RotatingLog

OTHER_UID = 54321
as_root = pytest.mark.skipif(os.getuid() != 0, reason="chown to another uid needs root")


def _victim(tmp_path):
    """A private file elsewhere that a planted symlink points at."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious\n")
    os.chmod(victim, 0o600)
    return victim


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# -- directories -----------------------------------------------------------------------------------------

def test_a_directory_writable_by_others_is_refused_naming_it_and_the_fix(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(private_fs.UnsafePath) as e:
        ensure_private_dir(shared, enforce=True)
    assert str(shared) in str(e.value) and "writable by other users" in str(e.value) and "chmod 700" in str(e.value)
    assert _mode(shared) == 0o777  # refused, not silently "fixed" with whatever was planted inside


@as_root
def test_a_directory_owned_by_another_user_is_refused(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(private_fs.UnsafePath, match=f"owned by uid {OTHER_UID}"):
        ensure_private_dir(theirs, enforce=True)
    with pytest.raises(OSError, match=f"owned by uid {OTHER_UID}"):
        discovery.publish({"pid": os.getpid()}, theirs)
    assert list(theirs.iterdir()) == []


def test_own_directory_readable_by_others_is_tightened(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    os.chmod(d, 0o755)
    ensure_private_dir(d, enforce=True)
    assert _mode(d) == 0o700


def test_admin_socket_is_refused_in_a_shared_directory(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    with pytest.raises(AdminSocketError, match=f"cannot use {shared} for the admin socket.*only you can write"):
        bind_admin_socket(shared / "coderouterd.sock", private_dir=False)
    assert not (shared / "coderouterd.sock").exists()


@as_root
def test_fallback_socket_directory_created_by_another_user_is_refused(tmp_path):
    # $TMPDIR/coderouter-<uid> made in advance by someone else
    theirs = tmp_path / f"coderouter-{os.getuid()}"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    with pytest.raises(AdminSocketError, match=f"owned by uid {OTHER_UID}"):
        bind_admin_socket(theirs / "coderouterd.sock", private_dir=True)


# -- files: never through a symlink, created 0600 ---------------------------------------------------------

def test_lock_file_is_not_followed_through_a_symlink(tmp_path):
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / LOCK_NAME).symlink_to(victim)
    with pytest.raises(OSError):
        StateLock(state / LOCK_NAME).acquire()
    assert victim.read_bytes() == b"precious\n"


def test_lock_file_is_created_0600(tmp_path):
    lock = StateLock(tmp_path / LOCK_NAME)
    lock.acquire()
    try:
        assert _mode(tmp_path / LOCK_NAME) == 0o600
    finally:
        lock.release()


def test_audit_log_does_not_append_through_a_symlink(tmp_path):
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / "audit.jsonl").symlink_to(victim)
    log = AuditLog(state)
    log.sink([ProfileSwitched("a", "b", source="corectl")])
    assert victim.read_bytes() == b"precious\n"
    assert log.healthy is False and "audit.jsonl" in (log.problem or "")
    log.close()


def test_audit_log_is_created_0600(tmp_path):
    os.umask(old := os.umask(0o022))
    log = AuditLog(tmp_path)
    log.sink([ProfileSwitched("a", "b", source="corectl")])
    log.close()
    assert old is not None and _mode(tmp_path / "audit.jsonl") == 0o600


def test_discovery_record_never_writes_through_a_symlink(tmp_path):
    victim = _victim(tmp_path)
    d = tmp_path / "disc"
    d.mkdir(mode=0o700)
    # The temporary file's old, predictable name, and the record itself.
    (d / f".{discovery.RECORD_NAME}.{os.getpid()}.tmp").symlink_to(victim)
    (d / discovery.LAST_RECORD_NAME).symlink_to(victim)
    discovery.publish({"pid": os.getpid()}, d)
    assert victim.read_bytes() == b"precious\n"
    for name in (discovery.RECORD_NAME, discovery.LAST_RECORD_NAME):
        assert not (d / name).is_symlink() and _mode(d / name) == 0o600
    assert discovery.read_live(d)["pid"] == os.getpid()
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


@pytest.mark.parametrize("name", ["state.db", "state.db-wal", "state.db-shm"])
def test_store_refuses_a_symlinked_database_or_sidecar(tmp_path, name):
    victim = _victim(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    (state / name).symlink_to(victim)
    store = Store(state / "state.db", flush_interval_s=60)
    store.open()
    store.set("profile", "active", "coding")
    store.close()
    assert victim.read_bytes() == b"precious\n"
    assert store.healthy is False and "refusing" in (store.problem or "")


def test_store_files_are_created_0600(tmp_path):
    os.umask(old := os.umask(0o022))
    store = Store(tmp_path / "state.db", flush_interval_s=60)
    store.open()
    store.set("profile", "active", "coding")
    store.flush()
    modes = {p.name: _mode(p) for p in tmp_path.iterdir()}
    store.close()
    assert old is not None and {"state.db", "state.db-wal", "state.db-shm"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_managed_process_log_is_not_followed_through_a_symlink(tmp_path):
    victim = _victim(tmp_path)
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    (logs / "x.log").symlink_to(victim)
    log = RotatingLog(logs / "x.log", max_bytes=5, keep=1)
    with pytest.raises(OSError):
        log.append("started")
    with pytest.raises(OSError):
        log.open_for_child()
    with pytest.raises(OSError):
        log.rotate_if_needed()  # the victim is past max_bytes: rotation must not truncate it
    assert victim.read_bytes() == b"precious\n"
    (logs / "x.log").unlink()
    (logs / "x.log.1").symlink_to(victim)
    log.append("a line long enough to rotate")
    with pytest.raises(OSError):
        log.rotate_if_needed()
    assert victim.read_bytes() == b"precious\n"
