"""`corectl init` against fake LM Studio, Ollama, llama.cpp and vLLM servers on overridden ports: what it
finds, the config it writes (loadable by the daemon, commented), and that it never overwrites by accident."""

from __future__ import annotations

import os
import subprocess

import orjson

from coderouterd.config import load_config
from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.ports import dead_port


def corectl(*args: str, home) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CODEROUTER_", "XDG_"))}
    env["HOME"] = str(home)
    return cli.corectl(list(args), env=env)


def test_init_finds_the_running_servers_and_writes_a_loadable_config(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    closed = dead_port()
    with FakeServer("lmstudio", models=["qwen3-coder-30b", "gemma-3"]) as lms, \
            FakeServer("ollama", models=["qwen3:8b"]) as ollama, \
            FakeServer("openai", models=["llama-local"]) as llamacpp:
        ports = ["--backend-port", f"lmstudio={lms.port}", "--backend-port", f"ollama={ollama.port}",
                 "--backend-port", f"llamacpp={llamacpp.port}", "--backend-port", f"vllm={closed}"]
        r = corectl("init", *ports, home=home)
        assert r.returncode == 0, r.stderr
        path = home / ".config" / "coderouter" / "config.toml"
        assert f"wrote {path}" in r.stdout
        assert f"found LM Studio on port {lms.port}: qwen3-coder-30b, gemma-3" in r.stdout
        assert f"no vLLM on port {closed}" in r.stdout
        text = path.read_text()
        assert text.startswith("# coderouter configuration")
        assert "# other models here: gemma-3" in text
        assert "# [providers.openrouter-free]" in text  # the cloud, commented out
        model = load_config(str(path)).model
        assert list(model.profiles["default"].providers) == ["lmstudio", "ollama", "llamacpp"]
        assert model.providers["lmstudio"].base_url == f"http://127.0.0.1:{lms.port}/v1"
        assert model.providers["lmstudio"].model == "qwen3-coder-30b"
        assert model.providers["ollama"].model == "qwen3:8b"
        assert "vllm" not in model.providers

        # Never overwritten without --force; with it, replaced.
        path.write_text("# mine\n")
        again = corectl("init", *ports, home=home)
        assert again.returncode == 1 and "already exists" in again.stderr and "--force" in again.stderr
        assert path.read_text() == "# mine\n"
        forced = corectl("init", "--force", "--json", *ports, home=home)
        assert forced.returncode == 0, forced.stderr
        doc = orjson.loads(forced.stdout)
        assert {f["backend"]: f["ok"] for f in doc["found"]} == {"lmstudio": True, "ollama": True,
                                                                  "llamacpp": True, "vllm": False}
        assert path.read_text().startswith("# coderouter configuration")

        # --config elsewhere; a bad --backend-port is a usage error naming the valid names.
        other = tmp_path / "other.toml"
        assert corectl("init", "--config", str(other), *ports, home=home).returncode == 0 and other.is_file()
        bad = corectl("init", "--backend-port", "nosuch=1", home=home)
        assert bad.returncode == 1 and "lmstudio, ollama, llamacpp, vllm" in bad.stderr


def test_init_with_nothing_running_still_writes_a_usable_config(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    chosen = {b: dead_port() for b in ("lmstudio", "ollama", "llamacpp", "vllm")}
    ports = [a for b, p in chosen.items() for a in ("--backend-port", f"{b}={p}")]
    r = corectl("init", *ports, home=home)
    assert r.returncode == 0, r.stderr
    path = home / ".config" / "coderouter" / "config.toml"
    assert "No local model server answered" in path.read_text()
    providers = load_config(str(path)).model.providers
    assert set(providers) == {"lmstudio", "ollama"}
    # The ports asked for, not the defaults (issue 23: --backend-port was ignored when nothing answered).
    assert {n: p.base_url for n, p in providers.items()} == {
        n: f"http://127.0.0.1:{chosen[n]}/v1" for n in ("lmstudio", "ollama")}


def test_service_install_without_a_config_points_to_init(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    r = corectl("service", "install", "--os", "linux", "--dry-run", home=home)
    assert r.returncode == 1
    assert "corectl init" in r.stderr and "Traceback" not in r.stderr
