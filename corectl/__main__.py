"""`corectl` entry point (console script and `python -m corectl`)."""

from __future__ import annotations

import signal
import sys


def main(argv: list[str] | None = None) -> int:
    # Ctrl-C must always stop `-f` and `top`, even when corectl was started from a context that ignores
    # SIGINT (a background job of a non-interactive shell): Python keeps an inherited SIG_IGN otherwise.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = sys.argv[1:] if argv is None else argv
    from .fast import run as fast_run

    code = fast_run(args)
    if code is not None:
        return code
    from .app import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
