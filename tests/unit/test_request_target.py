"""Issue 41, N14: an absolute-form request target (what a client sends to a proxy) names a host of its own; the
protocol refuses it unless it is the one Host header's (ingress/protocol.py: uvicorn keeps only the path)."""

from __future__ import annotations

import pytest

from coderouterd.ingress.protocol import _path_of, target_problem

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
