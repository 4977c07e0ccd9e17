"""`OnDemand.adopt_running` (issue 43, D2): a model found running at the daemon's start is resident like one we
started: it holds memory (its configured size, its measured rss when none is known), shows in the snapshot, and is
stopped first to make room. Over the fake effects of test_residency."""

from __future__ import annotations

from coderouterd.supervise.ondemand import room_for
from coderouterd.supervise.residency import Resident
from tests.unit.test_residency import run, scheduler, started


def test_an_adopted_model_holds_its_memory_and_is_stopped_first_to_make_room():
    run(_adopted_holds_and_makes_room())


async def _adopted_holds_and_makes_room():
    sch, fx, clock = scheduler(6000, [Resident("a", 4000), Resident("b", 2500)])
    fx.state["a"] = "ready"  # the supervisor adopted it before anything started
    clock.t += 5
    sch.adopt_running("a", 3900.0)  # a's memory is configured: the measured rss does not replace it
    snap = sch.snapshot()
    assert snap["memory_held_mb"] == 4000 and snap["processes"]["a"]["resident"] is True
    assert sch.policy.residents["a"].last_used == clock.t  # just used: its idle time starts now
    sch.adopt_running("nobody", 1.0)  # not configured: nothing to count
    clock.t += 1
    assert await started(sch, "prov-b")  # 4000 + 2500 > 6000: the adopted one is stopped before b starts
    assert ("stop", "a", room_for("b")) in fx.log and fx.max_held_together == 1
    assert fx.state == {"a": "stopped", "b": "ready"}
    await sch.close()


def test_an_adopted_model_of_unknown_size_holds_what_it_was_measured_holding():
    run(_unknown_size())


async def _unknown_size():
    sch, fx, _ = scheduler(6000, [Resident("a", 0)])  # no memory_mb, and no estimate (no model file to read)
    fx.state["a"] = "ready"
    sch.adopt_running("a", 2500.0)
    assert sch.snapshot()["memory_held_mb"] == 2500.0
    sch.adopt_running("a", None)  # rss unreadable: what is known stays
    assert sch.policy.residents["a"].memory_mb == 2500.0
    await sch.close()
