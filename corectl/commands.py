"""What each corectl command does, free of any CLI framework: shared by the Typer app and the fast path.

Each function returns the process exit status. Expected failures are one human line on stderr (and, with
--json, a JSON error document on stdout)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .api import DaemonAPI
from .client import DEFAULT_TIMEOUT_S, CorectlError
from .safe import clean, clean_tree


def emit_json(data) -> None:
    import orjson

    if hasattr(data, "model_dump"):  # a typed answer (apitype): what the daemon sent, nothing added
        data = data.model_dump(exclude_unset=True)

    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def echo(line: str) -> None:
    # Lines of our own that may quote what a daemon or a client wrote: never a terminal escape (safe.py).
    sys.stdout.write(clean(line, newlines=True) + "\n")


def report_error(message: str, as_json: bool, payload: dict | None = None) -> None:
    if as_json:
        emit_json({"ok": False, "error": message, **(payload or {})})
    sys.stderr.write(f"corectl: {clean(message, newlines=True)}\n")


def run(as_json: bool, work: Callable[[], int | None]) -> int:
    """The one wrapper every command runs in: its exit status, expected failures as one line on stderr (and a
    JSON error document with --json), Ctrl-C as the normal end of a follow."""
    try:
        return work() or 0
    except CorectlError as e:
        report_error(str(e), as_json, e.payload)
        return e.code
    except KeyboardInterrupt:
        return 0


def with_api(socket: str | None, as_json: bool, work: Callable[[DaemonAPI], int | None], *,
             timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """run() with a connection to the daemon for `work`."""
    def go() -> int | None:
        with DaemonAPI(socket, timeout=timeout) as api:
            return work(api)

    return run(as_json, go)


def _console():
    from .render import console

    return console()


def status(socket: str | None, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.status()
        if as_json:
            emit_json(data)
            return
        from .render import status as render_status

        render_status(data, _console())

    return with_api(socket, as_json, work)


def profile_list(socket: str | None, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.profiles()
        if as_json:
            emit_json(data)
            return
        from .render import profiles_table

        out = _console()
        out.print(profiles_table(clean_tree(data["profiles"]), out.width))

    return with_api(socket, as_json, work)


def profile_show(socket: str | None, name: str, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.profile(name)
        if as_json:
            emit_json(data)
            return
        from .render import profile_detail

        profile_detail(data, _console())

    return with_api(socket, as_json, work)


def profile_use(socket: str | None, name: str, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.use_profile(name)
        if as_json:
            emit_json(data)
        elif data["previous"] == data["active"]:
            echo(f"Profile {data['active']} is already active.")
        else:
            echo(f"Active profile: {data['active']} (was {data['previous']}).")

    return with_api(socket, as_json, work)


def reload(socket: str | None, as_json: bool) -> int:
    def work(api: DaemonAPI) -> None:
        data = api.reload()
        if as_json:
            emit_json(data)
        elif data.get("message"):
            echo(data["message"])
        elif data.get("changed"):
            echo(f"Reloaded {data['path']}: changed {', '.join(data['changed'])}.")
        else:
            echo(f"Reloaded {data['path']}: no changes.")

    return with_api(socket, as_json, work)


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
    environ = _daemon_environment()
    from coderouterd.cluster.backend import start_problem
    from coderouterd.supervise.from_config import ambiguous_hosts, slot_budget_notes
    from coderouterd.supervise.memory import uncounted_processes, unstartable_processes

    # What the daemon refuses to start with (a malformed DSN, the driver missing) fails the check too.
    shared = start_problem(m.state, environ)
    if shared is not None:
        report_error(f"{loaded.path}: {shared}", as_json, {"path": loaded.path, "from": found.source})
        return 1
    no_key = missing_keys(m.providers, environ)
    unused = (m.unused_settings() + uncounted_processes(m) + list(slot_budget_notes(m).values())
              + ambiguous_hosts(m))
    unstartable = unstartable_processes(m)
    data = {"ok": not unstartable, "path": loaded.path, "from": found.source, "providers": sorted(m.providers),
            "profiles": sorted(m.profiles), "default_profile": m.server.default_profile, "no_key": no_key,
            "unused": unused, "unstartable": unstartable}
    if as_json:
        emit_json(data)
    else:
        echo(f"{loaded.path}: OK ({len(m.providers)} providers, {len(m.profiles)} profiles, "
             f"default profile {m.server.default_profile})"
             + ("" if found.source == "--config" else f", the config of {found.source}"))
        for name, problem in no_key.items():
            echo(f"  {name}: {problem}")
        for note in unused:
            echo(f"  {note}")
        for name, problems in unstartable.items():
            echo(f"  process {name} cannot start: {'; '.join(problems)}")
    return 1 if unstartable else 0


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
