"""Which daemon a corectl command is about: the config file and state directory of the coderouterd the user
runs, so doctor, config check, service install and the history commands look at the same files it uses.

Order for the config: --config, $CODEROUTER_CONFIG, the running daemon (asked over its socket), the last
published discovery record (coderouterd.discovery), else the daemon's own default rule. For the state directory:
--state-dir, $CODEROUTER_STATE_DIR, the running daemon, the last record, else the default config's.

An explicit location wins over the pointer to the last daemon. A command that reads a given state directory
(`--state-dir DIR`) follows a daemon, running or last, for its config only when that daemon used DIR; else the
record DIR holds itself, else the default rule. Following the record of a daemon that no longer runs is said
on stderr: its config may be stale (a user's coderouterd of last week, a shared DSN that is gone)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .api import DaemonAPI
from .client import CorectlError


@dataclass(frozen=True)
class Found:
    value: str | None  # a config path (None: let the daemon's default rule decide) or a state directory
    source: str        # how it was found, for messages


def running_daemon(socket: str | None) -> dict | None:
    """The running daemon's /v1/status, or None when none answers on the resolved socket."""
    try:
        with DaemonAPI(socket, timeout=3.0) as api:
            return dict(api.status())
    except CorectlError:
        return None


def _last_record(directory: Path | None = None) -> dict | None:
    from coderouterd.discovery import read_last

    return read_last(directory)


def used_state_dir(record: dict, state_dir: Path | None) -> bool:
    """Whether the daemon of `record` used `state_dir` (None: any will do)."""
    if state_dir is None:
        return True
    theirs = record.get("state_dir")
    return isinstance(theirs, str) and Path(theirs).expanduser().resolve() == state_dir.expanduser().resolve()


def _from_last(last: dict) -> Found:
    import sys

    from coderouterd.discovery import pid_alive

    path = None if last.get("embedded_config") else last.get("config_path")
    pid = last.get("pid")
    if isinstance(pid, int) and pid_alive(pid):
        return Found(path, f"the last coderouterd run (pid {pid})")
    where = path or "the embedded default config"
    print(f"corectl: using the config of the last coderouterd run, {where} (pid {pid} is no longer running; "
          "pass --config to choose another)", file=sys.stderr)
    return Found(path, f"the last coderouterd run (pid {pid}, no longer running)")


_ASK = object()


def config_for(explicit: str | None, socket: str | None = None, *, daemon=_ASK,
               state_dir: Path | None = None) -> Found:
    """`daemon`: the running daemon's status when the caller already asked (None: none runs). `state_dir`: the
    state directory the command reads, when it reads one: only a daemon that used it lends its config."""
    if explicit:
        return Found(os.path.expanduser(explicit), "--config")
    if os.environ.get("CODEROUTER_CONFIG"):
        return Found(os.environ["CODEROUTER_CONFIG"], "$CODEROUTER_CONFIG")
    status = running_daemon(socket) if daemon is _ASK else daemon
    if status is not None and used_state_dir(status, state_dir):
        path = None if status.get("embedded_config") else status.get("config_path")
        return Found(path, f"the running coderouterd (pid {status.get('pid')})")
    last = _last_record()
    if last is not None and used_state_dir(last, state_dir):
        return _from_last(last)
    own = _last_record(state_dir) if state_dir is not None and state_dir.is_dir() else None
    if own is not None and used_state_dir(own, state_dir):
        return _from_last(own)
    return Found(None, "the default location")


def state_dir_for(explicit: str | None, socket: str | None = None) -> tuple[Path, str]:
    if explicit:
        return Path(explicit).expanduser(), "--state-dir"
    for var in ("CODEROUTER_STATE_DIR", "CODEROUTER_STATE__DIR"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser(), f"${var}"
    status = running_daemon(socket)
    if status is not None and status.get("state_dir"):
        return Path(status["state_dir"]), f"the running coderouterd (pid {status.get('pid')})"
    last = _last_record()
    if last is not None and last.get("state_dir"):
        return Path(last["state_dir"]), f"the last coderouterd run (pid {last.get('pid')})"
    from coderouterd.config import ConfigError, load_config, state_dir

    try:
        return state_dir(load_config(None).model), "the config"
    except ConfigError:
        import platformdirs

        return Path(platformdirs.user_state_dir("coderouter")), "the default location"
