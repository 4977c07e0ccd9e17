"""The control plane's one map (admin/handlers.py, issue 43 §3): the admin socket's app and the dashboard's /ui/api
serve exactly the handler table, each entry by its own function, and the browser flag is enforced: an entry not
marked for the browser is refused on /ui/api."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
from pathlib import Path
from types import SimpleNamespace

import orjson
import pytest
from fastapi.testclient import TestClient

from coderouterd.admin import handlers
from coderouterd.admin.api import create_admin_app
from coderouterd.admin.context import Status
from coderouterd.admin.handlers import HANDLERS
from coderouterd.after_response import AfterResponse
from coderouterd.keys.registry import KeyRegistry
from coderouterd.ui.app import DashboardApp
from coderouterd.ui.feed import LiveFeed

MARK = 218  # an unusual status: only the fakes below answer it


def _daemon() -> SimpleNamespace:
    server = SimpleNamespace(dashboard=True, api_keys=[], allowed_hosts=[])
    return SimpleNamespace(runtime=SimpleNamespace(config=SimpleNamespace(server=server)), listen=("127.0.0.1", 8088),
                           after_response=AfterResponse(delay_s=60), keys=KeyRegistry(), live=LiveFeed())


def _answers_its_path(h: handlers.Handler):
    """A stand-in for the handler: same parameters (FastAPI and the dashboard read them from its signature), and
    an answer that names the entry and echoes what it was handed."""

    @functools.wraps(h.fn)
    async def fake(c, **params):
        return Status({"entry": f"{h.method} {h.path}", "params": {k: v for k, v in params.items()
                                                                    if isinstance(v, str | int | float)}}, MARK)

    return fake


@pytest.fixture
def faked(monkeypatch):
    for key, h in list(HANDLERS.items()):
        monkeypatch.setitem(HANDLERS, key, dataclasses.replace(h, fn=_answers_its_path(h)))


def _concrete(template: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: f"{m.group(1)}-1", template)


def _ui(app: DashboardApp, path: str, query: bytes = b"") -> tuple[int, dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": path, "query_string": query,
             "headers": [(b"host", b"127.0.0.1:8088")], "server": ("127.0.0.1", 8088)}
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], orjson.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_the_admin_socket_serves_exactly_the_table_each_entry_by_its_handler(faked):
    app = create_admin_app(_daemon(), Path("/tmp/handlers-test.sock"))
    with TestClient(app) as client:
        # What the socket serves, as it documents it (FastAPI's routes are built lazily, /openapi.json is not).
        paths = client.get("/openapi.json").json()["paths"]
        assert {(m.upper(), p) for p, ops in paths.items() for m in ops} == set(HANDLERS)
        for method, path in HANDLERS:
            if method != "GET":
                continue  # their bodies are validated before the handler (tests/unit/test_admin_api.py)
            r = client.get(_concrete(path))
            assert r.status_code == MARK, (path, r.text)
            assert r.json()["entry"] == f"GET {path}"


def test_the_dashboard_serves_exactly_the_entries_marked_for_the_browser(faked):
    app = DashboardApp(_daemon())
    marked = [h for h in HANDLERS.values() if h.browser is not None]
    assert {h.browser for h in marked} >= {"now", "profiles", "spend", "trends", "keys", "requests",
                                            "requests/{request_id}", "inflight"}
    for h in marked:
        status, body = _ui(app, "/ui/api/" + _concrete(h.browser), b"limit=7")
        assert status == MARK and body["entry"] == f"GET {h.path}", (h.browser, body)
        if any(p.name == "limit" for p in h.parameters()):
            assert body["params"]["limit"] == 7  # the query, parsed by the handler's own signature


def test_an_entry_not_marked_for_the_browser_is_refused_there(faked):
    app = DashboardApp(_daemon())
    refused = 0
    for (method, path), h in HANDLERS.items():
        if method != "GET" or h.browser is not None:
            continue
        name = _concrete(path)[len("/v1/"):]
        if handlers.find_browser(name) is not None:
            continue  # its name is also a browser entry's (requests/{id}: the trace from memory or the journal)
        status, body = _ui(app, "/ui/api/" + name)
        assert status == 403 and "admin socket only" in body["error"], (path, body)
        refused += 1
    assert refused >= 6  # status, profiles/{name}, config/check, providers, processes, models, requests, keys ...
    assert _ui(app, "/ui/api/no-such-thing")[0] == 404


def test_the_browser_reads_only():
    assert all(h.method == "GET" for h in HANDLERS.values() if h.browser is not None)


def test_a_bad_query_is_refused_on_both_surfaces_by_the_same_constraint():
    h = HANDLERS[("GET", "/v1/history/requests")]
    status, body = _ui(DashboardApp(_daemon()), "/ui/api/" + h.browser, b"limit=0")
    assert status == 400 and body["error"].startswith("limit: ")
    with TestClient(create_admin_app(_daemon(), Path("/tmp/handlers-test.sock"))) as client:
        r = client.get(h.path, params={"limit": 0})
        assert r.status_code == 400 and r.json()["error"].startswith("limit: ")
