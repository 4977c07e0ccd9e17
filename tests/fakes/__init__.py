"""Fake LLM upstreams (OpenAI/llama.cpp, Anthropic, Ollama, LM Studio) speaking the real wire formats.

In-process: ``with FakeServer("openai", behaviour="tools") as srv: ... srv.url ...``.
Out of process: ``python -m tests.fakes --kind ollama --port N`` (see ``__main__``).
"""

from .behaviour import (
    BEHAVIOURS,
    REASONING_TEXT,
    THINKING_SIGNATURE,
    TOOL_ARGUMENTS,
    TOOL_ARGUMENTS_2,
    parse_behaviour,
)
from .runner import KINDS, FakeServer, build_fake, free_port

__all__ = [
    "BEHAVIOURS",
    "KINDS",
    "REASONING_TEXT",
    "THINKING_SIGNATURE",
    "TOOL_ARGUMENTS",
    "TOOL_ARGUMENTS_2",
    "FakeServer",
    "build_fake",
    "free_port",
    "parse_behaviour",
]
