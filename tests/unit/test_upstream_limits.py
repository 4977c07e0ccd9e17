"""What an upstream sends is bounded (issue 23, item 3): reading a body stops at its bound, whatever the body
(endless, gzip bomb), and the daemon's side calls (health probes, model lists, model control) read within theirs.
The request path's bounds are proven end to end in tests/e2e/test_hostile_upstream.py."""

from __future__ import annotations

import asyncio

import pytest

from coderouterd.health.monitor import HealthMonitor
from coderouterd.providers.errors import MODEL_DISCOVERY, UpstreamError
from coderouterd.providers.limits import MB, BodyTooLarge, read_at_most, read_capped
from coderouterd.providers.models_control import ModelControlError, list_models
from coderouterd.providers.pool import Pool
from coderouterd.tasks import TaskSet
from tests.fakes.runner import FakeServer
from tests.support.routing import Routing


def _read(url: str, behaviour: str, reader):
    async def go():
        pool = Pool(connect_timeout=2.0)
        try:
            async with pool.session().post(url + "/v1/chat/completions", data=b"{}",
                                           headers={"x-fake-behaviour": behaviour}) as r:
                return await reader(r)
        finally:
            await pool.drain()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def fake():
    with FakeServer("openai", name="up") as f:
        yield f


@pytest.mark.parametrize("behaviour", ["endless_error;status=200;mb=64", "gzip_bomb;mb=64", "big_json;mb=64"])
def test_read_capped_stops_at_its_bound(fake, behaviour):
    # The bound is in bytes, and the error says it held; how long reading took is not the point (nor timed).
    with pytest.raises(BodyTooLarge, match="larger than 1 MB"):
        _read(fake.url, behaviour, lambda r: read_capped(r, 1 * MB))


def test_read_capped_returns_a_body_within_its_bound(fake):
    body = _read(fake.url, "ok", lambda r: read_capped(r, 1 * MB))
    assert body.startswith(b"{") and b"chat.completion" in body


def test_read_at_most_keeps_the_head_of_an_endless_body(fake):
    body = _read(fake.url, "endless_error;status=500;mb=64", lambda r: read_at_most(r, 1000))
    assert len(body) == 1000 and body.startswith(b'{"error": {"message": "eee')


def _routing(url: str, kind: str = "openai") -> Routing:
    return Routing(f"""
[providers.p]
kind = "{kind}"
base_url = "{url}/v1"
[profiles.default]
providers = ["p"]
""")


def test_a_probe_does_not_read_an_endless_body():
    with FakeServer("openai", name="up", behaviour="endless_error;status=500;mb=200") as up:
        r = _routing(up.url)

        async def go():
            tasks = TaskSet()
            m = HealthMonitor(r.state, lambda: r.runtime, tasks=tasks)
            p = r.runtime.providers["p"]
            try:
                return await m.probe(p)
            finally:
                await tasks.close()
                await p.close()

        ok, detail, _ = asyncio.run(go())
        sent = up.fake.state.endless_sent
    # Judged by its status (a probe left reading would end in its timeout instead), and it stopped reading:
    # the fake's own count of what it wrote, not a stopwatch.
    assert not ok and detail == "HTTP 500"
    assert sent < 32 * MB, sent  # what the socket buffers hold, not the 200 MB on offer


def test_a_model_list_without_end_is_a_discovery_failure():
    with FakeServer("openai", name="up", behaviour="endless_error;status=200;mb=64") as up:
        r = _routing(up.url)

        async def go():
            p = r.runtime.providers["p"]
            try:
                with pytest.raises(UpstreamError) as ei:
                    await p.list_models(refresh=True)
                return ei.value
            finally:
                await p.close()

        e = asyncio.run(go())
    assert e.reason == MODEL_DISCOVERY and "larger than 16 MB" in e.message


def test_model_control_does_not_read_an_endless_body():
    with FakeServer("ollama", name="up", behaviour="endless_error;status=200;mb=64") as up:
        r = _routing(up.url, kind="ollama")

        async def go():
            p = r.runtime.providers["p"]
            try:
                with pytest.raises(ModelControlError, match="larger than 16 MB"):
                    await list_models(p)
            finally:
                await p.close()

        asyncio.run(go())
