"""The edge's last line: an exception no handler expected is answered in the caller's shape and logged once,
without request values."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from coderouterd.config import parse_config_text
from coderouterd.ingress.dispatch import ProxyApp

CONFIG = """
[providers.local]
base_url = "http://127.0.0.1:9/v1"
[profiles.default]
providers = ["local"]
"""


class _BrokenRuntime:
    """A runtime whose profile selection fails with a message carrying the client's value, as float("hot")
    would."""

    def __init__(self) -> None:
        self.config = parse_config_text(CONFIG, "test")

    def select_profile(self, header, model, active):
        raise ValueError(f"could not convert string to float: {model!r}")


class _Daemon:
    listen = ("127.0.0.1", 8088)
    runtime = _BrokenRuntime()
    active_profile = "default"


def _call(path: str, body: bytes) -> list[dict]:
    sent: list[dict] = []
    scope = {"type": "http", "method": "POST", "path": path, "server": ("127.0.0.1", 8088),
             "headers": [(b"host", b"127.0.0.1:8088"), (b"content-type", b"application/json")]}

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(ProxyApp(_Daemon())(scope, receive, send))
    return sent


@pytest.mark.parametrize("path,shape", [("/v1/messages", "anthropic"), ("/v1/chat/completions", "openai"),
                                        ("/v1/messages/count_tokens", "anthropic")])
def test_unexpected_exception_is_a_500_in_the_callers_shape(path, shape, caplog):
    body = orjson.dumps({"model": "SECRET-VALUE-hot", "max_tokens": 5, "messages": [{"role": "user",
                                                                                       "content": "hi"}]})
    with caplog.at_level(logging.ERROR):
        sent = _call(path, body)
    assert sent[0]["status"] == 500
    data = orjson.loads(sent[1]["body"])
    if shape == "anthropic":
        assert data["type"] == "error" and data["error"]["type"] == "api_error"
    else:
        assert data["error"]["type"] == "api_error" or data["error"]["type"] == "server_error"
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    text = errors[0].getMessage() + (errors[0].exc_text or "")
    assert "internal " in text and "coderouterd/ingress/dispatch.py" in text and "(values omitted)" in text
    assert "SECRET-VALUE" not in text and errors[0].exc_info is None
