"""Sub-segments (issue 44 §0): a long segment is digested in pieces, so two sessions whose long system block
differs only near its end (Claude Code's environment section, Copilot CLI's session folder) share most of it:
a new lane is seeded from, or placed on, the slot holding it. Lanes and cache-bust names still speak of whole
segments."""

from __future__ import annotations

from coderouterd.affinity.bust import first_difference
from coderouterd.affinity.canonical import Canonicaliser, common_prefix, segments
from coderouterd.affinity.lanes import LaneIndex
from coderouterd.affinity.slots import SlotTable
from tests.support.claude_sessions import CLAUDE_CODE, INSTRUCTIONS, Session, Shape

CANON = Canonicaliser()
STATIC = INSTRUCTIONS * 4  # ~25 KB of static instructions: thousands of tokens


def _env(n: int) -> str:
    return (f"\n<env>\nWorking directory: /home/dev/project-{n}\nIs directory a git repo: Yes\nPlatform: linux\n"
            f"Today's date: 2026-12-0{n % 9 + 1}\n</env>\ngitStatus: On branch feature-{n}\n M src/app_{n}.py")


def _session(n: int) -> Session:
    shape = Shape(CLAUDE_CODE.tools, STATIC, CLAUDE_CODE.agents, CLAUDE_CODE.tool_result_lines,
                  CLAUDE_CODE.max_tokens, CLAUDE_CODE.background_max_tokens)
    s = Session(n, shape=shape)
    s.system_extra = _env(n)
    return s


def _prompt(s: Session):
    return segments(CANON.anthropic(s.main_body()), "anthropic")


def _shared(a, b) -> int:
    return b.upto(common_prefix(a.digests, b.digests))


def test_two_prompts_sharing_most_of_one_system_block_share_that_much_prefix():
    a, b = _prompt(_session(1)), _prompt(_session(2))
    static = len(STATIC.encode())
    # Before the block: the short system[0] only. Whole blocks would share nothing more.
    start = a.whole.upto(1)
    assert a.whole.labels[1] == "system[1]" and common_prefix(a.whole.digests, b.whole.digests) == 1
    shared = _shared(a, b)
    assert start + static - 4096 <= shared <= start + static + 16  # within one piece of the shared text
    assert shared > start + static * 0.8


def test_openai_system_message_with_a_session_folder_shares_its_prefix():
    def body(folder: str) -> dict:
        return {"messages": [{"role": "system", "content": INSTRUCTIONS * 3 + f"\nSession folder: {folder}\n"
                                                           + "More static instructions follow. " * 200},
                             {"role": "user", "content": "hi"}]}

    a, b = segments(body("/tmp/copilot/s-1"), "openai"), segments(body("/tmp/copilot/s-2"), "openai")
    assert _shared(a, b) >= len((INSTRUCTIONS * 3).encode()) - 4096 > 10_000


def test_the_whole_view_is_the_segments_and_agrees_with_the_pieces_at_their_ends():
    p = _prompt(_session(1))
    w = p.whole
    assert w.labels[:4] == ("system[0]", "system[1]", "tools", "message 0") and w.lead == 3
    assert len(p.digests) > len(w.digests) and p.size == w.size
    # One running hash: a segment's digest is the piece's digest at its end, so either view matches the other there.
    at = dict(zip(p.ends, p.digests, strict=True))
    assert all(at[e] == d for e, d in zip(w.ends, w.digests, strict=True))
    assert set(p.labels) == set(w.labels) and p.labels[p.lead - 1] == "tools" and p.labels[p.lead] == "message 0"
    # Nothing long: one view.
    short = segments({"messages": [{"role": "user", "content": "hi"}]}, "anthropic")
    assert short.whole is short


def test_a_new_lane_copies_most_of_the_shared_block():
    t = SlotTable(3, can_save=True, clone_min_bytes=1024)
    a = _prompt(_session(1))
    c = t.choose("A", a)
    t.begin(c.slot, 1.0)
    t.finish(c.slot, "A", a, 1.5)
    b = _prompt(_session(2))
    c = t.choose("B", b, seed_pays=lambda gain, donor: True)
    assert c.restore is not None and c.seeded is not None and c.seeded[:2] == (0, "A")
    assert c.predicted >= len(STATIC.encode()) - 4096 and "copied the shared prefix from slot 0" in c.why


def test_a_free_slot_holding_most_of_the_block_is_where_a_new_lane_goes():
    t = SlotTable(2, can_save=False)
    a = _prompt(_session(1))
    t.begin(0, 1.0)
    t.finish(0, "A", a, 1.5)
    t.slots[0].lane = None  # A moved away; its prompt is still in the slot
    c = t.choose("B", _prompt(_session(2)))
    assert c.slot == 0 and c.seeded == (0, None, c.predicted) and c.predicted > len(STATIC.encode()) * 0.8


def test_lanes_and_busts_still_speak_of_whole_segments():
    idx = LaneIndex()
    first = "Please review this file:\n" + "def f(x):\n    return x * 2\n" * 400  # a long, shared first message

    def body(question: str) -> dict:
        return {"system": "You are a helpful assistant.", "messages": [{"role": "user", "content": first + question}]}

    # Two unnamed conversations that paste the same long file: sharing part of a first message names no lane.
    p1, p2 = segments(body("What does it do?"), "anthropic"), segments(body("Find the bug."), "anthropic")
    assert _shared(p1, p2) > 8000
    lane1 = idx.resolve(p1, session="fp:1", named=False, tools=False, model="m")[0]
    lane2, why, continues = idx.resolve(p2, session="fp:2", named=False, tools=False, model="m")
    assert lane2 != lane1 and not continues, why
    # A changed environment section is a change of system[1], named once, as before.
    s = _session(1)
    prev = _prompt(s)
    s.system_extra = _env(5)
    assert first_difference(prev, _prompt(s)) == "system[1] changed"
