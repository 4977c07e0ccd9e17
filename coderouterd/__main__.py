"""coderouterd: the router daemon. `coderouterd [--config PATH] [--host H] [--port N] [--check]`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from . import __version__


def _args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="coderouterd", description="Local-first LLM router for coding agents.")
    ap.add_argument("--config", help="config file (default: $CODEROUTER_CONFIG, the per-OS config file, "
                                     "else the embedded default)")
    ap.add_argument("--host", help="override [server] host")
    ap.add_argument("--port", type=int, help="override [server] port")
    ap.add_argument("--check", action="store_true", help="validate the configuration and exit")
    ap.add_argument("--log-level", default=None, help="debug | info | warning | error")
    ap.add_argument("--version", action="version", version=f"coderouterd {__version__}")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    from .config import ConfigError, load_config
    from .config.envfile import EnvFileError, load_env_file, missing_keys

    # --host/--port act as environment overrides for the process's life, so every reload reads the file with
    # them too (a reload compares host/port with the bound listener and refuses a change).
    if args.host:
        os.environ["CODEROUTER_SERVER__HOST"] = args.host
    if args.port is not None:
        os.environ["CODEROUTER_SERVER__PORT"] = str(args.port)
    try:
        # Before the config is read: CODEROUTER_* overrides and every api_key_env may come from this file.
        load_env_file()
    except EnvFileError as e:
        print(f"coderouterd: {e}", file=sys.stderr)
        return 2
    try:
        loaded = load_config(args.config)
    except ConfigError as e:
        print(f"coderouterd: {e}", file=sys.stderr)
        return 2
    from .cluster.backend import start_problem

    shared = start_problem(loaded.model.state)
    if shared is not None:
        # Not a database that is down (that is served through): this instance could never join it.
        print(f"coderouterd: {loaded.path}: {shared}", file=sys.stderr)
        return 2
    no_key = missing_keys(loaded.model.providers)
    server = loaded.model.server
    if args.check:
        from .ingress.browsers import remote_access
        from .supervise.memory import uncounted_processes, unstartable_processes

        print(f"coderouterd: configuration OK ({loaded.path})")
        print(f"coderouterd: {remote_access(server.host, server.allowed_hosts)}")
        for name, problem in no_key.items():
            print(f"coderouterd: provider {name}: {problem} (see {_env_hint()})", file=sys.stderr)
        for note in loaded.model.unused_settings():
            print(f"coderouterd: {note}", file=sys.stderr)
        for note in uncounted_processes(loaded.model):
            print(f"coderouterd: {note}", file=sys.stderr)
        from .supervise.from_config import ambiguous_hosts, slot_budget_notes

        for note in [*slot_budget_notes(loaded.model).values(), *ambiguous_hosts(loaded.model)]:
            print(f"coderouterd: {note}", file=sys.stderr)
        unstartable = unstartable_processes(loaded.model)
        for name, problems in unstartable.items():
            print(f"coderouterd: process {name} cannot start: {'; '.join(problems)}", file=sys.stderr)
        # A process that cannot start is an error of the configuration (the daemon would answer every request
        # for it with that error), not a note.
        return 1 if unstartable else 0
    level = (args.log_level or server.log_level).upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # watchfiles reports every change it sees at INFO; the reload that follows is the line worth reading.
    logging.getLogger("watchfiles").setLevel(logging.WARNING)
    for name, problem in no_key.items():
        logging.getLogger("coderouterd").warning("provider %s: %s (see %s)", name, problem, _env_hint())
    for note in loaded.model.unused_settings():
        logging.getLogger("coderouterd").warning("%s", note)
    from .allocator import keep_large_buffers_off_heap
    from .serve import _install_uvloop, serve

    keep_large_buffers_off_heap()  # a freed 16 MB answer goes back to the OS (allocator.py)
    _install_uvloop()
    try:
        return asyncio.run(serve(loaded))
    except KeyboardInterrupt:
        return 0


def _env_hint() -> str:
    from .config.envfile import env_file_path

    return f"{env_file_path()}: one NAME=value line per key, chmod 600"


if __name__ == "__main__":
    sys.exit(main())
