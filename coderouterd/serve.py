"""Running the daemon: the proxy's HTTP server on loopback, the admin API on its Unix socket, the config
watcher, signals and the graceful drain.

Order matters: the state lock is taken first (one daemon per state directory), then the admin socket is bound
and served, then the proxy starts. So by the time /healthz answers, corectl can already reach the daemon."""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from . import discovery
from .admin.server import AdminServer, AdminSocketError, ManagedServer, ensure_private_dir
from .config import LoadedConfig, admin_socket_path, state_dir
from .daemon import Daemon
from .ingress.dispatch import ProxyApp
from .ingress.protocol import Limits, make_protocol
from .reload import ConfigWatcher, apply_reload
from .state.dir_lock import LOCK_NAME, LockHeld, StateLock
from .tasks import TaskSet

if TYPE_CHECKING:
    from .ui.app import DashboardApp

log = logging.getLogger("coderouterd")


def _install_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


class _Signals:
    """SIGTERM/SIGINT: stop accepting, drain in-flight requests (bounded by drain_timeout_s), stop both
    servers. A second one forces the exit. SIGHUP: reload the config."""

    def __init__(self, daemon: Daemon, proxy: uvicorn.Server, admin: AdminServer) -> None:
        self.daemon = daemon
        self.proxy = proxy
        self.admin = admin
        self.stopping = False
        self._first_at = 0.0
        self._installed: list[int] = []

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stop, sig)
            self._installed.append(sig)
        loop.add_signal_handler(signal.SIGHUP, self.hangup)
        self._installed.append(signal.SIGHUP)

    def uninstall(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in self._installed:
            loop.remove_signal_handler(sig)
        self._installed.clear()

    def stop(self, sig: int) -> None:
        # A signal that arrives together with the first (`make run` under a supervisor that signals the whole
        # process group delivers two) is the same request, not an impatient second one.
        now = time.monotonic()
        if self.stopping and now - self._first_at < FORCE_AFTER_S:
            return
        force = self.stopping
        self.stopping = True
        self._first_at = now
        if force:
            log.warning("%s again: stopping without waiting for in-flight requests", signal.Signals(sig).name)
            self.proxy.force_exit = True
        else:
            log.info("%s: draining in-flight requests, then stopping", signal.Signals(sig).name)
        self.proxy.should_exit = True
        self.admin.request_stop(force=force)

    def hangup(self) -> None:
        if not self.daemon.started:
            log.warning("SIGHUP during startup ignored")
            return
        self.daemon.tasks.spawn(apply_reload(self.daemon, "SIGHUP"), name="reload:SIGHUP")


FORCE_AFTER_S = 1.0


def fallback_socket_path() -> Path:
    """Where the admin socket goes when the state directory cannot hold it: a private per-user directory."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"coderouter-{os.getuid()}" / "coderouterd.sock"

# Descriptors kept aside for everything but client connections: state files, logs, the admin socket, children.
_FDS_RESERVED = 100
_FD_TARGET = 65_536


def raise_fd_limit() -> int:
    """Raise the soft open-files limit towards the hard one (launchd starts agents at 256, many shells at
    1024: a few hundred idle connections used to make the daemon stop answering). Returns the soft limit."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 0
    want = _FD_TARGET if hard == resource.RLIM_INFINITY else min(hard, _FD_TARGET)
    if soft != resource.RLIM_INFINITY and soft < want:
        # macOS refuses values above OPEN_MAX (10240) even when the hard limit is "unlimited".
        for value in (want, 10_240):
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (min(value, want), hard))
                soft = min(value, want)
                break
            except (OSError, ValueError):
                continue
    log.info("open files limit: %s (hard %s)", soft, "unlimited" if hard == resource.RLIM_INFINITY else hard)
    return soft


def connections_for_fds(soft: int) -> int | None:
    """How many client connections the descriptor limit carries: each may hold an upstream connection too, and
    the answering reserve above the cap (ingress/protocol.py) needs room as well."""
    if soft <= 0 or soft == resource.RLIM_INFINITY:
        return None
    return max(8, (soft - _FDS_RESERVED) * 4 // 9)


async def serve(loaded: LoadedConfig) -> int:
    cfg = loaded.model
    sdir = state_dir(cfg)
    # A state directory we cannot use (read-only disk, wrong owner, a file in the way) costs persistence, never
    # service: state is kept in memory and `corectl status` says so.
    unusable = None
    try:
        ensure_private_dir(sdir, enforce=True)
    except OSError as e:
        unusable = f"state directory {sdir} is unusable: {e.strerror or e}"
    lock = StateLock(sdir / LOCK_NAME)
    if unusable is None:
        try:
            lock.acquire()
        except LockHeld as e:
            log.error("%s; not starting a second one", e)
            return 1
        except OSError as e:
            unusable = f"cannot take the state lock {sdir / LOCK_NAME}: {e.strerror or e}"
    if unusable is not None:
        log.warning("%s; serving with state in memory only (nothing persists until restarted with a usable "
                    "state directory)", unusable)
    limits = Limits(cfg.server, fd_cap=connections_for_fds(raise_fd_limit()))
    daemon = Daemon(loaded, state_unusable=unusable, connection_limits=limits)
    sock_path = admin_socket_path(cfg)
    if unusable is not None and sock_path.parent == sdir:
        sock_path = fallback_socket_path()
        log.warning("admin API moved to %s (use `corectl --socket %s`)", sock_path, sock_path)
    # The default socket lives in the state dir, which we own and keep private; a configured one may sit in a
    # directory shared with other things, which we only warn about.
    admin = AdminServer(daemon, sock_path, private_dir=sock_path.parent in (sdir, fallback_socket_path().parent))
    try:
        admin.bind()
    except AdminSocketError as e:
        lock.release()
        log.error("%s", e)
        return 1
    record = _discovery_record(daemon, loaded, sdir, sock_path)
    try:
        await asyncio.to_thread(discovery.publish, record)
    except OSError as e:  # corectl then needs --socket; the daemon itself serves on
        log.warning("cannot publish where this daemon is (%s): %s", discovery.discovery_dir(), e)
    try:
        return await _run(daemon, loaded, admin, limits)
    finally:
        await asyncio.to_thread(discovery.withdraw, daemon.pid)
        admin.remove_socket()
        lock.release()


def _discovery_record(daemon: Daemon, loaded: LoadedConfig, sdir, sock_path) -> dict:
    from .admin.version import API_VERSION  # not .admin.api: that is the FastAPI app, built on first use

    s = loaded.model.server
    host = f"[{s.host}]" if ":" in s.host else s.host
    return discovery.make_record(pid=daemon.pid, version=daemon.version, api_version=API_VERSION,
                                 socket=str(sock_path), config_path=loaded.path, embedded=loaded.is_embedded,
                                 state_dir=str(sdir), listen_url=f"http://{host}:{s.port}",
                                 started_at=daemon.started_at)


def _port_taken(host: str, port: int) -> bool:
    import errno
    import socket

    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, port))
    except OSError as e:
        return e.errno == errno.EADDRINUSE
    return False


def _dashboard(daemon: Daemon) -> DashboardApp:
    """The dashboard at /ui, made on its first request: its modules (the page, the views, the journal's trend
    readers) are imported then, not at start-up."""
    from .ui.app import DashboardApp

    return DashboardApp(daemon)


async def _run(daemon: Daemon, loaded: LoadedConfig, admin: AdminServer, limits: Limits) -> int:
    s = loaded.model.server
    config = uvicorn.Config(
        ProxyApp(daemon, dashboard=partial(_dashboard, daemon)), host=s.host, port=s.port, loop="none", http=make_protocol(limits), lifespan="on",
        access_log=False, log_level="warning",
        # uvicorn annotates both as int but uses them as asyncio timeouts, and our config takes fractions of a
        # second (float seconds, as every other timeout in [server]).
        timeout_graceful_shutdown=s.drain_timeout_s,  # type: ignore[arg-type]
        server_header=False, date_header=False, timeout_keep_alive=s.keep_alive_s,  # type: ignore[arg-type]
        proxy_headers=False,
    )
    proxy = ManagedServer(config, on_shutdown=(daemon.live.close,))
    signals = _Signals(daemon, proxy, admin)
    signals.install()
    # Not on the embedded default: there is no file to watch.
    watcher = None if loaded.is_embedded else ConfigWatcher(daemon, loaded.path)
    # The announcement and the admin API: owned here, ended (and awaited) before serve() returns.
    tasks = TaskSet()
    running: dict[str, asyncio.Task] = {}
    failed: list[str] = []
    tasks.spawn(_after_start(proxy, watcher, admin, tasks, running, failed, s.host, s.port, loaded.path),
                name="announce")
    try:
        try:
            await proxy.serve()
        except SystemExit:
            # uvicorn exits this way when the port is taken or startup failed; it has logged why, in its words.
            if _port_taken(s.host, s.port):
                log.error("port %d on %s is taken by another program (or another coderouterd): stop it, or "
                          "choose another port with --port, [server] port in the config, or "
                          "CODEROUTER_SERVER__PORT", s.port, s.host)
            return 1
        return 0 if proxy.started and not failed else 1
    finally:
        admin.request_stop()
        if watcher is not None:
            await watcher.stop()
        admin_task = running.get("admin")
        if admin_task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(admin_task), timeout=5)
            except (TimeoutError, asyncio.CancelledError):
                pass
            except Exception as e:
                log.error("admin API failed: %s", e)
        await tasks.close()
        signals.uninstall()
        log.info("coderouterd stopped")


async def _after_start(proxy: ManagedServer, watcher: ConfigWatcher | None, admin: AdminServer, tasks: TaskSet,
                       running: dict, failed: list, host: str, port: int, config_path: str) -> None:
    """Once the proxy serves (so the runtime a reload replaces exists): announce it, start the admin API and
    the config watcher. The proxy comes first: it is what a user is waiting for at login."""
    await proxy.ready.wait()
    log.info("coderouterd listening on http://%s:%s (config: %s)", host, port, config_path)
    admin_task = running["admin"] = tasks.spawn(admin.serve(), name="admin-api")
    if watcher is not None:
        watcher.start()
    admin_ready = tasks.spawn(admin.ready.wait(), name="admin-ready")
    await asyncio.wait((admin_task, admin_ready), return_when=asyncio.FIRST_COMPLETED)
    admin_ready.cancel()
    if admin_task.done():
        log.error("the admin API could not start: %r; stopping", admin_task.exception())
        failed.append("admin")
        proxy.should_exit = True
        return
    log.info("admin API on unix socket %s", admin.path)
