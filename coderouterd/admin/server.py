"""The admin API's server: the FastAPI app of admin/api.py, served by its own uvicorn Server on a Unix socket, in
the daemon's loop. The server starts once the proxy listens, and FastAPI is imported on the first admin request
(LazyAdminApp), so neither readiness nor the first proxied requests pay for it.

Authorisation is the socket's file mode (0600) and its directory's (0700), as with tailscaled. Handlers are
`async def` on purpose: they run on the loop thread, so they never race the proxy over the daemon's state."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from .. import private_fs

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.types import Receive, Scope, Send

    from ..daemon import Daemon  # layer-ok: the composition root, handed in; annotation only

log = logging.getLogger("coderouterd.admin")

# sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS/BSD (both include the terminating NUL).
MAX_SOCKET_PATH = 103


def ensure_private_dir(path: Path, *, enforce: bool) -> None:
    """Create `path` as 0700; refuse (UnsafePath) one not ours or writable by others. With `enforce`, also
    tighten one we own that others can read: the admin socket's directory is what keeps other users out on
    systems that ignore a socket file's own mode."""
    st = private_fs.ensure_private_dir(path, tighten=enforce)
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077 and not enforce:
        log.warning("directory %s is readable by other users (mode %o); keep the admin socket in a "
                    "private directory", path, mode)


class AdminSocketError(Exception):
    pass


class ManagedServer(uvicorn.Server):
    """A uvicorn Server that leaves signals alone: serve.py owns SIGTERM/SIGINT/SIGHUP for both servers.
    (uvicorn's own capture re-raises the signal after shutdown, which would turn a clean stop into death
    by SIGTERM instead of exit status 0.)"""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def __init__(self, config: uvicorn.Config, *, ready: asyncio.Event | None = None,
                 on_shutdown: tuple = ()) -> None:
        super().__init__(config)
        self.ready = ready if ready is not None else asyncio.Event()  # set once it listens (serve.py awaits it)
        # Called as the drain begins: endless answers (the dashboard's live feed) end here, or uvicorn would wait
        # the whole drain timeout for them.
        self.on_shutdown = on_shutdown

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for callback in self.on_shutdown:
            callback()
        await super().shutdown(sockets=sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started:
            self.ready.set()


# -- the socket --------------------------------------------------------------------------------------------

def bind_admin_socket(path: Path, *, private_dir: bool) -> socket.socket:
    """A listening Unix socket at `path`, mode 0600. A socket file left by a crashed daemon is detected (nobody
    accepts on it) and replaced; a live one is never touched."""
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise AdminSocketError(f"admin socket path is too long for a Unix socket ({len(os.fsencode(path))} "
                               f"bytes, max {MAX_SOCKET_PATH}): {path}; set [admin] socket to a shorter path")
    try:
        ensure_private_dir(path.parent, enforce=private_dir)
    except OSError as e:
        # Another user who can write there could unlink our socket and put theirs in its place.
        raise AdminSocketError(f"cannot use {path.parent} for the admin socket: {e.strerror or e}; "
                               "set [admin] socket to a path in a directory only you can write to") from None
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

class LazyAdminApp:
    """The admin API's ASGI app, built (FastAPI imported, routes and models created) on the first admin request.

    Importing FastAPI and building the routes is ~0.3 s of CPU on this VM and ~9.6 MB (bench/README.md). Built
    at start-up, even in a thread, it would compete with the first proxied requests, which arrive just then;
    a daemon that only proxies never pays it at all. The first `corectl` call after a start waits for the
    build instead (~0.3 s); it runs in a thread so the loop keeps serving the proxy meanwhile."""

    def __init__(self, daemon: Daemon, path: Path) -> None:
        self._daemon = daemon
        self._path = path
        self._app: FastAPI | None = None
        self._building = asyncio.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # What a request just answered left to record is recorded before anyone reads.
        self._daemon.after_response.drain()
        app = self._app
        if app is None:
            async with self._building:
                app = self._app
                if app is None:
                    app = self._app = await asyncio.to_thread(self._build)
        await app(scope, receive, send)

    def _build(self) -> FastAPI:
        import gc

        from .api import create_admin_app

        app = create_admin_app(self._daemon, self._path)
        # Its ~26k long-lived objects (+50% of the daemon's heap; full collections 19 -> 31 ms) go where the
        # collector never looks, like the rest of start-up (interpreter.py). Freeze only, no collect: this can
        # run while requests are in flight, and a full collection would stall them.
        gc.freeze()
        return app


# -- the server -----------------------------------------------------------------------------------------------

class AdminServer:
    def __init__(self, daemon: Daemon, path: Path, *, private_dir: bool = True) -> None:
        self.daemon = daemon
        self.path = path
        self.private_dir = private_dir
        self.server: ManagedServer | None = None
        self.ready = asyncio.Event()  # set once the admin API answers on its socket
        self._sock: socket.socket | None = None
        self._inode: tuple[int, int] | None = None

    def bind(self) -> None:
        self._sock = bind_admin_socket(self.path, private_dir=self.private_dir)
        st = self.path.stat()
        self._inode = (st.st_dev, st.st_ino)
        self.server = None

    async def serve(self) -> None:
        # Started after the proxy serves; the socket is already listening (bind()), so a client that connects
        # meanwhile waits in its backlog. The FastAPI app itself is built on the first admin request.
        config = uvicorn.Config(LazyAdminApp(self.daemon, self.path), loop="none", http="h11",
                                lifespan="off", access_log=False, log_level="warning",
                                timeout_graceful_shutdown=2, server_header=False, date_header=False)
        assert self._sock is not None, "bind() comes first"
        self.server = ManagedServer(config, ready=self.ready)
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
