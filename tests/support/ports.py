"""Ports a test relies on nothing answering.

A port taken from `free_port()` and released can be taken at once by any other process on the machine: another
test's fake, or the user's own coderouterd (our users run it while they run `make test`). A test that expects
"connection refused" there then reads someone else's answer (it happened: `dead:http_500` where the test expected
`dead:connect_error`). So a dead port is held for the life of the test process: bound, which keeps every other
socket off it (ours is bound without SO_REUSEADDR, so even a listener that sets it cannot share), and never
listening, so a connect to it is refused at once.
"""

from __future__ import annotations

import socket

_HELD: list[socket.socket] = []  # never closed: the port must stay dead until the process ends


def dead_port() -> int:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return s.getsockname()[1]
