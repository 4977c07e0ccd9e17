"""What a slot copy costs a server (kvcache/costs.py), learnt from its own saves and restores, outlives a daemon
restart: the first new lane after it is weighed with what was learnt, not with a trial copy. End to end, with the
real daemon managing a fake llama-server (tests/e2e/test_warm_caches.py's config)."""

from __future__ import annotations

import os
import signal

from tests.e2e.test_warm_caches import _bins, _config, _ready, _turn, _wait
from tests.support import cli
from tests.support.claude_sessions import Session
from tests.support.daemon import DaemonProcess, admin_get, free_port, running


def _warm(d: DaemonProcess) -> dict:
    st = admin_get(d.state_dir / "coderouterd.sock") or {}
    return next(p for p in st["providers"] if p["name"] == "llama")["cache"]["slots"]["warm"]


def test_the_learnt_copy_cost_is_still_known_after_a_daemon_restart(tmp_path):
    config = _config(tmp_path, free_port(), idle=0.2)
    a, b = Session(64), Session(65)
    with running(config, tmp_path) as d:
        proc = _ready(d)
        _turn(d, a)
        _turn(d, a)
        _wait(lambda: _bins(d), "the idle lane's background save")  # a save measured
        os.kill(proc["pid"], signal.SIGKILL)
        _wait(lambda: (p := _ready(d)) and p["pid"] != proc["pid"], "the supervisor's restart")
        _turn(d, a)  # its lane restored: a restore measured
        learnt = _wait(lambda: _warm(d)["copy_1000_s"], "a copy cost learnt from a save and a restore")
        assert learnt > 0

    with running(config, tmp_path) as d2:
        _ready(d2)
        _turn(d2, b)  # a new conversation in a free slot: nothing saved or restored, nothing measured in this run
        warm = _warm(d2)
        assert warm["saves"] == warm["restores"] == warm["restore_failures"] == 0, warm
        assert warm["copy_1000_s"] is not None and warm["copy_1000_s"] > 0, warm
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
        out = cli.corectl(["--socket", str(d2.state_dir / "coderouterd.sock"), "status"], env=env).stdout
        assert f"a slot copy ~{warm['copy_1000_s']:.3f} s per 1,000 tokens" in out, out
