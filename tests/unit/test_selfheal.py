"""Self-healing without a daemon: the routing state it acts on by named operations, a real health monitor
against fake upstreams on loopback, an injected sleep (no waiting), and a fake supervisor."""

from __future__ import annotations

import asyncio
import socket
import sys
import types
from pathlib import Path

from coderouterd.health.monitor import HealthMonitor
from coderouterd.health.selfheal import SelfHealer
from coderouterd.state import ProcessEvent, RecoveryProbe
from coderouterd.state.events import ProcessEventName
from coderouterd.supervise import ManagedProcess, ProcessSpec, ProcessState
from coderouterd.supervise import Supervisor as RealSupervisor
from coderouterd.tasks import TaskSet
from coderouterd.upstream.breaker import BreakerState
from tests.fakes.runner import FakeServer
from tests.support.ports import dead_port
from tests.support.routing import Routing


def config(url: str) -> str:
    return f"""
[health]
recovery_backoff_s = [1, 2]
[providers.p]
base_url = "{url}/v1"
model = "m"
[profiles.default]
providers = ["p"]
"""


class Supervisor:
    """What the self-healer asks a supervisor: which providers a process serves, which process serves one."""

    def providers_of(self, name):
        return ["p"] if name == "proc" else []

    def for_provider(self, provider):
        return None

    def get(self, name):
        if name != "proc":
            raise KeyError(name)
        return types.SimpleNamespace(spec=types.SimpleNamespace(start_timeout_s=42.0))


def harness(url: str, body, *, supervisor=None, on_sleep=None, fresh_start=None, ready=None):
    r = Routing(config(url))
    events: list = []
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if on_sleep is not None:
            on_sleep(len(sleeps))
        await asyncio.sleep(0)

    async def go():
        tasks = TaskSet()
        m = HealthMonitor(r.state, lambda: r.runtime, tasks=tasks)
        h = SelfHealer(r.state, m, supervisor=lambda: supervisor, runtime=lambda: r.runtime,
                       publish=events.append, sleep=sleep, fresh_start=fresh_start, ready=ready)
        try:
            return await body(r, h)
        finally:
            await h.stop()
            await tasks.close()
            for p in r.runtime.providers.values():
                await p.close()

    return r, events, sleeps, asyncio.run(go())


async def wait_recovered(h: SelfHealer) -> None:
    for _ in range(500):
        if not h.snapshot():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("recovery did not finish")


def test_unhealthy_on_real_traffic_holds_the_provider_and_a_generation_closes_its_breaker():
    with FakeServer("openai", behaviour="500") as f:
        def on_sleep(n):
            if n == 3:  # after the first back-off step and two failed rounds, the backend generates again
                f.set_behaviour("ok")

        async def body(r, h):
            from coderouterd.providers.errors import http_error

            for _ in range(3):  # three real failures: breaker open, health UNHEALTHY -> self-healing
                r.router.report_failure("p", http_error(500, "x"), 0.01)
            assert r.state.is_held("p") and r.state.health_of("p") == "UNHEALTHY"
            await wait_recovered(h)
            return r.breaker("p").state

        r, events, sleeps, state = harness(f.url, body, on_sleep=on_sleep)
    assert state is BreakerState.CLOSED and r.state.health_of("p") == "HEALTHY" and not r.state.is_held("p")
    probes = [e for e in events if isinstance(e, RecoveryProbe)]
    # The model list answered every time; only the generation probe said "not yet" until it was fixed.
    assert [p.ok for p in probes] == [False, False, True]
    assert sleeps == [1, 1, 2]
    assert any(isinstance(e, ProcessEvent) and e.event == "rejoined" for e in events)


def test_a_reachable_provider_with_a_closed_breaker_rejoins_without_a_generation():
    with FakeServer("openai") as f:
        async def body(r, h):
            h.trigger("p", "operator asked", restart=False)
            await wait_recovered(h)
            return f.count("/v1/chat/completions")

        r, _events, _sleeps, generations = harness(f.url, body)
    assert generations == 0 and r.state.health_of("p") == "HEALTHY"


def tell(r, h, event: ProcessEventName) -> None:
    """A process event as the daemon delivers it: the upstreams registry first (supervise/from_config.Processes),
    then self-healing's audit, hooks and reactions."""
    r.state.upstreams.process_event("proc", event, ["p"], "", wait_s=42.0, on_demand=False)
    h.on_process_event("proc", event, 123, "")


def test_process_events_take_providers_out_of_routing_and_back():
    with FakeServer("openai") as f:
        async def body(r, h):
            tell(r, h, ProcessEventName.STARTED)
            down = r.state.is_down("p")
            tell(r, h, ProcessEventName.READY)
            return down, r.state.is_down("p")

        _r, events, _s, (down, after) = harness(f.url, body, supervisor=Supervisor())
    assert down and not after
    assert [e.event for e in events if isinstance(e, ProcessEvent)] == ["started", "ready"]


def test_a_starting_process_may_be_waited_for_a_fatal_one_not_and_a_fresh_start_forgets_its_cache():
    fresh: list[list[str]] = []
    readies: list[list[str]] = []
    with FakeServer("openai") as f:
        async def body(r, h):
            seen = []
            for event in (ProcessEventName.STARTED, ProcessEventName.READY, ProcessEventName.EXITED,
                          ProcessEventName.FATAL, ProcessEventName.ADOPTED):
                tell(r, h, event)
                seen.append((event.value, r.state.is_down("p"), r.state.upstream("p").life.wait_s))
            return seen

        _r, _events, _s, seen = harness(f.url, body, supervisor=Supervisor(), fresh_start=fresh.append,
                                        ready=readies.append)
    assert seen == [("started", True, 42.0), ("ready", False, 0.0), ("exited", True, 42.0),
                    ("fatal", True, 0.0), ("adopted", False, 0.0)]
    assert fresh == [["p"]]  # only a process we started anew lost its cache; an adopted one kept it
    assert readies == [["p"], ["p"]]  # ready and adopted: its server is asked what it is now


def test_a_second_trigger_while_recovering_is_a_no_op():
    with FakeServer("openai", behaviour="503_loading") as f:
        async def body(r, h):
            first = h.trigger("p", "one", restart=False)
            second = h.trigger("p", "two", restart=False)
            return first, second

        _r, events, _s, (first, second) = harness(f.url, body)
    assert first and not second
    # Holding the provider publishes UNHEALTHY, which the healer itself watches: still one recovery, not two.
    assert [e.event for e in events if isinstance(e, ProcessEvent)] == ["excluded"]


def test_a_request_served_while_recovering_ends_the_recovery():
    with FakeServer("openai", behaviour="503_loading") as f:  # probes keep failing
        async def body(r, h):
            h.trigger("p", "health became UNHEALTHY", restart=False)
            await asyncio.sleep(0.05)
            r.router.report_success("p", 0.1)  # e.g. a panic attempt was served
            await wait_recovered(h)
            return r.state.is_held("p"), r.state.health_of("p")

        _r, events, _s, (held, health) = harness(f.url, body)
    assert not held and health == "HEALTHY"
    assert [e.event for e in events if isinstance(e, ProcessEvent)] == ["excluded", "rejoined"]


# -- a reload replaces or drops the process a recovery waits on ---------------------------------------------

BACKEND = str(Path(__file__).resolve().parents[1] / "support" / "fake_backend.py")
MISSING = "/nonexistent/coderouter-test/llama-server"  # a bad path: the process goes FATAL at once


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def until(pred, what: str, ceiling: float = 30.0) -> None:
    """A ceiling, not a measure: what is waited for takes well under a second idle."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ceiling
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"{what} did not happen within {ceiling:g}s")
        await asyncio.sleep(0.01)


def wired_supervisor(tmp_path) -> tuple[RealSupervisor, list]:
    """A real supervisor whose events go to the healer, as the daemon wires it (`healer[0]` once built)."""
    healer: list[SelfHealer] = []
    sup = RealSupervisor(log_dir=tmp_path / "logs", backoff=(0.05,),
                         on_event=lambda name, event, pid, detail: healer[0].on_process_event(name, event, pid,
                                                                                              detail))
    return sup, healer


def test_a_recovery_waiting_on_a_fatal_process_follows_the_process_a_reload_puts_in_its_place(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    sup, healer = wired_supervisor(tmp_path)

    async def body(r, h):
        healer.append(h)
        try:
            old = sup.add(ProcessSpec(name="llama", command=[MISSING], ready_url=f"{url}/v1/models"),
                          providers=["p"])
            await old.start()  # FATAL: self-healing holds p and waits for the process to be started again
            assert old.state is ProcessState.FATAL and r.state.is_held("p") and h.snapshot()
            for _ in range(20):  # let the recovery reach its wait on the fatal process
                await asyncio.sleep(0)
            # The user fixes the command; the reload replaces the process (as from_config.reload does).
            new = await sup.replace(ProcessSpec(name="llama", command=[sys.executable, BACKEND, "--port", str(port)],
                                                ready_url=f"{url}/v1/models", startsecs=0.1, stop_timeout_s=2.0),
                                    providers=["p"])
            await new.start()
            assert await new.wait_ready(30)
            await until(lambda: not h.snapshot(), "the recovery's end")
            return r.state.is_held("p"), r.state.health_of("p")
        finally:
            await sup.remove("llama")

    _r, events, _s, (held, health) = harness(url, body, supervisor=sup)
    assert not held and health == "HEALTHY"
    assert [e.ok for e in events if isinstance(e, RecoveryProbe)] == [True]  # the new process's server answered
    assert any(isinstance(e, ProcessEvent) and e.event == "rejoined" for e in events)


def test_a_recovery_waiting_on_a_fatal_process_a_reload_drops_goes_on_to_probing(tmp_path):
    sup, healer = wired_supervisor(tmp_path)
    with FakeServer("openai") as f:  # the provider stays, unmanaged: someone else runs its server now
        async def body(r, h):
            healer.append(h)
            mp = sup.add(ProcessSpec(name="llama", command=[MISSING], ready_url=f"http://127.0.0.1:{dead_port()}/"),
                         providers=["p"])
            await mp.start()
            assert mp.state is ProcessState.FATAL and r.state.is_held("p")
            for _ in range(20):
                await asyncio.sleep(0)
            await sup.remove("llama")
            await until(lambda: not h.snapshot(), "the recovery's end")
            return r.state.is_held("p"), r.state.health_of("p")

        _r, events, _s, (held, health) = harness(f.url, body, supervisor=sup)
    assert not held and health == "HEALTHY"
    assert any(isinstance(e, ProcessEvent) and e.event == "rejoined" for e in events)


def test_a_closed_process_releases_whoever_waits_for_it_to_start(tmp_path):
    async def go():
        mp = ManagedProcess(ProcessSpec(name="llama", command=[MISSING]), log_dir=tmp_path)
        await mp.start()
        assert mp.state is ProcessState.FATAL
        waiting = asyncio.ensure_future(mp.wait_started())
        await asyncio.sleep(0)
        await mp.close("reload")
        started = await asyncio.wait_for(waiting, 30)
        # Asking a closed process changes nothing: no new actor wakes up for an object nobody supervises.
        ready = await mp.wait_ready(30)
        return started, ready, mp._actor is None or mp._actor.done()

    assert asyncio.run(go()) == (False, False, True)


class _Unrestartable:
    """A managed process whose restart fails (a closed supervisor object answers so)."""

    external = False
    spec = types.SimpleNamespace(name="proc", start_timeout_s=1.0)

    async def restart(self, reason):
        raise RuntimeError("supervisor is shut down")


def test_a_recovery_that_fails_hands_the_provider_back_instead_of_holding_it_for_good():
    sup = Supervisor()
    sup.for_provider = lambda provider: _Unrestartable()
    with FakeServer("openai") as f:
        async def body(r, h):
            h.trigger("p", "health became UNHEALTHY", restart=True)
            assert r.state.is_held("p")
            await until(lambda: not h.snapshot(), "the recovery's end")
            return r.state.is_held("p"), r.state.health_of("p")

        _r, _events, _s, (held, health) = harness(f.url, body, supervisor=sup)
    # Not held: the health monitor probes it again and a later UNHEALTHY may start a new recovery. Its health is
    # the breaker's count again (no failure was counted), not the hold's UNHEALTHY.
    assert not held and health == "HEALTHY"
