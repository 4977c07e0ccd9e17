"""Composition root: builds every part of the daemon from the configuration and owns their lifetimes."""

from __future__ import annotations

import logging
import os
import time

from . import __version__
from .config import LoadedConfig
from .routing.executor import Exchange
from .routing.router import Router
from .runtime import Runtime, build_runtime

log = logging.getLogger("coderouterd")
req_log = logging.getLogger("coderouterd.request")


class Daemon:
    def __init__(self, loaded: LoadedConfig) -> None:
        self.version = __version__
        self.pid = os.getpid()
        self.started_at = time.time()
        self.runtime: Runtime | None = None
        self._loaded = loaded
        self.router = Router(loaded.model)
        self.active_profile = loaded.model.server.default_profile
        self.listen = (loaded.model.server.host, loaded.model.server.port)

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def startup(self) -> None:
        self.runtime = build_runtime(self._loaded)

    async def shutdown(self) -> None:
        if self.runtime is not None:
            for p in self.runtime.providers.values():
                await p.close()

    # -- request hooks --------------------------------------------------------------------------------------

    def guard_request(self, ex: Exchange):
        """An awaitable that answers True when a guard already answered the request, or None (no guard)."""
        return None

    def finish(self, ex: Exchange) -> None:
        """After every request: the one log line, and the record for journal, metrics and stats."""
        if ex.status >= 400 or len(ex.attempts) > 1 or ex.skips:
            req_log.info("%s %s profile=%s provider=%s status=%s attempts=%s", ex.req.request_id, ex.req.ingress,
                         ex.profile_name, ex.served_by, ex.status, ex.attempts_header())
        elif req_log.isEnabledFor(logging.DEBUG):
            req_log.debug("%s %s profile=%s provider=%s status=%s", ex.req.request_id, ex.req.ingress,
                          ex.profile_name, ex.served_by, ex.status)

    async def metrics_endpoint(self, scope, send) -> None:
        body = b"# metrics are served once the metrics registry is enabled\n"
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain; version=0.0.4")]})
        await send({"type": "http.response.body", "body": body})
