"""Shared benchmark plumbing: child processes pinned to cores, readiness, percentiles, tables."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
OPENAI_BODY = {"model": "bench-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 16}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(pid: int, cores: set[int]) -> None:
    try:
        avail = os.sched_getaffinity(0)
        cores = (cores & avail) or avail
        os.sched_setaffinity(pid, cores)
    except (AttributeError, OSError):
        pass


def start_fake(kind: str, behaviour: str = "ok", cores: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    p = subprocess.Popen([PY, "-m", "tests.fakes", "--kind", kind, "--port", str(port), "--behaviour", behaviour,
                          "--no-record", "--models", "bench-model"], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("READY"):
        p.kill()
        raise RuntimeError(f"fake {kind} did not start: {line!r}")
    if cores:
        pin(p.pid, cores)
    return p, f"http://127.0.0.1:{port}"


def _healthz_ok(host: str, port: int) -> bool:
    # A raw request: an HTTP client library would spend more time per poll than the daemon's start-up step.
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 200")
    except OSError:
        return False


def wait_healthz(url: str, proc: subprocess.Popen, timeout: float = 20.0) -> float:
    t0 = time.monotonic()
    hostport = url.split("//", 1)[1]
    host, port = hostport.rsplit(":", 1)
    while time.monotonic() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("daemon exited during start")
        if _healthz_ok(host, int(port)):
            return time.monotonic() - t0
        time.sleep(0.002)
    raise RuntimeError("daemon not ready")


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def rss_mb(pid: int) -> float:
    import psutil

    return psutil.Process(pid).memory_info().rss / (1024 * 1024)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    body = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    return "\n".join([line, sep, *body])


def wait_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port}")


def write_config(tmp: Path, oa_url: str, an_url: str, oa_stream_url: str, state: bool) -> Path:
    cfg = f"""
[server]
port = 0
[state]
enabled = {"true" if state else "false"}
[providers.oa]
kind = "openai"
base_url = "{oa_url}/v1"
model = "bench-model"
[providers.oastream]
kind = "openai"
base_url = "{oa_stream_url}/v1"
model = "bench-model"
[providers.an]
kind = "anthropic"
base_url = "{an_url}/v1"
[profiles.default]
providers = ["oa"]
[profiles.stream]
providers = ["oastream"]
[profiles.pass]
providers = ["an"]
"""
    p = tmp / "bench.toml"
    p.write_text(cfg)
    return p


def start_edge_fakes(tmp: Path) -> tuple[list[subprocess.Popen], Path]:
    """The fakes behind the edge scenarios (OpenAI, OpenAI streamed in 20 chunks, Anthropic), pinned to core 1,
    and a config naming them with state enabled: the setup edge_ab.py and stages.py share."""
    oa, oa_url = start_fake("openai", "ok", {1})
    oas, oas_url = start_fake("openai", "chunks;n=20", {1})
    an, an_url = start_fake("anthropic", "ok", {1})
    return [oa, oas, an], write_config(tmp, oa_url, an_url, oas_url, state=True)


def edge_scenarios(claude: bytes) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """name -> (path, body, headers): a small OpenAI request, and Claude Code's body translated to OpenAI and
    passed through to Anthropic (profile "pass" of write_config)."""
    import orjson

    jh = {"content-type": "application/json"}
    ah = {**jh, "anthropic-version": "2023-06-01"}
    kb = len(claude) // 1024
    return {
        "a) OpenAI→OpenAI": ("/v1/chat/completions", orjson.dumps(OPENAI_BODY), jh),
        f"b) Anthropic→OpenAI {kb} KB": ("/v1/messages", claude, ah),
        f"c) Anthropic passthrough {kb} KB": ("/v1/messages", claude, {**ah, "x-coderouter-profile": "pass"}),
    }


def start_ingress_pair(tmp: Path, procs: list) -> tuple[str, Any]:
    """The setup bench/responses.py and bench/gemini.py share: fast fakes (OpenAI and Anthropic, whole and in 20
    chunks) on core 1, and coderouterd on core 0 with one profile each (default, stream, an, anstream). Every
    process started goes into `procs` (the caller stops them). Returns the proxy's URL and the daemon's
    psutil.Process (its CPU time per request)."""
    import psutil

    oa, oa_url = start_fake("openai", "ok", {1})
    oas, oas_url = start_fake("openai", "chunks;n=20", {1})
    an, an_url = start_fake("anthropic", "ok", {1})
    ans, ans_url = start_fake("anthropic", "chunks;n=20", {1})
    procs += [oa, oas, an, ans]
    cfg = tmp / "bench.toml"
    cfg.write_text(f"""
[server]
port = 0
[providers.oa]
base_url = "{oa_url}/v1"
model = "bench-model"
[providers.oastream]
base_url = "{oas_url}/v1"
model = "bench-model"
[providers.an]
kind = "anthropic"
base_url = "{an_url}/v1"
model = "bench-model"
[providers.anstream]
kind = "anthropic"
base_url = "{ans_url}/v1"
model = "bench-model"
[profiles.default]
providers = ["oa"]
[profiles.stream]
providers = ["oastream"]
[profiles.an]
providers = ["an"]
[profiles.anstream]
providers = ["anstream"]
""")
    port = free_port()
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state")}
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg), "--port", str(port),
                          "--log-level", "warning"], cwd=ROOT, env=env)
    procs.append(d)
    pin(d.pid, {0})
    proxy = f"http://127.0.0.1:{port}"
    wait_healthz(proxy, d)
    time.sleep(0.5)
    return proxy, psutil.Process(d.pid)
