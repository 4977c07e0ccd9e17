"""Run the project's command-line tools (`python -m corectl ...`) the way subprocess.run(capture_output=True,
text=True) does, forked from the worker's zygote (tests/support/zygote.py) when it suits: a corectl start is
mostly imports, and the suite runs about two hundred of them."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.daemon import ROOT
from tests.support.zygote import zygote


def run_module(module: str, args: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT,
               timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", module, *args]
    z = zygote(ROOT)
    if z is None or not z.suits(env):
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="crt-cli-") as tmp:
        out, err = Path(tmp) / "out", Path(tmp) / "err"
        child = z.spawn(module, list(args), cwd=cwd, env=env, log=out, stderr=err)
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait(5)
            raise subprocess.TimeoutExpired(argv, timeout, out.read_bytes(), err.read_bytes()) from None
        return subprocess.CompletedProcess(argv, code, out.read_text(), err.read_text())


def corectl(args: list[str], *, env: dict[str, str] | None = None, cwd: Path = ROOT,
            timeout: float = 60) -> subprocess.CompletedProcess:
    return run_module("corectl", args, env=env, cwd=cwd, timeout=timeout)
