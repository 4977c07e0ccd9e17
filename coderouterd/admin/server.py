"""The admin API: a small FastAPI app served by its own uvicorn Server on a Unix socket, in the daemon's loop.

Authorisation is the socket's file mode (0600) and its directory's (0700), as with tailscaled. Handlers are
`async def` on purpose: they run on the loop thread, so they never race the proxy over the daemon's state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from pathlib import Path

import orjson
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response

from ..config import ConfigError, load_config
from ..reload import apply_reload
from ..runtime import UnknownProfile
from .lock import ensure_private_dir

log = logging.getLogger("coderouterd.admin")

API_VERSION = 1
# sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS/BSD (both include the terminating NUL).
MAX_SOCKET_PATH = 103


class AdminSocketError(Exception):
    pass


class JSON(Response):
    media_type = "application/json"

    def render(self, content) -> bytes:
        return orjson.dumps(content)


class AdminError(Exception):
    def __init__(self, status: int, message: str, **extra) -> None:
        super().__init__(message)
        self.status = status
        self.extra = extra


class ManagedServer(uvicorn.Server):
    """A uvicorn Server that leaves signals alone: serve.py owns SIGTERM/SIGINT/SIGHUP for both servers.
    (uvicorn's own capture re-raises the signal after shutdown, which would turn a clean stop into death
    by SIGTERM instead of exit status 0.)"""

    @contextlib.contextmanager
    def capture_signals(self):
        yield


# -- the socket --------------------------------------------------------------------------------------------

def bind_admin_socket(path: Path, *, private_dir: bool) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600. A socket file left by a crashed daemon is detected (nobody
    accepts on it) and replaced; a live one is never touched."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise AdminSocketError(f"admin socket path is too long for a Unix socket ({len(os.fsencode(path))} "
                               f"bytes, max {MAX_SOCKET_PATH}): {path}; set [admin] socket to a shorter path")
    ensure_private_dir(path.parent, enforce=private_dir)
    try:
        st = path.lstat()
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise AdminSocketError(f"{path} exists and is not a socket; refusing to replace it")
        if _socket_alive(path):
            raise AdminSocketError(f"another process is serving the admin socket {path}")
        log.warning("removing stale admin socket %s (left by a daemon that did not stop cleanly)", path)
        path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # The umask makes the socket 0600 from the moment it exists; chmod repeats it for platforms that
        # ignore the umask on bind.
        old_umask = os.umask(0o177)
        try:
            sock.bind(os.fsdecode(path))
        finally:
            os.umask(old_umask)
        os.chmod(path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
    except OSError as e:
        sock.close()
        raise AdminSocketError(f"cannot listen on admin socket {path}: {e.strerror or e}") from None
    return sock


def _socket_alive(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(os.fsdecode(path))
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError:
        # A full backlog or a slow owner times out: something is there, so do not steal its path.
        return True
    finally:
        probe.close()
    return True


# -- the app -----------------------------------------------------------------------------------------------

async def _json_body(request: Request) -> dict:
    raw = await request.body()
    if not raw:
        raise AdminError(400, "request body must be a JSON object")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise AdminError(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise AdminError(400, "request body must be a JSON object")
    return body


def _runtime(daemon):
    runtime = daemon.runtime
    if runtime is None:
        raise AdminError(503, "coderouterd is still starting")
    return runtime


def _profile_detail(daemon, name: str) -> dict:
    runtime = _runtime(daemon)
    prof = runtime.config.profiles.get(name)
    if prof is None:
        raise AdminError(404, str(UnknownProfile(name, runtime.profile_names)), valid_profiles=runtime.profile_names)
    plan = daemon.router.effective_order(name, prof, runtime).explain()
    return {
        "name": name,
        "active": name == daemon.active_profile,
        "default": name == runtime.config.server.default_profile,
        "settings": prof.model_dump(),
        "effective_order": plan["candidates"],
        "skips": plan["skips"],
        "order_notes": plan["order"],
        "providers": [_provider_brief(runtime, p) for p in prof.providers],
        "routes": [r.model for r in runtime.config.routes if r.profile == name],
    }


def _provider_brief(runtime, name: str) -> dict:
    c = runtime.providers[name].cfg
    return {"name": name, "kind": c.kind, "base_url": c.base_url, "model": c.model, "paid": c.paid}


def create_admin_app(daemon, socket_path: Path) -> FastAPI:
    app = FastAPI(title="coderouterd admin", docs_url=None, redoc_url=None, openapi_url=None,
                  default_response_class=JSON)

    @app.exception_handler(AdminError)
    async def _admin_error(_request, exc: AdminError):
        return JSON({"error": str(exc), **exc.extra}, status_code=exc.status)

    @app.exception_handler(HTTPException)
    async def _http_error(request, exc: HTTPException):
        if exc.status_code == 404:
            message = f"no such admin endpoint: {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return JSON({"error": message}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        parts = [f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSON({"error": "; ".join(parts) or "invalid request"}, status_code=400)

    @app.exception_handler(Exception)
    async def _crash(_request, exc: Exception):
        log.exception("admin request failed")
        return JSON({"error": f"internal error in coderouterd: {type(exc).__name__}: {exc}"}, status_code=500)

    @app.get("/v1/status")
    async def status():
        _runtime(daemon)
        out = daemon.status()
        out["admin_socket"] = str(socket_path)
        out["api_version"] = API_VERSION
        return out

    @app.get("/v1/profiles")
    async def profiles():
        runtime = _runtime(daemon)
        return {"active": daemon.active_profile, "default": runtime.config.server.default_profile,
                "profiles": daemon.status()["profiles"]}

    @app.get("/v1/profiles/{name}")
    async def profile(name: str):
        return _profile_detail(daemon, name)

    @app.post("/v1/profile/use")
    async def use_profile(request: Request):
        body = await _json_body(request)
        name = body.get("name")
        if not isinstance(name, str) or not name:
            raise AdminError(400, "name: required, a profile name (string)")
        _runtime(daemon)
        try:
            old, new = daemon.use_profile(name, source="corectl")
        except UnknownProfile as e:
            raise AdminError(404, str(e), valid_profiles=e.valid) from None
        if old != new:
            log.info("active profile: %s -> %s (corectl)", old, new)
        return {"ok": True, "previous": old, "active": new}

    @app.post("/v1/reload")
    async def reload():
        _runtime(daemon)
        result = apply_reload(daemon, "corectl")
        result.setdefault("path", daemon.config_path)
        if not result.get("ok"):
            return JSON(result, status_code=422)
        return result

    @app.get("/v1/config/check")
    async def config_check():
        path = daemon.config_path
        if daemon.runtime is not None and daemon.runtime.loaded.is_embedded:
            return {"ok": True, "path": path, "message": "running on the embedded default"}
        try:
            loaded = await asyncio.to_thread(load_config, path)
        except ConfigError as e:
            return {"ok": False, "path": path, "error": str(e)}
        return {"ok": True, "path": loaded.path, "providers": sorted(loaded.model.providers),
                "profiles": sorted(loaded.model.profiles)}

    return app


class AdminServer:
    def __init__(self, daemon, path: Path, *, private_dir: bool = True) -> None:
        self.daemon = daemon
        self.path = path
        self.private_dir = private_dir
        self.server: ManagedServer | None = None
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None

    def bind(self) -> None:
        self._sock = bind_admin_socket(self.path, private_dir=self.private_dir)
        st = self.path.stat()
        self._inode = (st.st_dev, st.st_ino)
        config = uvicorn.Config(create_admin_app(self.daemon, self.path), loop="none", http="h11",
                                lifespan="off", access_log=False, log_level="warning",
                                timeout_graceful_shutdown=2, server_header=False, date_header=False)
        self.server = ManagedServer(config)

    async def serve(self) -> None:
        await self.server.serve(sockets=[self._sock])

    def request_stop(self, *, force: bool = False) -> None:
        if self.server is not None:
            self.server.should_exit = True
            if force:
                self.server.force_exit = True

    def remove_socket(self) -> None:
        """Unlink the socket file, but only if it is still ours (never one a successor daemon created)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self._inode is None:
            return
        try:
            st = self.path.lstat()
            if (st.st_dev, st.st_ino) == self._inode:
                self.path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            log.warning("cannot remove admin socket %s: %s", self.path, e)
        self._inode = None
