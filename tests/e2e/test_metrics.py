"""/metrics: Prometheus text format that parses with the client library's parser and moves with traffic."""

from __future__ import annotations

import time

import httpx

from tests.fakes.runner import FakeServer
from tests.support.daemon import running
from tests.support.metrics import scrape, total


def test_metrics_parse_and_move(tmp_path):
    with FakeServer("openai", name="good") as good, FakeServer("openai", name="bad", behaviour="500") as bad:
        cfg = f"""
[server]
port = {{PORT}}
[metrics]
bearer_token = "scrape-me"
[providers.bad]
base_url = "{bad.url}/v1"
[providers.good]
base_url = "{good.url}/v1"
cost = {{ input = 1.0, output = 2.0 }}
[profiles.default]
providers = ["bad", "good"]
health_action = "warn"
"""
        with running(cfg, tmp_path) as d:
            assert httpx.get(d.url + "/metrics").status_code == 401
            before = scrape(d, "scrape-me")
            # E14: every configured provider's breaker and health are there before any of them moved.
            for name in ("bad", "good"):
                assert ("coderouter_breaker_state", (("provider", name),)) in before
                assert ("coderouter_health_state", (("provider", name),)) in before
            for _ in range(4):
                r = httpx.post(d.url + "/v1/messages", json={"model": "m", "max_tokens": 5,
                                                             "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200
            deadline = time.monotonic() + 30  # a ceiling against a hang: the count lands just after the answer
            while True:
                after = scrape(d, "scrape-me")
                if total(after, "coderouter_requests_total", provider="good") >= 4 or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert total(after, "coderouter_requests_total", provider="good", status="200") - \
                total(before, "coderouter_requests_total", provider="good", status="200") == 4
            assert total(after, "coderouter_attempts_total", provider="bad", outcome="failed") == 3
            assert total(after, "coderouter_failovers_total", reason="http_500") == 3
            assert total(after, "coderouter_breaker_state", provider="bad") == 2  # opened after 3 failures
            assert total(after, "coderouter_tokens_total", provider="good", kind="input") > 0
            assert total(after, "coderouter_cost_usd_total", provider="good") > 0
            assert total(after, "coderouter_overhead_seconds_count") == 4
            assert total(after, "coderouter_request_duration_seconds_count", provider="good") == 4
