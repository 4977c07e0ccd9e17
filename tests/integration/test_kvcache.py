"""kvcache/ against the fake llama-server on a loopback socket (tests/integration/test_warm.py's world): a slot
file is checked before it is restored and the restore proven by the next answer's cached tokens; a refused or
failed restore is recorded (a cache bust of the turn, audited); a server refusing saves with 501 is not asked
again, whichever path asked; and /props is read once per server start."""

from __future__ import annotations

import os

import orjson

from coderouterd.state.events import CacheBust
from tests.integration.test_warm import World, _run
from tests.support.claude_sessions import TINY, Session


def _saved_then_restarted(tmp_path, sessions):
    """Two lanes saved before a stop, then a new server process (empty slots) and a new daemon with the
    snapshot: the next turn of a lane restores its file."""
    w = World(tmp_path)

    async def first_life():
        w.daemon()
        for s in (*sessions, *sessions):
            await w.turn(s)
        await w.aff.warm.before_stop("llama", "shutdown")
        return w.aff.index.snapshot("p")

    snap = _run(w, first_life)
    w.fake = w._fake(port=w.fake.port)
    return w, snap


def _second_life(w: World, snap: dict, events: list):
    aff = w.daemon(snap)
    aff.publish = aff.kvcache.publish = events.append
    aff.server_restarted(["p"])
    return aff


def _lane_file(w: World, aff, session: Session) -> str:
    t = aff.ticket(_req_of(session))
    return aff.index.provider("p").slots.saved[t.lane].filename


def _req_of(s: Session):
    from tests.integration.test_warm import _req

    return _req(s)


def test_a_truncated_slot_file_is_refused_before_the_server_sees_it_and_recorded(tmp_path):
    a, b = Session(31), Session(32)
    w, snap = _saved_then_restarted(tmp_path, (a, b))
    events: list = []

    async def second_life():
        aff = _second_life(w, snap, events)
        fname = _lane_file(w, aff, a)
        path = w.dir / fname
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])  # cut in the middle, sidecar untouched
        t, placed = await w.turn(a, advance=False)
        assert not [x for x in w.fake.fake.slot_actions if x[0] == "restore"]  # never asked to load it
        assert t.restore is not None and t.restore.outcome == "refused" and "truncated" in t.restore.problem
        assert placed.predicted_bytes == 0 and w.cached[-1] == 0  # recomputed, and served
        st = aff.warm.status("p")
        assert st["restores_refused"] == 1 and st["restores"] == 0
        assert t.bust is not None and t.bust.cause == "slot file" and t.bust.segment.startswith(
            "slot restore refused (truncated: ")
        busts = [e for e in events if isinstance(e, CacheBust)]
        assert len(busts) == 1 and busts[0].cause == "slot file" and CacheBust.audited
        assert t.note()["slot_restore"]["outcome"] == "refused"
        assert fname not in {sv.filename for sv in aff.index.provider("p").slots.saved.values()}  # not again
        # The other lane's file is whole: restored, and proven by the answer.
        t2, _ = await w.turn(b, advance=False)
        assert t2.restore is not None and t2.restore.outcome == "taken" and t2.bust is None
        assert aff.warm.status("p")["restores"] == 1

    _run(w, second_life)


def test_a_deleted_slot_file_is_refused_and_recorded(tmp_path):
    """Issue 43, D4: a restore that could not happen leaves an audit line and a cache-bust record."""
    a, b = Session(33), Session(34)
    w, snap = _saved_then_restarted(tmp_path, (a, b))
    events: list = []

    async def second_life():
        aff = _second_life(w, snap, events)
        await w.turn(b, advance=False)  # the server's key learnt with every file there
        os.unlink(w.dir / _lane_file(w, aff, a))
        t, _ = await w.turn(a, advance=False)
        assert t.restore is not None and t.restore.outcome == "refused" and t.restore.problem == "the file is gone"
        assert [(e.cause, e.segment) for e in events if isinstance(e, CacheBust)] == [
            ("slot file", "slot restore refused (the file is gone)")]
        assert aff.warm.status("p")["restores_refused"] == 1

    _run(w, second_life)


def test_a_lying_slot_file_is_caught_by_the_cached_tokens_and_not_counted_as_a_restore(tmp_path):
    """Its sidecar matches (key and size), its contents are another conversation's (another client's: little
    in common): the server restores it and says so, and the next answer's cached tokens say the lane's prefix
    did not come back. (Another Claude Code session's file would give back the shared system prompt and tools,
    most of the prompt: that is a restore that took, of less than predicted.)"""
    a, b = Session(35), Session(36, shape=TINY, tools=False)
    w, snap = _saved_then_restarted(tmp_path, (a, b))
    events: list = []

    async def second_life():
        aff = _second_life(w, snap, events)
        mine, other = _lane_file(w, aff, a), _lane_file(w, aff, b)
        data = (w.dir / other).read_bytes()
        (w.dir / mine).write_bytes(data)
        side = w.dir / (mine + ".json")
        meta = orjson.loads(side.read_bytes())
        side.write_bytes(orjson.dumps({**meta, "bytes": len(data)}))
        t, _ = await w.turn(a, advance=False)
        assert [x for x in w.fake.fake.slot_actions if x[0] == "restore"]  # the server took it
        assert t.restore is not None and t.restore.outcome == "did not take", t.restore
        st = aff.warm.status("p")
        assert st["restores_not_taken"] == 1 and st["restores"] == 0
        assert t.bust is not None and t.bust.cause == "slot file" and "did not take" in t.bust.segment
        assert [e.cause for e in events if isinstance(e, CacheBust)] == ["slot file"]

    _run(w, second_life)


def test_a_server_refusing_saves_with_501_is_not_asked_again(tmp_path):
    """The rule is written once (kvcache/cache.py `execute`): a background save's 501 turns saving off, so
    neither the idle saver nor a request's eviction asks again."""
    w = World(tmp_path, n_slots=1, extra="save_idle_after_s = 10\n")
    w.restart_server(slot_save_path=None)  # no --slot-save-path: every slot action answers 501
    a, b = Session(37), Session(38)

    async def scenario():
        w.daemon()
        await w.turn(a)
        w.now = 100.0
        await w.aff.warm.idle_pass()
        assert [x[0] for x in w.fake.fake.slot_actions] == []  # the fake records only the actions it serves
        assert w.fake.count("/slots/0") == 1 and not w.aff.index.provider("p").slots.can_save
        assert w.aff.warm.status("p")["save_failures"] == 1
        await w.aff.warm.idle_pass()
        await w.turn(b)  # evicts a's lane from the only slot: no save asked
        await w.aff.warm.before_stop("llama", "shutdown")
        assert w.fake.count("/slots/0") == 1

    _run(w, scenario)


def test_props_is_read_once_per_server_start(tmp_path):
    """Discovery reads /props and kvcache learns the slot files' key from that answer (issue 43: it was read
    twice after every start)."""
    w = World(tmp_path)
    a = Session(39)

    async def scenario():
        w.daemon()
        await w.turn(a)
        await w.turn(a)
        assert w.fake.count("/props") == 1
        w.restart_server()
        w.aff.server_restarted(["p"])
        await w.turn(a)
        assert w.fake.count("/props") == 1  # the new process: once again

    _run(w, scenario)
