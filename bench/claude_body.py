"""A Claude-Code-shaped Messages request (~90 KB): system blocks with cache_control and the billing header,
~25 tools with 2020-12 JSON schemas, a mid-conversation system entry, and a few turns of tool use."""

from __future__ import annotations


def _tool(i: int) -> dict:
    props = {
        f"param_{j}": {"type": "string", "description": f"Parameter {j} of tool {i}. " + "Explains usage. " * 10}
        for j in range(6)
    }
    props["limit"] = {"type": "integer", "exclusiveMinimum": 0, "maximum": 9007199254740991}
    props["mode"] = {"type": "string", "enum": ["fast", "careful", "exhaustive"]}
    return {
        "name": f"Tool{i}",
        "description": f"Tool number {i}. " + "It does a useful thing for the coding agent. " * 30,
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": props,
            "required": ["param_0"],
            "additionalProperties": False,
        },
    }


def claude_code_body(*, stream: bool = False, model: str = "claude-sonnet-5") -> dict:
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.abc; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude.",
         "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Follow the instructions carefully. " * 170, "cache_control": {"type": "ephemeral"}},
    ]
    messages: list[dict] = [
        {"role": "user", "content": [
            {"type": "text", "text": "<system-reminder>Context about the repository.</system-reminder>"},
            {"type": "text", "text": "Please fix the failing test in src/app.py", "cache_control": {"type": "ephemeral"}},
        ]},
        {"role": "system", "content": "Available agent types and skills. " * 170},
    ]
    for turn in range(4):
        tid = f"toolu_{turn:02d}abcdef"
        messages.append({"role": "assistant", "content": [
            {"type": "text", "text": f"Let me look at step {turn}."},
            {"type": "tool_use", "id": tid, "name": "Tool1", "input": {"param_0": f"src/file{turn}.py", "limit": 200}},
        ]})
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": tid, "content": "\n".join(
                f"{n}\tline {n} of the file with some code in it" for n in range(1, 40))},
        ]})
    messages[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}
    body = {
        "model": model, "messages": messages, "system": system, "tools": [_tool(i) for i in range(25)],
        "metadata": {"user_id": '{"device_id":"' + "a" * 64 + '","account_uuid":"","session_id":"s"}'},
        "max_tokens": 32000, "thinking": {"type": "disabled"},
    }
    if stream:
        body["stream"] = True
    return body


if __name__ == "__main__":
    import orjson

    print(len(orjson.dumps(claude_code_body())))
