"""The health monitor without a daemon: the routing state it reports to, real fake upstreams on loopback."""

from __future__ import annotations

import asyncio

from coderouterd.health.monitor import HealthMonitor
from coderouterd.routing.router import PANIC
from coderouterd.tasks import TaskSet
from coderouterd.upstream.breaker import BreakerState
from coderouterd.upstream.lifecycle import Phase
from tests.fakes.runner import FakeServer
from tests.support.routing import Routing


def config(url: str, threshold: int = 2) -> str:
    return f"""
[providers.p]
base_url = "{url}/v1"
model = "m"
[profiles.default]
providers = ["p"]
[breaker]
failures = {threshold}
"""


def with_monitor(url: str, body, threshold: int = 2):
    r = Routing(config(url, threshold))

    async def go():
        tasks = TaskSet()
        m = HealthMonitor(r.state, lambda: r.runtime, tasks=tasks)
        try:
            return await body(r, m)
        finally:
            await tasks.close()
            for p in r.runtime.providers.values():
                await p.close()

    return r, asyncio.run(go())


def test_failed_reachability_probes_degrade_then_exclude_and_one_success_heals():
    with FakeServer("openai", behaviour="503_loading") as f:
        async def body(r, m):
            await m.probe_all()
            first = r.state.health_of("p")
            await m.probe_all()
            second = r.state.health_of("p")
            f.set_behaviour("ok")
            await m.probe_all()
            return first, second, r.state.health_of("p"), m.snapshot()["p"]

        r, (first, second, third, snap) = with_monitor(f.url, body)
    assert (first, second, third) == ("DEGRADED", "UNHEALTHY", "HEALTHY")
    assert [m[2] for m in r.health_moves] == ["DEGRADED", "UNHEALTHY", "HEALTHY"]
    assert snap["state"] == "HEALTHY" and snap["last_probe"]["ok"]


def test_a_model_list_answer_never_closes_a_breaker_failed_generations_opened():
    with FakeServer("openai", behaviour="500") as f:  # chat fails, the model list answers
        async def body(r, m):
            br = r.breaker("p")
            for _ in range(3):
                br.record_failure(reason="http_500")
            await m.probe_all()
            gen = await m.generation_probe(r.runtime.providers["p"])
            return br.state, gen

        r, (state, (gen_ok, detail, _secs)) = with_monitor(f.url, body)
    # Reachable, but not proven to generate: the breaker stays open, and health, a view of its count, agrees.
    assert state is BreakerState.OPEN and r.state.health_of("p") == "UNHEALTHY"
    assert not gen_ok and "500" in detail


def test_held_and_down_providers_are_not_probed():
    with FakeServer("openai") as f:
        async def body(r, m):
            r.state.upstreams.move(["p"], Phase.STOPPED)
            await m.probe_all()
            r.state.upstreams.move(["p"], Phase.RESIDENT)
            r.state.hold("p", "self-healing")
            await m.probe_all()
            return f.count("/v1/models")

        r, count = with_monitor(f.url, body)
    assert count == 0 and r.state.health_of("p") == "UNHEALTHY"


def test_latency_probe_is_a_real_generation_recorded_as_a_probe_sample():
    with FakeServer("openai") as f:
        async def body(r, m):
            await m.latency_probe(r.runtime.providers["p"])
            return r.state.stats.figures("p")

        _r, figures = with_monitor(f.url, body)
        assert f.count("/v1/chat/completions") == 1
    assert figures["probes"] == 1 and figures["errors"] == 0


def test_background_loops_are_owned_and_end_with_their_task_set():
    with FakeServer("openai") as f:
        async def body(r, m):
            m.start()
            await asyncio.sleep(0.05)
            return len(m._tasks)

        _r, running = with_monitor(f.url, body)
    assert running == 2  # both loops tracked; with_monitor's close() cancelled and awaited them


def test_a_model_list_answer_does_not_wipe_a_streak_of_failed_requests():
    with FakeServer("openai") as f:
        async def body(r, m):
            for _ in range(2):
                r.state.passive_failure("p")
            await m.probe_all()
            after_probe = r.state.health_of("p")
            # A real request served (in panic: the breaker opened at the same count) is what heals.
            r.router.report_success("p", 0.05, admission=PANIC)
            return after_probe, r.state.health_of("p")

        _r, (after_probe, after_success) = with_monitor(f.url, body)
    assert (after_probe, after_success) == ("UNHEALTHY", "HEALTHY")


def test_a_gemini_provider_whose_key_google_refuses_is_not_reachable(monkeypatch):
    """Google answers a wrong key with a 400 (API_KEY_INVALID), not a 401: the model list's 400 is no answer from
    a provider that can serve, and the probe says so (it used to count any status below 500 but 401/403)."""
    monkeypatch.setenv("CRT_GEMINI_PROBE_KEY", "not-the-key")
    with FakeServer("gemini", models=["gemini-x"], api_key="the-key") as g:
        r = Routing(f"""
[providers.p]
kind = "gemini"
base_url = "{g.url}"
api_key_env = "CRT_GEMINI_PROBE_KEY"
model = "gemini-x"
[profiles.default]
providers = ["p"]
""")

        async def go():
            tasks = TaskSet()
            m = HealthMonitor(r.state, lambda: r.runtime, tasks=tasks)
            try:
                return await m.probe(r.runtime.providers["p"])
            finally:
                await tasks.close()
                for p in r.runtime.providers.values():
                    await p.close()

        ok, detail, _ = asyncio.run(go())
    assert not ok and detail.startswith("HTTP 400")
