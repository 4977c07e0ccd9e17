"""The long hostile-input run: 25,000+ fuzzed bodies (tests/support/hostile.py) over every model ingress and
both upstream wires, against the real daemon; plus slow and oversized connections mixed in. Reports 5xx,
wrong error shapes, hangs (no answer within 30 s), crashes, and the daemon's RSS and open fds before/after.

    .venv/bin/python bench/fuzz.py [--cases 25000] [--seed 1] [--tree OTHER_CHECKOUT]

--tree runs another checkout's daemon (e.g. the commit before the edge guards) with the same generator.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, start_fake, wait_healthz  # noqa: E402
from tests.support.hostile import INGRESSES, check_response, hostile_body  # noqa: E402

CONFIG = """
[server]
port = {port}
max_body_mb = 4
{limits}
[state]
dir = "{state}"

[providers.oa]
kind = "openai"
base_url = "{oa}/v1"
capabilities = {{ vision = true }}

[providers.an]
kind = "anthropic"
base_url = "{an}/v1"
capabilities = {{ vision = true }}

[profiles.default]
providers = ["oa"]

[profiles.cloud]
providers = ["an"]
"""


def rss_kb(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def hostile_connections(port: int) -> Counter:
    """A few of each kind of misbehaving connection; what came back for each."""
    out: Counter = Counter()

    def raw(payload: bytes, wait: float = 5.0) -> bytes:
        s = socket.create_connection(("127.0.0.1", port), timeout=wait)
        try:
            if payload:
                s.sendall(payload)
            data = b""
            while True:
                try:
                    chunk = s.recv(65536)
                except (TimeoutError, ConnectionResetError):
                    break
                if not chunk:
                    break
                data += chunk
            return data
        finally:
            s.close()

    for _ in range(5):
        out["oversized header -> " + raw(b"GET / HTTP/1.1\r\nx: " + b"a" * 200_000 + b"\r\n\r\n")[:12].decode()] += 1
        out["slow head -> " + raw(b"POST /v1/messages HTTP/1.1\r\n")[:12].decode()] += 1
        out["short body -> " + raw(b"POST /v1/messages HTTP/1.1\r\ncontent-length: 99\r\n\r\n{")[:12].decode()] += 1
        out["idle -> " + (raw(b"")[:12].decode() or "closed")] += 1
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cases", type=int, default=25_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--ingress", action="append", choices=sorted(INGRESSES), help="only these (repeatable)")
    ap.add_argument("--tree", default=None, help="another checkout whose daemon to run (no limit keys in its config)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="crfuzz-"))
    oa, oa_url = start_fake("openai")
    an, an_url = start_fake("anthropic")
    port = free_port()
    cfg = tmp / "config.toml"
    tree = Path(args.tree).resolve() if args.tree else ROOT
    limits = "" if args.tree else "header_timeout_s = 2\nbody_timeout_s = 2\n"
    cfg.write_text(CONFIG.format(port=port, state=tmp / "state", oa=oa_url, an=an_url, limits=limits))
    log = open(tmp / "daemon.log", "wb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["PYTHONPATH"] = str(tree)
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg)], cwd=tree, env=env, stdout=log,
                         stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthz(url, d)
        client = httpx.Client(base_url=url, timeout=30)
        # Warm up (lazy imports, pools) so "before" is the serving state, not the cold start.
        for ingress in INGRESSES.values():
            client.post(ingress[0], json=ingress[2])
        rss0, fd0 = rss_kb(d.pid), fds(d.pid)
        statuses: Counter = Counter()
        bad: list[str] = []
        chosen = {k: v for k, v in INGRESSES.items() if not args.ingress or k in args.ingress}
        per = args.cases // len(chosen) + 1
        t0 = time.monotonic()
        def make_run(name: str, path: str, shape: str, base: dict):
            @seed(args.seed)
            @settings(max_examples=per, deadline=None, database=None, suppress_health_check=list(HealthCheck))
            @given(body=hostile_body(base), profile=st.sampled_from(["default", "cloud"]))
            def run(body: bytes, profile: str) -> None:
                nonlocal_counts["total"] += 1
                try:
                    r = client.post(path, content=body, headers={"x-coderouter-profile": profile,
                                                                 "content-type": "application/json"})
                except httpx.TimeoutException:
                    nonlocal_counts["hangs"] += 1
                    return
                statuses[(name, r.status_code)] += 1
                problem = check_response(r.status_code, r.headers, r.content, shape)
                if problem:
                    bad.append(f"{name}/{profile}: {problem} body={body[:300]!r}")

            return run

        nonlocal_counts = {"total": 0, "hangs": 0}
        for name, (path, shape, base) in chosen.items():
            make_run(name, path, shape, base)()
            print(f"{name}: done ({nonlocal_counts['total']} cases so far, {time.monotonic() - t0:.0f} s)",
                  flush=True)
        total, hangs = nonlocal_counts["total"], nonlocal_counts["hangs"]
        conns = hostile_connections(port)
        healthy = client.get("/healthz").status_code == 200
        time.sleep(1.0)
        rss1, fd1 = rss_kb(d.pid), fds(d.pid)
        elapsed = time.monotonic() - t0
        crashed = d.poll() is not None
    finally:
        if d.poll() is None:
            d.terminate()
            d.wait(15)
        for p in (oa, an):
            p.terminate()
            p.wait(5)
    fivexx = sum(n for (_, s), n in statuses.items() if s >= 500)
    print(f"\ncases: {total} in {elapsed:.0f} s; 5xx: {fivexx}; wrong error shape or 5xx: {len(bad)}; "
          f"hangs: {hangs}; crashed: {crashed}; /healthz after: {'200' if healthy else 'FAILED'}")
    print(f"daemon RSS {rss0 / 1024:.1f} MB -> {rss1 / 1024:.1f} MB; open fds {fd0} -> {fd1}")
    by_ingress: dict[str, Counter] = {}
    for (name, s), n in statuses.items():
        by_ingress.setdefault(name, Counter())[s] += n
    for name, c in sorted(by_ingress.items()):
        print(f"  {name:13s} " + ", ".join(f"{s}: {n}" for s, n in sorted(c.items())))
    print("hostile connections: " + "; ".join(f"{k} x{n}" for k, n in sorted(conns.items())))
    for line in bad[:10]:
        print("BAD", line)
    errors = [ln for ln in (tmp / "daemon.log").read_text(errors="replace").splitlines() if " ERROR " in ln]
    print(f"daemon ERROR lines: {len(errors)}")
    for ln in errors[:5]:
        print("  ", ln[:200])
    return 1 if bad or hangs or crashed or not healthy else 0


if __name__ == "__main__":
    sys.exit(main())
