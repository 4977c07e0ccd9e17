"""The fake Gemini upstream (tests/fakes/gemini_server.py) held to the shapes of Google's public API reference, so
that what the daemon is tested against is what the Gemini API sends. The shapes below are data written from:

- GenerateContentResponse, Candidate, Content, Part, UsageMetadata, FinishReason:
  https://ai.google.dev/api/generate-content#v1beta.GenerateContentResponse
  (promptTokenCount includes the cached content's tokens; thoughtsTokenCount counts thinking, outside
  candidatesTokenCount);
- streaming with `alt=sse`: https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent
  (SSE `data:` events, each a whole GenerateContentResponse; the last carries finishReason);
- Model and models.list: https://ai.google.dev/api/models#Model (`name` is "models/{model}");
- errors: https://ai.google.dev/gemini-api/docs/troubleshooting#error-codes and google.rpc.Status
  (`{"error": {"code", "message", "status", "details"}}`, RetryInfo's `retryDelay` a Duration such as "22s");
- thought signatures: https://ai.google.dev/gemini-api/docs/thought-signatures (a function call's signature on its
  part; a call sent back without it is refused with a 400 "Function call is missing a thought_signature").
"""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from tests.fakes.runner import FakeServer

# field -> type (a tuple: any of them), for the fields the reference documents; "*" marks the required ones.
RESPONSE = {"candidates*": list, "usageMetadata": dict, "modelVersion": str, "responseId": str,
            "promptFeedback": dict}
CANDIDATE = {"content": dict, "finishReason": str, "index": int, "safetyRatings": list, "tokenCount": int}
CONTENT = {"parts*": list, "role": str}
PART_DATA = ("text", "inlineData", "functionCall", "functionResponse", "fileData", "executableCode",
             "codeExecutionResult")  # Part's `data` oneof: exactly one
PART_META = {"thought": bool, "thoughtSignature": str}
FUNCTION_CALL = {"name*": str, "args": dict, "id": str}
USAGE = {"promptTokenCount": int, "cachedContentTokenCount": int, "candidatesTokenCount": int,
         "toolUsePromptTokenCount": int, "thoughtsTokenCount": int, "totalTokenCount": int,
         "promptTokensDetails": list, "cacheTokensDetails": list, "candidatesTokensDetails": list}
FINISH_REASONS = {"FINISH_REASON_UNSPECIFIED", "STOP", "MAX_TOKENS", "SAFETY", "RECITATION", "LANGUAGE", "OTHER",
                  "BLOCKLIST", "PROHIBITED_CONTENT", "SPII", "MALFORMED_FUNCTION_CALL", "IMAGE_SAFETY"}
ROLES = {"user", "model"}
MODEL = {"name*": str, "baseModelId": str, "version": str, "displayName": str, "description": str,
         "inputTokenLimit": int, "outputTokenLimit": int, "supportedGenerationMethods": list, "thinking": bool,
         "temperature": (int, float), "maxTemperature": (int, float), "topP": (int, float), "topK": int}
ERROR = {"code*": int, "message*": str, "status*": str, "details": list}
# HTTP status -> google.rpc.Code name, as the troubleshooting table lists them.
ERROR_STATUS = {400: {"INVALID_ARGUMENT", "FAILED_PRECONDITION"}, 403: {"PERMISSION_DENIED"}, 404: {"NOT_FOUND"},
                429: {"RESOURCE_EXHAUSTED"}, 500: {"INTERNAL"}, 503: {"UNAVAILABLE"}, 504: {"DEADLINE_EXCEEDED"}}
RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
DURATION = re.compile(r"^\d+(\.\d{1,9})?s$")
KEY = "AIza-contract"


def conforms(obj: object, shape: dict, where: str) -> None:
    assert isinstance(obj, dict), f"{where}: not an object"
    for field, kind in shape.items():
        name = field.rstrip("*")
        if field.endswith("*"):
            assert name in obj, f"{where}.{name}: required"
        if name in obj:
            assert isinstance(obj[name], kind) and not (kind is int and isinstance(obj[name], bool)), \
                f"{where}.{name}: {obj[name]!r} is not {kind}"
    known = {f.rstrip("*") for f in shape}
    assert set(obj) <= known, f"{where}: undocumented {set(obj) - known}"


def check_response(resp: object, where: str = "response") -> dict:
    conforms(resp, RESPONSE, where)
    assert isinstance(resp, dict)
    for i, cand in enumerate(resp["candidates"]):
        conforms(cand, CANDIDATE, f"{where}.candidates[{i}]")
        assert cand.get("finishReason", "STOP") in FINISH_REASONS
        conforms(cand["content"], CONTENT, f"{where}.candidates[{i}].content")
        assert cand["content"].get("role", "model") in ROLES
        for j, part in enumerate(cand["content"]["parts"]):
            data = [k for k in PART_DATA if k in part]
            assert len(data) == 1, f"part {j}: one data field, not {data}"
            assert set(part) - set(PART_DATA) <= set(PART_META), part
            for k, kind in PART_META.items():
                assert k not in part or isinstance(part[k], kind)
            if "functionCall" in part:
                conforms(part["functionCall"], FUNCTION_CALL, f"part {j}.functionCall")
    if "usageMetadata" in resp:
        u = resp["usageMetadata"]
        conforms(u, USAGE, f"{where}.usageMetadata")
        assert u["totalTokenCount"] == u["promptTokenCount"] + u.get("candidatesTokenCount", 0) + \
            u.get("thoughtsTokenCount", 0) + u.get("toolUsePromptTokenCount", 0)
        assert u.get("cachedContentTokenCount", 0) <= u["promptTokenCount"]  # the prompt's count includes them
    return resp


def check_error(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}
    conforms(body["error"], ERROR, "error")
    assert body["error"]["code"] == r.status_code and body["error"]["status"] in ERROR_STATUS[r.status_code]
    return body["error"]


def sse_events(r: httpx.Response) -> list[dict]:
    """The `data:` events of an alt=sse answer, each one JSON object; nothing else on the wire."""
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\r\n\r\n") if e]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [orjson.loads(e[len("data: "):]) for e in events]


@pytest.fixture(scope="module")
def fake():
    with FakeServer("gemini", name="contract", models=["gemini-2.5-flash"], api_key=KEY, cached_tokens=3) as f:
        yield f


def _post(fake, method: str, body: dict, *, behaviour: str = "ok", query: str = "",
          key: str | None = KEY) -> httpx.Response:
    headers = {"x-fake-behaviour": behaviour}
    if key is not None:
        headers["x-goog-api-key"] = key
    return httpx.post(f"{fake.url}/v1beta/models/gemini-2.5-flash:{method}{query}", json=body, headers=headers,
                      timeout=10)


PROMPT = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}],
          "tools": [{"functionDeclarations": [{"name": "Bash", "parametersJsonSchema": {"type": "object"}}]}]}


@pytest.mark.parametrize("behaviour", ["ok", "tools", "reasoning", "chunks;n=4"])
def test_whole_and_streamed_answers_have_the_documented_shape(fake, behaviour):
    body = {**PROMPT, "generationConfig": {"thinkingConfig": {"includeThoughts": True}}}
    whole = check_response(_post(fake, "generateContent", body, behaviour=behaviour).json())
    assert whole["candidates"][0]["finishReason"] == "STOP"
    events = sse_events(_post(fake, "streamGenerateContent", body, behaviour=behaviour, query="?alt=sse"))
    for i, e in enumerate(events):
        check_response(e, f"event {i}")
    assert [e["candidates"][0].get("finishReason") for e in events][-1] == "STOP"
    assert all("finishReason" not in e["candidates"][0] for e in events[:-1])
    counts = [e["usageMetadata"]["candidatesTokenCount"] for e in events]
    assert counts == sorted(counts)  # cumulative
    parts = [p for e in events for p in e["candidates"][0]["content"]["parts"]]
    assert [p for p in parts if not p.get("thought")] and whole["usageMetadata"] == events[-1]["usageMetadata"]
    if behaviour == "reasoning":
        assert whole["usageMetadata"]["thoughtsTokenCount"] > 0 and any(p.get("thought") for p in parts)
    if behaviour == "tools":
        calls = [p for p in parts if "functionCall" in p]
        assert calls and calls[0]["thoughtSignature"]  # the first call of a response carries it
    array = _post(fake, "streamGenerateContent", body, behaviour=behaviour).json()  # no alt=sse: a JSON array
    assert isinstance(array, list) and len(array) == len(events)


def test_a_call_sent_back_without_its_signature_is_refused(fake):
    calls = [p for p in _post(fake, "generateContent", PROMPT, behaviour="tools").json()["candidates"][0]["content"]
             ["parts"] if "functionCall" in p]
    answer = {"role": "user", "parts": [{"functionResponse": {"name": "Bash", "response": {"output": "ok"}}}]}
    signed = {**PROMPT, "contents": [*PROMPT["contents"], {"role": "model", "parts": calls}, answer]}
    assert _post(fake, "generateContent", signed).status_code == 200
    unsigned = [{"functionCall": p["functionCall"]} for p in calls]
    r = _post(fake, "generateContent", {**PROMPT, "contents": [*PROMPT["contents"],
                                                               {"role": "model", "parts": unsigned}, answer]})
    assert r.status_code == 400 and "missing a thought_signature" in check_error(r)["message"]
    forged = [{**calls[0], "thoughtSignature": "Zm9yZ2Vk"}]
    r = _post(fake, "generateContent", {**PROMPT, "contents": [*PROMPT["contents"],
                                                               {"role": "model", "parts": forged}, answer]})
    assert r.status_code == 400
    skipped = [{**calls[0], "thoughtSignature": "skip_thought_signature_validator"}]
    assert _post(fake, "generateContent", {**PROMPT, "contents": [*PROMPT["contents"], {"role": "model", "parts":
                                                                  skipped}, answer]}).status_code == 200


@pytest.mark.parametrize(("behaviour", "status"), [("429;retry_after=22", 429), ("500", 500), ("529", 503),
                                                   ("400", 400), ("overflow;max=1000", 400), ("404_model", 404)])
def test_errors_have_googles_shape(fake, behaviour, status):
    r = _post(fake, "generateContent", PROMPT, behaviour=behaviour)
    assert r.status_code == status
    err = check_error(r)
    if status == 429:
        retry = [d for d in err["details"] if d.get("@type") == RETRY_INFO]
        assert len(retry) == 1 and DURATION.match(retry[0]["retryDelay"]) and retry[0]["retryDelay"] == "22s"
    if behaviour.startswith("overflow"):
        assert re.search(r"input token count \(\d+\) exceeds the maximum number of tokens allowed \(1000\)",
                         err["message"])


def test_keys_are_checked_as_google_checks_them(fake):
    assert check_error(_post(fake, "generateContent", PROMPT, key=None))["status"] == "PERMISSION_DENIED"
    assert check_error(_post(fake, "generateContent", PROMPT, key="wrong"))["status"] == "INVALID_ARGUMENT"


def test_models_list_and_get(fake):
    h = {"x-goog-api-key": KEY}
    listed = httpx.get(f"{fake.url}/v1beta/models", headers=h, timeout=10).json()
    assert set(listed) <= {"models", "nextPageToken"}
    for m in listed["models"]:
        conforms(m, MODEL, "model")
        assert m["name"].startswith("models/")
    one = httpx.get(f"{fake.url}/v1beta/models/gemini-2.5-flash", headers=h, timeout=10).json()
    conforms(one, MODEL, "model")
    assert one["name"] == "models/gemini-2.5-flash" and one["inputTokenLimit"] > 0


def test_stream_failures_on_demand(fake):
    cut = sse_events(_post(fake, "streamGenerateContent", PROMPT, behaviour="cut_mid_block", query="?alt=sse"))
    assert cut and all("finishReason" not in e["candidates"][0] for e in cut)
    failed = _post(fake, "streamGenerateContent", PROMPT, behaviour="error_mid_stream", query="?alt=sse")
    last = orjson.loads(failed.text.strip().split("\r\n\r\n")[-1][len("data: "):])
    conforms(last["error"], ERROR, "error")
    with pytest.raises(httpx.HTTPError):
        _post(fake, "streamGenerateContent", PROMPT, behaviour="disconnect_mid_stream", query="?alt=sse").read()
