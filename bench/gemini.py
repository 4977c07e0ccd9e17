"""Gemini ingress vs chat ingress: the same conversation sent to coderouterd as a Gemini generateContent body
(what Gemini CLI sends) and as its chat-completions equivalent, against the same fast fake upstreams.

    .venv/bin/python bench/gemini.py [--quick]

Loopback only. The daemon is pinned to core 0; the fake upstreams and this load generator share core 1 (the
same layout as bench/responses.py). Scenarios: a small body and a Gemini-CLI-sized one (~40 KB: a long system
instruction and Gemini CLI's kind of function declarations), each non-streaming and streaming (20 text chunks
upstream, `alt=sse`), against an OpenAI-compatible and an Anthropic upstream.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.ingress_vs_chat import Request, compare_with_chat  # noqa: E402
from coderouterd.translate.gemini_request import translate_request  # noqa: E402


def small_body() -> dict:
    return {"contents": [{"role": "user", "parts": [{"text": "hello"}]}], "generationConfig": {"maxOutputTokens": 16}}


def cli_body() -> dict:
    """Shaped like Gemini CLI 0.61.0's first turn: a long system instruction, a dozen function declarations in
    Gemini's schema (upper-case types), two user text parts, thinking config."""
    words = " ".join(f"rule{i} keep edits small and run the tests before answering." for i in range(420))

    def fn(name: str, props: int) -> dict:
        return {"name": name, "description": f"{name}: " + "does a thing. " * 40,
                "parametersJsonSchema": {"type": "object", "properties": {
                    f"p{i}": {"type": "string", "description": "a parameter " * 8} for i in range(props)},
                    "required": ["p0"]}}

    decls = [fn(n, 5) for n in ("read_file", "write_file", "replace", "glob", "grep_search", "list_directory",
                                "run_shell_command", "web_fetch", "save_memory", "write_todos", "read_many_files",
                                "google_web_search")]
    return {"contents": [{"role": "user", "parts": [{"text": "<session_context>cwd: /work</session_context>"},
                                                    {"text": "say hi"}]}],
            "systemInstruction": {"role": "user", "parts": [{"text": words}]},
            "tools": [{"functionDeclarations": decls}],
            "generationConfig": {"temperature": 1, "topP": 0.95, "thinkingConfig": {"includeThoughts": True}}}


def as_chat(body: dict, stream: bool) -> dict:
    """The same request as a chat-completions client would send it (the daemon's own translation)."""
    chat = translate_request(body, "bench-model", stream=stream, sse=True).chat
    if stream:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _request(make: Callable[[], dict]) -> Request:
    def request(stream: bool) -> tuple[str, bytes, bytes]:
        body = make()
        path = "/v1beta/models/bench-model:" + ("streamGenerateContent?alt=sse" if stream else "generateContent")
        return path, orjson.dumps(body), orjson.dumps(as_chat(body, stream))
    return request


if __name__ == "__main__":
    raise SystemExit(compare_with_chat("gemini", [("small", _request(small_body)),
                                                  ("Gemini-CLI-sized", _request(cli_body))]))
