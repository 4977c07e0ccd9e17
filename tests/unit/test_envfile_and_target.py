"""The env file the daemon reads for service keys, the missing-key report, and how corectl picks the config
and state directory of the daemon the user runs (flags and environment first, then the daemon, then the last
record)."""

from __future__ import annotations

import os

import pytest

from coderouterd import discovery
from coderouterd.config import ConfigError, load_config, parse_config_text
from coderouterd.config.envfile import (
    EnvFileError,
    load_env_file,
    missing_keys,
    parse_env_text,
    read_env_file,
)
from corectl import target


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch, tmp_path):
    for k in ("CODEROUTER_SOCKET", "CODEROUTER_ADMIN__SOCKET", "CODEROUTER_STATE__DIR", "CODEROUTER_STATE_DIR",
              "CODEROUTER_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg-state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-config"))


def test_env_text_forms():
    text = "# comment\n\nA=1\nexport B = two words \nC=\"quoted = yes\"\nD='single'\nE=\n"
    assert parse_env_text(text, "f") == {"A": "1", "B": "two words", "C": "quoted = yes", "D": "single", "E": ""}
    with pytest.raises(EnvFileError, match="f:2: not a KEY=VALUE line"):
        parse_env_text("A=1\nno equals sign\n", "f")
    with pytest.raises(EnvFileError):
        parse_env_text("1BAD=x\n", "f")


def test_env_file_must_be_private_and_exported_variables_win(tmp_path):
    path = tmp_path / "env"
    assert read_env_file(path) == {}  # none: nothing to load, no error
    path.write_text("KEY_ONE=from-file\nKEY_TWO=from-file\n")
    path.chmod(0o640)
    with pytest.raises(EnvFileError, match=f"chmod 600 {path}"):
        read_env_file(path)
    path.chmod(0o600)
    env = {"KEY_TWO": "exported"}
    assert load_env_file(path, env) == ["KEY_ONE"]
    assert env == {"KEY_ONE": "from-file", "KEY_TWO": "exported"}


def test_env_file_that_is_a_fifo_is_refused_without_hanging(tmp_path):
    # Issue 23 item 15: opening a FIFO for reading waits for a writer, which hung start-up.
    import threading

    path = tmp_path / "env"
    os.mkfifo(path, 0o600)
    outcome: list = []

    def read() -> None:
        try:
            outcome.append(read_env_file(path))
        except EnvFileError as e:
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5.0)
    if reader.is_alive():  # unblock the old code's open() so the thread ends
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    assert outcome and isinstance(outcome[0], EnvFileError), outcome
    assert "not a regular file" in str(outcome[0]) and str(path) in str(outcome[0])
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(EnvFileError, match="not a regular file"):
        read_env_file(tmp_path / "dir")


def test_missing_keys_names_each_provider_with_an_unset_variable():
    cfg = parse_config_text("""
[providers.local]
base_url = "http://127.0.0.1:1/v1"
[providers.router]
base_url = "https://openrouter.ai/api/v1"
api_key_env = "OPENROUTER_API_KEY"
[providers.claude]
kind = "anthropic"
base_url = "https://api.anthropic.com/v1"
api_key_env = "ANTHROPIC_API_KEY"
[profiles.default]
providers = ["local", "router", "claude"]
""", "t")
    assert missing_keys(cfg.providers, {"ANTHROPIC_API_KEY": "k", "OPENROUTER_API_KEY": ""}) == {
        "router": "no key: $OPENROUTER_API_KEY is not set"}


def test_a_config_that_is_not_utf8_is_a_config_error(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_bytes(b"\xff\xfe[server]\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(bad))


def _record(tmp_path, **kw) -> dict:
    base = discovery.make_record(pid=os.getpid(), version="x", api_version=1, socket=str(tmp_path / "no.sock"),
                                 config_path=str(tmp_path / "router.toml"), embedded=False,
                                 state_dir=str(tmp_path / "st"), listen_url="http://127.0.0.1:1", started_at=0.0)
    return {**base, **kw}


def test_config_and_state_dir_order(monkeypatch, tmp_path):
    # Nothing published: the daemon's own default rule.
    assert target.config_for(None) == target.Found(None, "the default location")
    # A last record (its daemon stopped: nothing answers on its socket).
    discovery.publish(_record(tmp_path))
    assert target.config_for(None).value == str(tmp_path / "router.toml")
    assert "last coderouterd run" in target.config_for(None).source
    assert target.state_dir_for(None)[0] == tmp_path / "st"
    # A running daemon's own answer wins over the record.
    running = {"pid": 7, "config_path": "/running.toml", "embedded_config": False, "state_dir": "/running-state"}
    monkeypatch.setattr(target, "running_daemon", lambda socket: running)
    assert target.config_for(None) == target.Found("/running.toml", "the running coderouterd (pid 7)")
    assert target.state_dir_for(None)[0].as_posix() == "/running-state"
    # ... and the environment and flags win over it.
    monkeypatch.setenv("CODEROUTER_CONFIG", "/env.toml")
    assert target.config_for(None).value == "/env.toml"
    assert target.config_for("/flag.toml").value == "/flag.toml"
    monkeypatch.setenv("CODEROUTER_STATE_DIR", str(tmp_path / "env-state"))
    assert target.state_dir_for(None)[0] == tmp_path / "env-state"
    assert target.state_dir_for("/flag-state")[0].as_posix() == "/flag-state"
    # A daemon on the embedded default has no file: the default rule decides.
    monkeypatch.delenv("CODEROUTER_CONFIG")
    monkeypatch.setattr(target, "running_daemon", lambda socket: {**running, "embedded_config": True})
    assert target.config_for(None).value is None
