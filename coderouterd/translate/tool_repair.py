"""Tool calls that a local model wrote as text, turned back into real tool calls while the text streams.

The repairer is a pure state machine over the text deltas of one answer; it knows no wire format. Adapters
(``tool_repair_wire``) apply it to an upstream's OpenAI chunks or Anthropic events, so every ingress (and any
translator that consumes those) sees real tool calls.

Rules (see docs/decisions.md, "tool-call repair: the hold-back rule"):

- Markup is only recognised at the start of a line, outside fenced code blocks. Text is released as soon as
  the line's first characters cannot begin an opening tag; what is held is at most the longest opening tag
  (plus the line break and indentation in front of it).
- A bare JSON object or a fenced ```json block is a call only when it is the whole answer.
- A captured call becomes a call only if its name is a tool offered in this request, its arguments parse as
  JSON (near-JSON accepted through ``json5``) and carry the tool's required properties, and nothing but
  whitespace or further calls follows it. Anything else is released unchanged, as text.
- Calls are therefore emitted at the end of the answer (``finish``); the text before them streams.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from .tool_call_formats import (  # noqa: F401 (re-exported: the repair's public vocabulary)
    RepairedCall,
    ToolSpec,
    json_end,
    loads_near_json,
    offered_tools,
    parse_capture,
    repair_tools_for,
)

# Opening markers recognised at the start of a line, and the format each one starts.
OPENERS: dict[str, str] = {
    "<tool_call>": "hermes",
    "<function=": "function",
    "[TOOL_CALLS]": "mistral",
    "<|python_tag|>": "python_tag",
}
FENCE = "```"
_LONGEST_HEAD = max(len(o) for o in OPENERS)
# A call larger than this is not held any longer: it is released as text (bounds memory on a runaway answer).
MAX_CAPTURE_CHARS = 512 * 1024
_MAX_WS = 256
# End-of-turn tokens some servers leave in the text after a call; they are not prose.
_END_TOKENS = ("<|eom_id|>", "<|eot_id|>", "<|im_end|>", "</s>", "<|end|>")

_NAME = re.compile(r"[A-Za-z0-9_.:-]*")
_JSON_FENCE_INFO = ("", "json", "json5")


def _not_a_json_fence(buf: str) -> bool:
    """True as soon as a fence that opens the answer cannot hold a JSON call: another language, or a first
    character that does not open an object."""
    nl = buf.find("\n")
    if nl < 0:
        info = buf[len(FENCE):]
        return len(info) > 8 or bool(info.strip()) and not any(i.startswith(info.strip().lower())
                                                                 for i in _JSON_FENCE_INFO if i)
    if buf[len(FENCE):nl].strip().lower() not in _JSON_FENCE_INFO:
        return True
    body = buf[nl + 1:].lstrip()
    return bool(body) and body[0] != "{"


def calls_in_text(text: str, tools: Mapping[str, ToolSpec]) -> list[RepairedCall]:
    """The calls a whole answer's text holds, as the streaming repairer would find them."""
    repairer = ToolCallRepairer(tools)
    repairer.feed(text)
    return repairer.finish()[1]


# --- the streaming state machine -----------------------------------------------------------------------

_SCAN, _CAPTURE = 0, 1


class ToolCallRepairer:
    """Feed text deltas, get back the text to release now; ``finish()`` gives the rest and the calls.

    Cost on plain prose is one ``str.find`` per line plus a few comparisons at each line start.
    """

    __slots__ = ("tools", "_mode", "_line_start", "_in_fence", "_head", "_ws", "_said", "_fmt", "_buf",
                 "_calls", "_calls_raw", "_after", "repaired", "formats")

    def __init__(self, tools: Mapping[str, ToolSpec]) -> None:
        self.tools = tools
        self._mode = _SCAN
        self._line_start = True
        self._in_fence = False
        self._head = ""  # first characters of the current line, held while they may open a marker
        self._ws = ""  # whitespace held in front of a possible marker (a call must not leave a blank text)
        self._said = False  # any non-whitespace text released: a bare JSON answer is no longer possible
        self._fmt = ""
        self._buf = ""
        self._calls: list[RepairedCall] = []
        self._calls_raw = ""  # the markup of accepted calls, released as text if prose follows them
        self._after = ""  # what followed the accepted calls so far (whitespace, end tokens)
        self.repaired = 0
        self.formats: list[str] = []

    # -- public --------------------------------------------------------------------------------------------

    def feed(self, text: str) -> str:
        out: list[str] = []
        self._feed(text, out)
        return "".join(out)

    def finish(self) -> tuple[str, list[RepairedCall]]:
        out: list[str] = []
        if self._mode == _CAPTURE:
            # The answer ended inside a marker: a call only if what was captured is already complete.
            fmt, buf = self._fmt, self._buf
            self._mode, self._buf = _SCAN, ""
            end = self._capture_end(fmt, buf)
            calls = parse_capture(fmt, buf[:end], self.tools) if end > 0 and not buf[end:].strip() else None
            if end < 0 and fmt == "hermes":
                # Some servers cut the closing tag with the end-of-turn token; the JSON itself must be whole.
                calls = parse_capture(fmt, buf + "</tool_call>", self.tools)
                end = len(buf)
            if calls:
                self._accept(calls, buf[:end])
            else:
                self._release(out, buf)
        if self._head:
            self._release(out, self._head)
        calls = self._calls
        if calls and self._after_is_clean():
            self.repaired += len(calls)
            self.formats.extend(c.format for c in calls)
            self._calls = []
            return "".join(out), calls
        if calls:  # prose followed the calls: they were text after all
            out.insert(0, self._calls_raw + self._after)
            self._calls = []
        if self._ws:
            out.append(self._ws)
            self._ws = ""
        return "".join(out), []

    # -- scanning ------------------------------------------------------------------------------------------

    def _feed(self, text: str, out: list[str]) -> None:
        i, n = 0, len(text)
        while i < n:
            if self._mode == _CAPTURE:
                self._buf += text[i:]
                self._advance_capture(out)
                return
            if not self._line_start:
                j = text.find("\n", i)
                if j < 0:
                    self._emit(out, text[i:])
                    return
                self._emit(out, text[i:j])
                self._ws += "\n"  # held: a marker may start the next line
                self._line_start = True
                i = j + 1
                continue
            ch = text[i]
            if not self._head and ch in " \t\r\n":
                self._ws += ch
                i += 1
                if len(self._ws) > _MAX_WS and not self._calls:
                    # A run of blank lines this long is not leading up to a marker worth waiting for.
                    self._emit_ws(out)
                continue
            self._head += ch
            i += 1
            if len(self._head) == 1 and self._said and self._indented():
                self._release_head(out)  # an indented code block inside prose: an example, not a call
                continue
            self._classify_head(out)

    def _indented(self) -> bool:
        indent = self._ws[self._ws.rfind("\n") + 1:]
        return "\t" in indent or len(indent) >= 4

    def _classify_head(self, out: list[str]) -> None:
        head = self._head
        if self._in_fence:
            if FENCE.startswith(head) and len(head) < len(FENCE):
                return
            if head.startswith(FENCE):
                self._in_fence = False
            self._release_head(out)
            return
        for opener, fmt in OPENERS.items():
            if head.startswith(opener):
                self._start_capture(fmt)
                return
        if not self._said and not self._calls and head[0] == "{":
            self._start_capture("bare")
            return
        if head.startswith(FENCE):
            if not self._said and not self._calls:
                self._start_capture("fenced")
                return
            self._in_fence = True
            self._release_head(out)
            return
        if len(head) < _LONGEST_HEAD and (any(o.startswith(head) for o in OPENERS) or FENCE.startswith(head)):
            return  # still a possible marker: hold
        self._release_head(out)

    def _emit_ws(self, out: list[str]) -> None:
        out.append(self._ws)
        self._ws = ""

    def _release_head(self, out: list[str]) -> None:
        head, self._head = self._head, ""
        self._line_start = False
        self._emit(out, head)

    def _emit(self, out: list[str], text: str) -> None:
        if not text:
            return
        if self._calls:
            # Text after accepted calls: end tokens and whitespace are allowed; prose makes them text again.
            self._after += self._ws + text
            self._ws = ""
            if self._after_is_prose():
                out.append(self._calls_raw + self._after)
                self._calls, self._calls_raw, self._after = [], "", ""
                self._said = True
            return
        if self._ws:
            out.append(self._ws)
            self._ws = ""
        out.append(text)
        if not self._said and text.strip():
            self._said = True

    def _release(self, out: list[str], text: str) -> None:
        """Captured or held text that turned out not to be a call: out as it came, scanning resumes after."""
        self._head = ""
        self._line_start = False
        self._emit(out, text)

    # -- capturing -----------------------------------------------------------------------------------------

    def _start_capture(self, fmt: str) -> None:
        self._mode = _CAPTURE
        self._fmt = fmt
        self._buf = self._head
        self._head = ""
        self._line_start = False

    def _advance_capture(self, out: list[str]) -> None:
        fmt, buf = self._fmt, self._buf
        if fmt == "fenced" and _not_a_json_fence(buf):
            # An answer that opens with code, not with a call: stream it as the code block it is.
            self._mode, self._buf = _SCAN, ""
            self._said = True
            self._line_start = True
            self._feed(buf, out)
            return
        end = self._capture_end(fmt, buf)
        if end < 0:
            if len(buf) > MAX_CAPTURE_CHARS:
                self._mode, self._buf = _SCAN, ""
                self._release(out, buf)
            return
        self._mode, self._buf = _SCAN, ""
        calls = parse_capture(fmt, buf[:end], self.tools)
        rest = buf[end:]
        if calls:
            self._accept(calls, buf[:end])
            self._line_start = True  # another marker may follow directly
        else:
            self._release(out, buf[:end])
        self._feed(rest, out)

    def _accept(self, calls: list[RepairedCall], raw: str) -> None:
        self._calls_raw += self._after + self._ws + raw
        self._after = ""
        self._ws = ""
        self._calls.extend(calls)

    def _after_rest(self) -> str:
        rest = self._after
        for tok in _END_TOKENS:
            rest = rest.replace(tok, "")
        return rest.strip()

    def _after_is_clean(self) -> bool:
        return not self._after_rest()

    def _after_is_prose(self) -> bool:
        rest = self._after_rest()
        return bool(rest) and not any(tok.startswith(rest) for tok in _END_TOKENS)

    @staticmethod
    def _capture_end(fmt: str, buf: str) -> int:
        """Index just past the end of the markup in ``buf``; -1 while it has not ended."""
        if fmt == "hermes":
            k = buf.find("</tool_call>")
            return k + len("</tool_call>") if k >= 0 else -1
        if fmt == "function":
            k = buf.find("</function>")
            return k + len("</function>") if k >= 0 else -1
        if fmt == "fenced":
            k = buf.find("\n" + FENCE, len(FENCE))
            if k < 0:
                return -1
            return k + 1 + len(FENCE)
        marker = {"mistral": "[TOOL_CALLS]", "python_tag": "<|python_tag|>", "bare": ""}[fmt]
        start = len(marker)
        while start < len(buf) and buf[start] in " \t\r\n":
            start += 1
        if start >= len(buf):
            return -1
        if buf[start] not in "{[":
            if fmt != "mistral":
                return start  # not JSON after the marker: ends here, fails to parse, released as text
            # The newer Mistral form: [TOOL_CALLS]NAME[ARGS]{json}
            k = buf.find("[ARGS]", start)
            if k < 0:
                m = _NAME.match(buf, start)
                assert m is not None  # a pattern of `[...]*` matches (maybe empty) anywhere
                tail = buf[m.end():]
                waiting = len(buf) - start <= 128 and (not tail or "[ARGS]".startswith(tail))
                return -1 if waiting else start
            k += len("[ARGS]")
            while k < len(buf) and buf[k] in " \t\r\n":
                k += 1
            return json_end(buf, k) if k < len(buf) else -1
        return json_end(buf, start)
