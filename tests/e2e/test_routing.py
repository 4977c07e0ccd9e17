"""Resilient routing over real sockets: breakers, adaptive demotion with probes, races, capability gates."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, upstream
from tests.support.daemon import running
from tests.support.sse import streamed_text
from tests.support.wait import wait_for

USER = [{"role": "user", "content": "hi"}]


def post(d, profile, *, stream=False, body=None, timeout=20):
    body = body or {"model": "m", "max_tokens": 10, "messages": USER}
    if stream:
        body = {**body, "stream": True}
    return httpx.post(d.url + "/v1/messages", json=body, headers={"x-coderouter-profile": profile}, timeout=timeout)


def test_breaker_stops_calling_a_failing_provider(tmp_path):
    """The breaker's wiring in the daemon, by the events it causes (its timing, with an injected clock, is in
    tests/unit/test_breaker.py). Each check sends its request right after the one that changed the breaker;
    the recovery (2 s, then 4 s after a failed trial) is only there so that such a request cannot miss it, over
    10x what one request takes on a loaded machine (~150 ms)."""
    with FakeServer("openai", name="bad", behaviour="500") as bad, FakeServer("openai", name="good") as good:
        cfg = daemon_config(breaker={"failures": 3, "recovery_s": 2.0}, providers={"bad": bad.url, "good": good.url},
                            profiles={"default": {"providers": ["bad", "good"], "health_action": "warn"}})
        with running(cfg, tmp_path) as d:
            calls = lambda: bad.count("/v1/chat/completions")  # noqa: E731
            for _ in range(3):
                r = post(d, "default")
                assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "good"
            # closed -> open after exactly 3 failures: the next request does not touch it
            r = post(d, "default")
            assert r.headers["x-coderouter-provider"] == "good" and calls() == 3
            assert "bad:skipped:breaker_open" in r.headers["x-coderouter-attempts"], r.headers
            # After the recovery period exactly one trial goes through, fails, and re-opens it.
            assert wait_for(lambda: post(d, "default").status_code == 200 and calls() >= 4, 30, step=0.1)
            r = post(d, "default")
            assert calls() == 4 and "bad:skipped:breaker_open" in r.headers["x-coderouter-attempts"]
            bad.set_behaviour("ok")
            r = post(d, "default")  # the failed trial doubled the time out: still out
            assert r.headers["x-coderouter-provider"] == "good" and calls() == 4
            # A trial after that succeeds and closes it: bad serves again, and goes on serving.
            assert wait_for(lambda: post(d, "default").headers["x-coderouter-provider"] == "bad", 30, step=0.1)
            r = post(d, "default")
            assert r.headers["x-coderouter-provider"] == "bad"


def test_slow_first_provider_is_demoted_without_traffic_to_peers(tmp_path):
    with FakeServer("openai", name="slow", behaviour="slow_first_byte;delay=0.25") as slow, \
            FakeServer("openai", name="fast") as fast:
        cfg = daemon_config(adaptive={"window_s": 30, "min_latency_samples": 3, "debounce_s": 0,
                                      "probe_interval_s": 0.3, "max_probes_per_minute": 120},
                            providers={"slow": slow.url, "fast": fast.url},
                            profiles={"default": {"providers": ["slow", "fast"], "adaptive": True}})
        with running(cfg, tmp_path) as d:
            served = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                r = post(d, "default")
                assert r.status_code == 200
                served.append(r.headers["x-coderouter-provider"])
                if served[-3:] == ["fast"] * 3:
                    break
            assert served[0] == "slow"
            assert served[-3:] == ["fast"] * 3, served
            # fast got no real traffic before the switch, only probes: the sampling gap was closed by probing
            assert fast.count("/v1/chat/completions") >= 3


def _race_config(a, b, *, warm: bool = False, **default):
    profiles = {"default": {"providers": ["a", "b"], "mode": "race", "race_width": 2, **default}}
    if warm:
        profiles["warm"] = ["b"]
    return daemon_config(server={"stream_hold_s": 0.2}, providers={"a": a.url, "b": b.url}, profiles=profiles)


@pytest.mark.parametrize("stream", [False, True])
def test_race_returns_the_faster_and_closes_the_loser(tmp_path, stream):
    with FakeServer("openai", name="a", behaviour="slow_first_byte;delay=3") as a, FakeServer("openai", name="b") as b:
        with running(_race_config(a, b, warm=True), tmp_path) as d:
            # The race is timed on a warm daemon. A request that arrives while the routing stack is still being
            # imported (right after /healthz answers) spends that wait out of its stream hold (0.2 s here) and
            # commits its headers to whoever leads then. One request through b alone warms it, a untouched.
            assert post(d, "warm").status_code == 200
            r = post(d, "default", stream=stream)
            assert r.status_code == 200
            # b won (a answers only after 3 s), and the answer did not wait for a: it was cancelled, not drained.
            assert r.headers["x-coderouter-provider"] == "b"
            text = streamed_text(r.text) if stream else r.json()["content"][0]["text"]
            assert text == "Hello from b"
            assert wait_for(lambda: a.disconnects >= 1, 30)
            assert a.disconnects == 1 and a.count("/v1/chat/completions") == 1  # the loser's upstream saw the close
            assert "a:race_lost" in r.headers["x-coderouter-attempts"]


def test_race_leader_dying_before_content_completes_from_the_other(tmp_path):
    with FakeServer("openai", name="a", behaviour="disconnect_mid_stream;after=0") as a, \
            FakeServer("openai", name="b", behaviour="slow_first_byte;delay=0.3") as b:
        with running(_race_config(a, b), tmp_path) as d:
            r = post(d, "default", stream=True)
            assert r.status_code == 200
            events = [ln[7:] for ln in r.text.splitlines() if ln.startswith("event: ")]
            assert events[-1] == "message_stop", r.text
            assert events.count("message_start") == 1
            assert streamed_text(r.text) == "Hello from b"
            assert a.count("/v1/chat/completions") == 1  # the leader was tried and dropped out


def test_hedged_race_does_not_start_the_second_when_the_first_is_quick(tmp_path):
    with FakeServer("openai", name="a") as a, FakeServer("openai", name="b") as b:
        with running(_race_config(a, b, race_delay_ms=500), tmp_path) as d:
            for _ in range(3):
                assert post(d, "default").headers["x-coderouter-provider"] == "a"
            assert b.count("/v1/chat/completions") == 0


def test_capability_gates(tmp_path):
    with FakeServer("openai", name="notools") as nt, FakeServer("openai", name="small") as small, \
            FakeServer("openai", name="full") as full:
        cfg = daemon_config(providers={"notools": upstream(nt.url, capabilities={"tools": False}),
                                       "small": upstream(small.url, context_window=2000),
                                       "full": upstream(full.url, capabilities={"vision": True})},
                            profiles={"default": ["notools", "small", "full"], "novision": ["notools"]})
        with running(cfg, tmp_path) as d:
            tools = [{"name": "Bash", "input_schema": {"type": "object"}}]
            big = [{"role": "user", "content": "x" * 20000}]
            r = post(d, "default", body={"model": "m", "max_tokens": 5, "messages": big, "tools": tools})
            assert r.headers["x-coderouter-provider"] == "full"
            att = r.headers["x-coderouter-attempts"]
            assert "notools:skipped:tools" in att and "small:skipped:context" in att
            assert nt.count("/v1/chat/completions") == 0 and small.count("/v1/chat/completions") == 0
            img = [{"role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]
            # Vision not declared: unknown, so the image is forwarded (never a reason to refuse).
            r = post(d, "novision", body={"model": "m", "max_tokens": 5, "messages": img})
            assert r.status_code == 200
            sent = nt.requests[-1]["json"]["messages"][0]["content"]
            assert any(p.get("type") == "image_url" for p in sent)
