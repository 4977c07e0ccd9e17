"""What a provider's server says about itself, asked over real loopback sockets: once per base_url, in the
background, a minute later when nothing answered; the configured window wins."""

from __future__ import annotations

import asyncio

from coderouterd.config import parse_config_text
from coderouterd.providers.provider import Provider
from coderouterd.providers.server_info import RETRY_S, ServerDirectory
from coderouterd.servers import llamacpp
from tests.fakes.runner import FakeServer
from tests.support.ports import dead_port

CFG = """
[providers.p]
kind = "%s"
base_url = "%s"
model = "%s"
context_window = %d
[profiles.default]
providers = ["p"]
"""


def provider(url: str, *, kind: str = "openai", model: str = "", context_window: int = 0) -> Provider:
    cfg = parse_config_text(CFG % (kind, url, model, context_window), "t")
    return Provider("p", cfg.providers["p"])


def run(p: Provider, scenario, directory: ServerDirectory | None = None):
    d = directory or ServerDirectory(timeout_s=2.0)

    async def go():
        try:
            return await scenario(d, p)
        finally:
            await d.stop()
            await p.close()

    return asyncio.run(go())


def test_llama_server_slot_context_is_read_once_in_the_background():
    with FakeServer("llamacpp", n_slots=2, n_ctx=1024) as fake:
        async def scenario(d, p):
            assert d.context_window(p) == 0  # not known yet: the request is not kept waiting
            await d.discover(p)
            first = d.context_window(p)
            await d.discover(p)
            return first, d.info(p)

        window, info = run(provider(fake.url + "/v1"), scenario)
        assert window == 1024
        assert (info.kind, info.context_window, info.slots) == ("llama.cpp", 1024, 2)
        assert fake.count(llamacpp.PROPS) == 1 and fake.count(llamacpp.SLOTS) == 1


def test_the_configured_window_wins_and_the_server_is_not_asked_for_it():
    with FakeServer("llamacpp", n_ctx=1024) as fake:
        async def scenario(d, p):
            return d.context_window(p)

        assert run(provider(fake.url + "/v1", context_window=50_000), scenario) == 50_000
        assert fake.count(llamacpp.PROPS) == 0


def test_an_unreachable_server_is_asked_again_a_minute_later():
    now = [0.0]
    d = ServerDirectory(timeout_s=1.0, clock=lambda: now[0])

    async def scenario(d, p):
        await d.discover(p)
        again_at_once = d.refresh(p)
        now[0] = RETRY_S + 1
        again_later = d.refresh(p)
        if again_later is not None:
            await again_later
        return again_at_once, again_later

    at_once, later = run(provider(f"http://127.0.0.1:{dead_port()}/v1"), scenario, d)
    assert at_once is None and later is not None


def test_ollama_and_lm_studio_windows():
    with FakeServer("ollama", models=["qwen3"], context_length=16384, loaded=["qwen3"]) as ol, \
            FakeServer("lmstudio", models=["m"], context_length=8192, loaded=["m"]) as lm:
        async def scenario(d, p):
            await d.discover(p)
            return d.info(p)

        info = run(provider(ol.url, kind="ollama", model="qwen3"), scenario)
        assert (info.kind, info.context_window) == ("ollama", 16384)
        info = run(provider(lm.url + "/v1", model="m"), scenario)
        assert (info.kind, info.context_window, info.slots) == ("lmstudio", 8192, 0)


def test_a_server_still_loading_its_model_is_asked_again_within_a_second_not_settled_as_another_kind():
    now = [0.0]
    with FakeServer("llamacpp", n_slots=3, n_ctx=2048, loading_s=0.4) as fake:
        async def scenario(d, p):
            await d.discover(p)  # every path answers 503 "Loading model"
            during = d.info(p)
            await asyncio.sleep(0.5)
            now[0] += 1.0  # the short retry for a loading server, not the minute for one that did not answer
            await d.discover(p)
            return during, d.info(p)

        during, after = run(provider(fake.url + "/v1"), scenario,
                            ServerDirectory(timeout_s=2.0, clock=lambda: now[0]))
        assert during is None
        assert (after.kind, after.context_window, after.slots) == ("llama.cpp", 2048, 3)
