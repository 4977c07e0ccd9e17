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


# -- header forms no browser sends (issue 41, N14): raw sockets, as no SDK can send them ----------------------

def _raw(d, request_line: str, headers: list[str], body: bytes = b"") -> tuple[int, dict]:
    """Send one request exactly as written; (status, JSON body) of the answer."""
    import socket

    import orjson

    head = "\r\n".join([request_line, *headers, f"content-length: {len(body)}", "connection: close", "", ""])
    with socket.create_connection(("127.0.0.1", d.port), timeout=10) as s:
        s.sendall(head.encode("latin-1") + body)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    status_line, _, rest = got.partition(b"\r\n")
    payload = rest.split(b"\r\n\r\n", 1)[1]
    return int(status_line.split()[1]), orjson.loads(payload) if payload.startswith(b"{") else {}


def _bodies():
    import orjson

    return {"/v1/messages": orjson.dumps(MESSAGES), "/v1/chat/completions": orjson.dumps(CHAT)}


def _shape_ok(path: str, doc: dict) -> bool:
    """The caller's error shape: Anthropic's `type: error` envelope, or OpenAI's `error` object."""
    if path == "/v1/messages":
        return doc.get("type") == "error" and doc["error"]["type"] == "invalid_request_error"
    return "type" not in doc and doc["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("order", ["own-first", "foreign-first", "same-twice"])
def test_a_duplicated_host_is_a_400_in_the_callers_shape(env, order):
    d, up = env
    up.reset()
    own, foreign = f"host: 127.0.0.1:{d.port}", f"host: rebound.test:{d.port}"
    hosts = {"own-first": [own, foreign], "foreign-first": [foreign, own], "same-twice": [own, own]}[order]
    before = _refused(d).get("ambiguous", 0)
    for path, body in _bodies().items():
        status, doc = _raw(d, f"POST {path} HTTP/1.1", [*hosts, "content-type: application/json"], body)
        assert status == 400 and _shape_ok(path, doc), (path, doc)
        assert "more than one Host header" in doc["error"]["message"]
    status, _doc = _raw(d, "GET /ui HTTP/1.1", hosts)
    assert status == 400  # the dashboard's own Host check refuses it too
    assert _posts(up) == 0
    assert _refused(d)["ambiguous"] == before + 2  # counted apart from a browser's refusals


def test_an_absolute_form_target_naming_another_host_is_a_400(env):
    d, up = env
    up.reset()
    own = f"127.0.0.1:{d.port}"
    for path, body in _bodies().items():
        status, doc = _raw(d, f"POST http://rebound.test{path} HTTP/1.1", [f"host: {own}",
                                                                           "content-type: application/json"], body)
        assert status == 400 and _shape_ok(path, doc), (path, doc)
        assert doc["error"]["message"] == (f"the request target names host 'rebound.test' but the Host header says "
                                           f"'{own}': send the path alone (origin-form), with the Host header "
                                           "naming this server")
    assert _posts(up) == 0
    # The same form naming the Host's own name is plain HTTP/1.1 (RFC 9112 3.2.2): served.
    status, doc = _raw(d, f"POST http://{own}/v1/chat/completions HTTP/1.1", [f"host: {own}",
                                                                               "content-type: application/json"],
                       _bodies()["/v1/chat/completions"])
    assert status == 200 and doc["choices"], doc
    # And naming a foreign name in both places is the rebinding case: the Host check's 403.
    status, doc = _raw(d, "POST http://rebound.test/v1/chat/completions HTTP/1.1",
                       ["host: rebound.test", "content-type: application/json"], _bodies()["/v1/chat/completions"])
    assert status == 403 and "allowed_hosts" in doc["error"]["message"]
    assert _posts(up) == 1


def test_a_duplicated_origin_is_a_400(env):
    d, up = env
    up.reset()
    for origins in ([f"origin: {LISTED}", f"origin: {LISTED}"], [f"origin: {LISTED}", "origin: https://evil.example"],
                    ["origin: https://evil.example", f"origin: {LISTED}"]):
        for path, body in _bodies().items():
            status, doc = _raw(d, f"POST {path} HTTP/1.1", [f"host: 127.0.0.1:{d.port}", *origins,
                                                            "content-type: application/json"], body)
            assert status == 400 and _shape_ok(path, doc), (origins, path, doc)
            assert "more than one Origin header" in doc["error"]["message"]
    assert _posts(up) == 0


@pytest.mark.parametrize("site", ["CROSS-SITE", "Same-Site"])
def test_sec_fetch_site_in_upper_case_is_refused_like_lower_case(env, site):
    d, up = env
    up.reset()
    status, doc = _raw(d, "POST /v1/messages HTTP/1.1", [f"host: 127.0.0.1:{d.port}", f"sec-fetch-site: {site}",
                                                          "content-type: application/json"], _bodies()["/v1/messages"])
    assert status == 403 and doc["error"]["type"] == "permission_error" and site in doc["error"]["message"]
    assert _posts(up) == 0


def test_no_host_on_http11_is_a_400_and_http10_without_it_is_served(env):
    d, up = env
    up.reset()
    for path, body in _bodies().items():
        status, doc = _raw(d, f"POST {path} HTTP/1.1", ["content-type: application/json"], body)
        assert status == 400 and _shape_ok(path, doc), (path, doc)
        assert doc["error"]["message"] == "an HTTP/1.1 request must carry a Host header"
    assert _posts(up) == 0
    status, doc = _raw(d, "POST /v1/chat/completions HTTP/1.0", ["content-type: application/json"],
                       _bodies()["/v1/chat/completions"])
    assert status == 200 and doc["choices"]
    # Liveness stays open to any prober, Host or not; the dashboard is not.
    assert _raw(d, "GET /healthz HTTP/1.1", [])[0] == 200
    assert _raw(d, "GET /ui HTTP/1.1", [])[0] == 400
