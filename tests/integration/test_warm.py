"""Slot caches that outlive the server (kvcache/cache.py) against the fake llama-server on a loopback socket,
writing real slot files: saved before a planned stop, restored at the lane's next turn after a restart of
the server or of the daemon (its map of saved lanes persisted), saved in the background when a lane goes
idle, never restored for another model or context, within the disk budget, and correct on a state
directory full of stale files."""

from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path

from coderouterd.affinity.service import Affinity
from coderouterd.config import parse_config_text
from coderouterd.providers.provider import Provider
from coderouterd.routing.request import ClientRequest
from coderouterd.translate.anthropic_request_to_openai import request_to_openai
from tests.fakes.runner import FakeServer
from tests.support.claude_sessions import Session

CFG = """
[providers.p]
kind = "openai"
base_url = "%s/v1"
[profiles.default]
providers = ["p"]
[affinity]
clone_min_tokens = 100000
"""


class _Done:
    """What `finish` reads from a strategy: the fake's own timings for the turn."""

    upstream_wire = "openai"
    raw_usage = None

    def __init__(self, timings: dict | None = None) -> None:
        self.timings = timings
        n = (timings or {}).get("prompt_n", 10) + (timings or {}).get("cache_n", 0)
        self.usage = {"input_tokens": n, "cache_read_input_tokens": 0}


def _req(s: Session) -> ClientRequest:
    body = s.main_body()
    return ClientRequest(ingress="anthropic", body=body, raw=b"", headers=s.headers, stream=False,
                         model=body["model"], request_id="r")


class World:
    """One managed fake llama-server (restartable on its port, same save directory), and the daemon's
    prefix affinity wired as the daemon wires it; `now` is the affinity's clock."""

    def __init__(self, tmp: Path, *, n_slots: int = 2, extra: str = "") -> None:
        self.tmp = tmp
        self.dir = tmp / "slots"
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self.model = tmp / "coder.gguf"
        self.model.write_bytes(b"weights")
        self.n_slots = n_slots
        self.extra = extra
        self.fake = self._fake(port=0)
        self.now = 0.0
        # Requests in flight per provider: the upstream's one count in the daemon (upstream/upstream.py's Lease),
        # which affinity reads; here the scenario counts them itself.
        self.in_flight: dict[str, int] = {}
        self.aff = self.provider = None
        self.cached: list[int] = []  # what the server reported it reused, per turn

    def _fake(self, port: int, **kw) -> FakeServer:
        opts = {"n_slots": self.n_slots, "n_ctx": 1 << 20, "slot_save_path": str(self.dir),
                "model_path": str(self.model), **kw}
        return FakeServer("llamacpp", name="warm", port=port, **opts).start()

    def restart_server(self, **kw) -> None:
        """The process stops and a new one takes its port: empty slots, the files on disk stay."""
        port = self.fake.port
        self.fake.stop()
        self.fake = self._fake(port=port, **kw)

    def daemon(self, snapshot: dict | None = None) -> Affinity:
        cfg = parse_config_text(CFG % self.fake.url + self.extra, "t")
        self.aff = aff = Affinity(cfg, clock=lambda: self.now, in_flight=lambda n: self.in_flight.get(n, 0))
        if snapshot is not None:
            aff.restore({"p": snapshot})
        self.provider = Provider("p", cfg.providers["p"])
        aff.warm.wire(directory=self.dir, provider=lambda n: self.provider if n == "p" else None,
                      served_by=lambda proc: ["p"] if proc == "llama" else [], managed=lambda n: n == "p")
        return aff

    async def turn(self, s: Session, *, advance: bool = True):
        """One turn, sent to the server on the slot affinity chose (so its slot really holds the prompt)."""
        t = self.aff.ticket(_req(s))
        placed = await self.aff.place(t, self.provider)
        body, _ = request_to_openai(t.canonical, "m", stream=False)
        async with self.provider.session().post(self.fake.url + "/v1/chat/completions",
                                                json={**body, **placed.fields}) as r:
            assert r.status == 200, await r.text()
            got = await r.json()
        self.cached.append(got["timings"]["cache_n"])
        self.aff.finish(t, placed, self.provider, ok=True, strategy=_Done(got["timings"]))
        if advance:
            s.advance()
        return t, placed

    async def close(self) -> None:
        await self.aff.stop()
        await self.provider.close()

    def files(self) -> list[str]:
        return sorted(p.name for p in self.dir.iterdir())

    def stop(self) -> None:
        self.fake.stop()


def _run(world: World, scenario):
    async def go():
        try:
            return await scenario()
        finally:
            await world.close()

    try:
        return asyncio.run(go())
    finally:
        world.stop()


def test_slots_saved_before_a_stop_come_back_after_the_daemon_and_the_server_restart(tmp_path):
    w = World(tmp_path)
    a, b = Session(1), Session(2)

    async def first_life():
        w.daemon()
        for s in (a, b, a, b):
            await w.turn(s)
        assert w.files() == []  # two lanes on two slots: nothing evicted, nothing saved yet
        await w.aff.warm.before_stop("llama", "shutdown")
        st = w.aff.warm.status("p")
        assert st["before_stop_saves"] == 2 and st["saves"] == 2 and st["save_bytes"] > 0
        # Saved as they are: a second stop right after has nothing to add.
        await w.aff.warm.before_stop("llama", "restart")
        assert w.aff.warm.status("p")["saves"] == 2
        return w.aff.index.snapshot("p")

    snap = _run(w, first_life)
    names = w.files()
    bins = [n for n in names if n.endswith(".bin")]
    assert len(bins) == 2 and sorted(n + ".json" for n in bins) == [n for n in names if n.endswith(".json")]
    for n in names:  # KV caches hold the conversation: private files
        assert stat.S_IMODE(os.stat(w.dir / n).st_mode) == 0o600
    assert all(n.startswith("cr-") for n in names)

    w.fake = w._fake(port=w.fake.port)  # a new server process: empty slots

    async def second_life():
        aff = w.daemon(snap)
        aff.server_restarted(["p"])  # the supervisor's STARTED event
        t, placed = await w.turn(a, advance=False)
        assert "restored the lane's saved state" in t.placement_why
        assert placed.predicted_bytes > 0.5 * t.prompt.size
        restores = [x for x in w.fake.fake.slot_actions if x[0] == "restore"]
        assert len(restores) == 1 and restores[0][2] in bins
        assert w.cached[-1] > 0.5 * w.fake.fake.log[-1]["n_prompt"]  # the server really reused it
        st = aff.warm.status("p")
        assert st["restores"] == 1 and st["restore_failures"] == 0 and st["restore_bytes"] > 0

    _run(w, second_life)


def test_an_idle_lane_is_saved_in_the_background_and_a_crash_loses_only_later_turns(tmp_path):
    w = World(tmp_path, extra="save_idle_after_s = 10\n")
    a, b = Session(3), Session(4)

    async def scenario():
        w.daemon()
        await w.turn(a)
        w.now = 5.0
        await w.aff.warm.idle_pass()
        assert w.files() == []  # idle 5 s of 10
        # A request in flight on the server: no background save starts (it would delay the request).
        tb = w.aff.ticket(_req(b))
        w.in_flight["p"] = 1  # its lease has begun
        pb = await w.aff.place(tb, w.provider)
        w.now = 20.0
        await w.aff.warm.idle_pass()
        assert w.files() == []
        w.aff.finish(tb, pb, w.provider, ok=True, strategy=_Done())
        w.in_flight["p"] = 0  # and ended
        b.advance()
        assert w.aff.warm.status("p")["unsaved_lanes"] == 2
        await w.aff.warm.idle_pass()  # one slot a pass: a's (idle 20 s; b's was just used)
        assert len([n for n in w.files() if n.endswith(".bin")]) == 1
        assert w.aff.warm.status("p")["idle_saves"] == 1
        assert w.aff.warm.status("p")["unsaved_lanes"] == 1  # b's: what a crash now would lose
        await w.aff.warm.idle_pass()
        assert len([n for n in w.files() if n.endswith(".bin")]) == 1  # a: saved as it is; b: not idle yet
        # kill -9 of the server: nothing saved at that moment; the restarted one gets a's saved prefix back.
        w.restart_server()
        w.aff.server_restarted(["p"])
        t, placed = await w.turn(a, advance=False)
        assert "restored" in t.placement_why and placed.predicted_bytes > 0
        assert w.cached[-1] > 0

    _run(w, scenario)


def test_files_saved_for_another_model_or_context_are_never_restored(tmp_path):
    w = World(tmp_path)
    a = Session(5)

    async def save_one():
        w.daemon()
        await w.turn(a)
        await w.aff.warm.before_stop("llama", "reload")
        return w.aff.index.snapshot("p")

    snap = _run(w, save_one)
    assert len([n for n in w.files() if n.endswith(".bin")]) == 1

    for change in ({"model": True}, {"n_ctx": 1 << 19}):
        if change.get("model"):
            os.utime(w.model, ns=(1, 1))  # the same path, another file: another key
        w.fake = w._fake(port=w.fake.port, **({"n_ctx": change["n_ctx"]} if "n_ctx" in change else {}))

        async def after(snap=snap):
            aff = w.daemon(snap)
            aff.server_restarted(["p"])
            t, placed = await w.turn(a, advance=False)
            assert "restored" not in t.placement_why
            assert not [x for x in w.fake.fake.slot_actions if x[0] == "restore"]
            assert aff.index.provider("p").slots.saved == {}

        _run(w, after)
        # What the server itself says of such a file: refused, as the real one refuses another model's.
        w.fake = w._fake(port=w.fake.port, model_path=str(tmp_path / "other.gguf"))
        import httpx

        name = next(n for n in w.files() if n.endswith(".bin"))
        r = httpx.post(f"{w.fake.url}/slots/0?action=restore", json={"filename": name})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        w.fake.stop()


def test_a_saved_file_gone_from_disk_is_not_restored(tmp_path):
    w = World(tmp_path)
    a = Session(6)

    async def save_one():
        w.daemon()
        await w.turn(a)
        await w.aff.warm.before_stop("llama", "idle")
        return w.aff.index.snapshot("p")

    snap = _run(w, save_one)
    for n in w.files():
        if n.endswith(".bin"):
            os.unlink(w.dir / n)
    w.fake = w._fake(port=w.fake.port)

    async def after():
        aff = w.daemon(snap)
        aff.server_restarted(["p"])
        t, _ = await w.turn(a, advance=False)
        assert "restored" not in t.placement_why and not w.fake.fake.slot_actions

    _run(w, after)


def test_the_disk_budget_holds_oldest_deleted_first(tmp_path):
    # Each file here is ~70 KB: a budget for one or two of three.
    w = World(tmp_path, n_slots=3, extra="max_saved_mb = 0.15\n")
    sessions = [Session(10 + i) for i in range(3)]

    async def scenario():
        w.daemon()
        for i, s in enumerate(sessions):
            w.now = float(i)
            await w.turn(s)
        sizes = {}
        await w.aff.warm.before_stop("llama", "shutdown")
        for n in w.files():
            sizes[n] = os.stat(w.dir / n).st_size
        assert sum(sizes.values()) <= 0.15 * 1024 * 1024
        kept = [n for n in sizes if n.endswith(".bin")]
        assert 1 <= len(kept) < 3 and w.aff.warm.status("p")["saves"] == 3
        table = w.aff.index.provider("p").slots
        assert len(table.saved) == len(kept)
        # What was deleted is no longer offered for a restore.
        assert {sv.filename for sv in table.saved.values()} <= set(sizes)
        assert w.aff.warm.status("p")["disk_bytes"] == sum(sizes.values())

    _run(w, scenario)


def test_a_daemon_started_on_a_directory_full_of_stale_files_stays_correct(tmp_path):
    w = World(tmp_path, extra="max_saved_mb = 0.15\n")  # this lane's file (~70 KB) and a little more
    # A previous life's files under another key (another model), with their sidecars; a file of the user's own.
    for i in range(30):
        (w.dir / f"cr-0123456789ab-lane-{i}.bin").write_bytes(b"x" * 4096)
        (w.dir / f"cr-0123456789ab-lane-{i}.bin.json").write_bytes(b'{"key": {"model": "/old.gguf"}, "tokens": 9}')
    (w.dir / "cr-0123456789ab-orphan.bin.json").write_bytes(b"{}")  # a sidecar without its file
    (w.dir / "mine.bin").write_bytes(b"y" * 100_000)
    (w.dir / "coderouter-lane-0.bin").write_bytes(b"z" * 100_000)  # named by an older coderouterd
    a = Session(20)
    # The persisted map says some lane's prefix is in one of those files.
    snap = {"slots": {"slots": [{"lane": None}, {"lane": None}],
                      "saved": [["nonexistent-lane", "cr-0123456789ab-lane-0.bin", ["00" * 16], [10]]]}}

    async def scenario():
        aff = w.daemon(snap)
        aff.server_restarted(["p"])
        aff.warm.start()
        await w.turn(a)
        await w.turn(a)
        await aff.warm.before_stop("llama", "shutdown")
        ours = [n for n in w.files() if n.startswith("cr-")]
        assert sum(os.stat(w.dir / n).st_size for n in ours) <= 0.15 * 1024 * 1024
        assert "cr-0123456789ab-orphan.bin.json" not in ours
        assert "mine.bin" in w.files()  # never touched: not coderouterd's
        assert "coderouter-lane-0.bin" not in w.files()  # ours, from before keys: pruned like any stale file
        key = aff.warm.status("p")["key"]
        assert any(n.startswith(f"cr-{key}-") for n in ours)
        # Nothing stale was ever asked of the server.
        assert not [x for x in w.fake.fake.slot_actions if x[0] == "restore"]

    _run(w, scenario)


def test_a_server_that_does_not_answer_is_not_waited_for_before_its_stop(tmp_path):
    w = World(tmp_path, extra="save_before_stop_s = 600\n")
    a = Session(30)

    async def scenario():
        w.daemon()
        await w.turn(a)
        w.fake.fake.state.hung = True  # answers nothing from now on (what self-healing restarts it for)
        await asyncio.wait_for(w.aff.warm.before_stop("llama", "restart"), 30)  # not the 600 s allowed
        assert w.files() == [] and w.aff.warm.status("p")["saves"] == 0

    _run(w, scenario)
