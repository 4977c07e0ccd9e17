"""Swaps only when they pay: the pure turn decision (turns.py) and the on-demand scheduler's turns over fake
effects. No processes, no sleeping for a deadline: the clock is a number the test moves, then the dispatcher is
told to look again."""

from __future__ import annotations

import asyncio

from coderouterd.supervise.residency import ResidencyPolicy, Resident
from coderouterd.supervise.turns import Go, Hold, Refuse, Want, decide, swap_cost
from tests.unit.test_residency import Clock, CountedPolicy, run, scheduler, settle, started

# -- the decision -------------------------------------------------------------------------------------------------


def two(budget=1500, **resident) -> tuple[ResidencyPolicy, Clock]:
    clock = Clock()
    p = CountedPolicy(budget, clock=clock, min_resident_s=resident.pop("min_resident_s", 0.0))
    p.configure([Resident("a", 1000), Resident("b", 1000), Resident("c", 200)], budget)
    return p, clock


def test_a_want_that_fits_goes_at_once():
    p, clock = two(budget=0)
    assert decide([Want("a", clock.t, foreground=1)], p, holding=set(), starting=set(), hold_s=5, now=clock.t) == \
        Go("a", [])


def test_an_idle_resident_is_swapped_out_at_once():
    p, clock = two()
    assert decide([Want("b", clock.t, foreground=1)], p, holding={"a"}, starting=set(), hold_s=5,
                  now=clock.t) == Go("b", ["a"])


def test_a_busy_resident_is_kept_for_the_hold_then_swapped_out_for_a_foreground_want():
    p, clock = two()
    p.begin("a")
    w = [Want("b", clock.t, foreground=2)]
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 5
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 5) == Go("b", ["a"])


def test_a_background_want_never_stops_a_busy_model_however_long_it_waited():
    p, clock = two()
    p.begin("a")
    w = [Want("b", clock.t, background=3)]
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 10_000) == Hold(
        None, "a is serving 1 request(s): a background request never stops it", "b")
    p.end("a")
    # Idle for a moment only (an agent between two tool calls): the background want waits for the hold too.
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 5
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 5) == Go("b", ["a"])


def loads(p: ResidencyPolicy, **load_s: float) -> None:
    """Load times as learned from earlier starts of each model (residency.py `started`)."""
    for name, s in load_s.items():
        p.residents[name].load_s = s


def test_a_swap_that_loads_fast_is_not_held_longer_than_it_costs():
    # a serves; b is wanted. Both load in 0.3 s: the swap costs b's load now and a's when it is wanted again,
    # ~0.6 s. Waiting as long as that, then swapping (ski rental), not the 5 s a slow load is worth.
    p, clock = two()
    loads(p, a=0.3, b=0.3)
    p.begin("a")
    w = [Want("b", clock.t, foreground=2)]
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 0.6 and d.hold_s == 0.6 and d.target == "b"
    assert d.why == "held to save a swap (~0.6 s: the load times learned) until 0.6s from now"
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 0.6) == Go("b", ["a"])


def test_an_unknown_load_counts_nothing_and_none_known_keeps_swap_hold_s():
    p, clock = two()
    p.begin("a")
    w = [Want("b", clock.t, foreground=1)]
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 5 and d.hold_s == 5
    assert d.why == "held to save a swap until 5.0s from now"  # no load time to speak of
    loads(p, b=0.4)  # the target's load is known, the victim's not yet: the known one bounds the hold
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 0.4 and "~0.4 s" in d.why


def test_a_slow_load_is_still_held_no_longer_than_swap_hold_s():
    p, clock = two()
    loads(p, a=30.0, b=25.0)
    p.begin("a")
    w = [Want("b", clock.t, foreground=1)]
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 5 and d.hold_s == 5
    assert d.why == "held to save a swap (~55.0 s: the load times learned) until 5.0s from now"
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 5) == Go("b", ["a"])
    # swap_hold_s = 0 stays "no hold", whatever the loads.
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=0, now=clock.t) == Go("b", ["a"])


def test_a_model_being_stopped_anyway_adds_nothing_to_the_swap_cost():
    p, clock = two(budget=2000)
    loads(p, a=2.0, b=1.0, c=40.0)
    p.residents["c"].draining = True  # stopped by hand meanwhile: its memory goes whatever b does
    assert swap_cost("b", ["a", "c"], p) == 3.0
    assert swap_cost("b", [], two()[0]) is None


def test_a_background_want_waits_for_the_whole_idle_hold_however_fast_the_loads():
    # Decided (docs/decisions.md): the idle window guesses whether an agent is between two tool calls, which no
    # load time tells, and the reload it risks lands on a request a user waits for.
    p, clock = two()
    loads(p, a=0.3, b=0.3)
    p.begin("a")
    w = [Want("b", clock.t, background=1)]
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 100)
    assert isinstance(d, Hold) and d.until is None and "never stops it" in d.why
    p.end("a")
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 0.6)
    assert isinstance(d, Hold) and d.until == clock.t + 5 and d.hold_s == 5
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t + 5) == Go("b", ["a"])


def test_a_model_some_requests_were_promised_is_kept_until_they_begin():
    p, clock = two()
    p.residents["a"].admitted = 1
    d = decide([Want("b", clock.t - 100, foreground=1)], p, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold) and d.until is None


def test_a_model_still_starting_is_never_stopped_for_another():
    p, clock = two()
    d = decide([Want("b", clock.t - 100, foreground=1)], p, holding={"a"}, starting={"a"}, hold_s=0, now=clock.t)
    assert isinstance(d, Hold) and d.until is None and "starting" in d.why


def test_minimum_residency_holds_even_an_idle_model():
    p, clock = two(min_resident_s=4)
    p.started("a", 2.0)
    w = [Want("b", clock.t, foreground=1)]
    d = decide(w, p, holding={"a"}, starting=set(), hold_s=0, now=clock.t)
    assert isinstance(d, Hold) and d.until == clock.t + 4
    assert decide(w, p, holding={"a"}, starting=set(), hold_s=0, now=clock.t + 4) == Go("b", ["a"])


def test_foreground_goes_before_background_and_the_longest_waiting_first():
    p, clock = two(budget=1000)
    wants = [Want("b", clock.t - 50, background=1), Want("a", clock.t - 1, foreground=1)]
    assert decide(wants, p, holding=set(), starting=set(), hold_s=0, now=clock.t) == Go("a", [])


def test_a_later_want_goes_ahead_of_a_held_one_only_if_it_stops_nothing():
    p, clock = two(budget=1500)
    p.begin("a")
    wants = [Want("b", clock.t, foreground=1), Want("c", clock.t + 1, foreground=1)]
    # b needs a's memory and is held; c fits beside a: it goes.
    assert decide(wants, p, holding={"a"}, starting=set(), hold_s=5, now=clock.t) == Go("c", [])
    p2, _ = two(budget=1100)
    p2.begin("a")
    d = decide(wants, p2, holding={"a"}, starting=set(), hold_s=5, now=clock.t)
    assert isinstance(d, Hold)  # c would need a's memory too: it does not take b's turn


def test_a_want_that_can_never_fit_is_refused():
    p, clock = two(budget=500)
    d = decide([Want("a", clock.t, foreground=1)], p, holding=set(), starting=set(), hold_s=0, now=clock.t)
    assert isinstance(d, Refuse) and d.target == "a"


def test_load_times_are_learned_from_the_starts():
    p, _ = two()
    p.started("a", 4.0)
    assert p.residents["a"].load_s == 4.0
    p.started("a", 2.0)
    assert p.residents["a"].load_s == 3.0


# -- the scheduler's turns ----------------------------------------------------------------------------------------


async def kick(sch, n=30):
    sch._kick.set()
    await settle(n)


def test_the_loop_a_swap_that_started_serves_what_waited_and_the_other_waits_its_turn():
    run(_loop())


async def _loop():
    # The trace that failed: while a is swapped in for its requests, b is wanted, and back. Each turn is served,
    # one swap per change, and the model that came up is kept until its requests have begun.
    sch, fx, clock = scheduler(1500, [Resident("a", 1000), Resident("b", 1000)])
    fx.gates["a"] = asyncio.Event()
    a1, a2 = sch.demand("prov-a"), sch.demand("prov-a")
    await settle()
    b1 = sch.demand("prov-b")  # wanted while a loads
    fx.gates["a"].set()
    assert await a1.ready and await a2.ready
    await kick(sch)
    # a came up for a1 and a2: b's turn does not take it away before they begin.
    assert fx.state == {"a": "ready", "b": "stopped"} and not b1.ready.done()
    assert sch.begin("prov-a", a1) and sch.begin("prov-a", a2)
    sch.end("prov-a")
    sch.end("prov-a")
    assert await b1.ready
    assert sch.begin("prov-b", b1)
    a3 = sch.demand("prov-a")  # a again while b serves: waits its turn, then is served
    sch.end("prov-b")
    assert await a3.ready and sch.begin("prov-a", a3)
    sch.end("prov-a")
    assert [e[1] for e in fx.log if e[0] == "start"] == ["a", "b", "a"] and fx.max_held_together == 1
    assert sch.swaps == 2
    await sch.close()


def test_requests_for_the_same_model_are_collated_within_the_hold_and_served_by_one_swap():
    run(_collate())


async def _collate():
    sch, fx, clock = scheduler(1500, [Resident("a", 1000), Resident("b", 1000)], hold_s=5)
    assert await started(sch, "prov-a")
    # The fakes load in no time on the test's clock; loads of 3 s each make a swap worth more than the hold, so
    # the hold is swap_hold_s (a fast load shortens it: the test after this one).
    loads(sch.policy, a=3.0, b=3.0)
    assert sch.begin("prov-a")  # a is busy
    b = [sch.demand("prov-b")]
    for _ in range(3):
        clock.t += 1
        await kick(sch)
        b.append(sch.demand("prov-b"))
        assert sch.begin("prov-a")  # the resident model keeps serving meanwhile
        sch.end("prov-a")
    assert fx.state["a"] == "ready" and not any(t.ready.done() for t in b)
    snap = sch.snapshot()["processes"]["b"]
    assert snap["waiting"] == 4 and snap["hold_s"] == 5  # every held request is visible, and for how long
    assert snap["held"].startswith("held to save a swap (~6.0 s: the load times learned) until ")
    clock.t += 2  # the oldest has been held 5 s: a is drained, its request finishes, then b comes up once
    await kick(sch)
    assert sch.begin("prov-a") is False
    sch.end("prov-a")
    assert all([await t.ready for t in b])
    assert [e[1] for e in fx.log if e[0] == "start"] == ["a", "b"] and sch.swaps == 1
    await sch.close()


def test_requests_behind_a_fast_swap_are_held_only_as_long_as_the_loads_learned():
    run(_fast_swap())


async def _fast_swap():
    sch, fx, clock = scheduler(1500, [Resident("a", 1000), Resident("b", 1000)], hold_s=5)
    real_start = fx.start

    async def loading(name, wait=True):
        clock.t += 0.25  # each load takes 0.25 s on the test's clock: learned from the starts
        return await real_start(name, wait)

    fx.start = loading
    assert await started(sch, "prov-b")
    clock.t += 10
    assert await started(sch, "prov-a")  # b made room: both loads are learned now
    assert sch.snapshot()["processes"]["b"]["load_s"] == 0.25
    assert sch.begin("prov-a")  # a is busy
    b = sch.demand("prov-b")
    await kick(sch)
    snap = sch.snapshot()["processes"]["b"]
    assert snap["hold_s"] == 0.5 and "(~0.5 s: the load times learned)" in snap["held"]
    assert not b.ready.done() and sch.begin("prov-a")  # a serves on within the hold
    sch.end("prov-a")
    clock.t += 0.5  # held as long as the swap costs, not swap_hold_s: a is drained, then b comes up
    await kick(sch)
    assert sch.begin("prov-a") is False
    sch.end("prov-a")
    assert await b.ready
    assert sch.snapshot()["processes"]["b"]["hold_s"] is None  # nothing held any more
    assert [e[1] for e in fx.log if e[0] == "start"] == ["b", "a", "b"] and sch.swaps == 2
    await sch.close()


def test_a_background_request_never_stops_a_busy_model_and_waits_until_it_is_idle():
    run(_background())


async def _background():
    sch, fx, clock = scheduler(1500, [Resident("a", 1000), Resident("b", 1000)], hold_s=5)
    assert await started(sch, "prov-a")
    assert sch.begin("prov-a")
    title = sch.demand("prov-b", background=True)
    clock.t += 10_000
    await kick(sch)
    assert not title.ready.done() and fx.state["a"] == "ready"
    sch.end("prov-a")  # idle now, but only just: a is likely wanted again
    clock.t += 4
    await kick(sch)
    assert not title.ready.done()
    clock.t += 1  # idle for the hold: the title's turn
    await kick(sch)
    assert await title.ready and fx.state == {"a": "stopped", "b": "ready"}
    await sch.close()


def test_a_model_just_started_keeps_its_minimum_residency_against_idle_and_room_stops():
    run(_residency())


async def _residency():
    sch, fx, clock = scheduler(1500, [Resident("a", 1000, idle_stop_s=1), Resident("b", 1000)], min_resident_s=8)
    assert await started(sch, "prov-a")
    assert sch.policy.idle_left("a") == 8  # the idle stop waits for the minimum residency too
    b = sch.demand("prov-b")
    clock.t += 7
    await kick(sch)
    assert fx.state["a"] == "ready" and not b.ready.done()
    clock.t += 1
    await kick(sch)
    assert await b.ready and fx.state["a"] == "stopped"
    await sch.close()


def test_a_released_turn_frees_the_model_it_was_promised():
    run(_released())


async def _released():
    sch, fx, clock = scheduler(1500, [Resident("a", 1000), Resident("b", 1000)])
    a = sch.demand("prov-a")
    assert await a.ready  # admitted, then the client went away before it began
    b = sch.demand("prov-b")
    await kick(sch)
    assert not b.ready.done()
    sch.release(a)
    assert await b.ready
    await sch.close()


def test_the_load_time_is_learned_from_its_own_starts_and_shown():
    run(_learned())


async def _learned():
    sch, fx, clock = scheduler(0, [Resident("a", 1000)])
    real_start = fx.start

    async def slow(name, wait=True):
        clock.t += 3.0  # the load, on the injected clock
        return await real_start(name, wait)

    fx.start = slow
    assert await started(sch, "prov-a")
    assert sch.snapshot()["processes"]["a"]["load_s"] == 3.0
    await sch.close()


async def _random_trace(seed: int, load_s: float = 0.0) -> tuple[list[bool], int, int, int]:
    """Requests for a and b arriving at random, some background, each served for a few ticks after its turn came:
    (every request's turn came, starts, changes of the demanded model, most processes holding memory at once).
    `load_s`: each start takes that long on the clock (learned, it bounds the hold)."""
    import random

    rnd = random.Random(seed)
    sch, fx, clock = scheduler(1500, [Resident("a", 1000), Resident("b", 1000)], hold_s=3, min_resident_s=2)
    real_start = fx.start

    async def loading(name, wait=True):
        clock.t += load_s
        return await real_start(name, wait)

    fx.start = loading
    order: list[str] = []
    served: list[bool] = []

    async def request(name: str, background: bool) -> None:
        order.append(name)
        for _ in range(20):  # a request refused by a draining model takes a turn again, as the executor does
            if fx.state[name] == "ready" and sch.begin(f"prov-{name}"):
                break
            turn = sch.demand(f"prov-{name}", background=background)
            if await turn.ready and sch.begin(f"prov-{name}", turn):
                break
        else:
            served.append(False)
            return
        for _ in range(rnd.randint(1, 6)):
            await asyncio.sleep(0)
        sch.end(f"prov-{name}")
        served.append(True)

    tasks = []
    for _ in range(40):
        tasks.append(asyncio.ensure_future(request(rnd.choice("ab"), rnd.random() < 0.4)))
        clock.t += rnd.random()
        await kick(sch, rnd.randint(0, 5))
    while not all(t.done() for t in tasks):
        clock.t += 0.5
        await kick(sch, 5)
    await sch.close()
    changes = sum(1 for x, y in zip(order, order[1:], strict=False) if x != y)
    return served, len([e for e in fx.log if e[0] == "start"]), changes, fx.max_held_together


def test_random_traces_serve_every_request_never_hold_both_and_swap_at_most_once_per_change():
    # Loads of 0 s (a swap worth nothing: no hold), 0.6 s (a hold of 1.2 s) and 5 s (swap_hold_s bounds it).
    for load_s in (0.0, 0.6, 5.0):
        for seed in range(20):
            served, starts, changes, together = run(_random_trace(seed, load_s))
            assert served == [True] * 40, (seed, load_s)
            assert together == 1, (seed, load_s)
            assert starts - 1 <= changes, (seed, load_s, starts, changes)
