"""Files only this user may touch: the state, socket and discovery directories and what the daemon writes there.

A directory another user can write to lets that user plant a symlink where the daemon is about to write
(`coderouterd.lock`, `audit.jsonl`, a temporary file, the admin socket), and the daemon, often started by a
more privileged user, then overwrites or appends to whatever the link points at. So a directory not owned by
this user, or writable by group or others, is refused outright; and every file is still opened with
O_NOFOLLOW and checked to be a regular file of ours, so a link that got there some other way is never
followed. Stdlib only: discovery.py (corectl's fast path) imports this."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class UnsafePath(OSError):
    """`strerror` says what is wrong and what to do; `filename` is the path."""

    def __init__(self, path: Path | str, problem: str) -> None:
        super().__init__(errno.EPERM, problem, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


def directory_problem(st: os.stat_result) -> str | None:
    """Why a directory with this stat is unsafe to write in, or None."""
    me = os.getuid()
    if st.st_uid != me:
        return (f"owned by uid {st.st_uid}, not by this user (uid {me}); another user could plant symlinks "
                "there: use a directory of your own")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o022:
        return (f"writable by other users (mode {mode:o}); another user could plant symlinks there: "
                "`chmod 700` it or use another directory")
    return None


def ensure_private_dir(path: Path, *, tighten: bool = True) -> os.stat_result:
    """Create `path` (0700) or check an existing one: refuse (UnsafePath) one not ours or writable by others.
    With `tighten`, also drop read access for others from one we own (they could list it, not write in it)."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    problem = directory_problem(st)
    if problem is not None:
        raise UnsafePath(path, problem)
    if tighten and stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, DIR_MODE)
    return st


def open_private(path: Path | str, flags: int, mode: int = FILE_MODE) -> int:
    """os.open that never follows a symlink and only accepts a regular file owned by this user; a file of ours
    with a wider mode (from an older version) is narrowed to 0600. Returns the descriptor."""
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:  # what O_NOFOLLOW answers for a symlink: say it plainly
            raise UnsafePath(path, "is a symlink; refusing to write through it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafePath(path, "not a regular file; refusing to write to it")
        if st.st_uid != os.getuid():
            raise UnsafePath(path, f"owned by uid {st.st_uid}, not by this user; refusing to write to it")
        if stat.S_IMODE(st.st_mode) & ~mode & 0o777:
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_not_link(path: Path) -> None:
    """For files another library opens (SQLite's database, -wal, -shm): refuse a symlink or a foreign file."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISREG(st.st_mode):
        raise UnsafePath(path, "is a symlink or not a regular file; refusing to open it")
    if st.st_uid != os.getuid():
        raise UnsafePath(path, f"owned by uid {st.st_uid}, not by this user; refusing to open it")


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: a fresh temporary file (O_EXCL, random name, 0600) in the same directory,
    renamed over it. rename() replaces a symlink at `path` itself, never its target."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
