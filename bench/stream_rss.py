"""The daemon's RSS during one long, fast stream (issue 34, item 3): a fake OpenAI-compatible upstream sends
chat chunks as fast as the daemon reads them for N seconds, and the client reads the daemon's stream through
each ingress. What the daemon keeps per delta shows as RSS growth over the stream.

    .venv/bin/python bench/stream_rss.py [--seconds 30] [--ingress responses,chat,messages] [--tree OTHER]
                                         [--text-mb 12]

`--tree` runs another checkout's daemon (e.g. one from before a change) against the same upstream and client.

Loopback only, one stream at a time, bounded by --seconds per ingress. The daemon is pinned to core 0, the
upstream and the reading client (one asyncio process, this one) to core 1. RSS is sampled every 0.25 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import PY, ROOT, free_port, pin, rss_mb, stop, table, wait_healthz  # noqa: E402

# A token-sized delta, as a fast local model sends them; 64 chunks per write keeps the upstream cheap.
_CHUNK = b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":' \
         b'{"content":"tok1234 "},"finish_reason":null}]}\n\n'
_BATCH = _CHUNK * 64
# The first bytes of each ingress's closing events (a Responses stream repeats its whole text in them).
_CLOSING = (b"response.output_text.done", b"response.failed", b"[DONE]", b'"finish_reason":"stop"', b"message_delta")
_END = (b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},'
        b'"finish_reason":"stop"}]}\n\n'
        b'data: {"id":"c","object":"chat.completion.chunk","model":"m","choices":[],'
        b'"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
        b"data: [DONE]\n\n")

BODIES = {
    "responses": ("/v1/responses", {"model": "m", "stream": True, "input": "go"}),
    "chat": ("/v1/chat/completions", {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}),
    "messages": ("/v1/messages", {"model": "m", "stream": True, "max_tokens": 100000,
                                  "messages": [{"role": "user", "content": "go"}]}),
}


class Upstream:
    """Answers every POST with a chunked event stream of text deltas for `seconds`, then ends it cleanly."""

    def __init__(self, seconds: float, max_deltas: int = 0) -> None:
        self.seconds = seconds
        self.max_deltas = max_deltas  # 0: no limit but the time
        self.deltas = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            await reader.readexactly(length)
            if not head.startswith(b"POST ") or b"/chat/completions" not in head.split(b"\r\n", 1)[0]:
                # Discovery and health probes: a model list, nothing streamed (they must not skew the figures).
                body = b'{"object":"list","data":[{"id":"bench-model","object":"model"}]}'
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            frame = b"%x\r\n%s\r\n" % (len(_BATCH), _BATCH)
            end = time.monotonic() + self.seconds
            while time.monotonic() < end and not (self.max_deltas and self.deltas >= self.max_deltas):
                writer.write(frame)
                self.deltas += 64
                await writer.drain()  # as fast as the daemon reads, no faster
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(_END), _END))
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def one_stream(daemon_port: int, pid: int, ingress: str, up: Upstream) -> dict:
    path, body = BODIES[ingress]
    raw = orjson.dumps(body)
    reader, writer = await asyncio.open_connection("127.0.0.1", daemon_port)
    writer.write(b"POST %s HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 b"anthropic-version: 2023-06-01\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
                 % (path.encode(), len(raw), raw))
    await writer.drain()
    samples: list[float] = []
    closing_at: int | None = None  # the sample index when the stream's closing events began to arrive
    first_bytes = b""
    start = rss_mb(pid)
    received = 0
    tail = b""
    ending = "none"
    t0 = next_sample = time.monotonic()
    while True:
        data = await reader.read(1 << 20)
        if not data:
            break
        if not first_bytes:
            first_bytes = data[:300]
        received += len(data)
        seen = tail + data
        for mark in (b"response.completed", b"response.failed", b"[DONE]", b"message_stop"):
            if mark in seen:
                ending = mark.decode()
        if closing_at is None and any(m in seen for m in _CLOSING):
            closing_at = len(samples)
        tail = data[-200:]
        now = time.monotonic()
        if now >= next_sample:
            samples.append(rss_mb(pid))
            next_sample = now + 0.25
    took = time.monotonic() - t0
    writer.close()
    await asyncio.sleep(0.5)  # let the daemon release what the request held
    end = rss_mb(pid)
    if ending == "none":
        print(f"{ingress}: the stream did not end as expected; it began {first_bytes!r}", file=sys.stderr)
    if os.environ.get("BENCH_TRACE"):
        print(ingress, " ".join(f"{x:.0f}" for x in samples), file=sys.stderr)
    # Growth is measured from the first sample taken once the stream flows (start-up allocations aside), up to
    # 1 s before the closing events arrived (they are built, all at once, before the client sees them).
    first = samples[min(4, len(samples) - 1)] if samples else start
    streaming = samples[:max(5, (closing_at if closing_at is not None else len(samples)) - 4)]
    return {"start": start, "first": first, "streaming": max(streaming or [start]), "peak": max(samples or [start]),
            "end": end, "received": received, "ending": ending, "took": took}


async def run(port: int, pid: int, ingresses: list[str], seconds: float, up_port: int,
              text_mb: float) -> list[list[str]]:
    rows: list[list[str]] = []
    for ingress in ingresses:
        up = Upstream(seconds, int(text_mb * 1e6 / 8))
        server = await asyncio.start_server(up.handle, "127.0.0.1", up_port)
        try:
            r = await one_stream(port, pid, ingress, up)
        finally:
            server.close()
            await server.wait_closed()
        rows.append([BODIES[ingress][0], f"{seconds:g}", f"{r['took']:.1f}", f"{up.deltas:,}",
                     f"{up.deltas * 8 / 1e6:.1f}", f"{r['received'] / 1e6:.0f}", f"{r['start']:.0f}",
                     f"{r['streaming'] - r['first']:+.1f}", f"{r['peak'] - r['first']:+.1f}",
                     f"{r['end'] - r['start']:+.1f}",
                     r["ending"]])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--ingress", default="responses,chat")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose daemon runs")
    ap.add_argument("--text-mb", type=float, default=0.0, help="stop the upstream after this much text (0: time only)")
    args = ap.parse_args()
    ingresses = [i for i in args.ingress.split(",") if i]
    pin(os.getpid(), {1})
    tmp = Path(tempfile.mkdtemp(prefix="crbench-rss-"))
    up_port = free_port()
    cfg = tmp / "bench.toml"
    cfg.write_text(f"""
[server]
port = 0
[providers.fast]
kind = "openai"
base_url = "http://127.0.0.1:{up_port}/v1"
model = "bench-model"
[profiles.default]
providers = ["fast"]
""")
    port = free_port()
    tree = args.tree.resolve()
    env = {**os.environ, "CODEROUTER_STATE_DIR": str(tmp / "state"), "PYTHONPATH": str(tree)}
    d = subprocess.Popen([PY, "-m", "coderouterd", "--config", str(cfg), "--port", str(port),
                          "--log-level", "warning"], cwd=tree, env=env)
    try:
        pin(d.pid, {0})
        wait_healthz(f"http://127.0.0.1:{port}", d)
        rows = asyncio.run(run(port, d.pid, ingresses, args.seconds, up_port, args.text_mb))
        print(table(rows, ["ingress", "upstream sends for s", "stream lasted s", "deltas", "text MB",
                           "MB to client", "RSS start MB", "growth streaming MB", "growth to the peak MB",
                           "after the stream MB", "last event"]))
        print("\none stream at a time; 8-character deltas, 64 per upstream write, as fast as the daemon reads; "
              "growth: from the RSS 1 s into the stream, to its highest until 1 s before the closing events arrived, "
              "and to the peak with them; after: 0.5 s after the stream, from its start. "
              "A /v1/responses stream keeps its text for the closing events, up to 16 MB (providers/limits.py): "
              "past it the stream ends with response.failed")
    finally:
        stop(d)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
