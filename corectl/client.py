"""The admin API client: HTTP over the daemon's Unix socket, and where that socket is.

Startup time matters (`corectl status` is typed by hand and run by scripts in loops), so nothing here imports
the daemon's config stack (pydantic) unless the cheap guesses at the socket path all fail."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from coderouterd.admin.version import API_VERSION, API_VERSION_HEADER

if TYPE_CHECKING:
    import http.client

SOCKET_NAME = "coderouterd.sock"
DEFAULT_TIMEOUT_S = 15.0


class CorectlError(Exception):
    """An error to show as one human line; `code` is the process exit status."""

    def __init__(self, message: str, code: int = 1, payload: dict | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.payload = payload or {}


class DaemonNotRunning(CorectlError):
    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"coderouterd is not running ({detail} at {path}). Start it with: {start_command()}",
                         code=3, payload={"socket": path, "running": False})


def start_command(with_config: bool = True) -> str:
    """How to start the daemon from where the user is: `coderouterd` when it is on PATH, else the one next to
    this Python (a venv that is not activated), with the config the last daemon ran with."""
    import shutil
    import sys

    if shutil.which("coderouterd"):
        cmd = "coderouterd"
    else:
        beside = os.path.join(os.path.dirname(sys.executable), "coderouterd")
        cmd = _shorten(beside) if os.access(beside, os.X_OK) else f"{_shorten(sys.executable)} -m coderouterd"
    if not with_config:
        return cmd
    from coderouterd.discovery import read_last

    last = read_last()
    if last and not last.get("embedded_config") and last.get("config_path"):
        cmd += f" --config {_shorten(last['config_path'])}"
    return cmd


def _shorten(path: str) -> str:
    """A path as short as it can be typed from here: relative to the current directory, else with ~."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        rel = path
    if not rel.startswith(".."):
        return rel if os.sep in rel else os.path.join(".", rel)
    home = os.path.expanduser("~")
    return "~" + path[len(home):] if home != "/" and path.startswith(home + os.sep) else path


def cheap_socket_path() -> str:
    """The daemon's default socket path from the environment alone, mirroring coderouterd.config."""
    explicit = os.environ.get("CODEROUTER_ADMIN__SOCKET")
    if explicit:
        return os.path.expanduser(explicit)
    from coderouterd.discovery import discovery_dir

    return os.path.join(discovery_dir(), SOCKET_NAME)


def resolve_socket(explicit: str | None) -> str:
    """--socket (or $CODEROUTER_SOCKET), else $CODEROUTER_ADMIN__SOCKET, else the socket the running daemon
    published (coderouterd.discovery), else the default path. Never parses a config file."""
    if explicit:
        return os.path.expanduser(explicit)
    if os.environ.get("CODEROUTER_ADMIN__SOCKET"):
        return cheap_socket_path()
    from coderouterd.discovery import read_live

    live = read_live()
    if live and isinstance(live.get("socket"), str):
        return live["socket"]
    return cheap_socket_path()


def _unix_connection(path: str, timeout: float) -> http.client.HTTPConnection:
    """An http.client connection whose transport is the Unix socket at `path` (imports deferred: paths that
    never call the daemon do not pay for http.client)."""
    import http.client
    import socket

    class UnixHTTPConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            try:
                sock.connect(path)
            except BaseException:
                sock.close()
                raise
            self.sock = sock

    return UnixHTTPConnection("coderouterd", timeout=timeout)


class AdminClient:
    """HTTP/1.1 over the daemon's Unix socket with the standard library's http.client.

    Not httpx, on measurement: importing httpx + httpcore costs ~100 ms more CPU than http.client (see
    bench/corectl_status.py), which alone would spend most of the 250 ms budget of `corectl status`."""

    def __init__(self, socket_path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(status, JSON body) of one admin call. Raises CorectlError for anything that is not a JSON answer."""
        import orjson

        if self._conn is None:
            if not os.path.exists(self.socket_path):
                raise DaemonNotRunning(self.socket_path, "no socket")
            self._conn = _unix_connection(self.socket_path, self.timeout)
        content = orjson.dumps(body) if body is not None else None
        headers = {"content-type": "application/json"} if body is not None else {}
        try:
            self._conn.request(method, path, body=content, headers=headers)
            resp = self._conn.getresponse()
            status, raw = resp.status, resp.read()
            spoken = resp.getheader(API_VERSION_HEADER)
        except FileNotFoundError:
            raise DaemonNotRunning(self.socket_path, "no socket") from None
        except ConnectionRefusedError:
            raise DaemonNotRunning(self.socket_path, "nothing is listening on the socket") from None
        except PermissionError:
            raise CorectlError(f"permission denied on the admin socket {self.socket_path} "
                               "(it belongs to another user)", code=1) from None
        except TimeoutError:
            raise CorectlError(f"coderouterd did not answer within {self.timeout:g} s "
                               f"(socket {self.socket_path})", code=1) from None
        except Exception as e:  # http.client.HTTPException, a reset connection, ...
            raise CorectlError(f"talking to coderouterd over {self.socket_path} failed: "
                               f"{type(e).__name__}: {e}", code=1) from None
        if spoken is not None and spoken != str(API_VERSION):
            raise CorectlError(f"coderouterd speaks admin API version {spoken}, this corectl version {API_VERSION}: "
                               "restart coderouterd after an upgrade (or use the corectl installed with it)",
                               code=1, payload={"api_version": spoken, "expected": API_VERSION})
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise CorectlError(f"coderouterd answered {method} {path} with HTTP {status} and a body that "
                               "is not JSON", code=1) from None
        if not isinstance(data, dict):
            raise CorectlError(f"unexpected answer from coderouterd to {method} {path}", code=1)
        return status, data

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """Like request(), but any non-2xx answer becomes a CorectlError carrying the daemon's reason."""
        status, data = self.request(method, path, body)
        if status >= 400:
            raise CorectlError(str(data.get("error") or f"HTTP {status}"), code=1, payload=data)
        return data
