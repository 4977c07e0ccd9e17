"""Thinking blocks an Anthropic upstream did not sign never go back to it.

A local model's reasoning reaches an Anthropic client as `thinking` blocks carrying SYNTHETIC_SIGNATURE (local
backends cannot sign), and the client echoes them on later turns. When such a turn goes to an Anthropic
upstream, the real API checks every signature and refuses the whole request ("Invalid signature in thinking
block"), so a fallback in the middle of a conversation would fail. Before the body goes up:

- an unsigned block in an earlier turn is dropped: the API never shows a previous turn's thinking to the model;
- in the turn in progress (the last assistant message, when it called a tool) the model should still see it,
  so it becomes a text block;
- with thinking on, the API wants that turn to open with a signed thinking block; when it no longer can, thinking
  is switched off for this request (and with it `clear_thinking` context edits, which require thinking on).

The same holds between Anthropic upstreams: a signature one of them made (the Anthropic API, a gateway, a
third-party Anthropic-wire API) is refused by another. A SignatureBook remembers which upstream (by origin) signed
each thinking block it relayed, and blocks another upstream signed are treated as unsigned when the request goes
elsewhere. Signatures it never saw (made before a restart, or outside this daemon) go as they came.

Hot path: the body is only walked when its bytes carry our marker or an empty signature, or when more than one
upstream has signed blocks in this process."""

from __future__ import annotations

import re

from .openai_answer_to_anthropic import SYNTHETIC_SIGNATURE

_MARK = SYNTHETIC_SIGNATURE.encode()
_SIGNATURE_KEY = b'"signature"'
# After the key: an empty signature, ours (the marker), or null.
_UNSIGNED_VALUE = re.compile(rb'\s*:\s*(?:""|"' + re.escape(_MARK) + rb'"|null)')
_THINKING_FIRST = ("thinking", "redacted_thinking")


# Signatures remembered (newest kept): one per thinking turn relayed; about 100 bytes each.
SIGNATURES_KEPT = 65_536


class SignatureBook:
    """Which upstream (an origin such as https://api.anthropic.com) signed the thinking blocks this process
    relayed. Bounded: the oldest are forgotten first, and a forgotten signature goes up as it came."""

    def __init__(self, limit: int = SIGNATURES_KEPT) -> None:
        self._limit = limit
        self._by_signature: dict[int, str] = {}  # hash of the signature (or redacted data) -> signer
        self._signers: set[str] = set()

    def __len__(self) -> int:
        return len(self._by_signature)

    def record(self, signer: str, signature: object) -> None:
        if not isinstance(signature, str) or not signature or signature == SYNTHETIC_SIGNATURE:
            return
        book = self._by_signature
        key = hash(signature)
        book.pop(key, None)
        book[key] = signer
        self._signers.add(signer)
        if len(book) > self._limit:
            del book[next(iter(book))]

    def others_signed(self, signer: str) -> bool:
        """Whether any upstream but `signer` has signed a block here (else no block can be foreign to it)."""
        return len(self._signers) > 1 or (bool(self._signers) and signer not in self._signers)

    def signed_elsewhere(self, signer: str, signature: object) -> bool:
        owner = self._by_signature.get(hash(signature)) if isinstance(signature, str) else None
        return owner is not None and owner != signer

    def for_upstream(self, signer: str) -> UpstreamSignatures:
        return UpstreamSignatures(self, signer)


class UpstreamSignatures:
    """The book as one upstream sees it: what it signs is recorded, what others signed is foreign to it."""

    __slots__ = ("book", "signer")

    def __init__(self, book: SignatureBook, signer: str) -> None:
        self.book = book
        self.signer = signer

    def record(self, signature: object) -> None:
        self.book.record(self.signer, signature)

    def record_block(self, block: object) -> None:
        if isinstance(block, dict):
            kind = block.get("type")
            if kind == "thinking":
                self.record(block.get("signature"))
            elif kind == "redacted_thinking":
                self.record(block.get("data"))

    def may_hold_foreign(self) -> bool:
        return self.book.others_signed(self.signer)

    def foreign(self, signature: object) -> bool:
        return self.book.signed_elsewhere(self.signer, signature)


def may_carry_unsigned(raw: bytes) -> bool:
    """Whether a `"signature"` key in the body's bytes holds an empty string, our marker or null. One substring
    scan of the body, the value matched only where the key is (our marker and an empty signature were two
    scans, one of them a regex search: ~100 µs on the 95 KB Claude Code body on the benchmark VM)."""
    key = _SIGNATURE_KEY
    i = raw.find(key)
    while i >= 0:
        i += len(key)
        if _UNSIGNED_VALUE.match(raw, i):
            return True
        i = raw.find(key, i)
    return False


# Up to this many messages, walking the blocks is cheaper than scanning the bytes: the Claude Code benchmark body
# (10 messages, 95 KB) walks in ~6 µs and scans in ~35 µs; a long session (hundreds of short messages) scans
# faster than it walks.
WALK_FIRST_MAX_MESSAGES = 32


def unsigned_thinking_fix(body: dict, raw: bytes, upstream: UpstreamSignatures | None = None) -> dict | None:
    """What an Anthropic passthrough sends instead of `body` (its bytes: `raw`), or None to send it as it is:
    `without_unsigned_thinking(body, upstream)` when `may_carry_unsigned(raw)` or the upstream's book may hold
    another's signatures, else None. The same answer whichever runs first: on a body of few messages the walk
    runs first, and the scan only confirms a change the walk found."""
    if upstream is not None and upstream.may_hold_foreign():
        return without_unsigned_thinking(body, upstream)
    messages = body.get("messages")
    if isinstance(messages, list) and len(messages) <= WALK_FIRST_MAX_MESSAGES:
        fixed = without_unsigned_thinking(body, upstream)
        return fixed if fixed is not None and may_carry_unsigned(raw) else None
    return without_unsigned_thinking(body, upstream) if may_carry_unsigned(raw) else None


def _unsigned(block: object, upstream: UpstreamSignatures | None = None) -> bool:
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if kind == "thinking":
        sig = block.get("signature")
        if not isinstance(sig, str) or not sig or sig == SYNTHETIC_SIGNATURE:
            return True
        return upstream is not None and upstream.foreign(sig)
    if kind == "redacted_thinking":  # encrypted by its upstream: another cannot read it, and it has no text
        return upstream is not None and upstream.foreign(block.get("data"))
    return False


def _calls_tool(content: list) -> bool:
    return any(isinstance(b, dict) and b.get("type") == "tool_use" for b in content)


def without_unsigned_thinking(body: dict, upstream: UpstreamSignatures | None = None) -> dict | None:
    """A copy of the Messages `body` an Anthropic upstream accepts, or None when nothing needed to change.
    `upstream`: the upstream it goes to, whose book says which blocks another upstream signed."""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return None
    last = next((i for i in range(len(messages) - 1, -1, -1)
                 if isinstance(messages[i], dict) and messages[i].get("role") == "assistant"), -1)
    out: list = []
    changed = False
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) and msg.get("role") == "assistant" else None
        if not isinstance(content, list) or not any(_unsigned(b, upstream) for b in content):
            out.append(msg)
            continue
        changed = True
        in_progress = i == last and _calls_tool(content)
        kept = []
        for b in content:
            if not _unsigned(b, upstream):
                kept.append(b)
            elif in_progress and isinstance(b.get("thinking"), str) and b["thinking"].strip():
                kept.append({"type": "text", "text": b["thinking"]})
        if kept:  # an assistant turn that was only unsigned thinking goes; the API merges the turns around it
            out.append({**msg, "content": kept})
    if not changed:
        return None
    fixed = {**body, "messages": out}
    _thinking_off_if_unopened(fixed, out)
    return fixed


def _thinking_off_if_unopened(body: dict, messages: list) -> None:
    thinking = body.get("thinking")
    if not isinstance(thinking, dict) or thinking.get("type") == "disabled":
        return
    last = next((m for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "assistant"), None)
    content = last.get("content") if last is not None else None
    if not isinstance(content, list) or not _calls_tool(content):
        return
    first = content[0] if content else None
    if isinstance(first, dict) and first.get("type") in _THINKING_FIRST:
        return
    body.pop("thinking", None)
    cm = body.get("context_management")
    if isinstance(cm, dict) and isinstance(cm.get("edits"), list):
        edits = [e for e in cm["edits"] if not (isinstance(e, dict) and str(e.get("type", "")).startswith(
            "clear_thinking"))]
        if edits:
            body["context_management"] = {**cm, "edits": edits}
        else:
            body.pop("context_management", None)
