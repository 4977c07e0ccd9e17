"""The suite passes on a machine whose user runs coderouterd, and after one left a stale record behind.

Our users run coderouterd every day while they run `make test`. A daemon at the default location publishes its
socket and a discovery record (`~/.local/state/coderouter/coderouterd.json`, and `coderouterd.last.json`, kept
after it stops). A fresh clone's suite once failed five tests on such a machine: corectl followed the stale
record to a dead daemon's config (other provider names, a shared DSN that no longer answered).

This test plants both in a user's home, then runs tests that read the journal, the state directory and the
config under that home, as `make test` would: first while the user's daemon runs, then after it stopped with a
stale record pointing to a config of other providers on a shared database nobody serves.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from coderouterd.config import load_config
from tests.support.daemon import ROOT, free_port
from tests.support.ports import dead_port
from tests.support.wait import wait_for

INNER = ["tests/e2e/test_corectl_ops.py::test_replay_compare_on_a_known_journal",
         "tests/e2e/test_affinity.py::test_cache_bust_names_the_segment[_mutate_tools-tools changed]"]
STALE_CONFIG = """
[state]
backend = "postgres"
dsn = "postgresql://u:pw@127.0.0.1:{port}/gone"

[providers.anthropic]
kind = "anthropic"
base_url = "http://127.0.0.1:{port}"

[providers.groq]
base_url = "http://127.0.0.1:{port}/v1"

[profiles.default]
providers = ["anthropic", "groq"]
"""


def _user_env(home: Path) -> dict[str, str]:
    """The environment of a user whose state lives at the default places under `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEROUTER_", "XDG_"))}
    env["HOME"] = str(home)
    return env


@pytest.fixture
def user_home() -> Iterator[Path]:
    # Short: the user's daemon puts its admin socket under ~/.local/state, within a Unix socket's 103 bytes.
    home = Path(tempfile.mkdtemp(prefix="u"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


def _inner_suite(home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-q",
                           "--basetemp", str(home / "inner-tmp"), *INNER],
                          cwd=ROOT, env=_user_env(home), capture_output=True, text=True, timeout=600)


def test_the_suite_ignores_the_users_running_daemon_and_a_stale_record(user_home):
    records = user_home / ".local" / "state" / "coderouter"
    port = free_port()
    user_daemon = subprocess.Popen([sys.executable, "-m", "coderouterd", "--port", str(port)], cwd=user_home,
                                   env=_user_env(user_home), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: (records / "coderouterd.json").exists(), timeout=60)
        live = orjson.loads((records / "coderouterd.json").read_bytes())
        assert live["pid"] == user_daemon.pid

        ran = _inner_suite(user_home)
        assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
    finally:
        user_daemon.send_signal(signal.SIGTERM)
        user_daemon.wait(timeout=60)

    # The user's daemon is gone; its last record is left, rewritten to point to another config, as a daemon of
    # last week would have left it.
    stale_config = user_home / "old.toml"
    stale_config.write_text(STALE_CONFIG.format(port=dead_port()))
    load_config(str(stale_config))  # a config the daemon ran with: one a corectl would follow
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    record = {**live, "pid": int(gone.stdout), "config_path": str(stale_config), "embedded_config": False}
    (records / "coderouterd.last.json").write_bytes(orjson.dumps(record))
    assert not (records / "coderouterd.json").exists()

    ran = _inner_suite(user_home)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-2000:]
