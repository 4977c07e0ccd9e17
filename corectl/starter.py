"""`corectl init`: find the local model servers that are running and write a commented starter config.

Probes the usual ports on loopback (LM Studio 1234, Ollama 11434, llama.cpp 8080, vLLM 8000), asks each for
its models, and writes one provider per server that answered, a `default` profile over them, and commented
examples for the cloud. An existing file is never replaced without --force. The file is validated with the
daemon's own loader before it is written."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

PROBE_TIMEOUT_S = 1.5


@dataclass(frozen=True)
class Backend:
    name: str        # provider name in the written config
    label: str       # what the user calls it
    port: int
    models_path: str  # where its model list is


BACKENDS = (
    Backend("lmstudio", "LM Studio", 1234, "/v1/models"),
    Backend("ollama", "Ollama", 11434, "/api/tags"),
    Backend("llamacpp", "llama.cpp", 8080, "/v1/models"),
    Backend("vllm", "vLLM", 8000, "/v1/models"),
)


@dataclass
class Found:
    backend: Backend
    host: str
    port: int
    ok: bool
    models: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


class InitError(Exception):
    pass


def _models_of(data) -> list[str]:
    if not isinstance(data, dict):
        return []
    items = data.get("data") if isinstance(data.get("data"), list) else data.get("models")
    out = []
    for m in items or []:
        if isinstance(m, dict):
            name = m.get("id") or m.get("name") or m.get("model")
            if isinstance(name, str) and name:
                out.append(name)
    return out


def probe(backend: Backend, host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> Found:
    import http.client

    import orjson

    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", backend.models_path)
        resp = conn.getresponse()
        raw = resp.read()
    except (OSError, http.client.HTTPException) as e:
        return Found(backend, host, port, False, detail=getattr(e, "strerror", None) or str(e) or type(e).__name__)
    finally:
        conn.close()
    if resp.status >= 400:
        return Found(backend, host, port, False, detail=f"HTTP {resp.status} on {backend.models_path}")
    try:
        models = _models_of(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return Found(backend, host, port, False, detail=f"{backend.models_path} did not answer JSON")
    return Found(backend, host, port, True, models)


def probe_all(host: str = "127.0.0.1", ports: dict[str, int] | None = None) -> list[Found]:
    ports = ports or {}
    with ThreadPoolExecutor(max_workers=len(BACKENDS)) as pool:
        futures = [pool.submit(probe, b, host, ports.get(b.name, b.port)) for b in BACKENDS]
        return [f.result() for f in futures]


def _toml_str(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_config(found: list[Found]) -> str:
    """The starter config: the servers that answered, a default profile over them, the cloud commented out."""
    up = [f for f in found if f.ok]
    lines = [
        "# coderouter configuration, written by `corectl init`. Every key: config.example.toml in the repository.",
        "# Edits apply while coderouterd runs (an invalid file is refused and the running config stays).",
        "",
        "[server]",
        'host = "127.0.0.1"',
        "port = 8088",
        'default_profile = "default"',
        "",
    ]
    if not up:
        lines += ["# No local model server answered when this file was written. These are the usual places;",
                  "# start one (or fix the port), then run `corectl doctor`.", ""]
        # The places that were asked (a --backend-port included), not the defaults.
        asked = {f.backend.name: f for f in found}
        up = [asked.get(b.name) or Found(b, "127.0.0.1", b.port, False) for b in BACKENDS[:2]]
    for f in up:
        b = f.backend
        lines.append(f"# {b.label} on port {f.port}" + (f": {len(f.models)} model(s)" if f.ok else ""))
        lines.append(f"[providers.{b.name}]")
        lines.append('kind = "openai"')
        lines.append(f"base_url = {_toml_str(f.base_url)}")
        if f.models:
            lines.append(f"model = {_toml_str(f.models[0])}")
            others = f.models[1:]
            if others:
                shown = ", ".join(others[:8]) + (f" and {len(others) - 8} more" if len(others) > 8 else "")
                lines.append(f"# other models here: {shown}")
        else:
            lines.append('model = ""   # empty: the model the server has loaded is discovered')
        lines.append("")
    chain = ", ".join(_toml_str(f.backend.name) for f in up)
    lines += [
        "[profiles.default]",
        f"providers = [{chain}]   # tried in this order",
        "",
        "# Cloud providers, after the local ones. Keys come from the environment; for the login service put them",
        "# in ~/.config/coderouter/env (NAME=value lines, chmod 600), which coderouterd reads at start-up.",
        "#",
        "# [providers.openrouter-free]",
        '# kind = "openai"',
        '# base_url = "https://openrouter.ai/api/v1"',
        '# model = "qwen/qwen3-coder:free"',
        '# api_key_env = "OPENROUTER_API_KEY"',
        "#",
        "# [providers.anthropic]",
        '# kind = "anthropic"',
        '# base_url = "https://api.anthropic.com/v1"',
        '# api_key_env = "ANTHROPIC_API_KEY"',
        "# paid = true",
        "# monthly_budget_usd = 50",
        "#",
        "# and add them to the chain: providers = [..., \"openrouter-free\", \"anthropic\"]",
        "",
    ]
    return "\n".join(lines)


def target_path(explicit: str | None) -> Path:
    if explicit:
        return Path(explicit).expanduser()
    if os.environ.get("CODEROUTER_CONFIG"):
        return Path(os.environ["CODEROUTER_CONFIG"]).expanduser()
    from coderouterd.config.loader import default_config_path

    return default_config_path()


def write_config(path: Path, text: str, *, force: bool) -> None:
    from coderouterd.config import ConfigError, parse_config_text

    if path.exists() and not force:
        raise InitError(f"{path} already exists; not replacing it (use --force to overwrite, or --config PATH "
                        "to write elsewhere)")
    try:
        parse_config_text(text, str(path))
    except ConfigError as e:  # a defect here, not the user's: say so plainly
        raise InitError(f"the starter config would not load, not writing it: {e}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def parse_ports(specs: list[str] | None) -> dict[str, int]:
    names = [b.name for b in BACKENDS]
    out = {}
    for spec in specs or []:
        name, sep, port = spec.partition("=")
        if not sep or name not in names or not port.isdigit() or not 0 < int(port) < 65536:
            raise InitError(f"--backend-port {spec!r}: expected NAME=PORT with NAME one of {', '.join(names)}")
        out[name] = int(port)
    return out


def init(config: str | None, force: bool, host: str, port_specs: list[str] | None, as_json: bool) -> int:
    from .commands import echo, emit_json, report_error

    try:
        ports = parse_ports(port_specs)
        path = target_path(config)
        if path.exists() and not force:  # before probing: nothing to do
            raise InitError(f"{path} already exists; not replacing it (use --force to overwrite, or --config "
                            "PATH to write elsewhere)")
        found = probe_all(host, ports)
        text = render_config(found)
        write_config(path, text, force=force)
    except InitError as e:
        report_error(str(e), as_json)
        return 1
    if as_json:
        emit_json({"ok": True, "path": str(path), "found": [
            {"backend": f.backend.name, "port": f.port, "ok": f.ok, "models": f.models, "detail": f.detail}
            for f in found]})
        return 0
    for f in found:
        if f.ok:
            echo(f"found {f.backend.label} on port {f.port}: " + (", ".join(f.models[:5]) or "no models listed")
                 + (" …" if len(f.models) > 5 else ""))
        else:
            echo(f"no {f.backend.label} on port {f.port} ({f.detail})")
    echo(f"wrote {path}")
    from .client import start_command

    daemon = start_command(with_config=False)
    default = path == target_path(None)
    echo("next: start the router with  " + daemon + ("" if default else f" --config {path}"))
    echo("      then check every provider:  corectl doctor")
    return 0
