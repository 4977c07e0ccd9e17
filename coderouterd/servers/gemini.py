"""Google's Gemini API (AI Studio, `generativelanguage.googleapis.com`), a `kind = "gemini"` provider's server.

Never recognised by probing: the provider's kind says it (its adapter names this kind). Its model list is
`GET /v1beta/models` (`models[].name`, "models/..." ids); `GET /v1beta/models/{model}` says `inputTokenLimit`, the
prompt one request may send to that model. No slots, no model control. Cached prompt tokens:
`usageMetadata.cachedContentTokenCount`. Context overflow is a 400 INVALID_ARGUMENT reading "The input token count
(N) exceeds the maximum number of tokens allowed (M).\""""

from __future__ import annotations

from urllib.parse import quote

from .base import Answers, Get, Post, ServerKind, Window, positive_int, wording

API = "/v1beta"


def method_path(model: str, stream: bool) -> str:
    """The path under the API's origin for one generation with `model` (a "models/" prefix is the same model)."""
    name = quote(model.removeprefix("models/"), safe="-._")
    if stream:
        return f"{API}/models/{name}:streamGenerateContent?alt=sse"
    return f"{API}/models/{name}:generateContent"


class Gemini(ServerKind):
    name = "gemini"
    label = "Gemini API"
    models_path = API + "/models"
    cached_tokens = "usageMetadata.cachedContentTokenCount"
    overflow_markers = ("input token count",)
    overflow_wordings = (
        wording(r"input token count \((?P<prompt>[\d,]+)\) exceeds the maximum number of tokens allowed "
                r"\((?P<limit>[\d,]+)\)"),
    )

    def recognise(self, answers: Answers) -> bool:
        return False  # named by the provider's kind, never guessed from an OpenAI-compatible URL

    async def window(self, get: Get, model: str, answers: Answers, post: Post | None = None) -> Window:
        if not model:
            return Window(None)  # clients name the model: one provider, many windows
        name = model.removeprefix("models/")
        status, data = await get(f"{API}/models/{quote(name, safe='-._')}")
        if status != 200 or not isinstance(data, dict):
            return Window(None)
        n = positive_int(data.get("inputTokenLimit"))
        return Window(n, "Gemini API models.get inputTokenLimit" if n else "")


KIND = Gemini()
