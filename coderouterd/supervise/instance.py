"""The operating-system side of one instance of a managed process: starting it, stopping its whole tree, and
judging one that a previous coderouterd left running.

Apart from the state machine (process.py) because these act and decide nothing: they touch no state and post no
message, and they run inside the state machine's one actor task, which records what they did. What they do to a
process tree is tree.py's (by pid and create time); whose listener answers a port is adopt.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os

from . import adopt, tree
from .logs import RotatingLog
from .spec import ProcessSpec, http_ready

log = logging.getLogger("coderouterd.supervise")


async def spawn(spec: ProcessSpec, output: RotatingLog) -> asyncio.subprocess.Process:
    """Start the command in a session of its own, stdout and stderr into its log file (logs.py says why not into
    pipes). OSError when it cannot be started."""
    fd = await asyncio.to_thread(output.open_for_child)
    try:
        return await asyncio.create_subprocess_exec(
            *spec.command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            env={**os.environ, **spec.env},
            cwd=spec.cwd,
            start_new_session=True,  # its own group: one signal reaches the whole server
        )
    finally:
        os.close(fd)


async def stop(spec: ProcessSpec, pid: int, ctime: float | None,
               proc: asyncio.subprocess.Process | None) -> int | None:
    """SIGTERM the tree started as (pid, ctime) once, SIGKILL what is left after stop_timeout_s. Its exit code
    when it is our child (`proc`); None for one we cannot wait() on (adopted)."""
    survivors = await tree.kill_tree(pid, ctime=ctime, timeout=spec.stop_timeout_s)
    if survivors:
        log.error("%s: pids %s survived SIGKILL", spec.name, survivors)
    if proc is None:
        return None
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(proc.wait(), 2.0)  # reaped by the child watcher promptly
    return proc.returncode


async def judge_leftover(spec: ProcessSpec, pid: int, ctime: float, command: object) -> adopt.Verdict:
    """May a process a previous coderouterd recorded as running `command`, still alive as (pid, ctime), be adopted?
    Only when it runs the configured command and its own tree answers ready_url; else the reason it is stopped."""
    same_command = command == spec.command
    url = spec.ready_url
    serving = same_command and url is not None and await http_ready(url)
    owner = None
    if serving and url is not None:  # it answers: but is the answer its own, or someone's on its port?
        owner = await asyncio.to_thread(adopt.serves_from_tree, url, pid, ctime)
        if owner.ok:
            return owner
    why = "its command changed" if not same_command else (
        owner.reason if owner is not None else
        "it answers no ready_url" if url else "there is no ready_url to check it")
    return adopt.Verdict(False, why)
