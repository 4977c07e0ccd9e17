"""Each ingress answers every error coderouterd makes itself in its own API's vocabulary, as docs/protocols.md
("Errors coderouterd sends") tabulates it: this walks those tables, case by case, through the real makers
(routing/replies.py, the key gate, the guards' call sites) and the real responders. An OpenAI client once got
Anthropic's `overloaded_error`; a case added to the code but not to the tables fails here too."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import orjson
import pytest

from coderouterd.ingress.gemini import GeminiResponder
from coderouterd.ingress.guard import error_body
from coderouterd.ingress.responder import Responder
from coderouterd.ingress.responses import ResponsesResponder, admit_responses
from tests.support.error_cases import CASES, EDGE_CASES, EDGE_PATHS, INGRESSES, MID_STREAM

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocols.md"
HEADINGS = {"anthropic": "### Anthropic", "openai": "### OpenAI Chat", "responses": "### OpenAI Responses",
            "gemini": "### Gemini"}
# Each wire's own words: nothing else may appear in its column.
VOCABULARY = {
    "anthropic": {"invalid_request_error", "authentication_error", "billing_error", "permission_error",
                  "not_found_error", "request_too_large", "rate_limit_error", "api_error", "overloaded_error",
                  "timeout_error"},
    "openai": {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
               "rate_limit_exceeded", "insufficient_quota", "server_error"},
    "gemini": {"INVALID_ARGUMENT", "FAILED_PRECONDITION", "UNAUTHENTICATED", "PERMISSION_DENIED", "NOT_FOUND",
               "RESOURCE_EXHAUSTED", "UNAVAILABLE", "INTERNAL", "DEADLINE_EXCEEDED", "UNIMPLEMENTED"},
}
VOCABULARY["responses"] = VOCABULARY["openai"]
FAILED_CODES = {"server_error", "server_is_overloaded", "rate_limit_exceeded", "invalid_prompt",
                "context_length_exceeded", "insufficient_quota"}


def _cell(text: str) -> str | None:
    text = text.strip().strip("`")
    return None if text in ("—", "") else text


def tables() -> dict[str, tuple[dict[str, list[str]], dict[str, list[str]]]]:
    """ingress -> (its error table, its mid-stream table), each case -> the row's other cells."""
    doc = DOC.read_text()
    section = doc[doc.index("## Errors coderouterd sends"):]
    out = {}
    for ingress, heading in HEADINGS.items():
        part = section[section.index(heading):]
        nxt = part.find("\n### ", 4)
        part = part if nxt < 0 else part[:nxt]
        found: list[dict[str, list[str]]] = []
        rows: dict[str, list[str]] = {}
        for line in part.splitlines():
            if line.startswith("|") and not re.match(r"\|\s*(Case|-)", line):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                rows[cells[0]] = cells[1:]
            elif rows and not line.startswith("|"):
                found.append(rows)
                rows = {}
        if rows:
            found.append(rows)
        out[ingress] = (found[0], found[1])
    return out


def _responder(ingress: str, sent: list) -> Responder:
    async def send(message: dict) -> None:
        sent.append(message)

    if ingress == "responses":
        return ResponsesResponder(send, "req_1")
    if ingress == "gemini":
        return GeminiResponder(send, "req_1")
    return Responder(send, ingress, "req_1")


async def answer(ingress: str, case: str) -> tuple[int, str, str | None, dict[str, str]]:
    """(HTTP status, type or Gemini status, code or ErrorInfo reason, headers) of a case as the client gets it."""
    status, kind, code, headers = CASES[case](ingress)
    sent: list = []
    await _responder(ingress, sent).error(status, "m", kind=kind, code=code, headers=headers)
    hs = {k.decode(): v.decode() for k, v in sent[0]["headers"]}
    err = orjson.loads(sent[1]["body"])["error"]
    if ingress == "gemini":
        return sent[0]["status"], err["status"], (err.get("details") or [{}])[0].get("reason"), hs
    return sent[0]["status"], err["type"], err.get("code"), hs


async def mid_stream(ingress: str, case: str) -> tuple[str, str | None]:
    """What the client reads when the error comes after its 200: (type, code), or Responses' failed code, or
    Gemini's status."""
    status, kind = MID_STREAM[case]
    sent: list = []
    r = _responder(ingress, sent)
    if isinstance(r, ResponsesResponder):
        r.rq = admit_responses({"model": "m", "input": "hi", "stream": True})[0]
    await r.start_stream({})
    await r.error(status, "m", kind=kind)
    data = sent[-1]["body"].decode()
    if ingress == "anthropic":
        return orjson.loads(data.split("data: ", 1)[1].split("\n", 1)[0])["error"]["type"], None
    if ingress == "responses":
        return orjson.loads(data.split("data: ", 1)[1].split("\n", 1)[0])["response"]["error"]["code"], None
    if ingress == "gemini":
        return orjson.loads(data)["error"]["status"], None
    err = orjson.loads(data.split("data: ", 1)[1].split("\n", 1)[0])["error"]
    return err["type"], err["code"]


def edge(ingress: str, case: str) -> tuple[int, str, str | None]:
    status, anthropic_type, chat_type = EDGE_CASES[case]
    path = EDGE_PATHS[ingress]
    err = orjson.loads(error_body(path, status, "m", chat_type if path.startswith("/v1/chat") else
                                  anthropic_type))["error"]
    return (status, err["status"], None) if ingress == "gemini" else (status, err["type"], err.get("code"))


def _expected_headers(cell: str) -> tuple[bool, bool]:
    return "Retry-After" in cell, "x-should-retry: false" in cell


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("ingress", INGRESSES)
def test_every_error_is_in_the_callers_vocabulary_as_the_table_says(ingress, case):
    rows, _mid = tables()[ingress]
    assert case in rows, f"{case!r} is sent on the {ingress} ingress but missing from docs/protocols.md"
    http, etype, code, headers = rows[case]
    got_status, got_type, got_code, got_headers = asyncio.run(answer(ingress, case))
    assert (got_status, got_type, got_code) == (int(http), _cell(etype), _cell(code))
    assert got_type in VOCABULARY[ingress]
    retry, no_retry = _expected_headers(headers)
    assert ("retry-after" in got_headers) == retry
    assert (got_headers.get("x-should-retry") == "false") == no_retry
    if retry:
        assert got_headers["retry-after"].isdigit() and int(got_headers["retry-after"]) >= 1  # whole seconds
    if got_status in (429, 503, 529) and not retry:
        # A "try again later" without a time is only for a cause nobody can time (every provider busy).
        assert case == "every provider busy"


@pytest.mark.parametrize("case", list(EDGE_CASES))
@pytest.mark.parametrize("ingress", INGRESSES)
def test_edge_errors_as_the_table_says(ingress, case):
    rows, _mid = tables()[ingress]
    http, etype, code, _headers = rows[case]
    got = edge(ingress, case)
    assert got == (int(http), _cell(etype), _cell(code))
    assert got[1] in VOCABULARY[ingress]


@pytest.mark.parametrize("case", list(MID_STREAM))
@pytest.mark.parametrize("ingress", INGRESSES)
def test_errors_after_the_stream_began_as_the_table_says(ingress, case):
    _rows, mid = tables()[ingress]
    want = mid[case]
    got_type, got_code = asyncio.run(mid_stream(ingress, case))
    assert got_type == _cell(want[0])
    if ingress == "openai":
        assert got_code == _cell(want[1])
    if ingress == "responses":
        assert got_type in FAILED_CODES
    else:
        assert got_type in VOCABULARY[ingress]


def test_the_tables_name_no_case_the_code_does_not_make():
    for ingress, (rows, mid) in tables().items():
        assert set(rows) == set(CASES) | set(EDGE_CASES), ingress
        assert set(mid) == set(MID_STREAM), ingress
