"""llama.cpp's llama-server.

Recognised by `GET /props` carrying `default_generation_settings` (no other server answers it so). The
context one request may use is per slot: `/props` → `default_generation_settings.n_ctx` (the server's `-c`
divided by `--parallel`), the same figure as each `/slots` entry's `n_ctx`; `total_slots` counts them. A
client picks a slot with `id_slot`; `/slots` answering confirms the slot API is on (`--no-slots` turns it
off). Cached prompt tokens: `timings.cache_n` (with `prompt_n` processed), also
`usage.prompt_tokens_details.cached_tokens`. A prompt over the slot's context is answered 400 with
`error.type = "exceed_context_size_error"` and the numbers in `error.n_prompt_tokens` / `error.n_ctx`; the
message reads "request (N tokens) exceeds the available context size (M tokens), try increasing it" (older
builds: no numbers in the message) or "input (N tokens) is larger than the max context size (M tokens)".
Models are whatever it was started with: no load or unload. `tool_choice` is read only as a string
("auto", "none", "required"; with `--jinja`): an object (OpenAI's named function) is replaced by "auto" with a
warning in the server's log, so a forced call would quietly become optional."""

from __future__ import annotations

from .base import Answers, Get, Post, ServerKind, Window, positive_int, wording

PROPS = "/props"
SLOTS = "/slots"
OVERFLOW_TYPE = "exceed_context_size_error"


def slot_context(props) -> int | None:
    """The context of one slot from a `/props` answer."""
    if not isinstance(props, dict):
        return None
    settings = props.get("default_generation_settings")
    return positive_int(settings.get("n_ctx")) if isinstance(settings, dict) else None


def total_slots(props) -> int:
    return positive_int(props.get("total_slots")) or 0 if isinstance(props, dict) else 0


class LlamaCpp(ServerKind):
    name = "llama.cpp"
    label = "llama.cpp"
    default_port = 8080
    probe_paths = (PROPS,)
    cached_tokens = "timings.cache_n (timings.prompt_n processed); usage.prompt_tokens_details.cached_tokens"
    overflow_markers = ("exceed_context_size", "available context size", "max context size", "n_ctx")
    named_tool_choice = False
    overflow_wordings = (
        wording(r"(?:request|input) \((?P<prompt>[\d,]+) tokens\) (?:exceeds the available|is larger than the max) "
                r"context size \((?P<limit>[\d,]+) tokens\)"),
    )

    def recognise(self, answers: Answers) -> bool:
        status, props = answers.get(PROPS, (0, None))
        return status == 200 and isinstance(props, dict) and isinstance(props.get("default_generation_settings"),
                                                                          dict)

    def typed_overflow(self, err: dict) -> tuple[int, int] | None:
        prompt, limit = err.get("n_prompt_tokens"), err.get("n_ctx")
        if isinstance(prompt, int) or isinstance(limit, int):
            return (prompt if isinstance(prompt, int) else 0), (limit if isinstance(limit, int) else 0)
        return None

    def slots(self, answers: Answers) -> int:
        status, props = answers.get(PROPS, (0, None))
        return total_slots(props) if status == 200 else 0

    async def window(self, get: Get, model: str, answers: Answers, post: Post | None = None) -> Window:
        status, props = answers[PROPS] if PROPS in answers else await get(PROPS)
        n = slot_context(props) if status == 200 else None
        return Window(n, "llama-server /props n_ctx (per slot)" if n else "")


KIND = LlamaCpp()
