"""Upstream redirects are never followed (issue 23, item 2): not by a request, a health probe, a model list or
model control, since each would carry our credentials (x-api-key survives a cross-origin redirect in aiohttp)
and a 307/308 the prompt too. A 3xx is the upstream's failure, named as a redirect."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from coderouterd.health.monitor import HealthMonitor
from coderouterd.providers.errors import REDIRECT, UpstreamError
from coderouterd.providers.models_control import ModelControlError, load_model
from coderouterd.providers.pool import Pool
from coderouterd.tasks import TaskSet
from tests.fakes.runner import FakeServer
from tests.support.routing import Routing

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pair():
    with FakeServer("anthropic", name="up") as up, FakeServer("anthropic", name="elsewhere") as elsewhere:
        yield up, elsewhere


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_the_pool_session_answers_a_redirect_as_it_came(pair, status):
    up, elsewhere = pair
    up.set_behaviour(f"redirect;status={status};to={elsewhere.url}/v1/messages")

    async def go():
        pool = Pool(connect_timeout=2.0)
        try:
            async with pool.session().post(up.url + "/v1/messages", data=b'{"model":"m"}',
                                           headers={"x-api-key": "secret"}) as r:
                post = r.status, r.headers.get("location")
            async with pool.session().get(up.url + "/v1/models", headers={"x-api-key": "secret"}) as r:
                get = r.status
        finally:
            await pool.drain()
        return post, get

    (post_status, location), get_status = asyncio.run(go())
    assert post_status == status and location.startswith(elsewhere.url) and get_status == status
    assert not elsewhere.requests and not elsewhere.saw_api_key


def test_a_redirect_cannot_be_asked_for():
    async def go():
        pool = Pool(connect_timeout=1.0)
        try:
            with pytest.raises(TypeError):
                pool.session().get("http://127.0.0.1:9/", allow_redirects=True)
        finally:
            await pool.drain()

    asyncio.run(go())


def _routing(url: str, kind: str = "anthropic") -> Routing:
    return Routing(f"""
[providers.p]
kind = "{kind}"
base_url = "{url}/v1"
[profiles.default]
providers = ["p"]
""")


def test_probes_and_model_lists_take_a_redirect_for_a_failure(pair):
    up, elsewhere = pair
    up.set_behaviour(f"redirect;status=308;to={elsewhere.url}/v1/models")
    r = _routing(up.url)

    async def go():
        tasks = TaskSet()
        m = HealthMonitor(r.state, lambda: r.runtime, tasks=tasks)
        p = r.runtime.providers["p"]
        try:
            probe = await m.probe(p)
            generation = await m.generation_probe(p)
            with pytest.raises(UpstreamError) as ei:
                await p.list_models(refresh=True)
            return probe, generation, ei.value
        finally:
            await tasks.close()
            await p.close()

    (probe_ok, probe_detail, _), (gen_ok, _, _), listing = asyncio.run(go())
    assert not probe_ok and "308" in probe_detail
    assert not gen_ok
    assert listing.reason == REDIRECT and elsewhere.url.split("//")[1] in listing.message
    assert not elsewhere.requests and not elsewhere.saw_api_key


def test_model_control_takes_a_redirect_for_a_failure():
    with FakeServer("ollama", name="up") as up, FakeServer("ollama", name="elsewhere") as elsewhere:
        up.set_behaviour(f"redirect;status=307;to={elsewhere.url}/api/generate")
        r = _routing(up.url, kind="ollama")

        async def go():
            p = r.runtime.providers["p"]
            try:
                with pytest.raises(ModelControlError, match="307"):
                    await load_model(p, "m")
            finally:
                await p.close()

        asyncio.run(go())
        assert not elsewhere.requests


def test_every_upstream_http_call_goes_through_the_pool_session():
    """The one place an aiohttp session is made: providers/pool.py, wrapped by UpstreamSession."""
    made = []
    for path in (ROOT / "coderouterd").rglob("*.py"):
        text = path.read_text()
        if re.search(r"ClientSession\(|aiohttp\.request\(", text):
            made.append(str(path.relative_to(ROOT)))
    assert made == ["coderouterd/providers/pool.py"]
