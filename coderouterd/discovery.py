"""Where a running coderouterd can be found: one small JSON record per user, written by the daemon and read by
corectl. It is the only rule corectl uses to find the daemon, so a daemon started with any `--config`, any state
directory and any admin socket is found the same way, and corectl never parses a config file to find a socket.

The record lives in the discovery directory, which depends on the environment only, never on a config file:
$CODEROUTER_STATE_DIR (or $CODEROUTER_STATE__DIR) when set, else the per-user state directory (where the default
socket also lives). Two files:

- `coderouterd.json`: present while a daemon runs; removed by that daemon on a clean exit.
- `coderouterd.last.json`: the last record any daemon published, kept after it stops, so history commands
  (journal, audit, explain, replay) and doctor still know which config and state directory were used.

Both are written atomically (a temporary file renamed over the old one), private to the user. This module is
imported by corectl's fast path: it must stay cheap (no pydantic, no config)."""

from __future__ import annotations

import os
from pathlib import Path

from . import private_fs

RECORD_NAME = "coderouterd.json"
LAST_RECORD_NAME = "coderouterd.last.json"
SOCKET_NAME = "coderouterd.sock"
APP_NAME = "coderouter"


def discovery_dir() -> Path:
    """The fixed per-user place: from the environment alone, mirroring the daemon's default state directory."""
    sdir = os.environ.get("CODEROUTER_STATE__DIR") or os.environ.get("CODEROUTER_STATE_DIR")
    if not sdir:
        import platformdirs

        sdir = platformdirs.user_state_dir(APP_NAME)
    return Path(os.path.expanduser(sdir))


def make_record(*, pid: int, version: str, api_version: int, socket: str, config_path: str, embedded: bool,
                state_dir: str, listen_url: str, started_at: float) -> dict:
    return {"pid": pid, "version": version, "api_version": api_version, "socket": socket,
            "config_path": config_path, "embedded_config": embedded, "state_dir": state_dir,
            "listen_url": listen_url, "started_at": started_at}


def publish(record: dict, directory: Path | None = None) -> Path:
    """Write the live and the last record (blocking file I/O: the daemon calls it from a thread). A directory
    not ours or writable by others raises (private_fs.UnsafePath): a record there could be forged or redirected."""
    import orjson

    d = directory or discovery_dir()
    private_fs.ensure_private_dir(d)
    data = orjson.dumps(record, option=orjson.OPT_INDENT_2)
    private_fs.write_atomic(d / LAST_RECORD_NAME, data)
    private_fs.write_atomic(d / RECORD_NAME, data)
    return d / RECORD_NAME


def withdraw(pid: int, directory: Path | None = None) -> None:
    """Remove the live record on a clean exit, if it is still ours (another daemon may have published since)."""
    path = (directory or discovery_dir()) / RECORD_NAME
    record = _read(path)
    if record is not None and record.get("pid") == pid:
        try:
            path.unlink()
        except OSError:
            pass


def _read(path: Path) -> dict | None:
    import orjson

    try:
        data = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("pid"), int) else None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it is just not ours
    except OSError:
        return False
    return True


def read_live(directory: Path | None = None) -> dict | None:
    """The record of the daemon running now, or None (none published, or its process is gone: a crash)."""
    record = _read((directory or discovery_dir()) / RECORD_NAME)
    if record is None or not pid_alive(record["pid"]):
        return None
    return record


def read_last(directory: Path | None = None) -> dict | None:
    """The most recent record, whether or not its daemon still runs (the live one first: it is never older)."""
    d = directory or discovery_dir()
    return _read(d / RECORD_NAME) or _read(d / LAST_RECORD_NAME)
