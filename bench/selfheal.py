"""Self-healing benchmark: a managed backend crashes; how long until (a) a request is served by the fallback
provider, (b) the backend is back in rotation. The fake backend's own restart cost is measured separately.

    .venv/bin/python bench/selfheal.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, pct, stop, table, wait_healthz  # noqa: E402
from tests.fakes.runner import FakeServer  # noqa: E402

BODY = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def backend_start_cost(port: int) -> float:
    """exec -> ready_url 200 for the fake backend alone: the part of recovery that is the backend's, not ours."""
    t0 = time.monotonic()
    p = subprocess.Popen([PY, "-m", "tests.fakes", "--kind", "ollama", "--port", str(port)], cwd=ROOT,
                         stdout=subprocess.DEVNULL)
    try:
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/tags", timeout=0.2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                time.sleep(0.005)
    finally:
        stop(p)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    runs = ap.parse_args().runs
    port = free_port()
    start_costs = [backend_start_cost(port) for _ in range(3)]
    with FakeServer("openai", name="backup", record=False) as backup:
        cmd = [PY, "-m", "tests.fakes", "--kind", "ollama", "--port", str(port)]
        tmp = Path(tempfile.mkdtemp(prefix="crbench-"))
        dport = free_port()
        (tmp / "c.toml").write_text(f"""
[server]
port = {dport}
[health]
probe_interval_s = 5
recovery_backoff_s = [1, 2, 4]
[providers.local]
base_url = "http://127.0.0.1:{port}/v1"
[providers.local.process]
command = {cmd!r}
cwd = "{ROOT}"
ready_url = "http://127.0.0.1:{port}/api/tags"
startsecs = 0.2
max_restarts = 100
[providers.backup]
base_url = "{backup.url}/v1"
[profiles.default]
providers = ["local", "backup"]
""".replace("'", '"'))
        d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(tmp / "c.toml"), "--log-level", "warning"],
                             cwd=ROOT, env={**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state")})
        url = f"http://127.0.0.1:{dport}"
        failover, rejoin, errors = [], [], 0
        try:
            wait_healthz(url, d)
            with httpx.Client(timeout=10) as c:
                for _ in range(runs):
                    while c.post(url + "/v1/messages", json=BODY).headers.get("x-coderouter-provider") != "local":
                        time.sleep(0.02)
                    httpx.post(f"http://127.0.0.1:{port}/_fake/crash")
                    t0 = time.monotonic()
                    first_backup = None
                    while time.monotonic() - t0 < 60:
                        r = c.post(url + "/v1/messages", json=BODY)
                        if r.status_code != 200:
                            errors += 1
                        prov = r.headers.get("x-coderouter-provider")
                        if prov == "backup" and first_backup is None:
                            first_backup = time.monotonic() - t0
                        if prov == "local" and first_backup is not None:
                            rejoin.append(time.monotonic() - t0)
                            break
                        time.sleep(0.01)
                    failover.append(first_backup or float("nan"))
        finally:
            stop(d)
    rows = [
        ["fake backend start cost (exec → ready)", f"{pct(start_costs, 50) * 1000:.0f}", ""],
        ["crash → first request served by the fallback", f"{pct(failover, 50) * 1000:.1f}",
         f"{max(failover) * 1000:.1f}"],
        ["crash → backend back in rotation", f"{pct(rejoin, 50) * 1000:.0f}", f"{max(rejoin) * 1000:.0f}"],
        ["client-visible errors during the outages", str(errors), ""],
    ]
    print(table(rows, ["measure", "p50 (ms)", "max (ms)"]))
    print(f"\nconditions: {runs} crashes via POST /_fake/crash, a request every 10 ms, supervisor back-off 1 s "
          f"before the first restart, readiness polled from 0.1 s; loopback")
    return 0


if __name__ == "__main__":
    sys.exit(main())
