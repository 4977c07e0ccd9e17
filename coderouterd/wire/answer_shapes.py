"""The shape of each protocol's answer, as its clients read it: one description per protocol, for the answer
as a whole and for each event of its stream (the language is in wire/shapes.py).

What is described is what a client relies on (issue 34, item 4): the fields it reads, with their types, and
which of them must be there. Everything else passes, so servers that add fields (llama.cpp's `timings`,
Ollama's `reasoning`, Anthropic's `cache_creation`) keep working. A same-wire answer that does not fit is no
answer: it counts as the upstream's failure and the request fails over (providers/upstream_answer.py). The property
test (tests/unit/test_answer_shapes.py) generates wrong shapes from these same descriptions.
"""

from __future__ import annotations

from .shapes import Const, Many, Tagged, checker, event_checker

# -- OpenAI chat completions --------------------------------------------------------------------------------

CHAT_USAGE = {"prompt_tokens?": int, "completion_tokens?": int, "total_tokens?": int,
              "prompt_tokens_details?": dict, "completion_tokens_details?": dict}
_TEXT_FIELDS = {"role?": str, "content?": str, "reasoning_content?": str, "reasoning?": str, "refusal?": str}

CHAT_COMPLETION = {
    "choices": Many({
        "index?": int,
        "message": {**_TEXT_FIELDS,
                    "tool_calls?": Many({"id": str, "type?": str, "function": {"name": str, "arguments": str}})},
        "finish_reason?": str,
    }, min=1),
    "usage?": CHAT_USAGE,
}

# A chunk's tool call comes in fragments: the id and name with the first, arguments in pieces after.
CHAT_CHUNK = {
    "choices?": Many({
        "index?": int,
        "delta?": {**_TEXT_FIELDS,
                   "tool_calls?": Many({"index?": int, "id?": str, "type?": str,
                                        "function?": {"name?": str, "arguments?": str}})},
        "finish_reason?": str,
    }),
    "usage?": CHAT_USAGE,
}

# -- Anthropic Messages -------------------------------------------------------------------------------------

MESSAGES_USAGE = {"input_tokens?": int, "output_tokens?": int, "cache_creation_input_tokens?": int,
                  "cache_read_input_tokens?": int}
MESSAGES_BLOCK = Tagged("type", {
    "text": {"text": str},
    "tool_use": {"id": str, "name": str, "input": dict},
    "server_tool_use": {"id": str, "name": str, "input": dict},
    "thinking": {"thinking": str, "signature?": str},
    "redacted_thinking": {"data": str},
})
MESSAGE = {"type": Const("message"), "role?": str, "content": Many(MESSAGES_BLOCK), "stop_reason?": str,
           "usage?": MESSAGES_USAGE}

MESSAGES_EVENTS = {
    "message_start": {"message": {"role?": str, "content?": Many(MESSAGES_BLOCK), "usage?": MESSAGES_USAGE}},
    "content_block_start": {"index": int, "content_block": MESSAGES_BLOCK},
    "content_block_delta": {"index": int, "delta": Tagged("type", {
        "text_delta": {"text": str},
        "input_json_delta": {"partial_json": str},
        "thinking_delta": {"thinking": str},
        "signature_delta": {"signature": str},
    })},
    "content_block_stop": {"index": int},
    "message_delta": {"delta": {"stop_reason?": str, "stop_sequence?": str}, "usage?": MESSAGES_USAGE},
}

# -- OpenAI Responses (forwarded from an upstream that serves it) ---------------------------------------------

RESPONSES_USAGE = {"input_tokens?": int, "output_tokens?": int, "total_tokens?": int,
                   "input_tokens_details?": dict, "output_tokens_details?": dict}
RESPONSES_ITEM = Tagged("type", {
    "message": {"content": Many(Tagged("type", {"output_text": {"text": str}, "refusal": {"refusal": str}}))},
    "function_call": {"call_id": str, "name": str, "arguments": str},
    "reasoning": {"summary?": Many(Tagged("type", {"summary_text": {"text": str}}))},
})
RESPONSE = {"output": Many(RESPONSES_ITEM), "status?": str, "usage?": RESPONSES_USAGE}

RESPONSES_EVENTS = {
    "response.created": {"response": dict},
    "response.in_progress": {"response": dict},
    "response.completed": {"response": RESPONSE},
    "response.incomplete": {"response": RESPONSE},
    "response.failed": {"response": dict},
    "response.output_item.added": {"output_index?": int, "item": RESPONSES_ITEM},
    "response.output_item.done": {"output_index?": int, "item": RESPONSES_ITEM},
    "response.content_part.added": {"part": dict},
    "response.content_part.done": {"part": dict},
    "response.output_text.delta": {"delta": str},
    "response.output_text.done": {"text": str},
    "response.function_call_arguments.delta": {"delta": str},
    "response.function_call_arguments.done": {"arguments": str},
    "response.reasoning_summary_text.delta": {"delta": str},
    "response.reasoning_summary_text.done": {"text": str},
}

# -- the checks, compiled once ------------------------------------------------------------------------------

check_chat_completion = checker(CHAT_COMPLETION, "a chat completion")
check_chat_chunk = checker(CHAT_CHUNK, "a chat completion chunk")
check_message = checker(MESSAGE, "a message")
check_messages_event = event_checker(MESSAGES_EVENTS, "a Messages stream event")
check_response = checker(RESPONSE, "a response")
check_responses_event = event_checker(RESPONSES_EVENTS, "a Responses stream event")
