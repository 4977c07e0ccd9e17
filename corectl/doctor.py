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

from .doctor_probes import FAIL, LABELS, OK, SKIP, STYLES, WARN, DoctorError, Limits, ProviderProbe

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
        return list(await asyncio.gather(*(ProviderProbe(n, known[n], client, limits).run() for n in names)))


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


def doctor_command(provider: str | None = None, config: str | None = None, json: bool = False) -> int:
    """What `corectl doctor [PROVIDER] [--config PATH] [--json]` does; returns the exit code."""
    from coderouterd.config import ConfigError, load_config

    from .render import console

    try:
        loaded = load_config(config)
        results = asyncio.run(run_doctor(loaded, [provider] if provider else None))
    except (ConfigError, DoctorError) as e:
        if json:
            typer.echo(_dumps({"ok": False, "exit_code": 1, "error": str(e)}))
        typer.echo(f"corectl: {e}", err=True)
        return 1
    code = exit_code(results)
    if json:
        typer.echo(_dumps({"ok": code == 0, "exit_code": code, "config": loaded.path, "providers": results}))
    else:
        render(results, console())
    return code


def doctor(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Argument(help="Probe only this provider.")] = None,
    config: Annotated[str | None, typer.Option(
        "--config", metavar="PATH", help="Config file (default: the one coderouterd would load).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")] = False,
) -> None:
    """Probe each provider live: reachability, model, generation, streaming, tools, thinking, context window.

    Exit 0 all OK, 2 something needs tuning, 1 could not run (bad config, provider unreachable)."""
    root_json = bool(getattr(ctx.find_root().obj, "json", False))
    code = doctor_command(provider, config, json_out or root_json)
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    """Attach `doctor [PROVIDER] [--config PATH] [--json]` to the corectl app as a plain command (a Typer group
    cannot take options after a positional argument)."""
    app.command("doctor")(doctor)


# Standalone use (`python -c "from corectl.doctor import doctor_app; doctor_app()"`) and tests.
doctor_app = typer.Typer(pretty_exceptions_enable=False)
doctor_app.command("doctor")(doctor)
