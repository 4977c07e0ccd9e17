"""The dashboard's events and tool-loop alerts after a restart (issue 43, E3): they lived only in the daemon's
memory and vanished with it; now the feed reads what happened before its start from the audit log."""

from __future__ import annotations

import httpx

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config, openai_at
from tests.support.daemon import DaemonProcess
from tests.support.wait import wait_for


def _tool_loop(d: DaemonProcess, request_id: str) -> httpx.Response:
    msgs: list[dict] = [{"role": "user", "content": "list the files"}]
    for i in range(3):
        msgs.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd": "ls"}'}}]})
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": "a.txt"})
    return httpx.post(d.url + "/v1/chat/completions", timeout=20,
                      headers={"x-coderouter-profile": "loop", "x-request-id": request_id},
                      json={"model": "m", "messages": msgs})


def _loops(d: DaemonProcess) -> list[dict]:
    events = httpx.get(d.url + "/ui/api/now", timeout=10).json()["events"]
    return [e for e in events if e["kind"] == "guard_fired" and e.get("guard") == "tool_loop"]


def test_a_stopped_tool_loop_is_still_on_the_page_after_a_restart(tmp_path):
    with FakeServer("openai", name="local") as local:
        config = daemon_config(providers={"local": openai_at(local.url, model="qwen3-coder")},
                               profiles={"default": {"providers": ["local"]},
                                         "loop": {"providers": ["local"],
                                                  "tool_loop": {"action": "break", "threshold": 3, "window": 5}}})
        first = DaemonProcess(config, tmp_path).start()
        try:
            assert _tool_loop(first, "restart-loop-1").status_code == 400
            assert wait_for(lambda: _loops(first), 30)
        finally:
            first.stop()
        second = DaemonProcess(config, tmp_path, port=first.port).start()
        try:
            loops = _loops(second)
            assert [e["request_id"] for e in loops] == ["restart-loop-1"]
            assert loops[0]["action"] == "break" and loops[0]["detail"]["tool"] == "Bash"
            # The trace of the stopped request is there too (the journal), so the alert's link still opens.
            trace = httpx.get(second.url + "/ui/api/requests/restart-loop-1", timeout=10)
            assert trace.status_code == 200 and trace.json()["source"] == "journal"
        finally:
            second.stop()
