"""Hot reload: watch the config file and apply changes through Daemon.reload() (atomic swap, old config kept
on any error). Also the one place that logs a reload's outcome, whatever triggered it (file, SIGHUP, corectl),
and the checks a new configuration goes through before it is swapped in."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .config.schema import ConfigModel

log = logging.getLogger("coderouterd.reload")
daemon_log = logging.getLogger("coderouterd")


class Reloadable(Protocol):
    """What a reload asks of the daemon (which imports this module for the checks below, so names it so)."""

    async def reload(self, source: str = ...) -> dict[str, Any]: ...

    def reload_failed(self, reason: str) -> None: ...


def warn_reload_risks(cfg: ConfigModel) -> None:
    """Settings that make a backend reload its model behind our back (logged at start and on each reload)."""
    from .affinity.ollama import reload_risks

    for w in reload_risks(cfg):
        daemon_log.warning("%s", w)


def listener_change_refused(listen: tuple[str, int], new_server) -> str | None:
    """Why a reloaded [server] section cannot be applied to the running listener, or None. The socket is bound
    once: a new host or port would silently not take effect, and dropping every key from a listener that
    stays bound beyond loopback would switch auth off for the network."""
    host, port = listen
    if (new_server.host, new_server.port) != (host, port):
        return (f"server.host/server.port changed ({host}:{port} -> {new_server.host}:{new_server.port}): "
                "restart needed; the running configuration is kept until then")
    if not new_server.api_keys and not _is_loopback(host):
        return (f"server.api_keys: removing every key while listening on {host!r} (not loopback) is refused; "
                "the running configuration is kept")
    return None


# The shared-state connection is made once at start (its pool, LISTEN connection, heartbeats, allowances).
_SHARED_KEYS = ("backend", "dsn", "dsn_env", "instance")


def shared_state_change_refused(old_state, new_state) -> str | None:
    """Why a reloaded [state] section cannot be applied: where state is shared is fixed for the process's life."""
    changed = [k for k in _SHARED_KEYS if getattr(old_state, k) != getattr(new_state, k)]
    if changed:
        return (f"state.{', state.'.join(changed)} changed: restart needed (the shared state connection is made "
                "at start); the running configuration is kept until then")
    return None


def _is_loopback(host: str) -> bool:
    from .config.schema import ServerConfig

    return ServerConfig(host=host, api_keys=["x"]).is_loopback()


def changed_sections(old, new) -> list[str]:
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


async def apply_reload(daemon: Reloadable, source: str) -> dict:
    result = await daemon.reload(source=source)
    if result.get("ok"):
        changed = result.get("changed")
        if result.get("message"):
            log.info("reload (%s): %s", source, result["message"])
        else:
            log.info("config reloaded (%s): %s", source, ", ".join(changed) if changed else "no changes")
    else:
        log.error("config reload (%s) rejected, keeping the previous configuration: %s", source,
                  result.get("error"))
    return result


class ConfigWatcher:
    """Watches the config file's directory, not the file: editors that save by writing a new file and renaming
    it over the old one replace the inode, which a watch on the file itself would lose."""

    def __init__(self, daemon: Reloadable, path: str, *, step_ms: int = 50, debounce_ms: int = 1600) -> None:
        self.daemon = daemon
        self.path = Path(path)
        self.step_ms = step_ms
        self.debounce_ms = debounce_ms
        # Checked by the watch thread every step: setting it ends the watch within step_ms.
        self._stop = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="config-watcher")

    async def stop(self) -> None:
        self._stop.set()
        task, self._task = self._task, None
        if task is not None:
            try:
                await asyncio.wait_for(task, timeout=5)
            except (TimeoutError, asyncio.CancelledError):
                pass
            except Exception as e:  # the watcher already logged; shutdown must go on
                log.debug("config watcher ended with %r", e)

    def _is_config(self, _change, changed_path: str) -> bool:
        return Path(changed_path).name == self.path.name

    async def _run(self) -> None:
        from watchfiles import awatch

        directory = self.path.parent
        log.info("watching %s for changes", self.path)
        try:
            async for _ in awatch(directory, watch_filter=self._is_config, step=self.step_ms,
                                  debounce=self.debounce_ms, stop_event=self._stop, recursive=False):
                try:
                    await apply_reload(self.daemon, "file change")
                except Exception as e:  # a bug in one reload must not end the watch: later edits still apply
                    self.daemon.reload_failed(f"internal error while reloading: {type(e).__name__}")
                    log.error("config reload (file change) failed: %s; still watching", type(e).__name__)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # losing the watch must not take the daemon down: SIGHUP and corectl still work
            log.error("config watcher stopped: cannot watch %s: %s (use `corectl reload` or SIGHUP)",
                      directory, e)
