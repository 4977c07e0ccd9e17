"""A tiny stand-in for a local model server (ollama / LM Studio) that tests supervise as a real child.

    python tests/support/fake_backend.py --port N [--start-delay S] [--crash-after-s S]
        [--ignore-sigterm] [--children-ignore-sigterm] [--exit-at-start CODE] [--fail-while-exists PATH] [--spawn-child]
        [--spawn-escapees] [--pid-file PATH] [--spam-bytes N]

Serves GET /api/tags and GET /v1/models with 200 JSON. Standard library only so it starts fast.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TAGS = {"models": [{"name": "fake:latest", "model": "fake:latest", "size": 1}]}
MODELS = {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "fake"}]}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body_obj = {"/api/tags": TAGS, "/v1/models": MODELS}.get(self.path.split("?", 1)[0])
        status = 200 if body_obj is not None else 404
        body = json.dumps(body_obj if body_obj is not None else {"error": "not found"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # probes every 100 ms would flood the captured log


def spawn_children(escapees: bool) -> list[int]:
    # /dev/null: the captured log should hold this process's own lines only.
    quiet = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    pids = [subprocess.Popen(["sleep", "1000"], **quiet).pid]
    if escapees:
        # Left our process group: reachable only by walking the tree.
        pids.append(subprocess.Popen(["sleep", "1000"], start_new_session=True, **quiet).pid)
        # Double fork: reparented away from the tree, still in our group.
        sh = subprocess.Popen(
            ["sh", "-c", "sleep 1000 >/dev/null 2>&1 </dev/null & echo $!"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        pids.append(int(sh.stdout.readline()))
        sh.wait()
    return pids


def write_pid_file(path: str, children: list[int]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"pid": os.getpid(), "children": children}, f)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--start-delay", type=float, default=0.0)
    ap.add_argument("--crash-after-s", type=float, default=None)
    ap.add_argument("--ignore-sigterm", action="store_true")
    ap.add_argument("--children-ignore-sigterm", action="store_true")
    ap.add_argument("--exit-at-start", type=int, default=None)
    ap.add_argument("--fail-while-exists", default=None)
    ap.add_argument("--spawn-child", action="store_true")
    ap.add_argument("--spawn-escapees", action="store_true")
    ap.add_argument("--pid-file", default=None)
    ap.add_argument("--spam-bytes", type=int, default=0)
    args = ap.parse_args()

    print(f"fake_backend stdout: pid {os.getpid()} port {args.port}", flush=True)
    print(f"fake_backend stderr: pid {os.getpid()}", file=sys.stderr, flush=True)
    if args.exit_at_start is not None:
        sys.exit(args.exit_at_start)
    if args.fail_while_exists and os.path.exists(args.fail_while_exists):
        sys.exit(3)
    if args.ignore_sigterm or args.children_ignore_sigterm:
        # Before spawning, so the grandchildren inherit it and only SIGKILL ends them.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    children = spawn_children(args.spawn_escapees) if (args.spawn_child or args.spawn_escapees) else []
    if not args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if args.pid_file:
        write_pid_file(args.pid_file, children)
    if args.spam_bytes:
        line = b"x" * 99 + b"\n"
        for _ in range(args.spam_bytes // len(line) + 1):
            sys.stdout.buffer.write(line)
        sys.stdout.flush()
    if args.crash_after_s is not None:
        threading.Timer(args.crash_after_s, os._exit, args=(3,)).start()
    if args.start_delay:
        time.sleep(args.start_delay)

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
