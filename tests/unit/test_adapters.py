"""The upstream adapters: one per provider kind, owning URLs, headers, model lists, error classification and
token counting. Pure parts are checked directly; count_tokens talks to the fake upstreams over loopback."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson
import pytest
from pydantic import ValidationError

from coderouterd.config.schema import ProviderConfig
from coderouterd.providers.adapters import (
    ANTHROPIC_VERSION,
    AnthropicAdapter,
    OllamaAdapter,
    OpenAIAdapter,
    adapter_for,
    error_message,
)
from coderouterd.providers.errors import OVERFLOW
from coderouterd.providers.provider import Provider
from coderouterd.providers.strategies import (
    AnthropicPassthrough,
    AnthropicToOpenAIUpstream,
    OpenAIPassthrough,
    OpenAIToAnthropicUpstream,
)
from coderouterd.wire.anthropic import message_start
from tests.fakes.runner import FakeServer


def cfg(kind: str, base_url: str = "http://127.0.0.1:9/v1", **kw) -> ProviderConfig:
    return ProviderConfig(kind=kind, base_url=base_url, **kw)


# -- registry --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,cls,wire", [("openai", OpenAIAdapter, "openai"),
                                           ("anthropic", AnthropicAdapter, "anthropic"),
                                           ("ollama", OllamaAdapter, "openai")])
def test_each_kind_has_its_adapter_and_wire(kind, cls, wire):
    a = adapter_for(cfg(kind))
    assert type(a) is cls and a.kind == kind and a.wire == wire


def test_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="unknown provider kind"):
        adapter_for(SimpleNamespace(kind="grpc", base_url="http://x"))


def test_provider_holds_its_adapter():
    p = Provider("p", cfg("anthropic"))
    assert isinstance(p.adapter, AnthropicAdapter)


# -- URLs ------------------------------------------------------------------------------------------------------


def test_openai_urls():
    a = adapter_for(cfg("openai", "http://127.0.0.1:8080/v1"))
    assert a.api_base == "http://127.0.0.1:8080/v1"
    assert a.root_url == "http://127.0.0.1:8080"
    assert a.generation_url == "http://127.0.0.1:8080/v1/chat/completions"
    assert a.models_url == a.probe_url == "http://127.0.0.1:8080/v1/models"


def test_anthropic_urls():
    a = adapter_for(cfg("anthropic", "https://api.anthropic.com/v1"))
    assert a.generation_url == "https://api.anthropic.com/v1/messages"
    assert a.probe_url == "https://api.anthropic.com/v1/models"


@pytest.mark.parametrize("base", ["http://127.0.0.1:11434", "http://127.0.0.1:11434/v1"])
def test_ollama_generates_through_v1_and_probes_its_native_api(base):
    a = adapter_for(cfg("ollama", base))
    assert a.api_base == "http://127.0.0.1:11434/v1"
    assert a.generation_url == "http://127.0.0.1:11434/v1/chat/completions"
    assert a.root_url == "http://127.0.0.1:11434"
    assert a.probe_url == "http://127.0.0.1:11434/api/tags"


def test_ping_request_is_a_one_token_generation_on_each_wire():
    url, body = adapter_for(cfg("anthropic", "http://h/v1")).ping_request("claude-x")
    assert url == "http://h/v1/messages" and body["max_tokens"] == 1 and body["model"] == "claude-x"
    url, body = adapter_for(cfg("ollama", "http://h")).ping_request("qwen")
    assert url == "http://h/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "ping"}]


# -- headers ---------------------------------------------------------------------------------------------------


def test_openai_key_is_a_bearer_token(monkeypatch):
    monkeypatch.setenv("ADAPTER_TEST_KEY", "sk-1")
    a = adapter_for(cfg("openai", api_key_env="ADAPTER_TEST_KEY", headers={"x-org": "o"}))
    assert a.headers(json=True) == {"content-type": "application/json", "x-org": "o", "authorization": "Bearer sk-1"}
    assert "anthropic-version" not in a.headers(client={"anthropic-version": "2099-01-01"})


def test_no_key_no_auth_header(monkeypatch):
    monkeypatch.delenv("ADAPTER_TEST_KEY", raising=False)
    assert adapter_for(cfg("openai", api_key_env="ADAPTER_TEST_KEY")).headers() == {}
    assert adapter_for(cfg("anthropic", api_key_env="ADAPTER_TEST_KEY")).headers() == {
        "anthropic-version": ANTHROPIC_VERSION}


def test_anthropic_key_and_version(monkeypatch):
    monkeypatch.setenv("ADAPTER_TEST_KEY", "sk-ant")
    h = adapter_for(cfg("anthropic", api_key_env="ADAPTER_TEST_KEY")).headers(stream=True)
    assert h == {"anthropic-version": ANTHROPIC_VERSION, "x-api-key": "sk-ant", "accept": "text/event-stream"}


def test_anthropic_forwards_the_clients_version_and_betas():
    a = adapter_for(cfg("anthropic", headers={"anthropic-version": "2024-01-01"}))
    assert a.headers()["anthropic-version"] == "2024-01-01"  # configured beats the default
    client = {"anthropic-version": "2025-05-05", "anthropic-beta": "tools-2", "x-other": "no"}
    h = a.headers(client=client)
    assert h["anthropic-version"] == "2025-05-05" and h["anthropic-beta"] == "tools-2" and "x-other" not in h


def test_client_key_forwarded_only_when_configured_and_ours_wins(monkeypatch):
    client = {"authorization": "Bearer client", "x-api-key": "client-key"}
    a = adapter_for(cfg("openai"))
    assert "authorization" not in a.headers(client=client)
    assert a.headers(client=client, forward_client_key=True)["authorization"] == "Bearer client"
    monkeypatch.setenv("ADAPTER_TEST_KEY", "ours")
    a = adapter_for(cfg("openai", api_key_env="ADAPTER_TEST_KEY"))
    assert a.headers(client=client, forward_client_key=True)["authorization"] == "Bearer ours"


# -- what the kind means ---------------------------------------------------------------------------------------


def test_kind_traits():
    o, a, ol = (adapter_for(cfg(k)) for k in ("openai", "anthropic", "ollama"))
    assert a.serves_claude_models and not o.serves_claude_models and not ol.serves_claude_models
    assert o.may_serve_responses and not a.may_serve_responses and not ol.may_serve_responses
    assert o.fronts_unknown_server and not a.fronts_unknown_server and not ol.fronts_unknown_server
    assert ol.model_backend == "ollama" and o.model_backend is None and a.model_backend is None
    assert ol.reloads_on_model_switch and not o.reloads_on_model_switch
    assert ol.always_local and not o.always_local and not a.always_local
    assert cfg("ollama", "https://ollama.example.com").is_local()
    assert not cfg("openai", "https://api.example.com/v1").is_local()


def test_serves_responses_needs_an_adapter_that_may():
    assert cfg("openai", serves_responses=True).serves_responses
    for kind in ("anthropic", "ollama"):
        with pytest.raises(ValidationError, match="serves_responses"):
            cfg(kind, serves_responses=True)


@pytest.mark.parametrize("kind,ingress,cls", [
    ("anthropic", "anthropic", AnthropicPassthrough), ("openai", "anthropic", AnthropicToOpenAIUpstream),
    ("ollama", "anthropic", AnthropicToOpenAIUpstream), ("anthropic", "openai", OpenAIToAnthropicUpstream),
    ("openai", "openai", OpenAIPassthrough), ("ollama", "openai", OpenAIPassthrough)])
def test_strategy_follows_the_wire(kind, ingress, cls):
    assert adapter_for(cfg(kind)).strategy_for(ingress) is cls
    assert cls.upstream_wire == adapter_for(cfg(kind)).wire


def test_responses_strategy_passes_through_only_where_served():
    from coderouterd.providers.responses_strategies import (
        ResponsesPassthrough,
        ResponsesToAnthropic,
        ResponsesToChat,
    )

    assert adapter_for(cfg("openai", serves_responses=True)).strategy_for("responses") is ResponsesPassthrough
    assert adapter_for(cfg("openai")).strategy_for("responses") is ResponsesToChat
    assert adapter_for(cfg("anthropic")).strategy_for("responses") is ResponsesToAnthropic


def test_billing_header_only_for_the_real_anthropic_api():
    assert adapter_for(cfg("anthropic", "https://api.anthropic.com/v1")).keeps_billing_header()
    assert not adapter_for(cfg("anthropic", "http://127.0.0.1:8080/v1")).keeps_billing_header()
    assert not adapter_for(cfg("openai", "https://api.anthropic.com/v1")).keeps_billing_header()


def test_model_ids_read_every_list_shape():
    assert OpenAIAdapter.model_ids({"data": [{"id": "a"}, {"id": ""}, {"id": 3}, "x"]}) == ["a"]
    assert OllamaAdapter.model_ids({"models": [{"name": "qwen:7b"}, {"model": "m"}]}) == ["qwen:7b"]
    assert OpenAIAdapter.model_ids(["not", "a", "dict"]) == []


# -- errors ----------------------------------------------------------------------------------------------------


def test_error_message_reads_every_body_shape():
    assert error_message(b'{"error": {"message": "bad key", "type": "auth"}}')[0] == "bad key"
    assert error_message(b'{"error": "model not found"}')[0] == "model not found"  # Ollama, llama.cpp
    assert error_message(b'{"message": "nope"}')[0] == "nope"
    assert error_message(b"  Bad Gateway\n")[0] == "Bad Gateway"


def test_openai_errors_classified():
    a = adapter_for(cfg("openai"))
    e = a.classify_error(429, b'{"error": {"message": "slow down"}}', {"retry-after": "7"})
    assert e.reason == "http_429" and e.retry_after == 7.0 and e.failover and e.counts_against_provider
    e = a.classify_error(400, orjson.dumps({"error": {"code": 400, "type": "exceed_context_size_error",
                                                      "message": "request exceeds the available context size",
                                                      "n_prompt_tokens": 9000, "n_ctx": 8192}}), {})
    assert e.reason == OVERFLOW and e.overflow == (9000, 8192) and not e.counts_against_provider
    e = a.classify_error(400, b'{"error": {"message": "messages: field required"}}', {})
    assert e.reason == "http_400" and not e.failover
    e = a.classify_error(401, b"unauthorized", {})
    assert e.failover and not e.counts_against_provider and e.message == "unauthorized"


def test_ollama_errors_classified_as_openai_wire():
    e = adapter_for(cfg("ollama")).classify_error(404, b'{"error": "model \\"x\\" not found, try pulling it"}', {})
    assert e.reason == "http_404" and e.failover and "try pulling" in e.message


def test_anthropic_errors_classified():
    a = adapter_for(cfg("anthropic"))
    body = {"type": "error", "error": {"type": "invalid_request_error",
                                       "message": "prompt is too long: 250000 tokens > 200000 maximum"}}
    e = a.classify_error(400, orjson.dumps(body), {})
    assert e.reason == OVERFLOW and e.overflow == (250000, 200000)
    e = a.classify_error(529, orjson.dumps({"type": "error", "error": {"type": "overloaded_error",
                                                                        "message": "Overloaded"}}),
                         {"retry-after-ms": "1500"})
    assert e.reason == "http_529" and e.error_type == "overloaded_error" and e.retry_after == 1.5


# -- message_start has one builder -----------------------------------------------------------------------------


def test_message_start_shape():
    ev = message_start("msg_1", "m", 42)
    assert ev["type"] == "message_start"
    assert ev["message"]["usage"] == {"input_tokens": 42, "output_tokens": 1, "cache_creation_input_tokens": 0,
                                      "cache_read_input_tokens": 0}
    assert ev["message"]["content"] == [] and ev["message"]["stop_reason"] is None


# -- count_tokens against the fakes ----------------------------------------------------------------------------


def _req(body: dict, headers: dict | None = None):
    import orjson

    return SimpleNamespace(body=body, raw=orjson.dumps(body), model=body["model"], headers=headers or {})


BODY = {"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": "count these words " * 20}]}


async def _count(provider, req):
    try:
        return await provider.adapter.count_tokens(provider, req)
    finally:
        await provider.close()


def test_anthropic_counts_through_the_messages_api():
    with FakeServer("anthropic", models=["claude-x"]) as s:
        p = Provider("ant", cfg("anthropic", s.url + "/v1"))
        n, label = asyncio.run(_count(p, _req(BODY, {"anthropic-beta": "b1"})))
        sent = [r for r in s.requests if r["path"] == "/v1/messages/count_tokens"][-1]
    assert isinstance(n, int) and n > 0 and label == "exact:ant"
    assert sent["headers"]["anthropic-version"] == ANTHROPIC_VERSION and sent["headers"]["anthropic-beta"] == "b1"


def test_openai_counts_with_the_tokenizer_and_remembers_when_there_is_none():
    with FakeServer("openai", models=["m"], tokenize=True) as s:
        p = Provider("llama", cfg("openai", s.url + "/v1"))
        n, label = asyncio.run(_count(p, _req(BODY)))
    assert n > 0 and label == "tokenizer:llama" and p.tokenize_supported is True
    with FakeServer("openai", models=["m"]) as s:
        p = Provider("plain", cfg("openai", s.url + "/v1"))
        assert asyncio.run(_count(p, _req(BODY))) is None
        assert p.tokenize_supported is False
    # Not asked again: with the server gone, any request would raise a connection error.
    assert asyncio.run(_count(p, _req(BODY))) is None
