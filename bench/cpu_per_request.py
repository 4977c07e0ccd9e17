"""The daemon's CPU time per request (user + sys from /proc), for the same requests against a source tree.

    .venv/bin/python bench/cpu_per_request.py [TREE] [N]

TREE defaults to this checkout; give another (e.g. `git archive main | tar -x -C /tmp/base`) to compare
before/after. CPU time is far less sensitive to a busy machine than latency is, so interleave a few runs of
each tree and compare medians. Loopback only; one fake OpenAI upstream; state in a temporary directory."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp
import orjson

ROOT = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
N = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
sys.path.insert(0, str(ROOT))

from bench.common import PY, free_port, start_fake, stop, wait_healthz  # noqa: E402

CASES = (
    ("openai", "/v1/chat/completions", {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("anthropic_stream", "/v1/messages",
     {"model": "m", "max_tokens": 8, "stream": True, "messages": [{"role": "user", "content": "hi"}]}),
)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def main() -> None:
    fake, fake_url = start_fake("openai")
    tmp = Path(tempfile.mkdtemp(prefix="crcpu-"))
    port = free_port()
    (tmp / "c.toml").write_text(f'[server]\nport = {port}\n[state]\ndir = "{tmp}"\n[providers.f]\n'
                                f'base_url = "{fake_url}/v1"\nmodel = "bench-model"\n'
                                '[profiles.default]\nproviders = ["f"]\n')
    # cwd = the tree: `python -m coderouterd` imports that tree's code first.
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(tmp / "c.toml"), "--log-level", "warning"],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    out = {}
    try:
        wait_healthz(url, d)
        headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
        async with aiohttp.ClientSession() as s:
            for _name, path, body in CASES:  # warm-up: imports, pools, caches
                for _ in range(200):
                    async with s.post(url + path, data=orjson.dumps(body), headers=headers) as r:
                        await r.read()
            for name, path, body in CASES:
                raw = orjson.dumps(body)
                c0 = cpu_seconds(d.pid)
                for _ in range(N):
                    async with s.post(url + path, data=raw, headers=headers) as r:
                        await r.read()
                out[name] = (cpu_seconds(d.pid) - c0) / N * 1e6
    finally:
        d.terminate()
        d.wait()
        stop(fake)
    print(ROOT, " ".join(f"{k}={v:.0f}us" for k, v in out.items()))


if __name__ == "__main__":
    asyncio.run(main())
