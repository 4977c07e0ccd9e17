"""The edge's browser checks, as pure functions over a request's raw headers (ingress/browsers.py)."""

from __future__ import annotations

import pytest

from coderouterd.config import parse_config_text
from coderouterd.ingress.browsers import BrowserGuard, is_json_type

JSON = (b"content-type", b"application/json")
REST = '[providers.local]\nbase_url = "http://127.0.0.1:9/v1"\n[profiles.default]\nproviders = ["local"]\n'



def _check(guard: BrowserGuard, *headers: tuple[bytes, bytes], path: str = "/v1/messages", method: str = "POST"):
    refused, listed = guard.refusal(path, method, list(headers))
    return (refused.status, refused.reason) if refused else None, listed


@pytest.fixture
def guard() -> BrowserGuard:
    return BrowserGuard("127.0.0.1", 8088)


@pytest.mark.parametrize("host", [b"127.0.0.1:8088", b"localhost:8088", b"[::1]:8088", b"LOCALHOST:8088",
                                  b"localhost", b"127.0.0.1"])
def test_the_daemons_own_names_are_served(guard, host):
    assert _check(guard, (b"host", host), JSON) == (None, None)


@pytest.mark.parametrize("host", [b"rebound.test:8088", b"evil.example", b"127.0.0.1:9999", b"localhost:80",
                                  b"127.0.0.1.nip.io:8088", b"", b"localhost:8088.evil"])
def test_a_foreign_host_is_refused_with_403(guard, host):
    assert _check(guard, (b"host", host), JSON) == ((403, "host"), None)


def test_no_host_at_all_is_an_http10_client_not_a_browser(guard):
    assert _check(guard, JSON) == (None, None)  # HTTP/1.1 without Host is the protocol's 400 (test_request_target)


def test_allowed_hosts_with_and_without_a_port():
    g = BrowserGuard("127.0.0.1", 8088, ["coderouter.lan", "box.lan:9000"])
    assert _check(g, (b"host", b"coderouter.lan:8088"), JSON)[0] is None
    assert _check(g, (b"host", b"coderouter.lan"), JSON)[0] is None  # behind a proxy on port 80/443
    assert _check(g, (b"host", b"box.lan:9000"), JSON)[0] is None
    assert _check(g, (b"host", b"box.lan:8088"), JSON)[0] == (403, "host")
    assert _check(g, (b"host", b"other.lan:8088"), JSON)[0] == (403, "host")


def test_a_star_turns_the_host_check_off_but_not_the_others():
    g = BrowserGuard("127.0.0.1", 8088, ["*"])
    assert _check(g, (b"host", b"anything:1"), JSON)[0] is None
    assert _check(g, (b"host", b"anything:1"), (b"origin", b"http://evil.example"), JSON)[0] == (403, "origin")


def test_the_listen_address_is_one_of_the_names():
    g = BrowserGuard("192.168.1.5", 8088)
    assert _check(g, (b"host", b"192.168.1.5:8088"), JSON)[0] is None
    v6 = BrowserGuard("::1", 8088)
    assert _check(v6, (b"host", b"[::1]:8088"), JSON)[0] is None


@pytest.mark.parametrize("origin", [b"http://evil.example", b"null", b"http://localhost:3000",
                                    b"https://127.0.0.1:8088", b"http://127.0.0.1:8089"])
def test_a_cross_origin_request_is_refused(guard, origin):
    assert _check(guard, (b"host", b"127.0.0.1:8088"), (b"origin", origin), JSON) == ((403, "origin"), None)


def test_our_own_origin_is_not_cross_origin(guard):
    assert _check(guard, (b"host", b"127.0.0.1:8088"), (b"origin", b"http://127.0.0.1:8088"), JSON) == (None, None)
    assert _check(guard, (b"host", b"localhost:8088"), (b"origin", b"http://localhost:8088/"), JSON) == (None, None)


@pytest.mark.parametrize("site,refused", [(b"cross-site", True), (b"same-site", True), (b"same-origin", False),
                                          (b"none", False)])
def test_sec_fetch_site_without_an_origin(guard, site, refused):
    # A no-cors GET (an <img>, a <script>) carries no Origin, but current browsers say where it came from.
    got, _ = _check(guard, (b"host", b"127.0.0.1:8088"), (b"sec-fetch-site", site), path="/metrics", method="GET")
    assert got == ((403, "origin") if refused else None)


def test_a_listed_origin_is_let_through_and_named_for_cors():
    g = BrowserGuard("127.0.0.1", 8088, cors_origins=["http://localhost:5173/"])
    got = _check(g, (b"host", b"127.0.0.1:8088"), (b"origin", b"http://LOCALHOST:5173"),
                 (b"sec-fetch-site", b"cross-site"), JSON)
    assert got == (None, b"http://localhost:5173")
    # Listing one origin opens nothing for another.
    assert _check(g, (b"host", b"127.0.0.1:8088"), (b"origin", b"http://localhost:5174"), JSON)[0] == (403, "origin")


@pytest.mark.parametrize("ctype", [None, b"text/plain", b"text/plain;charset=UTF-8", b"application/x-www-form-urlencoded",
                                   b"multipart/form-data; boundary=x", b"application/jsonp", b"text/json"])
def test_a_json_route_refuses_a_body_not_declared_as_json(guard, ctype):
    headers = [(b"host", b"127.0.0.1:8088")] + ([(b"content-type", ctype)] if ctype is not None else [])
    for path in ("/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/messages/count_tokens"):
        assert _check(guard, *headers, path=path)[0] == (415, "content_type")


@pytest.mark.parametrize("ctype", [b"application/json", b"application/json; charset=utf-8", b"Application/JSON",
                                   b"application/vnd.api+json"])
def test_json_content_types_that_clients_send(ctype):
    assert is_json_type(ctype)


def test_gets_need_no_content_type(guard):
    assert _check(guard, (b"host", b"127.0.0.1:8088"), path="/v1/models", method="GET") == (None, None)


def test_preflight_answer_names_the_origin_and_what_it_may_send():
    hs = dict(BrowserGuard.preflight_headers(b"http://localhost:5173", b"content-type, x-api-key"))
    assert hs[b"access-control-allow-origin"] == b"http://localhost:5173"
    assert hs[b"access-control-allow-headers"] == b"content-type, x-api-key"
    assert b"POST" in hs[b"access-control-allow-methods"] and hs[b"vary"] == b"Origin"


@pytest.mark.parametrize("text,needle", [
    ('cors_origins = ["*"]', "any web page"),
    ('cors_origins = ["null"]', "any web page"),
    ('cors_origins = ["localhost:5173"]', "not a web origin"),
    ('cors_origins = ["http://localhost:5173/app"]', "not a web origin"),
    ('allowed_hosts = ["http://box.lan"]', "not a host name"),
    ('allowed_hosts = [""]', "not a host name"),
])
def test_config_refuses_what_would_open_everything_or_match_nothing(text, needle):
    with pytest.raises(Exception) as e:
        parse_config_text(f"[server]\n{text}\n{REST}", "test")
    assert needle in str(e.value)


def test_config_accepts_names_and_origins():
    cfg = parse_config_text('[server]\nallowed_hosts = ["Box.lan", "*"]\ncors_origins = ["http://localhost:5173"]\n'
                            + REST, "test")
    assert cfg.server.allowed_hosts == ["box.lan", "*"]
    assert cfg.server.cors_origins == ["http://localhost:5173"]


# -- header forms no browser sends (issue 41, N14) -----------------------------------------------------------

@pytest.mark.parametrize("hosts", [(b"127.0.0.1:8088", b"127.0.0.1:8088"), (b"evil.test", b"127.0.0.1:8088"),
                                   (b"127.0.0.1:8088", b"evil.test")])
def test_a_second_host_is_a_400_whichever_comes_first(guard, hosts):
    headers = [(b"host", h) for h in hosts]
    assert _check(guard, *headers, JSON) == ((400, "ambiguous"), None)
    assert _check(BrowserGuard("127.0.0.1", 8088, ["*"]), *headers, JSON) == ((400, "ambiguous"), None)
    refused, _ = guard.refusal("/v1/messages", "POST", [*headers, JSON])
    assert refused is not None and refused.error_type == "invalid_request_error"
    assert refused.message == "more than one Host header: a request must carry exactly one"


def test_a_second_origin_is_a_400_even_when_both_are_listed():
    guard = BrowserGuard("127.0.0.1", 8088, cors_origins=["https://app.example"])
    host = (b"host", b"127.0.0.1:8088")
    once = (b"origin", b"https://app.example")
    assert _check(guard, host, once, JSON) == (None, b"https://app.example")
    assert _check(guard, host, once, once, JSON) == ((400, "ambiguous"), None)
    assert _check(guard, host, once, (b"origin", b"https://evil.example"), JSON) == ((400, "ambiguous"), None)


def test_a_second_sec_fetch_site_is_a_400(guard):
    host = (b"host", b"127.0.0.1:8088")
    assert _check(guard, host, (b"sec-fetch-site", b"cross-site"), (b"sec-fetch-site", b"none"), JSON) \
        == ((400, "ambiguous"), None)


@pytest.mark.parametrize("site", [b"CROSS-SITE", b"Cross-Site", b"SAME-SITE", b" cross-site "])
def test_sec_fetch_site_is_read_without_regard_to_case(guard, site):
    assert _check(guard, (b"host", b"127.0.0.1:8088"), (b"sec-fetch-site", site), JSON) == ((403, "origin"), None)


@pytest.mark.parametrize("site", [b"SAME-ORIGIN", b"None"])
def test_same_origin_and_none_in_any_case_are_served(guard, site):
    assert _check(guard, (b"host", b"127.0.0.1:8088"), (b"sec-fetch-site", site), JSON) == (None, None)
