"""Identifiers for requests and messages: unique within a daemon's life and across restarts, and cheap.

uuid4() reads the OS random source on every call, which showed up at ~5% of the proxy's CPU; a random
per-process prefix plus a counter is unique enough for request ids and costs a string format."""

from __future__ import annotations

import itertools
import os

_PREFIX = os.urandom(6).hex()
_COUNTER = itertools.count(1)


def _own_prefix() -> None:
    global _PREFIX, _COUNTER
    _PREFIX = os.urandom(6).hex()
    _COUNTER = itertools.count(1)


# A process forked from one that had imported this module (the test suite's pre-loaded parent of its daemons,
# any pre-forking launcher) would otherwise hand out its parent's ids, and its siblings the same ones.
os.register_at_fork(after_in_child=_own_prefix)


def new_id(kind: str) -> str:
    return f"{kind}_{_PREFIX}{next(_COUNTER):012x}"


def hex24() -> str:
    """24 hex digits, unique like `new_id`: the tail of the message, tool-call and completion ids that answers
    carry in the upstream APIs' own shape (`msg_` + 24 hex). secrets.token_hex(12) made one system call per id:
    ~10 µs of a translated answer on the benchmark VM (issue 36); these ids are names, not secrets."""
    return f"{_PREFIX}{next(_COUNTER):012x}"


# Client-supplied strings (model names, request ids, profile names, tool names) end up in the journal, the
# audit log, log lines and response headers: each is cut to this with a marker saying how much was dropped.
MAX_STORED_CHARS = 256
# A client's own x-request-id is kept only when it looks like an id: short, printable ASCII, no spaces.
MAX_CLIENT_REQUEST_ID = 128


def clip(s: str, limit: int = MAX_STORED_CHARS) -> str:
    if len(s) <= limit:
        return s
    return f"{s[:limit]}…[+{len(s) - limit} chars]"


def client_request_id(given: str | None) -> str:
    """The client's x-request-id when it is a sane id, else a fresh one (echoed back in headers and stored)."""
    if given and len(given) <= MAX_CLIENT_REQUEST_ID and given.isascii() and given.isprintable() \
            and " " not in given:
        return given
    return new_id("req")
