"""What each corectl command does, free of any CLI framework: shared by the Typer app and the fast path.

Each function returns the process exit status. Expected failures are one human line on stderr (and, with
--json, a JSON error document on stdout)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .client import AdminClient, CorectlError, resolve_socket


def emit_json(data) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def echo(line: str) -> None:
    sys.stdout.write(line + "\n")


def report_error(message: str, as_json: bool, payload: dict | None = None) -> None:
    if as_json:
        emit_json({"ok": False, "error": message, **(payload or {})})
    sys.stderr.write(f"corectl: {message}\n")


def with_daemon(socket: str | None, as_json: bool, work: Callable[[AdminClient], None]) -> int:
    try:
        with AdminClient(resolve_socket(socket)) as client:
            work(client)
    except CorectlError as e:
        report_error(str(e), as_json, e.payload)
        return e.code
    return 0


def _console():
    from .render import console

    return console()


def status(socket: str | None, as_json: bool) -> int:
    def work(client: AdminClient) -> None:
        data = client.call("GET", "/v1/status")
        if as_json:
            emit_json(data)
            return
        from .render import status as render_status

        render_status(data, _console())

    return with_daemon(socket, as_json, work)


def profile_list(socket: str | None, as_json: bool) -> int:
    def work(client: AdminClient) -> None:
        data = client.call("GET", "/v1/profiles")
        if as_json:
            emit_json(data)
            return
        from .render import profiles_table

        out = _console()
        out.print(profiles_table(data["profiles"], out.width))

    return with_daemon(socket, as_json, work)


def profile_show(socket: str | None, name: str, as_json: bool) -> int:
    from urllib.parse import quote

    def work(client: AdminClient) -> None:
        data = client.call("GET", f"/v1/profiles/{quote(name, safe='')}")
        if as_json:
            emit_json(data)
            return
        from .render import profile_detail

        profile_detail(data, _console())

    return with_daemon(socket, as_json, work)


def profile_use(socket: str | None, name: str, as_json: bool) -> int:
    def work(client: AdminClient) -> None:
        data = client.call("POST", "/v1/profile/use", {"name": name})
        if as_json:
            emit_json(data)
        elif data["previous"] == data["active"]:
            echo(f"Profile {data['active']} is already active.")
        else:
            echo(f"Active profile: {data['active']} (was {data['previous']}).")

    return with_daemon(socket, as_json, work)


def reload(socket: str | None, as_json: bool) -> int:
    def work(client: AdminClient) -> None:
        status_code, data = client.request("POST", "/v1/reload")
        if status_code >= 400 or not data.get("ok"):
            reason = data.get("error") or f"HTTP {status_code}"
            raise CorectlError(f"reload refused, the running configuration stays: {reason}", 1, data)
        if as_json:
            emit_json(data)
        elif data.get("message"):
            echo(data["message"])
        elif data.get("changed"):
            echo(f"Reloaded {data['path']}: changed {', '.join(data['changed'])}.")
        else:
            echo(f"Reloaded {data['path']}: no changes.")

    return with_daemon(socket, as_json, work)


def config_check(path: str | None, as_json: bool, socket: str | None = None) -> int:
    """Offline: the daemon's own loader, so the messages are the ones the daemon would print. Without a PATH,
    the file of the daemon the user runs (corectl.target), so the check is about the config actually in use."""
    from coderouterd.config import ConfigError, load_config
    from coderouterd.config.envfile import missing_keys

    from .target import config_for

    found = config_for(path, socket)
    try:
        loaded = load_config(found.value)
    except ConfigError as e:
        report_error(str(e), as_json, {"path": found.value, "from": found.source})
        return 1
    m = loaded.model
    no_key = missing_keys(m.providers, _daemon_environment())
    data = {"ok": True, "path": loaded.path, "from": found.source, "providers": sorted(m.providers),
            "profiles": sorted(m.profiles), "default_profile": m.server.default_profile, "no_key": no_key}
    if as_json:
        emit_json(data)
    else:
        echo(f"{loaded.path}: OK ({len(m.providers)} providers, {len(m.profiles)} profiles, "
             f"default profile {m.server.default_profile})"
             + ("" if found.source == "--config" else f", the config of {found.source}"))
        for name, problem in no_key.items():
            echo(f"  {name}: {problem}")
    return 0


def _daemon_environment() -> dict:
    """This shell's environment plus the env file, as the daemon would see it at start-up."""
    import os

    from coderouterd.config.envfile import EnvFileError, load_env_file

    env = dict(os.environ)
    try:
        load_env_file(environ=env)
    except EnvFileError as e:
        sys.stderr.write(f"corectl: {e}\n")
    return env
