"""The soft open-files limit is raised at start-up where the hard limit allows (launchd starts agents at 256),
and the connection cap follows what the limit carries."""

from __future__ import annotations

import resource
import subprocess
import sys

from coderouterd.serve import connections_for_fds

CODE = """
import logging, resource
logging.basicConfig(level=logging.INFO)
from coderouterd.serve import raise_fd_limit
print(raise_fd_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""


def _low_soft_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))


def test_soft_limit_is_raised_and_logged():
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, preexec_fn=_low_soft_limit,
                       timeout=60)
    reported, actual = map(int, r.stdout.split())
    assert reported == actual
    expected = 65_536 if hard == resource.RLIM_INFINITY else min(hard, 65_536)
    assert actual == expected and actual > 256
    assert f"open files limit: {actual}" in r.stderr


def test_connection_cap_fits_the_descriptor_limit():
    assert connections_for_fds(256) == (256 - 100) * 4 // 9  # 69: launchd's default without raising
    assert connections_for_fds(65_536) > 20_000
    assert connections_for_fds(0) is None
