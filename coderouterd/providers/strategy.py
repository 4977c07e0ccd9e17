"""The base of every strategy: what one attempt's strategy holds (model names, usage, what was produced, tool-call
repair, drift figures, held closing output) and the four calls each (client wire, upstream wire) pair implements.
The pairs' own classes live in the `*_strategies.py` modules beside it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any, Required, TypedDict

from ..translate.answer_observe import observe_anthropic, observe_openai
from ..translate.answer_stats import AnswerStats, DriftSample, Produced
from ..translate.tool_repair import ToolSpec
from ..translate.tool_repair_wire import (
    AnthropicStreamRepair,
    OpenAIStreamRepair,
    repair_anthropic_message,
    repair_openai_completion,
)


class StrategyOptions(TypedDict, total=False):
    """Strategy's own keywords, as a subclass passes them on (`**kw: Unpack[StrategyOptions]`)."""

    model: Required[str]
    skip_prologue: Required[bool]
    client_body: Required[dict]
    repair_tools: Mapping[str, ToolSpec] | None
    observe: bool
    named_tool_choice: bool
    answer_model: str


class Strategy(ABC):
    """Stream state for one attempt. events() returns the bytes to send to the client for a batch of parsed
    SSE events; `done` is set when the upstream finished cleanly.

    With `repair_tools` (the tools the request offered, when the provider's tool_repair applies), tool calls
    the model wrote as text are repaired on the upstream's wire, before any translation; `repaired` and
    `repair_formats` tell what was done."""

    # The upstream's message format (an adapter's `wire`): "openai" chat completions or "anthropic" Messages.
    upstream_wire = "openai"
    done = False
    started_content = False
    usage: dict
    # What an OpenAI-wire backend said about its prompt cache: the raw `usage` (prompt_tokens_details) and
    # llama.cpp's `timings` (cache_n, prompt_n, prompt_ms). Read by prefix affinity after the answer.
    raw_usage: dict | None = None
    timings: dict | None = None
    # The answer's closing output, already built, leaving one write at a time (next_held); the answer is done
    # once it is out. Each item becomes bytes through `encode_held`.
    held: list | None = None

    def __init__(self, *, model: str, skip_prologue: bool, client_body: dict,
                 repair_tools: Mapping[str, ToolSpec] | None = None, observe: bool = False,
                 named_tool_choice: bool = True, answer_model: str = "") -> None:
        self.model = model  # what the upstream is asked for
        self.answer_model = answer_model or model  # what the client's answer names (providers/answer_model.py)
        # False: the upstream reads tool_choice only as a string (servers/llamacpp.py); see request bodies.
        self.named_tool_choice = named_tool_choice
        # Figures about the answer for drift detection (local providers only: a hosted API does not drift).
        self.answer = AnswerStats() if observe else None
        # What the upstream produced so far: a stream cut before its end is still billed (routing/executor.py).
        self.produced = Produced()
        self.skip_prologue = skip_prologue
        self.client_body = client_body
        self.usage = {}
        self.repair_tools = repair_tools or None
        self.repair = None
        if self.repair_tools:
            cls = OpenAIStreamRepair if self.upstream_wire == "openai" else AnthropicStreamRepair
            self.repair = cls(self.repair_tools)
        self._repaired_whole: list = []  # non-streaming answers

    @property
    def repaired(self) -> int:
        return len(self._repaired_whole) + (self.repair.repaired if self.repair is not None else 0)

    @property
    def repair_formats(self) -> list[str]:
        formats = [c.format for c in self._repaired_whole]
        return formats + (self.repair.formats if self.repair is not None else [])

    def drift_sample(self, *, tools_offered: bool, prompt_key: int = 0) -> DriftSample | None:
        if self.answer is None:
            return None
        if self.repaired:
            self.answer.tool_called = True  # the model did call, in text
        return self.answer.sample(tools_offered=tools_offered, prompt_key=prompt_key)

    def _repair_openai_body(self, resp: dict) -> None:
        if self.answer is not None:
            observe_openai(self.answer, resp)
        if self.repair_tools:
            self._repaired_whole = repair_openai_completion(resp, self.repair_tools)

    def _repair_anthropic_body(self, resp: dict) -> None:
        if self.answer is not None:
            observe_anthropic(self.answer, resp)
        if self.repair_tools:
            self._repaired_whole = repair_anthropic_message(resp, self.repair_tools)

    def path(self) -> str:
        return "/chat/completions" if self.upstream_wire == "openai" else "/messages"

    def url_path(self, stream: bool) -> str:
        """The path under the adapter's api_base for this attempt (a wire whose URL says streaming overrides it)."""
        return self.path()

    # What every strategy does (each subclass has its own, which the ABC enforces at construction): the upstream's request body from the client's, a whole
    # answer on the client's wire, a batch of the upstream's SSE events, and the end of the upstream's stream.

    @abstractmethod
    def request(self, raw: bytes, stream: bool) -> bytes:
        ...

    @abstractmethod
    def response(self, body: bytes) -> bytes:
        ...

    @abstractmethod
    def events(self, events: list[tuple[str | None, str]]) -> bytes:
        ...

    @abstractmethod
    def eof(self) -> bytes:
        ...

    def next_held(self) -> bytes:
        held = self.held
        assert held
        data = self.encode_held(held.pop(0))
        if not held:
            self.held = None
            self.done = True
        return data

    def encode_held(self, item: Any) -> bytes:  # bytes here; a subclass that holds other items encodes them
        return item
