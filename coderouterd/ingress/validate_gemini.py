"""Validation of Gemini API bodies at the edge: a clear message naming the offending field (dotted path with [i]
indices, as Google's own INVALID_ARGUMENT messages do), before anything is translated or sent upstream.

Only what the translation reads is checked; unknown keys and part kinds pass (the API keeps growing)."""

from __future__ import annotations

from .validate import (
    ARRAY,
    BOOL,
    INT,
    NUM,
    OBJ,
    POS_INT,
    STR,
    STR_LIST,
    Fields,
    _type_name,
    check_fields,
    model_name_problem,
)

_ROLES = frozenset({"user", "model", "function"})
_PART: Fields = (("text", STR, False), ("thought", BOOL, False), ("thoughtSignature", STR, False),
                 ("inlineData", OBJ, False), ("fileData", OBJ, False), ("functionCall", OBJ, False),
                 ("functionResponse", OBJ, False))
_INLINE: Fields = (("mimeType", STR, True), ("data", STR, True))
_FILE: Fields = (("mimeType", STR, False), ("fileUri", STR, True))
_CALL: Fields = (("name", STR, True), ("args", OBJ, False), ("id", STR, False))
_RESPONSE: Fields = (("name", STR, True), ("response", OBJ, False), ("id", STR, False), ("parts", ARRAY, False))
_DECL: Fields = (("name", STR, True), ("description", STR, False), ("parameters", OBJ, False),
                 ("parametersJsonSchema", OBJ, False))
_TOOL: Fields = (("functionDeclarations", ARRAY, False),)
_FCC: Fields = (("mode", STR, False), ("allowedFunctionNames", STR_LIST, False))
_GEN: Fields = (("maxOutputTokens", POS_INT, False), ("temperature", NUM, False), ("topP", NUM, False),
                ("topK", NUM, False), ("stopSequences", STR_LIST, False), ("candidateCount", INT, False),
                ("seed", INT, False), ("presencePenalty", NUM, False), ("frequencyPenalty", NUM, False),
                ("thinkingConfig", OBJ, False), ("responseMimeType", STR, False),
                ("responseJsonSchema", OBJ, False), ("responseSchema", OBJ, False))
_THINKING: Fields = (("thinkingBudget", INT, False), ("includeThoughts", BOOL, False), ("thinkingLevel", STR, False))
_TOP: Fields = (("tools", ARRAY, False), ("toolConfig", OBJ, False), ("generationConfig", OBJ, False),
                ("cachedContent", STR, False))


def _object_problem(value: object, fields: Fields, where: str) -> str | None:
    """The problem with a value that must be an object with these fields."""
    if not isinstance(value, dict):
        return f"{where}: expected an object, got {_type_name(value)}"
    return check_fields(value, fields, f"{where}.")


def _part_problem(part: object, where: str, *, nested: bool = False) -> str | None:
    if not isinstance(part, dict):
        return f"{where}: expected a part object, got {_type_name(part)}"
    problem = check_fields(part, _PART, f"{where}.")
    if problem:
        return problem
    for key, fields in (("inlineData", _INLINE), ("fileData", _FILE), ("functionCall", _CALL),
                        ("functionResponse", _RESPONSE)):
        if part.get(key) is not None:  # null is absent, as in proto JSON
            problem = check_fields(part[key], fields, f"{where}.{key}.")
            if problem:
                return problem
    if part.get("functionResponse") is not None and not nested:
        for k, inner in enumerate(part["functionResponse"].get("parts") or ()):
            problem = _part_problem(inner, f"{where}.functionResponse.parts[{k}]", nested=True)
            if problem:
                return problem
    return None


def _content_problem(content: object, where: str) -> str | None:
    if not isinstance(content, dict):
        return f"{where}: expected a content object, got {_type_name(content)}"
    role = content.get("role")
    if role is not None and (not isinstance(role, str) or role not in _ROLES):
        return f"{where}.role: expected 'user' or 'model', got {role!r}"
    parts = content.get("parts")
    if parts is None:
        return f"{where}.parts: field required (an array of parts)"
    if not isinstance(parts, list):
        return f"{where}.parts: expected an array, got {_type_name(parts)}"
    for j, part in enumerate(parts):
        problem = _part_problem(part, f"{where}.parts[{j}]")
        if problem:
            return problem
    return None


def validate_gemini(body: object, model: str, *, count_tokens: bool = False) -> str | None:
    """The problem with a generateContent (or countTokens) body as "path: reason", or None."""
    if not isinstance(body, dict):
        return f"request body: expected a JSON object, got {_type_name(body)}"
    if not model:
        return "model: the path names no model (models/{model}:generateContent)"
    problem = model_name_problem(model)
    if problem:
        return problem
    contents = body.get("contents")
    if contents is None and not count_tokens:  # countTokens may count a system instruction or tools alone
        return "contents: field required (an array of contents)"
    if contents is not None and not isinstance(contents, list):
        return f"contents: expected an array, got {_type_name(contents)}"
    for i, content in enumerate(contents or ()):
        problem = _content_problem(content, f"contents[{i}]")
        if problem:
            return problem
    system = body.get("systemInstruction")
    if system is not None and not isinstance(system, str):
        problem = _content_problem(system, "systemInstruction")
        if problem:
            return problem
    problem = check_fields(body, _TOP, "")
    if problem:
        return problem
    for i, tool in enumerate(body.get("tools") or ()):
        problem = _object_problem(tool, _TOOL, f"tools[{i}]")
        if problem:
            return problem
        for k, decl in enumerate(tool.get("functionDeclarations") or ()):
            problem = _object_problem(decl, _DECL, f"tools[{i}].functionDeclarations[{k}]")
            if problem:
                return problem
            if not decl["name"]:
                return f"tools[{i}].functionDeclarations[{k}].name: expected a non-empty string"
    fcc = (body.get("toolConfig") or {}).get("functionCallingConfig")
    if fcc is not None:
        problem = _object_problem(fcc, _FCC, "toolConfig.functionCallingConfig")
        if problem:
            return problem
        mode = fcc.get("mode")
        if mode is not None and mode.upper() not in ("AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"):
            return f"toolConfig.functionCallingConfig.mode: expected AUTO, ANY, NONE or VALIDATED, got {mode!r}"
    gen = body.get("generationConfig") or {}
    problem = check_fields(gen, _GEN, "generationConfig.")
    if problem:
        return problem
    return check_fields(gen.get("thinkingConfig") or {}, _THINKING, "generationConfig.thinkingConfig.")
