"""Issue 41, N14: the Host forms only the protocol sees (ingress/protocol.py: uvicorn keeps only the target's
path). An absolute-form target (what a client sends to a proxy) names a host of its own: refused unless it is the
one Host header's. An HTTP/1.1 request without Host is refused; HTTP/1.0 may leave it out."""

from __future__ import annotations

import pytest

from coderouterd.ingress.protocol import _path_of, host_missing, target_problem

HOST = [(b"host", b"127.0.0.1:8088")]


@pytest.mark.parametrize("url", [b"/v1/messages", b"*", b"//evil.test/v1/messages", b"ftp://evil.test/x"])
def test_targets_that_are_not_absolute_http_are_left_alone(url):
    assert target_problem(url, HOST) is None


@pytest.mark.parametrize("url", [b"http://127.0.0.1:8088/v1/messages", b"HTTP://127.0.0.1:8088/v1/messages?x=1",
                                 b"https://127.0.0.1:8088", b"http://127.0.0.1:8088?q"])
def test_an_absolute_target_naming_the_host_headers_name_is_served(url):
    assert target_problem(url, HOST) is None


@pytest.mark.parametrize(("url", "hosts"), [
    (b"http://evil.test/v1/messages", HOST),
    (b"http://evil.test:8088/v1/messages", HOST),
    (b"http://127.0.0.1:9999/v1/messages", HOST),
    (b"http://user@127.0.0.1:8088/v1/messages", HOST),
    (b"http://127.0.0.1:8088/v1/messages", []),
    (b"http://127.0.0.1:8088/v1/messages", HOST + HOST),
])
def test_an_absolute_target_naming_another_host_is_refused(url, hosts):
    problem = target_problem(url, hosts)
    assert problem is not None and "send the path alone (origin-form)" in problem


def test_the_refusal_names_both_names():
    assert target_problem(b"http://Evil.test/v1/messages", HOST) == (
        "the request target names host 'evil.test' but the Host header says '127.0.0.1:8088': send the path "
        "alone (origin-form), with the Host header naming this server")


@pytest.mark.parametrize(("url", "path"), [(b"http://evil.test/v1/chat/completions?x", b"/v1/chat/completions?x"),
                                           (b"/v1/messages", b"/v1/messages"), (b"http://evil.test", b"")])
def test_the_error_shape_follows_the_targets_path(url, path):
    assert _path_of(url) == path


@pytest.mark.parametrize(("version", "url", "refused"), [
    ("1.1", b"/v1/messages", True), ("1.1", b"/", True), ("1.1", b"/ui", True),
    ("1.0", b"/v1/messages", False), ("1.1", b"/healthz", False), ("1.1", b"/healthz?x=1", False),
])
def test_no_host_is_refused_on_http11_but_healthz_and_http10(version, url, refused):
    problem = host_missing(version, url)
    assert (problem == "an HTTP/1.1 request must carry a Host header") if refused else problem is None
