"""Loading the configuration: TOML file or embedded default, environment overrides, clear errors."""

from __future__ import annotations

import os
import re
import stat
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

# The most of a config file that is read. Real configs are a few KB; one with dozens of providers, processes and
# profiles stays well under 100 KB. 1 MiB is ten times that and still nothing to parse, while a wrong path (a log
# file, a device, a disk image) costs at most this much memory and never takes the daemon with it.
MAX_CONFIG_BYTES = 1024 * 1024
# How deeply the parsed values may nest. The schema's deepest key is four tables down ([providers.X.headers]);
# anything past this is not a configuration, and refusing it here keeps validation from recursing on it.
MAX_CONFIG_DEPTH = 32


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
    """--config, else $CODEROUTER_CONFIG, else the per-OS config file if there is one, else the embedded default."""
    if cli_path:
        return cli_path
    env = os.environ.get("CODEROUTER_CONFIG")
    if env:
        return env
    p = default_config_path()
    # Something other than a file there (a device, a FIFO, a dangling symlink) is named and refused by the
    # loader, never silently replaced by the embedded default.
    return str(p) if p.exists() or p.is_symlink() else EMBEDDED


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
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: a few hundred `[` exhaust the stack.
        raise ConfigError(f"{source}: invalid TOML: arrays or inline tables nested too deeply to parse (a "
                          f"configuration nests at most {MAX_CONFIG_DEPTH} levels)") from None
    deep = _too_deep(data)
    if deep is not None:
        raise ConfigError(f"{source}: invalid configuration:\n{deep}: nested more than {MAX_CONFIG_DEPTH} levels "
                          "deep; no configuration key takes values nested like this") from None
    try:
        return _Settings(**data)
    except ValidationError as e:
        raise ConfigError(f"{source}: invalid configuration:\n{_format_validation_error(e, source)}") from None
    except SettingsError as e:
        raise ConfigError(_env_override_error(e)) from None
    except RecursionError:
        # What the file holds was bounded above: this is an environment override's JSON (pydantic-settings
        # decodes CODEROUTER_*__* lists and tables with a recursive parser).
        names = sorted(k for k in os.environ if k.upper().startswith("CODEROUTER_") and "__" in k)
        raise ConfigError(f"environment override {', '.join(names) or 'CODEROUTER_*'}: a value nested too deeply "
                          f"to read (a configuration nests at most {MAX_CONFIG_DEPTH} levels)") from None


def _too_deep(data: dict[str, Any]) -> str | None:
    """The key path of the first value nested deeper than MAX_CONFIG_DEPTH, or None. Iterative: the check must
    not itself recurse on what it guards against."""
    stack: list[tuple[object, str, int]] = [(data, "", 0)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_CONFIG_DEPTH:
            return where or "(top level)"
        if isinstance(value, dict):
            stack.extend((v, f"{where}.{k}" if where else str(k), depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
    return None


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
    data = read_config_file(path)
    return LoadedConfig(parse_config_text(decode_config_bytes(data, path), path), str(Path(path).resolve()))


def read_config_file(path: str) -> bytes:
    """The config file's bytes: a regular file (a symlink to one is fine) of at most MAX_CONFIG_BYTES, else a
    ConfigError saying what it is. A config symlinked to /dev/zero once grew the daemon by 1 GB/s on reload."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (and hang start-up, a reload or `config check`);
        # fstat of what was opened then refuses anything but a regular file before a byte is read.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        real = os.path.realpath(path)
        what = ("a directory" if stat.S_ISDIR(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                or stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket"
                if stat.S_ISSOCK(st.st_mode) else "a special file")
        via = f" (a symlink to {real})" if real != os.path.abspath(path) else ""
        raise ConfigError(f"{path}{via} is {what}, not a regular file: the config must be a plain TOML file")
    with open(fd, "rb") as f:
        too_big = (f"{path}: the config file is larger than {MAX_CONFIG_BYTES // 1024} KB; a configuration is a "
                   "few KB of TOML: is this the right file?")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(too_big)
        try:
            # One byte more than the cap: a file that grew since fstat is refused, never read whole.
            data = f.read(MAX_CONFIG_BYTES + 1)
        except OSError as e:
            raise ConfigError(f"{path}: cannot read config file: {e.strerror or e}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(too_big)
    return data


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
