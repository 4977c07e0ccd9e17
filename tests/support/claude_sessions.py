"""Claude-Code-shaped sessions for prefix-affinity tests and the bench: every session shares the system
prompt and tools, its history grows by a tool call and a sizeable tool result per turn, and its background
calls (small model, no tools) carry the same session id. The billing header's `cch=` changes per request,
as Claude Code's does; `cache_control` moves to the last block every turn. `tools=False`: a session whose
turns carry no tools (Claude Code run with `--tools ""`, or a chat client that names its session).

`reuse_report` compares what a backend reused with the best any slot assignment could give: for each
request, the longest prefix it shares with ANY earlier prompt (an upper bound, since a slot can only hold
an earlier prompt).
"""

from __future__ import annotations

import itertools
import uuid

_cch = itertools.count(1)


def _tool(i: int) -> dict:
    props = {f"param_{j}": {"type": "string", "description": f"Parameter {j} of tool {i}. " + "Explains usage. " * 8}
             for j in range(5)}
    props["limit"] = {"type": "integer", "exclusiveMinimum": 0, "maximum": 9007199254740991}
    return {"name": f"Tool{i}", "description": f"Tool number {i}. " + "It does a useful thing for the agent. " * 25,
            "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                             "properties": props, "required": ["param_0"], "additionalProperties": False}}


TOOLS = [_tool(i) for i in range(25)]
INSTRUCTIONS = "Follow the instructions carefully and use the tools well. " * 110
AGENTS = "Available agent types and skills: general-purpose, explore, plan. " * 90


def _small_tool(i: int) -> dict:
    return {"name": f"Tool{i}", "description": f"Tool number {i}. " + "It does a useful thing for the agent. " * 3,
            "input_schema": {"type": "object", "properties": {
                "param_0": {"type": "string", "description": "The path to work on."},
                "limit": {"type": "integer", "description": "How many lines."}}, "required": ["param_0"]}}


class Shape:
    """How big a session is: Claude Code's real sizes (the default), or scaled down for a real small model
    (a few hundred tokens of shared prefix, on a CPU that processes about 120 prompt tokens a second)."""

    def __init__(self, tools: list[dict], instructions: str, agents: str, tool_result_lines: int,
                 max_tokens: int, background_max_tokens: int, title_repeat: int = 20) -> None:
        self.tools = tools
        self.title_repeat = title_repeat  # the background call's system prompt, in sentences
        self.instructions = instructions
        self.agents = agents
        self.tool_result_lines = tool_result_lines
        self.max_tokens = max_tokens
        self.background_max_tokens = background_max_tokens


CLAUDE_CODE = Shape(TOOLS, INSTRUCTIONS, AGENTS, 70, 64000, 32000)
SMALL = Shape([_small_tool(i) for i in range(3)], "Follow the instructions carefully and use the tools well. " * 14,
              "Available agent types and skills: general-purpose, explore, plan. " * 4, 9, 4, 4)
# SMALL scaled down again, to about a third of its tokens, for the test suite: what the real server must process
# (its CPU time) is mostly the cold prompts, and their size does not change what prefix routing is measured on.
TINY = Shape([_small_tool(i) for i in range(2)], "Follow the instructions carefully and use the tools well. " * 3,
             "Available agent types and skills: general-purpose, explore, plan. ", 3, 2, 2, title_repeat=3)


def billing_block() -> dict:
    return {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.197.a1b; cc_entrypoint=cli; "
                                    f"cch={next(_cch):05x};"}


class Session:
    def __init__(self, n: int, *, tool_result_lines: int | None = None, shape: Shape = CLAUDE_CODE,
                 tools: bool = True) -> None:
        self.n = n
        self.id = str(uuid.UUID(int=0xC0DE0000 + n))
        self.turn = 0
        self.shape = shape
        self.lines = tool_result_lines or shape.tool_result_lines
        self.messages: list[dict] = [
            {"role": "user", "content": [
                {"type": "text", "text": f"<system-reminder>Repository context for session {n}.</system-reminder>"},
                {"type": "text", "text": f"Session {n}: please fix the failing tests in module_{n}.py"}]},
            {"role": "system", "content": shape.agents},
        ]
        self.tools: list[dict] | None = shape.tools if tools else None
        self.system_extra = ""

    @property
    def headers(self) -> dict[str, str]:
        return {"x-claude-code-session-id": self.id}

    def system(self) -> list[dict]:
        return [billing_block(),
                {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                 "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": self.shape.instructions + self.system_extra,
                 "cache_control": {"type": "ephemeral"}}]

    def main_body(self) -> dict:
        messages = [dict(m) for m in self.messages]
        last = messages[-1] if messages[-1]["role"] == "user" else messages[0]
        if isinstance(last["content"], list):
            last["content"] = [*last["content"][:-1], {**last["content"][-1], "cache_control": {"type": "ephemeral"}}]
        body = {"model": "claude-sonnet-5", "max_tokens": self.shape.max_tokens, "system": self.system(),
                "tools": self.tools,
                "messages": messages, "metadata": {"user_id": '{"device_id":"' + "d" * 64 +
                                                   '","account_uuid":"","session_id":"' + self.id + '"}'}}
        if self.tools is None:
            del body["tools"]
        return body

    def compaction_body(self) -> dict:
        """Claude Code's compaction call: the main model, the whole history and a request for a summary at its
        end (merged into the last user message, as consecutive user messages are), and no tools."""
        body = self.main_body()
        body.pop("tools", None)
        last = body["messages"][-1]
        content = last["content"] if isinstance(last["content"], list) else [{"type": "text", "text": last["content"]}]
        body["messages"][-1] = {**last, "content": [*content, {"type": "text", "text": (
            "Your task is to create a detailed summary of the conversation so far. ") * 4}]}
        return body

    def background_body(self) -> dict:
        first = self.messages[0]["content"][-1]["text"]
        return {"model": "claude-haiku-4-5-20251001", "max_tokens": self.shape.background_max_tokens,
                "thinking": {"type": "disabled"},
                "system": [billing_block(), {"type": "text", "text": "Generate a concise title for this "
                                                                      "conversation. " * self.shape.title_repeat}],
                "messages": [{"role": "user", "content": f"{first} (turn {self.turn})"}]}

    def advance(self) -> None:
        """The model asked for a tool; its result comes back in the next turn."""
        t = self.turn
        tid = f"toolu_{self.n:02d}_{t:03d}"
        self.messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Let me look at step {t}."},
            {"type": "tool_use", "id": tid, "name": "Tool1", "input": {"param_0": f"src/file{t}.py", "limit": 200}}]})
        self.messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": "\n".join(
                f"{i}\tsession {self.n} turn {t} line {i} of the file with some code in it"
                for i in range(1, self.lines))}]})
        self.turn += 1


def workload(n_sessions: int, turns: int, *, background_every: int = 4, shape: Shape = CLAUDE_CODE,
             background_sessions: int | None = None, tools: bool = True,
             background_turns: int | None = None) -> list[tuple[Session, str]]:
    """The request order: sessions take turns round-robin; a background call every few turns (from the first
    `background_sessions` sessions only, when given; in the first `background_turns` turns only, when given)."""
    sessions = [Session(i, shape=shape, tools=tools) for i in range(n_sessions)]
    with_background = n_sessions if background_sessions is None else background_sessions
    order: list[tuple[Session, str]] = []
    for t in range(turns):
        for s in sessions:
            order.append((s, "main"))
            if t % background_every == 1 % background_every and s.n < with_background and \
                    (background_turns is None or t < background_turns):
                order.append((s, "background"))
    return order


def common_bytes(a: bytes, b: bytes) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:  # a[:lo] == b[:lo] already holds
            lo = mid
        else:
            hi = mid - 1
    return lo


def reuse_report(log: list[dict], bytes_per_token: int = 4) -> dict:
    """From a fake llama-server's log: tokens reused, the upper bound any assignment could reach, prompt
    tokens, and the two ratios."""
    reused = best = total = 0
    seen: list[bytes] = []
    for e in log:
        p = e["prompt"]
        bound = max((common_bytes(q, p) for q in seen), default=0) // bytes_per_token
        best += min(bound, e["n_prompt"] - 1)
        reused += e["cache_n"]
        total += e["n_prompt"]
        seen.append(p)
    return {"requests": len(log), "prompt_tokens": total, "reused_tokens": reused, "best_tokens": best,
            "of_best": round(reused / best, 4) if best else 1.0, "hit_ratio": round(reused / total, 4) if total else 0.0}


def drive_straight(fake_url: str, sessions: int, turns: int, model: str = "local-model") -> None:
    """The workload sent straight to an OpenAI-wire server, translated exactly as coderouterd translates it
    (billing header removed), without slot pinning: the server chooses slots itself. The baseline."""
    import httpx

    from coderouterd.affinity.canonical import Canonicaliser
    from coderouterd.translate.anthropic_request_to_openai import request_to_openai

    canon = Canonicaliser()
    with httpx.Client(base_url=fake_url, timeout=60) as http:
        for s, kind in workload(sessions, turns):
            body = s.main_body() if kind == "main" else s.background_body()
            oa, _ = request_to_openai(canon.anthropic(body), model, stream=False)
            r = http.post("/v1/chat/completions", json=oa)
            if r.status_code != 200:
                raise RuntimeError(f"baseline request failed: {r.status_code} {r.text[:200]}")
            if kind == "main":
                s.advance()


def drive_router(router_url: str, sessions: int, turns: int, *, stream_every: int = 3) -> None:
    """The same workload through coderouterd with the official Anthropic SDK, as Claude Code would send it."""
    import anthropic

    client = anthropic.Anthropic(base_url=router_url, api_key="x", max_retries=0)
    for i, (s, kind) in enumerate(workload(sessions, turns)):
        body = s.main_body() if kind == "main" else s.background_body()
        if i % stream_every == 0:
            with client.messages.stream(**body, extra_headers=s.headers) as st:
                st.get_final_message()
        else:
            client.messages.create(**body, extra_headers=s.headers, timeout=60)
        if kind == "main":
            s.advance()
