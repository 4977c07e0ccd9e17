"""The control plane end to end: the real daemon process, the real `corectl` processes, the admin socket.

Covers status (both renderings), profile switching and its persistence across restarts, hot reload by editing
the file (rename and in-place; valid and invalid; during a stream), SIGHUP, socket permissions, stale socket
recovery, second-daemon refusal, malformed admin requests, no admin surface on TCP, graceful stop."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.daemon import ROOT, DaemonProcess, admin_get, free_port
from tests.support.wait import MIN_CEILING_S
from tests.support.wait import wait_for as wait_until


def config_text(a_url: str, b_url: str, *, default_chain: str = '"a"', extra: str = "") -> str:
    return f"""
[server]
default_profile = "default"
drain_timeout_s = 10

[providers.a]
kind = "openai"
base_url = "{a_url}/v1"
model = "fake-model"

[providers.b]
kind = "openai"
base_url = "{b_url}/v1"
model = "fake-model"

[profiles.default]
providers = [{default_chain}]

[profiles.alt]
providers = ["b", "a"]
mode = "fallback"
{extra}
"""


INVALID_TAIL = '\n[profiles.broken]\nproviders = ["ghost"]\n'


def corectl(*args: str, socket: str | None = None, env_socket: str | None = None,
            timeout: float = 30) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    if env_socket:
        env["CODEROUTER_SOCKET"] = env_socket
    argv = ["--socket", socket] if socket else []
    return cli.corectl(argv + list(args), env=env, timeout=timeout)


def status_json(sock: str) -> dict:
    r = corectl("status", "--json", env_socket=sock)
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)


def chat(url: str, **body) -> httpx.Response:
    payload = {"model": "any", "messages": [{"role": "user", "content": "hi"}], **body}
    return httpx.post(url + "/v1/chat/completions", json=payload, timeout=10)


def served_by(url: str) -> str:
    r = chat(url)
    assert r.status_code == 200, r.text
    return r.headers["x-coderouter-provider"]


def wait_for(predicate, timeout: float, what: str, interval: float = 0.03):
    """tests/support/wait.wait_for (its ceiling is never under MIN_CEILING_S), failing with what was awaited."""
    value = wait_until(predicate, timeout, interval)
    if not value:
        raise AssertionError(f"timed out after {max(timeout, MIN_CEILING_S)} s waiting for {what}")
    return value


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".swp")
    tmp.write_text(text)
    os.replace(tmp, path)


def admin_client(sock: str) -> httpx.Client:
    # A generous ceiling, not a window: the first admin call imports FastAPI and builds the app from the handler
    # table, which took over 5 s under -X importtime with the suite's workers sharing two cores.
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://coderouterd", timeout=60)


@pytest.fixture
def fakes():
    with FakeServer("openai", name="a") as a, FakeServer("openai", name="b") as b:
        yield a, b


@pytest.fixture
def daemons():
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        d.stop()


def start(daemons: list, text: str, tmp: Path, **kw) -> DaemonProcess:
    d = DaemonProcess(text, tmp, **kw)
    daemons.append(d)
    return d.start()


def sock_of(d: DaemonProcess) -> str:
    return str(d.state_dir / "coderouterd.sock")


# -- status, profiles, persistence ---------------------------------------------------------------------------

def test_status_profiles_and_persisted_switch(fakes, daemons, tmp_path):
    a, b = fakes
    d = start(daemons, config_text(a.url, b.url), tmp_path)
    sock = sock_of(d)
    assert served_by(d.url) == "a"

    human = corectl("status", socket=sock)
    assert human.returncode == 0, human.stderr
    for needle in ("coderouterd 0.1.0", f"pid {d.proc.pid}", f"http://127.0.0.1:{d.port}",
                   str(d.config_path.resolve()), "Providers", "Profiles", f"{a.url}/v1", "closed", "b > a"):
        assert needle in human.stdout, needle

    s = status_json(sock)
    assert s["pid"] == d.proc.pid and s["listen"]["port"] == d.port
    assert s["config_path"] == str(d.config_path.resolve()) and s["last_reload_error"] is None
    assert s["active_profile"] == "default" and s["uptime_s"] >= 0
    prov = {p["name"]: p for p in s["providers"]}
    assert prov["a"]["breaker"]["state"] == "closed" and prov["a"]["figures"]["samples"] >= 1
    profs = {p["name"]: p for p in s["profiles"]}
    assert profs["default"]["active"] and profs["alt"]["effective_order"] == ["b", "a"]

    lst = corectl("profile", "list", "--json", env_socket=sock)
    assert lst.returncode == 0 and orjson.loads(lst.stdout)["active"] == "default"
    show = corectl("profile", "show", "alt", env_socket=sock)
    assert show.returncode == 0 and "b > a" in show.stdout and f"{b.url}/v1" in show.stdout
    show_json = orjson.loads(corectl("--json", "profile", "show", "alt", env_socket=sock).stdout)
    assert show_json["settings"]["providers"] == ["b", "a"] and show_json["active"] is False

    bad = corectl("profile", "use", "nope", env_socket=sock)
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == "corectl: unknown profile 'nope'; valid profiles: alt, default\n"
    missing = corectl("profile", "show", "nope", "--json", env_socket=sock)
    assert missing.returncode == 1 and orjson.loads(missing.stdout)["valid_profiles"] == ["alt", "default"]

    use = corectl("profile", "use", "alt", env_socket=sock)
    assert use.returncode == 0 and use.stdout.strip() == "Active profile: alt (was default)."
    assert served_by(d.url) == "b"  # at once
    assert status_json(sock)["active_profile"] == "alt"

    assert d.stop() == 0
    # persisted in the state store's KV (namespace "daemon"), not only in memory
    con = sqlite3.connect(d.state_dir / "state.db")
    try:
        row = con.execute("SELECT value_json FROM kv WHERE namespace='daemon' AND key='active_profile'").fetchone()
    finally:
        con.close()
    assert row is not None and orjson.loads(row[0]) == "alt"
    d.start()
    assert status_json(sock)["active_profile"] == "alt"
    assert served_by(d.url) == "b"
    again = corectl("profile", "use", "default", "--json", env_socket=sock)
    assert orjson.loads(again.stdout) == {"ok": True, "previous": "alt", "active": "default"}


# -- hot reload ----------------------------------------------------------------------------------------------

def test_hot_reload_by_editing_the_file(fakes, daemons, tmp_path):
    a, b = fakes
    d = start(daemons, config_text(a.url, b.url), tmp_path)
    sock = sock_of(d)
    assert served_by(d.url) == "a"

    # An editor that saves by rename: a new inode replaces the watched file.
    write_atomic(d.config_path, config_text(a.url, b.url, default_chain='"b"'))
    wait_for(lambda: served_by(d.url) == "b", 2.0, "routing to b after an atomic rename")

    # An invalid edit written in place: refused, the running config stays, the reason is shown.
    d.config_path.write_text(config_text(a.url, b.url, default_chain='"a"') + INVALID_TAIL)
    wait_for(lambda: (admin_get(sock) or {}).get("last_reload_error"), 5.0, "the reload error in status")
    err = status_json(sock)["last_reload_error"]
    assert "profiles.broken.providers[0]: unknown provider 'ghost'" in err
    assert served_by(d.url) == "b"
    human = corectl("status", env_socket=sock)
    assert "last reload failed" in human.stdout and "unknown provider 'ghost'" in human.stdout
    r = corectl("reload", env_socket=sock)
    assert r.returncode == 1
    assert r.stderr.startswith("corectl: reload refused, the running configuration stays:")
    assert "unknown provider 'ghost'" in r.stderr
    rj = corectl("reload", "--json", env_socket=sock)
    assert rj.returncode == 1 and orjson.loads(rj.stdout)["ok"] is False
    # One log line per refused reload (two refusals from corectl: two lines, not four).
    assert sum("rejected" in line for line in d.log().splitlines() if "(corectl)" in line) == 2
    assert sum("rejected" in line for line in d.log().splitlines()) == \
        sum("config reload (" in line for line in d.log().splitlines())

    # A valid in-place write: applied, the error is cleared.
    d.config_path.write_text(config_text(a.url, b.url, default_chain='"a"'))
    wait_for(lambda: served_by(d.url) == "a", 2.0, "routing back to a after an in-place write")
    wait_for(lambda: (admin_get(sock) or {"last_reload_error": 1})["last_reload_error"] is None, 5.0,
             "the reload error to clear")
    assert status_json(sock)["last_reload_error"] is None

    ok = corectl("reload", "--json", env_socket=sock)
    assert ok.returncode == 0 and orjson.loads(ok.stdout)["ok"] is True

    # SIGHUP reloads too (the log names the trigger).
    d.signal(signal.SIGHUP)
    wait_for(lambda: "reloaded (SIGHUP)" in d.log(), 5.0, "the SIGHUP reload")
    assert d.proc.poll() is None


def test_reload_during_a_stream_keeps_the_old_config_for_it(daemons, tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_stream;delay=0.2;n=10") as a, \
            FakeServer("openai", name="b") as b:
        d = start(daemons, config_text(a.url, b.url), tmp_path)
        sock = sock_of(d)
        # The new config drops provider a altogether: the stream must still finish on it.
        without_a = config_text(a.url, b.url, default_chain='"b"').replace(
            f'[providers.a]\nkind = "openai"\nbase_url = "{a.url}/v1"\nmodel = "fake-model"\n', "").replace(
            'providers = ["b", "a"]', 'providers = ["b"]')
        lines: list[str] = []
        after_reload: list[str] = []
        reloaded = threading.Event()
        payload = {"model": "any", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=payload, timeout=20) as resp:
            assert resp.status_code == 200 and resp.headers["x-coderouter-provider"] == "a"
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line)
                if reloaded.is_set():
                    after_reload.append(line)
                elif "tok1 " in line:
                    write_atomic(d.config_path, without_a)
                    # The watcher may apply it first; either way it is applied once corectl returns.
                    r = corectl("reload", "--json", env_socket=sock)
                    assert r.returncode == 0, r.stderr
                    assert [p["name"] for p in status_json(sock)["providers"]] == ["b"]
                    assert served_by(d.url) == "b"
                    reloaded.set()
        text = "".join(orjson.loads(x[6:])["choices"][0]["delta"].get("content") or ""
                       for x in lines if x != "data: [DONE]" and orjson.loads(x[6:])["choices"])
        assert text == "".join(f"tok{i} " for i in range(10))
        assert lines[-1] == "data: [DONE]"
        assert any("tok9" in x for x in after_reload)


# -- the socket ----------------------------------------------------------------------------------------------

def test_socket_permissions_malformed_requests_and_no_tcp_admin(fakes, daemons, tmp_path):
    a, b = fakes
    d = start(daemons, config_text(a.url, b.url), tmp_path)
    sock = sock_of(d)
    assert stat.S_ISSOCK(os.stat(sock).st_mode)
    assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(d.state_dir).st_mode) == 0o700
    assert (d.state_dir / "coderouterd.lock").read_text().strip() == str(d.proc.pid)

    with admin_client(sock) as c:
        cases = [
            ("POST", "/v1/profile/use", b"{not json", 400),
            ("POST", "/v1/profile/use", b"[1, 2]", 400),
            ("POST", "/v1/profile/use", b'{"name": 7}', 400),
            ("POST", "/v1/profile/use", b"", 400),
            ("POST", "/v1/profile/use", b'{"name": "ghost"}', 404),
            ("GET", "/v1/profiles/ghost", None, 404),
            ("GET", "/v1/nothing-here", None, 404),
            ("DELETE", "/v1/status", None, 405),
            ("GET", "/v1/reload", None, 405),
        ]
        for method, path, body, code in cases:
            r = c.request(method, path, content=body)
            assert r.status_code == code, (method, path, r.text)
            assert r.headers["content-type"] == "application/json"
            assert isinstance(r.json()["error"], str) and r.json()["error"], r.text
        assert c.get("/v1/status").status_code == 200
        check = c.get("/v1/config/check").json()
        assert check["ok"] is True and check["path"] == str(d.config_path.resolve())

    for method, path in (("GET", "/v1/status"), ("GET", "/v1/profiles"), ("POST", "/v1/reload"),
                         ("POST", "/v1/profile/use"), ("GET", "/v1/config/check")):
        r = httpx.request(method, d.url + path, json={"name": "alt"} if method == "POST" else None, timeout=5)
        assert r.status_code == 404, (method, path, r.status_code)
    assert status_json(sock)["active_profile"] == "default"
    assert d.proc.poll() is None


def test_openapi_is_served_on_the_socket(fakes, daemons, tmp_path):
    a, b = fakes
    d = start(daemons, config_text(a.url, b.url), tmp_path)
    with admin_client(sock_of(d)) as c:
        r = c.get("/openapi.json")
        assert r.status_code == 200 and r.headers["content-type"] == "application/json"
        assert r.headers["x-coderouter-api-version"]
        doc = r.json()
        paths = set(doc["paths"])
        for path in ("/v1/status", "/v1/profiles", "/v1/profiles/{name}", "/v1/profile/use", "/v1/reload",
                     "/v1/config/check", "/v1/providers", "/v1/processes", "/v1/processes/{name}/{action}",
                     "/v1/models", "/v1/models/load", "/v1/models/unload", "/v1/requests",
                     "/v1/requests/{request_id}"):
            assert path in paths, path
        body = doc["paths"]["/v1/profile/use"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert body["$ref"].endswith("/UseProfileRequest")
        assert doc["info"]["version"] == c.get("/v1/status").headers["x-coderouter-api-version"]
    # Not on the proxy's port.
    assert httpx.get(d.url + "/openapi.json", timeout=5).status_code == 404

    # corectl's fast path reads a real answer without FastAPI, pydantic or the models (its 250 ms budget).
    code = ("import sys; from corectl.__main__ import main; rc = main(['--socket', sys.argv[1], 'status', '--json']); "
            "bad = [m for m in ('fastapi', 'pydantic', 'coderouterd.admin.apitype', 'typer') if m in sys.modules]; "
            "print('RESULT', rc, bad)")
    r = subprocess.run([sys.executable, "-c", code, sock_of(d)], capture_output=True, text=True, timeout=30)
    assert r.stdout.strip().splitlines()[-1] == "RESULT 0 []", r.stdout + r.stderr


def test_fastapi_is_loaded_by_the_first_admin_call_not_by_the_start(tmp_path):
    """The admin app (FastAPI) is built on the first admin request: a daemon that answers /healthz and serves
    its socket, but has had no admin call, has not imported it (its RSS and the first proxied requests do not
    pay for it). -X importtime lists every import as it happens, on stderr."""
    port = free_port()
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp_path / "state")}
    for k in ("CODEROUTER_CONFIG", "CODEROUTER_SOCKET", "CODEROUTER_ADMIN__SOCKET"):
        env.pop(k, None)
    err = tmp_path / "stderr.txt"
    with err.open("wb") as fh:
        proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "coderouterd", "--port", str(port)],
                                cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=fh)
    sock = tmp_path / "state" / "coderouterd.sock"
    try:
        deadline = time.monotonic() + 30
        while "admin API on unix socket" not in err.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, err.read_text(errors="replace")[-2000:]
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200
        healthy_at = time.monotonic()

        def imports() -> list[str]:
            return [line.rsplit("|", 1)[-1].strip() for line in err.read_text(errors="replace").splitlines()
                    if line.startswith("import time:")]

        # The background start (aiohttp, health) is done: about a second when idle, longer on a loaded machine
        # (it was a fixed one-second sleep, too short with the suite's workers sharing two cores).
        deadline = time.monotonic() + 20
        while "aiohttp" not in imports() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(max(0.0, healthy_at + 1.0 - time.monotonic()))  # never less than the second it used to be
        imported = imports()
        assert "aiohttp" in imported  # the listing is complete
        assert "fastapi" not in imported and "coderouterd.admin.api" not in imported
        with admin_client(str(sock)) as c:
            assert c.get("/v1/status").status_code == 200
        imported = [line.rsplit("|", 1)[-1].strip() for line in err.read_text(errors="replace").splitlines()
                    if line.startswith("import time:")]
        assert "fastapi" in imported
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


def test_stale_socket_second_daemon_and_not_running(fakes, daemons, tmp_path):
    a, b = fakes
    d = start(daemons, config_text(a.url, b.url), tmp_path)
    sock = sock_of(d)

    second = tmp_path / "second"
    second.mkdir()
    (second / "config.toml").write_text(d.config_path.read_text())
    env = {**d.env, "CODEROUTER_STATE_DIR": str(d.state_dir)}
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(second / "config.toml"),
                        "--port", str(free_port())], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30)
    assert r.returncode == 1
    assert f"another coderouterd (pid {d.proc.pid}) is already running" in r.stderr
    assert os.path.exists(sock) and status_json(sock)["pid"] == d.proc.pid  # the first is untouched

    d.kill9()
    assert os.path.exists(sock)  # a crash leaves the socket file behind
    down = corectl("status", env_socket=sock)
    assert down.returncode == 3
    assert down.stderr.startswith(f"corectl: coderouterd is not running (nothing is listening on the socket "
                                  f"at {sock}). Start it with: ")
    # The command that works from here: `coderouterd` on PATH, else the one beside this Python.
    assert "coderouterd" in down.stderr.split("Start it with: ")[1] and down.stderr.count("\n") == 1

    d.start()
    assert "removing stale admin socket" in d.log()
    assert status_json(sock)["pid"] == d.proc.pid

    gone = corectl("status", socket=str(tmp_path / "never.sock"))
    assert gone.returncode == 3 and "Traceback" not in gone.stderr
    assert gone.stderr.startswith(f"corectl: coderouterd is not running (no socket at "
                                  f"{tmp_path / 'never.sock'}). Start it with: ")


# -- lifecycle -----------------------------------------------------------------------------------------------

def test_sigterm_drains_the_stream_then_removes_socket_and_lock(daemons, tmp_path):
    with FakeServer("openai", name="a", behaviour="slow_stream;delay=0.15;n=8") as a, \
            FakeServer("openai", name="b") as b:
        d = start(daemons, config_text(a.url, b.url), tmp_path)
        sock = sock_of(d)
        payload = {"model": "any", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        got: list[str] = []
        with httpx.stream("POST", d.url + "/v1/chat/completions", json=payload, timeout=20) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    got.append(line)
                    if len(got) == 2:
                        d.signal(signal.SIGTERM)
        assert got[-1] == "data: [DONE]"
        assert sum("tok" in x for x in got) == 8
        assert d.proc.wait(15) == 0
        assert not os.path.exists(sock)
        assert (d.state_dir / "coderouterd.lock").read_text() == ""
        assert "SIGTERM: draining" in d.log()
        assert corectl("status", env_socket=sock).returncode == 3


# -- building blocks, in process -----------------------------------------------------------------------------

def test_state_lock_names_the_owner_and_frees_on_release(tmp_path):
    from coderouterd.state.dir_lock import LockHeld, StateLock

    first = StateLock(tmp_path / "coderouterd.lock")
    first.acquire()
    # flock belongs to the open file description, so a second open in this process contends like a 2nd daemon.
    with pytest.raises(LockHeld) as e:
        StateLock(tmp_path / "coderouterd.lock").acquire()
    assert e.value.pid == os.getpid() and f"pid {os.getpid()}" in str(e.value)
    first.release()
    again = StateLock(tmp_path / "coderouterd.lock")
    again.acquire()
    again.release()


def test_admin_socket_never_replaces_a_live_socket_or_a_regular_file(tmp_path):
    import socket as _socket

    from coderouterd.admin.server import AdminSocketError, bind_admin_socket

    path = tmp_path / "run" / "admin.sock"
    live = bind_admin_socket(path, private_dir=True)
    try:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
        with pytest.raises(AdminSocketError, match="another process is serving"):
            bind_admin_socket(path, private_dir=True)
    finally:
        live.close()
    # Closed without unlinking, as after a crash: replaced.
    replacement = bind_admin_socket(path, private_dir=True)
    probe = _socket.socket(_socket.AF_UNIX)
    probe.connect(str(path))
    probe.close()
    replacement.close()

    plain = tmp_path / "run" / "not-a-socket"
    plain.write_text("keep me")
    with pytest.raises(AdminSocketError, match="not a socket"):
        bind_admin_socket(plain, private_dir=True)
    assert plain.read_text() == "keep me"
    with pytest.raises(AdminSocketError, match="too long"):
        bind_admin_socket(tmp_path / ("x" * 120) / "s.sock", private_dir=True)
