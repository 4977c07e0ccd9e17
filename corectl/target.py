"""Which daemon a corectl command is about: the config file and state directory of the coderouterd the user
runs, so doctor, config check, service install and the history commands look at the same files it uses.

Order for the config: --config, $CODEROUTER_CONFIG, the running daemon (asked over its socket), the last
published discovery record (coderouterd.discovery), else the daemon's own default rule. For the state directory:
--state-dir, $CODEROUTER_STATE_DIR, the running daemon, the last record, else the default config's."""

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


def _last_record() -> dict | None:
    from coderouterd.discovery import read_last

    return read_last()


_ASK = object()


def config_for(explicit: str | None, socket: str | None = None, *, daemon=_ASK) -> Found:
    """`daemon`: the running daemon's status when the caller already asked (None: none runs)."""
    if explicit:
        return Found(os.path.expanduser(explicit), "--config")
    if os.environ.get("CODEROUTER_CONFIG"):
        return Found(os.environ["CODEROUTER_CONFIG"], "$CODEROUTER_CONFIG")
    status = running_daemon(socket) if daemon is _ASK else daemon
    if status is not None:
        path = None if status.get("embedded_config") else status.get("config_path")
        return Found(path, f"the running coderouterd (pid {status.get('pid')})")
    last = _last_record()
    if last is not None:
        path = None if last.get("embedded_config") else last.get("config_path")
        return Found(path, f"the last coderouterd run (pid {last.get('pid')})")
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
