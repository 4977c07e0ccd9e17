"""The Responses API's objects as the client reads them: the response envelope, output items and usage.

Shared by the stream event generator and the non-stream builder so both answer with the same shapes."""

from __future__ import annotations

from ..ids import new_id
from .reasoning import split_think_tags
from .responses_request import ResponsesRequest

# Echoed from the request into response objects (the SDK and Codex read some of them back).
_ECHO = ("max_output_tokens", "parallel_tool_calls", "temperature", "tool_choice", "top_p", "reasoning", "text",
         "truncation", "metadata", "prompt_cache_key", "store", "user")


def response_object(rq: ResponsesRequest, model: str, status: str, output: list[dict] | None = None,
                    usage: dict | None = None, *, error: dict | None = None,
                    incomplete: dict | None = None, final: bool = True) -> dict:
    """The response envelope. `tools` is not echoed (Codex's are ~30 KB, sent three times a stream: that
    cost ~0.3 ms per Codex-sized request in bench/responses.py, and neither Codex nor the SDK reads them back);
    `instructions` is echoed in the final object only."""
    body = rq.body
    obj: dict = {
        "id": rq.response_id, "object": "response", "created_at": rq.created_at, "status": status,
        "error": error, "incomplete_details": incomplete, "model": model, "output": output or [],
        "previous_response_id": None, "usage": usage,
        "tools": [],
        "instructions": body.get("instructions") if final else None,
    }
    for key in _ECHO:
        obj[key] = body.get(key)
    if obj["parallel_tool_calls"] is None:
        obj["parallel_tool_calls"] = True
    if obj["tool_choice"] is None:
        obj["tool_choice"] = "auto"
    return obj


def responses_usage(chat_usage: dict | None, *, reasoning_tokens: int = 0) -> dict:
    """Chat-completions usage in the Responses shape (cached and reasoning token details included)."""
    u = chat_usage or {}
    inp = int(u.get("prompt_tokens") or 0)
    out = int(u.get("completion_tokens") or 0)
    cached = int((u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    reasoning = int((u.get("completion_tokens_details") or {}).get("reasoning_tokens") or reasoning_tokens)
    return {"input_tokens": inp, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": min(reasoning, out) if out else reasoning},
            "total_tokens": inp + out}


def message_item(text: str, *, item_id: str | None = None, status: str = "completed") -> dict:
    return {"id": item_id or new_id("msg"), "type": "message", "status": status, "role": "assistant",
            "content": [output_text_part(text)] if status == "completed" else []}


def output_text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_item(summary: str, *, item_id: str | None = None, done: bool = True) -> dict:
    item: dict = {"id": item_id or new_id("rs"), "type": "reasoning",
                  "summary": [{"type": "summary_text", "text": summary}] if done and summary else []}
    if done:
        item["status"] = "completed"
    return item


def function_call_item(rq: ResponsesRequest, flat_name: str, call_id: str, arguments: str, *,
                       item_id: str | None = None, status: str = "completed") -> dict:
    """A function_call item under the name the client declared: namespaced tools get their namespace back."""
    ns, name = rq.client_tool_name(flat_name)
    item: dict = {"id": item_id or new_id("fc"), "type": "function_call", "status": status,
                  "call_id": call_id or new_id("call"), "name": name, "arguments": arguments}
    if ns is not None:
        item["namespace"] = ns
    return item


def chat_completion_to_response(rq: ResponsesRequest, completion: dict, model: str) -> dict:
    """A whole chat completion as a Responses object: reasoning, then text, then function calls."""
    choice = (completion.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    content = msg.get("content")
    text = content if isinstance(content, str) else ""
    tag_thinking = ""
    if "think>" in text:  # <think> or </think>: most answers have neither
        tag_thinking, text = split_think_tags(text)
    field = msg.get("reasoning_content") or msg.get("reasoning") or ""
    thinking = "\n\n".join(t for t in (field.strip() if isinstance(field, str) else "", tag_thinking) if t)
    output: list[dict] = []
    if thinking:
        output.append(reasoning_item(thinking))
    if text:
        output.append(message_item(text))
    for call in msg.get("tool_calls") or ():
        fn = call.get("function") or {}
        output.append(function_call_item(rq, fn.get("name") or "", call.get("id") or "", fn.get("arguments") or ""))
    usage = responses_usage(completion.get("usage"), reasoning_tokens=(len(thinking) + 3) // 4)
    if choice.get("finish_reason") == "length":
        return response_object(rq, model, "incomplete", output, usage, incomplete={"reason": "max_output_tokens"})
    return response_object(rq, model, "completed", output, usage)
