"""The admin API client: httpx over the daemon's Unix socket, and where that socket is.

Startup time matters (`corectl status` is typed by hand and run by scripts in loops), so nothing here imports
the daemon's config stack (pydantic) unless the cheap guesses at the socket path all fail."""

from __future__ import annotations

import os
import sys

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


def _import_httpx():
    # httpx's own CLI module pulls in click, rich.progress and pygments at import (~60 ms). corectl never uses
    # it; a None entry in sys.modules makes httpx's guarded `from ._main import main` fall back to its stub.
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)
    import httpx

    return httpx


class AdminClient:
    def __init__(self, socket_path: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._client = None

    def _http(self):
        if self._client is None:
            if not os.path.exists(self.socket_path):
                raise DaemonNotRunning(self.socket_path, "no socket")
            httpx = _import_httpx()
            import ssl

            # The admin API is plain HTTP on a Unix socket; without an explicit context httpx would load the
            # CA bundle (tens of ms) for TLS that is never used. This context trusts nothing, so it stays safe.
            no_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            transport = httpx.HTTPTransport(uds=self.socket_path, verify=no_tls)
            self._client = httpx.Client(transport=transport, base_url="http://coderouterd", timeout=self.timeout)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
        """(status, JSON body) of one admin call. Raises CorectlError for anything that is not a JSON answer."""
        import orjson

        client = self._http()
        httpx = sys.modules["httpx"]
        content = orjson.dumps(body) if body is not None else None
        headers = {"content-type": "application/json"} if body is not None else None
        try:
            r = client.request(method, path, content=content, headers=headers)
        except httpx.ConnectError as e:
            cause = e.__context__ or e.__cause__
            if isinstance(cause, PermissionError) or "Permission denied" in str(e):
                raise CorectlError(f"permission denied on the admin socket {self.socket_path} "
                                   "(it belongs to another user)", code=1) from None
            if not os.path.exists(self.socket_path):
                raise DaemonNotRunning(self.socket_path, "no socket") from None
            raise DaemonNotRunning(self.socket_path, "nothing is listening on the socket") from None
        except httpx.TimeoutException:
            raise CorectlError(f"coderouterd did not answer within {self.timeout:g} s "
                               f"(socket {self.socket_path})", code=1) from None
        except httpx.HTTPError as e:
            raise CorectlError(f"talking to coderouterd over {self.socket_path} failed: {e}", code=1) from None
        try:
            data = orjson.loads(r.content)
        except orjson.JSONDecodeError:
            raise CorectlError(f"coderouterd answered {method} {path} with HTTP {r.status_code} and a body that "
                               "is not JSON", code=1) from None
        if not isinstance(data, dict):
            raise CorectlError(f"unexpected answer from coderouterd to {method} {path}", code=1)
        return r.status_code, data

    def call(self, method: str, path: str, body: dict | None = None) -> dict:
        """Like request(), but any non-2xx answer becomes a CorectlError carrying the daemon's reason."""
        status, data = self.request(method, path, body)
        if status >= 400:
            raise CorectlError(str(data.get("error") or f"HTTP {status}"), code=1, payload=data)
        return data
