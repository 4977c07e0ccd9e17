"""One upstream, one object (upstream/): its lifecycle's transition table, the registry's moves on process events,
and the lease, the only way a request waits for a process and the one count of requests in flight."""

from __future__ import annotations

import asyncio
import logging

import pytest

from coderouterd.state.events import ProcessEventName as E
from coderouterd.upstream.breaker import BreakerRegistry, BreakerState
from coderouterd.upstream.clock import ManualClock
from coderouterd.upstream.lifecycle import MOVES, Lifecycle, Phase
from coderouterd.upstream.upstream import CLOSED, TRIAL, Refused, Upstreams

CLOCK = ManualClock()


def registry() -> Upstreams:
    ups = Upstreams(BreakerRegistry(failures=1, recovery_s=30.0, clock=CLOCK))
    ups.configure(["p", "q"])
    return ups


def test_every_phase_has_its_moves_and_a_move_the_table_does_not_name_is_refused_and_logged(caplog):
    assert set(MOVES) == set(Phase)
    life = Lifecycle("p")
    assert life.phase is Phase.RESIDENT
    with caplog.at_level(logging.WARNING, "coderouterd.upstream"):
        assert life.move(Phase.CANNOT_START, "no room") is False  # a start that failed, of a process that is up
    assert life.phase is Phase.RESIDENT
    assert "refused lifecycle move resident -> cannot_start" in caplog.text
    assert life.move(Phase.DRAINING, "stopping")
    assert not life.move(Phase.CANNOT_START, "no room") and life.phase is Phase.DRAINING


def test_process_events_move_the_providers_it_serves_with_the_words_clients_are_told():
    ups = registry()
    seen: list[tuple[str, Phase, Phase]] = []
    ups.watch(lambda up, old, new: seen.append((up.name, old, new)))
    ups.process_event("llama", E.STARTED, ["p", "q"], "", wait_s=42.0, on_demand=False)
    assert ups.get("p").phase is Phase.STARTING and ups.get("q").life.wait_s == 42.0
    assert ups.out == {"p", "q"}
    assert ups.get("p").life.words() == "p's managed process llama is not ready (starting)"
    ups.process_event("llama", E.READY, ["p", "q"], "", wait_s=42.0, on_demand=False)
    assert ups.out == set()
    ups.process_event("llama", E.FATAL, ["p"], "exit 1", wait_s=42.0, on_demand=False)
    assert ups.get("p").phase is Phase.FATAL and "corectl start llama" in ups.get("p").life.why
    ups.process_event("llama", E.STOPPED, ["q"], "", wait_s=42.0, on_demand=True)
    assert ups.get("q").phase is Phase.STOPPED_ON_DEMAND
    assert seen[:2] == [("p", Phase.RESIDENT, Phase.STARTING), ("q", Phase.RESIDENT, Phase.STARTING)]


def test_a_stop_of_ours_leaves_it_startable_by_a_request_a_stop_by_hand_does_not():
    ups = registry()
    ups.draining(["p"], "llama", "idle", ours=True)
    ups.stopped(["p"], "llama", on_demand=False)
    assert ups.get("p").phase is Phase.STOPPED_ON_DEMAND
    ups.starting(["q"], "qwen", 30, "starting on demand")
    ups.move(["q"], Phase.RESIDENT)
    ups.draining(["q"], "qwen", "manual", ours=False)
    ups.stopped(["q"], "qwen", on_demand=False)
    assert ups.get("q").phase is Phase.STOPPED
    assert "`corectl restart qwen` starts it again" in ups.get("q").life.words()


def test_the_lease_admits_through_the_breaker_counts_in_flight_and_gives_the_trial_back():
    async def go():
        ups = registry()
        up = ups.get("p")
        async with up.lease(timeout=1) as lease:
            assert lease.admission == CLOSED and up.in_flight == 1
        assert up.in_flight == 0
        up.breaker.record_failure()  # failures = 1: open
        with pytest.raises(Refused) as e:
            async with up.lease(timeout=1):
                pass
        assert e.value.code == "breaker_open" and up.in_flight == 0
        CLOCK.advance(31)  # its recovery time has passed: half-open, one trial
        assert up.breaker.state is BreakerState.HALF_OPEN
        async with up.lease(timeout=1) as lease:
            assert lease.admission == TRIAL and up.breaker.trial_in_flight
        assert not up.breaker.trial_in_flight  # no verdict was reported: the trial is given back
    asyncio.run(go())


def test_the_lease_waits_for_a_starting_process_and_refuses_a_draining_one():
    async def go():
        ups = registry()
        up = ups.get("p")
        ups.starting(["p"], "llama", 30)

        async def ready_soon():
            await asyncio.sleep(0.01)
            ups.process_event("llama", E.READY, ["p"], "", wait_s=30, on_demand=False)

        task = asyncio.ensure_future(ready_soon())
        async with up.lease(timeout=5) as lease:
            assert up.phase is Phase.RESIDENT and lease.counted
        await task
        ups.draining(["p"], "llama", "manual", ours=False)
        with pytest.raises(Refused) as e:
            async with up.lease(timeout=5):
                pass
        assert e.value.code == "not_ready" and "stopping: manual" in e.value.words
        ups.starting(["q"], "qwen", 30)
        with pytest.raises(Refused):  # its start does not end within the lease's timeout
            async with ups.get("q").lease(timeout=0.01):
                pass
        ups.process_event("qwen", E.FATAL, ["q"], "exit 1", wait_s=30, on_demand=False)
        with pytest.raises(Refused) as e:  # not coming back by itself: refused at once
            async with ups.get("q").lease(timeout=5):
                pass
        assert e.value.code == "cannot_start"
    asyncio.run(go())


def test_a_lease_on_a_model_stopped_on_demand_takes_a_turn_and_is_served_once_it_is_up():
    class Turn:
        def __init__(self) -> None:
            self.ready = asyncio.get_running_loop().create_future()
            self.state = "waiting"

        def waiting(self) -> bool:
            return self.state == "waiting"

        def admitted(self) -> bool:
            return self.state == "admitted"

    class Starter:
        def __init__(self) -> None:
            self.turns: list[Turn] = []
            self.begun: list[str] = []
            self.ended: list[str] = []

        def can_start(self, provider: str) -> bool:
            return True

        def demand(self, provider: str, *, background: bool = False) -> Turn | None:
            if ups.get(provider).phase is not Phase.STOPPED_ON_DEMAND:
                return None
            t = Turn()
            self.turns.append(t)
            return t

        def begin(self, provider: str, turn=None) -> bool:
            self.begun.append(provider)
            return True

        def end(self, provider: str) -> None:
            self.ended.append(provider)

        def release(self, turn) -> None:
            turn.state = "gone"

    async def go():
        starter = Starter()
        ups.starter = starter
        ups.stopped(["p"], "llama", on_demand=True, first=True)

        async def come_up():
            while not starter.turns:
                await asyncio.sleep(0)
            ups.process_event("llama", E.READY, ["p"], "", wait_s=30, on_demand=True)
            t = starter.turns[0]
            t.state = "admitted"
            t.ready.set_result(True)

        task = asyncio.ensure_future(come_up())
        async with ups.get("p").lease(timeout=5):
            assert ups.get("p").in_flight == 1 and starter.begun == ["p"]
        await task
        assert starter.ended == ["p"] and ups.get("p").in_flight == 0
        assert len(starter.turns) == 1  # one turn, used by the request (nothing left to give back)

    ups = registry()
    asyncio.run(go())


def test_the_registry_has_every_configured_provider_from_the_start_and_forgets_removed_ones():
    ups = registry()
    assert sorted(ups.names()) == ["p", "q"]
    ups.starting(["q"], "qwen", 30)
    ups.configure(["p"])
    assert ups.names() == ["p"] and ups.out == set()


def test_a_start_says_how_long_its_window_has_left():
    from tests.support.routing import Routing, chain_config

    r = Routing(chain_config("a"))
    assert r.state.start_left("a") is None  # resident
    r.state.upstreams.starting(["a"], "llama", 30)
    r.clock.advance(12)
    assert r.state.start_left("a") == 18
    r.clock.advance(40)
    assert r.state.start_left("a") == 0  # past its window: it has come up or failed by now
    r.state.upstreams.process_event("llama", E.READY, ["a"], "", wait_s=30, on_demand=False)
    assert r.state.start_left("a") is None


def test_a_wait_for_the_phase_to_change_ends_at_the_next_move_or_its_timeout():
    """routing/starts.py: a request that saw its server's connection go waits for the supervisor's news."""
    async def go():
        ups = registry()
        up = ups.get("p")
        assert await up.life.left(Phase.STARTING, 5)  # not in it: at once
        assert not await up.life.left(Phase.RESIDENT, 0.01)  # nothing moves it

        async def exited():
            await asyncio.sleep(0)
            ups.process_event("llama", E.EXITED, ["p"], "killed by SIGKILL", wait_s=30, on_demand=False)

        task = asyncio.ensure_future(exited())
        assert await up.life.left(Phase.RESIDENT, 5)
        await task
        assert up.phase is Phase.STARTING
        lease = ups.lease("p")
        assert lease.want() and lease.starting == 30  # what the request waits on, within the start timeout
    asyncio.run(go())


def test_the_lifecycle_counts_changes_of_phase_not_new_words():
    """routing/starts.py: RESIDENT with another count than at a death is a server that came back since."""
    ups = registry()
    up = ups.get("p")
    before = up.life.moves
    ups.move(["p"], up.phase, "the same phase, other words")
    assert up.life.moves == before
    ups.process_event("llama", E.EXITED, ["p"], "killed by SIGKILL", wait_s=30, on_demand=False)
    ups.process_event("llama", E.READY, ["p"], "", wait_s=30, on_demand=False)
    assert up.phase is Phase.RESIDENT and up.life.moves == before + 2
