"""The corectl command line (Typer): definitions, help and shell completion. The work is in commands.py.

Exit codes: 0 ok · 1 refused or failed (the reason is printed) · 2 usage error · 3 coderouterd is not running."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer

from . import __version__, commands
from .client import AdminClient, resolve_socket

app = typer.Typer(
    name="corectl",
    help="Control coderouterd, the local-first LLM router: status, profiles, reloads, config checks.",
    epilog="Exit codes: 0 ok, 1 refused or failed, 2 usage error, 3 coderouterd is not running.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
profile_app = typer.Typer(help="List, inspect and switch routing profiles.", no_args_is_help=True)
config_app = typer.Typer(help="Work with configuration files.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")
app.add_typer(config_app, name="config")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


@dataclass
class Options:
    socket: str | None
    json: bool


def _version(value: bool) -> None:
    if value:
        typer.echo(f"corectl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    socket: Annotated[str | None, typer.Option(
        "--socket", envvar="CODEROUTER_SOCKET", metavar="PATH",
        help="Admin socket of coderouterd (default: derived like the daemon: [admin] socket, else "
             "<state dir>/coderouterd.sock).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON (any command).")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Show the version and exit.")] = False,
) -> None:
    ctx.obj = Options(socket=socket, json=json_out)


def _opts(ctx: typer.Context, json_flag: bool) -> tuple[str | None, bool]:
    obj = ctx.find_root().obj
    opts = obj if isinstance(obj, Options) else Options(socket=None, json=False)
    return opts.socket, json_flag or opts.json


def _exit(code: int) -> None:
    if code:
        raise typer.Exit(code)


def _complete_profiles(ctx: typer.Context, incomplete: str) -> list[str]:
    try:
        with AdminClient(resolve_socket(ctx.find_root().params.get("socket")), timeout=2.0) as client:
            data = client.call("GET", "/v1/profiles")
        return [p["name"] for p in data["profiles"] if p["name"].startswith(incomplete)]
    except Exception:  # completion must never print errors into the user's shell
        return []


ProfileArg = Annotated[str, typer.Argument(help="Profile name.", autocompletion=_complete_profiles)]


@app.command()
def status(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Daemon, providers (breaker, health, figures) and profiles (effective order)."""
    _exit(commands.status(*_opts(ctx, json_out)))


@profile_app.command("list")
def profile_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every profile, its chain and effective order; the active one is marked."""
    _exit(commands.profile_list(*_opts(ctx, json_out)))


@profile_app.command("show")
def profile_show(ctx: typer.Context, name: ProfileArg, json_out: JsonOpt = False) -> None:
    """One profile: its chain, settings and effective order."""
    socket, as_json = _opts(ctx, json_out)
    _exit(commands.profile_show(socket, name, as_json))


@profile_app.command("use")
def profile_use(ctx: typer.Context, name: ProfileArg, json_out: JsonOpt = False) -> None:
    """Make NAME the active profile, at once and across daemon restarts."""
    socket, as_json = _opts(ctx, json_out)
    _exit(commands.profile_use(socket, name, as_json))


@app.command()
def reload(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Re-read the daemon's config file now. An invalid file is refused and the running config stays."""
    _exit(commands.reload(*_opts(ctx, json_out)))


@config_app.command("check")
def config_check(
    ctx: typer.Context,
    path: Annotated[str | None, typer.Argument(
        help="Config file to validate (default: the one coderouterd would load).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a config file offline, with the daemon's own rules and messages."""
    _exit(commands.config_check(path, _opts(ctx, json_out)[1]))


def run(argv: list[str] | None = None) -> int:
    try:
        app(args=argv, prog_name="corectl")
    except SystemExit as e:
        if e.code is None:
            return 0
        return e.code if isinstance(e.code, int) else 1
    return 0
