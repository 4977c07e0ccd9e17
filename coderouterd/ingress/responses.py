"""The Responses API ingress (POST /v1/responses, what Codex CLI speaks): validation, translation to the
canonical chat body, and a responder that writes Responses-shaped prologues and stream failures.

Everything protocol-specific is in translate/responses_*.py; this module only wires it to the HTTP side."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..translate.responses_request import ResponsesRequest, ResponsesRequestError, translate_request
from ..translate.responses_stream import encode, failed_event, prologue
from ..wire.sse import encode_data
from .errors import openai_type, responses_failed_code, status_of_kind
from .responder import Responder
from .validate_responses import validate_responses

if TYPE_CHECKING:
    from .asgi import Send

_SEQ_KEY = b'"sequence_number":'


class ResponsesResponder(Responder):
    """A Responder for Responses clients. Errors before the stream are OpenAI-shaped (the base class); after
    the stream began they are a `response.failed` numbered after the last event actually sent."""

    def __init__(self, send: Send, request_id: str) -> None:
        super().__init__(send, "responses", request_id)
        self.rq: ResponsesRequest | None = None
        self.model = ""
        self.last_seq = -1

    async def event(self, data: bytes) -> None:
        if data:
            # Where the numbering stands, read from what leaves (a fallback's provider continues after it).
            at = data.rfind(_SEQ_KEY)
            if at >= 0:
                start = at + len(_SEQ_KEY)
                end = start
                while end < len(data) and data[end:end + 1].isdigit():
                    end += 1
                if end > start:
                    self.last_seq = int(data[start:end])
            await self._body(data, True)

    def prologue(self, model: str, message_id: str, input_tokens: int) -> bytes:
        if self.rq is None:
            return b""
        self.last_seq = 1
        return b"".join(encode(e) for e in prologue(self.rq, self.rq.body.get("model") or model))

    async def stream_error(self, error_type: str, message: str, *, code: str | None = None,
                           status: int | None = None) -> None:
        status = status or status_of_kind(error_type)
        if self.rq is None:
            etype, ecode = openai_type(status, error_type, code)
            data = encode_data({"error": {"message": message, "type": etype, "param": None, "code": ecode}})
        else:
            failed = responses_failed_code(status, error_type, code)
            data = encode(failed_event(self.rq, self.rq.body.get("model") or "", self.last_seq + 1, failed, message))
        await self._body(data, False)


def admit_responses(body: Any) -> tuple[ResponsesRequest | None, str | None, str | None]:
    """(translated request, None, None), or (None, problem, param) for a 400 naming the field. `body`: any JSON
    value (Any: validate_responses makes it the dict translate_request reads, without a second check)."""
    problem = validate_responses(body)
    if problem:
        return None, problem, problem.split(":")[0]
    try:
        return translate_request(body), None, None
    except ResponsesRequestError as e:
        return None, e.message, e.param
