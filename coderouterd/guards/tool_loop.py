"""Tool-loop guard: notice an agent calling the same tool with the same input over and over.

Only the current agent run counts: walking back from the end of the history, collection stops at
the latest human turn (a user turn that carries no tool results). Once the user has stepped in, the
old calls are theirs to judge — otherwise a `break` would reject every later request of the
conversation, the user's own correction included.

Histories are long (Claude Code sends hundreds of messages), so the walk starts at the end, only
the newest `window` calls are canonicalised, and the older ones are merely counted — and only when
a `max_tool_calls` cap or a finding needs the number.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import orjson

from coderouterd.ids import clip
from coderouterd.state.events import GuardFired

if TYPE_CHECKING:
    from ..config.schema import ToolLoopConfig

GUARD_NAME = "tool_loop"

Call = tuple[str, str]


@dataclass(slots=True)
class LoopFinding:
    tool: str  # "*" when the finding is the total-calls cap
    repeats: int
    threshold: int
    window: int
    input_digest: str
    total_tool_calls: int
    max_tool_calls: int = 0

    @property
    def is_cap(self) -> bool:
        return self.tool == "*"

    def detail(self) -> dict:
        out = {
            "tool": clip(self.tool) if isinstance(self.tool, str) else self.tool,  # a client's string: bounded
            "repeat_count": self.repeats,
            "threshold": self.threshold,
            "window": self.window,
            "total_tool_calls": self.total_tool_calls,
        }
        if self.is_cap:
            out["max_tool_calls"] = self.max_tool_calls
        return out

    def message(self) -> str:
        if self.is_cap:
            return (
                f"tool call limit exceeded: {self.total_tool_calls} tool calls since the last user message"
                f" (max {self.max_tool_calls})"
            )
        return (
            f"tool loop detected: {clip(str(self.tool))} called {self.repeats} times in a row with the same input"
            f" (threshold {self.threshold}, window {self.window})"
        )

    def event(self, request_id: str | None, action: str) -> GuardFired:
        return GuardFired(request_id=request_id, guard=GUARD_NAME, action=action, detail=self.detail())


def canonical(value: Any) -> str:
    """Key order must not hide a repeat: the same input serialised by another client sorts the same."""
    try:
        return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        # orjson refuses integers beyond 64 bits and non-str keys; those still deserve a stable form.
        return json.dumps(value, sort_keys=True, default=str, ensure_ascii=False)


def _canonical_arguments(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            return canonical(orjson.loads(arguments))
        except orjson.JSONDecodeError:
            return arguments
    return canonical(arguments)


def _has_tool_result(content: Any) -> bool:
    if not isinstance(content, list):
        return False
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            return True
    return False


def _anthropic_newest_first(messages: list) -> Iterator[tuple[str, Any]]:
    # Consecutive user messages form one turn (the API merges them), so a text-only user message
    # next to a tool_result one is part of the agent run, not a human interruption.
    turn_has_user = turn_has_results = False
    for msg in reversed(messages):
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "assistant":
            if turn_has_user and not turn_has_results:
                return
            turn_has_user = turn_has_results = False
            content = msg.get("content")
            if isinstance(content, list):
                for block in reversed(content):
                    if isinstance(block, dict) and block.get("type") == "tool_use":
                        yield str(block.get("name") or ""), block.get("input")
        elif role == "user":
            turn_has_user = True
            if not turn_has_results and _has_tool_result(msg.get("content")):
                turn_has_results = True


def _openai_newest_first(messages: list) -> Iterator[tuple[str, Any]]:
    turn_has_user = turn_has_results = False
    for msg in reversed(messages):
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role == "assistant":
            if turn_has_user and not turn_has_results:
                return
            turn_has_user = turn_has_results = False
            calls = msg.get("tool_calls")
            if isinstance(calls, list):
                for call in reversed(calls):
                    fn = call.get("function") if isinstance(call, dict) else None
                    if isinstance(fn, dict):
                        yield str(fn.get("name") or ""), fn.get("arguments")
            legacy = msg.get("function_call")
            if isinstance(legacy, dict):
                yield str(legacy.get("name") or ""), legacy.get("arguments")
        elif role in ("tool", "function"):
            turn_has_results = True
        elif role == "user":
            turn_has_user = True


def _take(raw: Iterator[tuple[str, Any]], canon, limit: int | None) -> list[Call]:
    """The newest `limit` calls canonicalised, oldest first; `raw` is left positioned after them."""
    newest = [(name, canon(value)) for name, value in (raw if limit is None else islice(raw, limit))]
    newest.reverse()
    return newest


def tool_calls_anthropic(messages: list, *, limit: int | None = None) -> list[Call]:
    """(tool name, canonical input JSON) of the current run's tool_use blocks, oldest first."""
    return _take(_anthropic_newest_first(messages), canonical, limit)


def tool_calls_openai(messages: list, *, limit: int | None = None) -> list[Call]:
    """(tool name, canonical arguments) of the current run's tool_calls, oldest first; unparseable
    arguments are kept as the raw string."""
    return _take(_openai_newest_first(messages), _canonical_arguments, limit)


def _digest(canonical_input: str) -> str:
    return hashlib.blake2b(canonical_input.encode(), digest_size=8).hexdigest()


def detect(
    calls: list[Call],
    *,
    threshold: int,
    window: int,
    max_tool_calls: int = 0,
    total_tool_calls: int | None = None,
) -> LoopFinding | None:
    """A repeat of the newest call `threshold` times in a row within the last `window` calls, or more
    than `max_tool_calls` calls in all (when that cap is set).

    `calls` may be only the newest part of the run; pass the run's full count as `total_tool_calls`.
    A window smaller than the threshold can never hold a loop, so it never fires.
    """
    total = len(calls) if total_tool_calls is None else total_tool_calls
    recent = calls[-window:] if window > 0 else []
    if recent and 0 < threshold <= len(recent):
        last = recent[-1]
        run = 1
        for i in range(len(recent) - 2, -1, -1):
            if recent[i] != last:
                break
            run += 1
        if run >= threshold:
            return LoopFinding(
                tool=last[0], repeats=run, threshold=threshold, window=window,
                input_digest=_digest(last[1]), total_tool_calls=total, max_tool_calls=max_tool_calls,
            )
    if max_tool_calls > 0 and total > max_tool_calls:
        return LoopFinding(
            tool="*", repeats=total, threshold=max_tool_calls, window=window,
            input_digest="", total_tool_calls=total, max_tool_calls=max_tool_calls,
        )
    return None


def _check(raw, canon, *, threshold: int, window: int, max_tool_calls: int) -> LoopFinding | None:
    calls = _take(raw, canon, max(window, 0))
    # The older calls are only counted, and only when someone needs the number: the cap, or a finding's detail.
    total = len(calls) + sum(1 for _ in raw) if max_tool_calls > 0 else None
    finding = detect(calls, threshold=threshold, window=window, max_tool_calls=max_tool_calls,
                     total_tool_calls=total)
    if finding is not None and total is None:
        finding.total_tool_calls = len(calls) + sum(1 for _ in raw)
    return finding


def check_anthropic(messages: list, *, threshold: int, window: int, max_tool_calls: int = 0) -> LoopFinding | None:
    """The request-path entry point for the Anthropic wire: extraction and detection in one bounded walk."""
    return _check(_anthropic_newest_first(messages), canonical,
                  threshold=threshold, window=window, max_tool_calls=max_tool_calls)


def check_openai(messages: list, *, threshold: int, window: int, max_tool_calls: int = 0) -> LoopFinding | None:
    """The request-path entry point for the OpenAI wire."""
    return _check(_openai_newest_first(messages), _canonical_arguments,
                  threshold=threshold, window=window, max_tool_calls=max_tool_calls)


def check(ingress: str, body: dict, cfg: ToolLoopConfig) -> LoopFinding | None:
    """Run the guard for one request body; `cfg` is a ToolLoopConfig, `ingress` "anthropic" or "openai"."""
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return None
    # Only an assistant message carries calls: a conversation without one (a first turn, a title request) has
    # nothing to find. Cheap however long the history: the first assistant message ends the look.
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant":
            break
    else:
        return None
    fn = check_anthropic if ingress == "anthropic" else check_openai
    return fn(messages, threshold=cfg.threshold, window=cfg.window, max_tool_calls=cfg.max_tool_calls)


def note(finding: LoopFinding) -> str:
    """The system note that `inject` adds, addressed to the model."""
    if finding.is_cap:
        return (
            f"[coderouter] You have made {finding.total_tool_calls} tool calls since the user's last message,"
            f" more than the {finding.max_tool_calls} allowed. Stop calling tools now: tell the user what you"
            " have done, what is blocking you, and what you need from them."
        )
    return (
        f"[coderouter] You are repeating yourself: you have called the tool {finding.tool} {finding.repeats}"
        " times in a row with exactly the same input. Calling it again the same way will not give a"
        " different result. Do not repeat that call. Change your approach: re-read the previous results,"
        " try a different tool or different input, or explain to the user what is blocking you."
    )


def inject_anthropic(body: dict, finding: LoopFinding) -> dict:
    """A new body whose system prompt ends with the loop note; `system` keeps its shape (absent, string
    or block list). The note goes last so cached system prefixes stay valid."""
    text = note(finding)
    system = body.get("system")
    if isinstance(system, list):
        new_system: Any = [*system, {"type": "text", "text": text}]
    elif isinstance(system, str) and system:
        new_system = f"{system}\n\n{text}"
    else:
        new_system = text
    return {**body, "system": new_system}


def inject_openai(body: dict, finding: LoopFinding) -> dict:
    """A new body with the loop note appended to the leading system (or developer) message, or in a
    new system message at index 0."""
    text = note(finding)
    messages = body.get("messages")
    messages = list(messages) if isinstance(messages, list) else []
    first = messages[0] if messages else None
    if isinstance(first, dict) and first.get("role") in ("system", "developer"):
        content = first.get("content")
        if isinstance(content, list):
            new_content: Any = [*content, {"type": "text", "text": text}]
        elif isinstance(content, str) and content:
            new_content = f"{content}\n\n{text}"
        else:
            new_content = text
        messages[0] = {**first, "content": new_content}
    else:
        messages.insert(0, {"role": "system", "content": text})
    return {**body, "messages": messages}


def inject_gemini(body: dict, finding: LoopFinding) -> dict:
    """A Gemini body whose systemInstruction ends with the loop note (a text part after the client's own). The
    client's own body is what a Gemini upstream is sent (the pass-through), so the note must be in it too."""
    system = body.get("systemInstruction")
    system = system if isinstance(system, dict) else {}
    parts = system.get("parts")
    parts = list(parts) if isinstance(parts, list) else []
    return {**body, "systemInstruction": {**system, "parts": [*parts, {"text": note(finding)}]}}


def inject(ingress: str, body: dict, finding: LoopFinding) -> dict:
    return inject_anthropic(body, finding) if ingress == "anthropic" else inject_openai(body, finding)
