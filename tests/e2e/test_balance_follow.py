"""A balance profile's replica goes down and its lane moves, its saved slot file with it (issue 44 section 1), end
to end: the real daemon manages two fake llama-servers as processes (scripts named `llama-server`, so each is
given `--slot-save-path` in the daemon's slot directory, as the real one is) and a conversation sits on one of
them until its lane is saved. That replica is then taken down, by a planned stop (its slots saved before it
stops) or by kill -9 (its background save is what exists), and the conversation's next turn is served by the
other replica from the moved file: cached tokens, a restore counted there, and `corectl explain` saying so.
A replica with another context per slot or another model file never receives the file."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support import cli
from tests.support.claude_sessions import Session
from tests.support.daemon import ROOT, DaemonProcess, admin_get, free_port, running
from tests.support.held import held_turn
from tests.support.wait import wait_for

NAMES = ("gpu1", "gpu2")
CTX = 2 * 65536  # two slots of 65,536 tokens

PROVIDER = """
[providers.@NAME@]
kind = "openai"
base_url = "http://127.0.0.1:@PORT@/v1"
model = "coder"
[providers.@NAME@.process]
command = @ARGV@
cwd = "@ROOT@"
ready_url = "http://127.0.0.1:@PORT@/health"
stop_timeout_s = 2
startsecs = 0.1
max_restarts = 0
"""

# max_restarts = 0: a replica killed stays down (a machine that died), so the next turn has only the other.
CONFIG = """
[server]
port = {PORT}
[state]
flush_interval_s = 0.1
@PROVIDERS@
[profiles.default]
providers = ["gpu1", "gpu2"]
mode = "balance"
health_action = "warn"
[affinity]
clone_min_tokens = 100000
save_idle_after_s = @IDLE@
"""


def _config(tmp: Path, *, idle: float = 0.2, other: dict[str, str] | None = None) -> str:
    """Both replicas run the same model file with the same context (one cache key), unless `other` gives gpu2
    another: {"ctx": ...} or {"model": ...}. `idle`: save_idle_after_s (0: no background saves)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "llama-server"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} -m tests.fakes --kind llamacpp --no-record \"$@\"\n")
    script.chmod(0o755)
    model = tmp / "coder.gguf"
    model.write_bytes(b"weights")
    blocks = []
    for name in NAMES:
        port = free_port()
        m, ctx = str(model), str(CTX)
        if name == "gpu2" and other:
            ctx = other.get("ctx", ctx)
            if "model" in other:
                m = str(tmp / other["model"])
                Path(m).write_bytes(b"other weights")
        argv = [str(script), "-m", m, "--port", str(port), "-np", "2", "-c", ctx]
        blocks.append(PROVIDER.replace("@NAME@", name).replace("@PORT@", str(port))
                      .replace("@ARGV@", json.dumps(argv)).replace("@ROOT@", str(ROOT)))
    return CONFIG.replace("@PROVIDERS@", "".join(blocks)).replace("@IDLE@", str(idle))


def _wait(pred, what: str, timeout: float = 60.0):
    got = wait_for(pred, timeout)
    assert got, f"timed out waiting for {what}"
    return got


def _sock(d: DaemonProcess) -> Path:
    return d.state_dir / "coderouterd.sock"


def _processes(d: DaemonProcess) -> dict[str, dict]:
    procs = (admin_get(_sock(d), "/v1/processes") or {}).get("processes") or []
    rows = procs.values() if isinstance(procs, dict) else procs
    return {p["name"]: p for p in rows if isinstance(p, dict) and "name" in p}


def _all_ready(d: DaemonProcess) -> dict[str, dict]:
    def ready():
        procs = _processes(d)
        return procs if all(procs.get(n, {}).get("state") == "ready" for n in NAMES) else None

    return _wait(ready, "both managed llama-servers to be ready")


def _turn(d: DaemonProcess, s: Session) -> tuple[str, dict, str]:
    """(the replica that served it, its usage, its request id)."""
    r = httpx.post(d.url + "/v1/messages", json=s.main_body(), timeout=60,
                   headers={**s.headers, "anthropic-version": "2023-06-01"})
    assert r.status_code == 200, r.text
    s.advance()
    return r.headers["x-coderouter-provider"], r.json()["usage"], r.headers["x-request-id"]


def _slot_files(d: DaemonProcess) -> dict[str, dict]:
    """coderouterd's saved slot files (with a sidecar) -> the sidecar."""
    out = {}
    directory = d.state_dir / "slots"
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for n in names:
        if n.endswith(".bin") and n + ".json" in names:
            try:
                out[n] = orjson.loads((directory / (n + ".json")).read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue  # being written
    return out


def _warm(d: DaemonProcess, name: str) -> dict:
    st = admin_get(_sock(d)) or {}
    row = next(p for p in st["providers"] if p["name"] == name)
    return row["cache"]["slots"]["warm"]


def _corectl(d: DaemonProcess, *args: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["COLUMNS"] = "240"
    return cli.corectl(["--socket", str(_sock(d)), *args], env=env)


def _settle_on_one(d: DaemonProcess, s: Session) -> str:
    """Two turns of one conversation: it sits on one replica (returned)."""
    first, _, _ = _turn(d, s)
    again, usage, rid = _turn(d, s)
    assert again == first, _corectl(d, "explain", rid).stdout
    assert usage["cache_read_input_tokens"] > 0, usage
    return first


def _saved(d: DaemonProcess) -> set[str]:
    return set(_wait(lambda: _slot_files(d), "the lane's saved slot file and its sidecar"))


def _take_down(d: DaemonProcess, name: str, how: str, pid: int) -> None:
    if how == "stop":
        out = _corectl(d, "stop", name)
        assert out.returncode == 0, out.stdout + out.stderr
    else:
        os.kill(pid, signal.SIGKILL)
    _wait(lambda: _processes(d).get(name, {}).get("state") in ("stopped", "fatal", "exited"),
          f"{name} to be down")


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_a_lane_moving_off_a_downed_replica_takes_its_slot_file_and_resumes_warm(tmp_path, how):
    s = Session(70)
    # A planned stop saves the lane before the server stops: no background saves here, so that save is the file.
    # After kill -9 the lane's background save, made while it sat idle, is all there is.
    with running(_config(tmp_path, idle=0 if how == "stop" else 0.2), tmp_path) as d:
        procs = _all_ready(d)
        src = _settle_on_one(d, s)
        dst = next(n for n in NAMES if n != src)
        if how == "stop":
            assert not _slot_files(d)
        else:
            _saved(d)
        _take_down(d, src, how, procs[src]["pid"])
        assert len(_saved(d)) == 1

        served, usage, rid = _turn(d, s)
        assert served == dst
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage
        warm = _wait(lambda: (w := _warm(d, dst))["restores"] == 1 and w, f"{dst}'s restore counted")
        assert warm["restores_not_taken"] == 0 and warm["restores_refused"] == 0, warm

        # The file now bears the new replica's name (its files are named by its key and its owner).
        trace = admin_get(_sock(d), f"/v1/requests/{rid}")
        assert trace, rid
        aff = trace["affinity"]
        assert aff["moved"]["from"] == src and aff["moved"]["tokens"] > 0, aff
        assert aff["slot_restore"]["outcome"] == "taken", aff
        text = _corectl(d, "explain", rid)
        assert text.returncode == 0, text.stderr
        assert f"its lane moves from {src}, which is not available" in text.stdout, text.stdout
        assert f"saved slot file moved from {src}" in text.stdout, text.stdout


@pytest.mark.parametrize("other", [{"ctx": str(CTX // 2)}, {"model": "other.gguf"}], ids=["context", "model"])
def test_a_slot_file_never_follows_its_lane_to_a_replica_of_another_context_or_model(tmp_path, other):
    s = Session(71)
    with running(_config(tmp_path, other=other), tmp_path) as d:
        procs = _all_ready(d)
        # The conversation's first turn goes to the replica expected to answer first; both are idle and equal,
        # so the profile's order decides: gpu1, the replica whose key gpu2 does not share.
        assert _settle_on_one(d, s) == "gpu1"
        files = _saved(d)
        _take_down(d, "gpu1", "stop", procs["gpu1"]["pid"])

        served, usage, rid = _turn(d, s)
        assert served == "gpu2"
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] < 0.5 * prompt, usage  # recomputed: nothing restored
        warm = _warm(d, "gpu2")
        assert warm["restores"] == 0 and warm["restores_refused"] == 0 and warm["restores_not_taken"] == 0, warm
        # gpu1's file is where it was, under its own name: nothing was renamed into gpu2's.
        assert files <= set(_slot_files(d)), (files, _slot_files(d))
        aff = (admin_get(_sock(d), f"/v1/requests/{rid}") or {})["affinity"]
        assert "moved" not in aff and aff.get("slot_restore") is None, aff


def test_a_replica_killed_under_a_turn_sends_its_lane_s_file_along_to_the_replica_that_serves_the_retry(tmp_path):
    """Issue 44 §2, "a killed server's lane", in a balance profile: the replica is killed -9 while it computes a
    turn (nothing of the answer reached the client). The request goes on to the other replica at once, and its
    lane's saved slot file (the background save made while the conversation sat idle) goes with it: the turn
    reads its prefix from the file there instead of recomputing it."""
    import re

    s = Session(72)
    config = _config(tmp_path, idle=0.2)
    with running(config, tmp_path) as d:
        procs = _all_ready(d)
        src = _settle_on_one(d, s)
        dst = next(n for n in NAMES if n != src)
        _saved(d)
        port = re.search(rf'\[providers\.{src}\]\nkind = "openai"\nbase_url = "http://127\.0\.0\.1:(\d+)/v1"', config)
        assert port, config
        answer = held_turn(d, port[1], s, at=src)
        os.kill(procs[src]["pid"], signal.SIGKILL)
        r = answer()
        assert r.status_code == 200, r.text
        assert r.headers["x-coderouter-provider"] == dst, r.headers
        usage = r.json()["usage"]
        prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
        assert usage["cache_read_input_tokens"] > 0.5 * prompt, usage
        aff = (admin_get(_sock(d), "/v1/requests/" + r.headers["x-request-id"]) or {})["affinity"]
        assert aff["moved"]["from"] == src and aff["slot_restore"]["outcome"] == "taken", aff
