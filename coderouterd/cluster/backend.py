"""The state backend the daemon holds: what is shared, and with whom.

`LocalBackend` ([state] backend = "sqlite", the default): nothing leaves this machine; the budget is the local
ledger, breakers are local, the journal is the local SQLite one. `PostgresBackend`: the same local parts, plus
the shared ledger, shared breakers, the journal shipper and heartbeats. The daemon talks to either through
the same five calls (`start`, `stop`, `budget`, `attach_routing`, `status`) and never branches on the kind."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..config.schema import StateConfig
    from ..guards.budget import Budget
    from ..keys.registry import KeyRegistry
    from ..keys.service import KeyStorage
    from ..routing.state import RoutingState
    from ..state.events import Event
    from ..state.memory import MemoryStore
    from ..state.shared.shipper import Shipper
    from ..state.store import Store
    from ..tasks import TaskSet
    from .breakers import SharedBreakers
    from .budget import SharedBudget
    from .keys import SharedKeyStorage

log = logging.getLogger("coderouterd.shared")

# Start-up waits for the shared state's first connect-and-migrate this long at most (a database that does not
# answer at all, rather than refusing the connection, would otherwise hold it for the driver's connect timeout).
START_WAIT_S = 1.0


class StateBackend(Protocol):
    kind: str

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def budget(self, store: Store | MemoryStore, publish: Callable[[Event], None]) -> Budget | SharedBudget:
        """The budget the guard uses: the local ledger in `store`, or the shared ledger."""

    def attach_routing(self, routing: RoutingState) -> None:
        """Share the routing state's breakers (or not)."""

    def key_storage(self, store: Store | MemoryStore, registry: KeyRegistry) -> KeyStorage:
        """Where team keys live: the local store, or the shared database (every instance sees them)."""

    def status(self) -> dict[str, Any] | None: ...


class LocalBackend:
    kind = "sqlite"

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    def budget(self, store: Store | MemoryStore, publish: Callable[[Event], None]) -> Budget | SharedBudget:
        from ..guards.budget import Budget

        return Budget(store, publish=publish)

    def attach_routing(self, routing: RoutingState) -> None:
        return None

    def key_storage(self, store: Store | MemoryStore, registry: KeyRegistry) -> KeyStorage:
        from ..keys.local import LocalKeyStorage

        return LocalKeyStorage(store, registry)

    def status(self) -> dict[str, Any] | None:
        return None


def instance_name(state_cfg: StateConfig, state_dir: Path) -> str:
    """The configured name, else one made once (host name + a random suffix) and kept in the state directory:
    the shipped journal is keyed by (instance, seq), so a restart must come back under the same name."""
    if state_cfg.instance:
        return state_cfg.instance
    path = state_dir / "instance-id"
    try:
        name = path.read_text().strip()
        if name:
            return name
    except OSError:
        pass
    import secrets

    name = f"{socket.gethostname().split('.')[0][:40]}-{secrets.token_hex(3)}"
    try:
        path.write_text(name + "\n")
    except OSError as e:
        log.warning("shared state: cannot keep the instance name in %s (%s); it changes at each start", path, e)
    return name


class PostgresBackend:
    kind = "postgres"

    def __init__(self, state_cfg: StateConfig, *, state_dir: Path, version: str, tasks: TaskSet,
                 publish: Callable[[Event], None], journal_db: Path | None,
                 info: Callable[[], dict[str, Any]] | None = None) -> None:
        from ..state.shared.db import Database
        from ..state.shared.dsn import resolve
        from ..state.shared.instances import Instances

        self.cfg = state_cfg
        self.instance = instance_name(state_cfg, state_dir)
        self._tasks = tasks
        self._publish = publish
        self._journal_db = journal_db
        from .budget import new_boot

        self.boot = new_boot()
        self.db = Database(resolve(state_cfg), timeout_s=state_cfg.shared_timeout_ms / 1000.0, tasks=tasks)
        self.instances = Instances(self.db, instance=self.instance, heartbeat_s=state_cfg.heartbeat_s,
                                   lease_s=state_cfg.lease_s, version=version, info=info, boot=self.boot)
        self.shared_budget: SharedBudget | None = None
        self.breakers: SharedBreakers | None = None
        self.shipper: Shipper | None = None
        self.keys: SharedKeyStorage | None = None
        self.schema: tuple[int, int] | None = None
        self.ready = asyncio.Event()
        self._first_try = asyncio.Event()  # the first connect-and-migrate has succeeded or failed
        self.conflict: str | None = None  # the database refuses our schema: a person must fix it

    def budget(self, store: Store | MemoryStore, publish: Callable[[Event], None]) -> Budget | SharedBudget:
        from ..guards.budget import Budget
        from ..state.memory import MemoryStore
        from .budget import SharedBudget

        # The local Budget keeps only the configuration (caps, who bills, estimates): spend lives in the ledger,
        # and a local total beside it would publish warnings for this instance's part alone.
        local = Budget(MemoryStore())
        self.shared_budget = SharedBudget(local, self.db, instance=self.instance, lease_s=self.cfg.lease_s,
                                          tasks=self._tasks, live_instances=self.instances.live_count,
                                          publish=self._publish, poll_s=self.cfg.poll_s, boot=self.boot)
        return self.shared_budget

    def key_storage(self, store: Store | MemoryStore, registry: KeyRegistry) -> KeyStorage:
        from .keys import SharedKeyStorage

        self.keys = SharedKeyStorage(self.db, store, registry, tasks=self._tasks)
        return self.keys

    def attach_routing(self, routing: RoutingState) -> None:
        from .breakers import SharedBreakers

        self.breakers = SharedBreakers(self.db, routing, instance=self.instance, poll_s=self.cfg.poll_s,
                                       lease_s=self.cfg.lease_s, tasks=self._tasks)

    async def start(self) -> None:
        """Connect and migrate, waiting for the first attempt only (and START_WAIT_S at most): a database that
        answers joins before the first request, one that is down or refuses must not keep the proxy (and
        /healthz) from serving. It carries on with the local fallbacks and joins when the database answers."""
        await self.db.open()
        log.info("shared state: %s as instance %s", self.db.where, self.instance)
        self._tasks.spawn(self._join(), name="shared-join")
        try:
            await asyncio.wait_for(self._first_try.wait(), START_WAIT_S)
        except TimeoutError:
            pass
        if not self.ready.is_set() and self.conflict is None:
            log.warning("shared state: %s not reachable yet (%s); serving with the local fallbacks",
                        self.db.where, self.db.problem or "no answer yet")

    async def _join(self) -> None:
        from ..state.shared.db import Unavailable
        from ..state.shared.schema import SchemaConflict, SchemaTooNew, migrate

        delay = 0.5
        while True:
            try:
                async with await self.db.connect() as conn:
                    self.schema = await migrate(conn)
                break
            except (SchemaTooNew, SchemaConflict) as e:
                # The database answered and what it holds is wrong for us: say so, and do not retry forever.
                log.error("shared state: %s: %s; staying local", self.db.where, e)
                self.conflict = self.db.problem = str(e)
                self._first_try.set()
                return
            except Exception as e:
                self.db.problem = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]
                self._first_try.set()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
        try:
            await self.instances.beat_once()
        except Unavailable:
            pass
        if self.shared_budget is not None:
            await self.shared_budget.start()
        if self.breakers is not None:
            await self.breakers.start()
        if self.keys is not None:
            await self.keys.start()
        if self._journal_db is not None:
            from ..state.shared.shipper import Shipper

            self.shipper = shipper = Shipper(self.db, self._journal_db, instance=self.instance,
                                             interval_s=self.cfg.ship_interval_s)
            self._tasks.spawn(shipper.run(), name="shared-journal-ship")
        self._tasks.spawn(self.instances.run(), name="shared-heartbeat")
        self.ready.set()
        self._first_try.set()

    async def stop(self) -> None:
        if self.shared_budget is not None:
            await self.shared_budget.release_allowances()
            await self.shared_budget.drain(2.0)
        if self.ready.is_set():
            if self.shipper is not None:
                await self.shipper.ship_once(final=True)
            await self.instances.leave()
        if self.breakers is not None:
            await self.breakers.stop()
        await self.db.close()

    def status(self) -> dict[str, Any] | None:
        now = time.time()
        beat = self.instances.last_beat
        out = {
            "backend": "postgres",
            "where": self.db.where,
            "instance": self.instance,
            "up": self.db.up,
            "problem": self.db.problem,
            "down_since": self.db.down_since,
            "schema": self.schema[1] if self.schema else None,
            "heartbeat_age_s": round(now - beat, 3) if beat else None,
            "instances": self.instances.peers,
            "reclaimed": self.instances.reclaimed,
        }
        if self.shipper is not None:
            out["journal"] = self.shipper.status()
        if self.breakers is not None:
            out["breakers"] = self.breakers.status()
        if self.shared_budget is not None:
            out["budget"] = self.shared_budget.snapshot().get("shared")
        if self.keys is not None:
            out["keys"] = self.keys.status()
        return out


def start_problem(state_cfg: StateConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """Why this [state] cannot start (the driver is not installed, the DSN variable is unset), or None. Checked
    before the daemon starts, and by --check: a shared backend that cannot even be tried is a config error."""
    if state_cfg.backend != "postgres":
        return None
    from importlib.util import find_spec

    if find_spec("psycopg") is None or find_spec("psycopg_pool") is None:
        return ('[state] backend = "postgres" needs psycopg and psycopg-pool: '
                "pip install 'coderouter[postgres]'")
    from ..state.shared.dsn import DsnMissing, resolve

    try:
        resolve(state_cfg, environ)
    except DsnMissing as e:
        return str(e)
    return None


def build(state_cfg: StateConfig, **kw: Any) -> StateBackend:
    if state_cfg.backend == "postgres":
        return PostgresBackend(state_cfg, **kw)
    return LocalBackend()
