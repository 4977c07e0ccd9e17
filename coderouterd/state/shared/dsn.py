"""The shared database's address: from the config or an environment variable, and shown without its password."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

if TYPE_CHECKING:
    from ...config.schema import StateConfig

_URL_PASSWORD = re.compile(r"(://[^:/@]*:)[^@]*@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


class DsnMissing(ValueError):
    pass


class DsnInvalid(DsnMissing):
    """The DSN is there but no PostgreSQL address (the driver cannot parse it)."""


def resolve(state_cfg: StateConfig, environ: Mapping[str, str] | None = None) -> str:
    """The DSN to connect with, checked. `dsn_env` names a variable so the password need not sit in the file."""
    env = os.environ if environ is None else environ
    if state_cfg.dsn_env:
        value = env.get(state_cfg.dsn_env, "")
        if not value:
            raise DsnMissing(f"[state] dsn_env: environment variable {state_cfg.dsn_env} is not set")
        check(value, f"[state] dsn_env ({state_cfg.dsn_env})")
        return value
    if not state_cfg.dsn:
        raise DsnMissing('[state] backend = "postgres" needs dsn or dsn_env')
    check(state_cfg.dsn, "[state] dsn")
    return state_cfg.dsn


def check(dsn: str, where: str) -> None:
    """Raise DsnInvalid unless the driver parses `dsn`: a malformed one must stop --check and start-up with a
    message, not the daemon later with a traceback. The driver's own words quote the DSN (password and all), so
    only their first clause is kept and the DSN is shown redacted."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        return  # start_problem says the driver is missing
    try:
        conninfo_to_dict(dsn)
    except Exception as e:
        why = str(e).split(" in URI:")[0].split(": \"")[0].splitlines()[0] if str(e) else type(e).__name__
        raise DsnInvalid(f"{where} is not a valid PostgreSQL address ({redact(dsn)}): {why}") from None


def redact(dsn: str) -> str:
    """The DSN with any password replaced by ***, in both URL and key=value forms: for logs and status."""
    if "://" in dsn:
        try:
            parts = urlsplit(dsn)
        except ValueError:  # malformed (an unclosed [IPv6]): still never show what may be a password
            return _URL_PASSWORD.sub(r"\1***@", dsn)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo, host = netloc.rsplit("@", 1)
            if ":" in userinfo:
                userinfo = userinfo.split(":", 1)[0] + ":***"
            netloc = f"{userinfo}@{host}"
        query = _KV_PASSWORD.sub(r"\1***", parts.query.replace("&", " ")).replace(" ", "&") if parts.query else ""
        return urlunsplit((parts.scheme, netloc, parts.path, query, ""))
    return _KV_PASSWORD.sub(r"\1***", dsn)
