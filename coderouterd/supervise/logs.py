"""Size-rotated log files for supervised children.

The child writes straight into the file (stdout and stderr both point at one O_APPEND descriptor)
instead of into pipes the daemon pumps. Two reasons:
- A child must outlive a crash of the daemon to be adopted at the next start. With pipes, the
  read end dies with the daemon and the child's next log line raises SIGPIPE, which kills Go and
  C servers (ollama, llama-server): adoption would be a fiction and the model would be reloaded.
- The event loop does no per-byte work at all, so a chatty server or a stalled disk cannot delay
  request streaming.
Rotation is therefore copy-then-truncate: with O_APPEND the child's next write lands at the new
end of the truncated file. Only bytes written between the final read of the copy and the
truncate (microseconds) can be lost. Every method here does blocking file I/O; callers on the
event loop run them through asyncio.to_thread.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path
from typing import BinaryIO

from coderouterd import private_fs

DEFAULT_MAX_BYTES = 5 * 1024 * 1024
DEFAULT_KEEP = 3

_FILE_MODE = 0o600  # server logs can quote prompts and paths; keep them private like the state dir
_DIR_MODE = 0o700


class RotatingLog:
    def __init__(self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, keep: int = DEFAULT_KEEP) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = max(0, keep)
        # Serialises rotation against the supervisor's own marker lines (the child is not covered:
        # it cannot take our lock, which is what the copy-truncate scheme accounts for).
        self._lock = threading.Lock()

    def _ensure_dir(self) -> None:
        self.path.parent.mkdir(mode=_DIR_MODE, parents=True, exist_ok=True)

    def open_for_child(self) -> int:
        """A new descriptor for the child's stdout/stderr; the caller closes it after spawning."""
        self._ensure_dir()
        return private_fs.open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _FILE_MODE)

    def append(self, line: str) -> None:
        """One supervisor line (start, exit, stop), timestamped, so the file reads as a history."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data = f"[coderouterd {stamp}] {line.rstrip()}\n".encode()
        with self._lock:
            self._ensure_dir()
            fd = private_fs.open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, _FILE_MODE)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)

    def rotated_paths(self) -> list[Path]:
        return [self.path.with_name(f"{self.path.name}.{i}") for i in range(1, self.keep + 1)]

    def rotate_if_needed(self) -> bool:
        with self._lock:
            try:
                size = os.stat(self.path).st_size
            except FileNotFoundError:
                return False
            if size < self.max_bytes:
                return False
            self._rotate()
            return True

    def _rotate(self) -> None:
        # Through descriptors opened without following symlinks: os.truncate(path) would follow one.
        live = private_fs.open_private(self.path, os.O_RDWR, _FILE_MODE)
        with open(live, "r+b") as live_f:
            if self.keep == 0:
                live_f.truncate(0)
                return
            self._shift_into_first(live_f)

    def _shift_into_first(self, live: BinaryIO) -> None:
        older = self.rotated_paths()
        for src, dst in zip(reversed(older[:-1]), reversed(older[1:]), strict=True):
            if src.exists():
                os.replace(src, dst)
        fd = private_fs.open_private(older[0], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, _FILE_MODE)
        with open(fd, "wb") as first:
            shutil.copyfileobj(live, first, 1 << 20)
            live.truncate(0)
