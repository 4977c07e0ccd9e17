"""Any other OpenAI-compatible server (OpenAI itself, OpenRouter, a gateway): what the others do not claim.

Nothing to recognise it by but the absence of the others; its model list is the OpenAI one (no load state,
no model control, no context window reported). Cached prompt tokens: `usage.prompt_tokens_details.
cached_tokens`. Context overflow: OpenAI answers `error.code = "context_length_exceeded"` with "This model's
maximum context length is M tokens. However, your messages resulted in N tokens. ..." (or "However, you
requested N tokens (X in the messages, Y in the completion)"), newer models "Your input exceeds the context
window of this model." (no numbers). Servers that copy the Anthropic API say "prompt is too long: N tokens >
M maximum"."""

from __future__ import annotations

from .base import Answers, ServerKind, wording


class Generic(ServerKind):
    name = "openai"
    label = "OpenAI-compatible server"
    overflow_markers = ("context length", "context_length", "maximum context", "context window", "context size",
                        "prompt is too long", "prompt too long")
    overflow_wordings = (
        wording(r"maximum context length is (?P<limit>[\d,]+) tokens.*your messages resulted in "
                r"(?P<prompt>[\d,]+) tokens"),
        wording(r"prompt is too long:\s*(?P<prompt>[\d,]+)\s*tokens\s*>\s*(?P<limit>[\d,]+)"),
    )

    def recognise(self, answers: Answers) -> bool:
        return True


KIND = Generic()
