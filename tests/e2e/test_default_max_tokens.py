"""A profile's default output limit (`[profiles.X] default_max_tokens`): set on a request that names none, on
every ingress that can lack one (chat, Responses, Gemini), whatever wire the upstream speaks; never over a limit
the client asked for; shown by `corectl explain`. Copilot CLI's chat and Responses requests carry none
(docs/clients.md), and a local server has no cap of its own."""

from __future__ import annotations

import os

import httpx
import orjson
import pytest

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.config import anthropic_at, daemon_config, openai_at, warn
from tests.support.daemon import running

LIMIT = 77
CHAT = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_default_max_tokens")
    with FakeServer("openai", name="local", models=["qwen3"]) as local, \
            FakeServer("anthropic", name="cloud") as cloud, \
            FakeServer("openai", name="native", models=["qwen3"]) as native:
        config = daemon_config(
            providers={"local": openai_at(local.url), "cloud": anthropic_at(cloud.url, model="claude-sonnet-5"),
                       "native": openai_at(native.url, serves_responses=True)},
            profiles={"default": warn("local"), "capped": warn("local", default_max_tokens=LIMIT),
                      "capped_cloud": warn("cloud", default_max_tokens=LIMIT),
                      "capped_native": warn("native", default_max_tokens=LIMIT)})
        with running(config, tmp) as d:
            yield {"daemon": d, "local": local, "cloud": cloud, "native": native}


@pytest.fixture(autouse=True)
def _reset(env):
    for k in ("local", "cloud", "native"):
        env[k].reset()


def post(env, path: str, body: dict, profile: str) -> httpx.Response:
    r = httpx.post(env["daemon"].url + path, json=body, headers={"x-coderouter-profile": profile}, timeout=20)
    assert r.status_code == 200, r.text
    return r


def sent(fake: FakeServer, path: str) -> dict:
    bodies = [r["json"] for r in fake.requests if r["path"] == path]
    assert len(bodies) == 1, [r["path"] for r in fake.requests]
    return bodies[0]


def explain(env, rid: str, *json_flag: str) -> str:
    child = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    child["COLUMNS"] = "220"
    child["CODEROUTER_SOCKET"] = str(env["daemon"].state_dir / "coderouterd.sock")
    p = cli.corectl(["explain", rid, *json_flag], env=child)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_chat_request_without_a_limit_gets_the_profiles_default_and_explain_says_so(env):
    r = post(env, "/v1/chat/completions", CHAT, "capped")
    assert sent(env["local"], "/v1/chat/completions")["max_tokens"] == LIMIT
    rid = r.headers["x-request-id"]
    trace = orjson.loads(explain(env, rid, "--json"))["trace"]
    assert trace["guards"] == [{"guard": "output_limit", "action": "default",
                                "message": f"max_tokens {LIMIT} from profile 'capped' (the client sent none)"}]
    assert f"output limit set: max_tokens {LIMIT} from profile 'capped'" in explain(env, rid)


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_limit_the_client_sent_is_kept(env, field):
    r = post(env, "/v1/chat/completions", {**CHAT, field: 5000}, "capped")
    body = sent(env["local"], "/v1/chat/completions")
    assert body["max_tokens"] == 5000  # not lowered to the default (max_completion_tokens is copied for llama.cpp)
    assert orjson.loads(explain(env, r.headers["x-request-id"], "--json"))["trace"]["guards"] == []


def test_a_profile_without_a_default_sends_none(env):
    post(env, "/v1/chat/completions", CHAT, "default")
    assert "max_tokens" not in sent(env["local"], "/v1/chat/completions")


def test_responses_request_without_a_limit(env):
    post(env, "/v1/responses", {"model": "qwen3", "input": "hi"}, "capped")
    assert sent(env["local"], "/v1/chat/completions")["max_tokens"] == LIMIT


def test_responses_request_to_an_upstream_serving_responses_gets_max_output_tokens(env):
    post(env, "/v1/responses", {"model": "qwen3", "input": "hi", "store": False}, "capped_native")
    assert sent(env["native"], "/v1/responses")["max_output_tokens"] == LIMIT  # the client's body, passed through


def test_gemini_request_without_a_limit(env):
    post(env, "/v1beta/models/qwen3:generateContent", {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]},
         "capped")
    assert sent(env["local"], "/v1/chat/completions")["max_tokens"] == LIMIT


def test_chat_request_to_an_anthropic_upstream_gets_the_default_not_the_translations(env):
    post(env, "/v1/chat/completions", CHAT, "capped_cloud")
    assert sent(env["cloud"], "/v1/messages")["max_tokens"] == LIMIT  # instead of the translation's fallback


def test_anthropic_requests_always_name_their_own(env):
    body = {"model": "claude-sonnet-5", "max_tokens": 3000, "messages": [{"role": "user", "content": "hi"}]}
    r = post(env, "/v1/messages", body, "capped_cloud")
    assert sent(env["cloud"], "/v1/messages")["max_tokens"] == 3000
    assert orjson.loads(explain(env, r.headers["x-request-id"], "--json"))["trace"]["guards"] == []
