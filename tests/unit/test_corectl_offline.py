"""corectl without a daemon: argument fast path, socket discovery, errors and exit codes, config check,
rendering. In-process (main(argv)) for speed; the e2e file drives the real subprocess against a daemon."""

from __future__ import annotations

import os
import socket
import sys

import orjson
import pytest

from corectl import __version__, commands, fast
from corectl.__main__ import main
from corectl.client import cheap_socket_path, resolve_socket, start_command

VALID = """
[providers.local]
kind = "openai"
base_url = "http://127.0.0.1:1/v1"
model = "m"

[profiles.default]
providers = ["local"]

[profiles.fast]
providers = ["local"]
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for k in ("CODEROUTER_SOCKET", "CODEROUTER_ADMIN__SOCKET", "CODEROUTER_STATE__DIR", "CODEROUTER_STATE_DIR",
              "CODEROUTER_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    # Keep the per-OS locations inside the test's directory.
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))


# -- fast path grammar ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, expected", [
    (["status"], (None, [], False)),
    (["status", "--json"], (None, [], True)),
    (["--json", "status"], (None, [], True)),
    (["--socket", "/s", "status"], ("/s", [], False)),
    (["--socket=/s", "--json", "profile", "list"], ("/s", [], True)),
    (["profile", "use", "coding"], (None, ["coding"], False)),
    (["profile", "show", "coding", "--json"], (None, ["coding"], True)),
    (["reload"], (None, [], False)),
])
def test_fast_path_recognises_plain_commands(argv, expected):
    parsed = fast.parse(argv)
    assert parsed is not None
    _, sock, positional, as_json = parsed
    assert (sock, positional, as_json) == expected


@pytest.mark.parametrize("argv", [
    [], ["--help"], ["status", "--help"], ["status", "extra"], ["profile", "use"], ["profile", "use", "a", "b"],
    ["profile", "use", "--weird"], ["--socket"], ["--verbose", "status"], ["config", "check"], ["--version"],
    ["statu"], ["profile"],
])
def test_fast_path_leaves_everything_else_to_typer(argv):
    assert fast.parse(argv) is None


def test_fast_path_takes_socket_from_environment(monkeypatch):
    monkeypatch.setenv("CODEROUTER_SOCKET", "/env.sock")
    assert fast.parse(["status"])[1] == "/env.sock"
    assert fast.parse(["--socket", "/flag.sock", "status"])[1] == "/flag.sock"


# -- socket discovery ----------------------------------------------------------------------------------------

def test_cheap_socket_path_follows_the_daemon_rules(monkeypatch, tmp_path):
    assert cheap_socket_path() == str(tmp_path / "xdg-state" / "coderouter" / "coderouterd.sock")
    monkeypatch.setenv("CODEROUTER_STATE_DIR", "/var/a")
    assert cheap_socket_path() == "/var/a/coderouterd.sock"
    monkeypatch.setenv("CODEROUTER_STATE__DIR", "/var/b")
    assert cheap_socket_path() == "/var/b/coderouterd.sock"
    monkeypatch.setenv("CODEROUTER_ADMIN__SOCKET", "/run/c.sock")
    assert cheap_socket_path() == "/run/c.sock"


def test_resolve_socket_follows_the_published_record_not_the_config(monkeypatch, tmp_path):
    from coderouterd import discovery

    cfg = tmp_path / "c.toml"
    cfg.write_text(VALID + f'\n[admin]\nsocket = "{tmp_path / "from-config.sock"}"\n')
    monkeypatch.setenv("CODEROUTER_CONFIG", str(cfg))
    # The config is never parsed to find the socket: nothing published -> the default path.
    assert resolve_socket(None) == cheap_socket_path()
    sock = tmp_path / "custom" / "admin.sock"
    record = discovery.make_record(pid=os.getpid(), version="x", api_version=1, socket=str(sock),
                                   config_path=str(cfg), embedded=False, state_dir=str(tmp_path / "st"),
                                   listen_url="http://127.0.0.1:1", started_at=0.0)
    discovery.publish(record)
    assert resolve_socket(None) == str(sock)
    assert resolve_socket("/explicit.sock") == "/explicit.sock"
    # A record whose process is gone (a crash) is not a running daemon, but stays the last record.
    discovery.publish({**record, "pid": 2 ** 22 + 12345})
    assert resolve_socket(None) == cheap_socket_path()
    assert discovery.read_last()["socket"] == str(sock)
    discovery.withdraw(2 ** 22 + 12345)
    assert discovery.read_live() is None and discovery.read_last() is not None


def test_published_record_is_private_and_withdrawn_only_by_its_owner(tmp_path):
    import stat

    from coderouterd import discovery

    d = tmp_path / "disc"
    discovery.publish({"pid": os.getpid(), "socket": "/s"}, d)
    for name in (discovery.RECORD_NAME, discovery.LAST_RECORD_NAME):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600
    discovery.withdraw(os.getpid() + 1, d)
    assert (d / discovery.RECORD_NAME).exists()
    discovery.withdraw(os.getpid(), d)
    assert not (d / discovery.RECORD_NAME).exists() and (d / discovery.LAST_RECORD_NAME).exists()
    assert [p.name for p in d.iterdir() if p.name.startswith(".")] == []  # no temporary file left


# -- daemon not running --------------------------------------------------------------------------------------

def test_not_running_is_one_line_and_exit_3(capsys, tmp_path):
    missing = tmp_path / "nope.sock"
    assert main(["--socket", str(missing), "status"]) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"corectl: coderouterd is not running (no socket at {missing}). "
                   f"Start it with: {start_command()}\n")


def test_stale_socket_file_is_reported_as_not_running(capsys, tmp_path):
    path = tmp_path / "stale.sock"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays, nobody listens: what a crashed daemon leaves
    assert main(["--socket", str(path), "profile", "list"]) == 3
    err = capsys.readouterr().err
    assert "coderouterd is not running (nothing is listening on the socket" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [
    ["status", "--json"], ["profile", "use", "x", "--json"], ["reload", "--json"], ["--json", "profile", "list"],
])
def test_not_running_with_json_prints_a_json_error_too(capsys, tmp_path, argv):
    assert main(["--socket", str(tmp_path / "none.sock"), *argv]) == 3
    out, err = capsys.readouterr()
    doc = orjson.loads(out)
    assert doc["ok"] is False and doc["running"] is False and "not running" in doc["error"]
    assert err.startswith("corectl: coderouterd is not running")


def test_typer_path_reports_not_running_the_same_way(capsys, tmp_path):
    # "--" is not in the fast path's grammar, so this goes through Typer to the same command code.
    assert fast.parse(["profile", "show", "--", "x"]) is None
    assert main(["--socket", str(tmp_path / "x.sock"), "profile", "show", "--", "x"]) == 3
    assert "not running" in capsys.readouterr().err


# -- Typer surface -------------------------------------------------------------------------------------------

def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"corectl {__version__}"


def test_help_lists_commands_and_exit_codes(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for word in ("status", "profile", "reload", "config", "--socket", "--install-completion", "Exit codes"):
        assert word in out


def test_unknown_command_is_a_usage_error(capsys):
    assert main(["frobnicate"]) == 2
    assert "frobnicate" in capsys.readouterr().err


def test_completion_script_is_available(capsys, monkeypatch):
    # Typer finds the shell by walking this process's parents (shellingham). Under `make test` started from a
    # detached job, no parent is a shell and the answer is "Shell  not supported": play the user's bash.
    import shellingham
    monkeypatch.setattr(shellingham, "detect_shell", lambda *a, **k: ("bash", "/bin/bash"))
    assert main(["--show-completion"]) == 0
    assert "_CORECTL_COMPLETE" in capsys.readouterr().out


# -- config check (offline) ----------------------------------------------------------------------------------

def test_config_check_valid_file(capsys, tmp_path):
    cfg = tmp_path / "ok.toml"
    cfg.write_text(VALID)
    assert main(["config", "check", str(cfg)]) == 0
    assert "OK (1 providers, 2 profiles, default profile default)" in capsys.readouterr().out
    assert main(["config", "check", str(cfg), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc == {"ok": True, "path": str(cfg.resolve()), "providers": ["local"], "profiles": ["default", "fast"],
                   "default_profile": "default", "from": "--config", "no_key": {}, "unused": [], "unstartable": {}}


def test_config_check_invalid_file_names_the_key(capsys, tmp_path):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(VALID.replace('providers = ["local"]\n\n[profiles.fast]', 'providers = ["ghost"]\n\n'
                                                                                '[profiles.fast]'))
    assert main(["config", "check", str(cfg)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert "profiles.default.providers[0]: unknown provider 'ghost'" in err
    assert main(["--json", "config", "check", str(cfg)]) == 1
    assert "unknown provider 'ghost'" in orjson.loads(capsys.readouterr().out)["error"]


def test_config_check_messages_match_the_daemon(capsys, tmp_path):
    from coderouterd.config import ConfigError, load_config

    cfg = tmp_path / "bad.toml"
    cfg.write_text("[server]\nport = 'x'\n")
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg))
    assert commands.config_check(str(cfg), False) == 1
    assert capsys.readouterr().err == f"corectl: {e.value}\n"


def test_config_check_missing_file_and_default(capsys, tmp_path):
    assert main(["config", "check", str(tmp_path / "absent.toml")]) == 1
    assert "cannot read config file" in capsys.readouterr().err
    # No path and no config anywhere: the daemon would run on the embedded default, which is valid.
    assert main(["config", "check"]) == 0
    assert "<embedded default>: OK" in capsys.readouterr().out


def test_config_check_names_settings_that_no_longer_do_anything(capsys, tmp_path):
    cfg = tmp_path / "old.toml"
    cfg.write_text(VALID + '\n[profiles.old]\nproviders = ["local"]\nhealth_threshold = 5\n')
    assert commands.config_check(str(cfg), False) == 0
    assert "profiles.old.health_threshold is no longer used: [breaker] failures (3)" in capsys.readouterr().out


def test_config_check_reports_a_process_that_cannot_start(capsys, tmp_path):
    cfg = tmp_path / "proc.toml"
    model = tmp_path / "models" / "coder.gguf"
    cfg.write_text(VALID.replace('model = "m"\n', f'model = "m"\nprocess = {{ command = ["{tmp_path}/bin/llama-server", '
                                                  f'"-m", "{model}"] }}\n', 1))
    assert commands.config_check(str(cfg), False) == 1
    out = capsys.readouterr().out
    assert f"process local cannot start: binary '{tmp_path}/bin/llama-server' not found; model file '{model}' " \
           "not found" in out, out


def test_config_check_does_not_need_typer_or_a_daemon(tmp_path):
    cfg = tmp_path / "ok.toml"
    cfg.write_text(VALID)
    assert commands.config_check(str(cfg), True) == 0


# -- rendering -----------------------------------------------------------------------------------------------

STATUS = {
    "version": "9.9.9", "pid": 4242, "uptime_s": 3725.0,
    "listen": {"host": "127.0.0.1", "port": 8088, "url": "http://127.0.0.1:8088"},
    "config_path": "/home/u/.config/coderouter/config.toml", "admin_socket": "/tmp/s.sock",
    "active_profile": "coding", "default_profile": "default",
    "last_reload_error": "config.toml: invalid configuration:\nprofiles.x.providers[0]: unknown provider 'q'",
    "stats_window_s": 60.0,
    "providers": [
        {"name": "ollama-qwen", "kind": "openai", "base_url": "http://127.0.0.1:11434/v1", "model": "qwen3",
         "paid": False, "breaker": {"state": "open", "retry_in_s": 12.4}, "health": "UNHEALTHY",
         "availability": {"available": False, "code": "breaker_open", "failures": 3, "retry_in_s": 12.4,
                          "why": "breaker open after 3 failures, retry in 12 s"},
         "state": {"word": "down: breaker open", "kind": "bad", "problem": "down", "code": "breaker_open",
                   "takes_traffic": False},
         "figures": {"samples": 7, "probes": 2, "errors": 3, "median_s": 0.2345}},
        {"name": "claude", "kind": "anthropic", "base_url": "https://api.anthropic.com", "model": "",
         "paid": True, "breaker": {"state": "closed"}, "health": "HEALTHY",
         "availability": {"available": True, "code": "ok", "why": "can take traffic", "failures": 0},
         "state": {"word": "healthy", "kind": "ok", "problem": None, "code": "ok", "takes_traffic": True},
         "figures": {"samples": 0, "probes": 0, "errors": 0, "median_s": None}},
    ],
    "profiles": [
        {"name": "coding", "active": True, "providers": ["ollama-qwen", "claude"], "mode": "fallback",
         "adaptive": True, "effective_order": ["claude"],
         "skips": [{"provider": "ollama-qwen", "reason": "breaker_open", "message": "open"}]},
        {"name": "default", "active": False, "providers": ["claude"], "mode": "race", "adaptive": False,
         "effective_order": ["claude"], "skips": []},
    ],
}


def _render(fn, *args) -> str:
    from rich.console import Console

    con = Console(width=160, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    fn(*args, con)
    text = con.export_text()
    con.file.close()
    return text


def test_status_rendering_shows_every_figure():
    from corectl import render

    text = _render(render.status, STATUS)
    for needle in ("coderouterd 9.9.9", "pid 4242", "up 1h 02m", "http://127.0.0.1:8088", "config.toml",
                   "/tmp/s.sock", "coding", "(default: default)", "last reload failed",
                   "unknown provider 'q'", "ollama-qwen", "open (12s)", "234 ms", "anthropic $",
                   "down: breaker open", "ollama-qwen: no traffic: breaker open after 3 failures, retry in 12 s",
                   "(client's)", "claude", "skipped: ollama-qwen (breaker_open)", "fallback adaptive", "race",
                   "figures over the last 60 s"):
        assert needle in text, needle
    row = next(line for line in text.splitlines() if "ollama-qwen" in line and "qwen3" in line)
    assert " 5 " in row and " 3 " in row  # requests exclude probes; errors


def test_profile_detail_rendering():
    from corectl import render

    detail = {
        "name": "coding", "active": True, "default": False,
        "settings": {"mode": "race", "race_width": 2, "adaptive": False, "health_action": "demote",
                     "out_after_failures": 3, "tool_loop": {"action": "break", "threshold": 3, "window": 5}},
        "effective_order": ["b", "a"], "skips": [], "routes": ["*haiku*"],
        "providers": [{"name": "a", "kind": "openai", "base_url": "http://a/v1", "model": "m", "paid": False},
                      {"name": "b", "kind": "anthropic", "base_url": "https://b", "model": "", "paid": True}],
    }
    text = _render(render.profile_detail, detail)
    for needle in ("coding", "(active)", "race, width 2", "demote after 3 failures", "break at 3 repeats",
                   "b > a", "*haiku*", "http://a/v1", "anthropic $"):
        assert needle in text, needle


@pytest.mark.parametrize("seconds, text", [(5, "5s"), (65, "1m 05s"), (7322, "2h 02m"), (90000, "1d 1h")])
def test_duration(seconds, text):
    from corectl.render import duration

    assert duration(seconds) == text


def test_status_path_does_not_import_typer_or_pydantic(tmp_path):
    import subprocess

    code = ("import sys; from corectl.__main__ import main; rc = main(['--socket', sys.argv[1], 'status']); "
            "bad = [m for m in ('typer', 'click', 'pydantic', 'httpx', 'coderouterd.config') if m in sys.modules]; "
            "print(rc, bad)")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "none.sock")], capture_output=True, text=True,
                       timeout=30)
    assert r.stdout.strip() == "3 []", r.stdout + r.stderr


def test_narrow_terminal_drops_the_base_url_column():
    from rich.console import Console

    from corectl import render

    con = Console(width=80, record=True, file=open("/dev/null", "w"), color_system=None)  # noqa: SIM115
    render.status(STATUS, con)
    text = con.export_text()
    con.file.close()
    assert "ollama-qwen" in text and "http://127.0.0.1:11434/v1" not in text
    assert all(len(line) <= 80 for line in text.splitlines())


# -- admin API version -----------------------------------------------------------------------------------------

def _serve_once_on(path, version: str) -> None:
    """A one-connection HTTP server on a Unix socket that answers like a daemon of another API version."""
    import threading

    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)

    def answer() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.recv(65536)
            body = b'{"version": "9.9", "pid": 1}'
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         + f"x-coderouter-api-version: {version}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
                         + body)
        srv.close()

    threading.Thread(target=answer, daemon=True).start()


def test_a_daemon_of_another_api_version_is_refused_not_misread(capsys, tmp_path):
    path = tmp_path / "other.sock"
    _serve_once_on(path, "99")
    assert main(["--socket", str(path), "status"]) == 1
    err = capsys.readouterr().err
    assert "speaks admin API version 99" in err and "restart coderouterd" in err


def test_config_check_says_when_a_process_counts_as_nothing_against_the_budget(capsys, tmp_path):
    cfg = tmp_path / "budget.toml"
    cfg.write_text("[models]\nmemory_budget_mb = 8000\n" + VALID.replace(
        'model = "m"\n', 'model = "m"\nprocess = { command = ["sh", "-c", "exec sleep 1000"] }\n', 1))
    assert commands.config_check(str(cfg), False) == 0
    assert "process local: memory_mb is 0 and its command names no .gguf" in capsys.readouterr().out


# -- an unreadable journal -----------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["journal", "tail", "--local"], ["journal", "export", "--local"],
                                  ["replay", "compare", "7d..1d", "1d..", "--window", "--local"],
                                  ["explain", "req-1"]])
def test_an_unreadable_journal_is_one_line_naming_it_and_exit_1(capsys, tmp_path, argv):
    (tmp_path / "state.db").write_bytes(b"not a database, " * 256)
    assert main(["--socket", str(tmp_path / "none.sock"), *argv, "--state-dir", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert err == f"corectl: cannot read the journal {tmp_path / 'state.db'}: file is not a database\n"
    assert "Traceback" not in err and out == ""
