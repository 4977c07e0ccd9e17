"""Which daemon's config a corectl command follows: an explicit location wins over the pointer to the last one."""

from __future__ import annotations

import os
import subprocess
import sys

import orjson

from corectl.target import config_for


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)


def _plant(directory, **record) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "coderouterd.last.json").write_bytes(orjson.dumps(record))


def test_an_explicit_state_dir_is_not_given_another_daemons_config(tmp_path, monkeypatch, capsys):
    discovery = tmp_path / "discovery"
    monkeypatch.setenv("CODEROUTER_STATE_DIR", str(discovery))
    monkeypatch.delenv("CODEROUTER_CONFIG", raising=False)
    _plant(discovery, pid=os.getpid(), config_path="/elsewhere/config.toml", embedded_config=False,
           state_dir=str(tmp_path / "their-state"))
    mine = tmp_path / "mine"
    mine.mkdir()
    assert config_for(None, None, daemon=None, state_dir=mine).value is None  # the default rule, not theirs
    # The record that state directory holds itself is its own daemon's.
    _plant(mine, pid=os.getpid(), config_path="/mine/config.toml", embedded_config=False, state_dir=str(mine))
    assert config_for(None, None, daemon=None, state_dir=mine).value == "/mine/config.toml"
    # A daemon that used that very directory lends its config, running or last; --config wins over all of it.
    status = {"pid": os.getpid(), "config_path": "/running.toml", "state_dir": str(mine)}
    assert config_for(None, None, daemon=status, state_dir=mine).value == "/running.toml"
    assert config_for("/explicit.toml", None, daemon=status, state_dir=mine).value == "/explicit.toml"
    assert capsys.readouterr().err == ""


def test_a_dead_daemons_record_is_followed_only_saying_so(tmp_path, monkeypatch, capsys):
    discovery = tmp_path / "discovery"
    monkeypatch.setenv("CODEROUTER_STATE_DIR", str(discovery))
    monkeypatch.delenv("CODEROUTER_CONFIG", raising=False)
    pid = _dead_pid()
    _plant(discovery, pid=pid, config_path="/old/config.toml", embedded_config=False, state_dir=str(discovery))
    found = config_for(None, None, daemon=None)
    assert found.value == "/old/config.toml" and "no longer running" in found.source
    err = capsys.readouterr().err
    assert "/old/config.toml" in err and f"pid {pid} is no longer running" in err and "--config" in err
