"""Browsers are not callers, on the real daemon: a foreign Host, a cross-site Origin and a body not declared as
JSON are refused in the caller's shape before anything reaches an upstream; a listed origin gets real CORS.
(The same in real Chromium: tests/browser/test_cross_site.py.)"""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config
from tests.support.metrics import scrape, series

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
MESSAGES = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
LISTED = "http://localhost:5173"


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    from tests.support.daemon import running

    with FakeServer("openai", name="local") as up:
        cfg = daemon_config(providers={"local": up.url}, profiles={"default": ["local"]},
                            server={"cors_origins": [LISTED]})
        with running(cfg, tmp_path_factory.mktemp("browsers")) as d:
            yield d, up


def _posts(up) -> int:
    """Model requests the upstream saw (the daemon's own probes are GETs)."""
    return sum(1 for r in up.requests if r["method"] == "POST")


def _refused(d) -> dict[str, float]:
    return {lab["reason"]: v for lab, v in series(scrape(d), "coderouter_browser_refused_total")}


def test_a_foreign_host_is_refused_in_each_callers_shape_and_reaches_no_upstream(env):
    d, up = env
    up.reset()
    before = _refused(d)["host"]
    rebound = {"host": f"rebound.test:{d.port}"}
    a = httpx.post(d.url + "/v1/messages", json=MESSAGES, headers=rebound, timeout=10)
    assert a.status_code == 403 and a.json()["type"] == "error"
    assert a.json()["error"]["type"] == "permission_error" and "allowed_hosts" in a.json()["error"]["message"]
    o = httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers=rebound, timeout=10)
    assert o.status_code == 403 and "allowed_hosts" in o.json()["error"]["message"]
    for path in ("/v1/models", "/metrics", "/"):
        assert httpx.get(d.url + path, headers=rebound, timeout=10).status_code == 403, path
    # Liveness stays open to any prober; and the dashboard keeps its own Host check.
    assert httpx.get(d.url + "/healthz", headers=rebound, timeout=10).status_code == 200
    assert httpx.get(d.url + "/ui", headers=rebound, timeout=10).status_code == 403
    assert _posts(up) == 0
    assert _refused(d)["host"] == before + 5  # /ui refuses by its own check


@pytest.mark.parametrize("ctype", ["text/plain;charset=UTF-8", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", None])
def test_a_body_not_declared_as_json_gets_415_and_is_never_parsed(env, ctype):
    d, up = env
    up.reset()
    import orjson

    headers = {"content-type": ctype} if ctype else {}
    for path, body in (("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)):
        r = httpx.post(d.url + path, content=orjson.dumps(body), headers=headers, timeout=10)
        assert r.status_code == 415, (path, r.text)
        assert "application/json" in r.text
    assert _posts(up) == 0


def test_a_cross_site_origin_is_refused_and_a_listed_one_gets_cors(env):
    d, up = env
    up.reset()
    r = httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers={"origin": "https://evil.example"}, timeout=10)
    assert r.status_code == 403 and "cors_origins" in r.json()["error"]["message"]
    assert "access-control-allow-origin" not in r.headers
    r = httpx.get(d.url + "/v1/models", headers={"sec-fetch-site": "cross-site"}, timeout=10)
    assert r.status_code == 403
    assert _posts(up) == 0
    # Deliberately opened: the listed origin's preflight and request are answered with CORS headers.
    pre = httpx.options(d.url + "/v1/chat/completions", timeout=10, headers={
        "origin": LISTED, "access-control-request-method": "POST",
        "access-control-request-headers": "content-type,authorization"})
    assert pre.status_code == 204
    assert pre.headers["access-control-allow-origin"] == LISTED
    assert pre.headers["access-control-allow-headers"] == "content-type,authorization"
    ok = httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers={"origin": LISTED}, timeout=10)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == LISTED
    assert _posts(up) == 1
    # A preflight from an origin that is not listed is refused too.
    assert httpx.options(d.url + "/v1/chat/completions", headers={"origin": "http://localhost:1"},
                         timeout=10).status_code == 403


def test_real_clients_shapes_still_pass(env):
    """What the SDKs and agents send: JSON with their own headers, no Origin, a loopback Host."""
    d, up = env
    up.reset()
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
    assert oa.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}]).choices
    an = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
    assert an.messages.create(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]).content
    assert _posts(up) == 2
