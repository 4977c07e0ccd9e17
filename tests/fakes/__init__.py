"""Fake LLM upstreams (OpenAI/llama.cpp, Anthropic, Ollama, LM Studio, Gemini) speaking the real wire formats.

In-process: ``with FakeServer("openai", behaviour="tools") as srv: ... srv.url ...``.
Out of process: ``python -m tests.fakes --kind ollama --port N`` (see ``__main__``).

Names resolve lazily so ``python -m tests.fakes --exit-at-start`` exits without importing aiohttp.
"""

from importlib import import_module

_EXPORTS = {
    "BEHAVIOURS": "behaviour",
    "REASONING_TEXT": "behaviour",
    "THINKING_SIGNATURE": "behaviour",
    "TOOL_ARGUMENTS": "behaviour",
    "TOOL_ARGUMENTS_2": "behaviour",
    "parse_behaviour": "behaviour",
    "KINDS": "runner",
    "FakeServer": "runner",
    "build_fake": "runner",
    "free_port": "runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
