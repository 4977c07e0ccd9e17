"""When a 529/503 made while a local model starts tells the client to come back (Retry-After): by the load time its
own starts taught (supervise/ondemand.py), else the rest of its start window (the upstream's lifecycle, through routing/state.py), rounded up to
whole seconds by the reply (routing/replies.py). A start that nobody can time gives no Retry-After."""

from __future__ import annotations

import asyncio

from coderouterd.config.schema import ConfigModel
from coderouterd.routing.planner import Skip
from coderouterd.routing.replies import nothing_attempted
from coderouterd.routing.router import Router
from coderouterd.routing.state import RoutingState
from coderouterd.supervise.residency import Resident
from coderouterd.upstream.clock import ManualClock
from coderouterd.upstream.lifecycle import Phase
from tests.unit.test_residency import scheduler, settle

CFG = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://127.0.0.1:1/v1"}},
                                  "profiles": {"default": {"providers": ["p"]}}})


def test_the_rest_of_the_start_window_when_no_load_time_was_learned():
    clock = ManualClock()
    st = RoutingState(CFG, clock=clock)
    ups = st.upstreams
    assert st.start_left("p") is None  # up: nothing to wait for
    ups.starting(["p"], "x", 60, "starting on demand")
    clock.advance(15.25)
    assert st.start_left("p") == 44.75
    assert Router(st).start_eta("p") == 44.75
    ups.stopped(["p"], "x", on_demand=True, first=True)  # not coming: nobody can say when
    assert st.start_left("p") is None
    ups.starting(["p"], "x", 60)
    ups.move(["p"], Phase.RESIDENT, process="x")
    assert st.start_left("p") is None


class _Learned:
    def start_eta(self, provider: str) -> float | None:
        return 7.5 if provider == "p" else None


def test_the_learned_load_time_comes_first():
    st = RoutingState(CFG, clock=ManualClock())
    st.upstreams.starting(["p"], "x", 60)
    st.upstreams.starter = _Learned()  # type: ignore[assignment]
    assert Router(st).start_eta("p") == 7.5


def test_on_demand_knows_the_rest_of_a_start_by_the_load_time_it_learned():
    asyncio.run(_learned())


async def _learned():
    sch, fx, clock = scheduler(0, [Resident("a", 1)])
    fx.gates["a"] = gate = asyncio.Event()
    turn = sch.demand("prov-a")
    await settle()
    assert sch.start_eta("prov-a") is None  # a first start: no load time learned yet
    clock.t += 20.0
    gate.set()
    assert await turn.ready is True
    sch.release(turn)
    assert sch.start_eta("prov-a") is None  # ready: not starting
    await sch.stop("a", "idle")
    gate.clear()
    turn = sch.demand("prov-a")
    await settle()
    clock.t += 5.0
    assert sch.start_eta("prov-a") == 15.0  # 20 s learned, 5 s into this start
    clock.t += 30.0
    assert sch.start_eta("prov-a") == 0.0  # late: any moment now, never negative
    gate.set()
    assert await turn.ready is True
    sch.release(turn)
    await sch.close()


def test_the_reply_rounds_the_soonest_known_time_up_to_whole_seconds():
    skips = [Skip("a", "not_ready", "starting", overridable=False, retry_in_s=14.2),
             Skip("b", "breaker_open", "breaker open", retry_in_s=30.0)]
    r = nothing_attempted(skips, ingress="anthropic", profile="default", summary="")
    assert (r.status, r.headers) == (529, {"retry-after": "15"})
    r = nothing_attempted([Skip("a", "not_ready", "starting", overridable=False, retry_in_s=0.0)],
                          ingress="openai", profile="default", summary="")
    assert (r.status, r.headers) == (503, {"retry-after": "1"})  # never 0: a client told 0 comes straight back
    r = nothing_attempted([Skip("a", "not_ready", "starting", overridable=False)], ingress="openai",
                          profile="default", summary="")
    assert r.status == 503 and r.headers is None  # nobody knows when: no time is invented


def test_every_attempt_busy_takes_the_soonest_reopening_of_those_skipped():
    from coderouterd.providers.errors import http_error
    from coderouterd.routing.replies import all_failed

    busy = http_error(503, "Loading model")
    skipped = [Skip("b", "breaker_open", "breaker open", retry_in_s=9.4)]
    r = all_failed([busy], ingress="openai", profile="default", summary="", skips=skipped)
    assert (r.status, r.headers) == (503, {"retry-after": "10"})
    r = all_failed([busy], ingress="anthropic", profile="default", summary="")
    assert r.status == 529 and r.headers is None  # nobody said when


class _Remembers:
    """A scheduler that still remembers an earlier start (its expected end passed: 0.0 left)."""

    def start_eta(self, provider: str) -> float | None:
        return 0.0


def test_no_retry_after_from_a_start_that_is_not_under_way():
    st = RoutingState(CFG, clock=ManualClock())
    st.upstreams.starter = _Remembers()  # type: ignore[assignment]
    assert Router(st).start_eta("p") is None  # resident: nothing is starting, whatever the scheduler remembers
    st.upstreams.starting(["p"], "x", 60)
    assert Router(st).start_eta("p") == 0.0  # starting: the scheduler's word counts
