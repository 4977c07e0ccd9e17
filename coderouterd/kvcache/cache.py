"""KV caches that outlive their llama-server: slots saved before a planned stop and in the background when a
lane goes idle, restored when the lane's next turn comes, checked before they are restored and proven after,
on a disk budget, valid only for the server they came from.

Only managed servers' files are kept across stops (coderouterd gave them `--slot-save-path` in its state
directory: it knows where the files are). Every slot action goes through `execute`: a request's placement, the
background saver (kvcache/saver.py) and the save before a stop. What a file is valid for (the key), which
slots to save first and which files to prune are pure (kvcache/files.py); the server is asked through
servers/llamacpp.LlamaServer, the files touched in a thread (kvcache/disk.py). Costs (time and bytes of every
save and restore) and what went wrong are counted per provider for `corectl status` and /metrics.

Restores are checked, not trusted. A file whose size is not its sidecar's is refused before the server sees
it (a truncated file crashed the real llama-server on restore in an attack: a 502 and a restart). A restore
the server accepted is proven by the next answer's cached tokens (llama.cpp can report a restore that
restored nothing, llama.cpp #26676); one that did not take is counted, recorded as a cache bust of the turn
and never as a restore.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

from ..providers.server_http import llama_server
from ..tasks import TaskSet
from .costs import CopyCosts, cost_key
from .disk import check_restore, prune_dir, valid_files, write_sidecar
from .files import PREFIX, CacheKey, TableView, key_from_props, owner_tag, to_save
from .intent import BEFORE_STOP, IDLE, REQUEST, Intent, Outcome, Restore
from .saver import IdleSaver

if TYPE_CHECKING:
    from ..config.schema import AffinityConfig
    from ..providers.provider import Provider
    from ..servers.llamacpp import LlamaServer

T = TypeVar("T")
log = logging.getLogger("coderouterd.kvcache")

_UNKNOWN = CacheKey("", None, None, 0, "")  # a managed server whose /props said too little: nothing is kept
# A restore took when the answer reused at least this share of what the file held of the prompt.
PROOF_SHARE = 0.5


class Host(Protocol):
    """What kvcache reads of prefix affinity (affinity/service.py): the servers' slot tables and their
    persistence, and which servers are serving a request now."""

    def table(self, name: str) -> TableView | None: ...

    def names(self) -> list[str]: ...

    def in_flight(self, name: str) -> int: ...

    def persist_soon(self, name: str) -> None: ...


@dataclass(slots=True)
class KVStats:
    saves: int = 0
    save_bytes: int = 0
    save_s: float = 0.0
    save_failures: int = 0
    restores: int = 0  # proven by the answer's cached tokens
    restore_bytes: int = 0
    restore_s: float = 0.0
    restore_failures: int = 0  # the server failed it (or did not answer)
    restores_refused: int = 0  # refused before the server saw it: the file's size is not its sidecar's, or gone
    restores_not_taken: int = 0  # the server said yes, the next answer's cached tokens said no
    before_stop_saves: int = 0
    idle_saves: int = 0
    saves_discarded: int = 0  # deleted by the disk budget as soon as written (max_saved_mb below one file)
    copies: int = 0  # slots copied into another (a new lane seeded with a shared prefix), restores accepted

    def as_dict(self) -> dict:
        return {f.name: round(v, 3) if isinstance(v := getattr(self, f.name), float) else v for f in fields(self)}


class KVCache:
    def __init__(self, host: Host, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, publish: Callable | None = None) -> None:
        self.host = host
        self.clock = clock
        self.wall = wall
        self.publish = publish  # the bus: a restore refused or failed, a budget below one file (audited)
        self.cfg: AffinityConfig | None = None
        self.directory: Path | None = None
        self.provider: Callable[[str], Provider | None] = lambda name: None
        self.served_by: Callable[[str], list[str]] = lambda process: []
        self.managed: Callable[[str], bool] = lambda name: False
        self.stats: dict[str, KVStats] = {}
        self.costs: dict[str, CopyCosts] = {}  # what a save and a restore cost each server, learnt (kvcache/costs.py)
        self._cost_keys: dict[str, str] = {}  # server -> the key its costs are learnt for (costs.cost_key)
        # Costs learnt for a key this server has not named yet (persisted by a previous run, or kept over its
        # restart): its own once it names the same key at its first placement, dropped if it names another.
        self._stashed: dict[str, tuple[str, CopyCosts]] = {}
        self.disk_bytes = 0  # what coderouterd's slot files take, as last measured
        self._keys: dict[str, CacheKey] = {}
        self._learning: dict[str, asyncio.Task] = {}
        self._pending: dict[str, asyncio.Task] = {}  # sidecars being written, by file
        self._tasks = TaskSet()
        self._saver = IdleSaver(self, clock)
        self._idle: asyncio.Task | None = None
        self._fs_lock: asyncio.Lock | None = None
        self._stopped = False
        self._small_budget_told: set[str] = set()

    def configure(self, cfg: AffinityConfig) -> None:
        self.cfg = cfg

    def wire(self, *, directory: Path | None, provider: Callable[[str], Provider | None],
             served_by: Callable[[str], list[str]], managed: Callable[[str], bool]) -> None:
        """The daemon's part: the slot directory it gave its servers, its providers by name, the providers a
        process serves, and which providers run on a process it manages."""
        self.directory, self.provider, self.served_by, self.managed = directory, provider, served_by, managed

    def manages(self, name: str) -> bool:
        return self.directory is not None and self.managed(name)

    @property
    def idle_after_s(self) -> float:
        return self.cfg.save_idle_after_s if self.cfg is not None else 0.0

    def names(self) -> list[str]:
        return self.host.names()

    def busy(self, name: str) -> bool:
        return self.host.in_flight(name) > 0

    def start(self) -> None:
        """On the running loop: the background saves, and one pass of the disk budget over what a previous
        run left (stale keys, files no saved state refers to)."""
        if self._idle is None and self.directory is not None and not self._stopped:
            self._idle = self._tasks.spawn(self._saver.run(), name="slot-idle-saves")
            self._tasks.spawn(self._prune(), name="slot-prune")

    async def stop(self) -> None:
        """The background saves end here; the saves before the servers stop (at shutdown, after this) still run."""
        self._stopped = True
        await self._tasks.close()

    def forget(self, providers: Iterable[str]) -> None:
        """The server started afresh: its key (model file, context, version) is learnt again."""
        for name in providers:
            self._keys.pop(name, None)
            key, costs = self._cost_keys.pop(name, None), self.costs.pop(name, None)
            if key is not None and costs is not None:
                self._stashed[name] = (key, costs)  # its own again if it comes back with the same model

    def copy_s(self, name: str, tokens: float) -> float | None:
        """Seconds this server takes to save a slot of `tokens` and restore it into another, as measured on its
        own saves and restores; None until it has done both."""
        c = self.costs.get(name)
        return c.copy_s(tokens) if c is not None else None

    # -- a server's key, and which saved states survive it -------------------------------------------------

    async def prepare(self, provider: Provider, table: TableView, props: dict | None) -> None:
        """Before a server's first placement: learn its key from its /props (read once per server start, by
        discovery: providers/server_info.py), name its files by it, and keep only the saved states whose files
        are on disk and were saved under that key. Once per server instance."""
        name = provider.name
        if name not in self._cost_keys:
            self._adopt_costs(name, props)
        if name in self._keys or not self.manages(name) or self._stopped:
            return
        self.start()
        task = self._learning.get(name)
        if task is None or task.done():
            task = self._learning[name] = self._tasks.spawn(self._learn(provider, table, props),
                                                            name=f"slot-key-{name}")
        await asyncio.shield(task)

    async def _learn(self, provider: Provider, table: TableView, props: dict | None) -> None:
        try:
            await self._learn_key(provider, table, props)
        except Exception:
            # Awaited by a request's placement: whatever went wrong costs the saved states, never the request.
            log.exception("%s: could not check its saved slot states; none restored", provider.name)
            table.files.keep(lambda f: False)
            self._keys[provider.name] = _UNKNOWN

    async def _learn_key(self, provider: Provider, table: TableView, props: dict | None) -> None:
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
        files = table.files
        if key is None:
            # Nothing tells this server's files from another's: none from before is trusted, and what it saves
            # now is named so that no later key matches it.
            files.keep(lambda f: False)
            files.prefix = f"{PREFIX}unkeyed-{owner_tag(provider.name)}"
            self._keys[provider.name] = _UNKNOWN
            return
        prefix = key.file_prefix(provider.name)
        files.prefix = prefix
        candidates = [sv.filename for sv in files.saved.values() if sv.filename.startswith(prefix)]
        assert self.directory is not None
        valid = await asyncio.to_thread(valid_files, self.directory, candidates, key)
        dropped = files.keep(lambda f: f in valid)
        if dropped:
            log.info("%s: %d saved slot state(s) not valid for this server (model, context or version changed, "
                     "or the file is gone): not restored", provider.name, len(dropped))
            self.host.persist_soon(provider.name)
        self._keys[provider.name] = key

    # -- what copies cost, across restarts (kvcache/costs.py) ------------------------------------------------

    def _adopt_costs(self, name: str, props: dict | None) -> None:
        """Once per server instance, before its first slot action: the key its copy costs are learnt for, and
        the costs a previous run (or its previous process) learnt for that same key."""
        key = cost_key(props)
        if key is None:
            return  # asked again at the next placement (its /props may say more then)
        self._cost_keys[name] = key
        stashed = self._stashed.pop(name, None)
        if stashed is not None and stashed[0] == key and name not in self.costs:
            self.costs[name] = stashed[1]

    def costs_snapshot(self, name: str) -> dict | None:
        """For the server's persisted affinity snapshot (affinity/service.py, written by the store's thread)."""
        key, costs = self._cost_keys.get(name), self.costs.get(name)
        if key is not None and costs is not None:
            return costs.snapshot(key)
        stashed = self._stashed.get(name)  # not placed since the restart: kept for the next
        return stashed[1].snapshot(stashed[0]) if stashed is not None else None

    def restore_costs(self, name: str, snap: object) -> None:
        """At start-up, from the persisted snapshot: kept aside until the server names its key."""
        got = CopyCosts.from_snapshot(snap)
        if got is not None:
            self._stashed[name] = got

    # -- the one path for slot actions ---------------------------------------------------------------------

    async def execute(self, provider: Provider, intent: Intent) -> Outcome:
        """Save, then restore, as `intent` says. A save the server refuses with 501 (started without
        --slot-save-path) turns saving off for that server: the one place that rule is written."""
        out = Outcome()
        table = self.host.table(provider.name)
        if table is None:
            return out
        server = llama_server(provider)
        written: set[str] = set()
        for slot, fname in intent.saves:
            if fname is None:
                s = table.slots[slot]
                if s.lane is None:
                    continue
                fname = table.files.remember(s.lane, s.digests, s.ends)
            if not await self._save(provider, server, table, slot, fname, intent.why):
                out.save_failed = True
                break
            written.add(fname)
            out.saved += 1
        if out.saved:
            self.host.persist_soon(provider.name)
        if intent.restore is not None and table.files.can_save:
            slot, fname = intent.restore
            if fname in written or not any(f == fname for _, f in intent.saves):
                out.restore = await self._restore(provider, server, table, slot, fname, trusted=fname in written)
                if fname in written and out.restored:
                    self.stats.setdefault(provider.name, KVStats()).copies += 1
        return out

    async def _save(self, provider: Provider, server: LlamaServer, table: TableView, slot: int, fname: str,
                    why: str) -> bool:
        name = provider.name
        st = self.stats.setdefault(name, KVStats())
        t0 = self.clock()
        try:
            # Saving a long prompt's KV cache writes gigabytes: it gets the provider's first-byte timeout.
            ans = await server.save(slot, fname, provider.cfg.timeouts.first_byte)
        except BaseException:
            table.files.forget(fname)  # cancelled (a stop's deadline): the file may be half written
            raise
        if not ans.ok:
            st.save_failures += 1
            if ans.status == 501:  # started without --slot-save-path: stop trying
                table.files.can_save = False
            table.files.forget(fname)
            return False
        st.saves += 1
        took = self.clock() - t0
        st.save_s += took
        self.costs.setdefault(name, CopyCosts()).save.add(ans.count("n_saved"), took)
        st.save_bytes += ans.count("n_written")
        if why == IDLE:
            st.idle_saves += 1
        elif why == BEFORE_STOP:
            st.before_stop_saves += 1
        if self.manages(name):
            lane = table.files.lane_of(fname)
            key = self._keys.get(name)
            meta = {"key": key.as_dict() if key is not None and key is not _UNKNOWN else None,
                    "lane": hashlib.sha256(lane.encode()).hexdigest()[:12] if lane else None,
                    "tokens": ans.count("n_saved"), "saved_at": self.wall()}
            if why != REQUEST or self._stopped:  # after stop() (shutdown) nothing is left to run it later
                await self._after_save(name, fname, meta)
            else:  # off the request's path; a restore of this file waits for it (`_restore`)
                task = self._pending[fname] = self._tasks.spawn(self._after_save(name, fname, meta),
                                                                name="slot-after-save")
                task.add_done_callback(self._written)
        return True

    def _written(self, task: asyncio.Task) -> None:
        for fname, t in list(self._pending.items()):
            if t is task:
                del self._pending[fname]

    async def _restore(self, provider: Provider, server: LlamaServer, table: TableView, slot: int, fname: str,
                       *, trusted: bool) -> Restore:
        """`trusted`: written by the server within this intent (a shared prefix copied through a scratch file)."""
        name = provider.name
        st = self.stats.setdefault(name, KVStats())
        tokens = 0
        if self.manages(name) and not trusted:
            pending = self._pending.get(fname)
            if pending is not None:
                await asyncio.shield(pending)
            assert self.directory is not None
            problem, tokens = await self._fs(check_restore, self.directory, fname)
            if problem is not None:
                st.restores_refused += 1
                table.files.forget(fname)
                self.host.persist_soon(name)
                log.warning("%s: slot file %s not restored: %s", name, fname, problem)
                return Restore(fname, tokens, problem=problem, outcome="refused")
        t0 = self.clock()
        ans = await server.restore(slot, fname, provider.cfg.timeouts.first_byte)
        took = self.clock() - t0
        st.restore_s += took
        if ans.ok:
            self.costs.setdefault(name, CopyCosts()).restore.add(ans.count("n_restored"), took)
            self.host.persist_soon(name)  # the learnt cost with it
        if not ans.ok:
            st.restore_failures += 1
            table.files.forget(fname)
            self.host.persist_soon(name)
            return Restore(fname, tokens, problem="no answer" if ans.status == 0 else f"HTTP {ans.status}",
                           outcome="failed")
        st.restore_bytes += ans.count("n_read")
        return Restore(fname, ans.count("n_restored") or tokens)

    def prove(self, name: str, restore: Restore, *, cached_tokens: int, predicted_tokens: int | None) -> bool:
        """Whether a restore the server accepted took, by the answer's cached tokens: at least PROOF_SHARE of
        what the file held of this prompt (the lesser of what the server restored and what affinity predicted
        the file shares with the prompt). Counted either way; only a restore that took counts as one."""
        held = [n for n in (restore.tokens, predicted_tokens) if n]
        expected = min(held) if held else 0
        taken = cached_tokens >= PROOF_SHARE * expected
        restore.outcome = "taken" if taken else "did not take"
        restore.expected_tokens, restore.cached_tokens = expected, cached_tokens
        st = self.stats.setdefault(name, KVStats())
        if taken:
            st.restores += 1
        else:
            st.restores_not_taken += 1
            log.warning("%s: slot file %s restored, but the answer reused %d of the %d tokens it held: the restore "
                        "did not take", name, restore.filename, cached_tokens, expected)
        return taken

    async def _after_save(self, name: str, filename: str, meta: dict) -> None:
        """The file private, its sidecar written, then the disk budget kept (in a thread, off the request)."""
        assert self.directory is not None
        await self._fs(write_sidecar, self.directory, filename, meta)
        deleted = await self._prune()
        if filename in deleted:
            # The budget is smaller than this one file: every save like it is written and deleted at once.
            self.stats.setdefault(name, KVStats()).saves_discarded += 1
            if name not in self._small_budget_told:
                self._small_budget_told.add(name)
                log.warning("%s: a slot file was deleted as soon as it was saved: affinity.max_saved_mb (%g MB) is "
                            "smaller than one of its slot files", name, self.cfg.max_saved_mb if self.cfg else 0)

    async def _fs(self, fn: Callable[..., T], *args: object) -> T:
        if self._fs_lock is None:
            self._fs_lock = asyncio.Lock()
        async with self._fs_lock:  # one thread at a time on the directory: a prune never races a sidecar
            return await asyncio.to_thread(fn, *args)

    async def _prune(self) -> set[str]:
        if self.directory is None or self.cfg is None:
            return set()
        tables = [(n, t) for n in self.host.names() if (t := self.host.table(n)) is not None]
        referenced = {sv.filename for _, t in tables for sv in t.files.saved.values()}
        budget = int(self.cfg.max_saved_mb * 1024 * 1024)
        deleted, self.disk_bytes = await self._fs(prune_dir, self.directory, referenced, budget)
        if not deleted:
            return set()
        for name, t in tables:
            if t.files.keep(lambda f: f not in deleted):
                self.host.persist_soon(name)
        log.info("slot files over max_saved_mb (%g MB): %d deleted", self.cfg.max_saved_mb, len(deleted))
        return deleted

    # -- saving before a stop, and in the background ----------------------------------------------------------

    def savable(self, name: str) -> tuple[Provider, TableView] | None:
        """A managed server whose files are keyed and which still saves: its provider and slot table."""
        table = self.host.table(name)
        key = self._keys.get(name)
        provider = self.provider(name)
        if table is None or not table.files.can_save or key is None or key is _UNKNOWN or provider is None:
            return None
        return provider, table

    async def idle_pass(self) -> None:
        """One pass of the background saver (kvcache/saver.py)."""
        await self._saver.one_pass()

    async def before_stop(self, process: str, reason: str) -> None:
        """The supervisor's hook before a planned stop: every idle slot holding a lane's prefix not yet on disk
        as it is, most valuable first, until `save_before_stop_s` is spent."""
        if self.cfg is None:
            return
        deadline = self.clock() + self.cfg.save_before_stop_s
        for name in self.served_by(process):
            found = self.savable(name)
            if found is None:
                continue
            provider, table = found
            todo = to_save(table, now=self.clock())
            if todo and not await self._answers(provider):
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
                        done += (await self.execute(provider, Intent(BEFORE_STOP, ((sid, None),)))).saved
                except TimeoutError:
                    break
            if todo:
                log.info("%s: saved %d of %d slot(s) before stopping (%s)", name, done, len(todo), reason)

    async def _answers(self, provider: Provider) -> bool:
        import aiohttp

        try:
            async with asyncio.timeout(self.cfg.probe_timeout_s if self.cfg is not None else 2.0):
                return await llama_server(provider).props() is not None
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    def tell_budget(self, notes: dict[str, str]) -> None:
        """At start-up: the processes one of whose slot files would not fit the disk budget
        (supervise/from_config.slot_budget_notes), each said once in the log and the audit log."""
        from ..state.events import SlotBudgetTooSmall

        for process, note in notes.items():
            log.warning("%s", note)
            if self.publish is not None:
                self.publish(SlotBudgetTooSmall(process=process, note=note))

    # -- visibility ---------------------------------------------------------------------------------------

    def status(self, name: str) -> dict | None:
        if not self.manages(name):
            return None
        st = self.stats.get(name) or KVStats()
        key = self._keys.get(name)
        table = self.host.table(name)
        # Lanes whose slot holds more than their file: what a crash now would lose.
        unsaved = len(to_save(table, now=self.clock())) if table is not None and table.files.can_save else None
        costs = self.costs.get(name)
        return {**st.as_dict(), **(costs or CopyCosts()).as_dict(), "disk_bytes": self.disk_bytes,
                "unsaved_lanes": unsaved,
                "key": key.digest() if key is not None and key is not _UNKNOWN else None}
