"""Audit log: the events worth reading later, as JSON Lines with size-based rotation.

`audit.jsonl` is the live file; rotation renames it to `audit.jsonl.1` (older files shift up to
`.keep`, the oldest falls off). Each line is `{"ts": ISO-8601 UTC, "kind": ..., <event fields>}`.
Writing happens in the event writer thread; a disk problem is recorded, never raised.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Generator, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from coderouterd import private_fs
from coderouterd.state.events import Event, PersistenceFault
from coderouterd.tail import follow_lines

log = logging.getLogger(__name__)

AUDIT_FILE = "audit.jsonl"
# Rate-limit refusals are written at most once per key per this many seconds (a client retrying in a loop must not
# fill the log); the line written says how many refusals it stands for.
RATE_LIMIT_LINE_EVERY_S = 60.0
_ROTATED = re.compile(re.escape(AUDIT_FILE) + r"\.(\d+)$")


def iso_utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def audit_record(event: Event) -> dict[str, Any]:
    record = event.to_dict()
    record["ts"] = iso_utc(event.ts)
    return record


class AuditLog:
    def __init__(
        self,
        dir: Path,
        *,
        max_bytes: int = 10_000_000,
        keep: int = 3,
        bus: Any | None = None,
        max_buffer: int = 10_000,
    ):
        self.dir = Path(dir)
        self.path = self.dir / AUDIT_FILE
        self.max_bytes = max_bytes
        self.keep = keep
        self.max_buffer = max_buffer
        self.healthy = True
        self.problem: str | None = None
        self._bus = bus
        self._fh: Any = None
        self._size = 0
        # Lines not yet on disk (only non-empty while the disk is failing).
        self._buffer: list[bytes] = []
        # key name -> (when its last rate-limit line was written, refusals since then not written)
        self._rate_lines: dict[str, tuple[float, int]] = {}

    def sink(self, events: list[Event]) -> None:
        for ev in events:
            if ev.audited:
                record = audit_record(ev)
                if ev.kind == "key_rate_limited" and not self._rate_line_due(record, ev.ts):
                    continue
                self._buffer.append(orjson.dumps(record, default=str) + b"\n")
        if not self._buffer:
            return
        if len(self._buffer) > self.max_buffer:
            del self._buffer[: len(self._buffer) - self.max_buffer]
        try:
            self._write_buffer()
        except OSError as exc:
            self._close()
            self._fail(f"cannot write {self.path}: {exc.strerror or exc}")
            return
        if not self.healthy:
            old, self.healthy, self.problem = self.problem, True, None
            log.warning("audit log recovered (was: %s)", old)
            self._publish(PersistenceFault(component="audit", problem=old or "", recovered=True))

    def close(self) -> None:
        self._close()

    def _rate_line_due(self, record: dict[str, Any], ts: float) -> bool:
        """One rate-limit line per key per RATE_LIMIT_LINE_EVERY_S (by the events' own times): the first refusal
        of a burst is written, the next ones are counted into the line written after the minute."""
        key = str(record.get("key"))
        last = self._rate_lines.get(key)
        if last is not None and ts - last[0] < RATE_LIMIT_LINE_EVERY_S:
            self._rate_lines[key] = (last[0], last[1] + 1)
            return False
        if last is not None and last[1]:
            record["refusals_since_last_line"] = last[1]
        if len(self._rate_lines) > 10_000:  # keys are few; a bound all the same
            self._rate_lines.clear()
        self._rate_lines[key] = (ts, 0)
        return True

    def _write_buffer(self) -> None:
        self._ensure_open()
        lines = self._buffer
        while lines:
            size, end = self._size, 0
            # An empty file always takes one line, so an oversized record cannot stall rotation.
            while end < len(lines) and (size == 0 or size + len(lines[end]) <= self.max_bytes):
                size += len(lines[end])
                end += 1
            if end == 0:
                self._rotate()
                continue
            before = self._size
            view = memoryview(b"".join(lines[:end]))
            try:
                while view:
                    view = view[self._fh.write(view) :]
            except OSError:
                # Cut a half-written chunk off so the file stays one object per line; the lines
                # stay buffered and are retried with the next batch.
                with contextlib.suppress(OSError):
                    self._fh.truncate(before)
                raise
            self._size = size
            del lines[:end]

    def _ensure_open(self) -> None:
        if self._fh is not None:
            try:
                if os.stat(self.path).st_ino == os.fstat(self._fh.fileno()).st_ino:
                    return
            except FileNotFoundError:
                pass
            self._close()  # removed or rotated by someone else: start a new live file
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # 0600 and never through a symlink planted at the path; unbuffered: every batch reaches the file
        # before the sink returns, for `tail -f` readers.
        fd = private_fs.open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._fh = open(fd, "ab", buffering=0)
        self._size = self._fh.seek(0, os.SEEK_END)

    def _rotate(self) -> None:
        self._close()
        if self.keep <= 0:
            self.path.unlink(missing_ok=True)
        else:
            for i in range(self.keep - 1, 0, -1):
                src = self.dir / f"{AUDIT_FILE}.{i}"
                if src.exists():
                    os.replace(src, self.dir / f"{AUDIT_FILE}.{i + 1}")
            os.replace(self.path, self.dir / f"{AUDIT_FILE}.1")
        self._ensure_open()

    def _close(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _fail(self, problem: str) -> None:
        if problem == self.problem:
            return
        self.healthy = False
        self.problem = problem
        log.error("audit log unhealthy: %s", problem)
        self._publish(PersistenceFault(component="audit", problem=problem))

    def _publish(self, event: Event) -> None:
        if self._bus is not None:
            self._bus.publish(event)


def audit_files(dir: Path | str) -> list[Path]:
    """Existing audit files, oldest first (highest rotation number first, live file last)."""
    d = Path(dir)
    rotated: list[tuple[int, Path]] = []
    try:
        for p in d.iterdir():
            m = _ROTATED.match(p.name)
            if m:
                rotated.append((int(m.group(1)), p))
    except FileNotFoundError:
        return []
    files = [p for _, p in sorted(rotated, reverse=True)]
    live = d / AUDIT_FILE
    if live.exists():
        files.append(live)
    return files


def _parse(line: bytes) -> dict | None:
    if not line.strip():
        return None
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None  # a torn final line after a crash
    return obj if isinstance(obj, dict) else None


def read_audit(
    dir: Path | str,
    n: int | None = None,
    kind: str | Iterable[str] | None = None,
    since: datetime | None = None,
) -> list[dict]:
    """Audit records across rotated files, newest last; `n` keeps only the newest n matches."""
    if n is not None and n <= 0:
        return []
    kinds = {kind} if isinstance(kind, str) else (set(kind) if kind is not None else None)
    since_s = None
    if since is not None:
        if since.tzinfo is None:
            since = since.replace(tzinfo=UTC)
        # Records carry one fixed ISO format, so string order is time order.
        since_s = iso_utc(since.timestamp())
    out: list[dict] = []
    for path in reversed(audit_files(dir)):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue  # rotated away between listing and reading
        for line in reversed(data.splitlines()):
            rec = _parse(line)
            if rec is None:
                continue
            if kinds is not None and rec.get("kind") not in kinds:
                continue
            if since_s is not None and str(rec.get("ts", "")) < since_s:
                continue
            out.append(rec)
            if n is not None and len(out) >= n:
                out.reverse()
                return out
    out.reverse()
    return out


def follow_audit(
    dir: Path | str,
    poll_s: float = 0.5,
    *,
    from_start: bool = False,
    stop: Callable[[], bool] | None = None,
) -> Iterator[dict]:
    """Yield records appended after this call (like `tail -f`), following rotation.

    The start position is fixed when this function is called, not at the first next().
    `stop` is polled while idle; returning True ends the iteration.
    """
    path = Path(dir) / AUDIT_FILE
    fh = None
    ino = None
    try:
        fh = open(path, "rb")
        ino = os.fstat(fh.fileno()).st_ino
        if not from_start:
            fh.seek(0, os.SEEK_END)
    except FileNotFoundError:
        fh = None
    return _records(follow_lines(path, fh, ino, poll_s=poll_s, stop=stop,
                                 rotated=lambda old: _lines_after(path.parent, old)))


def _lines_after(dir: Path, ino: int | None) -> Iterator[bytes]:
    """The lines of the rotated files newer than the one of inode `ino` (all of them when it fell off the end)."""
    rotated = audit_files(dir)
    if rotated and rotated[-1].name == AUDIT_FILE:
        rotated.pop()
    start = 0  # the finished file fell off the end entirely: every rotated file is newer
    for i, p in enumerate(rotated):
        try:
            if os.stat(p).st_ino == ino:
                start = i + 1
        except FileNotFoundError:
            continue
    for p in rotated[start:]:
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            continue
        yield from data.splitlines()


def _records(lines: Generator[bytes]) -> Iterator[dict]:
    with contextlib.closing(lines):  # closing the follower closes its file at once
        for line in lines:
            rec = _parse(line)
            if rec is not None:
                yield rec
