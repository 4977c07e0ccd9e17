"""Loading the configuration: TOML file or embedded default, environment overrides, clear errors."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import platformdirs
from pydantic import ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from .schema import ConfigModel

APP_NAME = "coderouter"
EMBEDDED = "<embedded default>"


class ConfigError(Exception):
    """A configuration that must not be used. The message names each key path and the reason."""


class _Settings(ConfigModel, BaseSettings):
    # CODEROUTER_<SECTION>__<KEY> environment variables override file values.
    model_config = SettingsConfigDict(env_prefix="CODEROUTER_", env_nested_delimiter="__", extra="forbid")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (env_settings, init_settings)


@dataclass(frozen=True)
class LoadedConfig:
    model: ConfigModel
    path: str  # file path, or EMBEDDED

    @property
    def is_embedded(self) -> bool:
        return self.path == EMBEDDED


def default_config_path() -> Path:
    return Path(platformdirs.user_config_dir(APP_NAME)) / "config.toml"


def resolve_config_path(cli_path: str | None) -> str:
    """--config, else $CODEROUTER_CONFIG, else the per-OS config file if it exists, else the embedded default."""
    if cli_path:
        return cli_path
    env = os.environ.get("CODEROUTER_CONFIG")
    if env:
        return env
    p = default_config_path()
    return str(p) if p.is_file() else EMBEDDED


def embedded_default_text() -> str:
    return resources.files("coderouterd").joinpath("default_config.toml").read_text(encoding="utf-8")


def _env_source(loc: tuple) -> str | None:
    """The CODEROUTER_<SECTION>__<KEY> variable that set the value at `loc`, when one did."""
    for depth in range(len(loc), 0, -1):
        parts = [str(p) for p in loc[:depth] if not isinstance(p, int)]
        name = "CODEROUTER_" + "__".join(parts).upper()
        if any(k.upper() == name for k in os.environ):
            return name
    return None


def _format_validation_error(err: ValidationError, source: str) -> str:
    """One line per problem, each blamed on where its value came from: the file, or an environment override."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in e["loc"]).replace(".[", "[")
        msg = e["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        env = _env_source(tuple(e["loc"])) if e["loc"] else None
        if env is not None:
            msg += f" (from ${env}, not {source})"
        lines.append(f"{loc}: {msg}" if loc else msg)
    return "\n".join(lines)


def parse_config_text(text: str, source: str) -> ConfigModel:
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: invalid TOML: {e}") from None
    try:
        return _Settings(**data)
    except ValidationError as e:
        raise ConfigError(f"{source}: invalid configuration:\n{_format_validation_error(e, source)}") from None
    except SettingsError as e:
        raise ConfigError(_env_override_error(e)) from None


def _env_override_error(err: SettingsError) -> str:
    """pydantic-settings fails on an override of a list or table that is not JSON (CODEROUTER_SERVER__API_KEYS=x)
    before any validation, naming only the section: name the variables and the form they need."""
    m = re.search(r'field "([^"]+)"', str(err))
    prefix = f"CODEROUTER_{m.group(1).upper()}__" if m else "CODEROUTER_"
    names = sorted(k for k in os.environ if k.upper().startswith(prefix))
    which = ", ".join(names) if names else f"a {prefix}* variable"
    return (f"environment override {which}: cannot parse its value; a list or table must be written as JSON, "
            "e.g. CODEROUTER_SERVER__API_KEYS='[\"key-1\"]'")


def load_config(cli_path: str | None = None) -> LoadedConfig:
    path = resolve_config_path(cli_path)
    if path == EMBEDDED:
        return LoadedConfig(parse_config_text(embedded_default_text(), EMBEDDED), EMBEDDED)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror or e}") from None
    return LoadedConfig(parse_config_text(decode_config_bytes(data, path), path), str(Path(path).resolve()))


def decode_config_bytes(data: bytes, source: str) -> str:
    """The file as text; anything but UTF-8 is a config error naming the first bad byte's offset (a file saved
    in Latin-1 or a binary written over the config must not kill the watcher or print a traceback)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{source}: not UTF-8 text: invalid byte 0x{data[e.start]:02x} at byte offset {e.start}"
                          " (save the file as UTF-8)") from None


def state_dir(cfg: ConfigModel) -> Path:
    """[state] dir, else $CODEROUTER_STATE_DIR, else the per-OS state directory."""
    d = cfg.state.dir or os.environ.get("CODEROUTER_STATE_DIR") or platformdirs.user_state_dir(APP_NAME)
    return Path(d).expanduser()


def admin_socket_path(cfg: ConfigModel) -> Path:
    return Path(cfg.admin.socket).expanduser() if cfg.admin.socket else state_dir(cfg) / "coderouterd.sock"
