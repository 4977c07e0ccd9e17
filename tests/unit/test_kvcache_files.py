"""Slot caches that outlive the server, the pure parts: what a slot file is valid for, which slots to save
first, which files the disk budget deletes first, and a restarted server's lane getting its saved state."""

from __future__ import annotations

from coderouterd.affinity.canonical import Canonicaliser, segments
from coderouterd.affinity.slots import SlotTable
from coderouterd.kvcache.files import (
    CacheKey,
    SlotFile,
    key_from_props,
    sidecar_matches,
    to_prune,
    to_save,
)
from tests.support.claude_sessions import Session

PROPS = {"default_generation_settings": {"n_ctx": 4096}, "model_path": "/m/coder.gguf", "build_info": "b6000-x"}


def _prompts(session: Session, n: int):
    canon = Canonicaliser()
    out = []
    for _ in range(n):
        out.append(segments(canon.anthropic(session.main_body()), "anthropic"))
        session.advance()
    return out


def test_the_key_names_model_file_size_mtime_context_and_version():
    base = key_from_props(PROPS, 1000, 5)
    assert base is not None and base.n_ctx == 4096 and base.model == "/m/coder.gguf" and base.build == "b6000-x"
    others = [
        key_from_props({**PROPS, "model_path": "/m/other.gguf"}, 1000, 5),
        key_from_props(PROPS, 1001, 5),  # the same path, another file behind it
        key_from_props(PROPS, 1000, 6),
        key_from_props({**PROPS, "default_generation_settings": {"n_ctx": 2048}}, 1000, 5),
        key_from_props({**PROPS, "build_info": "b6001-y"}, 1000, 5),
    ]
    digests = {base.digest()} | {k.digest() for k in others if k is not None}
    assert len(digests) == 6
    assert base.file_prefix().startswith("cr-") and base.digest() in base.file_prefix()
    assert key_from_props(PROPS, 1000, 5) == base  # stable: a restarted daemon finds the same files


def test_two_servers_of_one_model_and_context_name_their_files_apart():
    """Same model file, same context, one save directory: the key is the same, and without the provider in the
    names one server's save overwrote the other's lane (found by the swap bench)."""
    key = key_from_props(PROPS, 1000, 5)
    assert key is not None
    a, b = key.file_prefix("coder"), key.file_prefix("coder-2")
    assert a != b and a.startswith(key.file_prefix()) and b.startswith(key.file_prefix())
    assert a == key.file_prefix("coder")  # stable across restarts
    assert "/" not in key.file_prefix("we/ird name")  # any provider name gives a plain file name


def test_no_key_without_a_context_size():
    assert key_from_props({"model_path": "/m/x.gguf"}, 1, 1) is None
    assert key_from_props({"default_generation_settings": {"n_ctx": 0}}, 1, 1) is None
    assert key_from_props("nonsense", 1, 1) is None  # type: ignore[arg-type]


def test_a_sidecar_matches_only_its_own_key():
    key = CacheKey("/m/a.gguf", 10, 20, 1024, "b1")
    assert sidecar_matches({"key": key.as_dict(), "tokens": 5}, key)
    assert not sidecar_matches({"key": CacheKey("/m/a.gguf", 10, 20, 2048, "b1").as_dict()}, key)
    assert not sidecar_matches(None, key) and not sidecar_matches({"key": "x"}, key)


def _table_with_lanes() -> tuple[SlotTable, dict]:
    t = SlotTable(4, can_save=True, clone_min_bytes=10**9)
    prompts = {"short": _prompts(Session(1), 1)[0], "long": _prompts(Session(2), 4)[-1],
               "mid": _prompts(Session(3), 2)[-1]}
    for i, lane in enumerate(("short", "long", "mid")):
        c = t.choose(lane, prompts[lane])
        t.begin(c.slot, float(i))
        t.finish(c.slot, lane, prompts[lane], float(i))
    return t, prompts


def test_slots_to_save_longest_prefix_first_and_only_what_is_not_on_disk_as_it_is():
    t, prompts = _table_with_lanes()
    slot_of = {s.lane: s.id for s in t.slots if s.lane}
    assert to_save(t, now=10.0) == [slot_of["long"], slot_of["mid"], slot_of["short"]]
    # A lane saved as it is now is not saved again; once it grows, it is.
    fname = t.remember_save(slot_of["long"])
    assert fname.startswith(t.files.prefix) and t.saved["long"].digests == t.slots[slot_of["long"]].digests
    assert to_save(t, now=10.0) == [slot_of["mid"], slot_of["short"]]
    # Busy slots are left alone (what they hold is changing); the idle filter keeps recently used lanes out.
    t.begin(slot_of["mid"], 10.0)
    assert to_save(t, now=10.0) == [slot_of["short"]]
    assert to_save(t, now=10.5, idle_after_s=10.0) == [slot_of["short"]]  # used at 0: idle 10.5 s
    assert to_save(t, now=9.0, idle_after_s=10.0) == []


def test_the_disk_budget_deletes_unreferenced_then_oldest_then_least_valuable():
    files = [SlotFile("cr-a-lane-0.bin", 100, 50.0, 900, True),
             SlotFile("cr-a-lane-1.bin", 100, 10.0, 50, True),
             SlotFile("cr-old-lane-0.bin", 100, 90.0, 999, False),   # another key's: nobody refers to it
             SlotFile("cr-a-lane-2.bin", 100, 10.0, 10, True)]
    assert to_prune(files, 400) == []
    assert to_prune(files, 399) == ["cr-old-lane-0.bin"]
    assert to_prune(files, 200) == ["cr-old-lane-0.bin", "cr-a-lane-2.bin"]
    assert to_prune(files, 0) == ["cr-old-lane-0.bin", "cr-a-lane-2.bin", "cr-a-lane-1.bin", "cr-a-lane-0.bin"]


def test_after_a_restart_a_lane_gets_its_saved_state_back_in_its_own_slot():
    t = SlotTable(2, can_save=True, clone_min_bytes=10**9)
    turns = _prompts(Session(7), 3)
    c = t.choose("L", turns[0])
    t.finish(c.slot, "L", turns[0], 1.0)
    fname = t.remember_save(c.slot)  # saved in the background, or before the stop
    t.forget_contents()  # the server restarted: its slots are empty, the file is not
    again = t.choose("L", turns[1])
    assert again.slot == c.slot and again.restore == fname and again.predicted > 0
    assert "restored the lane's saved state" in again.why


def test_saved_states_another_key_wrote_are_dropped():
    t = SlotTable(2, can_save=True, clone_min_bytes=10**9)
    p = _prompts(Session(8), 1)[0]
    c = t.choose("L", p)
    t.finish(c.slot, "L", p, 1.0)
    old = t.remember_save(c.slot)
    t.files.prefix = "cr-newkey-"
    assert t.files.keep(lambda f: f.startswith(t.files.prefix)) == [old]
    assert not t.saved
    t.forget_contents()
    assert t.choose("L", p).restore is None


def test_a_file_is_refused_unless_its_size_is_its_sidecars():
    """The attack's truncated file crashed the real llama-server on restore: it never reaches it."""
    from coderouterd.kvcache.files import restore_problem

    side = {"bytes": 1000, "tokens": 40}
    assert restore_problem(side, 1000) is None
    assert restore_problem(side, 600) == "truncated: 600 bytes, saved as 1000"
    assert restore_problem(side, 1200) == "grown: 1200 bytes, saved as 1000"
    assert restore_problem(side, None) == "the file is gone"
    assert restore_problem(None, 1000) == "it has no sidecar"
    assert restore_problem({"tokens": 40}, 1000) == "its sidecar gives no size"


def test_a_budget_below_one_slot_file_is_named():
    from coderouterd.kvcache.budget import too_small

    assert too_small(100, "llama", 50 * 2**20, 2048) is None
    note = too_small(10, "llama", 50 * 2**20, 2048)
    assert note is not None and note.startswith("process llama: affinity.max_saved_mb = 10 is smaller than one")
    assert "2,048 tokens, about 50 MB" in note and "written and deleted at once" in note
    assert too_small(0, "llama", 0, 0) is None  # nothing known of its files: nothing said
