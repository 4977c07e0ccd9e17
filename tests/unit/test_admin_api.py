"""The admin app in-process (FastAPI's TestClient), with a daemon double: error shapes, validation by the shared
models, and handlers that compute only what they return. The same app over the real socket is covered by
tests/e2e/test_control_plane.py."""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient

from coderouterd.admin import apitype, views
from coderouterd.admin.api import create_admin_app
from coderouterd.admin.version import API_VERSION, API_VERSION_HEADER
from coderouterd.runtime import UnknownProfile


class _Plan:
    def __init__(self, candidates):
        self.candidates = candidates

    def explain(self) -> dict:
        return {"candidates": list(self.candidates), "skips": [], "order": []}


class _Router:
    def __init__(self) -> None:
        self.planned: list[str] = []

    def effective_order(self, name, prof, runtime):
        self.planned.append(name)
        return _Plan(prof.providers)

    def providers_availability(self, runtime, active_profile):
        """Judging is not planning: every provider's verdict, read by the profiles' order words."""
        return {}


def _profile(providers):
    return SimpleNamespace(providers=providers, mode="fallback", adaptive=False, health_action="skip",
                           model_dump=lambda: {"providers": providers})


class DaemonDouble:
    """Just what the profile endpoints read; nothing a whole status() needs (no telemetry, breakers, memory)."""

    def __init__(self) -> None:
        profiles = {"default": _profile(["a"]), "alt": _profile(["b", "a"])}
        cfg = SimpleNamespace(profiles=profiles, server=SimpleNamespace(default_profile="default", dashboard=False), routes=[],
                              adaptive=SimpleNamespace(window_s=300.0))
        self.runtime = SimpleNamespace(config=cfg, profile_names=list(profiles), providers={},
                                       loaded=SimpleNamespace(is_embedded=True))
        self.router = _Router()
        self.active_profile = "default"
        self.config_path = "<embedded>"
        self.recent: OrderedDict[str, dict] = OrderedDict()
        self.processes = None

    def use_profile(self, name: str, source: str = "corectl"):
        if name not in self.runtime.config.profiles:
            raise UnknownProfile(name, self.runtime.profile_names)
        old, self.active_profile = self.active_profile, name
        return old, name


@pytest.fixture
def daemon():
    return DaemonDouble()


@pytest.fixture
def client(daemon):
    with TestClient(create_admin_app(daemon, Path("/tmp/test.sock"))) as c:
        yield c


@pytest.fixture
def no_whole_status(monkeypatch):
    def whole_status(_daemon):
        raise AssertionError("the whole status was built to answer a narrower endpoint")

    monkeypatch.setattr(views, "status", whole_status)


def test_profiles_plans_the_profiles_without_building_the_whole_status(client, daemon, no_whole_status,
                                                                        monkeypatch):
    monkeypatch.setattr(views, "providers", lambda _d: pytest.fail("/v1/profiles read the providers section"))
    r = client.get("/v1/profiles")
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["active"] == "default" and data["default"] == "default"
    assert [p["name"] for p in data["profiles"]] == ["default", "alt"]
    assert data["profiles"][1]["effective_order"] == ["b", "a"]
    assert daemon.router.planned == ["default", "alt"]
    assert r.headers[API_VERSION_HEADER] == str(API_VERSION)


def test_providers_does_not_plan_any_profile(client, daemon, no_whole_status, monkeypatch):
    monkeypatch.setattr(views, "profiles", lambda _d: pytest.fail("/v1/providers planned the profiles"))
    monkeypatch.setattr(views, "_providers", lambda _d, *_a: [{"name": "a", "kind": "openai", "base_url": "http://x",
                                                               "model": None, "paid": False, "health": "HEALTHY"}])
    monkeypatch.setattr(views, "health", lambda _d: {"a": apitype.HealthDetail(state="HEALTHY")})
    monkeypatch.setattr(views, "budget", lambda _d: apitype.BudgetStatus.model_validate({"month": "2026-12",
                                                                                          "global": {}}))
    r = client.get("/v1/providers")
    assert r.status_code == 200, r.text
    row = r.json()["providers"][0]
    assert row["name"] == "a" and row["health_detail"] == {"state": "HEALTHY"} and row["process"] is None
    assert r.json()["stats_window_s"] == 300.0
    assert daemon.router.planned == []


@pytest.mark.parametrize("body,field", [
    (b'{"name": 7}', "name"),
    (b'{"name": ""}', "name"),
    (b'{}', "name"),
    (b'{"nom": "alt"}', "name"),
])
def test_invalid_body_is_400_naming_the_field(client, body, field):
    r = client.post("/v1/profile/use", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert set(r.json()) == {"error"}
    assert r.json()["error"].startswith(f"{field}: "), r.text
    assert r.headers[API_VERSION_HEADER] == str(API_VERSION)


@pytest.mark.parametrize("body,expected", [
    (b"{not json", "request body is not valid JSON"),
    (b"[1, 2]", "request body must be a JSON object"),
    (b"", "request body must be a JSON object"),
])
def test_malformed_body_is_400_in_the_admin_shape(client, body, expected):
    r = client.post("/v1/profile/use", content=body)  # no content-type: read as JSON all the same
    assert r.status_code == 400 and r.json()["error"].startswith(expected), r.text


@pytest.mark.parametrize("body,field", [
    ({"provider": "p"}, "model"),
    ({"provider": 3, "model": "m"}, "provider"),
    ({"provider": "p", "model": "m", "force": "yes"}, "force"),
])
def test_model_control_body_names_the_field(client, body, field):
    r = client.post("/v1/models/load", json=body)
    assert r.status_code == 400 and r.json()["error"].startswith(f"{field}: "), r.text


@pytest.mark.parametrize("wait", [-1, True, "5"])
def test_process_wait_must_be_a_number_of_seconds(client, wait):
    r = client.post("/v1/processes/x/start", json={"wait_s": wait})
    assert r.status_code == 400 and r.json()["error"].startswith("wait_s: "), r.text


def test_query_parameter_errors_name_it(client):
    r = client.get("/v1/requests?limit=many")
    assert r.status_code == 400 and r.json()["error"].startswith("limit: ") and "'many'" in r.json()["error"]
    r = client.get("/v1/requests?limit=-1")
    assert r.status_code == 400 and r.json()["error"].startswith("limit: ")
    assert client.get("/v1/requests?limit=0").json() == {"requests": [], "kept": 0}


def test_unknown_names_are_404_with_the_valid_ones(client):
    r = client.post("/v1/profile/use", json={"name": "ghost"})
    assert r.status_code == 404 and r.json()["valid_profiles"] == ["default", "alt"]
    r = client.get("/v1/profiles/ghost")
    assert r.status_code == 404 and "ghost" in r.json()["error"]
    r = client.post("/v1/processes/x/explode")
    assert r.status_code == 404 and "unknown process action" in r.json()["error"]
    r = client.post("/v1/processes/x/start")  # no body: wait_s defaults to 0
    assert r.status_code == 404 and r.json()["valid"] == []


def test_404_and_405_shapes(client):
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.json() == {"error": "no such admin endpoint: GET /v1/nothing-here"}
    assert r.headers["content-type"] == "application/json"
    assert r.headers[API_VERSION_HEADER] == str(API_VERSION)
    r = client.delete("/v1/status")
    assert r.status_code == 405
    assert r.json() == {"error": "method DELETE not allowed on /v1/status"}
    assert r.headers[API_VERSION_HEADER] == str(API_VERSION)
    assert "GET" in r.headers.get("allow", "")


def test_a_bug_in_a_handler_is_a_500_in_the_admin_shape(client, monkeypatch):
    monkeypatch.setattr(views, "profiles", lambda _d: 1 / 0)
    r = client.get("/v1/profiles")
    assert r.status_code == 500
    assert r.json() == {"error": "internal error in coderouterd: ZeroDivisionError: division by zero"}
    assert client.get("/v1/requests").status_code == 200  # the app keeps serving


def test_answers_keep_fields_beyond_the_model_and_add_none(client, daemon):
    daemon.recent["r1"] = {"request_id": "r1", "status": 200, "panic": False, "notes": ["x"]}
    r = client.get("/v1/requests/r1")
    assert r.json() == {"request_id": "r1", "status": 200, "panic": False, "notes": ["x"]}
    assert client.get("/v1/requests/r2").status_code == 404


def test_a_trace_links_to_the_dashboard_when_it_is_on(client, daemon):
    daemon.recent["r 1"] = {"request_id": "r 1", "status": 200}
    daemon.runtime.config.server.dashboard = True
    daemon.listen = ("127.0.0.1", 8088)
    assert client.get("/v1/requests/r%201").json()["dashboard_url"] == "http://127.0.0.1:8088/ui#/requests/r%201"


def test_use_profile_switches(client, daemon):
    r = client.post("/v1/profile/use", json={"name": "alt", "unknown": 1})
    assert r.json() == {"ok": True, "previous": "default", "active": "alt"}
    assert daemon.active_profile == "alt"


def test_openapi_lists_the_endpoints_and_the_shared_models(client):
    doc = client.get("/openapi.json").json()
    assert {"/v1/status", "/v1/profiles", "/v1/profile/use", "/v1/providers", "/v1/models/load",
            "/v1/requests/{request_id}"} <= set(doc["paths"])
    assert {"UseProfileRequest", "Status", "ErrorAnswer"} <= set(doc["components"]["schemas"])
    assert client.get("/docs").status_code == 404


def test_the_daemon_does_not_import_fastapi_before_the_proxy_listens():
    """serve.py and the composition root load without FastAPI: the admin app is built on the first admin request
    (admin/server.py, LazyAdminApp), so neither readiness nor the first proxied requests pay for it."""
    import subprocess
    import sys

    code = ("import sys, coderouterd.serve, coderouterd.daemon, coderouterd.admin.server; "
            "print([m for m in ('fastapi', 'starlette', 'coderouterd.admin.api') if m in sys.modules])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


def test_history_without_a_journal_is_empty_and_requests_come_from_memory(client, daemon):
    """[state] off (no journal): the trends say so instead of failing, and the last requests are the traces
    the daemon keeps in memory, filtered as the journal's would be."""
    daemon.telemetry = SimpleNamespace(enabled=False, journal_path=None)
    daemon.budget = SimpleNamespace(snapshot=dict)
    daemon.recent["r1"] = {"request_id": "r1", "ts": 1.0, "profile": "default", "served_by": "a", "status": 200}
    daemon.recent["r2"] = {"request_id": "r2", "ts": 2.0, "profile": "alt", "served_by": "b", "status": 502,
                           "error_class": "upstream_error"}
    spend = client.get("/v1/history/spend")
    assert spend.status_code == 200, spend.text
    assert spend.json()["journal"] is False and spend.json()["providers"] == {}
    trends = client.get("/v1/history/trends", params={"range": "1h"})
    assert trends.status_code == 200 and trends.json()["journal"] is False
    assert len(trends.json()["t"]) in (60, 61)  # minute buckets over the hour, aligned to whole minutes
    assert client.get("/v1/history/trends", params={"range": "2y"}).status_code == 400
    reqs = client.get("/v1/history/requests").json()
    assert reqs["source"] == "memory" and [r["request_id"] for r in reqs["requests"]] == ["r2", "r1"]
    errors = client.get("/v1/history/requests", params={"outcome": "error"}).json()["requests"]
    assert [r["request_id"] for r in errors] == ["r2"]
    assert client.get("/v1/history/requests", params={"outcome": "weird"}).status_code == 400
    assert [r["request_id"] for r in client.get("/v1/history/requests", params={"provider": "a"})
            .json()["requests"]] == ["r1"]
