"""KV caches that survive a restart of coderouterd and a kill -9 of its llama-server, on the real server
(SmolLM2-135M): three interleaved Claude-Code-shaped conversations with two title calls on three slots, cut in
three parts: coderouterd restarted after the first, the server killed -9 after the second (after a pause longer
than save_idle_after_s). What the server processed against the best any cache could do (each prompt less its
longest prefix shared with any earlier prompt, in the server's tokens), over the whole run and over each part
after an interruption: a restart may not forgive anything.

Issue 33's bounds: 1.25x after the restart, 1.5x after the kill. Measured here: 1.15x and 0.99x (1.045x over the
whole run, held at 1.10x); with the saves off 2.06x, 2.4x and 1.87x. bench/real_llama.py --warm runs the full
scale, saves on and off, one interruption per run; its figures are in bench/README.md."""

from __future__ import annotations

import pytest

from bench.real_llama import WARM_NO_TOOLS_SUITE, WARM_SUITE, interrupted, print_warm_table
from tests.support.real_llama import paths

# A real model on two CPU cores: each test here takes tens of seconds when the machine is idle, and several times
# that when it is not. The suite-wide 120 s guard is for tests that should be instant.
pytestmark = pytest.mark.timeout(900)


@pytest.mark.parametrize("scenario", [WARM_SUITE, WARM_NO_TOOLS_SUITE], ids=["tools", "no-tools"])
def test_lanes_resume_from_saved_slots_after_a_daemon_restart_and_a_server_kill(tmp_path, scenario):
    """The same with sessions whose turns carry no tools (lanes are chosen by prefix, not by request shape)."""
    paths()
    r = interrupted(scenario, tmp_path, ("restart", "kill"))
    print()
    print_warm_table([{"run": "restart, then kill -9", **r}])
    assert r["restores"] >= 1, r  # the killed server's lanes came back from their background saves
    assert r["after_restart"] <= 1.25, r
    assert r["after_kill"] <= 1.5, r
    assert r["of_ideal"] <= 1.10, r
