"""Memory pressure end to end: a backend answering an out-of-memory error is cooled down and the request
fails over; available memory, faked through the daemon's probe-file seam, drives the warning, the order of a
prefer_remote profile, and the refusal of a model load that would not fit."""

from __future__ import annotations

import httpx
import pytest

from coderouterd.state import read_audit
from tests.e2e.test_control_plane import corectl, status_json
from tests.fakes.runner import FakeServer
from tests.support.config import NO_BREAKER, daemon_config, ollama_at, openai_at, warn
from tests.support.daemon import admin_get, running
from tests.support.wait import wait_for


def config(local_url: str, remote_url: str, ollama_url: str, sock: str) -> str:
    return daemon_config(
        admin={"socket": sock}, breaker=NO_BREAKER,
        memory={"low_available_mb": 4000, "sample_interval_s": 0.1, "cooldown_s": 120},
        providers={"local": openai_at(local_url), "remote": openai_at(remote_url, local=False),
                   "ollama": ollama_at(ollama_url)},
        profiles={"default": warn("local", "remote"),
                  "squeezed": warn("local", "remote", memory_action="prefer_remote")})

BODY = {"model": "m", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def env(tmp_path):
    probe = tmp_path / "available"
    probe.write_text(str(16_000_000_000))
    with FakeServer("openai", name="local") as local, FakeServer("openai", name="remote") as remote, \
            FakeServer("ollama", name="ollama", models=["qwen3-coder:30b"]) as ollama:
        cfg = config(local.url, remote.url, ollama.url, str(tmp_path / "admin.sock"))
        with running(cfg, tmp_path, env={"CODEROUTER_MEMORY_PROBE_FILE": str(probe)}) as d:
            yield {"daemon": d, "local": local, "remote": remote, "ollama": ollama, "probe": probe,
                   "sock": str(tmp_path / "admin.sock")}


def ask(env, profile: str = "default") -> httpx.Response:
    r = httpx.post(env["daemon"].url + "/v1/messages", json=BODY, headers={"x-coderouter-profile": profile},
                   timeout=20)
    assert r.status_code == 200, r.text
    return r


def test_out_of_memory_error_cools_the_provider_down_and_fails_over(env):
    env["local"].set_behaviour("oom")
    r = ask(env)
    assert r.headers["x-coderouter-provider"] == "remote"
    assert "local:memory_pressure:500" in r.headers["x-coderouter-attempts"]
    env["local"].set_behaviour("ok")
    r = ask(env)  # inside the cooldown the provider is not even tried
    assert r.headers["x-coderouter-provider"] == "remote"
    assert "local:skipped:memory_cooldown" in r.headers["x-coderouter-attempts"]
    transitions = wait_for(lambda: [e for e in read_audit(env["daemon"].state_dir)
                                    if e["kind"] == "breaker_transition" and e["provider"] == "local"])
    assert "memory_pressure" in transitions[0]["reason"] and "120" in transitions[0]["reason"]
    local = {p["name"]: p for p in status_json(env["sock"])["providers"]}["local"]
    # Still out when read: its length (120 s) is the transition's reason above, not how much of it is left (that
    # depends on how long the reads took).
    assert local["breaker"]["state"] == "open" and local["breaker"]["retry_in_s"] > 0


def test_low_memory_warns_and_prefer_remote_goes_remote_first(env):
    assert ask(env, "squeezed").headers["x-coderouter-provider"] == "local"
    env["probe"].write_text(str(1_500_000_000))
    assert wait_for(lambda: (admin_get(env["sock"]) or {"memory": {}})["memory"].get("low"))
    assert status_json(env["sock"])["memory"]["low"]
    r = ask(env, "squeezed")
    assert r.headers["x-coderouter-provider"] == "remote"
    assert ask(env, "default").headers["x-coderouter-provider"] == "local"  # memory_action = "warn"
    events = wait_for(lambda: [e for e in read_audit(env["daemon"].state_dir) if e["kind"] == "memory_pressure"])
    assert events[0]["low"] and events[0]["available_bytes"] == 1_500_000_000
    shown = corectl("status", env_socket=env["sock"]).stdout
    assert "1.5 GB available" in shown and "LOW" in shown
    explained = corectl("explain", r.headers["x-request-id"], env_socket=env["sock"]).stdout
    assert "memory pressure" in explained and "prefer_remote" in explained
    env["probe"].write_text(str(9_000_000_000))
    assert wait_for(lambda: not (admin_get(env["sock"]) or {"memory": {"low": True}})["memory"]["low"])
    assert not status_json(env["sock"])["memory"]["low"]
    assert ask(env, "squeezed").headers["x-coderouter-provider"] == "local"
    kinds = wait_for(lambda: [e["low"] for e in read_audit(env["daemon"].state_dir)
                              if e["kind"] == "memory_pressure"] == [True, False])
    assert kinds


def test_models_load_refuses_a_model_that_does_not_fit_unless_forced(env):
    env["probe"].write_text(str(8_000_000_000))  # the fake's model is 18.6 GB
    r = corectl("models", "load", "qwen3-coder:30b", "--provider", "ollama", env_socket=env["sock"])
    assert r.returncode == 1
    assert "needs 18.6 GB but only 8.0 GB is available (10.6 GB missing)" in r.stderr + r.stdout
    assert not [q for q in env["ollama"].requests if q["path"] == "/api/generate"]
    r = corectl("models", "load", "qwen3-coder:30b", "--provider", "ollama", "--force", env_socket=env["sock"])
    assert r.returncode == 0, r.stderr
    assert [q for q in env["ollama"].requests if q["path"] == "/api/generate"]
