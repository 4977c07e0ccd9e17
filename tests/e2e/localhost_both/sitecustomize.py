"""For tests/e2e/test_pinned_connections.py only: on this directory's PYTHONPATH, a process resolves `localhost`
as a machine whose /etc/hosts names both loopback addresses does (most distributions': `::1 localhost` beside
`127.0.0.1 localhost`), ::1 first as glibc sorts them, whatever this machine's own resolver says. The daemon's
asyncio loop resolves through socket.getaddrinfo; uvloop's resolver would not, so uvloop is kept out."""

import socket
import sys

sys.modules["uvloop"] = None  # type: ignore[assignment]  # `import uvloop` raises ImportError: plain asyncio

_real = socket.getaddrinfo


def _getaddrinfo(host, port, family=0, type=0, proto=0, flags=0):
    if host not in ("localhost", b"localhost"):
        return _real(host, port, family, type, proto, flags)
    out = []
    if family in (0, socket.AF_INET6):
        out += _real("::1", port, socket.AF_INET6, type, proto, flags)
    if family in (0, socket.AF_INET):
        out += _real("127.0.0.1", port, socket.AF_INET, type, proto, flags)
    return out


socket.getaddrinfo = _getaddrinfo
