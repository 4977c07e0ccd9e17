"""Malformed requests get a clear 4xx in the caller's shape, naming the field, and the daemon keeps serving."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, openai_at
from tests.support.daemon import running


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with FakeServer("openai", name="local") as local:
        cfg = daemon_config(server={"max_body_mb": 1}, providers={"local": openai_at(local.url)},
                            profiles={"default": ["local"], "coding": ["local"]})
        with running(cfg, tmp_path_factory.mktemp("bad")) as d:
            yield d


def _post(d, path, content=None, json=None, headers=None):
    return httpx.post(d.url + path, content=content, json=json, headers=headers, timeout=10)


A = "/v1/messages"
OA = "/v1/chat/completions"
OK_A = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path,body,field", [
    (A, b"{not json", "JSON"),
    (A, b"[1,2]", "request body"),
    (A, b'{"max_tokens": 5, "messages": []}', "model"),
    (A, b'{"model": "m", "messages": []}', "max_tokens"),
    (A, b'{"model": "m", "max_tokens": "5", "messages": []}', "max_tokens"),
    (A, b'{"model": "m", "max_tokens": 5}', "messages"),
    (A, b'{"model": "m", "max_tokens": 5, "messages": "hi"}', "messages"),
    (A, b'{"model": "m", "max_tokens": 5, "messages": [{"role": "bot", "content": "x"}]}', "messages[0].role"),
    (A, b'{"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
    (A, b'{"model": "m", "max_tokens": 5, "stream": "yes", "messages": []}', "stream"),
    (A, b'{"model": "m", "max_tokens": 5, "messages": [], "tools": [{}]}', "tools[0].name"),
    (OA, b"{not json", "JSON"),
    (OA, b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    (OA, b'{"model": "m"}', "messages"),
    (OA, b'{"model": "m", "messages": [{"role": "robot"}]}', "messages[0].role"),
    (OA, b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}', "max_tokens"),
    # Model names are capped at the edge (issue 34: 1 MB names cost +580 MB), on all three ingresses.
    (A, b'{"model": "%s", "max_tokens": 5, "messages": []}' % (b"m" * 257), "longer than 256 characters"),
    (OA, b'{"model": "%s", "messages": [{"role": "user", "content": "x"}]}' % (b"m" * 100_000),
     "longer than 256 characters"),
    ("/v1/responses", b'{"model": "%s", "input": "hi"}' % (b"m" * 257), "longer than 256 characters"),
])
def test_malformed_requests(env, path, body, field):
    r = _post(env, path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    data = r.json()
    if path == A:
        assert data["type"] == "error" and data["error"]["type"] == "invalid_request_error"
        assert field in data["error"]["message"]
    else:
        assert data["error"]["type"] == "invalid_request_error" and field in data["error"]["message"]
    assert httpx.get(env.url + "/healthz").status_code == 200


@pytest.mark.parametrize("path", [A, OA])
def test_huge_body_is_413(env, path):
    big = b'{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"' + b"x" * (1_200_000) + b'"}]}'
    r = _post(env, path, content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    if path == A:
        assert r.json()["error"]["type"] == "request_too_large"
    # A chunked body with no content-length is cut off as it streams in, too.
    r2 = httpx.post(env.url + path, content=iter([big[:600_000], big[600_000:]]), timeout=10,
                    headers={"content-type": "application/json"})
    assert r2.status_code == 413
    assert _post(env, A, json=OK_A).status_code == 200


def test_unknown_profile_lists_valid_ones(env):
    r = _post(env, A, json=OK_A, headers={"x-coderouter-profile": "nope"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "nope" in err["message"] and "coding" in err["message"] and "default" in err["message"]
    assert err["valid_profiles"] == ["coding", "default"]


def test_unknown_path_and_method(env):
    r = httpx.get(env.url + "/v1/nothing")
    assert r.status_code == 404 and "error" in r.json()
    r = httpx.get(env.url + "/v1/messages", headers={"anthropic-version": "2023-06-01"})
    assert r.status_code == 405 and r.json()["type"] == "error"


def test_beta_query_and_unknown_betas_accepted(env):
    r = _post(env, A + "?beta=true", json=OK_A, headers={"anthropic-beta": "made-up-2099-01-01,another"})
    assert r.status_code == 200
