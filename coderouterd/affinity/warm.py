"""KV caches that outlive their llama-server: slots saved before a planned stop and in the background when a
lane goes idle, restored when the lane's next turn comes, on a disk budget, valid only for the server they
came from.

Only for managed servers (coderouterd gave them `--slot-save-path` in its state directory: it knows where
the files are). What a file is valid for (the key), which slots to save first and which files to prune are
pure (warm_files.py); this module asks the server (/props, POST /slots/N) and touches the files, always in a
thread. Costs (time and bytes of every save and restore) are counted per provider for `corectl status` and
/metrics.

Background saves never hold a slot: a save is only started while the server has no request in flight, one
at a time, and the slot stays free in the table. A request that arrives during one is sent at once and the
server runs it right after that one save (llama-server handles slot actions in its own task loop): it waits
for at most one file, never for a queue of them. Skipping the save instead would need a cancel the server
does not have.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from ..providers.limits import MAX_AUX_BYTES, MAX_IGNORED_BYTES, BodyTooLarge, read_at_most, read_capped
from ..tasks import TaskSet
from .slots import SlotTable
from .warm_files import (
    PREFIX,
    SIDECAR,
    CacheKey,
    SlotFile,
    is_ours,
    key_from_props,
    owner_tag,
    sidecar_matches,
    to_prune,
    to_save,
)

if TYPE_CHECKING:
    from ..providers.provider import Provider

log = logging.getLogger("coderouterd.affinity")

IDLE_TICK_S = 1.0
_UNKNOWN = CacheKey("", None, None, 0, "")  # a managed server whose /props said too little: nothing is kept


@dataclass(slots=True)
class WarmStats:
    saves: int = 0
    save_bytes: int = 0
    save_s: float = 0.0
    save_failures: int = 0
    restores: int = 0
    restore_bytes: int = 0
    restore_s: float = 0.0
    restore_failures: int = 0
    before_stop_saves: int = 0
    idle_saves: int = 0

    def as_dict(self) -> dict:
        return {"saves": self.saves, "save_bytes": self.save_bytes, "save_s": round(self.save_s, 3),
                "save_failures": self.save_failures, "restores": self.restores,
                "restore_bytes": self.restore_bytes, "restore_s": round(self.restore_s, 3),
                "restore_failures": self.restore_failures, "before_stop_saves": self.before_stop_saves,
                "idle_saves": self.idle_saves}


class Warm:
    def __init__(self, affinity, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.affinity = affinity  # its index (slot tables), config and persistence
        self.clock = clock
        self.wall = wall
        self.directory: Path | None = None
        self.provider: Callable[[str], Provider | None] = lambda name: None
        self.served_by: Callable[[str], list[str]] = lambda process: []
        self.managed: Callable[[str], bool] = lambda name: False
        self.stats: dict[str, WarmStats] = {}
        self.disk_bytes = 0  # what coderouterd's slot files take, as last measured
        self._keys: dict[str, CacheKey] = {}
        self._learning: dict[str, asyncio.Task] = {}
        self._tasks = TaskSet()
        self._idle: asyncio.Task | None = None
        self._fs_lock: asyncio.Lock | None = None
        self._stopped = False

    def wire(self, *, directory: Path | None, provider: Callable[[str], Provider | None],
             served_by: Callable[[str], list[str]], managed: Callable[[str], bool]) -> None:
        """The daemon's part: the slot directory it gave its servers, its providers by name, the providers a
        process serves, and which providers run on a process it manages."""
        self.directory, self.provider, self.served_by, self.managed = directory, provider, served_by, managed

    @property
    def cfg(self):
        return self.affinity.cfg

    def manages(self, name: str) -> bool:
        return self.directory is not None and self.managed(name)

    def start(self) -> None:
        """On the running loop: the background saves, and one pass of the disk budget over what a previous
        run left (stale keys, files no saved state refers to)."""
        if self._idle is None and self.directory is not None and not self._stopped:
            self._idle = self._tasks.spawn(self._idle_loop(), name="slot-idle-saves")
            self._tasks.spawn(self._prune(), name="slot-prune")

    async def stop(self) -> None:
        """The background saves end here; the saves before the servers stop (at shutdown, after this) still run."""
        self._stopped = True
        await self._tasks.close()

    def forget(self, providers) -> None:
        """The server started afresh: its key (model file, context, version) is asked again."""
        for name in providers:
            self._keys.pop(name, None)

    # -- a server's key, and which saved states survive it -------------------------------------------------

    async def prepare(self, provider: Provider, table: SlotTable) -> None:
        """Before a server's first placement: learn its key, name its files by it, and keep only the saved
        states whose files are on disk and were saved under that key. Once per server instance."""
        name = provider.name
        if name in self._keys or not self.manages(name) or self._stopped:
            return
        self.start()
        task = self._learning.get(name)
        if task is None or task.done():
            task = self._learning[name] = self._tasks.spawn(self._learn(provider, table), name=f"slot-key-{name}")
        await asyncio.shield(task)

    async def _learn(self, provider: Provider, table: SlotTable) -> None:
        try:
            await self._learn_key(provider, table)
        except Exception:
            # Awaited by a request's placement: whatever went wrong costs the saved states, never the request.
            log.exception("%s: could not check its saved slot states; none restored", provider.name)
            table.keep_saved(lambda f: False)
            self._keys[provider.name] = _UNKNOWN

    async def _learn_key(self, provider: Provider, table: SlotTable) -> None:
        props = await self._props(provider)
        key = None
        if props is not None:
            model = props.get("model_path")
            size = mtime = None
            if isinstance(model, str) and model:
                try:
                    st = await asyncio.to_thread(os.stat, model)
                    size, mtime = st.st_size, st.st_mtime_ns
                except OSError:
                    pass
            key = key_from_props(props, size, mtime)
        if key is None:
            # Nothing tells this server's files from another's: none from before is trusted, and what it saves
            # now is named so that no later key matches it.
            table.keep_saved(lambda f: False)
            table.file_prefix = f"{PREFIX}unkeyed-{owner_tag(provider.name)}"
            self._keys[provider.name] = _UNKNOWN
            return
        prefix = key.file_prefix(provider.name)
        table.file_prefix = prefix
        candidates = [sv.filename for sv in table.saved.values() if sv.filename.startswith(prefix)]
        assert self.directory is not None
        valid = await asyncio.to_thread(_valid_files, self.directory, candidates, key)
        dropped = table.keep_saved(lambda f: f in valid)
        if dropped:
            log.info("%s: %d saved slot state(s) not valid for this server (model, context or version changed, "
                     "or the file is gone): not restored", provider.name, len(dropped))
            self.affinity._persist_soon(provider.name)
        self._keys[provider.name] = key

    async def _props(self, provider: Provider) -> dict | None:
        import aiohttp

        try:
            async with asyncio.timeout(self.cfg.probe_timeout_s):
                async with provider.session().get(provider.root_url + "/props",
                                                  headers=provider.adapter.headers()) as r:
                    if r.status >= 300:
                        await read_at_most(r, MAX_IGNORED_BYTES)
                        return None
                    got = orjson.loads(await read_capped(r, MAX_AUX_BYTES, "/props answer"))
                    return got if isinstance(got, dict) else None
        except (aiohttp.ClientError, OSError, TimeoutError, orjson.JSONDecodeError, BodyTooLarge):
            return None

    # -- slot actions, measured ----------------------------------------------------------------------------

    async def action(self, provider: Provider, table: SlotTable, slot: int, action: str, filename: str, *,
                     inline: bool = False) -> int:
        """POST /slots/{slot}?action=… ; the HTTP status, 0 when the server could not be reached in time.
        Saving a long prompt's KV cache writes gigabytes: it gets the provider's first-byte timeout. After a
        save, the file's sidecar and the disk budget: in the background on a request's path, awaited
        (`inline`) for the saves made here (before a stop, the background ones)."""
        import aiohttp

        url = f"{provider.root_url}/slots/{slot}?action={action}"
        t0 = self.clock()
        body: dict = {}
        try:
            async with asyncio.timeout(provider.cfg.timeouts.first_byte):
                async with provider.session().post(url, json={"filename": filename},
                                                   headers=provider.adapter.headers()) as r:
                    status = r.status
                    raw = await read_at_most(r, MAX_IGNORED_BYTES)
        except (aiohttp.ClientError, OSError, TimeoutError):
            status, raw = 0, b""
        if 200 <= status < 300:
            try:
                got = orjson.loads(raw)
                body = got if isinstance(got, dict) else {}
            except orjson.JSONDecodeError:
                pass
        meta = self._count(provider, table, action, filename, status, body, self.clock() - t0)
        if meta is not None:
            if inline or self._stopped:  # after stop() (shutdown) nothing is left to run it later
                await self._after_save(filename, meta)
            else:
                self._tasks.spawn(self._after_save(filename, meta), name="slot-after-save")
        return status

    def _count(self, provider: Provider, table: SlotTable, action: str, filename: str, status: int, body: dict,
               elapsed: float) -> dict | None:
        """Counts the action; returns what the saved file's sidecar says (None: nothing to write)."""
        st = self.stats.setdefault(provider.name, WarmStats())
        ok = 200 <= status < 300
        if action == "save":
            if not ok:
                st.save_failures += 1
                return None
            written = body.get("n_written")
            st.saves += 1
            st.save_s += elapsed
            st.save_bytes += written if isinstance(written, int) else 0
            key = self._keys.get(provider.name)
            if self.manages(provider.name) and key is not None and key is not _UNKNOWN:
                lane = next((lane for lane, sv in table.saved.items() if sv.filename == filename), None)
                tokens = body.get("n_saved")
                return {"key": key.as_dict(),
                        "lane": hashlib.sha256(lane.encode()).hexdigest()[:12] if lane else None,
                        "tokens": tokens if isinstance(tokens, int) else 0, "saved_at": self.wall()}
        elif action == "restore":
            if not ok:
                st.restore_failures += 1
                return None
            read = body.get("n_read")
            st.restores += 1
            st.restore_s += elapsed
            st.restore_bytes += read if isinstance(read, int) else 0
        return None

    async def _after_save(self, filename: str, meta: dict) -> None:
        """The file private, its sidecar written, then the disk budget kept (in a thread, off the request)."""
        assert self.directory is not None
        await self._fs(_write_sidecar, self.directory, filename, meta)
        await self._prune()

    async def _fs(self, fn, *args):
        if self._fs_lock is None:
            self._fs_lock = asyncio.Lock()
        async with self._fs_lock:  # one thread at a time on the directory: a prune never races a sidecar
            return await asyncio.to_thread(fn, *args)

    async def _prune(self) -> None:
        if self.directory is None:
            return
        referenced = {sv.filename for p in self.affinity.index.providers.values() if p.slots is not None
                      for sv in p.slots.saved.values()}
        budget = int(self.cfg.max_saved_mb * 1024 * 1024)
        deleted, self.disk_bytes = await self._fs(_prune_dir, self.directory, referenced, budget)
        if not deleted:
            return
        for name, p in self.affinity.index.providers.items():
            if p.slots is not None and p.slots.keep_saved(lambda f: f not in deleted):
                self.affinity._persist_soon(name)
        log.info("slot files over max_saved_mb (%g MB): %d deleted", self.cfg.max_saved_mb, len(deleted))

    # -- saving -------------------------------------------------------------------------------------------

    async def save_slot(self, provider: Provider, table: SlotTable, slot: int) -> bool:
        fname = table.remember_save(slot)
        try:
            status = await self.action(provider, table, slot, "save", fname, inline=True)
        except BaseException:
            table.forget_saved(fname)
            raise
        if not 200 <= status < 300:
            if status == 501:  # started without --slot-save-path: stop trying
                table.can_save = False
            table.forget_saved(fname)
            return False
        self.affinity._persist_soon(provider.name)
        return True

    def _savable(self, name: str) -> tuple[Provider, SlotTable] | None:
        p = self.affinity.index.providers.get(name)
        table = p.slots if p is not None else None
        key = self._keys.get(name)
        provider = self.provider(name)
        if table is None or not table.can_save or key is None or key is _UNKNOWN or provider is None:
            return None
        return provider, table

    async def before_stop(self, process: str, reason: str) -> None:
        """The supervisor's hook before a planned stop: every idle slot holding a lane's prefix not yet on disk
        as it is, most valuable first, until `save_before_stop_s` is spent."""
        deadline = self.clock() + self.cfg.save_before_stop_s
        for name in self.served_by(process):
            found = self._savable(name)
            if found is None:
                continue
            provider, table = found
            todo = to_save(table, now=self.clock())
            if todo and await self._props(provider) is None:
                # A server restarted for not answering (self-healing) would spend the whole budget on timeouts.
                log.info("%s: not answering; its slots are not saved before it stops (%s)", name, reason)
                continue
            done = 0
            for sid in todo:
                left = deadline - self.clock()
                if left <= 0:
                    break
                try:
                    async with asyncio.timeout(left):
                        ok = await self.save_slot(provider, table, sid)
                except TimeoutError:
                    break
                if ok:
                    done += 1
                    self.stats.setdefault(name, WarmStats()).before_stop_saves += 1
            if todo:
                log.info("%s: saved %d of %d slot(s) before stopping (%s)", name, done, len(todo), reason)

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(IDLE_TICK_S if self.cfg.save_idle_after_s <= 0 else
                                min(IDLE_TICK_S, self.cfg.save_idle_after_s / 2))
            try:
                await self.idle_pass()
            except Exception:
                log.exception("background slot save failed")

    async def idle_pass(self) -> None:
        """One slot per server whose lanes went idle, while it serves nothing (see the module's note)."""
        after = self.cfg.save_idle_after_s
        if after <= 0:
            return
        for name in list(self.affinity.index.providers):
            found = self._savable(name)
            if found is None or self.affinity.index.in_flight(name):
                continue
            provider, table = found
            todo = to_save(table, now=self.clock(), idle_after_s=after)
            if todo and await self.save_slot(provider, table, todo[0]):
                self.stats.setdefault(name, WarmStats()).idle_saves += 1

    # -- visibility ---------------------------------------------------------------------------------------

    def status(self, name: str) -> dict | None:
        if not self.manages(name):
            return None
        st = self.stats.get(name) or WarmStats()
        key = self._keys.get(name)
        p = self.affinity.index.providers.get(name)
        table = p.slots if p is not None else None
        # Lanes whose slot holds more than their file: what a crash now would lose.
        unsaved = len(to_save(table, now=self.clock())) if table is not None and table.can_save else None
        return {**st.as_dict(), "disk_bytes": self.disk_bytes, "unsaved_lanes": unsaved,
                "key": key.digest() if key is not None and key is not _UNKNOWN else None}


# -- in a thread --------------------------------------------------------------------------------------------


def _read_sidecar(path: Path) -> dict | None:
    try:
        with open(path, "rb") as f:
            got = orjson.loads(f.read(MAX_IGNORED_BYTES))
        return got if isinstance(got, dict) else None
    except (OSError, orjson.JSONDecodeError):
        return None


def _valid_files(directory: Path, names: list[str], key: CacheKey) -> set[str]:
    return {n for n in names if (directory / n).is_file() and sidecar_matches(_read_sidecar(directory / (n + SIDECAR)),
                                                                              key)}


def _write_sidecar(directory: Path, filename: str, meta: dict) -> None:
    path = directory / filename
    try:
        os.chmod(path, 0o600)  # llama-server writes it with its umask; the directory is 0700 already
        tmp = directory / (filename + SIDECAR + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(orjson.dumps({**meta, "bytes": path.stat().st_size}))
        os.replace(tmp, directory / (filename + SIDECAR))
    except OSError as e:
        log.warning("slot file %s: %s", filename, e)


def _prune_dir(directory: Path, referenced: set[str], budget: int) -> tuple[set[str], int]:
    """(names deleted, bytes left) for coderouterd's files in `directory` (llama-server's own and the user's
    are never touched)."""
    files = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return set(), 0
    by_name = {e.name: e for e in entries}
    for e in entries:
        if not is_ours(e.name) or e.name.endswith(SIDECAR) or e.name.endswith(".tmp"):
            continue
        try:
            st = e.stat()
        except OSError:
            continue
        side = by_name.get(e.name + SIDECAR)
        meta = _read_sidecar(Path(side.path)) if side is not None else None
        size = st.st_size + (side.stat().st_size if side is not None else 0)
        tokens = meta.get("tokens") if meta is not None else 0
        files.append(SlotFile(e.name, size, st.st_mtime, tokens if isinstance(tokens, int) else 0,
                              e.name in referenced))
    # Sidecars whose file is gone are debris.
    for e in entries:
        if e.name.startswith(PREFIX) and e.name.endswith(SIDECAR) and e.name[:-len(SIDECAR)] not in by_name:
            _unlink(Path(e.path))
    deleted = set(to_prune(files, budget))
    for name in deleted:
        _unlink(directory / name)
        _unlink(directory / (name + SIDECAR))
    return deleted, sum(f.bytes for f in files if f.name not in deleted)


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as e:
        log.warning("could not delete %s: %s", path, e)
