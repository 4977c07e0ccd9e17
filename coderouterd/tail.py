"""`tail -F` of one file: the lines appended to it, across its rotation. Shared by the audit log's follower
(state/audit.py) and `corectl logs --follow` (a supervised server's log)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import BinaryIO


def follow_lines(
    path: Path | str,
    fh: BinaryIO | None,
    ino: int | None,
    *,
    poll_s: float,
    stop: Callable[[], bool] | None = None,
    rotated: Callable[[int | None], Iterable[bytes]] | None = None,
) -> Generator[bytes]:
    """The lines (without their newline) appended to `path`, read through `fh`: open where reading starts, or None
    while there is no file yet; `ino` is its inode.

    A new file at the path (rename rotation) is read from its start once the old one is read to its end; the lines
    of the files rotated in between, should several rotations have happened since the last poll, are what
    `rotated(the old inode)` gives. A file cut below the read position (copy-truncate rotation) is read again from
    its start. `stop` is polled while idle: True ends the iteration. `fh` is closed at the end."""
    buf = b""
    try:
        while True:
            got = False
            if fh is not None:
                chunk = fh.read()
                if chunk:
                    got = True
                    buf += chunk
                    *lines, buf = buf.split(b"\n")
                    yield from lines
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (fh is None or st.st_ino != ino):
                if fh is not None:
                    if fh.read(1):  # the old file still had unread lines: finish those first
                        fh.seek(-1, os.SEEK_CUR)
                        continue
                    fh.close()
                    if rotated is not None:
                        yield from rotated(ino)
                fh = open(path, "rb")
                ino = os.fstat(fh.fileno()).st_ino
                buf = b""
                continue
            if st is not None and fh is not None and st.st_size < fh.tell():
                fh.seek(0)  # truncated in place
                buf = b""
                continue
            if got:
                continue
            if stop is not None and stop():
                return
            time.sleep(poll_s)
    finally:
        if fh is not None:
            fh.close()
