"""Drift detection end to end: a local backend that starts answering empty is demoted behind the next
provider (audit, status, explain); one that starts looping has its model unloaded and reloaded through
Ollama's API."""

from __future__ import annotations

import httpx
import pytest

from coderouterd.state import read_audit
from tests.e2e.test_control_plane import corectl, status_json
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, daemon_config, ollama_at, openai_at, warn
from tests.support.daemon import running
from tests.support.wait import wait_for


def config(local_url: str, backup_url: str, ollama_url: str, sock: str) -> str:
    return daemon_config(
        server={"stream_hold_s": 0.3}, admin={"socket": sock}, breaker=NO_BREAKER,
        drift={"window": 10, "recent": 3, "min_fill": 5, "cooldown_s": 300},
        providers={"local": openai_at(local_url), "backup": openai_at(backup_url),
                   "ollama": ollama_at(ollama_url, model="qwen3")},
        profiles={"default": warn("local", "backup", drift_action="demote"),
                  "loop": warn("ollama", drift_action="reload")})

BODY = {"model": "qwen3", "max_tokens": 200, "messages": [{"role": "user", "content": "explain the change"}]}


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("e2e_drift")
    with FakeServer("openai", name="local", behaviour="long") as local, \
            FakeServer("openai", name="backup", behaviour="long") as backup, \
            FakeServer("ollama", name="ollama", behaviour="loop", models=["qwen3"]) as ollama:
        with running(config(local.url, backup.url, ollama.url, str(tmp / "admin.sock")), tmp) as d:
            yield {"daemon": d, "local": local, "ollama": ollama, "sock": str(tmp / "admin.sock")}


def ask(env, profile: str, stream: bool = False) -> httpx.Response:
    r = httpx.post(env["daemon"].url + "/v1/messages", json={**BODY, "stream": stream}, timeout=20,
                   headers={"x-coderouter-profile": profile})
    assert r.status_code == 200, r.text
    return r


def audit(env, kind: str, provider: str) -> list[dict]:
    return wait_for(lambda: [e for e in read_audit(env["daemon"].state_dir)
                             if e["kind"] == kind and e["provider"] == provider], step=0.1)


def test_empty_answers_demote_the_provider(env):
    served = [ask(env, "default").headers["x-coderouter-provider"] for _ in range(3)]
    assert served == ["local"] * 3
    env["local"].set_behaviour("empty")
    for _ in range(6):
        r = ask(env, "default", stream=True)
        if r.headers["x-coderouter-provider"] == "backup":
            break
    assert r.headers["x-coderouter-provider"] == "backup", "the drifting provider was not demoted"
    detected = audit(env, "drift_detected", "local")
    assert "empty" in detected[0]["signals"]
    assert detected[0]["action"] == "demote"
    assert [a["action"] for a in audit(env, "drift_action", "local")] == ["demote"]
    drift = {p["name"]: p["drift"] for p in status_json(env["sock"])["providers"]}["local"]
    assert drift["score"] == 1.0 and "empty" in drift["signals"] and drift["demoted_for_s"] > 0
    explained = corectl("explain", r.headers["x-request-id"], env_socket=env["sock"])
    assert explained.returncode == 0 and "drift (empty" in explained.stdout
    assert "Drift" in corectl("status", env_socket=env["sock"]).stdout


def test_a_looping_model_is_reloaded(env):
    for _ in range(5):
        ask(env, "loop", stream=True)
    actions = audit(env, "drift_action", "ollama")
    assert actions and actions[0]["action"] == "reload" and actions[0]["ok"]
    detected = audit(env, "drift_detected", "ollama")
    assert {"repetition", "length_stops"} <= set(detected[0]["signals"])
    gens = [r["json"] for r in env["ollama"].requests if r["path"] == "/api/generate"]
    assert gens[0]["keep_alive"] == 0 and gens[1].get("keep_alive") is None
    assert all(g["model"] == "qwen3" for g in gens)
