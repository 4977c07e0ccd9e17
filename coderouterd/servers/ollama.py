"""Ollama.

Recognised by `GET /api/version` answering `{"version": ...}`. Models: `/api/tags` (available), `/api/ps`
(loaded, each with the `context_length` it was loaded with); an empty `/api/generate` loads a model,
`keep_alive: 0` unloads it. Context window: as loaded (`/api/ps`), else `num_ctx` in the model's parameters
(`POST /api/show`), else the server's default (4096 unless OLLAMA_CONTEXT_LENGTH says otherwise: a guess,
never firm); `/api/show` → `model_info["<arch>.context_length"]` is what the model was trained for. Ollama
has no slots. Cached prompt tokens: not reported. A prompt over the window is usually truncated silently;
when refused, the message reads "prompt too long; exceeded max context length by N tokens" (N is the
excess, not the prompt: no numbers to report)."""

from __future__ import annotations

import re

from .base import Answers, Get, Post, ServerKind, Window

VERSION = "/api/version"
DEFAULT_CONTEXT = 4096
_NUM_CTX = re.compile(r"^\s*num_ctx\s+(\d+)", re.M)


def _names(model: str) -> set[str]:
    return {model, f"{model}:latest"}


def trained_context(show) -> int | None:
    found = None
    if isinstance(show, dict):
        for key, value in (show.get("model_info") or {}).items():
            if key.endswith(".context_length") and isinstance(value, int):
                found = value
    return found


def loaded_context(ps, model: str) -> int | None:
    for m in (ps or {}).get("models") or [] if isinstance(ps, dict) else []:
        if isinstance(m, dict) and m.get("name") in _names(model) and isinstance(m.get("context_length"), int):
            return m["context_length"]
    return None


def parameter_num_ctx(show) -> int | None:
    params = show.get("parameters", "") if isinstance(show, dict) else ""
    found = _NUM_CTX.search(params if isinstance(params, str) else "")
    return int(found.group(1)) if found else None


def window_from(show, ps, model: str) -> Window:
    """The window from `/api/show` and `/api/ps` answers (either may be None)."""
    trained = trained_context(show)
    n = loaded_context(ps, model)
    if n:
        return Window(n, "as loaded, /api/ps", trained)
    n = parameter_num_ctx(show)
    if n:
        return Window(n, "num_ctx in the model's parameters", trained)
    return Window(DEFAULT_CONTEXT, "Ollama's default unless OLLAMA_CONTEXT_LENGTH is set", trained, firm=False)


class Ollama(ServerKind):
    name = "ollama"
    label = "Ollama"
    default_port = 11434
    models_path = "/api/tags"
    probe_paths = (VERSION,)
    cached_tokens = "not reported"
    overflow_markers = ("prompt too long", "exceeded max context length")

    def recognise(self, answers: Answers) -> bool:
        status, data = answers.get(VERSION, (0, None))
        return status == 200 and isinstance(data, dict) and "version" in data

    async def window(self, get: Get, model: str, answers: Answers, post: Post | None = None) -> Window:
        if not model:
            return Window(None)  # clients choose the model: no one window
        status, ps = await get("/api/ps")
        show = None
        if post is not None:
            try:
                show = await post("/api/show", {"model": model}, 10.0)
            except Exception:  # noqa: BLE001 - a model /api/show does not know: the other sources still count
                show = None
        w = window_from(show, ps if status == 200 else None, model)
        if not w.firm and w.trained:
            # Not loaded and no num_ctx: what it will be loaded with is a guess, but never more than the model
            # was trained for, so that bound is safe to route by.
            return Window(w.trained, "the model's trained context (model_info), not loaded yet", w.trained)
        return w

    async def list_models(self, get: Get) -> list[dict] | None:
        _, tags = await get("/api/tags")
        _, ps = await get("/api/ps")
        loaded = {m.get("name") or m.get("model") for m in (ps or {}).get("models", [])}
        out = []
        for m in (tags or {}).get("models", []):
            name = m.get("name") or m.get("model")
            out.append({"id": name, "loaded": name in loaded, "size": m.get("size"), "details": m.get("details", {})})
        return out

    async def load(self, get: Get, post: Post, model: str, timeout: float) -> dict:
        data = await post("/api/generate", {"model": model}, timeout)
        return {"loaded": True, "done_reason": (data or {}).get("done_reason")}

    async def unload(self, get: Get, post: Post, model: str, timeout: float) -> dict:
        data = await post("/api/generate", {"model": model, "keep_alive": 0}, timeout)
        return {"loaded": False, "done_reason": (data or {}).get("done_reason")}


KIND = Ollama()
