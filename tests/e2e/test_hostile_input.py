"""Issue 41, N10 and N11 against the real daemon and the real corectl: a config file that is a device, at start
and on reload (the daemon keeps serving, on its old config, and says why); a client's model name full of
terminal escapes, which no corectl view may pass to the admin's terminal."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.e2e.test_control_plane import corectl, status_json, wait_for, write_atomic
from tests.fakes.runner import FakeServer
from tests.support.daemon import ROOT, DaemonProcess, admin_get


def _config(url: str, extra: str = "") -> str:
    return f"""
[server]
port = {{PORT}}

[state]
flush_interval_s = 0.05

[providers.local]
kind = "openai"
base_url = "{url}/v1"
{extra}

[profiles.default]
providers = ["local"]
"""


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def daemons():
    started: list[DaemonProcess] = []
    yield started
    for d in started:
        d.stop()


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}


# -- N10: the config file is a device -----------------------------------------------------------------------------

def test_a_config_symlinked_to_dev_zero_is_refused_at_start_and_by_config_check(tmp_path):
    link = tmp_path / "config.toml"
    link.symlink_to("/dev/zero")
    want = f"{link} (a symlink to /dev/zero) is a device, not a regular file"
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(link)], cwd=ROOT, env=_clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and want in r.stderr and "MemoryError" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(link), "--check"], cwd=ROOT,
                       env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and want in r.stderr
    r = corectl("config", "check", str(link))
    assert r.returncode == 1 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = corectl("--json", "config", "check", str(link))
    assert r.returncode == 1 and want in orjson.loads(r.stdout)["error"]


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_a_config_replaced_by_a_dev_zero_symlink_is_refused_on_reload_and_the_daemon_serves_on(daemons, tmp_path):
    with FakeServer("openai", name="local") as fake:
        text = _config(fake.url)
        d = DaemonProcess(text, tmp_path)
        daemons.append(d)
        d.start()
        sock = str(d.state_dir / "coderouterd.sock")
        pid = status_json(sock)["pid"]
        before = _rss_mb(pid)
        # What an editor or a mistaken `ln -sf` does: the path now names a device. The watcher sees it.
        tmp_link = d.config_path.with_name("config.toml.new")
        tmp_link.symlink_to("/dev/zero")
        os.replace(tmp_link, d.config_path)
        err = wait_for(lambda: (admin_get(sock) or {}).get("last_reload_error"), 8.0, "the reload error")
        assert "(a symlink to /dev/zero) is a device, not a regular file" in err
        r = corectl("reload", "--json", env_socket=sock)
        assert "is a device" in orjson.loads(r.stdout)["error"]
        assert "last reload failed, previous config kept" in corectl("status", env_socket=sock).stdout
        assert "is a device" in d.log()
        # Still serving, on the config it had, and it did not read the device.
        assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200
        assert _rss_mb(pid) < before + 100
        # A regular file again: applied as usual.
        d.config_path.unlink()
        write_atomic(d.config_path, text.replace("{PORT}", str(d.port)) + '\n[profiles.extra]\nproviders = ["local"]\n')
        wait_for(lambda: "extra" in [p["name"] for p in (admin_get(sock) or {"profiles": []})["profiles"]], 8.0,
                 "the valid edit")
        assert status_json(sock)["last_reload_error"] is None


# -- N11: a model name full of terminal escapes ---------------------------------------------------------------

EVIL = ("m\x1b[2J\x1b[H\x1b]8;;https://evil.example\x1b\\click\x1b]8;;\x07\x9b31m[link=https://evil.example]x[/link]"
        "\u202e\nforged")
SGR = re.compile(r"\x1b\[[0-9;]*m")
FORBIDDEN = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e]")


def _assert_neutral(what: str, out: str) -> None:
    found = FORBIDDEN.search(out)
    assert found is None, (what, repr(out[max(0, found.start() - 40):found.end() + 40]))
    assert "evil.example\x1b" not in out and "\nforged" not in out, what


def test_a_model_name_with_escape_sequences_never_reaches_the_admins_terminal(daemons, tmp_path):
    # `bad` answers 404 quoting the model (its error text is the client's too), then `local` serves.
    with FakeServer("openai", name="bad", behaviour="404_model") as bad, \
            FakeServer("openai", name="local") as good:
        cfg = _config(good.url, extra=f'\n[providers.bad]\nkind = "openai"\nbase_url = "{bad.url}/v1"\n')
        cfg = cfg.replace('providers = ["local"]', 'providers = ["bad", "local"]')
        d = DaemonProcess(cfg, tmp_path)
        daemons.append(d)
        d.start()
        sock = str(d.state_dir / "coderouterd.sock")
        r = httpx.post(d.url + "/v1/chat/completions", json={**CHAT, "model": EVIL},
                       headers={"x-request-id": "evil-1"}, timeout=10)
        assert r.status_code == 200, r.text
        # The journal has it (the row is written by the writer task).
        wait_for(lambda: orjson.loads(corectl("--json", "journal", "tail", env_socket=sock).stdout).get("rows"),
                 8.0, "the journal row")
        # --json stays exact: the encoder escapes, the value is the client's.
        doc = orjson.loads(corectl("--json", "explain", "evil-1", env_socket=sock).stdout)
        assert doc["trace"]["model_requested"] == EVIL
        views = {"explain": ["explain", "evil-1"], "journal": ["journal", "tail"], "top": ["top"],
                 "status": ["status"], "providers": ["providers"]}
        for name, args in views.items():
            r = corectl(*args, env_socket=sock)
            assert r.returncode == 0, (name, r.stderr)
            _assert_neutral(name, r.stdout + r.stderr)
        explained = corectl("explain", "evil-1", env_socket=sock).stdout
        assert "m\\x1b[2J\\x1b[H\\x1b]8;;https://evil.example" in explained  # shown, visibly
        assert "[link=https://evil.example]x[/link]" in explained  # printed as written, not a link
        # On a colour terminal too (Rich's own colour codes are the only escapes); top would take the screen.
        env = {"FORCE_COLOR": "1", "TERM": "xterm-256color", "COLUMNS": "200"}
        for name in ("explain", "journal", "status"):
            r = _corectl_env(views[name], sock, env)
            assert r.returncode == 0, (name, r.stderr)
            assert "\x1b[" in r.stdout  # it did colour
            _assert_neutral(name + " (colour)", SGR.sub("", r.stdout))


def _corectl_env(args: list[str], sock: str, extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {**_clean_env(), "CODEROUTER_SOCKET": sock, **extra}
    return subprocess.run([sys.executable, "-m", "corectl", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


# -- N15: nesting, and a process the memory budget can never hold -------------------------------------------------

DEEP = "[server]\napi_keys = " + "[" * 5000 + "]" * 5000 + "\n"  # in place of the [server] line


def test_a_deeply_nested_config_is_a_clear_error_at_start_in_config_check_and_on_reload(daemons, tmp_path):
    bad = tmp_path / "deep.toml"
    bad.write_text(_config("http://127.0.0.1:9").replace("{PORT}", "8088").replace("[server]\n", DEEP))
    want = "invalid TOML: arrays or inline tables nested too deeply to parse"
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(bad)], cwd=ROOT, env=_clean_env(),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and want in r.stderr and "RecursionError" not in r.stderr, r.stderr
    r = corectl("config", "check", str(bad))
    assert r.returncode == 1 and want in r.stderr and "Traceback" not in r.stderr, r.stderr
    with FakeServer("openai", name="local") as fake:
        text = _config(fake.url)
        d = DaemonProcess(text, tmp_path / "d")
        daemons.append(d)
        d.start()
        sock = str(d.state_dir / "coderouterd.sock")
        good = text.replace("{PORT}", str(d.port))
        write_atomic(d.config_path, good.replace("[server]\n", DEEP))
        err = wait_for(lambda: (admin_get(sock) or {}).get("last_reload_error"), 8.0, "the reload error")
        assert want in err
        assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=10).status_code == 200


def test_config_check_and_daemon_check_name_a_process_over_the_memory_budget(tmp_path):
    binary = tmp_path / "server"
    binary.write_text("#!/bin/sh\nsleep 60\n")
    binary.chmod(0o755)
    cfg = tmp_path / "p.toml"
    cfg.write_text(f"""
[models]
memory_budget_mb = 8000

[providers.big]
base_url = "http://127.0.0.1:9/v1"
process = {{ command = ["{binary}"], memory_mb = 12000 }}

[providers.small]
base_url = "http://127.0.0.1:9/v1"
process = {{ command = ["{binary}"], memory_mb = 4000 }}

[profiles.default]
providers = ["big", "small"]
""")
    want = "process big cannot start: memory_mb 12,000 MB exceeds [models] memory_budget_mb = 8,000"
    r = corectl("config", "check", str(cfg))
    assert r.returncode == 1 and want in r.stdout and "process small" not in r.stdout, r.stdout
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(cfg), "--check"], cwd=ROOT,
                       env=_clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and want in r.stderr, r.stderr
