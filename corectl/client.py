"""The admin API client: HTTP over the daemon's Unix socket, and where that socket is.

Startup time matters (`corectl status` is typed by hand and run by scripts in loops), so nothing here imports
the daemon's config stack (pydantic) unless the cheap guesses at the socket path all fail."""

from __future__ import annotations

import os

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
        super().__init__(f"coderouterd is not running ({detail} at {path}). Start it with: coderouterd", code=3,
                         payload={"socket": path, "running": False})


def cheap_socket_path() -> str:
    """The daemon's default socket path from the environment alone, mirroring coderouterd.config."""
    explicit = os.environ.get("CODEROUTER_ADMIN__SOCKET")
    if explicit:
        return os.path.expanduser(explicit)
    sdir = os.environ.get("CODEROUTER_STATE__DIR") or os.environ.get("CODEROUTER_STATE_DIR")
    if not sdir:
        import platformdirs

        sdir = platformdirs.user_state_dir("coderouter")
    return os.path.join(os.path.expanduser(sdir), SOCKET_NAME)


def configured_socket_path() -> str | None:
    """The socket named by the config file the daemon would load (slow: imports pydantic). None when there is no
    config file or it cannot be read: the caller then reports the cheap path."""
    from coderouterd.config import ConfigError, admin_socket_path, load_config
    from coderouterd.config.loader import EMBEDDED, resolve_config_path

    if resolve_config_path(None) == EMBEDDED:
        return None
    try:
        return str(admin_socket_path(load_config(None).model))
    except ConfigError:
        return None


def resolve_socket(explicit: str | None) -> str:
    if explicit:
        return os.path.expanduser(explicit)
    path = cheap_socket_path()
    if os.path.exists(path):
        return path
    configured = configured_socket_path()
    if configured and os.path.exists(configured):
        return configured
    return path


def _unix_connection(path: str, timeout: float):
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
        self._conn = None

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
