"""What the admin API costs the daemon: ready time and resident memory before and after the first admin call.

Starts coderouterd on the embedded default (temporary state dir, free port, pinned to one core) N times. Per
run: ready = exec -> /healthz 200 (raw-socket polling); RSS idle = 2 s after ready; RSS after admin = after one
GET /v1/status over the Unix socket and 0.5 s of settling (the admin app is built when the proxy listens, so
the first call is where its imports have all been paid). Prints each run and the medians.
Usage: python bench/admin_cost.py [-n 5]"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, free_port, pin, rss_mb, stop, wait_healthz  # noqa: E402


class _Unix(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("coderouterd", timeout=10)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(self._path)


def admin_get(path: str, sock_path: str, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = _Unix(sock_path)
            conn.request("GET", path)
            resp = conn.getresponse()
            resp.read()
            conn.close()
            return resp.status
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def one_run(core: int) -> tuple[float, float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="admin-cost-"))
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state"),
           "CODEROUTER_ADMIN__SOCKET": str(tmp / "a.sock")}
    for k in ("CODEROUTER_CONFIG", "CODEROUTER_SOCKET"):
        env.pop(k, None)
    port = free_port()
    t0 = time.monotonic()
    d = subprocess.Popen([PY, "-m", "coderouterd", "--port", str(port)], cwd=tmp, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pin(d.pid, {core})
    try:
        wait_healthz(f"http://127.0.0.1:{port}", d)
        ready = time.monotonic() - t0
        time.sleep(2.0)
        idle = rss_mb(d.pid)
        status = admin_get("/v1/status", str(tmp / "a.sock"))
        if status != 200:
            raise SystemExit(f"/v1/status answered {status}")
        time.sleep(0.5)
        after = rss_mb(d.pid)
        return ready * 1000, idle, after
    finally:
        stop(d)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5, help="daemon starts (default 5)")
    ap.add_argument("--core", type=int, default=0, help="core the daemon is pinned to (default 0)")
    args = ap.parse_args()
    print(f"runs: {args.n}   cpus: {os.cpu_count()}   load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = [one_run(args.core) for _ in range(args.n)]
    for ready, idle, after in rows:
        print(f"ready {ready:7.0f} ms   RSS idle {idle:6.1f} MB   RSS after first admin call {after:6.1f} MB")
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    print(f"median: ready {med[0]:.0f} ms   RSS idle {med[1]:.1f} MB   RSS after first admin call {med[2]:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
