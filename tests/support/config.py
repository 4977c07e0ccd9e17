"""Daemon configs for tests, built from Python values instead of copied TOML text.

    daemon_config(providers={"bad": bad.url, "good": good.url},
                  profiles={"default": {"providers": ["bad", "good"], "health_action": "warn"}},
                  breaker={"failures": 3, "recovery_s": 1.5})

- `server` always gets `port = {PORT}`: DaemonProcess puts its own port there.
- A provider given as a string is a fake's URL: `base_url = "<url>/v1"`. `upstream(url, **fields)` adds fields.
- A profile given as a list is its providers.
- Nested values (timeouts, cost, capabilities, a provider's `process`) are written as inline tables, which
  TOML reads exactly as the `[a.b]` sub-tables the hand-written configs used.
- `openai_at(url)`, `anthropic_at(url)`, `ollama_at(url)` name a provider's kind; `warn(*names)` is the profile most tests
  want (health is only a warning, so a test's own fault injection decides where a request goes), and
  `NO_BREAKER` keeps the breaker out of a test that sends failures on purpose.
- Any other keyword is a top-level table (`breaker`, `state`, `health`, `adaptive`, `affinity`, ...);
  `routes` is a list of tables (`[[routes]]`). `extra` is appended verbatim, for the rare config a test wants
  to spell out itself.
"""

from __future__ import annotations

import json
from typing import Any

PORT = "{PORT}"


def upstream(url: str, **fields: Any) -> dict[str, Any]:
    """A provider in front of a fake (or any server) at `url`, OpenAI-style path."""
    return {"base_url": f"{url}/v1", **fields}


def openai_at(url: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "openai", **upstream(url, **fields)}


def anthropic_at(url: str, **fields: Any) -> dict[str, Any]:
    return {"kind": "anthropic", **upstream(url, **fields)}


def ollama_at(url: str, **fields: Any) -> dict[str, Any]:
    """Ollama's base URL has no /v1: the daemon adds its own paths (/api/chat, /api/tags)."""
    return {"kind": "ollama", "base_url": url, **fields}


def warn(*providers: str, **fields: Any) -> dict[str, Any]:
    """A profile over `providers` whose health verdict only warns."""
    return {"providers": list(providers), "health_action": "warn", **fields}


# A stream held briefly, then kept alive with pings while no provider has answered yet: a test of the hold sees
# several pings in the second a slow fake keeps silent.
PINGING = {"stream_hold_s": 0.1, "ping_interval_s": 0.2}

# Failures a test sends on purpose must not open the breaker and change where its next request goes.
NO_BREAKER = {"failures": 1000}


def daemon_config(*, providers: dict[str, str | dict[str, Any]], profiles: dict[str, list[str] | dict[str, Any]],
                  server: dict[str, Any] | None = None, routes: list[dict[str, Any]] | None = None,
                  extra: str = "", **tables: dict[str, Any]) -> str:
    out = [_table("server", {"port": _Raw(PORT), **(server or {})})]
    for name, fields in tables.items():
        out.append(_table(name, fields))
    for name, p in providers.items():
        out.append(_table(f"providers.{name}", upstream(p) if isinstance(p, str) else p))
    for name, prof in profiles.items():
        out.append(_table(f"profiles.{name}", {"providers": prof} if isinstance(prof, list) else prof))
    for route in routes or ():
        out.append("[[routes]]\n" + "".join(f"{k} = {_value(v)}\n" for k, v in route.items()))
    return "\n".join(out) + (("\n" + extra.strip() + "\n") if extra else "")


class _Raw(str):
    """Written as is: the `{PORT}` placeholder is not a TOML string."""


def _table(name: str, fields: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(f"{_key(k)} = {_value(v)}\n" for k, v in fields.items())


def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, _Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string (the escapes are the same)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(f"cannot write {type(v).__name__} to TOML: {v!r}")


def local_and_cloud(local_url: str, cloud_url: str, **tables: dict[str, Any]) -> str:
    """The two upstreams most client tests stand in front of: `local`, an OpenAI-wire server, behind profile
    `default`, and `cloud`, an Anthropic-wire one, behind profile `cloud`. `tables` as daemon_config's."""
    return daemon_config(providers={"local": openai_at(local_url),
                                    "cloud": anthropic_at(cloud_url, model="claude-sonnet-5")},
                         profiles={"default": warn("local"), "cloud": warn("cloud")}, **tables)
