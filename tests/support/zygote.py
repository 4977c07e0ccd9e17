"""A parent for the daemons the suite starts, with the libraries they import already loaded.

Most of a coderouterd start is importing its dependencies (aiohttp, pydantic and pydantic-settings, FastAPI,
uvicorn: ~0.5 s of CPU of a ~0.8 s start), and the suite starts about two hundred daemons on two cores. One
zygote per test worker imports those libraries once, single-threaded, then forks a child per daemon; the child
takes the daemon's environment, working directory and log, and runs `python -m coderouterd ARGS` exactly as
the interpreter would (runpy, as `-m` does). coderouterd's and corectl's own modules are loaded too (their
`__main__` runs in the child). They compute nothing per process at import but the id prefix, which
coderouterd.ids renews after a fork; what reads the environment (config, paths, the terminal) does so when the
child runs. The libraries' per-process state is reset by their own fork hooks (random reseeds itself), and what
the zygote loaded is frozen out of the collector's reach (gc.freeze).

The child is the zygote's, not the test's: the zygote reaps it and reports its exit status, and `Child` gives
the test the part of `subprocess.Popen` it uses (pid, poll, wait, returncode). Tests about how the daemon
starts from nothing (first run, a second daemon, the installed command) keep the real `exec` path, and any
start with an interpreter setting the zygote was not started with (PYTHONPATH, ...) falls back to it.

    python -m tests.support.zygote FD     # FD: this end of a socket pair to the test worker
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import pkgutil
import select
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

# What a daemon imports from outside coderouterd on its way to ready, the heaviest first.
PRELOAD = (
    "aiohttp", "aiohttp.client", "aiohttp.web", "pydantic", "pydantic_settings", "fastapi", "fastapi.responses",
    "starlette.routing", "uvicorn", "uvicorn.config", "uvicorn.server", "uvicorn.main",
    "uvicorn.protocols.http.httptools_impl", "uvicorn.protocols.http.h11_impl", "uvicorn.lifespan.on",
    "uvicorn.loops.auto", "uvicorn.loops.uvloop", "uvloop", "httptools", "prometheus_client", "orjson", "psutil",
    "watchfiles", "platformdirs", "dotenv", "httpx", "anyio", "asyncio", "sqlite3", "ssl", "concurrent.futures",
    "email.utils", "http.cookies", "zoneinfo", "uuid", "decimal", "statistics", "tomllib", "argparse", "logging",
    "logging.handlers", "tempfile", "shutil", "ctypes",
    # corectl's (its fast path: Typer is imported only for the rest, in the child)
    "rich.console", "rich.table", "rich.text", "rich.markup", "rich.panel",
)
# Interpreter settings read at start-up, before any code runs: a child asked for with different ones than the
# zygote's is started the ordinary way.
INTERPRETER_VARS = ("PYTHONPATH", "PYTHONHOME", "PYTHONHASHSEED", "PYTHONOPTIMIZE", "PYTHONDONTWRITEBYTECODE",
                    "PYTHONSAFEPATH", "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONUTF8",
                    "PYTHONNOUSERSITE", "PYTHONIOENCODING", "PYTHONUNBUFFERED", "PYTHONFAULTHANDLER",
                    "PYTHONTRACEMALLOC", "PYTHONPYCACHEPREFIX", "PYTHONNODEBUGRANGES")


# -- the zygote process ------------------------------------------------------------------------------------------


def _preload() -> None:
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    # Then every module of the two programs (their __main__ is run by the child): ~0.14 s of a daemon's start,
    # a fifth of its CPU in the suite. Nothing in them computes per-process state at import but the id prefix,
    # which coderouterd.ids renews in every forked child.
    for package in ("coderouterd", "corectl"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, package + "."):
            if not info.name.endswith(".__main__"):
                importlib.import_module(info.name)


def _become(req: dict) -> None:
    """In the forked child: take the daemon's environment, files and arguments, then run it as `-m` would.
    Never returns: the daemon's SystemExit unwinds to the interpreter, which exits as after `python -m`."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.path[0] = req["cwd"]  # as `python -m` run from that directory
    sys.argv = ["-m", *req["args"]]
    import runpy

    runpy.run_module(req["module"], run_name="__main__", alter_sys=True)
    sys.exit(0)


def serve(fd: int) -> None:
    _preload()
    # What the zygote loaded lives as long as every child: freezing it keeps the daemon's start-up collection
    # (coderouterd/interpreter.py) from walking it again in each child, 13% of a forked daemon's CPU.
    gc.freeze()
    assert threading.active_count() == 1, "the zygote must fork from a single thread"
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    buf = b""
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            os.read(wake_r, 4096)
        for pid in list(children):  # reap every child that ended, and say how
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                sock.sendall(json.dumps({"exit": pid, "code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
        if sock not in ready:
            continue
        data = sock.recv(65536)
        if not data:  # the test worker is gone: so is the zygote (its daemons are stopped by the tests)
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            req = json.loads(line)
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                sock.close()
                os.close(wake_r)
                os.close(wake_w)
                _become(req)
            children.add(pid)
            sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")


# -- the test worker's side --------------------------------------------------------------------------------------


class Child:
    """A daemon forked by the zygote: the part of subprocess.Popen the tests use."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]) -> None:
        self._zygote = zygote
        self.pid = pid
        self.args = args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            code = self._zygote.exit_code(self.pid, timeout)
            if code is None:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self.returncode = code
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """This worker's zygote, started on first use and ended with the worker (its end of the socket closes)."""

    def __init__(self, root: Path) -> None:
        ours, theirs = socket.socketpair()
        self.env = dict(os.environ)
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.zygote", str(theirs.fileno())],
                                     cwd=root, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        theirs.close()
        self._sock = ours
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._pids: list[int] = []
        self._exits: dict[int, int] = {}
        self._gone = False
        threading.Thread(target=self._read, name="zygote-reader", daemon=True).start()
        atexit.register(self.close)

    def close(self) -> None:
        """End the zygote (it exits when its end of the socket closes) and reap it, so its CPU time and its
        children's count in this process's, as a daemon started directly would."""
        self._sock.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self._sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                with self._cond:
                    self._gone = True
                    self._cond.notify_all()
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                with self._cond:
                    if "pid" in msg:
                        self._pids.append(msg["pid"])
                    else:
                        self._exits[msg["exit"]] = msg["code"]
                    self._cond.notify_all()

    def suits(self, env: dict[str, str]) -> bool:
        """Whether a child with this environment starts as it would from `python` itself."""
        return all(env.get(k) == self.env.get(k) for k in INTERPRETER_VARS)

    def spawn(self, module: str, args: list[str], *, cwd: Path, env: dict[str, str], log: Path,
              stderr: Path | None = None) -> Child:
        """`python -m module args` in cwd with env; stdout to log, stderr too unless given its own file."""
        req = {"module": module, "args": args, "cwd": str(cwd), "env": env, "stdout": str(log),
               "stderr": str(stderr or log)}
        with self._lock:  # one request at a time, so the pid that comes back is this one's
            with self._cond:
                self._pids.clear()
            self._sock.sendall(json.dumps(req).encode() + b"\n")
            with self._cond:
                if not self._cond.wait_for(lambda: self._pids or self._gone, timeout=30) or not self._pids:
                    raise RuntimeError(f"the zygote did not start {module}: {self.proc.poll()=}")
                pid = self._pids.pop()
        return Child(self, pid, [sys.executable, "-m", module, *args])

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._gone, timeout=timeout)
            return self._exits.get(pid)


_zygote: Zygote | None = None
_zygote_lock = threading.Lock()


def zygote(root: Path) -> Zygote | None:
    """This process's zygote, or None where forking is not how this platform starts processes well."""
    global _zygote
    if sys.platform != "linux" or os.environ.get("CRT_NO_ZYGOTE"):
        return None
    with _zygote_lock:
        if _zygote is None or _zygote.proc.poll() is not None:
            _zygote = Zygote(root)
        return _zygote


if __name__ == "__main__":
    serve(int(sys.argv[1]))
