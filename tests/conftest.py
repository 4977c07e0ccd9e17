"""Suite-wide collection rules for parallel runs (pytest-xdist, `--dist loadgroup`; see docs/decisions.md).

- A module whose tests share a module-scoped fixture (a daemon, a real llama-server, fakes) is one xdist
  group: its tests run on one worker, in file order. Spread over workers, each worker would start the
  daemon or server again, and tests/real/test_real_llama.py relies on file order (its last test kills the
  server). Every other test is a unit of its own and goes to whichever worker is free: most e2e tests start
  their own daemon and fakes and share nothing.
- The real-server modules are collected first: they are the longest units of work (a real model on two
  cores), so they start at once and the shorter ones fill the other workers around them instead of leaving
  one worker alone on a real module at the end.

- The packages the suite starts as child processes (coderouterd, corectl, tests.fakes: a few hundred Python
  processes per run) are compiled to bytecode once, before any test. With PYTHONDONTWRITEBYTECODE set (as in
  many containers, and on the machine this suite is timed on) nothing else ever writes it, and every one of
  those processes compiled ~150 modules from source again: about 0.2 s of CPU each.

- Test directories live under a short base, /tmp/crt-<uid>/<pid>, instead of /tmp/pytest-of-<user>/pytest-<n>:
  xdist adds popen-gw<n>/ to every path, and a daemon's admin socket sits in its state directory, whose path
  must fit a Unix socket's 103 bytes (and corectl's tables show the config path). A run's directory is
  removed when it passed and kept when it failed, until a later run finds its process gone.

- Workers see the environment the run was started with. By the time xdist starts them, something in the
  controller has set COLUMNS and LINES (80x24) at the C level, which os.environ there does not show but a
  child process inherits; in a worker they are ordinary variables, copied into every corectl a test starts,
  and corectl then renders piped tables 80 columns wide instead of 140 (tests/e2e/test_control_plane.py).

- Rewritten test modules are kept as bytecode (sys.dont_write_bytecode is cleared in the test processes, not
  in the processes they start): a run after the first reads them instead of rewriting them in every worker.

- Every HTTP client a test makes shares one TLS context (tests/support/tls.py): building one per client, as
  httpx does, was 31% of the test processes' CPU, for TLS the suite never speaks.

- Hermetic: the run, and every process it starts, sees a private HOME and private XDG directories, and none of
  the user's CODEROUTER_* variables. Our users run coderouterd while they run `make test`: its socket, its
  discovery record (`coderouterd.last.json`, kept after it stops) and its config must never be what a test's
  corectl or daemon finds (a stale record once sent five tests to a dead daemon's config and shared DSN).
  Set in the controller before xdist starts the workers, which inherit it. tests/e2e/test_hermetic.py plants a
  running daemon and a stale record in a user's home and runs tests under it.

Without xdist (`-p no:xdist`, `-n 0`) the markers are inert and the order is the same minus the reordering
of directories, which no test depends on.
"""

from __future__ import annotations

import compileall
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.tls import share_default_contexts

ROOT = Path(__file__).resolve().parents[1]

share_default_contexts()  # in the controller and every worker; see tests/support/tls.py
# pytest keeps the test modules it rewrote (their asserts) as bytecode only when this process may write it: with
# PYTHONDONTWRITEBYTECODE set, every worker rewrote every test module on every run (~4 s of CPU each).
sys.dont_write_bytecode = False

# tests/clients/node_modules: the coding-agent CLIs, not Python.
SKIP = re.compile(r"node_modules")
# The order work is handed out in: the longest first.
FIRST = ("tests/real/", "tests/e2e/", "tests/integration/")


def _short_basetemp() -> Path:
    root = Path(tempfile.gettempdir()) / f"crt-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    if root.is_symlink() or root.stat().st_uid != os.getuid():
        raise pytest.UsageError(f"{root} is not a directory of this user's: remove it or pass --basetemp")
    for old in root.iterdir():  # runs that are over: their process is gone
        if old.name.isdigit() and not _alive(int(old.name)):
            shutil.rmtree(old, ignore_errors=True)
    return root / str(os.getpid())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.hookimpl(tryfirst=True)  # before the tmp_path plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did the rest before starting it
        for k, v in config.workerinput.get("user_terminal_env", {}).items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        return
    config.stash[_HOME] = _private_home()
    if config.option.basetemp is None:
        config.option.basetemp = str(_short_basetemp())
        config.stash[_OURS] = Path(config.option.basetemp)
    for package in ("coderouterd", "corectl", "tests"):
        # Up-to-date files are skipped (a stat each), so a run after the first costs a few milliseconds.
        # compileall writes whatever sys.dont_write_bytecode says; this process's own imports stay as they were.
        compileall.compile_dir(ROOT / package, quiet=1, rx=SKIP)


# Where the user's own coderouterd, its records and its configs live: pointed at a private directory per run.
_PRIVATE_DIRS = {"HOME": "home", "XDG_CONFIG_HOME": "home/.config", "XDG_STATE_HOME": "home/.local/state",
                 "XDG_DATA_HOME": "home/.local/share", "XDG_CACHE_HOME": "home/.cache", "XDG_RUNTIME_DIR": "run"}


def _private_home() -> Path:
    """A fresh HOME and XDG tree for this run, in the environment of this process and every one it starts."""
    root = Path(tempfile.mkdtemp(prefix="crt-home-"))
    for var, sub in _PRIVATE_DIRS.items():
        path = root / sub
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ[var] = str(path)
    for var in [v for v in os.environ if v.startswith("CODEROUTER_")]:
        del os.environ[var]
    return root


# The variables the controller's C environment gains behind os.environ's back (see above).
_TERMINAL_VARS = ("COLUMNS", "LINES")


@pytest.hookimpl(optionalhook=True)  # an xdist hook: unknown when xdist is not installed
def pytest_configure_node(node) -> None:  # in the controller, once per worker
    node.workerinput["user_terminal_env"] = {k: os.environ.get(k) for k in _TERMINAL_VARS}


_OURS = pytest.StashKey[Path]()
_HOME = pytest.StashKey[Path]()
_PASSED = pytest.StashKey[bool]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_PASSED] = exitstatus == 0


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
    ours = config.stash.get(_OURS, None)
    if ours is not None and config.stash.get(_PASSED, False):
        shutil.rmtree(ours, ignore_errors=True)


def _rank(nodeid: str) -> int:
    for i, prefix in enumerate(FIRST):
        if nodeid.startswith(prefix):
            return i
    return len(FIRST)


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs[-1].scope == "module" for defs in info.name2fixturedefs.values() if defs)


_REAL_CHAINS = frozenset({"tests/real/test_real_affinity.py", "tests/real/test_real_llama.py"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A stable sort: file order within a module, and module order within a directory, are kept.
    items.sort(key=lambda item: _rank(item.nodeid))
    for item in items:
        if item.nodeid.startswith("tests/real/"):
            # Three groups of real-server tests, each a chain on one worker: prefix routing, the clients through
            # the managed server, and the slot/KV-cache files with swaps. All of tests/real in one group was the
            # suite's critical path (~190 s of a ~250 s run). No test holds the daemon to a wall-clock window
            # any more (issue 36), so three small servers (one thread each, tests/support/real_llama.THREADS)
            # decoding beside the rest of the suite only make it slower, never wrong.
            module = item.nodeid.split("::", 1)[0]
            real = module if module in _REAL_CHAINS else "tests/real"
            item.add_marker(pytest.mark.xdist_group(real))
        elif _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
