"""Shutdown leaves nothing running: every task the daemon (or its managed processes) started is cancelled
and awaited, and a managed child started in the background is stopped. Real daemon parts, real child
processes, in one event loop, no daemon process."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

from coderouterd.config import parse_config_text
from coderouterd.config.loader import LoadedConfig
from coderouterd.daemon import Daemon
from coderouterd.state.memory import MemoryStore
from coderouterd.supervise.from_config import Processes
from coderouterd.supervise.tree import process_alive
from coderouterd.upstream.breaker import BreakerRegistry
from coderouterd.upstream.upstream import Upstreams


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp_path: Path) -> str:
    # A child that never becomes ready (nothing answers its ready_url): its start is still under way when
    # shutdown comes, which is the case a forgotten task would leak.
    port = _unused_port()
    return f"""
[state]
dir = {str(tmp_path / "state")!r}
[providers.local]
kind = "openai"
base_url = "http://127.0.0.1:{port}/v1"
process = {{ command = [{sys.executable!r}, "-c", "import time; time.sleep(60)"], ready_url = "http://127.0.0.1:{port}/health", stop_timeout_s = 2 }}
[profiles.default]
providers = ["local"]
"""


def _others() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


def test_daemon_shutdown_leaves_no_task_and_no_child(tmp_path):
    async def main():
        loaded = LoadedConfig(model=parse_config_text(_config(tmp_path), "t"), path=str(tmp_path / "c.toml"))
        daemon = Daemon(loaded)
        await daemon.startup()
        await asyncio.wait_for(daemon._background, 30)
        mp = daemon.processes.resolve("local")
        for _ in range(200):  # the background start spawns the child; readiness never comes
            if mp.pid is not None:
                break
            await asyncio.sleep(0.05)
        assert mp.pid is not None and _others()
        pid = mp.pid
        await daemon.shutdown()
        assert _others() == set()
        assert not process_alive(pid, None)

    asyncio.run(main())


def test_a_start_spawned_by_a_reload_is_owned_and_ended(tmp_path):
    async def main():
        cfg = parse_config_text(_config(tmp_path), "t")
        procs = Processes(tmp_path / "logs", MemoryStore(), on_event=None,
                          upstreams=Upstreams(BreakerRegistry()))
        await procs.reload(cfg)  # a process new to the config, autostarted: started in the background
        assert len(procs._starts) == 1
        await procs.shutdown()
        assert len(procs._starts) == 0
        assert _others() == set()

    asyncio.run(main())
