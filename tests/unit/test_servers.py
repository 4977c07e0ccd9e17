"""The server kind modules on parsed JSON alone: recognition, context windows, slots (no sockets)."""

from __future__ import annotations

import asyncio

import pytest

from coderouterd import servers
from coderouterd.servers import llamacpp, lmstudio, ollama


def getter(routes: dict[str, object]):
    """An async GET over canned answers: a path missing from `routes` is a 404."""
    asked: list[str] = []

    async def get(path: str):
        asked.append(path)
        return (200, routes[path]) if path in routes else (404, None)

    get.asked = asked
    return get


LLAMA = {"/props": {"default_generation_settings": {"n_ctx": 4096, "params": {}}, "total_slots": 3},
         "/v1/models": {"object": "list", "data": [{"id": "smol", "owned_by": "llamacpp", "meta": {"n_ctx": 4096}}]}}
OLLAMA = {"/api/version": {"version": "0.14.3"}, "/v1/models": {"data": [{"id": "qwen3", "owned_by": "library"}]}}
LMSTUDIO = {"/api/v0/models": {"object": "list", "data": []}, "/props": LLAMA["/props"]}
VLLM = {"/v1/models": {"data": [{"id": "Qwen/Qwen3-8B", "owned_by": "vllm", "max_model_len": 32768}]}}
OPENAI = {"/v1/models": {"data": [{"id": "gpt-5", "owned_by": "openai"}]}}


@pytest.mark.parametrize("routes,kind", [(LLAMA, "llama.cpp"), (OLLAMA, "ollama"), (LMSTUDIO, "lmstudio"),
                                         (VLLM, "vllm"), (OPENAI, "openai"), ({}, "openai")],
                         ids=["llama", "ollama", "lmstudio-before-props", "vllm", "openai", "nothing"])
def test_detect_picks_the_first_kind_that_recognises_the_answers(routes, kind):
    get = getter(routes)
    found = asyncio.run(servers.detect(get))
    assert found.kind.name == kind
    assert len(get.asked) == len(set(get.asked))  # every probe path asked once, whatever the kinds share


def test_detect_says_unreachable_only_when_nothing_answered():
    async def refused(path):
        raise ConnectionRefusedError("refused")

    with pytest.raises(servers.Unreachable):
        asyncio.run(servers.detect(refused))


def test_llama_server_window_and_slots_come_from_props():
    found = asyncio.run(servers.detect(getter(LLAMA)))
    assert found.kind.slots(found.answers) == 3
    w = asyncio.run(found.kind.window(getter({}), "", found.answers))
    assert w.tokens == 4096 and w.firm and "/props" in w.source
    assert llamacpp.slot_context({"default_generation_settings": {}}) is None


def test_vllm_window_is_the_models_max_model_len():
    found = asyncio.run(servers.detect(getter(VLLM)))
    assert asyncio.run(found.kind.window(getter({}), "Qwen/Qwen3-8B", found.answers)).tokens == 32768


def test_ollama_window_prefers_loaded_then_num_ctx_then_a_guess():
    show = {"parameters": "temperature 0.7", "model_info": {"qwen3.context_length": 40960}}
    ps = {"models": [{"name": "qwen3:latest", "context_length": 8192}]}
    assert ollama.window_from(show, ps, "qwen3").tokens == 8192
    w = ollama.window_from({**show, "parameters": "num_ctx 16384"}, {"models": []}, "qwen3")
    assert (w.tokens, w.firm, w.trained) == (16384, True, 40960)
    guess = ollama.window_from(show, None, "qwen3")
    assert guess.tokens == ollama.DEFAULT_CONTEXT and not guess.firm  # never routed by

    async def post(path, body, timeout):
        return show

    # Routed by: the trained context bounds whatever a load will give, the default is only a guess.
    w = asyncio.run(ollama.KIND.window(getter({"/api/ps": {"models": []}}), "qwen3", {}, post))
    assert (w.tokens, w.firm) == (40960, True)


def test_lmstudio_window_is_the_smallest_loaded_instance_else_its_maximum():
    v1 = {"models": [{"key": "m", "max_context_length": 32768,
                      "loaded_instances": [{"id": "m", "config": {"context_length": 8192}},
                                           {"id": "m:2", "config": {"context_length": 4096}}]}]}
    assert lmstudio.window_from(v1, None, "m").tokens == 4096
    v0 = {"data": [{"id": "m", "state": "loaded", "loaded_context_length": 6000, "max_context_length": 32768}]}
    assert lmstudio.window_from(None, v0, "m").tokens == 6000
    idle = lmstudio.window_from({"models": [{"key": "m", "max_context_length": 32768, "loaded_instances": []}]},
                                None, "m")
    assert (idle.tokens, idle.firm) == (32768, False)


def test_every_kind_has_a_name_and_generic_comes_last():
    assert servers.KINDS[-1] is servers.GENERIC
    names = [k.name for k in servers.KINDS]
    assert len(set(names)) == len(names) and all(names)
    assert servers.by_name("llama.cpp") is llamacpp.KIND and servers.by_name("nonesuch") is servers.GENERIC
