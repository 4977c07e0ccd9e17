"""`corectl service`: rendered launchd/systemd files, and install/uninstall/status through an injected runner."""

import configparser
import plistlib
import shlex
import shutil
import subprocess
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from corectl import service
from corectl.service import (
    LABEL,
    ServiceError,
    detect_os,
    install,
    render_examples,
    render_plist,
    render_unit,
    service_app,
    status,
    status_exit_code,
    uninstall,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = """
[providers.local]
base_url = "http://127.0.0.1:11434/v1"
[profiles.default]
providers = ["local"]
"""


class Recorder:
    """A service-manager stand-in: records argv lists, answers from a table of (argv prefix -> result)."""

    def __init__(self, answers: dict[tuple[str, ...], tuple[int, str]] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.answers = answers or {}

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.calls.append(argv)
        for prefix, answer in self.answers.items():
            if tuple(argv[:len(prefix)]) == prefix:
                return answer
        return 0, ""


def refuse(argv: list[str]) -> tuple[int, str]:
    raise AssertionError(f"the runner must not be called, got {argv}")


@pytest.fixture
def setup(tmp_path):
    """A tmp HOME, an executable daemon whose path has a space, and a valid config file."""
    home = tmp_path / "home"
    home.mkdir()
    bindir = tmp_path / "my venv" / "bin"
    bindir.mkdir(parents=True)
    daemon = bindir / "coderouterd"
    daemon.write_text("#!/bin/sh\nexit 0\n")
    daemon.chmod(0o755)
    config = tmp_path / "config dir" / "config.toml"
    config.parent.mkdir()
    config.write_text(CONFIG)
    return home, str(daemon), str(config)


def parse_unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read_string(text)
    return parser


def test_plist_has_the_launchd_keys(setup):
    home, daemon, config = setup
    plist = plistlib.loads(render_plist(daemon, config, home, "/venv/bin:/usr/bin"))
    assert plist["Label"] == LABEL == "dev.coderouter.coderouterd"
    assert plist["ProgramArguments"] == [daemon, "--config", config]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ThrottleInterval"] == 10
    logs = home / "Library" / "Logs" / "coderouter"
    assert Path(plist["StandardOutPath"]).parent == logs and Path(plist["StandardErrorPath"]).parent == logs
    assert plist["StandardOutPath"] != plist["StandardErrorPath"]
    assert plist["EnvironmentVariables"] == {"PATH": "/venv/bin:/usr/bin"}


def test_unit_structure_and_quoting(setup):
    _, daemon, config = setup
    unit = parse_unit(render_unit(daemon, config, "/a b/bin:/usr/bin"))
    assert unit.sections() == ["Unit", "Service", "Install"]
    assert unit["Unit"]["StartLimitIntervalSec"] == "60" and unit["Unit"]["StartLimitBurst"] == "5"
    svc = unit["Service"]
    assert svc["Type"] == "simple"
    assert shlex.split(svc["ExecStart"]) == [daemon, "--config", config]  # paths with spaces stay whole
    assert svc["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert svc["Restart"] == "on-failure" and svc["RestartSec"] == "2"
    # Keys come from ~/.config/coderouter/env, which the daemon reads itself (one mechanism for both managers).
    assert "EnvironmentFile" not in svc
    assert svc["Environment"] == '"PATH=/a b/bin:/usr/bin"'
    assert unit["Install"]["WantedBy"] == "default.target"


def test_unit_escapes_systemd_specials():
    unit = parse_unit(render_unit("/opt/100%/coderouterd", "/cfg/$HOME/c.toml", "/usr/bin"))
    assert unit["Service"]["ExecStart"] == "/opt/100%%/coderouterd --config /cfg/$$HOME/c.toml"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_passes_systemd_analyze_verify(setup, tmp_path):
    _, daemon, config = setup
    unit = tmp_path / "coderouterd.service"
    unit.write_text(render_unit(daemon, config, "/usr/bin:/bin"))
    p = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=30)
    output = p.stdout + p.stderr
    if "Failed to initialize manager" in output:
        pytest.skip(f"systemd-analyze cannot run here: {output.strip()}")
    assert p.returncode == 0, output
    # verify only warns (exit 0) about unknown keys: any line about our unit is a defect.
    assert "coderouterd.service" not in output, output


def test_repository_examples_are_the_rendered_templates():
    for rel, content in render_examples().items():
        assert (REPO / rel).read_bytes() == content, f"{rel} is stale: regenerate with service.write_examples()"
    plist = plistlib.loads((REPO / "launchd" / f"{LABEL}.plist").read_bytes())
    assert plist["ProgramArguments"][1] == "--config"
    parse_unit((REPO / "systemd" / "coderouterd.service").read_text())


def test_install_linux_writes_the_unit_and_enables_it(setup):
    home, daemon, config = setup
    runner = Recorder({("systemctl", "--user", "is-active"): (3, "inactive")})
    report = install("linux", daemon=daemon, config=config, home=home, runner=runner, path_env="/usr/bin")
    path = home / ".config" / "systemd" / "user" / "coderouterd.service"
    assert report["ok"] and report["path"] == str(path)
    assert path.read_text() == render_unit(daemon, config, "/usr/bin")
    assert runner.calls == [["systemctl", "--user", "is-active", "coderouterd.service"],
                            ["systemctl", "--user", "daemon-reload"],
                            ["systemctl", "--user", "enable", "--now", "coderouterd.service"]]


def test_reinstall_linux_restarts_a_running_unit(setup):
    home, daemon, config = setup
    runner = Recorder()  # is-active answers 0: already running
    report = install("linux", daemon=daemon, config=config, home=home, runner=runner)
    assert report["ok"]
    assert runner.calls[-1] == ["systemctl", "--user", "restart", "coderouterd.service"]


def test_install_macos_writes_the_agent_and_bootstraps_it(setup):
    home, daemon, config = setup
    runner = Recorder({("launchctl", "bootout"): (3, "Boot-out failed: 3: No such process")})
    report = install("macos", daemon=daemon, config=config, home=home, uid=501, runner=runner)
    path = home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
    assert report["ok"], report
    assert plistlib.loads(path.read_bytes())["ProgramArguments"] == [daemon, "--config", config]
    assert (home / "Library" / "Logs" / "coderouter").is_dir()
    assert runner.calls == [["launchctl", "bootout", f"gui/501/{LABEL}"],
                            ["launchctl", "enable", f"gui/501/{LABEL}"],
                            ["launchctl", "bootstrap", "gui/501", str(path)]]
    # The PATH puts the venv first, so supervised tools installed beside coderouterd are found.
    assert plistlib.loads(path.read_bytes())["EnvironmentVariables"]["PATH"].startswith(str(Path(daemon).parent))


def test_install_reports_a_refusing_service_manager(setup):
    home, daemon, config = setup
    runner = Recorder({("launchctl", "bootstrap"): (5, "Bootstrap failed: 5: Input/output error")})
    report = install("macos", daemon=daemon, config=config, home=home, uid=501, runner=runner)
    assert report["ok"] is False
    assert report["results"][-1]["code"] == 5 and "Input/output" in report["results"][-1]["output"]


def test_dry_run_writes_nothing_and_runs_nothing(setup):
    home, daemon, config = setup
    for os_name in ("macos", "linux"):
        report = install(os_name, daemon=daemon, config=config, home=home, uid=501, runner=refuse, dry_run=True)
        assert report["dry_run"] and report["ok"] and report["results"] == []
        assert report["commands"] and daemon in report["content"]
        gone = uninstall(os_name, home=home, uid=501, runner=refuse, dry_run=True)
        assert gone["commands"] and gone["results"] == []
    assert list(home.iterdir()) == []


def test_install_refuses_bad_config_or_daemon(setup, tmp_path):
    home, daemon, config = setup
    bad = tmp_path / "bad.toml"
    bad.write_text("[providers.x]\nkind = 'openai'\n")
    with pytest.raises(ServiceError, match="unusable config"):
        install("linux", daemon=daemon, config=str(bad), home=home, runner=refuse)
    with pytest.raises(ServiceError, match="not an executable"):
        install("linux", daemon=str(tmp_path / "missing"), config=config, home=home, runner=refuse)
    assert list(home.iterdir()) == []


def test_uninstall_linux_stops_and_removes(setup):
    home, daemon, config = setup
    install("linux", daemon=daemon, config=config, home=home, runner=Recorder())
    runner = Recorder()
    report = uninstall("linux", home=home, runner=runner)
    assert report["ok"] and report["installed"]
    assert not (home / ".config" / "systemd" / "user" / "coderouterd.service").exists()
    assert runner.calls == [["systemctl", "--user", "disable", "--now", "coderouterd.service"],
                            ["systemctl", "--user", "daemon-reload"]]


def test_uninstall_macos_when_not_loaded_still_removes(setup):
    home, daemon, config = setup
    install("macos", daemon=daemon, config=config, home=home, uid=501, runner=Recorder())
    runner = Recorder({("launchctl", "bootout"): (113, "Could not find specified service")})
    report = uninstall("macos", home=home, uid=501, runner=runner)
    assert report["ok"]
    assert runner.calls == [["launchctl", "bootout", f"gui/501/{LABEL}"]]
    assert not (home / "Library" / "LaunchAgents" / f"{LABEL}.plist").exists()


def test_status_macos(setup):
    home, daemon, config = setup
    install("macos", daemon=daemon, config=config, home=home, uid=501, runner=Recorder())
    printed = f"gui/501/{LABEL} = {{\n\tactive count = 1\n\tstate = running\n\tpid = 4242\n}}\n"
    report = status("macos", home=home, uid=501, runner=Recorder({("launchctl", "print"): (0, printed)}))
    assert report == {"os": "macos", "path": str(home / "Library" / "LaunchAgents" / f"{LABEL}.plist"),
                      "installed": True, "loaded": True, "active": True, "state": "running", "pid": 4242}
    assert status_exit_code(report) == 0
    missing = status("macos", home=home, uid=501,
                     runner=Recorder({("launchctl", "print"): (113, "Could not find service")}))
    assert missing["loaded"] is False and missing["active"] is False and missing["pid"] is None
    assert status_exit_code(missing) == 3


def test_status_linux(setup):
    home, _, _ = setup
    runner = Recorder({("systemctl", "--user", "is-enabled"): (0, "enabled\n"),
                       ("systemctl", "--user", "is-active"): (0, "active\n"),
                       ("systemctl", "--user", "show"): (0, "777\n")})
    report = status("linux", home=home, runner=runner)
    assert report["installed"] is False  # no unit file in this HOME, whatever systemd says
    assert report["loaded"] and report["active"] and report["state"] == "active" and report["pid"] == 777
    down = status("linux", home=home, runner=Recorder({
        ("systemctl", "--user", "is-enabled"): (1, "Failed to get unit file state for coderouterd.service: No such"),
        ("systemctl", "--user", "is-active"): (3, "inactive\n"),
        ("systemctl", "--user", "show"): (0, "0\n")}))
    assert down["enabled"] == "not-found" and not down["loaded"] and down["state"] == "inactive"
    assert down["pid"] is None and status_exit_code(down) == 3


def test_detect_os():
    assert detect_os("darwin") == "macos"
    assert detect_os("linux") == "linux"
    with pytest.raises(ServiceError):
        detect_os("win32")


def test_cli_dry_run_json(setup, monkeypatch):
    home, daemon, config = setup
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(service, "run_command", refuse)
    runner = CliRunner()
    result = runner.invoke(service_app, ["install", "--os", "linux", "--dry-run", "--json", "--daemon", daemon,
                                         "--config", config])
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert data["dry_run"] and data["path"] == str(home / ".config/systemd/user/coderouterd.service")
    assert ["systemctl", "--user", "enable", "--now", "coderouterd.service"] in data["commands"]
    human = runner.invoke(service_app, ["install", "--os", "macos", "--dry-run", "--daemon", daemon,
                                        "--config", config])
    assert human.exit_code == 0 and "<key>ProgramArguments</key>" in human.stdout
    assert "launchctl bootstrap" in human.stdout
    assert list(home.iterdir()) == []
    bad_os = runner.invoke(service_app, ["status", "--os", "windows"])
    assert bad_os.exit_code == 1 and "--os must be macos or linux" in bad_os.output
