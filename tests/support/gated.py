"""`python -m tests.support.gated GATE -- ARGV...`: wait until the file GATE exists, then become ARGV (exec: the
same pid). A server whose start the test holds open for as long as it needs, without a timing window."""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    gate, sep, *argv = sys.argv[1:]
    assert sep == "--" and argv
    while not os.path.exists(gate):
        time.sleep(0.02)
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
