"""How long `corectl status` takes from process start to exit, against a real daemon.

Starts coderouterd on the embedded default (temporary state dir, free port), then runs `corectl status`
(Rich tables) and `corectl status --json` N times each as fresh processes and prints median and p90.
Target: median <= 250 ms. Usage: python bench/corectl_status.py [-n 20]"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def corectl_argv() -> list[str]:
    script = Path(sys.executable).with_name("corectl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "corectl"]


def wait_ready(argv: list[str], env: dict, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"coderouterd exited with {proc.returncode}")
        if subprocess.run(argv + ["status", "--json"], env=env, capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise SystemExit("coderouterd did not become ready")


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure(argv: list[str], env: dict, n: int) -> tuple[list[float], list[float]]:
    """Wall time and CPU time (user + sys) per run, in ms. CPU time barely moves with machine load, so it
    shows what a quiet machine would see when the wall figures are inflated by other work."""
    wall, cpu = [], []
    for _ in range(n):
        c0 = _children_cpu()
        t0 = time.perf_counter()
        r = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((_children_cpu() - c0) * 1000)
        if r.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.decode()}")
    return wall, cpu


def p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(0.9 * (len(s) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=20, help="runs per variant (default 20)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="corectl-bench-"))
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state")}
    for k in ("CODEROUTER_CONFIG", "CODEROUTER_SOCKET"):
        env.pop(k, None)
    daemon = subprocess.Popen([sys.executable, "-m", "coderouterd", "--port", str(free_port())], cwd=tmp,
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        argv = corectl_argv()
        wait_ready(argv, env, daemon)
        print(f"corectl: {' '.join(argv)}   runs: {args.n}   cpus: {os.cpu_count()}   "
              f"load: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"{'command':<24} {'median ms':>10} {'p90 ms':>8} {'min ms':>8} {'cpu median ms':>14}")
        for label, extra in (("corectl status", ["status"]), ("corectl status --json", ["status", "--json"])):
            wall, cpu = measure(argv + extra, env, args.n)
            print(f"{label:<24} {statistics.median(wall):>10.1f} {p90(wall):>8.1f} {min(wall):>8.1f} "
                  f"{statistics.median(cpu):>14.1f}")
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait(5)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
