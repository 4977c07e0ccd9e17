"""Codex-shaped Responses request bodies and their chat-completions equivalent, shared by bench/responses.py and
bench/proxy.py (here, so that neither benchmark imports the other)."""

from __future__ import annotations

from coderouterd.translate.responses_request import translate_request


def codex_body(stream: bool) -> dict:
    """A body shaped like Codex 0.171.0's first request (~40 KB): two developer items, two user items,
    function tools with JSON schemas, a namespace tool and a hosted web_search."""
    words = " ".join(f"rule{i} keep edits small and run the tests before answering." for i in range(420))

    def fn(name: str, props: int) -> dict:
        return {"type": "function", "name": name, "description": f"{name}: " + "does a thing. " * 40,
                "strict": False, "parameters": {"type": "object", "properties": {
                    f"p{i}": {"type": "string", "description": "a parameter " * 8} for i in range(props)},
                    "required": ["p0"], "additionalProperties": False}}

    tools = [fn(n, 6) for n in ("exec_command", "write_stdin", "request_user_input", "view_image", "get_goal",
                                "create_goal", "update_goal")]
    tools.append({"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents",
                  "tools": [fn("spawn_agent", 4), fn("wait_agent", 2)]})
    tools.append({"type": "web_search", "external_web_access": False})
    dev = lambda t: {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": t}]}  # noqa: E731
    user = lambda t: {"type": "message", "role": "user", "content": [{"type": "input_text", "text": t}]}  # noqa: E731
    return {"model": "bench-model", "stream": stream, "store": False, "instructions": None,
            "input": [dev(words), dev("<permissions>sandbox: workspace-write</permissions>"),
                      user("<environment_context>cwd: /work</environment_context>"), user("say hi")],
            "tools": tools, "tool_choice": "auto", "parallel_tool_calls": True, "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"], "prompt_cache_key": "bench-session",
            "client_metadata": {"originator": "codex_exec"}}


def small_body(stream: bool) -> dict:
    return {"model": "bench-model", "stream": stream, "max_output_tokens": 16,
            "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]}]}


def as_chat(body: dict) -> dict:
    """The same request as a chat-completions client would send it (the daemon's own translation)."""
    chat = translate_request({k: v for k, v in body.items() if v is not None}).chat
    if body.get("stream"):
        chat["stream_options"] = {"include_usage": True}
    return chat
