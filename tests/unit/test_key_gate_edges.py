"""Team keys at the edges of the proxy's dispatch, in-process (raw ASGI calls, a daemon stand-in holding only what
the Host check and the key check read): a key checked on the Host-refusal path is read where the caller's API
sends it and refused in the caller's shape."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import orjson

from coderouterd.ingress.auth import KeyGate
from coderouterd.ingress.dispatch import ProxyApp
from coderouterd.keys.hashing import display_prefix, new_hash_key, new_secret
from coderouterd.keys.model import TeamKey
from coderouterd.keys.record import KeyRecord
from coderouterd.keys.registry import KeyRegistry

FOREIGN = b"192.0.2.10:8088"  # the name another machine reaches the daemon by (not in allowed_hosts)


def _daemon(published: list) -> tuple[SimpleNamespace, str]:
    reg = KeyRegistry()
    reg.set_hash_key(new_hash_key())
    secret = new_secret()
    assert reg.hasher is not None
    reg.replace([KeyRecord(key=TeamKey(name="alice", prefix=display_prefix(secret)), digest=reg.hasher.hex(secret))])
    server = SimpleNamespace(api_keys=["op-key"], allowed_hosts=[], cors_origins=[])
    runtime = SimpleNamespace(config=SimpleNamespace(server=server), providers={}, profile_names=["default"])
    d = SimpleNamespace(runtime=runtime, listen=("0.0.0.0", 8088),
                        key_gate=KeyGate(reg, published.append), telemetry=SimpleNamespace(publish=published.append),
                        browser_refused={}, keys=reg)
    return d, secret


def _call(app: ProxyApp, method: str, path: str, headers: list[tuple[bytes, bytes]], query: bytes = b""):
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query, "headers": headers,
             "server": ("192.0.2.10", 8088), "client": ("192.0.2.99", 5000)}
    asyncio.run(app.http(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return sent[0]["status"], orjson.loads(body)


def test_a_wrong_gemini_key_under_a_foreign_host_is_refused_in_google_s_shape():
    d, _secret = _daemon([])
    status, body = _call(ProxyApp(d), "POST", "/v1beta/models/qwen3:generateContent",
                         [(b"host", FOREIGN), (b"content-type", b"application/json"),
                          (b"x-goog-api-key", b"crk_not-a-key")])
    assert status == 401
    # Google's shape ({"error": {"code", "message", "status"}}), as every other refusal of a Gemini call
    assert body["error"]["status"] == "UNAUTHENTICATED" and body["error"]["code"] == 401, body


def test_a_gemini_key_in_the_query_opens_a_foreign_host_like_the_header_does():
    d, secret = _daemon([])
    # The Host check is passed by a valid key, whichever way Gemini's clients send it; the wrong one in the query
    # is refused as a wrong key (401), not as a foreign Host (403).
    status, body = _call(ProxyApp(d), "GET", "/v1beta/models", [(b"host", FOREIGN)], query=b"key=crk_not-a-key")
    assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED", body
    status, body = _call(ProxyApp(d), "GET", "/v1beta/models", [(b"host", FOREIGN)],
                         query=b"key=" + secret.encode())
    assert status == 200 and body["models"][0]["name"] == "models/profile:default", body


def test_a_gemini_query_key_that_is_not_latin_1_is_a_wrong_key_not_a_crash():
    d, _secret = _daemon([])
    for host in (b"127.0.0.1:8088", FOREIGN):  # the Gemini route's own check, and the Host-refusal path's
        status, body = _call(ProxyApp(d), "GET", "/v1beta/models", [(b"host", host)], query=b"key=%E2%82%AC")
        assert status == 401 and body["error"]["status"] == "UNAUTHENTICATED", body
