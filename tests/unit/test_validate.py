"""The edge validator: every shape the translators rely on is checked first, naming the field."""

from __future__ import annotations

import copy
import json

import orjson
import pytest

from bench.claude_body import claude_code_body
from coderouterd.ingress.validate import MAX_DEPTH, MAX_MODEL_NAME_CHARS, validate_anthropic, validate_openai
from coderouterd.ingress.validate_responses import validate_responses
from coderouterd.translate.anthropic_request_to_openai import request_to_openai
from coderouterd.translate.openai_request_to_anthropic import openai_request_to_anthropic

A_OK = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
O_OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _with(base: dict, **kw) -> dict:
    b = copy.deepcopy(base)
    b.update(kw)
    return b


def _nest(depth: int):
    v: dict = {}
    for _ in range(depth - 1):
        v = {"a": v}
    return v


def test_real_bodies_pass():
    assert validate_anthropic(claude_code_body()) is None
    assert validate_anthropic(claude_code_body(), count_tokens=True) is None
    oa, _ = request_to_openai(claude_code_body(), "m", stream=True)
    assert validate_openai(oa) is None


@pytest.mark.parametrize("body,expected", [
    (None, "request body: expected a JSON object, got null"),
    (_with(A_OK, messages=[{"role": ["user"], "content": "x"}]), "messages[0].role: expected 'user' or 'assistant'"),
    (_with(A_OK, messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}]),
     "messages[0].content[0].text: expected a string, got integer"),
    (_with(A_OK, messages=[{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": [{"type": "text", "text": "ok"}, {"type": "text"}]}]),
     "messages[2].content[1].text: field required"),
    (_with(A_OK, system=[{"type": "text", "text": ["x"]}]), "system[0].text: expected a string, got array"),
    (_with(A_OK, system=[{"type": "image"}]), "system[0].type: expected 'text'"),
    (_with(A_OK, messages=[{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 7}]}]),
     "messages[0].content[0].content: expected a string or an array of content blocks, got integer"),
    (_with(A_OK, messages=[{"role": "user", "content": [{"type": "image", "source": 3}]}]),
     "messages[0].content[0].source: expected an object, got integer"),
    (_with(A_OK, messages=[{"role": "user", "content": [{"type": "image", "source": {"type": "base64"}}]}]),
     "messages[0].content[0].source.data: field required"),
    (_with(A_OK, messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "n",
                                                               "input": "x"}]}]),
     "messages[0].content[0].input: expected an object, got string"),
    (_with(A_OK, temperature="hot"), "temperature: expected a number, got string"),
    (_with(A_OK, top_k=1.5), "top_k: expected an integer, got number"),
    (_with(A_OK, stop_sequences=["a", 1]), "stop_sequences: expected an array of strings"),
    (_with(A_OK, tools=[{"name": "t", "input_schema": "x"}]), "tools[0].input_schema: expected an object"),
    (_with(A_OK, tools=[{"input_schema": {}}]), "tools[0].name: field required"),
    (_with(A_OK, tool_choice={"type": 1}), "tool_choice.type: expected a string"),
    (_with(A_OK, thinking="on"), "thinking: expected an object, got string"),
    (_with(A_OK, output_config={"format": {"type": "json_schema", "schema": 1}}),
     "output_config.format.schema: expected an object"),
    (_with(A_OK, max_tokens=True), "max_tokens: expected a positive integer, got boolean"),
])
def test_anthropic_problems_name_the_field(body, expected):
    problem = validate_anthropic(body)
    assert problem is not None and problem.startswith(expected), problem


@pytest.mark.parametrize("body,expected", [
    (None, "request body: expected a JSON object, got null"),
    (_with(O_OK, messages=[{"role": ["user"]}]), "messages[0].role: invalid role array"),
    (_with(O_OK, stream_options="x"), "stream_options: expected an object, got string"),
    (_with(O_OK, temperature="hot"), "temperature: expected a number, got string"),
    (_with(O_OK, messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]),
     "messages[0].content[0].text: expected a string"),
    (_with(O_OK, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 1}}]}]),
     "messages[0].content[0].image_url.url: expected a string"),
    (_with(O_OK, messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]),
     "messages[0].tool_calls[0].function.arguments: expected a string, got object"),
    (_with(O_OK, messages=[{"role": "assistant", "tool_calls": [{"id": "x"}]}]),
     "messages[0].tool_calls[0].function: field required"),
    (_with(O_OK, tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
     "tools[0].function.parameters: expected an object"),
    (_with(O_OK, tool_choice={"type": "function", "function": "f"}), "tool_choice.function.name"),
    (_with(O_OK, response_format={"type": "json_schema", "json_schema": {"schema": "x"}}),
     "response_format.json_schema.schema: expected an object"),
    (_with(O_OK, stop=[1]), "stop: expected a string or an array of strings"),
    (_with(O_OK, max_completion_tokens=0), "max_completion_tokens: expected a positive integer"),
])
def test_openai_problems_name_the_field(body, expected):
    problem = validate_openai(body)
    assert problem is not None and problem.startswith(expected), problem


def test_deep_nesting_is_refused_before_translation():
    ok = _with(A_OK, tools=[{"name": "t", "input_schema": _nest(MAX_DEPTH - 4)}])
    assert validate_anthropic(ok, raw=orjson.dumps(ok)) is None
    # What passes must survive translation and serialisation both ways.
    orjson.dumps(request_to_openai(ok, "m", stream=False)[0])
    deep = _with(A_OK, tools=[{"name": "t", "input_schema": _nest(300)}])
    assert validate_anthropic(deep, raw=json.dumps(deep).encode()) == f"request body: nested deeper than {MAX_DEPTH} levels"
    odeep = _with(O_OK, metadata=_nest(260))
    assert "nested deeper" in validate_openai(odeep, raw=json.dumps(odeep).encode())
    # Tool-call arguments are parsed back into objects for an Anthropic upstream: bounded as well.
    args = json.dumps(_nest(400))
    body = _with(O_OK, messages=[{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": args}}]}])
    assert validate_openai(body) == f"messages[0].tool_calls[0].function.arguments: nested deeper than {MAX_DEPTH} levels"
    fine = _with(O_OK, tools=[{"type": "function", "function": {"name": "f", "parameters": _nest(MAX_DEPTH - 4)}}])
    assert validate_openai(fine) is None
    orjson.dumps(openai_request_to_anthropic(fine, "m"))


def test_model_names_are_capped_on_every_ingress():
    """A client's model name is kept in tables, the journal and labels: over the cap it is a 400 naming it."""
    ok, long = "m" * MAX_MODEL_NAME_CHARS, "m" * (MAX_MODEL_NAME_CHARS + 1)
    expected = f"model: longer than {MAX_MODEL_NAME_CHARS} characters ({MAX_MODEL_NAME_CHARS + 1})"
    assert validate_anthropic(_with(A_OK, model=ok)) is None
    assert validate_anthropic(_with(A_OK, model=long)) == expected
    assert validate_anthropic(_with(A_OK, model=long), count_tokens=True) == expected
    assert validate_openai(_with(O_OK, model=ok)) is None
    assert validate_openai(_with(O_OK, model=long)) == expected
    assert validate_responses({"model": ok, "input": "hi"}) is None
    assert validate_responses({"model": long, "input": "hi"}) == expected
