"""routing/balance.py: the cost that blends a replica's cached prefix and its load, the rules for new and returning
turns, the words `corectl explain` shows, and llama-server's /slots rows as servers/llamacpp.py reads them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from coderouterd.affinity.canonical import common_prefix, segments
from coderouterd.affinity.index import PrefixIndex
from coderouterd.affinity.slots import SlotTable
from coderouterd.routing.balance import Balancer, Live, apply_balance, live_from, rank, replica, why
from coderouterd.routing.planner import Plan
from coderouterd.servers.llamacpp import LlamaServer, SlotState, slot_state

NAMES = ["gpu1", "gpu2", "gpu3"]


def _prompt(turns: int):
    messages = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"turn {t}: " + "please read the file and fix it. " * 40})
        messages.append({"role": "assistant", "content": f"done {t}"})
    messages.append({"role": "user", "content": "next"})
    return segments({"system": "You are a coding agent. " * 100, "messages": messages}, "anthropic")


def _ticket(prompt, lane="lane-a", continues=True):
    return SimpleNamespace(prompt=prompt, lane=lane, continues=continues, lane_label=f"lane:{lane}")


def _in_flight(index: PrefixIndex, name: str, n: int) -> None:
    """Requests in flight on `name`, as the upstream's one count hands them to the index."""
    counts = dict(getattr(index, "_counts", {}))
    counts[name] = n
    index._counts = counts  # type: ignore[attr-defined]
    index.in_flight = lambda provider: counts.get(provider, 0)


def _index(slots: int = 2, s_per_token: float = 0.01, mean_s: float = 4.0) -> PrefixIndex:
    index = PrefixIndex()
    for n in NAMES:
        p = index.provider(n)
        p.slots = SlotTable(slots)
        p.s_per_token = s_per_token
        p.measured = True
        p.mean_duration_s = mean_s
    return index


def _hold(index: PrefixIndex, name: str, lane: str, prompt, slot: int = 0, at: float = 1.0) -> None:
    table = index.provider(name).slots
    assert table is not None
    table.slots[slot].lane = lane
    table.finish(slot, lane, prompt, at)
    index.remember(lane, name, prompt)


def test_a_returning_turn_goes_to_the_replica_holding_its_prefix():
    index = _index()
    earlier, now = _prompt(3), _prompt(4)
    _hold(index, "gpu2", "lane-a", earlier)
    b = Balancer(clock=lambda: 10.0)
    order, notes = b.order(NAMES, _ticket(now), index)
    assert order[0] == "gpu2"
    words = notes[0]["why"]
    cached = int(now.upto(common_prefix(earlier.digests, now.digests)) / index.provider("gpu2").bytes_per_token)
    total = int(now.size / index.provider("gpu2").bytes_per_token)
    assert words.startswith(f"balance: prefix {cached:,} of {total:,} tokens cached on gpu2; 2 of 2 slots free")


def test_the_holder_loses_the_turn_when_its_queue_costs_more_than_recomputing():
    earlier, now = _prompt(3), _prompt(4)
    # gpu2 holds the prefix but runs 4 requests on 2 slots: 3 ahead of this one, each 4 s on 2 slots = 6 s of wait,
    # against ~0.01 s/token x ~1,800 tokens = ~18 s of prefill elsewhere: it stays.
    index = _index(s_per_token=0.01)
    _hold(index, "gpu2", "lane-a", earlier)
    _in_flight(index, "gpu2", 4)
    assert Balancer().order(NAMES, _ticket(now), index)[0][0] == "gpu2"
    # A fast prefill (0.5 ms/token: ~1 s to recompute) makes the same queue not worth waiting for.
    index = _index(s_per_token=0.0005)
    _hold(index, "gpu2", "lane-a", earlier)
    _in_flight(index, "gpu2", 4)
    order, notes = Balancer().order(NAMES, _ticket(now), index)
    assert order[0] != "gpu2" and order[-1] == "gpu2"
    assert "gpu2: " in notes[0]["why"] and "queue 3" in notes[0]["why"]


def test_new_conversations_go_to_the_shortest_queue_then_the_most_free_slots():
    index = _index()
    _in_flight(index, "gpu1", 3)  # queue 2
    _in_flight(index, "gpu2", 1)  # 1 free slot
    order, notes = Balancer().order(NAMES, _ticket(_prompt(0), continues=False), index)
    assert order == ["gpu3", "gpu2", "gpu1"]
    assert notes[0]["why"].startswith("balance: new conversation: 2 of 2 slots free on gpu3")


def test_a_burst_of_new_conversations_spreads_before_any_is_placed():
    index = _index()
    b = Balancer()
    firsts = [b.order(NAMES, _ticket(_prompt(0), lane=f"l{i}", continues=False), index)[0][0] for i in range(6)]
    assert sorted(firsts) == sorted(NAMES * 2)


def test_the_replicas_own_slots_count_load_this_daemon_did_not_send():
    index = _index()
    b = Balancer(clock=lambda: 5.0)
    b._live["gpu1"] = Live(processing=2, total=2, held=None, at=5.0)  # busy with another client's requests
    order, _ = b.order(NAMES, _ticket(_prompt(0), continues=False), index)
    assert order[-1] == "gpu1"


def test_a_replica_that_restarted_holds_nothing_whatever_was_sent_to_it():
    earlier, now = _prompt(3), _prompt(4)
    index = _index()
    _hold(index, "gpu2", "lane-a", earlier, at=1.0)
    view = replica("gpu2", index, _ticket(now), Live(0, 2, 0, at=2.0))
    assert view.cached_tokens == 0
    # A reading from before the answer that filled the slot says nothing about it.
    view = replica("gpu2", index, _ticket(now), Live(0, 2, 0, at=0.5))
    assert view.cached_tokens > 0


def test_a_reading_is_stamped_when_asked_not_when_answered():
    """A turn that finished while the question was in flight may be missing from the reading: only a reading asked
    after that turn may cap what it left cached."""
    earlier, now = _prompt(3), _prompt(4)
    index = _index()
    clock = [1.0]

    async def get(path: str):
        clock[0] = 3.0  # the lane's turn finished (at 2.0) while /slots was being asked
        return 200, [{"id": 0, "is_processing": False, "id_task": 1, "n_prompt_tokens": 0},
                     {"id": 1, "is_processing": False}]

    async def post(path, body, timeout):
        raise AssertionError("balance only reads")

    b = Balancer(clock=lambda: clock[0])
    asyncio.run(b._read("gpu1", LlamaServer(get, post)))
    _hold(index, "gpu1", "lane-a", earlier, at=2.0)
    assert b._live["gpu1"].at == 1.0
    assert replica("gpu1", index, _ticket(now), b.live("gpu1")).cached_tokens > 0
    order, _ = b.order(["gpu1", "gpu2"], _ticket(now), index)
    assert order[0] == "gpu1"


def test_a_replica_that_never_answered_here_is_not_free():
    """A replica the index knows nothing of holds nothing of the prompt and computes it at the default speed: the
    returning turn stays where its prefix is."""
    earlier, now = _prompt(3), _prompt(4)
    index = _index()
    del index.providers["gpu2"]
    _hold(index, "gpu1", "lane-a", earlier)
    view = replica("gpu2", index, _ticket(now), None)
    assert view.cached_tokens == 0 and view.prompt_tokens > 0 and view.prefill_s > 0
    order, notes = Balancer().order(["gpu2", "gpu1"], _ticket(now), index)
    assert order[0] == "gpu1", notes


def test_stale_readings_are_ignored():
    clock = [0.0]
    b = Balancer(clock=lambda: clock[0])
    b._live["gpu1"] = Live(2, 2, 0, at=0.0)
    assert b.live("gpu1") is not None
    clock[0] = 60.0
    assert b.live("gpu1") is None


def test_moved_back_providers_stay_behind():
    index = _index()
    plan = Plan(candidates=list(NAMES), order_notes=[{"provider": "gpu3", "moved": "back", "why": "health"}])
    _in_flight(index, "gpu1", 5)
    apply_balance(Balancer(), plan, _ticket(_prompt(0), continues=False), index, {}, None)
    assert plan.candidates == ["gpu2", "gpu1", "gpu3"]
    assert plan.order_notes[-1]["provider"] == "gpu2" and plan.order_notes[-1]["moved"] == "front"


def test_rank_and_words_without_affinity():
    views = [replica(n, None, None, Live(i, 1, None, 0.0)) for i, n in enumerate(NAMES)]
    ranked = rank(views, new=True)
    assert [r.name for r in ranked] == NAMES
    assert why(ranked[1], [], new=False) == "balance: prefix 0 of 0 tokens cached on gpu2; queue 1 ahead"


def test_slots_rows_of_old_and_new_llama_server_builds():
    assert slot_state({"id": 0, "is_processing": True, "n_past": 120}) == SlotState(True, 120)
    assert slot_state({"id": 1, "is_processing": False, "id_task": 7, "n_prompt_tokens": 300}) == SlotState(False, 300)
    assert slot_state({"id": 2, "is_processing": False}) == SlotState(False, 0)  # never ran a task
    assert slot_state({"id": 3, "is_processing": False, "id_task": 9}) == SlotState(False, None)
    live = live_from([SlotState(True, 10), SlotState(False, 300), SlotState(False, None)], 1.0)
    assert (live.processing, live.total, live.held) == (1, 3, 300)


def test_polling_reads_slots_through_llama_server_and_at_most_every_half_second():
    asked: list[str] = []

    async def get(path: str):
        asked.append(path)
        return 200, [{"id": 0, "is_processing": True, "id_task": 1, "n_prompt_tokens": 50},
                     {"id": 1, "is_processing": False}]

    async def post(path, body, timeout):
        raise AssertionError("balance only reads")

    async def main() -> Balancer:
        clock = [100.0]
        b = Balancer(clock=lambda: clock[0])
        srv = LlamaServer(get, post)
        b.poll({"gpu1": object()}, lambda _p: srv)  # type: ignore[dict-item]
        b.poll({"gpu1": object()}, lambda _p: srv)  # type: ignore[dict-item]
        await asyncio.sleep(0)
        await asyncio.gather(*b._tasks)
        assert asked == ["/slots"]
        clock[0] += 0.6
        b.poll({"gpu1": object()}, lambda _p: srv)  # type: ignore[dict-item]
        await asyncio.gather(*b._tasks)
        assert asked == ["/slots", "/slots"]
        await b.stop()
        return b

    b = asyncio.run(main())
    assert b.status("gpu1") == {"processing": 1, "slots": 2, "held_tokens": 50, "age_s": 0.0, "picks": 0}


def test_a_paid_provider_in_a_balance_profile_is_the_chains_failover_not_a_replica():
    index = _index()
    for n in NAMES:
        _in_flight(index, n, 6)  # every replica queued deep: a paid provider would still not lead
    plan = Plan(candidates=["anthropic", *NAMES])
    providers = {n: SimpleNamespace(cfg=SimpleNamespace(paid=False)) for n in NAMES}
    providers["anthropic"] = SimpleNamespace(cfg=SimpleNamespace(paid=True))
    apply_balance(Balancer(), plan, _ticket(_prompt(0), continues=False), index, providers, None)  # type: ignore[arg-type]
    assert plan.candidates[-1] == "anthropic" and set(plan.candidates[:3]) == set(NAMES)


# -- a lane moving off a replica that went down takes its slot file along (kvcache/move.py) ----------------------

class _Host:
    def __init__(self, tables: dict) -> None:
        self.tables = tables
        self.persisted: list[str] = []

    def table(self, name):
        return self.tables.get(name)

    def names(self):
        return list(self.tables)

    def in_flight(self, name):
        return 0

    def persist_soon(self, name):
        self.persisted.append(name)


def _kv(tmp_path, keys: dict, managed=lambda _n: True):
    from coderouterd.kvcache.cache import KVCache

    tables = {n: SlotTable(2, can_save=True) for n in ("gpu1", "gpu2", "gpu3")}
    for n, t in tables.items():
        t.files.prefix = f"cr-{keys[n].digest()}-{n}-"
    kv = KVCache(_Host(tables))
    kv.wire(directory=tmp_path, provider=lambda _n: None, served_by=lambda n: [n], managed=managed)
    kv._keys.update(keys)
    return kv, tables


def _key(model="m.gguf", n_ctx=2048, build="b1"):
    from coderouterd.kvcache.files import CacheKey

    return CacheKey(model, 10, 1, n_ctx, build)


def _saved_on(tmp_path, table, lane: str, prompt, key=None, tokens: int = 1234) -> str:
    """A lane's saved slot file on disk with the sidecar kvcache writes: the key it was saved under."""
    import orjson

    fname = table.files.remember(lane, prompt.digests, prompt.ends)
    (tmp_path / fname).write_bytes(b"KV" * 10)
    side = {"key": (key or _key()).as_dict(), "tokens": tokens, "bytes": 20}
    (tmp_path / (fname + ".json")).write_bytes(orjson.dumps(side))
    return fname


def test_the_balancer_moves_a_downed_replicas_lane_with_its_slot_file(tmp_path):
    kv, tables = _kv(tmp_path, {n: _key() for n in NAMES})
    index = _index()
    earlier, now = _prompt(3), _prompt(4)
    _hold(index, "gpu1", "lane-a", earlier)
    old = _saved_on(tmp_path, tables["gpu1"], "lane-a", earlier)
    b = Balancer()
    ticket = _ticket(now)
    order, notes = b.order(["gpu2", "gpu3"], ticket, index)  # gpu1 is down: not a candidate
    assert "its lane moves from gpu1, which is not available" in notes[0]["why"]
    assert b.follower(_ticket(now, lane="lane-b"), order[0], kv) is None  # another lane: nothing to await
    follow = b.follower(ticket, order[0], kv)  # type: ignore[arg-type]
    assert follow is not None
    assert asyncio.run(follow()) == {"from": "gpu1", "tokens": 1234}  # type: ignore[misc]
    new = tables[order[0]].files.saved["lane-a"]
    assert (tmp_path / new.filename).read_bytes() == b"KV" * 10 and (tmp_path / (new.filename + ".json")).exists()
    assert new.filename.startswith(tables[order[0]].files.prefix)  # named as the new server's own
    assert not (tmp_path / old).exists() and "lane-a" not in tables["gpu1"].files.saved
    assert new.digests == earlier.digests
    assert asyncio.run(b.follow(ticket, order[0], kv)) is None  # type: ignore[arg-type]  # once
    assert b.follower(ticket, order[0], kv) is None  # type: ignore[arg-type]


def test_a_slot_file_never_crosses_to_another_model_context_or_build_nor_off_this_machine(tmp_path):
    from coderouterd.kvcache.move import move_lane

    for other in (_key(model="other.gguf"), _key(n_ctx=4096), _key(build="b2")):
        d = tmp_path / other.digest()
        d.mkdir()
        kv, tables = _kv(d, {"gpu1": _key(), "gpu2": other, "gpu3": _key()})
        fname = _saved_on(d, tables["gpu1"], "lane-a", _prompt(2))
        assert asyncio.run(move_lane(kv, "lane-a", "gpu1", "gpu2")) is None
        assert (d / fname).exists() and "lane-a" not in tables["gpu2"].files.saved
        # Its server's key forgotten (it restarted, or was killed): the file's own sidecar still says no.
        del kv._keys["gpu1"]
        assert asyncio.run(move_lane(kv, "lane-a", "gpu1", "gpu2")) is None
        assert (d / fname).exists() and "lane-a" in tables["gpu1"].files.saved
    d = tmp_path / "unmanaged"
    d.mkdir()
    kv, tables = _kv(d, {n: _key() for n in NAMES}, managed=lambda n: n != "gpu3")  # gpu3: another machine's
    _saved_on(d, tables["gpu1"], "lane-a", _prompt(2))
    assert asyncio.run(move_lane(kv, "lane-a", "gpu1", "gpu3")) is None
    assert asyncio.run(move_lane(kv, "lane-a", "gpu1", "gpu2")) == 1234


def test_the_files_own_key_decides_not_what_its_server_said_last(tmp_path):
    """A killed server's key may be forgotten (its restart) or may have changed (the model file replaced): the key
    in the file's sidecar is what the file is valid for. And a new server whose key is not learnt yet receives
    nothing."""
    from coderouterd.kvcache.move import move_lane

    kv, tables = _kv(tmp_path, {n: _key() for n in NAMES})
    _saved_on(tmp_path, tables["gpu1"], "lane-a", _prompt(2))
    _saved_on(tmp_path, tables["gpu1"], "lane-b", _prompt(3), key=_key(n_ctx=4096))  # an older server's
    del kv._keys["gpu1"]
    assert asyncio.run(move_lane(kv, "lane-b", "gpu1", "gpu2")) is None
    del kv._keys["gpu3"]
    assert asyncio.run(move_lane(kv, "lane-a", "gpu1", "gpu3")) is None
    assert asyncio.run(move_lane(kv, "lane-a", "gpu1", "gpu2")) == 1234
    assert "lane-a" in tables["gpu2"].files.saved and "lane-b" in tables["gpu1"].files.saved


def test_a_plan_only_shown_counts_no_pick():
    index = _index()
    b = Balancer()
    for _ in range(3):
        b.order(NAMES, None, index, pick=False)
    assert [b.picks(n) for n in NAMES] == [0, 0, 0]
    b.order(NAMES, None, index)
    assert [b.picks(n) for n in NAMES] == [1, 0, 0]
