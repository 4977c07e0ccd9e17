"""The first ten minutes, as a new user lives them: a private HOME, no CODEROUTER_* variables, a daemon started
with `--config` somewhere else and its own state directory, and `corectl` typed in another shell.

corectl must find that daemon (the discovery record), read its journal while it runs and after it stopped, check
its config (doctor, config check), the key in ~/.config/coderouter/env must reach the upstream, tables must fit
80 columns, and unknown names must fail with the valid ones."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from coderouterd.state.journal_reader import journal_rows
from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.daemon import ROOT, admin_get, free_port
from tests.support.wait import wait_for

KEY = "sk-from-the-env-file"


def config_text(url: str, state: Path) -> str:
    return f"""
[server]
default_profile = "default"

[state]
dir = "{state}"

[providers.cloud-with-a-long-name]
kind = "openai"
base_url = "{url}/v1"
model = "fake-model"
api_key_env = "FIRST_RUN_UPSTREAM_KEY"

[providers.spare]
kind = "openai"
base_url = "{url}/v1"
model = "fake-model"
api_key_env = "FIRST_RUN_MISSING_KEY"

[profiles.default]
providers = ["cloud-with-a-long-name", "spare"]

[profiles.alt]
providers = ["spare"]
"""


class User:
    """A shell with its own HOME: every command runs with that environment, none of CODEROUTER_*."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        self.home.mkdir()
        drop = ("CODEROUTER_", "XDG_")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
        self.env.pop("FIRST_RUN_UPSTREAM_KEY", None)
        self.env.pop("FIRST_RUN_MISSING_KEY", None)
        self.env["HOME"] = str(self.home)

    def corectl(self, *args: str, columns: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
        env = dict(self.env)
        if columns:
            env["COLUMNS"] = str(columns)
        return cli.corectl(list(args), env=env, timeout=timeout)

    def json(self, *args: str) -> dict:
        r = self.corectl(*args, "--json")
        assert r.returncode == 0, r.stderr
        return orjson.loads(r.stdout)


@pytest.fixture
def user(tmp_path):
    return User(tmp_path)


def start(user: User, config: Path, port: int, log: Path, sock: Path) -> subprocess.Popen:
    out = open(log, "ab")
    proc = subprocess.Popen([sys.executable, "-m", "coderouterd", "--config", str(config), "--port", str(port)],
                            cwd=ROOT, env=user.env, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    deadline = time.monotonic() + 60  # as DaemonProcess.start: a ceiling, not a measure
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"coderouterd exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=0.5).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    # The admin API comes up right after the proxy (asked from here: a corectl per poll costs a process start;
    # the test's first step is `corectl status`).
    while time.monotonic() < deadline and admin_get(sock) is None:
        time.sleep(0.05)
    return proc


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(5)
    return proc.returncode


def test_a_daemon_with_its_own_config_and_state_is_found_and_used(user, tmp_path):
    state = tmp_path / "my state"
    config = tmp_path / "elsewhere" / "router.toml"
    config.parent.mkdir()
    envfile = user.home / ".config" / "coderouter" / "env"
    envfile.parent.mkdir(parents=True)
    envfile.write_text(f"# keys for the login service\nexport FIRST_RUN_UPSTREAM_KEY={KEY}\n")
    envfile.chmod(0o644)
    port = free_port()
    log = tmp_path / "daemon.log"
    with FakeServer("openai", name="cloud") as fake:
        config.write_text(config_text(fake.url, state))
        # A key file others may read is refused, with the fix in the message.
        refused = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(config), "--check"], cwd=ROOT,
                                 env=user.env, capture_output=True, text=True, timeout=30)
        assert refused.returncode == 2 and f"chmod 600 {envfile}" in refused.stderr
        envfile.chmod(0o600)
        check = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(config), "--check"], cwd=ROOT,
                               env=user.env, capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        assert "spare: no key: $FIRST_RUN_MISSING_KEY is not set" in check.stderr
        assert "cloud-with-a-long-name" not in check.stderr

        proc = start(user, config, port, log, state / "coderouterd.sock")
        try:
            st = user.json("status")
            assert st["config_path"] == str(config.resolve())
            assert st["state_dir"] == str(state)
            problems = {p["name"]: p["key_problem"] for p in st["providers"]}
            assert problems == {"cloud-with-a-long-name": None, "spare": "no key: $FIRST_RUN_MISSING_KEY is not set"}

            # The key from the env file reaches the upstream.
            r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=15,
                           json={"model": "any", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
            rid = r.headers["x-request-id"]
            gen = [q for q in fake.requests if q["path"] == "/v1/chat/completions"]
            assert gen and gen[-1]["headers"]["authorization"] == f"Bearer {KEY}"

            # The journal of this daemon, read while it runs.
            rows = wait_for_journal(user, rid, state)
            assert rows[0]["provider"] == "cloud-with-a-long-name"

            # config check and doctor look at the daemon's file, not a default one.
            assert user.json("config", "check")["path"] == str(config.resolve())
            doc = user.corectl("doctor", "--json", timeout=120)
            assert doc.returncode in (0, 2), doc.stderr
            report = orjson.loads(doc.stdout)
            assert report["config"] == str(config.resolve())
            spare = next(p for p in report["providers"] if p["provider"] == "spare")
            assert any(c["name"] == "daemon key" and c["status"] == "fail" for c in spare["checks"])

            # service install defaults to the running daemon's config too.
            svc = user.corectl("service", "install", "--os", "linux", "--dry-run", "--json")
            assert svc.returncode == 0, svc.stderr
            assert orjson.loads(svc.stdout)["config"] == str(config.resolve())

            # 80 columns: nothing truncated, no line wider than the terminal, the key problem named.
            narrow = user.corectl("status", columns=80)
            assert narrow.returncode == 0, narrow.stderr
            assert "…" not in narrow.stdout
            assert max(len(line) for line in narrow.stdout.splitlines()) <= 80
            assert "cloud-with-a-long-name" in narrow.stdout
            assert "spare: no key: $FIRST_RUN_MISSING_KEY is not set" in narrow.stdout
            journal = user.corectl("journal", "tail", columns=80)
            assert journal.returncode == 0 and rid in journal.stdout  # the id on one line, pasteable

            # Unknown names fail, naming the valid ones.
            for args, valid in ((("profile", "use", "nosuch"), "alt, default"),
                                (("profile", "show", "nosuch"), "alt, default"),
                                (("models", "list", "nosuch"), "cloud-with-a-long-name, spare"),
                                (("journal", "tail", "--provider", "nosuch"), "cloud-with-a-long-name, spare"),
                                (("journal", "tail", "--profile", "nosuch"), "alt, default"),
                                (("audit", "tail", "--kind", "nosuchkind"), "health_transition")):
                r = user.corectl(*args)
                assert r.returncode == 1, (args, r.stdout, r.stderr)
                assert valid in r.stderr and "Traceback" not in r.stderr, (args, r.stderr)
            # Profiles are compared as profiles without --by; asked to compare them as providers, the error
            # still says what they are.
            assert user.corectl("replay", "compare", "default", "alt", "--since", "10m").returncode == 0
            hint = user.corectl("replay", "compare", "default", "alt", "--by", "provider", "--since", "10m")
            assert hint.returncode == 1 and "--by profile" in hint.stderr

            # An invalid, even non-UTF-8, config on disk: the daemon is still found; the check says what is wrong.
            config.write_bytes(b"\xff\xfe[server\n")
            assert user.corectl("status").returncode == 0
            bad = user.corectl("config", "check")
            assert bad.returncode == 1 and "not UTF-8" in bad.stderr and "Traceback" not in bad.stderr
            config.write_text(config_text(fake.url, state))
        finally:
            assert stop(proc) == 0
        daemon_log = log.read_text()
        assert "Traceback" not in daemon_log

        # Stopped: "not running" with a start command that works from here, and the history still readable.
        down = user.corectl("status")
        assert down.returncode == 3
        assert f"--config {config.resolve()}" in down.stderr or "--config ~" in down.stderr
        after = user.json("journal", "tail")
        assert after["state_dir"] == str(state) and rid in [row["request_id"] for row in after["rows"]]
        assert user.json("config", "check")["path"] == str(config.resolve())
        explained = user.json("explain", rid)
        assert explained["source"] == "journal"


def wait_for_journal(user: User, rid: str, state: Path) -> list[dict]:
    # Until the writer has flushed the row (read from here: a corectl per poll costs a process start), then
    # what corectl shows.
    wait_for(lambda: any(r["request_id"] == rid for r in journal_rows(state / "state.db")))
    data = user.json("journal", "tail")
    rows = [r for r in data["rows"] if r["request_id"] == rid]
    assert rows, data
    return rows
