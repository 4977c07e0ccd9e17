"""Start the real coderouterd as a child process for end-to-end tests, and always stop it by its PID."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.zygote import Child, zygote

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaemonProcess:
    def __init__(self, config_text: str, tmp: Path, *, env: dict[str, str] | None = None,
                 port: int | None = None, fork: bool = True, root: Path = ROOT) -> None:
        """fork: start it from this worker's zygote (tests/support/zygote.py), with its libraries already
        imported; False for a test about how the daemon starts from nothing. `root`: the source tree it runs
        from (another revision's, for a bench that compares with it; never forked)."""
        self.tmp = tmp
        self.root = root
        self.fork = fork and root == ROOT
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.state_dir = tmp / "state"
        self.config_path = tmp / "config.toml"
        self.config_path.write_text(config_text.replace("{PORT}", str(self.port)))
        # XDG_CONFIG_HOME: the user's own ~/.config/coderouter/env (API keys) must not leak into tests.
        self.env = {**os.environ, "CODEROUTER_STATE_DIR": str(self.state_dir),
                    "XDG_CONFIG_HOME": str(tmp / "xdg-config"), **(env or {})}
        self.env.pop("CODEROUTER_CONFIG", None)
        self.proc: subprocess.Popen | Child | None = None
        self.log_path = tmp / "daemon.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # Generous: ready is usually a second away, but with the suite's workers and a real model sharing two cores
    # a start has taken over 15 s. Waiting longer costs nothing when it is quick.
    def start(self, timeout: float = 60.0) -> DaemonProcess:
        self._log = open(self.log_path, "ab")
        args = ["--config", str(self.config_path), "--port", str(self.port)]
        z = zygote(ROOT) if self.fork else None
        if z is not None and z.suits(self.env):
            self.proc = z.spawn("coderouterd", args, cwd=ROOT, env=self.env, log=self.log_path)
        else:
            self.proc = subprocess.Popen([sys.executable, "-m", "coderouterd", *args], cwd=self.root, env=self.env,
                                         stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"coderouterd exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=0.5).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"coderouterd did not become ready:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        self._log.close()
        return self.proc.returncode

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


@contextmanager
def running(config_text: str, tmp: Path, **kw) -> Iterator[DaemonProcess]:
    """A started daemon for the length of a `with` block, stopped by its PID however the block ends."""
    d = DaemonProcess(config_text, tmp, **kw).start()
    try:
        yield d
    finally:
        d.stop()


def admin_get(sock: str | Path, path: str = "/v1/status", timeout: float = 10.0) -> dict | None:
    """GET on a daemon's admin API over its Unix socket, from this process: the answer `corectl <command>
    --json` prints for the read-only commands (`status` is GET /v1/status verbatim), or None while the socket
    does not answer. For polling: a corectl process per poll costs ~0.7 s of CPU, and a test that asserts on
    corectl's output still calls corectl once, when the poll says the moment has come."""
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://coderouterd",
                          timeout=timeout) as c:
            r = c.get(path)
    except httpx.HTTPError:
        return None
    return r.json() if r.status_code == 200 else None
