"""A request takes a turn at a stopped model only when it would wait for it: never for a stopped provider that
comes after the one that serves it (issue 44 section 2: that turn made the model serving the request the victim
of a swap for a model nobody needed, under the request and again after it, as a start nobody waits for)."""

from __future__ import annotations

import asyncio

from coderouterd.config.loader import parse_config_text
from coderouterd.guards.apply import BudgetHooks
from coderouterd.guards.budget import Budget
from coderouterd.providers.errors import UpstreamError
from coderouterd.routing.router import Router
from coderouterd.state.store import Store
from coderouterd.upstream.lifecycle import Phase
from tests.support.routing import FakeCall, FakeSink, Routing, chain_config, fail, ok

TOOLS = [{"name": "read", "description": "read a file", "input_schema": {"type": "object", "properties": {}}}]


class Demand:
    """The scheduler's side the exchange sees: every turn asked for is recorded."""

    def __init__(self) -> None:
        self.demanded: list[str] = []
        self.released = 0

    def can_start(self, provider: str) -> bool:
        return True

    def start_eta(self, provider: str) -> float | None:
        return None  # no load time learned

    def demand(self, provider: str, *, background: bool = False):
        self.demanded.append(provider)
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(False)  # it could not start: the request is told why

        class T:
            ready = fut

            def waiting(self) -> bool:
                return False

            def admitted(self) -> bool:
                return False
        return T()

    def begin(self, provider: str, turn=None) -> bool:
        return True

    def release(self, turn) -> None:
        self.released += 1

    def end(self, provider: str) -> None:
        pass


def routing() -> tuple[Routing, Demand]:
    r = Routing(chain_config("coder", "small"))
    d = Demand()
    r.state.upstreams.starter = d  # type: ignore[assignment]
    r.state.upstreams.move(["small"], Phase.STOPPED)
    return r, d


BODY = {"model": "m", "max_tokens": 5, "tools": TOOLS, "messages": [{"role": "user", "content": "hi"}]}


def test_a_request_served_by_the_first_provider_takes_no_turn_at_a_stopped_one_behind_it():
    r, d = routing()
    r.ups.script("coder", ok())
    _, sink = asyncio.run(r.serve(BODY))
    assert sink.status == 200
    assert d.demanded == []


def test_the_stopped_provider_behind_is_still_started_when_the_first_one_fails():
    r, d = routing()
    r.ups.script("coder", fail(UpstreamError("http_500", status=500)))
    asyncio.run(r.serve(BODY))
    assert d.demanded == ["small"] and d.released == 1


class Waiting:
    """A turn still waiting for its model (the scheduler may admit it any time: the model is then kept for it)."""

    def __init__(self) -> None:
        self.ready = asyncio.get_running_loop().create_future()

    def waiting(self) -> bool:
        return not self.ready.done()

    def admitted(self) -> bool:
        return False


class WaitingDemand(Demand):
    def demand(self, provider: str, *, background: bool = False):
        self.demanded.append(provider)
        return Waiting()


SSE = b'data: {"choices":[{"index":0,"delta":{"content":"hello there"}}]}\n\n'


class Seen(FakeSink):
    def __init__(self, d: Demand) -> None:
        super().__init__(opens_stream_itself=False)
        self.d = d
        self.released_at_events: list[int] = []

    async def event(self, data: bytes) -> None:
        await super().event(data)
        self.released_at_events.append(self.d.released)


def test_a_turn_is_given_back_once_another_provider_streams_the_answer():
    # The stopped local model ahead of the cloud: the request fails over to the cloud at once, and its turn at
    # the local model must not stay pending (and, once the model is up, keep it promised) while the cloud streams.
    r = Routing(chain_config("local", "cloud"))
    d = WaitingDemand()
    r.state.upstreams.starter = d  # type: ignore[assignment]
    r.state.upstreams.move(["local"], Phase.STOPPED)
    r.ups.script("cloud", ok(SSE, SSE, SSE))

    async def go() -> Seen:
        sink = Seen(d)
        ex, _ = r.exchange({**BODY, "stream": True}, ingress="openai", sink=sink)
        await ex.run()
        return sink

    sink = asyncio.run(go())
    assert d.demanded == ["local"]
    assert sink.released_at_events == [0, 1, 1] and d.released == 1  # given back after the first output


class Admitted:
    """A turn whose model came up and is kept for the request until it begins there or gives the turn back."""

    def __init__(self) -> None:
        self.ready = asyncio.get_running_loop().create_future()
        self.ready.set_result(True)
        self.gone = False

    def waiting(self) -> bool:
        return False

    def admitted(self) -> bool:
        return not self.gone


class AdmittingDemand(Demand):
    def demand(self, provider: str, *, background: bool = False):
        self.demanded.append(provider)
        return Admitted()

    def release(self, turn) -> None:
        turn.gone = True
        super().release(turn)


def test_a_turn_whose_model_was_not_used_is_given_back_before_the_request_goes_elsewhere(tmp_path):
    # Its model is up and kept for the request, but the attempt there is skipped (its budget is spent): the request
    # is served by the cloud, and the model must not stay promised to it for as long as the cloud answers.
    toml = chain_config("local", "cloud", extra_profile='on_demand_start = "wait"',
                        provider_extra={"local": 'paid = true\ncost = { input = 1.0, output = 100.0 }\n'
                                                 'monthly_budget_usd = 0.0001\n'})
    budget = Budget(Store(tmp_path / "state.db"))
    budget.configure(parse_config_text(toml, "test").providers, global_cap_usd=0.0, warn_ratio=0.8)
    r = Routing(toml)
    d = AdmittingDemand()
    r.router = Router(r.state, budget=BudgetHooks(budget))
    r.state.upstreams.starter = d  # type: ignore[assignment]
    r.state.upstreams.move(["local"], Phase.STOPPED)
    r.ups.script("cloud", ok())

    class Body(FakeCall):
        async def result(self) -> bytes:
            released.append(d.released)
            return await super().result()

    released: list[int] = []
    r.ups.call_class = Body
    ex, sink = asyncio.run(r.serve(BODY, ingress="openai"))
    assert sink.status == 200 and d.demanded == ["local"]
    assert [s.reason for s in ex.record.skips if s.provider == "local"] == ["budget"]
    assert released == [1]  # given back before the cloud was asked


def test_the_local_model_that_came_up_while_the_cloud_failed_serves_the_request():
    # Failover first (the default): the cloud is tried while the local model starts; the model is up and kept for
    # this request by the time the cloud has failed, and serves it.
    r = Routing(chain_config("local", "cloud"))

    class UpWhileCloudTried(AdmittingDemand):
        def demand(self, provider: str, *, background: bool = False):
            r.state.upstreams.move([provider], Phase.RESIDENT)  # ready, and kept for this request, before the cloud has answered
            return super().demand(provider, background=background)

    d = UpWhileCloudTried()
    r.state.upstreams.starter = d  # type: ignore[assignment]
    r.state.upstreams.move(["local"], Phase.STOPPED)
    r.ups.script("cloud", fail(UpstreamError("http_500", status=500)))
    r.ups.script("local", ok())
    ex, sink = asyncio.run(r.serve(BODY))
    assert sink.status == 200 and ex.record.served_by == "local"
