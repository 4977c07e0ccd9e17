"""`python -m tests.support.exclusive LOG PORTS -- ARGV...`: note in LOG which of the servers on PORTS
(comma-separated; any command line with `--port P`: a fake or a real llama-server) are alive in the process table
at this moment, then become ARGV (exec: same pid, so the supervisor watches the real server). A budget that holds one model at a time is checked this way without a
timing window: each start reads the process table at the very moment it happens."""

from __future__ import annotations

import os
import sys

import psutil


def alive(ports: set[str]) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        if p.info["pid"] == os.getpid() or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if "--port" in cmd[:-1] and cmd[cmd.index("--port") + 1] in ports:
            out.append(p.info["pid"])
    return out


def main() -> None:
    log, ports, sep, *argv = sys.argv[1:]
    assert sep == "--" and argv
    others = alive({p for p in ports.split(",") if p})
    with open(log, "a") as f:
        f.write(f"{os.getpid()} others_alive={others}\n")
    os.execvp(argv[0], argv)


if __name__ == "__main__":
    main()
