"""The real llama.cpp `llama-server` and the real SmolLM2-135M model that `scripts/real_llama.sh` builds and
caches: where they are, and a server started straight (for baselines and the wire contract), always stopped
by its PID."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.daemon import ROOT, free_port

REAL = ROOT / "tests" / "real"
PATHS = REAL / ".paths"
UNAVAILABLE = REAL / ".unavailable"
# Threads for prompt processing and generation: one. This machine (and CI's) has two cores, shared with the rest
# of the suite; llama.cpp's threads wait for each other at every step by spinning, so when one is descheduled the
# other burns its core for nothing. Measured with the suite's load around it (bench/real_llama.py --scenario suite
# --restart): two threads 600 s and 397 s of CPU, one thread 166 s and 84 s, the same tokens reused.
THREADS = os.environ.get("CRT_LLAMA_THREADS", "1")


def paths() -> dict[str, str]:
    """{LLAMA_SERVER, LLAMA_MODEL, ...}, or skip with the reason the build could not be had."""
    if UNAVAILABLE.exists():
        pytest.skip("real llama-server unavailable: " + UNAVAILABLE.read_text().strip()[-300:])
    if not PATHS.exists():
        pytest.skip("real llama-server not built: run `make real-llama` (make test does)")
    out = {}
    for line in PATHS.read_text().splitlines():
        key, _, value = line.partition("=")
        out[key.strip()] = value.strip()
    if not Path(out.get("LLAMA_SERVER", "")).is_file() or not Path(out.get("LLAMA_MODEL", "")).is_file():
        pytest.skip(f"real llama-server build missing ({PATHS} names files that are gone): run `make real-llama`")
    return out


def server_argv(binary: str, model: str, port: int, *, slots: int, ctx_per_slot: int,
                save_dir: Path | None = None, extra: tuple[str, ...] = ()) -> list[str]:
    """The command line the tests and the managed-process config both use."""
    argv = [binary, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(slots * ctx_per_slot), "-t", THREADS, "-tb", THREADS, "--jinja", "--metrics",
            "--no-webui", "-lv", "1"]
    if save_dir is not None:
        argv += ["--slot-save-path", str(save_dir)]
    return argv + list(extra)


class LlamaServer:
    """One real llama-server, started straight from the test (no coderouterd)."""

    def __init__(self, tmp: Path, *, slots: int = 3, ctx_per_slot: int = 2048, save: bool = True,
                 extra: tuple[str, ...] = ()) -> None:
        p = paths()
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.save_dir = tmp / f"slots-{self.port}" if save else None
        if self.save_dir is not None:
            self.save_dir.mkdir(parents=True, exist_ok=True)
        self.argv = server_argv(p["LLAMA_SERVER"], p["LLAMA_MODEL"], self.port, slots=slots,
                                ctx_per_slot=ctx_per_slot, save_dir=self.save_dir, extra=extra)
        self.log_path = tmp / f"llama-{self.port}.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spawn(self) -> LlamaServer:
        """Start the process without waiting for its model to load."""
        self._log = open(self.log_path, "ab")  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        return self

    def start(self, timeout: float = 60.0) -> LlamaServer:
        self.spawn()
        self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"llama-server not ready in {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
