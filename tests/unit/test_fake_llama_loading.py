"""The fake llama-server run as a managed process (`python -m tests.fakes --kind llamacpp`) can load slowly, as the
real one does: `--start-delay` holds its bind, `--loading S` answers 503 "Loading model" that long after it (the
real server's shape of that answer is held by tests/real/test_llama_contract.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx

from tests.support.daemon import ROOT


def test_a_managed_fake_llama_server_answers_loading_then_ok():
    proc = subprocess.Popen([sys.executable, "-m", "tests.fakes", "--kind", "llamacpp", "--port", "0",
                             "--loading", "3", "-np", "2", "-c", "2048"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout is not None else ""
        assert line.startswith("READY "), line
        url = f"http://127.0.0.1:{line.split()[1]}"
        first = httpx.get(url + "/health", timeout=10)
        assert (first.status_code, first.json()) == (503, {"error": {"code": 503, "message": "Loading model",
                                                                     "type": "unavailable_error"}})
        deadline = time.monotonic() + 60
        while (r := httpx.get(url + "/health", timeout=10)).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)
        props = httpx.get(url + "/props", timeout=10).json()
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 1024
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
