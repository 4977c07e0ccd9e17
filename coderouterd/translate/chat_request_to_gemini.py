"""OpenAI chat-completions bodies as Gemini `generateContent` requests: the chat form every ingress but Gemini's
own is held in (Anthropic's through anthropic_request_to_openai.py, Responses' through responses_request.py) goes
to a Gemini upstream this way. The answer comes back through gemini_answer_to_chat.py.

The inverse of gemini_request.py (Gemini client -> chat), written the other way round:

- `system` messages become `systemInstruction`; the rest alternate `user` / `model` turns, runs of one role merged
  (tool results and the user text after them share one user turn, as Gemini's own clients send them);
- tool calls become `functionCall` parts (with their ids), tool messages `functionResponse` parts named after
  the call they answer, the text as `{"output": ...}` (what Gemini CLI sends, and what gemini_request.py reads);
- tool schemas go as `parametersJsonSchema` (full JSON Schema, no conversion to Gemini's OpenAPI subset);
- a model turn that calls a function carries a `thoughtSignature` on its first call: Gemini 3 refuses a
  function call without one. Clients of other wires never see signatures, so the ones the upstream gave are kept
  here by call id (`CallSignatures`, filled by gemini_answer_to_chat.py) and put back; a call this daemon does not
  remember (another model made it, or the memory was lost) gets the value Google documents for calls made
  elsewhere (`SKIP_SIGNATURE`).
"""

from __future__ import annotations

import re
from collections import OrderedDict

from .tool_arguments import parse_tool_arguments

# https://ai.google.dev/gemini-api/docs/thought-signatures: for function calls that did not come from a Gemini
# model (history built elsewhere), this value in place of a signature skips its validation.
SKIP_SIGNATURE = "skip_thought_signature_validator"

# How many calls' signatures one provider remembers: a tool loop sends back the calls of its current turn only, so
# this covers thousands of concurrent sessions (a signature is a few hundred bytes).
_REMEMBERED = 4096


class CallSignatures:
    """The thoughtSignatures a Gemini upstream gave its function calls, by call id, the oldest forgotten first."""

    def __init__(self, size: int = _REMEMBERED) -> None:
        self.size = size
        self._by_id: OrderedDict[str, str] = OrderedDict()

    def remember(self, call_id: str, signature: str) -> None:
        self._by_id[call_id] = signature
        self._by_id.move_to_end(call_id)
        while len(self._by_id) > self.size:
            self._by_id.popitem(last=False)

    def get(self, call_id: str) -> str | None:
        return self._by_id.get(call_id)


# chat reasoning_effort -> thinkingBudget (0: off). The budgets are Gemini 2.5's own tiers.
_BUDGET = {"none": 0, "minimal": 512, "low": 1024, "medium": 8192, "high": 24576}
# Gemini 2.5 Pro cannot think less than this and refuses 0 (Google's thinking guide): "none" is its least.
_PRO_25_MIN_BUDGET = 128
# Gemini 3 and later take a level instead of a budget (both at once is a 400), and cannot turn thinking off. Pro
# knows "low" and "high"; Flash also "minimal" and "medium". "none" is the least the model has, thoughts not shown.
_LEVEL_FLASH = {"none": "minimal", "minimal": "minimal", "low": "low", "medium": "medium", "high": "high"}
_LEVEL_PRO = {"none": "low", "minimal": "low", "low": "low", "medium": "high", "high": "high"}
_LEVELLED = re.compile(r"gemini-(?:[3-9]|\d{2,})")


def effort_thinking(effort: str, model: str | None) -> dict:
    """A chat reasoning_effort as the thinkingConfig the upstream model takes (`model`: as in its URL)."""
    m = (model or "").lower().rsplit("/", 1)[-1]
    if _LEVELLED.search(m):
        level = (_LEVEL_FLASH if "flash" in m else _LEVEL_PRO)[effort]
        return {"thinkingLevel": level, "includeThoughts": effort != "none"}
    budget = _BUDGET[effort]
    if budget == 0 and "gemini-2.5-pro" in m:
        return {"thinkingBudget": _PRO_25_MIN_BUDGET, "includeThoughts": False}
    return {"thinkingBudget": budget, "includeThoughts": budget > 0}


_IMAGE_TYPES = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg", "webp": "image/webp",
                "gif": "image/gif", "heic": "image/heic", "heif": "image/heif"}


def _image(url: str) -> dict:
    """An image_url part: a data URL inline, anything else by reference (fileData needs a concrete MIME type:
    the file name's, else JPEG)."""
    if url.startswith("data:") and ";base64," in url:
        head, _, data = url.partition(";base64,")
        return {"inlineData": {"mimeType": head[5:] or "image/png", "data": data}}
    ext = url.split("?", 1)[0].rpartition(".")[2].lower()
    return {"fileData": {"mimeType": _IMAGE_TYPES.get(ext, "image/jpeg"), "fileUri": url}}


def _parts(content: object) -> list[dict]:
    """A chat message's content as Gemini parts (text and images; other part kinds carry no meaning here)."""
    if isinstance(content, str):
        return [{"text": content}] if content else []
    parts: list[dict] = []
    for p in content if isinstance(content, list) else ():
        if not isinstance(p, dict):
            continue
        if p.get("type") in ("text", "input_text", "output_text") and isinstance(p.get("text"), str):
            parts.append({"text": p["text"]})
        elif p.get("type") == "image_url":
            iu = p.get("image_url")
            url = iu.get("url") if isinstance(iu, dict) else iu
            if isinstance(url, str) and url:
                parts.append(_image(url))
    return parts


def _text(content: object) -> str:
    return "".join(p.get("text", "") for p in _parts(content))


class _Turns:
    """Gemini `contents` under construction: consecutive parts of one role share a turn."""

    def __init__(self, signatures: CallSignatures | None) -> None:
        self.contents: list[dict] = []
        self.call_names: dict[str, str] = {}  # chat tool_call id -> function name (functionResponse needs it)
        self.signatures = signatures

    def add(self, role: str, parts: list[dict]) -> None:
        if not parts:
            return
        if self.contents and self.contents[-1]["role"] == role:
            self.contents[-1]["parts"].extend(parts)
        else:
            self.contents.append({"role": role, "parts": parts})

    def assistant(self, msg: dict) -> None:
        parts = _parts(msg.get("content"))
        calls: list[dict] = []
        for tc in msg.get("tool_calls") or ():
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                continue
            call: dict = {"name": fn["name"], "args": parse_tool_arguments(fn.get("arguments"))}
            part: dict = {"functionCall": call}
            if isinstance(tc.get("id"), str) and tc["id"]:
                call["id"] = tc["id"]
                self.call_names[tc["id"]] = fn["name"]
                signature = self.signatures.get(tc["id"]) if self.signatures is not None else None
                if signature:
                    part["thoughtSignature"] = signature
            calls.append(part)
        if calls and "thoughtSignature" not in calls[0]:
            calls[0]["thoughtSignature"] = SKIP_SIGNATURE
        self.add("model", parts + calls)

    def tool(self, msg: dict) -> None:
        call_id = msg.get("tool_call_id")
        name = self.call_names.get(call_id) if isinstance(call_id, str) else None
        response: dict = {"name": name or str(msg.get("name") or "tool"),
                          "response": {"output": _text(msg.get("content"))}}
        if isinstance(call_id, str) and call_id:
            response["id"] = call_id
        self.add("user", [{"functionResponse": response}])


def _tools(chat: dict) -> tuple[list[dict], dict | None]:
    """(Gemini tools, toolConfig) from chat tools and tool_choice."""
    decls: list[dict] = []
    for t in chat.get("tools") or ():
        fn = t.get("function") if isinstance(t, dict) and t.get("type", "function") == "function" else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        decl: dict = {"name": fn["name"]}
        if fn.get("description"):
            decl["description"] = fn["description"]
        params = fn.get("parameters")
        decl["parametersJsonSchema"] = params if isinstance(params, dict) else {"type": "object", "properties": {}}
        decls.append(decl)
    if not decls:
        return [], None
    choice = chat.get("tool_choice")
    fcc: dict
    if choice == "none":
        fcc = {"mode": "NONE"}
    elif choice == "required":
        fcc = {"mode": "ANY"}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        fcc = {"mode": "ANY", "allowedFunctionNames": [str(choice["function"].get("name") or "")]}
    else:
        fcc = {"mode": "AUTO"}
    return [{"functionDeclarations": decls}], {"functionCallingConfig": fcc}


def _generation_config(chat: dict, model: str | None) -> dict:
    gen: dict = {}
    limit = chat.get("max_completion_tokens")
    if limit is None:  # present but null is no limit: max_tokens may still name one
        limit = chat.get("max_tokens")
    if isinstance(limit, int) and limit > 0:
        gen["maxOutputTokens"] = limit
    for src, dst in (("temperature", "temperature"), ("top_p", "topP"), ("top_k", "topK"), ("seed", "seed"),
                     ("presence_penalty", "presencePenalty"), ("frequency_penalty", "frequencyPenalty")):
        if chat.get(src) is not None:
            gen[dst] = chat[src]
    stop = chat.get("stop")
    if isinstance(stop, str) and stop:
        gen["stopSequences"] = [stop]
    elif isinstance(stop, list) and stop:
        gen["stopSequences"] = [s for s in stop if isinstance(s, str)]
    fmt = chat.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        gen["responseMimeType"] = "application/json"
        schema = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
        if isinstance(schema, dict):
            gen["responseJsonSchema"] = schema
    effort = chat.get("reasoning_effort")
    if isinstance(effort, str) and effort in _BUDGET:
        gen["thinkingConfig"] = effort_thinking(effort, model)
    return gen


def chat_to_gemini(chat: dict, signatures: CallSignatures | None = None, model: str | None = None) -> dict:
    """A chat-completions body as a Gemini generateContent body (the model goes in the URL, not the body);
    `signatures`: what the upstream signed its calls with, to send them back; `model`: the upstream model (what
    it can do with thinking), else the body's."""
    turns = _Turns(signatures)
    system: list[str] = []
    for msg in chat.get("messages") or ():
        if not isinstance(msg, dict):
            continue
        role = msg.get("role")
        if role in ("system", "developer"):
            text = _text(msg.get("content"))
            if text:
                system.append(text)
        elif role == "assistant":
            turns.assistant(msg)
        elif role == "tool":
            turns.tool(msg)
        else:
            turns.add("user", _parts(msg.get("content")))
    body: dict = {"contents": turns.contents}
    if system:
        body["systemInstruction"] = {"parts": [{"text": "\n\n".join(system)}]}
    tools, tool_config = _tools(chat)
    if tools:
        body["tools"] = tools
        body["toolConfig"] = tool_config
    gen = _generation_config(chat, model or (chat.get("model") if isinstance(chat.get("model"), str) else None))
    if gen:
        body["generationConfig"] = gen
    return body


def thinking_config(anthropic_thinking: object) -> dict | None:
    """An Anthropic `thinking` setting as Gemini's thinkingConfig (thoughts shown: the client asked to see them)."""
    if not isinstance(anthropic_thinking, dict):
        return None
    kind = anthropic_thinking.get("type")
    if kind == "enabled" and isinstance(anthropic_thinking.get("budget_tokens"), int):
        return {"thinkingBudget": anthropic_thinking["budget_tokens"], "includeThoughts": True}
    if kind == "adaptive":
        return {"thinkingBudget": -1, "includeThoughts": True}
    return None
