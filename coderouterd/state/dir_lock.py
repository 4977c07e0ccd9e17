"""The state-directory lock, one daemon per state directory: an flock'd lock file holding the owner's PID.

flock is released by the kernel when the owner dies, so a crashed daemon never leaves a lock behind; the
file itself stays (unlinking it would let two processes hold locks on two different inodes)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from .. import private_fs

LOCK_NAME = "coderouterd.lock"


class LockHeld(Exception):
    def __init__(self, path: Path, pid: int | None) -> None:
        who = f"pid {pid}" if pid else "another process"
        super().__init__(f"another coderouterd ({who}) is already running with this state directory "
                         f"(lock file {path})")
        self.path = path
        self.pid = pid


class StateLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise LockHeld naming the owner's PID."""
        # Never through a symlink: the lock file sits where the daemon's (maybe privileged) user writes.
        fd = private_fs.open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = _read_pid(fd)
            os.close(fd)
            raise LockHeld(self.path, pid) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _read_pid(fd: int) -> int | None:
    try:
        return int(os.pread(fd, 32, 0).decode().strip() or 0) or None
    except (OSError, ValueError):
        return None
