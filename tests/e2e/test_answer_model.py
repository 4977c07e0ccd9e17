"""The model an answer names (issue 34, item 6): the client's name, in every ingress, streamed or whole, whatever
the server calls its model (llama-server answers with the absolute path of its .gguf file, an Anthropic API with
a dated id). Real daemon, fake upstreams that name their model their own way."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config
from tests.support.daemon import DaemonProcess, running

ASKED = "my-model"
MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with FakeServer("openai", name="local", served_model="/home/u/models/Qwen3-8B-Q4_K_M.gguf") as local, \
            FakeServer("anthropic", name="anth", served_model="claude-x-20250101") as anth:
        # "aliased": the upstream is asked for its configured model, the client still hears its own name.
        providers = {"local": local.url, "anth": {"base_url": anth.url + "/v1", "kind": "anthropic"},
                     "aliased": {"base_url": local.url + "/v1", "model": "qwen3-8b"}}
        cfg = daemon_config(providers=providers, profiles={"default": ["local"], "local": ["local"],
                                                           "anth": ["anth"], "aliased": ["aliased"]})
        with running(cfg, tmp_path_factory.mktemp("answer_model")) as d:
            yield d


def _events(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line[6:].strip() != "[DONE]":
            out.append(json.loads(line[6:]))
    return out


def named(d: DaemonProcess, ingress: str, profile: str, stream: bool) -> set[str]:
    """Every model name the answer carries."""
    path, body = {
        "openai": ("/v1/chat/completions", {"model": ASKED, "messages": MESSAGES}),
        "anthropic": ("/v1/messages", {"model": ASKED, "max_tokens": 50, "messages": MESSAGES}),
        "responses": ("/v1/responses", {"model": ASKED, "input": "hi"}),
    }[ingress]
    r = httpx.post(d.url + path, json={**body, "stream": stream}, timeout=20,
                   headers={"x-coderouter-profile": profile})
    assert r.status_code == 200, r.text
    if not stream:
        return {r.json()["model"]}
    names = set()
    for ev in _events(r.text):
        holder = ev.get("message") or ev.get("response") or ev
        if isinstance(holder, dict) and "model" in holder:
            names.add(holder["model"])
    assert names, r.text
    return names


@pytest.mark.parametrize("profile", ["local", "anth", "aliased"])
@pytest.mark.parametrize("ingress", ["openai", "anthropic", "responses"])
def test_every_answer_names_the_model_the_client_asked_for(daemon, ingress, profile):
    assert named(daemon, ingress, profile, stream=False) == {ASKED}
    assert named(daemon, ingress, profile, stream=True) == {ASKED}
