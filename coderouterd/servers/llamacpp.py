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
warning in the server's log, so a forced call would quietly become optional.

`LlamaServer` is the only code in coderouterd that speaks llama-server's HTTP API (its paths are grepped for
everywhere else by tests/unit/test_import_layers.py), and the flag helpers below the only code that reads or
writes its command line. Like the rest of servers/, it performs no I/O of its own: it is handed a client."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import Answers, Get, Post, ServerKind, Window, positive_int, wording

PROPS = "/props"
SLOTS = "/slots"
TOKENIZE = "/tokenize"
APPLY_TEMPLATE = "/apply-template"
OVERFLOW_TYPE = "exceed_context_size_error"
SLOT_SAVE_PATH = "--slot-save-path"
MODEL_FLAGS = ("-m", "--model")
CTX_FLAGS = ("-c", "--ctx-size")
PARALLEL_FLAGS = ("-np", "--parallel")

# POST JSON to a path under the server's root with a timeout: (HTTP status, parsed JSON or None when the body is
# not JSON). Raises when nothing answers in time (refused, timed out), as `Get` does. Unlike `Post`, an HTTP
# error is an answer: a slot action's 501 says the server was started without --slot-save-path.
PostStatus = Callable[[str, dict, float], Awaitable[tuple[int, Any]]]


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


# -- the HTTP API -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotAnswer:
    """A slot action's answer: the HTTP status (0: no answer in time) and its JSON object ({} otherwise)."""

    status: int
    body: dict

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def count(self, field: str) -> int:
        """A count the server reports (n_saved, n_written, n_restored, n_read); 0 when it does not say."""
        v = self.body.get(field)
        return v if isinstance(v, int) and not isinstance(v, bool) else 0


@dataclass(frozen=True, slots=True)
class SlotState:
    """One `/slots` row: whether the slot is generating, and the tokens it holds (None: the build does not say).
    Older builds report `n_past`; newer ones `n_prompt_tokens` (the prompt and what was generated after it) for a
    slot that ran a task, and no task counters at all for one that never did (it holds nothing)."""

    processing: bool
    tokens: int | None


def _count(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def slot_state(row: dict) -> SlotState:
    n = _count(row.get("n_past"))
    if n is None:
        n = _count(row.get("n_prompt_tokens"))
    if n is None and "id_task" not in row:
        n = 0
    return SlotState(bool(row.get("is_processing")), n)


class LlamaServer:
    """One llama-server's HTTP API through an injected client (`get`, `post`): raises what the client raises
    when nothing answers, except for slot actions (status 0), whose callers only need to know it failed."""

    def __init__(self, get: Get, post: PostStatus) -> None:
        self._get = get
        self._post = post

    async def props(self) -> dict | None:
        """GET /props: the server's settings (model_path, build_info, default_generation_settings.n_ctx,
        total_slots); None when it answers otherwise."""
        status, got = await self._get(PROPS)
        return got if status == 200 and isinstance(got, dict) else None

    async def slots_on(self) -> bool:
        """Whether GET /slots answers: the slot API is on (`--no-slots` turns it off)."""
        status, _ = await self._get(SLOTS)
        return status < 300

    async def slot_states(self) -> list[SlotState] | None:
        """GET /slots: each slot's live state (routing/balance.py polls it to see a replica's load); None when the
        slot API is off or the answer is not a list."""
        status, got = await self._get(SLOTS)
        if status != 200 or not isinstance(got, list):
            return None
        return [slot_state(row) for row in got if isinstance(row, dict)]

    async def _slot(self, slot: int, action: str, filename: str, timeout: float) -> SlotAnswer:
        try:
            status, got = await self._post(f"{SLOTS}/{slot}?action={action}", {"filename": filename}, timeout)
        except (OSError, TimeoutError):
            return SlotAnswer(0, {})
        return SlotAnswer(status, got if 200 <= status < 300 and isinstance(got, dict) else {})

    async def save(self, slot: int, filename: str, timeout: float) -> SlotAnswer:
        """POST /slots/{slot}?action=save: the slot's KV cache to `filename` under its --slot-save-path. A long
        prompt's cache is gigabytes: `timeout` is the provider's first-byte one."""
        return await self._slot(slot, "save", filename, timeout)

    async def restore(self, slot: int, filename: str, timeout: float) -> SlotAnswer:
        """POST /slots/{slot}?action=restore. A success is the server's word only: llama.cpp can report one that
        restored nothing (llama.cpp #26676), so kvcache/ proves it by the next answer's cached tokens."""
        return await self._slot(slot, "restore", filename, timeout)

    async def apply_template(self, asked: dict, timeout: float) -> tuple[int, str | None]:
        """POST /apply-template: the chat rendered by the model's own template (status, prompt text)."""
        status, got = await self._post(APPLY_TEMPLATE, asked, timeout)
        prompt = got.get("prompt") if status == 200 and isinstance(got, dict) else None
        return status, prompt if isinstance(prompt, str) else None

    async def tokenize(self, text: str, timeout: float, *, special: bool = False) -> tuple[int, int | None]:
        """POST /tokenize: (status, how many tokens `text` is). `special`: text rendered by a template, whose
        BOS and special tokens count as the server counts them for a prompt."""
        body: dict = {"content": text}
        if special:
            body.update(add_special=True, parse_special=True)
        status, got = await self._post(TOKENIZE, body, timeout)
        tokens = got.get("tokens") if status == 200 and isinstance(got, dict) else None
        return status, len(tokens) if isinstance(tokens, list) else None


# -- its command line (pure) ------------------------------------------------------------------------------------


# A wrapper that runs the server with the rest of its own command line (`nice -n 5`, `taskset -c 0`, `env K=V`,
# `sh -c 'sleep 2; exec "$0" "$@"'`): the server is the element that names it, and what follows is its own.
_WRAPPED = frozenset({"llama-server", "llama-server.exe"})


def is_llama_server(command: list[str]) -> bool:
    """The command runs llama-server itself (its program is named llama-server*) or through a wrapper that hands
    it the rest of the command line (an element named exactly llama-server), so flags appended reach it."""
    if not command:
        return False
    return os.path.basename(command[0]).startswith("llama-server") or \
        any(os.path.basename(a) in _WRAPPED for a in command[1:])


def flag_value(command: list[str], flags: tuple[str, ...]) -> str | None:
    """The first value of any of `flags` (`-c 4096`, `--ctx-size=4096`), None when absent."""
    for i, arg in enumerate(command):
        if arg in flags and i + 1 < len(command):
            return command[i + 1]
        for f in flags:
            if f.startswith("--") and arg.startswith(f + "="):
                return arg[len(f) + 1:]
    return None


def _last_value(command: list[str], flags: tuple[str, ...]) -> str | None:
    found = None
    for i in range(len(command)):
        v = flag_value(command[i:i + 2], flags)
        if v is not None:
            found = v
    return found


def with_slot_save_path(command: list[str], directory: Path) -> list[str]:
    """A llama-server command given `--slot-save-path directory`, unless it sets one itself."""
    if not is_llama_server(command) or flag_value(command, (SLOT_SAVE_PATH,)) is not None or SLOT_SAVE_PATH in command:
        return command
    return [*command, SLOT_SAVE_PATH, str(directory)]


def saves_to(command: list[str], directory: Path) -> bool:
    """Whether this command's server writes its slot files into `directory` (coderouterd's own)."""
    return flag_value(command, (SLOT_SAVE_PATH,)) == str(directory)


def model_file(command: list[str], cwd: str | None = None) -> Path | None:
    """The GGUF file a llama.cpp-style command loads (-m/--model), resolved against its working directory. Only
    a value ending in .gguf counts: `python -m module` or vLLM's `--model org/name` name no file."""
    value = _last_value(command, MODEL_FLAGS)
    if not value or not value.lower().endswith(".gguf"):
        return None
    p = Path(os.path.expanduser(value))
    return p if p.is_absolute() or not cwd else Path(cwd) / p


def ctx_size(command: list[str]) -> int:
    """-c/--ctx-size, or 0 (the model's own trained context, as llama-server takes it)."""
    value = flag_value(command, CTX_FLAGS)
    try:
        return max(0, int(value)) if value else 0
    except ValueError:
        return 0


def parallel(command: list[str]) -> int:
    """-np/--parallel (the slots the context is split across), or 0 when not given."""
    value = flag_value(command, PARALLEL_FLAGS)
    try:
        return max(0, int(value)) if value else 0
    except ValueError:
        return 0
