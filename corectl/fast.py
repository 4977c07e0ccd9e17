"""A fast path for the everyday read/switch commands, taken before Typer is even imported.

Typer (with its pydantic coercion layer) and Click cost ~150 ms of imports on every run, more than the whole
budget of `corectl status` (250 ms). The grammar recognised here is a strict subset of the Typer app's, mapped
to the same functions in commands.py; anything else (help, completion, typos, unusual spellings) returns None
and goes through Typer, which stays the definition of the command line."""

from __future__ import annotations

import os

from . import commands

# command words -> (number of positional arguments, handler(socket, args, as_json))
_COMMANDS = {
    ("status",): (0, lambda s, a, j: commands.status(s, j)),
    ("reload",): (0, lambda s, a, j: commands.reload(s, j)),
    ("profile", "list"): (0, lambda s, a, j: commands.profile_list(s, j)),
    ("profile", "show"): (1, lambda s, a, j: commands.profile_show(s, a[0], j)),
    ("profile", "use"): (1, lambda s, a, j: commands.profile_use(s, a[0], j)),
}


def parse(argv: list[str]):
    """(handler, socket, positional args, json) for a recognised command line, else None."""
    socket = os.environ.get("CODEROUTER_SOCKET") or None
    as_json = False
    i = 0
    while i < len(argv) and argv[i].startswith("-"):
        arg = argv[i]
        if arg == "--json":
            as_json = True
        elif arg == "--socket" and i + 1 < len(argv):
            socket = argv[i + 1]
            i += 1
        elif arg.startswith("--socket="):
            socket = arg[len("--socket="):]
        else:
            return None
        i += 1
    rest = argv[i:]
    for words, (nargs, handler) in _COMMANDS.items():
        if tuple(rest[:len(words)]) != words:
            continue
        positional = []
        for arg in rest[len(words):]:
            if arg == "--json":
                as_json = True
            elif arg.startswith("-"):
                return None
            else:
                positional.append(arg)
        if len(positional) != nargs:
            return None
        return handler, socket, positional, as_json
    return None


def run(argv: list[str]) -> int | None:
    parsed = parse(argv)
    if parsed is None:
        return None
    handler, socket, positional, as_json = parsed
    return handler(socket, positional, as_json)
