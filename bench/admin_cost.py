"""What the admin API costs the daemon: ready time, admin-ready time and resident memory.

Starts coderouterd on the embedded default (temporary state dir, free port, pinned to one core) N times. Per
run: ready = exec -> /healthz 200 (raw-socket polling, 2 ms); admin = exec -> first GET /v1/status 200 over
the Unix socket (polled right after ready; the admin app is built once the proxy listens); RSS = resident
memory 2 s after that first admin call, when every import the admin API needs has been paid.
--tree runs another checkout's daemon as well, alternating with this one's run by run (same conditions).
Usage: python bench/admin_cost.py [-n 5] [--tree OTHER_CHECKOUT]"""

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
    """The status of GET `path` over the socket, retried until the socket answers."""
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
            time.sleep(0.002)


def one_run(core: int, tree: Path | None = None) -> tuple[float, float, float]:
    tmp = Path(tempfile.mkdtemp(prefix="admin-cost-"))
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state"),
           "CODEROUTER_ADMIN__SOCKET": str(tmp / "a.sock")}
    for k in ("CODEROUTER_CONFIG", "CODEROUTER_SOCKET"):
        env.pop(k, None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    port = free_port()
    t0 = time.monotonic()
    d = subprocess.Popen([PY, "-m", "coderouterd", "--port", str(port)], cwd=tmp, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pin(d.pid, {core})
    try:
        wait_healthz(f"http://127.0.0.1:{port}", d)
        ready = time.monotonic() - t0
        status = admin_get("/v1/status", str(tmp / "a.sock"))
        admin = time.monotonic() - t0
        if status != 200:
            raise SystemExit(f"/v1/status answered {status}")
        time.sleep(2.0)
        return ready * 1000, admin * 1000, rss_mb(d.pid)
    finally:
        stop(d)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=5, help="daemon starts (default 5)")
    ap.add_argument("--core", type=int, default=0, help="core the daemon is pinned to (default 0)")
    ap.add_argument("--tree", default=None, help="another checkout to compare with, run by run")
    args = ap.parse_args()
    print(f"runs: {args.n}   cpus: {os.cpu_count()}   load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    trees = {"this": None}
    if args.tree:
        trees["other"] = Path(args.tree).resolve()
    rows: dict[str, list] = {label: [] for label in trees}
    for _ in range(args.n):
        for label, tree in trees.items():
            ready, admin, rss = one_run(args.core, tree)
            rows[label].append((ready, admin, rss))
            print(f"{label:5} ready {ready:6.0f} ms   admin {admin:6.0f} ms   RSS after first admin call {rss:5.1f} MB")
    for label, runs in rows.items():
        med = [statistics.median(col) for col in zip(*runs, strict=True)]
        print(f"{label:5} median: ready {med[0]:.0f} ms   admin {med[1]:.0f} ms   "
              f"RSS after first admin call {med[2]:.1f} MB")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
