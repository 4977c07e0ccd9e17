"""How many tokens a prompt is for each provider's context gate. The one estimate (bytes / 4) counts what a chat
template may never render: tool schemas, for one. Measured on a Claude Code turn: ~19,000 estimated, 3,003 by
the server. So the gate asks, per provider, in this order:

1. the server's own count of this prompt, when its server can count (llama-server: `/apply-template` renders it
   with the model's own template, `/tokenize` counts that), asked only when an estimate would skip it;
2. the chars-per-token ratio taught by what that server reported as prompt_tokens on earlier requests;
3. the plain estimate.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from ..providers.server_http import llama_server

if TYPE_CHECKING:
    from ..providers.provider import Provider
    from ..providers.server_info import ServerDirectory
    from .generation import Generation
    from .request import ClientRequest

log = logging.getLogger("coderouterd")


class WindowFacts(Protocol):
    """What counting asks of the router (routing/router.py, which calls in here): its server directory and the
    window each provider is routed by."""

    @property
    def servers(self) -> ServerDirectory | None: ...

    def context_window(self, provider: Provider) -> int: ...


COUNT_TIMEOUT_S = 5.0  # both round trips; a server slower than that is gated by the estimate
_COUNTING_SERVERS = frozenset({"llama.cpp"})


def learned_estimates(runtime: Generation, names: Iterable[str], req: ClientRequest) -> dict[str, int]:
    """Providers whose server has taught a ratio: this prompt's size by that ratio."""
    size = len(req.raw)
    out = {}
    for name in names:
        p = runtime.providers.get(name)
        if p is not None and p.ratio_learned:
            out[name] = p.estimate_tokens(size)
    return out


def _countable(router: WindowFacts, p: Provider) -> bool:
    if p.adapter.wire != "openai" or p.template_count_supported is False or router.servers is None:
        return False
    info = router.servers.info(p)
    return info is not None and info.kind in _COUNTING_SERVERS


async def count_over_window(router: WindowFacts, runtime: Generation, names: Iterable[str],
                            req: ClientRequest) -> dict[str, int]:
    """{provider: tokens by its server's count} for the providers of `names` whose estimate exceeds their window
    and whose server can count. Nothing is asked for a prompt that fits by the estimate (nearly all)."""
    base = req.estimated_tokens()
    learned = None
    todo: list[Provider] = []
    for name in names:
        p = runtime.providers.get(name)
        if p is None:
            continue
        window = router.context_window(p)
        if not window:
            continue
        if learned is None:
            learned = learned_estimates(runtime, names, req)
        if learned.get(name, base) > window and _countable(router, p):
            todo.append(p)
    if not todo:
        return {}
    body = chat_body(req)
    counted = await asyncio.gather(*(_count(p, body) for p in todo))
    return {p.name: n for p, n in zip(todo, counted, strict=True) if n is not None}


def chat_body(req: ClientRequest) -> dict:
    """The prompt in the chat-completions form a llama-server template takes."""
    if req.ingress == "anthropic":
        from ..translate.anthropic_request_to_openai import request_to_openai

        body, _ = request_to_openai(req.body, req.model, stream=False)
        return body
    return req.body  # chat completions, and Responses as translated to it


async def _count(p: Provider, body: dict) -> int | None:
    """The server's token count of the rendered prompt; None when it cannot say (and, on 404, never again)."""
    asked = {"messages": body.get("messages") or []}
    for key in ("tools", "tool_choice", "chat_template_kwargs"):
        if body.get(key) is not None:
            asked[key] = body[key]
    server = llama_server(p)
    try:
        async with asyncio.timeout(COUNT_TIMEOUT_S):
            status, prompt = await server.apply_template(asked, COUNT_TIMEOUT_S)
            if status in (404, 405, 501):
                p.template_count_supported = False
                return None
            if prompt is None:
                return None
            _, tokens = await server.tokenize(prompt, COUNT_TIMEOUT_S, special=True)
    except (OSError, TimeoutError) as e:
        log.debug("context count at %s failed: %s", p.name, e)
        return None
    if tokens is None:
        return None
    p.template_count_supported = True
    return tokens
