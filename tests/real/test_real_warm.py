"""KV caches that survive a restart of coderouterd and a kill -9 of its llama-server, on the real server
(SmolLM2-135M): three interleaved Claude-Code-shaped conversations with two title calls on three slots,
interrupted half-way. What the server processed, over the whole run, against the best any cache could do
(each prompt less its longest prefix shared with any earlier prompt, in the server's tokens): a restart may
not forgive anything. Issue 33 asks for 1.25x (restart) and 1.5x (kill) at full scale; at this scale the shared
system prompt is most of each prompt and other slots give it back, so losing every lane's cache costs only
1.23x (measured with the saves off, both ways): the suite holds 1.10x, which only the saves reach (1.04x). bench/real_llama.py --warm runs the same at full scale, with the saves on and off; its
figures are in bench/README.md."""

from __future__ import annotations

import pytest

from bench.real_llama import THREE_SUITE, interrupted, print_warm_table
from tests.support.real_llama import paths

# A real model on two CPU cores: each test here takes tens of seconds when the machine is idle, and several times
# that when it is not. The suite-wide 120 s guard is for tests that should be instant.
pytestmark = pytest.mark.timeout(900)


def _show(row: dict) -> None:
    print()
    print_warm_table([row])


def test_coderouterd_restarted_half_way_stays_near_the_best(tmp_path):
    paths()
    r = interrupted(THREE_SUITE, tmp_path, "restart")
    _show({"run": "restart", **r})
    assert r["restores"] >= 1, r  # the lanes came back from the slots saved at shutdown
    assert r["processed_tokens"] <= 1.10 * r["ideal_processed"], r


def test_the_server_killed_half_way_stays_near_the_best(tmp_path):
    paths()
    r = interrupted(THREE_SUITE, tmp_path, "kill")
    _show({"run": "kill -9", **r})
    assert r["restores"] >= 1, r  # the lanes came back from their background saves
    assert r["processed_tokens"] <= 1.10 * r["ideal_processed"], r
