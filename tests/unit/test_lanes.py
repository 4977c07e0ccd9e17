"""Lanes by prefix (issue 33, item 1): a request joins the lane whose last prompt it extends, whatever its shape
(tools or none, model); side calls and new sessions get lanes of their own; a cache bust is only ever a
regression within one lane."""

from __future__ import annotations

import pytest

from coderouterd.affinity.canonical import Canonicaliser, segments
from coderouterd.affinity.lanes import LaneIndex
from coderouterd.affinity.service import Affinity, Placement
from coderouterd.affinity.slots import SlotTable
from coderouterd.config.schema import ConfigModel
from coderouterd.routing.request import ClientRequest
from tests.support.claude_sessions import Session

CANON = Canonicaliser()


def _prompt(body: dict):
    return segments(CANON.anthropic(body), "anthropic")


def _lane(idx: LaneIndex, s: Session, body: dict) -> str:
    return idx.resolve(_prompt(body), session="s:" + s.id, named=True, tools=bool(body.get("tools")),
                       model=body["model"])[0]


@pytest.mark.parametrize("tools", [True, False], ids=["tools", "no tools"])
def test_title_calls_never_join_the_conversation_and_its_turns_stay_together(tools):
    idx = LaneIndex()
    s = Session(1, tools=tools)
    main = _lane(idx, s, s.main_body())
    s.advance()
    lanes = set()
    for _ in range(4):
        title = _lane(idx, s, s.background_body())
        assert title != main
        lanes.add(title)
        assert _lane(idx, s, s.main_body()) == main
        s.advance()
    # The title calls (their message differs every time) share their own system prompt, which no conversation
    # holds: one side lane of the session, evicted before its conversation.
    assert len(lanes) == 1 and idx.spare(title) and not idx.spare(main)
    # Another session's title call shares that system prompt too, but not the session: a lane of its own.
    o = Session(2, tools=tools)
    _lane(idx, o, o.main_body())
    assert _lane(idx, o, o.background_body()) not in lanes | {main}


def test_a_session_without_tools_gets_the_same_lanes_as_one_with_tools():
    def run(tools: bool) -> list[int]:
        idx = LaneIndex()
        seen: dict[str, int] = {}
        sessions = [Session(i, tools=tools) for i in range(3)]
        out = []
        for t in range(4):
            for s in sessions:
                for body in ([s.main_body(), s.background_body()] if t % 2 else [s.main_body()]):
                    out.append(seen.setdefault(_lane(idx, s, body), len(seen)))
                s.advance()
        return out

    assert run(True) == run(False)
    assert run(False)[:3] == [0, 1, 2]  # three conversations, three lanes


def test_compaction_goes_to_the_lane_holding_the_history_with_or_without_tools():
    for tools in (True, False):
        idx = LaneIndex()
        s, other = Session(2, tools=tools), Session(3, tools=tools)
        main = _lane(idx, s, s.main_body())
        _lane(idx, other, other.main_body())
        s.advance()
        assert _lane(idx, s, s.main_body()) == main
        s.advance()
        assert _lane(idx, s, s.background_body()) != main
        assert _lane(idx, s, s.compaction_body()) == main


def test_three_interleaved_sessions_sharing_a_system_prompt_keep_three_lanes():
    idx = LaneIndex()
    sessions = [Session(10 + i) for i in range(3)]
    lanes: dict[int, set[str]] = {i: set() for i in range(3)}
    for _ in range(5):
        for i, s in enumerate(sessions):
            lanes[i].add(_lane(idx, s, s.main_body()))
            s.advance()
    assert all(len(v) == 1 for v in lanes.values()) and len(set().union(*lanes.values())) == 3


def test_a_new_session_gets_its_own_lane_even_when_it_began_like_another():
    idx = LaneIndex()
    a = Session(20)
    lane_a = _lane(idx, a, a.main_body())
    a.advance()
    _lane(idx, a, a.main_body())
    # Same system prompt and tools: a new lane, not a's.
    b = Session(21)
    p = _prompt(b.main_body())
    lane_b, why, continues = idx.resolve(p, session="s:" + b.id, named=True, tools=True, model="m")
    assert lane_b != lane_a and "system prompt and tools" in why and not continues
    # Another session whose first turn is word for word a's first turn: it shares a's history only in part (a
    # went on), so it forks; then each keeps its own lane.
    c = Session(20)
    c.id = "another-session"
    lane_c = _lane(idx, c, c.main_body())
    assert lane_c not in (lane_a, lane_b)
    a.advance()
    c.advance()
    assert _lane(idx, a, a.main_body()) == lane_a and _lane(idx, c, c.main_body()) == lane_c
    # The same session rewinding (a strict prefix of its history): still its lane.
    rewind = a.main_body()
    rewind["messages"] = rewind["messages"][:2]
    assert _lane(idx, a, rewind) == lane_a


def test_a_changed_system_prompt_or_tools_keeps_the_lane_so_the_bust_is_named():
    idx = LaneIndex()
    s = Session(30)
    lane = _lane(idx, s, s.main_body())
    s.advance()
    s.system_extra = " Today is Monday."
    assert _lane(idx, s, s.main_body()) == lane
    s.advance()
    s.tools = s.tools[:-1]
    assert _lane(idx, s, s.main_body()) == lane


def test_lanes_adopted_from_a_restored_slot_table_are_found_by_prefix():
    idx = LaneIndex()
    s = Session(31)
    p = _prompt(s.main_body())
    idx.adopt("restored-lane", p.digests)
    s.advance()
    assert _lane(idx, s, s.main_body()) == "restored-lane"


def test_the_index_is_bounded_in_lanes_and_entries():
    idx = LaneIndex(max_lanes=3, max_entries=10_000)
    for i in range(6):
        s = Session(40 + i)
        _lane(idx, s, s.main_body())
    assert len(idx.lanes) == 3
    small = LaneIndex(max_entries=12)
    for i in range(4):
        s = Session(50 + i)
        _lane(idx, s, s.main_body())
        _lane(small, s, s.main_body())
    assert small._entries <= 12 and len(small.lanes) >= 1
    # Forgetting removes every entry a lane held.
    for name in list(small.lanes):
        small.forget(name)
    assert small._entries == 0 and small._by_digest == {} and small._by_head == {} and small._sessions == {}


def test_the_lookup_does_not_walk_every_lane():
    """The lane is found by a binary search over the request's own digests, not by comparing it with each lane."""
    idx = LaneIndex()
    sessions = [Session(60 + i) for i in range(40)]
    for s in sessions:
        _lane(idx, s, s.main_body())
        s.advance()
    calls = []

    class Counting(dict):
        def __contains__(self, key):
            calls.append(1)
            return dict.__contains__(self, key)

    idx._by_digest = Counting(idx._by_digest)
    _lane(idx, sessions[7], sessions[7].main_body())
    assert len(calls) <= 8


def test_a_title_call_during_the_first_turn_is_spare_a_new_sessions_first_turn_is_not():
    idx = LaneIndex()
    s, other = Session(75), Session(76)
    main = _lane(idx, s, s.main_body())
    title = _lane(idx, s, s.background_body())  # sent while the first turn runs: the conversation has one turn
    first = _lane(idx, other, other.main_body())
    assert idx.spare(title) and not idx.spare(main) and not idx.spare(first)


# -- the slot table: spare lanes go first --------------------------------------------------------------------

def test_a_title_call_lane_is_evicted_before_any_conversation():
    idx = LaneIndex()
    t = SlotTable(2)
    a, b = Session(70), Session(71)

    def run(s: Session, body: dict, now: float) -> int:
        p = _prompt(body)
        lane = _lane(idx, s, body)
        c = t.choose(lane, p, spare=idx.spare)
        t.begin(c.slot, now)
        t.finish(c.slot, lane, p, now + 0.5)
        return c.slot

    slot_a = run(a, a.main_body(), 1.0)
    a.advance()
    run(a, a.main_body(), 2.0)
    title = run(a, a.background_body(), 3.0)
    assert title != slot_a
    # b's first turn: the conversation's slot is the least recently used, the title call's goes.
    assert run(b, b.main_body(), 4.0) == title
    assert t.slots[slot_a].lane is not None and "|" in t.slots[slot_a].lane


# -- cache-bust detection through the service ------------------------------------------------------------------

class _Strategy:
    upstream_wire = "openai"
    usage: dict = {}
    timings = None

    def __init__(self, prompt_tokens: int, cached: int) -> None:
        self.usage = {"input_tokens": prompt_tokens - cached, "cache_read_input_tokens": cached}
        self.raw_usage = {"prompt_tokens_details": {"cached_tokens": cached}}


def _affinity() -> Affinity:
    return Affinity(ConfigModel.model_validate({"providers": {"p": {"base_url": "http://127.0.0.1:9/v1"}},
                                                "profiles": {"default": {"providers": ["p"]}}}))


def _send(aff: Affinity, s: Session, body: dict, *, cached: int, tokens: int):
    req = ClientRequest(ingress="anthropic", body=body, raw=b"{}", headers=s.headers, stream=False,
                        model=body["model"], request_id="r")
    t = aff.ticket(req)
    assert t is not None
    aff.finish(t, Placement("p", None, None), None, ok=True, strategy=_Strategy(tokens, cached))  # type: ignore[arg-type]
    return t


@pytest.mark.parametrize("tools", [True, False], ids=["tools", "no tools"])
def test_no_bust_for_title_calls_between_main_turns_but_a_real_regression_is_named(tools):
    aff = _affinity()
    s = Session(80, tools=tools)
    busts = []
    tokens = 5000
    for turn in range(4):
        t = _send(aff, s, s.main_body(), cached=tokens - 600 if turn else 0, tokens=tokens)
        busts.append(t.bust)
        # The title call reuses nothing of the main turn, nor of the previous title call in its side lane (a
        # long one here): neither is a bust, it continues no history.
        busts.append(_send(aff, s, s.background_body(), cached=0, tokens=3000).bust)
        s.advance()
        tokens += 600
    assert busts == [None] * 8
    # The conversation's next turn reuses nothing of its previous one: that is a bust.
    t = _send(aff, s, s.main_body(), cached=0, tokens=tokens)
    assert t.bust is not None and t.bust.cause == "backend"
