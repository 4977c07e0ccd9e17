"""Auth that cannot be switched off by accident, config that cannot poison the daemon, persistence faults that
never stop serving, and bounded client strings: each against the real daemon process."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.test_control_plane import corectl, status_json, wait_for, write_atomic
from tests.fakes.runner import FakeServer
from tests.support.daemon import ROOT, DaemonProcess, admin_get, running


def _config(url: str, *, server: str = "", extra: str = "") -> str:
    return f"""
[server]
port = {{PORT}}
{server}

[providers.local]
kind = "openai"
base_url = "{url}/v1"
{extra}

[profiles.default]
providers = ["local"]
"""


@pytest.fixture
def fake():
    with FakeServer("openai", name="local") as f:
        yield f


@pytest.fixture
def daemons():
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        d.stop()


def _check(tmp_path: Path, text: str | bytes) -> subprocess.CompletedProcess:
    p = tmp_path / "check.toml"
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    return subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(p), "--check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


# -- auth ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("keys", ['[""]', '[" "]', '["good", "\\t"]'])
def test_empty_or_whitespace_keys_are_a_config_error(tmp_path, keys):
    text = _config("http://127.0.0.1:9", server=f'host = "0.0.0.0"\napi_keys = {keys}').replace("{PORT}", "8088")
    r = _check(tmp_path, text)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "server.api_keys" in r.stderr and "empty or whitespace" in r.stderr


def test_reload_never_weakens_the_listener(fake, daemons, tmp_path):
    keyed = _config(fake.url, server='host = "0.0.0.0"\napi_keys = ["k1"]')
    d = DaemonProcess(keyed, tmp_path)
    daemons.append(d)
    d.start()
    sock = str(d.state_dir / "coderouterd.sock")
    url = d.url + "/v1/chat/completions"
    assert httpx.post(url, json=CHAT).status_code == 401
    assert httpx.post(url, json=CHAT, headers={"authorization": "Bearer k1"}).status_code == 200

    # Moving to loopback and dropping the keys together: the listener would stay on 0.0.0.0, so refused.
    write_atomic(d.config_path, _config(fake.url, server='host = "127.0.0.1"').replace("{PORT}", str(d.port)))
    r = corectl("reload", "--json", env_socket=sock)
    assert r.returncode != 0
    err = orjson.loads(r.stdout)["error"]
    assert "restart needed" in err and "server.host" in err
    assert httpx.post(url, json=CHAT).status_code == 401
    status = status_json(sock)
    assert "restart needed" in status["last_reload_error"]
    assert "restart needed" in corectl("status", env_socket=sock).stdout
    assert "restart needed" in d.log()

    # Removing every key while bound beyond loopback: refused, auth stays on.
    write_atomic(d.config_path, _config(fake.url, server='host = "0.0.0.0"').replace("{PORT}", str(d.port)))
    err = orjson.loads(corectl("reload", "--json", env_socket=sock).stdout)["error"]
    assert "api_keys" in err
    assert httpx.post(url, json=CHAT).status_code == 401

    # A harmless edit still applies, and clears the error.
    write_atomic(d.config_path, keyed.replace("{PORT}", str(d.port)).replace('["k1"]', '["k1", "k2"]'))
    assert orjson.loads(corectl("reload", "--json", env_socket=sock).stdout)["ok"] is True
    assert httpx.post(url, json=CHAT, headers={"x-api-key": "k2"}).status_code == 200
    assert status_json(sock)["last_reload_error"] is None


# -- config -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("extra,where", [
    ("[providers.local.timeouts]\nconnect = inf", "providers.local.timeouts.connect"),
    ("[providers.local.timeouts]\nfirst_byte = nan", "providers.local.timeouts.first_byte"),
    ("[providers.local.timeouts]\ntotal = 1e308", "providers.local.timeouts.total"),
])
def test_non_finite_and_huge_numbers_are_refused(tmp_path, extra, where):
    r = _check(tmp_path, _config("http://127.0.0.1:9", extra=extra).replace("{PORT}", "8088"))
    assert r.returncode == 2 and where in r.stderr, r.stderr


@pytest.mark.parametrize("section", ["[state]\nflush_interval_s = inf", "[state]\nflush_interval_s = 0.001",
                                     "[server]\nmax_connections = 0"])
def test_out_of_range_state_and_server_numbers(tmp_path, section):
    text = _config("http://127.0.0.1:9").replace("{PORT}", "8088").replace("[server]\nport = 8088", "")
    r = _check(tmp_path, text + "\n" + section + "\n")
    assert r.returncode == 2, r.stdout + r.stderr


def test_non_utf8_config_at_start_names_the_byte(tmp_path):
    text = _config("http://127.0.0.1:9").replace("{PORT}", "8088").encode()
    bad = text.replace(b"[profiles.default]", b"# caf\xe9\n[profiles.default]")
    r = _check(tmp_path, bad)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    offset = bad.index(bytes([0xE9]))
    assert f"not UTF-8 text: invalid byte 0xe9 at byte offset {offset}" in r.stderr


def test_non_utf8_edit_is_rejected_and_the_watcher_survives(fake, daemons, tmp_path):
    text = _config(fake.url)
    d = DaemonProcess(text, tmp_path)
    daemons.append(d)
    d.start()
    sock = str(d.state_dir / "coderouterd.sock")
    good = text.replace("{PORT}", str(d.port)).encode()
    tmp = d.config_path.with_name("config.toml.swp")
    tmp.write_bytes(good.replace(b"[profiles.default]", b"# \xff\xfe\n[profiles.default]"))
    os.replace(tmp, d.config_path)
    wait_for(lambda: (admin_get(sock) or {}).get("last_reload_error"), 8.0, "the reload error")
    err = status_json(sock)["last_reload_error"]
    assert "not UTF-8" in err and "byte offset" in err
    r = corectl("reload", "--json", env_socket=sock)
    assert "internal error" not in r.stdout and "not UTF-8" in orjson.loads(r.stdout)["error"]
    # The watcher is still alive: a later valid edit is applied on its own.
    write_atomic(d.config_path, good.decode() + '\n[profiles.extra]\nproviders = ["local"]\n')
    wait_for(lambda: "extra" in [p["name"] for p in (admin_get(sock) or {"profiles": []})["profiles"]], 8.0,
             "the valid edit")
    assert "extra" in [p["name"] for p in status_json(sock)["profiles"]]
    assert status_json(sock)["last_reload_error"] is None


# -- persistence faults -------------------------------------------------------------------------------------

def test_unusable_state_dir_serves_with_memory_state(fake, daemons, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    d = DaemonProcess(_config(fake.url), tmp_path,
                      env={"CODEROUTER_STATE_DIR": str(blocker / "state"), "XDG_RUNTIME_DIR": str(runtime)})
    daemons.append(d)
    d.start()
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT).status_code == 200
    log = d.log()
    assert "is unusable" in log and "state in memory only" in log
    sock = str(runtime / f"coderouter-{os.getuid()}" / "coderouterd.sock")
    status = status_json(sock)
    assert status["store"]["healthy"] is False and "unusable" in status["store"]["problem"]
    assert "persistence is failing" in corectl("status", env_socket=sock).stdout


def test_state_dir_writable_by_others_is_refused_and_state_kept_in_memory(fake, daemons, tmp_path):
    # Issue 23 item 9: another user could plant symlinks there; persistence is refused, service is not.
    state = tmp_path / "shared-state"
    state.mkdir()
    os.chmod(state, 0o777)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    d = DaemonProcess(_config(fake.url), tmp_path,
                      env={"CODEROUTER_STATE_DIR": str(state), "XDG_RUNTIME_DIR": str(runtime)})
    daemons.append(d)
    d.start()
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT).status_code == 200
    log = d.log()
    assert f"state directory {state} is unusable: writable by other users" in log and "chmod 700" in log
    assert "state in memory only" in log
    assert list(state.iterdir()) == []  # no lock, database, audit log, record or socket written there
    assert os.stat(state).st_mode & 0o777 == 0o777


@pytest.mark.skipif(os.getuid() == 0, reason="root ignores directory permissions")
def test_read_only_state_dir_serves(fake, daemons, tmp_path):
    state = tmp_path / "ro-state"
    state.mkdir()
    os.chmod(state, 0o500)
    try:
        d = DaemonProcess(_config(fake.url), tmp_path, env={"CODEROUTER_STATE_DIR": str(state),
                                                             "XDG_RUNTIME_DIR": str(tmp_path)})
        daemons.append(d)
        d.start()
        assert httpx.post(d.url + "/v1/chat/completions", json=CHAT).status_code == 200
        assert "state in memory only" in d.log()
    finally:
        os.chmod(state, 0o700)


# -- bounded client strings --------------------------------------------------------------------------------

def test_client_strings_are_bounded(fake, daemons, tmp_path):
    d = DaemonProcess(_config(fake.url, server="[state]\nflush_interval_s = 0.05"), tmp_path)
    daemons.append(d)
    d.start()
    url = d.url + "/v1/chat/completions"
    r = httpx.post(url, json=CHAT, headers={"x-request-id": "r" * 5000})
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req_")
    r = httpx.post(url, json=CHAT, headers={"x-request-id": "bad id\twith controls"})
    assert r.headers["x-request-id"].startswith("req_")
    r = httpx.post(url, json=CHAT, headers={"x-request-id": "client-123"})
    assert r.headers["x-request-id"] == "client-123"
    # A model name past the ingress cap (issue 34) is refused, naming the limit, and never stored or logged.
    huge = "m" * 300_000
    r = httpx.post(url, json={**CHAT, "model": huge}, headers={"x-request-id": "huge-model"})
    assert r.status_code == 400 and "256" in r.text and len(r.text) < 2000
    r = httpx.post(url, json=CHAT, headers={"x-coderouter-profile": "p" * 50_000})
    assert r.status_code == 400 and len(r.text) < 2000
    # A name at the cap is served, and what the journal keeps of it stays bounded.
    r = httpx.post(url, json={**CHAT, "model": "m" * 256}, headers={"x-request-id": "long-model"})
    assert r.status_code == 200

    def stored():
        try:
            with sqlite3.connect(d.state_dir / "state.db") as db:
                return db.execute("SELECT model_requested FROM journal WHERE request_id = 'long-model'").fetchone()
        except sqlite3.Error:
            return None

    row = wait_for(stored, 8.0, "the journal row")
    assert len(row[0]) <= 300
    assert huge not in d.log()


def test_a_taken_port_is_named_with_how_to_choose_another(tmp_path):
    import socket

    from tests.support.daemon import DaemonProcess

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        d = DaemonProcess("[server]\nport = {PORT}\n[providers.a]\nbase_url = \"http://127.0.0.1:9/v1\"\n"
                          "[profiles.default]\nproviders = [\"a\"]\n", tmp_path, port=port)
        with pytest.raises(RuntimeError) as e:
            d.start()
    log = str(e.value)
    assert f"port {port} on 127.0.0.1 is taken" in log and "--port" in log and "CODEROUTER_SERVER__PORT" in log


def test_coderouterds_own_client_key_is_never_forwarded_upstream(tmp_path):
    import httpx

    from tests.fakes.runner import FakeServer

    with FakeServer("openai", name="up") as up:
        cfg = ("[server]\nport = {PORT}\napi_keys = [\"sekrit-of-the-router\"]\n[providers.a]\n"
               f"base_url = \"{up.url}/v1\"\nforward_client_key = true\n[profiles.default]\nproviders = [\"a\"]\n")
        with running(cfg, tmp_path) as d:
            for headers in ({"authorization": "Bearer sekrit-of-the-router"}, {"x-api-key": "sekrit-of-the-router"}):
                r = httpx.post(d.url + "/v1/chat/completions", headers=headers, timeout=10,
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200, r.text
        sent = [req["headers"] for req in up.requests if req["method"] == "POST"]
        assert len(sent) == 2 and all("sekrit-of-the-router" not in str(h) for h in sent), sent
