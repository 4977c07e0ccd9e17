"""`corectl doctor`: live probes of every configured provider, straight from the config (no daemon needed).
The probes themselves are in doctor_probes.py; this module runs them, renders the report and is the CLI.

Exit codes: 0 all OK, 2 something needs tuning, 1 could not run (bad config, unknown or unreachable provider).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import httpx
import orjson
import typer

from .doctor_client import Limits
from .doctor_probes import FAIL, LABELS, OK, SKIP, STYLES, WARN, DoctorError, ProviderProbe

__all__ = ["FAIL", "OK", "SKIP", "WARN", "DoctorError", "Limits", "doctor", "doctor_app", "doctor_command",
           "exit_code", "register", "render", "run_doctor"]


# -- public API ---------------------------------------------------------------------------------------------


async def run_doctor(config: Any, providers: list[str] | None = None, *,
                     limits: Limits | None = None) -> list[dict]:
    """Probe the named providers (all when None) of a ConfigModel or LoadedConfig; one report per provider."""
    model = getattr(config, "model", config)
    known = model.providers
    names = list(providers) if providers else list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        listed = ", ".join(sorted(known)) or "none"
        raise DoctorError(f"unknown provider {', '.join(unknown)} (known: {listed})")
    limits = limits or Limits()
    # trust_env=False: like the daemon, ignore HTTP(S)_PROXY so loopback backends are reached directly.
    async with httpx.AsyncClient(trust_env=False, follow_redirects=True) as client:
        results = list(await asyncio.gather(*(ProviderProbe(n, known[n], client, limits).run() for n in names)))
    await _adoption_checks(model, results)
    return results


async def _adoption_checks(model: Any, results: list[dict]) -> None:
    """A managed provider whose ready_url answers: is that listener the configured process (what the daemon
    would adopt), or an impostor it refuses (supervise/adopt.py)?"""
    from coderouterd.supervise import adopt, http_ready
    from coderouterd.supervise.from_config import specs_from_config

    by_provider = {p: spec for spec, providers in specs_from_config(model).values() for p in providers}
    for r in results:
        spec = by_provider.get(r["provider"])
        if spec is None or not spec.ready_url or not await http_ready(spec.ready_url):
            continue
        v = await asyncio.to_thread(adopt.judge, spec.ready_url, spec.command, spec.cwd, spec.adopt)
        r["checks"].append({"name": "process", "status": OK if v.ok else FAIL, "message": v.reason,
                            "suggestion": "" if v.ok else "stop whatever holds the port; the daemon will not "
                                                          "serve it as this provider"})


def exit_code(results: list[dict]) -> int:
    statuses = [(c["name"], c["status"]) for r in results for c in r["checks"]]
    if any(name == "reachable" and status == FAIL for name, status in statuses):
        return 1
    return 2 if any(status in (WARN, FAIL) for _, status in statuses) else 0


def render(results: list[dict], console: Any) -> None:
    from rich.table import Table
    from rich.text import Text

    for r in results:
        title = Text.assemble((r["provider"], "bold"), f"  {r['backend']} · {r['base_url']}",
                              (f" · {r['model']}" if r["model"] else "", "cyan"))
        t = Table(title=title, title_justify="left", show_lines=False)
        t.add_column("Check", no_wrap=True, style="bold")
        t.add_column("Status", no_wrap=True)
        t.add_column("Detail", overflow="fold")
        for c in r["checks"]:
            detail = Text(c["message"])
            if c["suggestion"]:
                detail.append(f"\n→ {c['suggestion']}", style="cyan")
            t.add_row(c["name"], Text(LABELS[c["status"]], style=STYLES[c["status"]]), detail)
        console.print(t)
        console.print()
    code = exit_code(results)
    summary = {0: ("All checks passed.", "bold green"),
               2: ("Some checks need tuning: see the suggestions above.", "bold yellow"),
               1: ("Could not run everything: a provider is unreachable.", "bold red")}[code]
    console.print(Text(*summary))


def _dumps(data: dict) -> str:
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def doctor_command(provider: str | None = None, config: str | None = None, json: bool = False,
                   socket: str | None = None) -> int:
    """What `corectl doctor [PROVIDER] [--config PATH] [--json]` does; returns the exit code.

    Without --config it checks the config of the daemon the user runs (corectl.target), with the keys that
    daemon has: the env file is loaded here like the daemon loads it, and a running daemon's own report of
    missing keys becomes an `auth` failure (a key exported in this shell does not reach a login service)."""
    from coderouterd.config import ConfigError, load_config
    from coderouterd.config.envfile import EnvFileError, load_env_file

    from .render import console
    from .target import config_for, running_daemon

    daemon = None if config else running_daemon(socket)
    found = config_for(config, socket, daemon=daemon)
    try:
        load_env_file()
        loaded = load_config(found.value)
        results = asyncio.run(run_doctor(loaded, [provider] if provider else None))
    except (ConfigError, DoctorError, EnvFileError) as e:
        if json:
            typer.echo(_dumps({"ok": False, "exit_code": 1, "error": str(e)}))
        typer.echo(f"corectl: {e}", err=True)
        return 1
    if daemon is not None:
        _add_daemon_key_checks(results, daemon)
    code = exit_code(results)
    if json:
        typer.echo(_dumps({"ok": code == 0, "exit_code": code, "config": loaded.path, "from": found.source,
                           "providers": results}))
    else:
        console().print(f"Config: {loaded.path} (from {found.source})")
        render(results, console())
    return code


def _add_daemon_key_checks(results: list[dict], daemon: dict) -> None:
    """The running daemon's view of its keys, which may differ from this shell's."""
    from coderouterd.config.envfile import env_file_path

    problems = {p["name"]: p.get("key_problem") for p in daemon.get("providers") or []}
    for r in results:
        problem = problems.get(r["provider"])
        if problem:
            r["checks"].append({"name": "daemon key", "status": FAIL,
                                "message": f"the running coderouterd (pid {daemon.get('pid')}) has {problem}",
                                "suggestion": f"put the key in {env_file_path()} (chmod 600), then restart "
                                              "coderouterd"})


def doctor(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Argument(help="Probe only this provider.")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", metavar="PATH", help="Config file (default: $CODEROUTER_CONFIG, else the running "
                                       "coderouterd's, else the last one it ran with).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Probe each provider live: reachability, model, generation, streaming, tools, thinking, context window.

    Exit 0 all OK, 2 something needs tuning, 1 could not run (bad config, provider unreachable)."""
    root = ctx.find_root().obj
    code = doctor_command(provider, config, json_out or bool(getattr(root, "json", False)),
                          getattr(root, "socket", None))
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Attach `doctor [PROVIDER] [--config PATH] [--json]` to the corectl app as a plain command (a Typer group
    cannot take options after a positional argument)."""
    app.command("doctor")(doctor)


# Standalone use (`python -c "from corectl.doctor import doctor_app; doctor_app()"`) and tests.
doctor_app = typer.Typer(pretty_exceptions_enable=False)
doctor_app.command("doctor")(doctor)
