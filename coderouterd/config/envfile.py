"""Secrets for a daemon started by a service manager: `~/.config/coderouter/env`, KEY=VALUE lines.

A login service (launchd, systemd --user) does not inherit the shell's exported API keys, so the daemon reads
this file itself at start-up, before anything resolves `api_key_env`. One mechanism for both service managers
(a plist has no way to name an environment file). Variables already in the environment win: an explicit
`export` in a shell is the more deliberate choice.

The file holds keys, so it must be private: a file that group or others may read is refused, with the fix."""

from __future__ import annotations

import os
import stat
from pathlib import Path

ENV_FILE_NAME = "env"
# KEY=VALUE lines of API keys: a few hundred bytes. A file past this is not one (the config file's cap, the same
# reasoning: loader.MAX_CONFIG_BYTES).
MAX_ENV_FILE_BYTES = 1024 * 1024


class EnvFileError(Exception):
    """The env file exists but must not be used; the message says how to fix it."""


def env_file_path() -> Path:
    import platformdirs

    return Path(platformdirs.user_config_dir("coderouter")) / ENV_FILE_NAME


def parse_env_text(text: str, source: str) -> dict[str, str]:
    """KEY=VALUE lines; blank lines and # comments ignored; an optional `export ` prefix and matching quotes
    around the value are accepted (the subset systemd's EnvironmentFile= and shells agree on)."""
    out: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export "):].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not key or not (key[0].isalpha() or key[0] == "_") \
                or not all(c.isalnum() or c == "_" for c in key):
            raise EnvFileError(f"{source}:{n}: not a KEY=VALUE line (KEY: letters, digits, _)")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        out[key] = value
    return out


def read_env_file(path: Path | None = None) -> dict[str, str]:
    """The variables in the env file ({} when there is none). Raises EnvFileError when it is unsafe or bad."""
    path = path or env_file_path()
    # O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer and hang start-up; fstat of what was
    # opened then refuses anything but a regular file before a byte is read.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return {}
    except OSError as e:
        raise EnvFileError(f"{path}: cannot read: {e.strerror or e}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise EnvFileError(f"{path} is not a regular file (a FIFO, device or directory); it must be a "
                           "plain file of KEY=VALUE lines")
    with open(fd, "rb") as f:
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise EnvFileError(f"{path} holds API keys but other users may read it (mode "
                               f"{stat.S_IMODE(st.st_mode):03o}); fix it with: chmod 600 {path}")
        try:
            data = f.read(MAX_ENV_FILE_BYTES + 1)  # never more than the cap, whatever fstat said
            if len(data) > MAX_ENV_FILE_BYTES:
                raise EnvFileError(f"{path} is larger than {MAX_ENV_FILE_BYTES // 1024} KB; it must hold only "
                                   "KEY=VALUE lines")
            text = data.decode("utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise EnvFileError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None
    return parse_env_text(text, str(path))


def load_env_file(path: Path | None = None, environ: dict | None = None) -> list[str]:
    """Put the env file's variables into the environment (those not already set). Returns the names added."""
    env = os.environ if environ is None else environ
    added = []
    for key, value in read_env_file(path).items():
        if not env.get(key):
            env[key] = value
            added.append(key)
    return added


def missing_keys(providers: dict, environ: dict | None = None) -> dict[str, str]:
    """provider name -> `no key: $NAME is not set`, for every provider whose api_key_env names an unset or
    empty variable (such a provider would send its requests without credentials)."""
    env = os.environ if environ is None else environ
    return {name: f"no key: ${cfg.api_key_env} is not set" for name, cfg in providers.items()
            if cfg.api_key_env and not env.get(cfg.api_key_env)}
