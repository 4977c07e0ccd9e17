"""The figures a user reads afterwards: restart and failover counters, and the connection pools' lifetime."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from coderouterd.observe.metrics import Metrics
from coderouterd.providers.pool import Pool
from coderouterd.state.events import ProcessEvent, ProcessEventName, RequestFinished, moved_past
from tests.support.metrics import Samples, parse, total


def _metrics() -> Metrics:
    return Metrics(SimpleNamespace(budget=SimpleNamespace(snapshot=dict), processes=None,
                                   affinity=SimpleNamespace(index=SimpleNamespace(providers={}),
                                                            warm=SimpleNamespace(stats={}, disk_bytes=0)),
                                   in_flight={"anthropic": 2, "openai": 0}, runtime=SimpleNamespace(providers={}),
                                   router=SimpleNamespace(providers_availability=lambda _runtime, _active: {}),
                                   active_profile="default", browser_refused={"host": 1}))


def _samples(m: Metrics) -> Samples:
    return parse(m.render().decode())


def test_every_configured_provider_has_its_breaker_health_and_lifecycle_gauges_from_the_start():
    # E14: the gauges were fed by transitions only, so a provider that never moved was absent from /metrics.
    from coderouterd.upstream.lifecycle import Phase
    from tests.support.routing import Routing, chain_config

    r = Routing(chain_config("a", "b", "c"))
    r.state.upstreams.stopped(["c"], "llama", on_demand=True, first=True)
    m = Metrics(SimpleNamespace(budget=SimpleNamespace(snapshot=dict), processes=None,
                                affinity=SimpleNamespace(index=SimpleNamespace(providers={}),
                                                         warm=SimpleNamespace(stats={}, disk_bytes=0)),
                                in_flight={}, runtime=r.runtime, router=r.router, active_profile="default",
                                browser_refused={}))
    s = _samples(m)
    for name in ("a", "b", "c"):
        assert ("coderouter_breaker_state", (("provider", name),)) in s
        assert ("coderouter_health_state", (("provider", name),)) in s
        assert ("coderouter_upstream_in_flight", (("provider", name),)) in s
    assert total(s, "coderouter_breaker_state") == 0 and total(s, "coderouter_health_state") == 0
    assert total(s, "coderouter_upstream_lifecycle", provider="a", phase=Phase.RESIDENT.value) == 1
    assert total(s, "coderouter_upstream_lifecycle", provider="c", phase=Phase.STOPPED_ON_DEMAND.value) == 1
    for _ in range(r.breaker("b").failures):
        r.breaker("b").record_failure()
    assert total(_samples(m), "coderouter_breaker_state", provider="b") == 2  # open, read when scraped


def test_a_restart_moves_the_restart_counter_once_per_process():
    m = _metrics()
    m.sink([
        ProcessEvent(provider="ollama-qwen", process="ollama", event=ProcessEventName.EXITED, detail="killed by SIGKILL"),
        # a process serving two providers is recorded once per provider; only the first copy is primary
        ProcessEvent(provider="ollama-qwen", process="ollama", event=ProcessEventName.RESTARTING, detail="restart 1/5 in 1s"),
        ProcessEvent(provider="ollama-chat", process="ollama", event=ProcessEventName.RESTARTING, detail="restart 1/5 in 1s",
                     primary=False),
        ProcessEvent(provider="llama", process="llama", event=ProcessEventName.RESTARTING, detail="corectl restart"),
    ])
    s = _samples(m)
    assert total(s, "coderouter_process_restarts_total", process="ollama") == 1
    assert total(s, "coderouter_process_restarts_total", process="llama") == 1


def _finished(attempts: list[dict], provider: str | None, **kw) -> RequestFinished:
    return RequestFinished(request_id="r", ingress="anthropic", profile="p", provider=provider,
                           attempts=attempts, status=200 if provider else 502, **kw)


def test_race_losers_are_not_failovers():
    lost_ok = [{"provider": "a", "outcome": "lost", "reason": "race_lost", "status": None, "ms": 3.0},
               {"provider": "b", "outcome": "ok", "reason": "ok", "status": 200, "ms": 3.0}]
    failed_ok = [{"provider": "a", "outcome": "failed", "reason": "http_500", "status": 500, "ms": 1.0},
                 {"provider": "b", "outcome": "ok", "reason": "ok", "status": 200, "ms": 3.0}]
    both_failed = [{"provider": "a", "outcome": "failed", "reason": "http_500", "status": 500, "ms": 1.0},
                   {"provider": "b", "outcome": "failed", "reason": "connect", "status": None, "ms": 1.0}]
    assert moved_past(lost_ok, True) == []
    assert [a["provider"] for a in moved_past(failed_ok, True)] == ["a"]
    assert [a["provider"] for a in moved_past(both_failed, False)] == ["a"]  # b was the end, not a move past
    m = _metrics()
    m.sink([_finished(lost_ok, "b"), _finished(failed_ok, "b"), _finished(both_failed, None)])
    s = _samples(m)
    assert total(s, "coderouter_failovers_total") == 2
    assert total(s, "coderouter_failovers_total", reason="http_500") == 2
    assert total(s, "coderouter_attempts_total", outcome="lost") == 1


def test_in_flight_gauge_reads_the_daemon_counts():
    s = _samples(_metrics())
    assert total(s, "coderouter_requests_in_flight", ingress="anthropic") == 2
    assert ("coderouter_requests_in_flight", (("ingress", "openai"),)) in s


# -- pools --------------------------------------------------------------------------------------------------


def test_retired_pool_closes_when_its_last_call_ends_and_only_once():
    async def scenario():
        pool = Pool(connect_timeout=1.0)
        session = pool.session()
        pool.acquire()
        pool.acquire()
        pool.retire()
        await asyncio.sleep(0)
        assert not session.closed  # two calls still stream through it
        pool.release()
        await asyncio.sleep(0)
        assert not session.closed
        pool.release()
        for _ in range(3):
            await asyncio.sleep(0)
        assert session.closed and pool.sessions_closed == 1
        await pool.drain()  # shutdown after the fact: nothing left to close
        assert pool.sessions_closed == 1

    asyncio.run(scenario())


def test_retired_idle_pool_closes_at_once_and_a_late_call_gets_a_fresh_one_closed_after_it():
    async def scenario():
        pool = Pool(connect_timeout=1.0)
        first = pool.session()
        pool.retire()
        for _ in range(3):
            await asyncio.sleep(0)
        assert first.closed
        # a request of the old generation fails over onto this provider after the reload
        pool.acquire()
        second = pool.session()
        assert second is not first and not second.closed
        pool.release()
        for _ in range(3):
            await asyncio.sleep(0)
        assert second.closed and pool.sessions_opened == pool.sessions_closed == 2

    asyncio.run(scenario())


def test_a_call_that_leases_a_retired_pool_before_its_close_runs_keeps_its_session():
    """The close of a retired pool is a task: a fallback attempt of an old-generation request may lease the pool
    (and start its request on the open session) after the last release scheduled the close but before it ran."""
    async def scenario():
        pool = Pool(connect_timeout=1.0)
        pool.acquire()
        session = pool.session()
        pool.retire()
        pool.release()  # the last call ends: the close is scheduled, not run yet
        pool.acquire()  # ... and a late call takes the pool in between
        assert pool.session() is session
        for _ in range(3):
            await asyncio.sleep(0)
        assert not session.closed  # still in use
        pool.release()
        for _ in range(3):
            await asyncio.sleep(0)
        assert session.closed and pool.sessions_closed == 1

    asyncio.run(scenario())


@pytest.mark.parametrize("used", [True, False])
def test_shutdown_drains_every_pool(used):
    async def scenario():
        pool = Pool(connect_timeout=1.0)
        if used:
            pool.session()
        await pool.drain()
        assert not pool.open and pool.sessions_closed == pool.sessions_opened

    asyncio.run(scenario())
