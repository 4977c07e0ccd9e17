"""Images for a provider that does not take them: replaced by a short text note, so the turn is still served.

Claude Code keeps every image of a session (a pasted screenshot, a `Read` of a PNG inside a `tool_result`) in
every later turn, so refusing a request with an image would end the session for good. Pure: returns a new body
and leaves the caller's untouched."""

from __future__ import annotations


def omit_images(ingress: str, body: dict, note: str) -> tuple[dict, int]:
    """(body with every image replaced by `note`, how many were replaced)."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return body, 0
    count = 0
    out = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, list):
            new, n = (_anthropic_blocks if ingress == "anthropic" else _openai_parts)(content, note)
            if n:
                m = {**m, "content": new}
                count += n
        out.append(m)
    if not count:
        return body, 0
    return {**body, "messages": out}, count


def _anthropic_blocks(blocks: list, note: str) -> tuple[list, int]:
    count = 0
    out = []
    for b in blocks:
        if isinstance(b, dict):
            if b.get("type") == "image":
                b = {"type": "text", "text": note}
                count += 1
            elif b.get("type") == "tool_result" and isinstance(b.get("content"), list):
                inner, n = _anthropic_blocks(b["content"], note)
                if n:
                    b = {**b, "content": inner}
                    count += n
        out.append(b)
    return out, count


def _openai_parts(parts: list, note: str) -> tuple[list, int]:
    count = 0
    out = []
    for p in parts:
        if isinstance(p, dict) and p.get("type") in ("image_url", "input_image"):
            p = {"type": "text", "text": note}
            count += 1
        out.append(p)
    return out, count
