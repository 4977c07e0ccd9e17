"""Composition root: builds every part of the daemon from the configuration and owns their lifetimes."""

from __future__ import annotations

import logging
import os
import time

from . import __version__
from .config import ConfigError, LoadedConfig, load_config
from .routing.executor import Exchange
from .routing.router import Router
from .runtime import Runtime, UnknownProfile, build_runtime

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
        self.last_reload_error: str | None = None

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def startup(self) -> None:
        self.runtime = build_runtime(self._loaded)

    # -- control (called by the admin API) -------------------------------------------------------------------

    @property
    def config_path(self) -> str:
        return self._loaded.path

    def use_profile(self, name: str, source: str = "corectl") -> tuple[str, str]:
        """Switch the active profile for new requests. Returns (old, new). Raises UnknownProfile."""
        runtime = self.runtime
        if name not in runtime.config.profiles:
            raise UnknownProfile(name, runtime.profile_names)
        old = self.active_profile
        self.active_profile = name
        self.persist_active_profile()
        return old, name

    def persist_active_profile(self) -> None:
        """Hook for the state store: overridden by wiring in startup once a store exists."""

    def reload(self, source: str = "corectl") -> dict:
        """Re-read the config file and swap it in atomically. The old config stays on any error."""
        if self._loaded.is_embedded:
            return {"ok": True, "changed": [], "message": "running on the embedded default; nothing to reload"}
        try:
            loaded = load_config(self._loaded.path)
        except ConfigError as e:
            self.last_reload_error = str(e)
            return {"ok": False, "error": str(e)}
        old = self.runtime
        changed = _changed_sections(old.config, loaded.model)
        self.runtime = build_runtime(loaded, previous=old)
        self._loaded = loaded
        self.router.reconfigure(loaded.model)
        self.last_reload_error = None
        if self.active_profile not in loaded.model.profiles:
            fallback = loaded.model.server.default_profile
            log.warning("active profile %r disappeared in the reload; falling back to %r", self.active_profile, fallback)
            self.active_profile = fallback
            self.persist_active_profile()
        return {"ok": True, "changed": changed}

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


def _changed_sections(old, new) -> list[str]:
    """Top-level keys (and provider/profile names) whose values differ: for the audit log and corectl."""
    changed = []
    a, b = old.model_dump(), new.model_dump()
    for key in sorted(set(a) | set(b)):
        if key in ("providers", "profiles", "processes"):
            for name in sorted(set(a.get(key, {})) | set(b.get(key, {}))):
                if a.get(key, {}).get(name) != b.get(key, {}).get(name):
                    changed.append(f"{key}.{name}")
        elif a.get(key) != b.get(key):
            changed.append(key)
    return changed
