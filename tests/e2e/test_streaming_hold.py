"""The stream hold: a slow local prompt gets message_start and pings instead of silence, and a provider that
dies after the commit but before any content is replaced without the client seeing two message_starts."""

from __future__ import annotations

import httpx

from tests.fakes.runner import FakeServer
from tests.support.config import PINGING, daemon_config, upstream
from tests.support.daemon import running
from tests.support.sse import event_names, streamed_text

BODY = {"model": "m", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def test_slow_first_token_gets_pings_then_the_answer(tmp_path):
    with FakeServer("openai", name="slow", behaviour="slow_first_byte;delay=1.0") as slow:
        cfg = daemon_config(server=PINGING, providers={"slow": slow.url}, profiles={"default": ["slow"]})
        with running(cfg, tmp_path) as d:
            r = httpx.post(d.url + "/v1/messages", json=BODY, timeout=20)
            ev = event_names(r.text)
            assert r.status_code == 200
            assert ev[0] == "message_start" and ev.count("message_start") == 1
            first_content = ev.index("content_block_start")
            assert ev[1:first_content].count("ping") >= 3  # one at commit, then every 0.2 s of silence
            assert ev[-1] == "message_stop"
            assert streamed_text(r.text) == "Hello from slow"


def test_failure_after_commit_before_content_moves_to_the_next_provider(tmp_path):
    with FakeServer("openai", name="stuck", behaviour="hang") as stuck, FakeServer("openai", name="good") as good:
        cfg = daemon_config(server=PINGING, profiles={"default": ["stuck", "good"]},
                            providers={"stuck": upstream(stuck.url, timeouts={"first_byte": 0.8}), "good": good.url})
        with running(cfg, tmp_path) as d:
            r = httpx.post(d.url + "/v1/messages", json=BODY, timeout=20)
            ev = event_names(r.text)
            assert r.status_code == 200
            assert ev.count("message_start") == 1 and ev[-1] == "message_stop", ev
            assert "ping" in ev[: ev.index("content_block_start")]
            assert streamed_text(r.text) == "Hello from good"
            # headers went out at the commit, while stuck was being waited on; the journal has the whole story
            assert r.headers["x-coderouter-provider"] == "stuck"


def test_race_committed_before_any_event_sends_one_message_start(tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_first_byte;delay=0.8") as a, \
            FakeServer("openai", name="b", behaviour="slow_first_byte;delay=0.6") as b:
        cfg = daemon_config(server=PINGING, providers={"a": a.url, "b": b.url},
                            profiles={"default": {"providers": ["a", "b"], "mode": "race"}})
        with running(cfg, tmp_path) as d:
            r = httpx.post(d.url + "/v1/messages", json=BODY, timeout=20)
            ev = event_names(r.text)
            assert ev.count("message_start") == 1 and ev[-1] == "message_stop", ev
            assert "ping" in ev
            assert streamed_text(r.text) == "Hello from b"
