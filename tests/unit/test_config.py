"""Configuration: the documented example is valid, errors name the key path, env overrides file values."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from coderouterd.config import ConfigError, load_config, parse_config_text
from coderouterd.config.loader import embedded_default_text

ROOT = Path(__file__).resolve().parents[2]

MIN = """
[providers.a]
base_url = "http://127.0.0.1:1/v1"
[profiles.default]
providers = ["a"]
"""


def test_example_config_is_valid_and_complete():
    loaded = load_config(str(ROOT / "config.example.toml"))
    m = loaded.model
    assert {"ollama-qwen3", "openrouter-free", "anthropic"} <= set(m.providers)
    assert m.providers["ollama-qwen3"].process.command == ["ollama", "serve"]
    assert m.routes[0].model == "*haiku*"
    # every key of the schema appears in the example, so nothing is undocumented
    text = (ROOT / "config.example.toml").read_text()
    from coderouterd.config.schema import ConfigModel, ProcessConfig, ProfileConfig, ProviderConfig

    for model in (ConfigModel, ProviderConfig, ProfileConfig, ProcessConfig):
        for name in model.model_fields:
            assert name in text, f"{model.__name__}.{name} is not documented in config.example.toml"


def test_embedded_default():
    m = parse_config_text(embedded_default_text(), "embedded")
    assert list(m.profiles["default"].providers) == ["lmstudio", "ollama"]
    assert m.providers["lmstudio"].base_url == "http://127.0.0.1:1234/v1"
    assert m.providers["ollama"].model == ""


@pytest.mark.parametrize("text,needle", [
    (MIN + "[server]\nport = 'x'\n", "server.port"),
    (MIN + "[server]\nbogus = 1\n", "server.bogus: unknown key"),
    (MIN.replace('["a"]', '["a", "zz"]'), "profiles.default.providers[1]: unknown provider 'zz'"),
    (MIN.replace('["a"]', '["a", "a"]'), "profiles.default.providers[1]: 'a' is already listed at [0]"),
    (MIN + "[[routes]]\nmodel = '*'\nprofile = 'nope'\n", "routes[0].profile: unknown profile 'nope'"),
    (MIN + "[server]\nhost = '0.0.0.0'\n", "server.api_keys"),
    (MIN + "[server]\napi_keys = ['kéy']\n", "server.api_keys: [0] contains a non-ASCII"),
    (MIN + '[server]\napi_keys = ["ok", "k\\u0007y"]\n', "server.api_keys: [1] contains a non-ASCII or control"),
    (MIN.replace("http://", "ftp://"), "providers.a.base_url: must start with http"),
    (MIN + "[profiles.default.tool_loop]\naction = 'explode'\n", "profiles.default.tool_loop.action"),
    (MIN.replace('["a"]', '["a"]\ndefault_max_tokens = 0'), "profiles.default.default_max_tokens"),
    ("[server\n", "invalid TOML"),
])
def test_errors_name_the_key_path(text, needle):
    with pytest.raises(ConfigError) as ei:
        parse_config_text(text, "f.toml")
    assert needle in str(ei.value)


def test_env_overrides_file(monkeypatch):
    monkeypatch.setenv("CODEROUTER_SERVER__PORT", "9123")
    monkeypatch.setenv("CODEROUTER_BREAKER__FAILURES", "7")
    m = parse_config_text(MIN, "f.toml")
    assert m.server.port == 9123 and m.breaker.failures == 7


def test_env_override_of_a_list_that_is_not_json_is_a_config_error(monkeypatch):
    # Issue 23 item 15: CODEROUTER_SERVER__API_KEYS=x printed pydantic-settings' traceback.
    monkeypatch.setenv("CODEROUTER_SERVER__API_KEYS", "x")
    with pytest.raises(ConfigError) as ei:
        parse_config_text(MIN, "f.toml")
    msg = str(ei.value)
    assert "CODEROUTER_SERVER__API_KEYS" in msg and "JSON" in msg and "f.toml" not in msg
    monkeypatch.setenv("CODEROUTER_SERVER__API_KEYS", '["k1"]')
    assert parse_config_text(MIN, "f.toml").server.api_keys == ["k1"]


def test_daemon_refuses_a_bad_config(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(MIN.replace('["a"]', '["missing"]'))
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(bad)], capture_output=True, text=True,
                       timeout=30, cwd=ROOT)
    assert r.returncode == 2
    assert "profiles.default.providers[0]: unknown provider 'missing'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "coderouterd", "--config", str(tmp_path / "nope.toml")],
                       capture_output=True, text=True, timeout=30, cwd=ROOT)
    assert r.returncode == 2 and "cannot read config file" in r.stderr


def test_listener_changes_refused_on_reload():
    from coderouterd.config.schema import ServerConfig
    from coderouterd.reload import listener_change_refused

    assert listener_change_refused(("127.0.0.1", 8088), ServerConfig()) is None
    assert "restart needed" in listener_change_refused(("127.0.0.1", 8088), ServerConfig(port=9000))
    assert "restart needed" in listener_change_refused(("0.0.0.0", 8088),
                                                       ServerConfig(host="127.0.0.1", port=8088))
    # Same host and port, keys gone while bound beyond loopback (e.g. host given as an env override).
    refused = listener_change_refused(("0.0.0.0", 8088), ServerConfig.model_construct(host="0.0.0.0", port=8088,
                                                                                      api_keys=[]))
    assert refused is not None and "api_keys" in refused
    assert listener_change_refused(("0.0.0.0", 8088), ServerConfig(host="0.0.0.0", api_keys=["k"])) is None


def test_an_environment_override_is_blamed_for_its_own_error_not_the_file(monkeypatch):
    monkeypatch.setenv("CODEROUTER_SERVER__PORT", "abc")
    with pytest.raises(ConfigError) as e:
        parse_config_text('[providers.a]\nbase_url = "http://127.0.0.1:1/v1"\n[profiles.default]\nproviders = ["a"]\n',
                          "/etc/cr.toml")
    assert "server.port:" in str(e.value) and "(from $CODEROUTER_SERVER__PORT, not /etc/cr.toml)" in str(e.value)
    monkeypatch.delenv("CODEROUTER_SERVER__PORT")
    with pytest.raises(ConfigError) as e:
        parse_config_text('[server]\nport = "abc"\n[providers.a]\nbase_url = "http://127.0.0.1:1/v1"\n'
                          '[profiles.default]\nproviders = ["a"]\n', "/etc/cr.toml")
    assert "server.port:" in str(e.value) and "from $" not in str(e.value)  # the file's own mistake
