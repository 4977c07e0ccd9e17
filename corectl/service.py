"""`corectl service install|uninstall|status`: coderouterd at login, under launchd (macOS) or systemd --user.

The service manager is driven through an injectable `run(argv) -> (exit code, output)` so tests never touch
launchctl or systemctl. `--dry-run` shows the file and the commands and changes nothing.
"""

from __future__ import annotations

import os
import plistlib
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from string import Template
from typing import Annotated

import orjson
import typer

LABEL = "dev.coderouter.coderouterd"
UNIT = "coderouterd.service"
SYSTEMCTL = ["systemctl", "--user"]
# Where supervised backends (ollama, llama-server, lms) usually live; a login service starts with a bare PATH.
STANDARD_PATH = {"macos": ("/opt/homebrew/bin", "/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"),
                 "linux": ("/usr/local/bin", "/usr/bin", "/bin")}
UNIT_FILE_STATES = frozenset({"enabled", "enabled-runtime", "linked", "linked-runtime", "alias", "masked",
                              "masked-runtime", "static", "indirect", "disabled", "generated", "transient",
                              "bad"})

Runner = Callable[[list[str]], tuple[int, str]]


class ServiceError(Exception):
    """The service cannot be installed or queried as asked; the message says why."""


def run_command(argv: list[str]) -> tuple[int, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]}: command not found"
    except subprocess.TimeoutExpired:
        return 124, f"{' '.join(argv)}: no answer within 30s"
    return p.returncode, (p.stdout + p.stderr).strip()


def detect_os(platform: str | None = None) -> str:
    platform = platform or sys.platform
    if platform == "darwin":
        return "macos"
    if platform.startswith("linux"):
        return "linux"
    raise ServiceError(f"no service manager support for {platform!r}: run coderouterd yourself")


def service_file(os_name: str, home: Path) -> Path:
    if os_name == "macos":
        return home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    return home / ".config" / "systemd" / "user" / UNIT


def log_dir(home: Path) -> Path:
    return home / "Library" / "Logs" / "coderouter"


def _template(name: str) -> str:
    return resources.files("corectl").joinpath("templates", name).read_text(encoding="utf-8")


def render_plist(daemon: str, config: str, home: Path, path_env: str) -> bytes:
    """The LaunchAgent: static keys from the template, paths filled in, serialised by plistlib."""
    plist = plistlib.loads(_template(f"{LABEL}.plist").encode())
    logs = log_dir(home)
    plist["ProgramArguments"] = [daemon, "--config", config]
    plist["StandardOutPath"] = str(logs / "coderouterd.out.log")
    plist["StandardErrorPath"] = str(logs / "coderouterd.err.log")
    plist["EnvironmentVariables"] = {"PATH": path_env}
    return plistlib.dumps(plist, sort_keys=False)


def _unit_word(arg: str) -> str:
    """One ExecStart word: systemd expands % specifiers and $VARS and splits on spaces: escape and quote."""
    escaped = arg.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    needs_quotes = not arg or any(c.isspace() or c in "\"';" for c in arg)
    return f'"{escaped}"' if needs_quotes else escaped


def render_unit(daemon: str, config: str, path_env: str) -> str:
    exec_start = " ".join(_unit_word(a) for a in (daemon, "--config", config))
    # Environment= expands specifiers but not $VARS; quoting keeps a PATH with spaces in one assignment.
    env = '"PATH=' + path_env.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") + '"'
    return Template(_template(UNIT)).substitute(exec_start=exec_start, path_env=env)


def service_path_env(os_name: str, daemon: str, current: str | None = None) -> str:
    """The venv's bin first, then the installing shell's absolute PATH entries, then the usual places."""
    shell = os.environ.get("PATH", "") if current is None else current
    entries = [str(Path(daemon).parent), *(p for p in shell.split(os.pathsep) if p.startswith("/"))]
    entries += STANDARD_PATH[os_name]
    return ":".join(dict.fromkeys(entries))


def find_daemon() -> str:
    """The coderouterd next to this Python (the venv's console script), else the one on PATH."""
    beside = Path(sys.executable).parent / "coderouterd"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside.absolute())
    found = shutil.which("coderouterd")
    if found:
        return str(Path(found).absolute())
    raise ServiceError("cannot find the coderouterd executable: install the package, or pass --daemon PATH")


def default_config(socket: str | None = None) -> str:
    """$CODEROUTER_CONFIG, else the running (or last) coderouterd's file, else the per-OS config file."""
    from coderouterd.config.loader import default_config_path

    from .target import config_for

    return config_for(None, socket).value or str(default_config_path())


@dataclass(frozen=True)
class Step:
    argv: list[str]
    required: bool = True  # False: a failure is harmless (e.g. stopping a service that is not loaded)


def _launchd_target(uid: int) -> str:
    return f"gui/{uid}/{LABEL}"


def install_steps(os_name: str, path: Path, uid: int) -> list[Step]:
    if os_name == "macos":
        # bootout first so a reinstall replaces the loaded job; enable clears an earlier `launchctl disable`.
        return [Step(["launchctl", "bootout", _launchd_target(uid)], required=False),
                Step(["launchctl", "enable", _launchd_target(uid)], required=False),
                Step(["launchctl", "bootstrap", f"gui/{uid}", str(path)])]
    return [Step([*SYSTEMCTL, "daemon-reload"]), Step([*SYSTEMCTL, "enable", "--now", UNIT])]


def uninstall_steps(os_name: str, uid: int) -> list[Step]:
    if os_name == "macos":
        return [Step(["launchctl", "bootout", _launchd_target(uid)], required=False)]
    return [Step([*SYSTEMCTL, "disable", "--now", UNIT], required=False)]


def _run_steps(steps: list[Step], runner: Runner) -> tuple[bool, list[dict]]:
    results = []
    for step in steps:
        code, out = runner(step.argv)
        results.append({"argv": step.argv, "code": code, "output": out, "required": step.required})
        if code != 0 and step.required:
            return False, results
    return True, results


def _context(os_name: str | None, home: Path | None, uid: int | None,
             runner: Runner | None) -> tuple[str, Path, int, Runner]:
    return (os_name or detect_os(), home or Path.home(), os.getuid() if uid is None else uid,
            runner or run_command)


def install(os_name: str | None = None, *, daemon: str | None = None, config: str | None = None,
            home: Path | None = None, uid: int | None = None, runner: Runner | None = None,
            dry_run: bool = False, path_env: str | None = None) -> dict:
    """Render, write and load the service. Raises ServiceError when it must not be installed as asked."""
    from coderouterd.config import ConfigError, load_config

    os_name, home, uid, runner = _context(os_name, home, uid, runner)
    daemon = str(Path(daemon).absolute()) if daemon else find_daemon()
    config = str(Path(config or default_config()).expanduser().absolute())
    if not dry_run and not os.access(daemon, os.X_OK):
        raise ServiceError(f"{daemon} is not an executable file")
    # Installing a config the daemon would refuse only produces a service that crash-loops at login; a dry run
    # says so too, rather than showing a file that the real install would then refuse to write.
    if not Path(config).is_file():
        raise ServiceError(f"there is no config file at {config}: create one with `corectl init` (it finds "
                           "your local model servers), or pass --config PATH")
    try:
        load_config(config)
    except ConfigError as e:
        raise ServiceError(f"refusing to install with an unusable config:\n{e}\n(check it with `corectl config "
                           f"check {config}`; `corectl init --force` writes a fresh one)") from None
    path_env = path_env or service_path_env(os_name, daemon)
    if os_name == "macos":
        content = render_plist(daemon, config, home, path_env)
    else:
        content = render_unit(daemon, config, path_env).encode()
    path = service_file(os_name, home)
    steps = install_steps(os_name, path, uid)
    report = {"action": "install", "os": os_name, "path": str(path), "daemon": daemon, "config": config,
              "dry_run": dry_run, "commands": [s.argv for s in steps], "content": content.decode()}
    if dry_run:
        return {**report, "ok": True, "results": []}
    was_active = os_name == "linux" and runner([*SYSTEMCTL, "is-active", UNIT])[0] == 0
    if os_name == "macos":
        log_dir(home).mkdir(parents=True, exist_ok=True)
    _write(path, content)
    if was_active:
        # enable --now leaves a running unit on its old definition; restart puts the new one in force.
        steps.append(Step([*SYSTEMCTL, "restart", UNIT]))
        report["commands"] = [s.argv for s in steps]
    ok, results = _run_steps(steps, runner)
    return {**report, "ok": ok, "results": results}


def _write(path: Path, content: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(content)
    tmp.chmod(0o644)
    tmp.replace(path)


def uninstall(os_name: str | None = None, *, home: Path | None = None, uid: int | None = None,
              runner: Runner | None = None, dry_run: bool = False) -> dict:
    """Stop the service, remove its file, and tell the service manager."""
    os_name, home, uid, runner = _context(os_name, home, uid, runner)
    path = service_file(os_name, home)
    steps = uninstall_steps(os_name, uid)
    after = [Step([*SYSTEMCTL, "daemon-reload"])] if os_name == "linux" else []
    report = {"action": "uninstall", "os": os_name, "path": str(path), "installed": path.exists(),
              "dry_run": dry_run, "commands": [s.argv for s in steps + after]}
    if dry_run:
        return {**report, "ok": True, "results": []}
    ok, results = _run_steps(steps, runner)
    path.unlink(missing_ok=True)
    if ok and after:
        ok, more = _run_steps(after, runner)
        results += more
    return {**report, "ok": ok, "results": results}


def _field(text: str, key: str) -> str | None:
    for line in text.splitlines():
        name, sep, value = line.strip().partition(" = ")
        if sep and name == key:
            return value.strip()
    return None


def status(os_name: str | None = None, *, home: Path | None = None, uid: int | None = None,
           runner: Runner | None = None) -> dict:
    """Installed (file present), loaded/enabled and running, from the service manager's own answers."""
    os_name, home, uid, runner = _context(os_name, home, uid, runner)
    path = service_file(os_name, home)
    report: dict = {"os": os_name, "path": str(path), "installed": path.exists()}
    if os_name == "macos":
        code, out = runner(["launchctl", "print", _launchd_target(uid)])
        state = _field(out, "state") if code == 0 else None
        pid = _field(out, "pid") if code == 0 else None
        report.update(loaded=code == 0, active=state == "running", state=state or "not loaded",
                      pid=int(pid) if pid and pid.isdigit() else None)
        return report
    words = runner([*SYSTEMCTL, "is-enabled", UNIT])[1].split()
    # An unknown unit answers with an error sentence on stderr rather than a state word.
    enabled = words[0] if words and words[0] in UNIT_FILE_STATES else "not-found"
    code, active = runner([*SYSTEMCTL, "is-active", UNIT])
    pid = runner([*SYSTEMCTL, "show", "-p", "MainPID", "--value", UNIT])[1].strip()
    state = active.split()[0] if active.split() else "unknown"
    loaded = enabled in ("enabled", "enabled-runtime", "linked", "linked-runtime")
    report.update(loaded=loaded, enabled=enabled, active=code == 0, state=state,
                  pid=int(pid) if pid.isdigit() and pid != "0" else None)
    return report


def status_exit_code(report: dict) -> int:
    """0 running, 3 installed but not running or not installed (corectl's 'coderouterd is not running')."""
    return 0 if report.get("active") else 3


# -- examples shipped in the repository ---------------------------------------------------------------------

EXAMPLES = {
    "macos": ("/Users/USER/coderouter/.venv/bin/coderouterd",
              "/Users/USER/Library/Application Support/coderouter/config.toml", Path("/Users/USER")),
    "linux": ("/home/USER/coderouter/.venv/bin/coderouterd",
              "/home/USER/.config/coderouter/config.toml", Path("/home/USER")),
}


def render_examples() -> dict[str, bytes]:
    """The documented example files (repo-relative path -> content), rendered with placeholder paths."""
    mac_daemon, mac_config, mac_home = EXAMPLES["macos"]
    lin_daemon, lin_config, _ = EXAMPLES["linux"]
    return {
        f"launchd/{LABEL}.plist": render_plist(mac_daemon, mac_config, mac_home,
                                               service_path_env("macos", mac_daemon, "")),
        f"systemd/{UNIT}": render_unit(lin_daemon, lin_config,
                                       service_path_env("linux", lin_daemon, "")).encode(),
    }


def write_examples(root: Path) -> list[Path]:
    written = []
    for rel, content in render_examples().items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        written.append(target)
    return written


# -- CLI ----------------------------------------------------------------------------------------------------

service_app = typer.Typer(help="Run coderouterd at login: launchd on macOS, a systemd user unit on Linux.",
                          no_args_is_help=True, pretty_exceptions_enable=False)

OsOpt = Annotated[str | None, typer.Option("--os", help="macos or linux (default: this machine's).")]
DryOpt = Annotated[bool, typer.Option("--dry-run", help="Show the file and the commands; change nothing.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON.")]


def _as_json(ctx: typer.Context, flag: bool) -> bool:
    return flag or bool(getattr(ctx.find_root().obj, "json", False))


def _check_os(os_name: str | None) -> str | None:
    if os_name not in (None, "macos", "linux"):
        raise ServiceError(f"--os must be macos or linux, not {os_name!r}")
    return os_name


def _emit(report: dict, as_json: bool, human: Callable[[dict], None]) -> None:
    if as_json:
        typer.echo(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode())
    else:
        human(report)


def _fail(e: ServiceError, as_json: bool) -> None:
    if as_json:
        typer.echo(orjson.dumps({"ok": False, "error": str(e)}, option=orjson.OPT_INDENT_2).decode())
    typer.echo(f"corectl: {e}", err=True)
    raise typer.Exit(1)


def _print_changes(report: dict) -> None:
    verb = {"install": "write", "uninstall": "remove"}[report["action"]]
    if report["dry_run"]:
        if report["action"] == "install":
            typer.echo(f"# would {verb} {report['path']}:\n")
            typer.echo(report["content"])
        else:
            typer.echo(f"# would {verb} {report['path']}")
        typer.echo("# would run:")
        for argv in report["commands"]:
            typer.echo("  " + " ".join(argv))
        if report["action"] == "install" and report["os"] == "linux":
            typer.echo(f"  ({' '.join(SYSTEMCTL)} restart {UNIT}, if it is already running)")
        return
    typer.echo(f"{'wrote' if report['action'] == 'install' else 'removed'} {report['path']}")
    for r in report["results"]:
        mark = "ok" if r["code"] == 0 else ("failed" if r["required"] else "not needed")
        typer.echo(f"  [{mark}] {' '.join(r['argv'])}")
        if r["code"] and r["output"]:
            typer.echo(f"      {r['output']}")
    if not report["ok"]:
        typer.echo("the service manager refused: see the output above", err=True)


@service_app.command("install")
def install_cmd(
    ctx: typer.Context,
    config: Annotated[str | None, typer.Option("--config", metavar="PATH",
                                               help="Config file the service runs with (default: "
                                                    "$CODEROUTER_CONFIG, else the running coderouterd's, else the "
                                                    "per-OS file).")] = None,
    daemon: Annotated[str | None, typer.Option("--daemon", metavar="PATH",
                                               help="coderouterd executable (default: this venv's).")] = None,
    os_name: OsOpt = None, dry_run: DryOpt = False, json_out: JsonOpt = False,
) -> None:
    """Write the launchd agent or systemd user unit and start it now and at every login."""
    as_json = _as_json(ctx, json_out)
    try:
        socket = getattr(ctx.find_root().obj, "socket", None)
        report = install(_check_os(os_name), daemon=daemon, config=config or default_config(socket),
                         dry_run=dry_run)
    except ServiceError as e:
        _fail(e, as_json)
    _emit(report, as_json, _print_changes)
    if not report["ok"]:
        raise typer.Exit(1)


@service_app.command("uninstall")
def uninstall_cmd(ctx: typer.Context, os_name: OsOpt = None, dry_run: DryOpt = False,
                  json_out: JsonOpt = False) -> None:
    """Stop the service and remove its file."""
    as_json = _as_json(ctx, json_out)
    try:
        report = uninstall(_check_os(os_name), dry_run=dry_run)
    except ServiceError as e:
        _fail(e, as_json)
    _emit(report, as_json, _print_changes)
    if not report["ok"]:
        raise typer.Exit(1)


def _print_status(report: dict) -> None:
    if not report["installed"]:
        typer.echo(f"not installed ({report['path']} does not exist): corectl service install")
        return
    pid = f", pid {report['pid']}" if report.get("pid") else ""
    loaded = "loaded" if report["loaded"] else "not loaded"
    typer.echo(f"installed at {report['path']}; {loaded}; {report['state']}{pid}")


@service_app.command("status")
def status_cmd(ctx: typer.Context, os_name: OsOpt = None, json_out: JsonOpt = False) -> None:
    """Installed? Loaded? Running? Exit 0 when running, 3 when not."""
    as_json = _as_json(ctx, json_out)
    try:
        report = status(_check_os(os_name))
    except ServiceError as e:
        _fail(e, as_json)
    _emit(report, as_json, _print_status)
    code = status_exit_code(report)
    if code:
        raise typer.Exit(code)
