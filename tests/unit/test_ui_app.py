"""The dashboard's gate and answers in-process (raw ASGI calls), with a daemon stand-in holding only what the
gate and the history views read. The real daemon over HTTP: tests/e2e/test_dashboard_http.py."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from types import SimpleNamespace

import orjson
import pytest
from pydantic import ValidationError

from coderouterd.after_response import AfterResponse
from coderouterd.keys.registry import KeyRegistry
from coderouterd.ui.app import DashboardApp
from coderouterd.ui.feed import LiveFeed


class _Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"read {name!r} before the request was let in")


def _daemon(tmp_path, *, keys=(), journal_bytes: bytes | None = None, telemetry=None):
    db = tmp_path / "state.db"
    if journal_bytes is not None:
        db.write_bytes(journal_bytes)
    server = SimpleNamespace(dashboard=True, api_keys=list(keys), allowed_hosts=[])
    return SimpleNamespace(
        runtime=SimpleNamespace(config=SimpleNamespace(server=server)), listen=("127.0.0.1", 8088),
        telemetry=telemetry or SimpleNamespace(enabled=True, journal_path=db),
        budget=SimpleNamespace(snapshot=dict), recent=OrderedDict(), live=LiveFeed(),
        after_response=AfterResponse(delay_s=60), keys=KeyRegistry())


def _call(app, path: str, *, host: str = "127.0.0.1:8088", method: str = "GET", query: bytes = b"",
          headers: list | None = None):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "query_string": query,
             "headers": [(b"host", host.encode()), *(headers or [])], "server": ("127.0.0.1", 8088)}
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], dict(start["headers"]), body


def test_a_foreign_host_is_refused_before_anything_is_read(tmp_path):
    d = _daemon(tmp_path, telemetry=_Untouchable())
    d.recent = _Untouchable()
    status, headers, body = _call(DashboardApp(d), "/ui/api/requests", host="attacker.example:8088")
    assert status == 403 and b"content-security-policy" in headers
    assert not any(k.startswith(b"access-control-") for k in headers)


def test_with_keys_no_data_without_one(tmp_path):
    d = _daemon(tmp_path, keys=["k"], telemetry=_Untouchable())
    status, _h, body = _call(DashboardApp(d), "/ui/api/spend")
    assert status == 401 and orjson.loads(body)["error"]
    status, _h, body = _call(DashboardApp(d), "/ui")
    assert status == 401 and b'name="key"' in body


def test_an_unreadable_journal_is_a_503_the_page_can_show(tmp_path):
    d = _daemon(tmp_path, journal_bytes=b"this is not a database" * 100)
    status, headers, body = _call(DashboardApp(d), "/ui/api/spend")
    assert status == 503 and headers[b"content-type"] == b"application/json"
    assert "cannot read the journal" in orjson.loads(body)["error"]


@pytest.mark.parametrize("path,query,status", [
    ("/ui/api/trends", b"range=2y", 400),
    ("/ui/api/requests", b"limit=lots", 400),
    ("/ui/api/requests", b"outcome=maybe", 400),
    ("/ui/api/nothing", b"", 404),
    ("/ui/nothing", b"", 404),
    ("/ui/static/../guard.py", b"", 404),
])
def test_bad_asks_get_their_answer_with_the_headers(tmp_path, path, query, status):
    got, headers, _body = _call(DashboardApp(_daemon(tmp_path)), path, query=query)
    assert got == status and b"content-security-policy" in headers


def test_read_only(tmp_path):
    app = DashboardApp(_daemon(tmp_path))
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        assert _call(app, "/ui/api/now", method=method)[0] == 405


def test_a_request_just_answered_is_in_the_list_even_before_its_record_was_written(tmp_path):
    """The record of a request is written after its answer (coderouterd/after_response.py); a page asking
    right after must not miss it: the dashboard's data endpoints write what is pending first, as the admin
    socket does."""
    d = _daemon(tmp_path, telemetry=SimpleNamespace(enabled=False, journal_path=None))
    app = DashboardApp(d)

    class AnsweredJustNow:  # on the daemon's loop: the answer is out, its record waits for the loop to be idle
        async def __call__(self, scope, receive, send):
            d.after_response.defer(d.recent.__setitem__, "req-just-now", {"request_id": "req-just-now"})
            assert d.after_response.pending == 1
            await app(scope, receive, send)

    status, _, body = _call(AnsweredJustNow(), "/ui/api/requests")
    assert status == 200, body
    answer = orjson.loads(body)
    assert answer["source"] == "memory" and [r["request_id"] for r in answer["requests"]] == ["req-just-now"]


def test_a_process_log_s_last_line_is_read_from_its_end_and_bounded(tmp_path):
    from coderouterd.admin.now import last_line

    log = tmp_path / "box.log"
    log.write_bytes(b"x" * 10_000 + b"\nloading model\n" + ("error: " + "y" * 1000).encode() + b"\n\n  \n")
    assert last_line(log) == ("error: " + "y" * 1000)[:300]
    log.write_bytes(b"")
    assert last_line(log) is None and last_line(tmp_path / "missing.log") is None


def test_a_record_that_does_not_fit_the_model_is_not_blamed_on_the_caller(tmp_path):
    """A record the answer's model refuses is the daemon's fault: never a 400 that carries the row's values
    back in pydantic's words."""
    d = _daemon(tmp_path, telemetry=SimpleNamespace(enabled=False, journal_path=None))
    d.recent["bad"] = {"request_id": "bad", "latency_ms": "secret-looking-value"}
    # Raised out of the app, the ASGI server answers a bare 500 (tests/e2e/test_dashboard_http.py's server).
    with pytest.raises(ValidationError):
        _call(DashboardApp(d), "/ui/api/requests")


@pytest.mark.parametrize("extra", [[(b"host", b"attacker.example:8088")], [(b"host", b"127.0.0.1:8088")],
                                   [(b"origin", b"http://127.0.0.1:8088"), (b"origin", b"http://evil.example")]])
def test_a_second_host_or_origin_is_a_400_before_anything_is_read(tmp_path, extra):
    """Issue 41, N14: which one would count depends on who reads it; the dashboard never guesses."""
    d = _daemon(tmp_path, telemetry=_Untouchable())
    d.recent = _Untouchable()
    status, _headers, body = _call(DashboardApp(d), "/ui/api/requests", headers=extra)
    assert status == 400 and b"more than one" in body and b"a request must carry exactly one" in body


def test_wrong_keys_at_the_login_form_or_the_api_are_slowed_and_audited_like_the_proxy_s(tmp_path):
    """Repeated authentication failures from one source slow it down and write one audit line, whichever door
    they knock at: the dashboard's login form and its API are no way around the proxy's throttle."""
    from coderouterd.ingress.auth import KeyGate
    from coderouterd.keys.throttle import FREE
    from coderouterd.state.events import AuthThrottled

    published: list = []
    d = _daemon(tmp_path, keys=["op-key"])
    d.key_gate = KeyGate(d.keys, published.append)
    app = DashboardApp(d)

    async def login(key: bytes) -> int:
        sent: list = []
        body = [{"type": "http.request", "body": b"key=" + key, "more_body": False}]

        async def receive():
            return body.pop(0) if body else {"type": "http.disconnect"}

        async def send(message):
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/ui/login", "query_string": b"",
                 "headers": [(b"host", b"127.0.0.1:8088"), (b"content-type", b"application/x-www-form-urlencoded")],
                 "server": ("127.0.0.1", 8088), "client": ("127.0.0.9", 5555)}
        await app(scope, receive, send)
        return sent[0]["status"]

    for _ in range(int(FREE) + 1):
        assert asyncio.run(login(b"a-guess")) == 401
    assert d.key_gate.throttle.delay("127.0.0.9") > 0
    assert [e for e in published if isinstance(e, AuthThrottled)], published
    status, _h, _b = _call(app, "/ui/api/spend", headers=[(b"x-api-key", b"another-guess")])
    assert status == 401 and d.key_gate.refused == int(FREE) + 2
    assert asyncio.run(login(b"op-key")) == 303  # the right key is let in at once, whatever its source's score
