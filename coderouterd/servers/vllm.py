"""vLLM's OpenAI-compatible server.

Recognised by its model list: `GET /v1/models` entries carry `owned_by: "vllm"` and `max_model_len`, the
context one request may use (prompt and completion together). No slots, no model control (one model per
server). Cached prompt tokens: `usage.prompt_tokens_details.cached_tokens` (with
`--enable-prompt-tokens-details`). Context overflow is a 400 whose message reads, in current versions, "You
passed N input tokens and requested K output tokens. However, the model's context length is only M tokens,
resulting in a maximum input length of L tokens. Please reduce the length of the input prompt." (the prompt's
limit is L = M - K); before a prompt is tokenized, "You passed N input characters ..." (characters, not
tokens); older versions: "This model's maximum context length is M tokens. However, you requested N tokens
(X in the messages, Y in the completion)." or "... However, your request has N input tokens. Please reduce
the length of the input messages."."""

from __future__ import annotations

from .base import Answers, Get, Post, ServerKind, Window, positive_int, wording

MODELS = "/v1/models"


def _entries(data) -> list[dict]:
    return [m for m in (data or {}).get("data") or [] if isinstance(m, dict)] if isinstance(data, dict) else []


class VLLM(ServerKind):
    name = "vllm"
    label = "vLLM"
    default_port = 8000
    probe_paths = (MODELS,)
    overflow_markers = ("maximum context length", "maximum input length", "reduce the length of the input",
                        "maximum model length")
    overflow_wordings = (
        # Current: the prompt's limit is the maximum input length (the context minus the requested output).
        wording(r"you passed (?P<prompt>[\d,]+) input tokens.*maximum input length of (?P<limit>[\d,]+)"),
        # Rejected before tokenizing: the count is of characters, so the prompt's tokens are unknown.
        wording(r"you passed [\d,]+ input characters.*maximum input length of (?P<limit>[\d,]+)"),
        wording(r"maximum context length is (?P<limit>[\d,]+) tokens.*(?:you requested|your request has) "
                r"(?P<prompt>[\d,]+) (?:input )?tokens"),
        wording(r"decoder prompt \(length (?P<prompt>[\d,]+)\).*maximum model length of (?P<limit>[\d,]+)"),
    )

    def recognise(self, answers: Answers) -> bool:
        status, data = answers.get(MODELS, (0, None))
        return status == 200 and any(m.get("owned_by") == "vllm" for m in _entries(data))

    async def window(self, get: Get, model: str, answers: Answers, post: Post | None = None) -> Window:
        status, data = answers[MODELS] if MODELS in answers else await get(MODELS)
        entries = _entries(data) if status == 200 else []
        chosen = [m for m in entries if m.get("id") == model] or entries[:1]
        n = positive_int(chosen[0].get("max_model_len")) if chosen else None
        return Window(n, "vLLM /v1/models max_model_len" if n else "")


KIND = VLLM()
