"""The shared database's address: from the config or an environment variable, and shown without its password."""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit, urlunsplit

_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


class DsnMissing(ValueError):
    pass


def resolve(state_cfg) -> str:
    """The DSN to connect with. `dsn_env` names a variable so the password need not sit in the file."""
    if state_cfg.dsn_env:
        value = os.environ.get(state_cfg.dsn_env, "")
        if not value:
            raise DsnMissing(f"[state] dsn_env: environment variable {state_cfg.dsn_env} is not set")
        return value
    if not state_cfg.dsn:
        raise DsnMissing('[state] backend = "postgres" needs dsn or dsn_env')
    return state_cfg.dsn


def redact(dsn: str) -> str:
    """The DSN with any password replaced by ***, in both URL and key=value forms: for logs and status."""
    if "://" in dsn:
        parts = urlsplit(dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = _KV_PASSWORD.sub(r"\1***", parts.query.replace("&", " ")).replace(" ", "&") if parts.query else ""
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    return _KV_PASSWORD.sub(r"\1***", dsn)
