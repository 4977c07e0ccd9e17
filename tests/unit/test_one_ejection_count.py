"""Issue 25 item 2: one count of failures takes a provider out. The breaker opens and health says UNHEALTHY at the
same failure, `[breaker] failures`; a profile's old `health_threshold` no longer moves either (it still loads,
and is reported as unused)."""

from __future__ import annotations

import asyncio

from coderouterd.config.loader import parse_config_text
from coderouterd.providers.errors import UpstreamError
from coderouterd.upstream.breaker import BreakerState
from tests.support.routing import Routing, chain_config, fail


def _failures(r: Routing, n: int) -> list[tuple[str, str]]:
    """(breaker state, health) after each of n failed requests on `a` (b serves each)."""
    seen = []
    for _ in range(n):
        r.ups.script("a", fail(UpstreamError("http_500", status=500)))
        asyncio.run(r.serve())
        seen.append((str(r.breaker("a").state), r.state.health_of("a")))
    return seen


def test_the_breaker_opens_and_health_turns_unhealthy_at_the_same_failure():
    for failures in (2, 4):
        r = Routing(chain_config("a", "b", breaker_failures=failures, extra_profile="health_threshold = 9"))
        seen = _failures(r, failures)
        assert seen[-1] == (BreakerState.OPEN, "UNHEALTHY")
        assert all(state == BreakerState.CLOSED and health == "DEGRADED" for state, health in seen[:-1])


def test_probes_count_against_the_same_number():
    r = Routing(chain_config("a", breaker_failures=5))
    assert r.state.threshold("a") == 5


def test_an_old_health_threshold_loads_and_is_named_as_unused():
    cfg = parse_config_text(chain_config("a", extra_profile="health_threshold = 2", breaker_failures=4), "test")
    (note,) = cfg.unused_settings()
    assert "profiles.default.health_threshold" in note and "[breaker] failures (4)" in note
    assert parse_config_text(chain_config("a"), "test").unused_settings() == []


def test_drift_error_rate_still_loads_and_is_named_as_unused():
    """E6 stopped counting errors as drift: a config that sets drift.error_rate loads, and config check says so."""
    cfg = parse_config_text(chain_config("a") + "\n[drift]\nerror_rate = 0.5\n", "test")
    (note,) = cfg.unused_settings()
    assert note.startswith("drift.error_rate is no longer used")
