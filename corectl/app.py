"""The corectl command line (Typer): definitions, help and shell completion. The work is in commands.py.

Exit codes: 0 ok · 1 refused or failed (the reason is printed) · 2 usage error · 3 coderouterd is not running."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import typer
from typer.core import TyperGroup, TyperOption

from . import __version__, commands
from .api import DaemonAPI

_typed = TyperOption.display_type_rich


def _display_type_rich(self, ctx):
    # Typer's Rich help gives every option a type column, flags included (`--json <bool>`), although its plain
    # help leaves flags bare: a flag takes no value, so it gets no type (tests/unit/test_corectl_help.py).
    return None if self.is_flag or self.count else _typed(self, ctx)


TyperOption.display_type_rich = _display_type_rich  # type: ignore[method-assign]  # the patch described above


class _Root(TyperGroup):
    """The root group, with `doctor` and `service` built only when asked for: corectl.doctor imports httpx and
    the probe machinery (~0.2 s), which every other command would otherwise pay for on each run."""

    _lazy = ("doctor", "service")

    def list_commands(self, ctx):
        names = super().list_commands(ctx)
        return [*names, *(n for n in self._lazy if n not in names)]

    def get_command(self, ctx, name):
        cmd = super().get_command(ctx, name)
        if cmd is not None or name not in self._lazy:
            return cmd
        holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        if name == "doctor":
            from . import doctor

            doctor.register(holder)
            cmd = typer.main.get_command(holder)  # a Typer with a single command yields that command
        else:
            from . import service

            holder.add_typer(service.service_app, name="service")
            cmd = typer.main.get_command(holder).commands["service"]
        self.commands[name] = cmd
        return cmd


app = typer.Typer(
    name="corectl",
    cls=_Root,
    help="Control coderouterd, the local-first LLM router: status, live view, profiles, processes, models, "
         "history (audit, journal, replay comparisons), explanations of single requests, doctor, service.",
    epilog="Exit codes: 0 ok, 1 refused or failed, 2 usage error, 3 coderouterd is not running.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
profile_app = typer.Typer(help="List, inspect and switch routing profiles.", no_args_is_help=True)
config_app = typer.Typer(help="Work with configuration files.", no_args_is_help=True)
models_app = typer.Typer(help="List, load and unload models on local backends (Ollama, LM Studio).",
                         no_args_is_help=True)
audit_app = typer.Typer(help="The audit log (read from the state directory; works with the daemon stopped).",
                        no_args_is_help=True)
journal_app = typer.Typer(help="The request journal (read from the state directory; works with the daemon "
                               "stopped).", no_args_is_help=True)
replay_app = typer.Typer(help="Compare providers, profiles or time windows from the journal.", no_args_is_help=True)
app.add_typer(profile_app, name="profile")
app.add_typer(config_app, name="config")
app.add_typer(models_app, name="models")
app.add_typer(audit_app, name="audit")
app.add_typer(journal_app, name="journal")
app.add_typer(replay_app, name="replay")
keys_app = typer.Typer(help="Team keys: a key of their own for each user, with a budget, rate limits, a scope and an "
                            "expiry. Once any key exists, every request needs one.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]
_TIME_HELP = ("T is an ISO date/time (2025-06-01, 2025-06-01T14:30; no zone = local time) or an age like "
              "30m, 2h, 7d, 1w.")


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
        help="Admin socket of coderouterd (default: the one the running daemon published, whatever "
             "--config it was started with; else <state dir>/coderouterd.sock).")] = None,
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
        with DaemonAPI(ctx.find_root().params.get("socket"), timeout=2.0) as api:
            data = api.profiles()
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
        help="Config file to validate (default: $CODEROUTER_CONFIG, else the running coderouterd's, else the "
             "last one it ran with, else the one it would load).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Validate a config file offline, with the daemon's own rules and messages."""
    socket, as_json = _opts(ctx, json_out)
    _exit(commands.config_check(path, as_json, socket))


def _complete_processes(ctx: typer.Context, incomplete: str) -> list[str]:
    try:
        with DaemonAPI(ctx.find_root().params.get("socket"), timeout=2.0) as api:
            data = api.processes()
        return [n for n in data.names if n.startswith(incomplete)]
    except Exception:  # completion must never print errors into the user's shell
        return []


ProcessArg = Annotated[str, typer.Argument(help="Managed process, or a provider it serves.",
                                           autocompletion=_complete_processes)]
WaitOpt = Annotated[float, typer.Option(
    "--wait", metavar="SECONDS", help="Wait this long for the backend to be ready (0: return once it is "
                                      "spawned). Exit 1 if it is not ready in time.")]
StateDirOpt = Annotated[str | None, typer.Option(
    "--state-dir", metavar="DIR", help="State directory (default: $CODEROUTER_STATE_DIR, else the running "
                                        "daemon's, else the config's, else the per-OS default).")]
SinceOpt = Annotated[str | None, typer.Option("--since", metavar="T", help="From T (inclusive). " + _TIME_HELP)]
UntilOpt = Annotated[str | None, typer.Option("--until", metavar="T", help="Up to T (exclusive).")]
ProviderFilter = Annotated[str | None, typer.Option("--provider", metavar="NAME", help="Only this provider.")]
ProfileFilter = Annotated[str | None, typer.Option("--profile", metavar="NAME", help="Only this profile.")]
InstanceOpt = Annotated[str | None, typer.Option("--instance", metavar="NAME",
                                                 help="Only this instance's rows (the shared journal).")]
LocalOpt = Annotated[bool, typer.Option("--local", help="This machine's journal, not the shared one.")]


@app.command()
def providers(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every provider: kind, URL, model, breaker, health, managed process, figures, spend."""
    from . import ops

    _exit(ops.providers(*_opts(ctx, json_out)))


def _process(ctx: typer.Context, name: str, action: str, wait: float, json_out: bool) -> None:
    from . import ops

    socket, as_json = _opts(ctx, json_out)
    _exit(ops.process_action(socket, name, action, wait, as_json))


@app.command()
def restart(ctx: typer.Context, name: ProcessArg, wait: WaitOpt = 60.0, json_out: JsonOpt = False) -> None:
    """Restart a managed backend (also revives one that went FATAL after a crash loop)."""
    _process(ctx, name, "restart", wait, json_out)


@app.command()
def start(ctx: typer.Context, name: ProcessArg, wait: WaitOpt = 60.0, json_out: JsonOpt = False) -> None:
    """Start a managed backend that is stopped (or FATAL)."""
    _process(ctx, name, "start", wait, json_out)


@app.command()
def stop(ctx: typer.Context, name: ProcessArg, json_out: JsonOpt = False) -> None:
    """Stop a managed backend and its whole process tree. It stays stopped until start or restart."""
    _process(ctx, name, "stop", 0.0, json_out)


@app.command()
def logs(
    ctx: typer.Context,
    name: ProcessArg,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0, help="How many of the last lines to show.")] = 50,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new lines (Ctrl-C stops).")] = False,
    json_out: JsonOpt = False,
) -> None:
    """The captured output of a managed backend (its log file; rotation is followed)."""
    from . import ops

    socket, as_json = _opts(ctx, json_out)
    _exit(ops.logs(socket, name, lines, follow, as_json))


@models_app.command("list")
def models_list(
    ctx: typer.Context,
    provider: Annotated[str | None, typer.Argument(help="Only this provider (default: all).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Models each backend has, and which are loaded."""
    from . import ops

    socket, as_json = _opts(ctx, json_out)
    _exit(ops.models_list(socket, provider, as_json))


ModelArg = Annotated[str, typer.Argument(help="Model id, as `corectl models list` shows it.")]
ModelProviderOpt = Annotated[str, typer.Option("--provider", "-p", metavar="NAME",
                                               help="Provider whose backend loads the model.")]


@models_app.command("load")
def models_load(ctx: typer.Context, model: ModelArg, provider: ModelProviderOpt, json_out: JsonOpt = False,
                force: Annotated[bool, typer.Option("--force", help="Load even if it does not fit in the "
                                                    "available memory.")] = False) -> None:
    """Load MODEL into memory on a provider's backend (may take minutes for a large model). A model larger than
    the available memory is refused unless --force."""
    from . import ops

    socket, as_json = _opts(ctx, json_out)
    _exit(ops.model_control(socket, "load", model, provider, as_json, force=force))


@models_app.command("unload")
def models_unload(ctx: typer.Context, model: ModelArg, provider: ModelProviderOpt,
                  json_out: JsonOpt = False) -> None:
    """Unload MODEL from a provider's backend, freeing its memory."""
    from . import ops

    socket, as_json = _opts(ctx, json_out)
    _exit(ops.model_control(socket, "unload", model, provider, as_json))


@audit_app.command("tail")
def audit_tail(
    ctx: typer.Context,
    lines: Annotated[int, typer.Option("-n", "--lines", min=0, help="How many of the last records.")] = 20,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing new records (Ctrl-C stops).")] = False,
    kind: Annotated[list[str] | None, typer.Option(
        "--kind", metavar="K", help="Only records of this kind (repeatable): process, health_transition, "
                                    "breaker_transition, fallback_used, guard_fired, budget_warning, budget_blocked, "
                                    "config_reloaded, config_rejected, profile_switched, recovery_probe, daemon, "
                                    "persistence_fault, request_finished, key, auth_refused, auth_throttled.")] = None,
    since: SinceOpt = None,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The newest audit records (with --json: one JSON object, or JSON Lines with -f)."""
    from . import history

    socket, as_json = _opts(ctx, json_out)
    _exit(history.audit_tail(state_dir, socket, lines, follow, kind, since, as_json))


@journal_app.command("tail")
def journal_tail(
    ctx: typer.Context,
    lines: Annotated[int, typer.Option("-n", "--lines", min=1, help="How many of the last requests.")] = 20,
    provider: ProviderFilter = None,
    profile: ProfileFilter = None,
    instance: InstanceOpt = None,
    local: LocalOpt = False,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """The newest requests: route, status, latency, tokens, cost (metadata only, never bodies)."""
    from . import history

    socket, as_json = _opts(ctx, json_out)
    _exit(history.journal_tail(state_dir, socket, lines, provider, profile, as_json, instance=instance, local=local))


@journal_app.command("export")
def journal_export(
    ctx: typer.Context,
    fmt: Annotated[str, typer.Option("--format", metavar="jsonl|csv", help="Output format.")] = "jsonl",
    since: SinceOpt = None,
    until: UntilOpt = None,
    provider: ProviderFilter = None,
    profile: ProfileFilter = None,
    output: Annotated[str | None, typer.Option("-o", "--output", metavar="FILE",
                                               help="Write to FILE instead of stdout.")] = None,
    instance: InstanceOpt = None,
    local: LocalOpt = False,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Export journal rows (oldest first, times in ISO 8601 UTC)."""
    from . import history

    socket, as_json = _opts(ctx, json_out)
    _exit(history.journal_export(state_dir, socket, fmt, since, until, provider, profile, output, as_json,
                                 instance=instance, local=local))


@replay_app.command("compare")
def replay_compare(
    ctx: typer.Context,
    a: Annotated[str, typer.Argument(metavar="A", help="Baseline: a provider, a profile or a window (--window).")],
    b: Annotated[str, typer.Argument(metavar="B", help="Candidate, compared against A.")],
    since: SinceOpt = None,
    until: UntilOpt = None,
    by: Annotated[str, typer.Option("--by", metavar="provider|profile",
                                    help="What A and B name (default: what their names are; providers when "
                                         "they are both).")] = "auto",
    window: Annotated[bool, typer.Option(
        "--window", help="A and B are time windows START..END (END empty = now), e.g. `--window 14d..7d 7d..` "
                         "compares last week with this one; --provider/--profile narrow both.")] = False,
    profile: ProfileFilter = None,
    provider: ProviderFilter = None,
    instance: InstanceOpt = None,
    local: LocalOpt = False,
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Put A and B side by side from the journal: requests, tokens, p50/p95 latency and TTFB, error and fallback
    rates, cost, cache hits, streaming; a delta column (B against A) and a one-line verdict.

    Examples: `corectl replay compare ollama-qwen3 openrouter --since 7d`;
    `corectl replay compare default coding --by profile`; `corectl replay compare --window 14d..7d 7d..`."""
    from . import history

    socket, as_json = _opts(ctx, json_out)
    _exit(history.replay_compare(state_dir, socket, a, b, by=by, window=window, since=since, until=until,
                                 profile=profile, provider=provider, as_json=as_json, instance=instance,
                                 local=local))


@app.command()
def explain(
    ctx: typer.Context,
    request_id: Annotated[str, typer.Argument(help="The request id (the x-request-id response header).")],
    state_dir: StateDirOpt = None,
    json_out: JsonOpt = False,
) -> None:
    """Why a request went where it went: candidates, order, skips, attempts, winner."""
    from . import explain as explain_mod

    socket, as_json = _opts(ctx, json_out)
    _exit(explain_mod.explain(socket, request_id, state_dir, as_json))


@app.command()
def init(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option(
        "--config", metavar="PATH", help="Where to write (default: $CODEROUTER_CONFIG, else the per-OS config "
                                         "file coderouterd reads when started without --config).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing file.")] = False,
    host: Annotated[str, typer.Option("--host", help="Where the model servers run.")] = "127.0.0.1",
    backend_port: Annotated[list[str] | None, typer.Option(
        "--backend-port", metavar="NAME=PORT", help="Probe NAME (lmstudio, ollama, llamacpp, vllm) on PORT "
                                                    "instead of its usual one (repeatable).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Find the local model servers that run (LM Studio 1234, Ollama 11434, llama.cpp 8080, vLLM 8000), list
    their models, and write a commented starter config. Never replaces an existing file without --force."""
    from . import starter

    _exit(starter.init(config, force, host, backend_port, _opts(ctx, json_out)[1]))


@app.command()
def top(
    ctx: typer.Context,
    interval: Annotated[float, typer.Option("--interval", "-i", metavar="SECONDS",
                                            help="Refresh period.")] = 1.0,
    json_out: JsonOpt = False,
) -> None:
    """A live view of the daemon, refreshed every second; q or Ctrl-C quits.

    Request rate, p50 latency and TTFB per provider, breakers, health, effective order per profile, recent
    requests and their routes, spend this month. With --json, or when stdout is not a terminal, one snapshot."""
    from . import top as top_mod

    socket, as_json = _opts(ctx, json_out)
    _exit(top_mod.top(socket, interval, as_json))


KeyNameArg = Annotated[str, typer.Argument(help="The key's name (1 to 32 letters, digits, '.', '_', "
                                                                 "'-').")]
MonthlyOpt = Annotated[str | None, typer.Option("--monthly-usd", metavar="X",
                                               help="The key's own monthly budget in USD ('none' removes it).")]
RpmOpt = Annotated[str | None, typer.Option("--rpm", metavar="N",
                                           help="At most N requests in any 60 s ('none' removes the limit).")]
TpmOpt = Annotated[str | None, typer.Option("--tpm", metavar="N", help="At most N input + output tokens in any 60 s "
                                                                      "('none' removes the limit).")]
ConcurrencyOpt = Annotated[str | None, typer.Option("--concurrency", metavar="N",
                                                   help="At most N requests in flight; more get 429 "
                                                        "('none' removes the limit).")]
ProfilesOpt = Annotated[str | None, typer.Option("--profiles", metavar="P,...",
                                                help="Only these profiles ('none': any).")]
ModelsOpt = Annotated[str | None, typer.Option("--models", metavar="GLOB,...",
                                              help="Only requested models matching these globs, e.g. 'qwen*,"
                                                   "claude-haiku-*' ('none': any).")]
ExpiresOpt = Annotated[str | None, typer.Option("--expires", metavar="WHEN",
                                               help="ISO-8601 date (the end of that day, UTC) or date-time "
                                                    "(2026-12-31T18:00Z; no zone = UTC); 'never' removes it.")]
NoteOpt = Annotated[str | None, typer.Option("--note", metavar="TEXT", help="Free text: whose key, what for.")]


@keys_app.command("create")
def keys_create(ctx: typer.Context, name: KeyNameArg, monthly_usd: MonthlyOpt = None, rpm: RpmOpt = None,
                tpm: TpmOpt = None, concurrency: ConcurrencyOpt = None, profiles: ProfilesOpt = None,
                models: ModelsOpt = None, expires: ExpiresOpt = None, note: NoteOpt = None,
                json_out: JsonOpt = False) -> None:
    """Make a key and print its secret, once (with --json: the object's `key` field)."""
    from . import keys

    socket, as_json = _opts(ctx, json_out)
    _exit(keys.run_settings(as_json, lambda: keys.settings_from(monthly_usd, rpm, tpm, concurrency, profiles,
                                                                 models, expires, note),
                            lambda s: keys.create(socket, name, s, as_json)))


@keys_app.command("list")
def keys_list(ctx: typer.Context, json_out: JsonOpt = False) -> None:
    """Every key: state, limits, scope, expiry, last use (never a secret)."""
    from . import keys

    _exit(keys.listing(*_opts(ctx, json_out)))


@keys_app.command("show")
def keys_show(ctx: typer.Context, name: KeyNameArg, json_out: JsonOpt = False) -> None:
    """One key in full."""
    from . import keys

    socket, as_json = _opts(ctx, json_out)
    _exit(keys.show(socket, name, as_json))


@keys_app.command("update")
def keys_update(ctx: typer.Context, name: KeyNameArg, monthly_usd: MonthlyOpt = None, rpm: RpmOpt = None,
                tpm: TpmOpt = None, concurrency: ConcurrencyOpt = None, profiles: ProfilesOpt = None,
                models: ModelsOpt = None, expires: ExpiresOpt = None, note: NoteOpt = None,
                json_out: JsonOpt = False) -> None:
    """Change a key's limits, scope, expiry or note; options left out stay as they are. Takes effect on every
    instance within 2 s."""
    from . import keys

    socket, as_json = _opts(ctx, json_out)
    _exit(keys.run_settings(as_json, lambda: keys.settings_from(monthly_usd, rpm, tpm, concurrency, profiles,
                                                                 models, expires, note),
                            lambda s: keys.update(socket, name, s, as_json)))


@keys_app.command("rotate")
def keys_rotate(ctx: typer.Context, name: KeyNameArg,
                grace: Annotated[float, typer.Option("--grace", metavar="SECONDS", min=0, max=30 * 86400,
                                                     help="How long the old secret keeps working.")] = 0.0,
                json_out: JsonOpt = False) -> None:
    """Give a key a new secret (printed once); the old one works until --grace ends (at once by default)."""
    from . import keys

    socket, as_json = _opts(ctx, json_out)
    _exit(keys.rotate(socket, name, grace, as_json))


@keys_app.command("revoke")
def keys_revoke(ctx: typer.Context, name: KeyNameArg, json_out: JsonOpt = False) -> None:
    """Stop a key for good, on every instance within 2 s. Its name stays in the journal and the list."""
    from . import keys

    socket, as_json = _opts(ctx, json_out)
    _exit(keys.revoke(socket, name, as_json))


@keys_app.command("delete")
def keys_delete(ctx: typer.Context, name: KeyNameArg, json_out: JsonOpt = False) -> None:
    """Forget a revoked key for good (its name can then be reused). When no key is left, requests need no key
    again."""
    from . import keys

    socket, as_json = _opts(ctx, json_out)
    _exit(keys.delete(socket, name, as_json))


def run(argv: list[str] | None = None) -> int:
    try:
        app(args=argv, prog_name="corectl")
    except SystemExit as e:
        if e.code is None:
            return 0
        return e.code if isinstance(e.code, int) else 1
    return 0
