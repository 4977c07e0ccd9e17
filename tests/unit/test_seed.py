"""Issue 44 §0: a new lane starts from the longest prefix any slot of its server holds, copied when the server's
learnt copy cost is below its prefill cost, or placed in that slot when no lane that matters is lost."""

from __future__ import annotations

import pytest

from coderouterd.affinity.canonical import Canonicaliser, segments
from coderouterd.affinity.service import seed_words
from coderouterd.affinity.slots import SlotTable
from coderouterd.kvcache.costs import CopyCosts, Line
from tests.support.claude_sessions import Session


def _prompt(s: Session):
    return segments(Canonicaliser().anthropic(s.main_body()), "anthropic")


def _served(t: SlotTable, lane: str, s: Session, now: float, **kw):
    c = t.choose(lane, _prompt(s), **kw)
    t.begin(c.slot, now)
    t.finish(c.slot, lane, _prompt(s), now + 0.5)
    return c


# -- what a copy costs, learnt ----------------------------------------------------------------------------------


def test_a_cost_is_unknown_until_measured_then_a_line_through_what_was_measured():
    line = Line()
    assert line.at(1000) is None
    line.add(1000, 0.5)
    assert line.at(2000) == pytest.approx(1.0)  # one size seen: proportional
    line.add(3000, 0.9)  # 0.2 s/1000 tokens plus 0.3 s fixed
    assert line.at(5000) == pytest.approx(0.3 + 5 * 0.2, rel=0.01)
    assert line.at(0) == pytest.approx(0.3, rel=0.01)
    line.add(0, 5.0)  # an action that reports no tokens teaches nothing
    assert line.at(5000) == pytest.approx(1.3, rel=0.01)


def test_recent_measurements_count_more():
    line = Line()
    for _ in range(10):
        line.add(1000, 1.0)
    for _ in range(10):
        line.add(1000, 0.1)  # the page cache warmed
    assert line.at(1000) < 0.2


def test_a_copy_needs_both_a_save_and_a_restore_measured():
    c = CopyCosts()
    c.save.add(1000, 0.1)
    assert c.copy_s(1000) is None and c.as_dict()["copy_1000_s"] is None
    c.restore.add(1000, 0.05)
    assert c.copy_s(2000) == pytest.approx(0.3)


# -- choosing ---------------------------------------------------------------------------------------------------


def test_a_new_lane_copies_the_shared_prefix_when_the_copy_is_cheaper():
    t = SlotTable(3, can_save=True, clone_min_bytes=1024)
    _served(t, "A", Session(1), 1.0)
    asked: list[tuple[int, int]] = []

    def pays(gain: int, donor: int) -> bool:
        asked.append((gain, donor))
        return True

    c = t.choose("B", _prompt(Session(2)), seed_pays=pays)
    assert c.restore is not None and c.saves == [(0, c.restore)] and c.slot != 0
    assert c.seeded == (0, "A", c.predicted) and c.predicted > 50_000  # system prompt and tools
    gain, donor = asked[0]
    assert gain == c.predicted and donor == t.slots[0].ends[-1] > gain  # the donor's whole slot is copied


def test_a_new_lane_computes_the_prefix_when_that_is_cheaper():
    t = SlotTable(3, can_save=True, clone_min_bytes=1024)
    _served(t, "A", Session(1), 1.0)
    c = t.choose("B", _prompt(Session(2)), seed_pays=lambda gain, donor: False)
    assert c.restore is None and c.saves == [] and c.seeded is None and c.predicted == 0
    assert "computing the shared prefix is cheaper than copying slot 0" in c.why


def test_a_busy_slot_is_no_donor_but_an_idle_one_holding_the_prefix_is():
    t = SlotTable(3, can_save=True, clone_min_bytes=1024)
    a, b = Session(1), Session(2)
    _served(t, "A", a, 1.0)
    _served(t, "B", b, 2.0)
    a.advance()  # A's slot now holds more, and is busy
    t.begin(t.owned("A").id, 3.0)
    c = t.choose("C", _prompt(Session(3)))
    assert c.saves and c.saves[0][0] == t.owned("B").id and c.seeded is not None and c.seeded[1] == "B"


def test_below_the_least_prefix_worth_a_copy_nothing_is_copied():
    t = SlotTable(2, can_save=True, clone_min_bytes=10**9)
    _served(t, "A", Session(1), 1.0)
    c = t.choose("B", _prompt(Session(2)), seed_pays=lambda gain, donor: True)
    assert c.restore is None and c.seeded is None


def test_a_new_lane_takes_the_side_lane_slot_holding_its_prefix_rather_than_another():
    """No free slot: a side lane is evicted anyway. The one whose slot holds the prefix goes, so nothing need be
    copied; it is saved first, so nothing that matters is lost."""
    t = SlotTable(3, can_save=True, clone_min_bytes=1024)
    side = Session(9)  # same shape as the others: the shared system prompt and tools
    _served(t, "main-1", Session(1), 1.0)
    t.finish(t.choose("title", segments(Canonicaliser().anthropic(Session(5).background_body()),
                                        "anthropic")).slot, "title", None, 1.5)  # holds nothing shared
    _served(t, "side", side, 2.0)  # a side lane (never continued) holding the system prompt and tools
    spare = {"title", "side"}
    c = t.choose("B", _prompt(Session(2)), spare=lambda lane: lane in spare, seed_pays=lambda g, d: True)
    assert c.evicted == "side" and c.restore is None and c.predicted > 50_000
    assert c.saves == [(c.slot, c.saves[0][1])]  # the side lane is saved before it is overwritten
    assert c.seeded == (c.slot, "side", c.predicted) and "placed where its prefix is" in c.why


def test_a_free_slot_holding_the_prefix_is_taken_and_named():
    t = SlotTable(2, can_save=False)
    _served(t, "A", Session(1), 1.0)
    t.slots[0].lane = None  # A moved away; its old prompt is still in the slot
    c = t.choose("B", _prompt(Session(2)))
    assert c.slot == 0 and c.seeded == (0, None, c.predicted) and c.predicted > 50_000


def test_explain_words():
    assert seed_words({"from_lane": "lane:1a2b3c", "from_slot": 0, "tokens": 1112, "how": "copied"}) == \
        "seeded from lane:1a2b3c: 1,112 tokens (copied)"
    assert seed_words({"from_lane": None, "from_slot": 2, "tokens": 40, "how": "placed"}) == \
        "seeded from slot 2: 40 tokens (placed in its slot)"


def test_the_service_copies_only_when_the_servers_measured_copy_beats_its_measured_prefill():
    """Both costs from the server: its saves and restores timed by kvcache, its prefill speed from `timings`."""
    from coderouterd.affinity.service import Affinity
    from coderouterd.config.schema import ConfigModel

    cfg = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://x"}},
                                      "profiles": {"default": {"providers": ["p"]}}})
    aff = Affinity(cfg)
    p = aff.index.provider("p")
    p.bytes_per_token = 4.0
    p.learn(prompt_bytes=40_000, prompt_tokens=10_000, cached_tokens=0, processed_tokens=10_000, prefill_s=5.0,
            duration_s=6.0)  # 2,000 tokens a second
    pays = aff._seed_pays("p", p)
    gain, donor = 4 * 1000, 4 * 3000  # a 1,000-token prefix (0.5 s to compute) from a 3,000-token slot
    assert pays(gain, donor)  # never timed: one copy is how it is learnt
    costs = aff.kvcache.costs.setdefault("p", CopyCosts())
    costs.save.add(3000, 0.05)
    costs.restore.add(3000, 0.05)
    assert pays(gain, donor)  # 0.1 s to copy against 0.5 s to compute
    for _ in range(5):  # a slow disk: each action 0.4 s
        costs.save.add(3000, 0.4)
        costs.restore.add(3000, 0.4)
    assert not pays(gain, donor)
    assert pays(4 * 3000, donor)  # the whole slot's worth (1.5 s to compute) still pays


def test_corectl_status_says_how_many_lanes_were_seeded_and_what_a_copy_costs():
    from corectl.render import slot_cache_lines

    warm = {"saves": 3, "save_bytes": 10, "save_s": 0.1, "restores": 3, "restore_bytes": 10, "restore_s": 0.1,
            "disk_bytes": 20, "copies": 3, "copy_1000_s": 0.0123}
    line = slot_cache_lines([{"name": "llama", "cache": {"slots": {"warm": warm}}}])[0].plain
    assert "3 new lane(s) seeded by a copy, ~0.012 s per 1,000 tokens" in line
