"""A plan rendered as OpenAI Responses API output, for fakes of servers that serve /v1/responses themselves
(OpenAI, LM Studio 0.3.29+, llama-swap). Written from the API reference, independent of coderouterd's own
translator, so passthrough tests compare the daemon against the wire and not against itself."""

from __future__ import annotations

from .behaviour import Plan, dumps


def _usage(prompt: int, plan: Plan) -> dict:
    out = plan.output_tokens
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": out,
            "output_tokens_details": {"reasoning_tokens": len(plan.reasoning)}, "total_tokens": prompt + out}


def _items(plan: Plan, name: str) -> list[dict]:
    items: list[dict] = []
    if plan.reasoning:
        items.append({"id": f"rs_{name}", "type": "reasoning", "encrypted_content": f"enc-{name}",
                      "summary": [{"type": "summary_text", "text": "".join(plan.reasoning)}]})
    if plan.content:
        items.append({"id": f"msg_{name}", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": plan.text, "annotations": []}]})
    for tc in plan.tool_calls:
        items.append({"id": f"fc_{tc.id}", "type": "function_call", "status": "completed", "call_id": tc.id,
                      "name": tc.name, "arguments": tc.arguments})
    return items


def response_body(plan: Plan, model: str, name: str, prompt: int, status: str = "completed") -> dict:
    return {"id": f"resp_{name}", "object": "response", "created_at": 1700000000, "status": status,
            "model": model, "output": _items(plan, name) if status == "completed" else [],
            "usage": _usage(prompt, plan) if status == "completed" else None, "error": None,
            "incomplete_details": None, "tools": [], "tool_choice": "auto", "parallel_tool_calls": True}


def response_frames(plan: Plan, model: str, name: str, prompt: int) -> list[bytes]:
    events: list[dict] = []
    shell = response_body(plan, model, name, prompt, status="in_progress")
    events += [{"type": "response.created", "response": shell}, {"type": "response.in_progress", "response": shell}]
    for i, item in enumerate(_items(plan, name)):
        if item["type"] == "message":
            events.append({"type": "response.output_item.added", "output_index": i,
                           "item": {**item, "status": "in_progress", "content": []}})
            events.append({"type": "response.content_part.added", "item_id": item["id"], "output_index": i,
                           "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})
            for piece in plan.content:
                events.append({"type": "response.output_text.delta", "item_id": item["id"], "output_index": i,
                               "content_index": 0, "delta": piece})
            events.append({"type": "response.output_text.done", "item_id": item["id"], "output_index": i,
                           "content_index": 0, "text": plan.text})
            events.append({"type": "response.content_part.done", "item_id": item["id"], "output_index": i,
                           "content_index": 0, "part": item["content"][0]})
        elif item["type"] == "function_call":
            events.append({"type": "response.output_item.added", "output_index": i,
                           "item": {**item, "status": "in_progress", "arguments": ""}})
            tc = next(t for t in plan.tool_calls if t.id == item["call_id"])
            for frag in tc.fragments:
                events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                               "output_index": i, "delta": frag})
            events.append({"type": "response.function_call_arguments.done", "item_id": item["id"],
                           "output_index": i, "arguments": tc.arguments})
        else:
            events.append({"type": "response.output_item.added", "output_index": i,
                           "item": {**item, "summary": []}})
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    events.append({"type": "response.completed", "response": response_body(plan, model, name, prompt)})
    frames = []
    for seq, ev in enumerate(events):
        ev["sequence_number"] = seq
        frames.append(b"event: " + ev["type"].encode() + b"\ndata: " + dumps(ev) + b"\n\n")
    return frames
