"""Who may read the dashboard: the Host check against DNS rebinding, the key check and its cookie, the login
form's Origin, and the headers every answer carries."""

from __future__ import annotations

import pytest

from coderouterd.ui.guard import (
    COOKIE,
    CSP,
    SECURITY_HEADERS,
    UiAuth,
    allowed_hosts,
    cookie_value,
    host_allowed,
    origin_allowed,
)

KEYS = ["k-one", "k-two"]


@pytest.mark.parametrize("host", ["127.0.0.1:8088", "localhost:8088", "LOCALHOST:8088", "[::1]:8088",
                                  " localhost:8088 "])
def test_loopback_names_with_our_port_are_served(host):
    assert host_allowed(host, allowed_hosts("127.0.0.1", 8088))


@pytest.mark.parametrize("host", [
    "evil.example:8088",        # a rebinding page's own name
    "evil.example",
    "127.0.0.1",                # no port: not what a browser sends for port 8088
    "127.0.0.1:9999",           # another port: another server
    "localhost.evil.example:8088",
    "127.0.0.1.nip.io:8088",
    "",
    None,                       # HTTP/1.0 without Host
])
def test_other_hosts_are_refused(host):
    assert not host_allowed(host, allowed_hosts("127.0.0.1", 8088))


def test_the_configured_listen_address_is_served_too():
    allowed = allowed_hosts("192.168.1.20", 8088)
    assert host_allowed("192.168.1.20:8088", allowed)
    assert host_allowed("localhost:8088", allowed)
    assert not host_allowed("192.168.1.21:8088", allowed)
    v6 = allowed_hosts("fd00::1", 9000)
    assert host_allowed("[fd00::1]:9000", v6) and not host_allowed("fd00::1:9000", v6)


def test_port_80_also_takes_the_bare_name():
    assert host_allowed("localhost", allowed_hosts("127.0.0.1", 80))


def test_without_keys_anyone_on_an_allowed_host_reads():
    assert UiAuth().authorized({}, [])


def test_with_keys_nothing_is_read_without_one():
    auth = UiAuth()
    assert not auth.authorized({}, KEYS)
    assert not auth.authorized({"x-api-key": "nope"}, KEYS)
    assert not auth.authorized({"cookie": f"{COOKIE}=k-one"}, KEYS)  # the key itself is not a valid cookie
    assert not auth.authorized({"cookie": f"{COOKIE}="}, KEYS)


def test_a_key_header_opens_it_as_for_the_proxy():
    auth = UiAuth()
    assert auth.authorized({"x-api-key": "k-two"}, KEYS)
    assert auth.authorized({"authorization": "Bearer k-one"}, KEYS)


def test_the_login_cookie_is_an_hmac_not_the_key_and_dies_with_the_key_or_the_process():
    auth = UiAuth(secret=b"s" * 32)
    set_cookie = auth.login("k-one", KEYS)
    assert set_cookie is not None
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie and "Path=/ui" in set_cookie
    value = set_cookie.split(";")[0].split("=", 1)[1]
    assert "k-one" not in set_cookie
    headers = {"cookie": f"other=1; {COOKIE}={value}; more=2"}
    assert auth.authorized(headers, KEYS)
    assert not auth.authorized(headers, ["k-two"])  # k-one was removed from the config: the cookie is void
    assert not UiAuth(secret=b"t" * 32).authorized(headers, KEYS)  # a restarted daemon draws a new secret


def test_a_wrong_key_gets_no_cookie():
    auth = UiAuth()
    assert auth.login("k-three", KEYS) is None
    assert auth.login("", KEYS) is None
    assert auth.login("k-one", []) is None  # nothing to log in to


def test_cookie_parsing():
    assert cookie_value({"cookie": f"a=1; {COOKIE}=abc"}) == "abc"
    assert cookie_value({"cookie": f"x{COOKIE}=abc"}) is None
    assert cookie_value({}) is None


def test_the_login_form_must_come_from_our_own_page():
    allowed = allowed_hosts("127.0.0.1", 8088)
    assert origin_allowed({}, allowed)  # no Origin: an old browser or a script with the key anyway
    assert origin_allowed({"origin": "http://127.0.0.1:8088"}, allowed)
    assert not origin_allowed({"origin": "http://evil.example:8088"}, allowed)
    assert not origin_allowed({"origin": "null"}, allowed)
    assert not origin_allowed({"origin": "https://127.0.0.1:8088"}, allowed)


def test_security_headers_forbid_inline_code_framing_and_cors():
    names = {k for k, _v in SECURITY_HEADERS}
    assert b"content-security-policy" in names and b"x-frame-options" in names
    assert not any(k.startswith(b"access-control-") for k in names)
    assert "unsafe-inline" not in CSP and "unsafe-eval" not in CSP
    assert "default-src 'none'" in CSP and "frame-ancestors 'none'" in CSP and "script-src 'self'" in CSP
