"""Less noise from health probing: a backend that was never up is reported once as unreachable (not as a
HEALTHY -> DEGRADED move it never made), routine probe results are not logged at INFO, and recovery probes do
not fill the audit log."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace

from coderouterd.config import parse_config_text
from coderouterd.health.monitor import DEGRADED, HEALTHY, UNHEALTHY, HealthMonitor
from coderouterd.providers.provider import Provider
from coderouterd.routing.state import RoutingState
from coderouterd.state import HealthTransition, RecoveryProbe
from coderouterd.tasks import TaskSet
from tests.fakes.runner import FakeServer
from tests.support.ports import dead_port


def _daemon(url: str):
    cfg = parse_config_text(f"""
[health]
probe_interval_s = 5
[providers.lms]
kind = "openai"
base_url = "{url}/v1"
model = "m"
[profiles.default]
providers = ["lms"]
""", "test")
    providers = {n: Provider(n, c) for n, c in cfg.providers.items()}
    runtime = SimpleNamespace(providers=providers, config=cfg)
    return SimpleNamespace(runtime=runtime, config=cfg)


def _monitor(daemon, events: list) -> HealthMonitor:
    def moved(provider, old, new, reason):
        events.append(HealthTransition(provider=provider, old=old, new=new, reason=reason))

    daemon.state = RoutingState(daemon.config, on_health=moved)
    return HealthMonitor(daemon.state, lambda: daemon.runtime, tasks=TaskSet())


def test_a_backend_never_up_is_reported_once_as_unreachable(caplog):
    daemon = _daemon(f"http://127.0.0.1:{dead_port()}")
    events = []
    monitor = _monitor(daemon, events)

    async def rounds(n: int) -> None:
        try:
            for _ in range(n):
                await monitor.probe_all()
        finally:
            for p in daemon.runtime.providers.values():
                await p.close()

    with caplog.at_level(logging.DEBUG, logger="coderouterd.health"):
        asyncio.run(rounds(4))
    info = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert len(info) == 1, [r.getMessage() for r in info]
    assert "unreachable at" in info[0].getMessage() and "ssl:default" not in info[0].getMessage()
    moves = [(e.old, e.new) for e in events if isinstance(e, HealthTransition)]
    assert moves[0] == ("UNKNOWN", DEGRADED)
    assert (HEALTHY, DEGRADED) not in moves
    assert daemon.state.health_of("lms") == UNHEALTHY  # still acted upon: routing and self-healing see it


def test_a_backend_that_was_up_and_fails_is_a_logged_transition(caplog):
    with FakeServer("openai") as fake:
        daemon = _daemon(fake.url)
        events = []
        monitor = _monitor(daemon, events)

        async def run() -> None:
            await monitor.probe_all()
            fake.stop()
            await monitor.probe_all()
            for p in daemon.runtime.providers.values():
                await p.close()

        with caplog.at_level(logging.INFO, logger="coderouterd.health"):
            asyncio.run(run())
    assert [(e.old, e.new) for e in events if isinstance(e, HealthTransition)] == [(HEALTHY, DEGRADED)]
    assert any("HEALTHY -> DEGRADED" in r.getMessage() for r in caplog.records)


def test_recovery_probes_are_not_audited_but_transitions_are():
    assert RecoveryProbe(provider="p", ok=False, attempt=1).audited is False
    assert HealthTransition(provider="p", old=HEALTHY, new=DEGRADED, reason="x").audited is True
