"""Running the daemon: the proxy's HTTP server on loopback, signals, graceful drain."""

from __future__ import annotations

import asyncio
import logging

import uvicorn

from .app import Daemon
from .config import LoadedConfig
from .ingress.app import ProxyApp

log = logging.getLogger("coderouterd")


def _install_uvloop() -> None:
    try:
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    except ImportError:
        pass


async def serve(loaded: LoadedConfig) -> int:
    daemon = Daemon(loaded)
    s = loaded.model.server
    config = uvicorn.Config(
        ProxyApp(daemon), host=s.host, port=s.port, loop="none", http="httptools", lifespan="on",
        access_log=False, log_level="warning", timeout_graceful_shutdown=s.drain_timeout_s,
        server_header=False, date_header=False, timeout_keep_alive=75,
    )
    server = uvicorn.Server(config)
    log.info("coderouterd listening on http://%s:%s (config: %s)", s.host, s.port, loaded.path)
    await server.serve()
    return 0 if server.started else 1
