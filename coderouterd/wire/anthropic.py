"""Anthropic Messages stream events built in more than one place: one shape, one builder."""

from __future__ import annotations


def message_start(message_id: str, model: str, input_tokens: int) -> dict:
    """The stream's first event, before any content: output_tokens 1 and no cache figures yet, as the API
    itself sends it (the final usage arrives with message_delta)."""
    return {
        "type": "message_start",
        "message": {
            "id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0},
        },
    }
