"""Imports the proxy does not need to answer /healthz, done in a thread once it listens (see
Daemon._start_background): the upstream HTTP stack, health checks, token counting, the executor."""

from __future__ import annotations


def warm_imports() -> None:
    import aiohttp  # noqa: F401

    from .health import monitor, selfheal  # noqa: F401
    from .ingress import tokens  # noqa: F401
    from .routing import executor  # noqa: F401
