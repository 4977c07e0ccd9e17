"""`corectl top` under a real pseudo-terminal against the real daemon: live figures appear on the screen and
follow new traffic, q (or Ctrl-C) quits at once with status 0, and the terminal is restored."""

from __future__ import annotations

import os
import pty
import re
import sys
import termios
import threading
import time

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.daemon import ROOT, DaemonProcess, running
from tests.support.wait import wait_for

ANSI = re.compile(rb"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>78])")


class Screen:
    """corectl top running on the slave side of a pty; everything it draws is collected from the master."""

    def __init__(self, sock: str, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
        env.update(CODEROUTER_SOCKET=sock, TERM="xterm-256color", COLUMNS="160", LINES="60")
        argv = [sys.executable, "-m", "corectl", "top", *args]
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: exec at once, nothing else (the parent has threads)
            os.chdir(ROOT)
            os.execve(sys.executable, argv, env)
        self.raw = bytearray()
        self.status: int | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 65536)
            except OSError:  # EIO once the child has exited and the slave is closed
                return
            if not data:
                return
            self.raw += data

    def text(self) -> str:
        return ANSI.sub(b"", bytes(self.raw)).decode("utf-8", "replace")

    def frame(self) -> str:
        """The last complete frame drawn (each one starts with the header line)."""
        text = self.text()
        frames = text.split("(q or Ctrl-C quits)")
        return frames[-2] if len(frames) > 2 else text

    def wait_text(self, pred, timeout: float = 30.0) -> str:  # a ceiling, not a measure
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            f = self.frame()
            if pred(f):
                return f
            time.sleep(0.1)
        raise AssertionError(f"screen never matched; last frame:\n{self.frame()}")

    def send(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait_exit(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            time.sleep(0.02)
        return None

    def close(self) -> None:
        if self.status is None and self.wait_exit(0) is None:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        self._reader.join(2)
        os.close(self.fd)


@pytest.fixture
def daemon(tmp_path):
    with FakeServer("openai", name="a") as a, FakeServer("openai", name="b") as b:
        cfg = f"""
[server]
port = {{PORT}}
[providers.alpha]
base_url = "{a.url}/v1"
[providers.beta]
base_url = "{b.url}/v1"
[profiles.default]
providers = ["alpha", "beta"]
[profiles.reverse]
providers = ["beta", "alpha"]
"""
        with running(cfg, tmp_path) as d:
            yield d


def send(d: DaemonProcess, n: int, profile: str = "default") -> list[str]:
    ids = []
    for _ in range(n):
        r = httpx.post(d.url + "/v1/chat/completions", timeout=10, headers={"x-coderouter-profile": profile},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 200
        ids.append(r.headers["x-request-id"])
    return ids


def provider_row(frame: str, name: str) -> list[str] | None:
    for line in frame.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 8 and cells[1] == name:
            return cells[1:-1]
    return None


def test_top_shows_live_figures_and_quits_on_q(daemon):
    sock = str(daemon.state_dir / "coderouterd.sock")
    first = send(daemon, 3)
    screen = Screen(sock, "--interval", "0.5")
    try:
        frame = screen.wait_text(lambda f: first[-1] in f and "Effective order" in f)
        # While it runs, the terminal is in cbreak mode: no line buffering, no echo.
        lflag = termios.tcgetattr(screen.fd)[3]
        assert not lflag & termios.ICANON and not lflag & termios.ECHO
        assert "alpha > beta" in frame and "beta > alpha" in frame  # effective order per profile
        row = provider_row(frame, "alpha")
        assert row is not None, frame
        # Provider, Breaker, Health, Req/s, p50 latency, p50 TTFB, Reqs, Errors
        assert row[1] == "closed" and row[6] == "3" and row[7] == "0"
        assert float(row[3]) > 0 and row[4].endswith("ms") and row[5].endswith("ms")

        later = send(daemon, 2, profile="reverse")
        frame = screen.wait_text(lambda f: later[-1] in f)
        assert provider_row(frame, "beta")[6] == "2"
        assert provider_row(frame, "alpha")[6] == "3"
        assert "beta ok" in frame  # the route of the newest requests
        assert "req/s" in frame and "spend this month" in frame

        screen.send(b"q")
        assert screen.wait_exit(30.0) == 0  # a ceiling against a hang, not a measure of how quickly
        lflag = termios.tcgetattr(screen.fd)[3]
        assert lflag & termios.ICANON and lflag & termios.ECHO  # the terminal is restored
        # and it left the alternate screen (the reader thread may not have taken the last bytes in yet)
        assert wait_for(lambda: b"\x1b[?1049l" in screen.raw, 10)
    finally:
        screen.close()


def test_top_quits_cleanly_on_ctrl_c(daemon):
    sock = str(daemon.state_dir / "coderouterd.sock")
    screen = Screen(sock)
    try:
        screen.wait_text(lambda f: "no requests yet" in f)
        screen.send(b"\x03")  # the line discipline turns it into SIGINT for the foreground group
        assert screen.wait_exit(30.0) == 0
        assert termios.tcgetattr(screen.fd)[3] & termios.ICANON
    finally:
        screen.close()
