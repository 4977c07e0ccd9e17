"""One TLS client context per test process instead of one per HTTP client.

Every httpx client (and the anthropic and openai SDKs', built on httpx and httpx2) calls
`ssl.create_default_context()` when it is made, which parses the system's CA bundle: ~55 ms of CPU here, for
a context the suite never uses (its traffic is plain HTTP over loopback and Unix sockets). The tests and their
helpers make thousands of clients (a wait loop polling with `httpx.get` makes one per poll), and a profile of
a whole run (py-spy over the workers) put 31% of the test processes' CPU in that one call.

`share_default_contexts()` makes `ssl.create_default_context` (and httpcore2's `default_ssl_context`, which
httpx2 calls instead when SSL_CERT_FILE is unset) return one context per set of arguments for the rest of the
process. Nothing in the suite changes a context it was given; the product's own code never runs
in a test process that talks TLS."""

from __future__ import annotations

import ssl
import threading
from typing import Any

_made: dict[tuple, ssl.SSLContext] = {}
_lock = threading.RLock()  # httpcore2's builder calls create_default_context under it
_original = ssl.create_default_context


def _shared(purpose: Any = ssl.Purpose.SERVER_AUTH, *, cafile: Any = None, capath: Any = None,
            cadata: Any = None) -> ssl.SSLContext:
    key = (purpose, cafile, capath, cadata)
    with _lock:
        ctx = _made.get(key)
        if ctx is None:
            ctx = _made[key] = _original(purpose, cafile=cafile, capath=capath, cadata=cadata)
        return ctx


def share_default_contexts() -> None:
    ssl.create_default_context = _shared
    try:  # httpx2 (the anthropic SDK's) builds its context itself when SSL_CERT_FILE/SSL_CERT_DIR are unset
        import httpcore2
    except ImportError:
        return
    original = httpcore2.default_ssl_context
    made: dict[bool, ssl.SSLContext] = {}

    def shared(*, _trust_env: bool = True) -> ssl.SSLContext:
        with _lock:
            if _trust_env not in made:
                made[_trust_env] = original(_trust_env=_trust_env)
            return made[_trust_env]

    httpcore2.default_ssl_context = shared
