"""What corectl shows of a request is the client's text: neutralised before a terminal sees it (issue 41, N11).

A model name, an upstream's error text (which may quote the model), a request id from the shared journal: any
client of the router writes these, and in team mode every user is one. Printed raw, `ESC [2J` clears the
admin's screen and `ESC ] 8 ;; URL` plants a hyperlink; as Rich markup, `[link=URL]` does the same.

Two layers, both here:

- `clean` / `clean_tree`: every C0 control (newline and tab included: a newline in a model name would forge
  table rows), DEL, every C1 control (0x80-0x9f: 0x9b is a one-byte CSI) and the bidirectional overrides (which
  reorder what the admin reads) become visible escapes, `\\x1b`, `\\u202e`. Applied to the data a view renders,
  before layout, so tables keep their widths.
- `render.SafeConsole`: the console every human view prints through. Markup and emoji codes are off (a client's
  `[link=...]` or `:warning:` is printed as written), and any control character still in a segment of text
  (a view that forgot to clean its data) is escaped on the way out. Rich's own cursor and style codes are not
  text segments and pass.

No Rich here: `echo` and error lines clean their text without loading it. `--json` output is never cleaned: the JSON encoder escapes control characters and the data stays exact.
"""

from __future__ import annotations

import re
from typing import Any

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_BUT_NEWLINE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape_controls(text: str) -> str:
    """Every control character but the line break escaped: what `render.SafeConsole` does to text segments."""
    return _UNSAFE_BUT_NEWLINE.sub(_visible, text)


def clean(text: str, *, newlines: bool = False) -> str:
    """`text` with every control character shown as an escape. `newlines`: keep line breaks (a message of our
    own that spans lines, such as a config error); never for a value that came from a request."""
    return (_UNSAFE_BUT_NEWLINE if newlines else _UNSAFE).sub(_visible, text)


def clean_tree(value: Any) -> Any:
    """A decoded JSON value (or a journal row) with every string in it, keys included, `clean`ed."""
    if isinstance(value, str):
        return clean(value)
    if isinstance(value, dict):
        return {clean(k) if isinstance(k, str) else k: clean_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_tree(v) for v in value]
    return value
