"""Issue 41, N10 and N15: what the config loader refuses before it can hurt (a device, a FIFO, a huge file, values
nested deep enough to exhaust the stack), and `config check` naming a process the memory budget can never hold."""

from __future__ import annotations

import os
import sys

import pytest

from coderouterd.config import ConfigError, load_config, parse_config_text
from coderouterd.config.loader import MAX_CONFIG_BYTES, MAX_CONFIG_DEPTH
from corectl import commands

MIN = """
[providers.a]
base_url = "http://127.0.0.1:1/v1"
[profiles.default]
providers = ["a"]
"""


@pytest.fixture(autouse=True)
def _no_overrides(monkeypatch):
    for k in list(os.environ):
        if k.startswith("CODEROUTER_"):
            monkeypatch.delenv(k)


# -- N10: only a regular file, and only so much of it ---------------------------------------------------------

def test_a_symlink_to_dev_zero_is_refused_without_reading_it(tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.symlink_to("/dev/zero")
    with pytest.raises(ConfigError) as e:
        load_config(str(cfg))
    assert str(e.value) == f"{cfg} (a symlink to /dev/zero) is a device, not a regular file: the config must be " \
                           "a plain TOML file"


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    # No writer ever opens it: a blocking open would hang here for ever.
    with pytest.raises(ConfigError, match="is a FIFO, not a regular file"):
        load_config(str(fifo))


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="is a directory, not a regular file"):
        load_config(str(tmp_path))


def test_a_symlink_to_a_regular_file_is_fine(tmp_path):
    real = tmp_path / "real.toml"
    real.write_text(MIN)
    link = tmp_path / "config.toml"
    link.symlink_to(real)
    loaded = load_config(str(link))
    assert loaded.path == str(real.resolve()) and "a" in loaded.model.providers


def test_a_file_over_the_cap_is_refused_and_one_at_the_cap_is_read(tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as f:
        f.truncate(MAX_CONFIG_BYTES + 1)  # sparse: costs no disk
    with pytest.raises(ConfigError) as e:
        load_config(str(big))
    assert "larger than 1024 KB" in str(e.value) and "is this the right file?" in str(e.value)
    at_cap = tmp_path / "cap.toml"
    text = MIN.encode()
    at_cap.write_bytes(text + b"#" * (MAX_CONFIG_BYTES - len(text)))
    assert "a" in load_config(str(at_cap)).model.providers


def test_the_read_itself_stops_at_the_cap(tmp_path, monkeypatch):
    """A file that grows between fstat and read is never read whole: at most one byte past the cap."""
    from coderouterd.config import loader

    cfg = tmp_path / "config.toml"
    cfg.write_text(MIN)
    sizes = []
    real_fstat = os.fstat

    def small_then_growing(fd):
        st = real_fstat(fd)
        with open(cfg, "ab") as f:  # grows after the size was taken
            f.write(b"#" * (MAX_CONFIG_BYTES + 10))
        return st

    real_open = open

    class Recording:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read(self, n=-1):
            sizes.append(n)
            return self.f.read(n)

    monkeypatch.setattr(loader.os, "fstat", small_then_growing)
    monkeypatch.setattr(loader, "open", lambda fd, mode: Recording(real_open(fd, mode)), raising=False)
    with pytest.raises(ConfigError, match="larger than 1024 KB"):
        loader.load_config(str(cfg))
    assert sizes == [MAX_CONFIG_BYTES + 1]


def test_config_check_names_the_device_and_exits_1(capsys, tmp_path):
    cfg = tmp_path / "config.toml"
    cfg.symlink_to("/dev/zero")
    assert commands.config_check(str(cfg), False) == 1
    err = capsys.readouterr().err
    assert "(a symlink to /dev/zero) is a device, not a regular file" in err and "MemoryError" not in err


# -- N15: nesting -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["[" * 5000 + "]" * 5000, "{a=" * 5000 + "1" + "}" * 5000])
def test_nesting_beyond_the_parser_is_a_config_error(value):
    with pytest.raises(ConfigError) as e:
        parse_config_text(MIN + f"\n[server]\napi_keys = {value}\n", "f.toml")
    assert str(e.value) == ("f.toml: invalid TOML: arrays or inline tables nested too deeply to parse (a "
                            f"configuration nests at most {MAX_CONFIG_DEPTH} levels)")


def test_nesting_the_parser_takes_is_refused_before_validation_naming_the_key():
    deep = "[" * 300 + "]" * 300  # tomllib reads this; validating it would recurse 300 levels
    with pytest.raises(ConfigError) as e:
        parse_config_text(MIN + f"\n[server]\napi_keys = {deep}\n", "f.toml")
    msg = str(e.value)
    assert msg.startswith("f.toml: invalid configuration:\nserver.api_keys" + "[0]" * (MAX_CONFIG_DEPTH - 1) + ":")
    assert f"nested more than {MAX_CONFIG_DEPTH} levels deep" in msg


def test_nesting_at_the_limit_reaches_validation():
    ok = "[" * (MAX_CONFIG_DEPTH - 2) + "]" * (MAX_CONFIG_DEPTH - 2)
    with pytest.raises(ConfigError) as e:
        parse_config_text(MIN + f"\n[server]\napi_keys = {ok}\n", "f.toml")
    assert "Input should be a valid string" in str(e.value)  # the schema's own answer, not the depth guard


def test_a_deep_environment_override_is_a_config_error(monkeypatch):
    monkeypatch.setenv("CODEROUTER_SERVER__API_KEYS", "[" * 5000 + "]" * 5000)
    with pytest.raises(ConfigError) as e:
        parse_config_text(MIN, "f.toml")
    assert str(e.value) == ("environment override CODEROUTER_SERVER__API_KEYS: a value nested too deeply to read "
                            f"(a configuration nests at most {MAX_CONFIG_DEPTH} levels)")


def test_deep_nesting_gives_no_traceback_at_daemon_check(tmp_path):
    import subprocess

    cfg = tmp_path / "deep.toml"
    cfg.write_text(MIN + "\n[server]\napi_keys = " + "[" * 5000 + "]" * 5000 + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(cfg), "--check"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr and "RecursionError" not in r.stderr
    assert "nested too deeply to parse" in r.stderr


# -- N15: a process the memory budget can never hold ----------------------------------------------------------

def _with_process(tmp_path, memory_mb: float, budget: float) -> str:
    binary = tmp_path / "server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    cfg = tmp_path / "p.toml"
    cfg.write_text(f"""
[models]
memory_budget_mb = {budget}

[providers.big]
base_url = "http://127.0.0.1:1/v1"
process = {{ command = ["{binary}"], memory_mb = {memory_mb} }}

[profiles.default]
providers = ["big"]
""")
    return str(cfg)


def test_config_check_names_a_process_over_the_memory_budget(capsys, tmp_path):
    cfg = _with_process(tmp_path, 24_000, 16_000)
    assert commands.config_check(cfg, False) == 1
    out = capsys.readouterr().out
    assert ("process big cannot start: memory_mb 24,000 MB exceeds [models] memory_budget_mb = 16,000, so it is "
            "never started") in out, out
    assert commands.config_check(cfg, True) == 1
    import orjson

    doc = orjson.loads(capsys.readouterr().out)
    assert doc["ok"] is False and "exceeds [models] memory_budget_mb" in doc["unstartable"]["big"][0]


@pytest.mark.parametrize(("memory_mb", "budget"), [(16_000, 16_000), (24_000, 0)])
def test_a_process_within_the_budget_or_without_one_is_fine(capsys, tmp_path, memory_mb, budget):
    cfg = _with_process(tmp_path, memory_mb, budget)
    assert commands.config_check(cfg, False) == 0, capsys.readouterr()


def test_a_device_at_the_default_path_is_named_not_replaced_by_the_embedded_default(tmp_path, monkeypatch):
    from coderouterd.config import loader

    default = tmp_path / "coderouter" / "config.toml"
    default.parent.mkdir()
    default.symlink_to("/dev/zero")
    monkeypatch.setattr(loader, "default_config_path", lambda: default)
    with pytest.raises(ConfigError, match=r"\(a symlink to /dev/zero\) is a device"):
        load_config(None)
    default.unlink()
    assert load_config(None).is_embedded  # nothing there: the embedded default, as before


def test_the_env_file_is_capped_too(tmp_path):
    from coderouterd.config.envfile import MAX_ENV_FILE_BYTES, EnvFileError, read_env_file

    env = tmp_path / "env"
    with open(env, "wb") as f:
        f.truncate(MAX_ENV_FILE_BYTES + 1)
    env.chmod(0o600)
    with pytest.raises(EnvFileError, match="larger than 1024 KB"):
        read_env_file(env)
    env.write_text("A=1\n")
    assert read_env_file(env) == {"A": "1"}
