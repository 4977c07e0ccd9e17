"""The canonical prompt: what the backend's prefix cache will see, cut into hashed segments.

Some clients put a value that changes on every request at the very start of the prompt (Claude Code's
`x-anthropic-billing-header` line in system[0], whose `cch=` differs per request): every prefix cache misses
from the first token. Those lines are removed for every upstream except the real Anthropic API, which
reads them. The patterns are configurable.

Segments follow the order a local server's chat template renders a prompt in: the system prompt, then the
tools, then each message (docs/decisions.md, "Lanes by prefix"). Each segment's
digest chains the previous one, so two prompts share their first k segments exactly when their k-th
digests are equal; no tokenizer is needed. `cache_control` markers are dropped before hashing: Claude Code
moves them every turn and no backend caches on them.

A segment longer than CHUNK_BYTES is cut into sub-segments of that size (the last one shorter), each with its
own chained digest and end, labelled as the whole segment: agents put per-session text at the end of a long
system block (Claude Code's environment section, Copilot CLI's session folder), and two sessions then still
share most of that block, which is what a new lane is seeded from (affinity/slots.py). Lanes name conversations
by whole segments (`Prompt.whole`): part of a first message shared with another session names nothing.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import orjson

DEFAULT_STRIP_PATTERNS = (r"^x-anthropic-billing-header:.*$",)
# Two patterns, each starting with a literal (a leading optional comma made the search ~17x slower): the marker
# after another key (the usual place), then one left as the first key.
_CACHE_CONTROL_AFTER = re.compile(rb',"cache_control":\{[^{}]*\}')
_CACHE_CONTROL_FIRST = re.compile(rb'"cache_control":\{[^{}]*\},?')
# Sub-segment size. A copy of the running hash costs ~0.4 µs: ~25 more boundaries on a 200 KB Claude Code body.
# A seeded lane gets the donor's whole slot, so the server reuses every shared token whatever the size; the size
# only bounds how much of a shared prefix goes unseen when choosing (< 1k tokens).
CHUNK_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Prompt:
    """A request's canonical segments: labels ("tools", "system[0]", "message 3"), chained digests, and the
    cumulative size in bytes at the end of each segment (the unit the index predicts in). A long segment is
    several entries (sub-segments, CHUNK_BYTES each), all with its label."""

    labels: tuple[str, ...]
    digests: tuple[bytes, ...]
    ends: tuple[int, ...]
    # Digest of the first message alone (not chained): names the conversation even when the system prompt
    # or tools in front of it change, so such a change is seen as a cache bust rather than a new conversation.
    head: str = "empty"
    # Leading segments that are system prompt or tools: what every conversation of one client shares, so a
    # prefix no longer than this names no conversation (affinity/lanes.py).
    lead: int = 0
    # The same prompt at whole segments, when some segment was cut (None: it is this one). Its digests are
    # those of this prompt at segment ends (one running hash), so either granularity matches the other there.
    coarse: Prompt | None = None

    @property
    def whole(self) -> Prompt:
        """One entry per segment: what names a lane (affinity/lanes.py)."""
        return self.coarse if self.coarse is not None else self

    @property
    def size(self) -> int:
        return self.ends[-1] if self.ends else 0

    def upto(self, k: int) -> int:
        """Bytes covered by the first k segments."""
        return self.ends[k - 1] if k > 0 else 0


class Canonicaliser:
    def __init__(self, patterns: list[str] | tuple[str, ...] = DEFAULT_STRIP_PATTERNS) -> None:
        self.patterns = [re.compile(p, re.MULTILINE) for p in patterns]

    def _clean(self, text: str) -> str:
        out = text
        for p in self.patterns:
            out = p.sub("", out)
        if out is text or out == text:
            return text
        return out.strip("\n")

    def anthropic(self, body: dict) -> dict:
        """The body with system[0] cleaned; the same object when nothing matched (the common case)."""
        system = body.get("system")
        if isinstance(system, str):
            cleaned = self._clean(system)
            if cleaned == system:
                return body
            out = dict(body)
            if cleaned:
                out["system"] = cleaned
            else:
                out.pop("system")
            return out
        if not isinstance(system, list) or not system:
            return body
        first = system[0]
        if not isinstance(first, dict) or first.get("type") != "text" or not isinstance(first.get("text"), str):
            return body
        cleaned = self._clean(first["text"])
        if cleaned == first["text"]:
            return body
        out = dict(body)
        out["system"] = ([{**first, "text": cleaned}] if cleaned else []) + system[1:]
        return out

    def openai(self, body: dict) -> dict:
        """The first system (or developer) message cleaned, for Chat Completions bodies."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return body
        m0 = messages[0]
        if not isinstance(m0, dict) or m0.get("role") not in ("system", "developer"):
            return body
        content = m0.get("content")
        if isinstance(content, str):
            cleaned = self._clean(content)
            if cleaned == content:
                return body
            new_m0 = {**m0, "content": cleaned}
        elif isinstance(content, list) and content and isinstance(content[0], dict) \
                and isinstance(content[0].get("text"), str):
            cleaned = self._clean(content[0]["text"])
            if cleaned == content[0]["text"]:
                return body
            new_m0 = {**m0, "content": [{**content[0], "text": cleaned}, *content[1:]]}
        else:
            return body
        out = dict(body)
        out["messages"] = [new_m0, *messages[1:]]
        return out

    def canonical(self, body: dict, ingress: str) -> dict:
        return self.anthropic(body) if ingress == "anthropic" else self.openai(body)


def _dump(part: object) -> bytes:
    raw = orjson.dumps(part)
    if b'"cache_control"' in raw:
        raw = _CACHE_CONTROL_AFTER.sub(b"", raw)
        if b'"cache_control"' in raw:
            raw = _CACHE_CONTROL_FIRST.sub(b"", raw)
    return raw


def segments(body: dict, ingress: str, head: str | None = None) -> Prompt:
    """Chained segment digests of a canonical body (Anthropic Messages or OpenAI Chat Completions). `head`:
    `first_message_head(body, ingress)` when the caller has it already."""
    labels: list[str] = []
    parts: list[bytes] = []
    tools = body.get("tools")
    lead = 0  # where the tools go: after the leading system segments, as templates render them
    if ingress == "anthropic":
        system = body.get("system")
        if isinstance(system, str) and system:
            labels.append("system[0]")
            parts.append(system.encode())
        elif isinstance(system, list):
            for i, block in enumerate(system):
                labels.append(f"system[{i}]")
                parts.append(_dump(block))
        lead = len(parts)
        for i, m in enumerate(body.get("messages") or ()):
            labels.append(f"message {i}")
            parts.append(_dump(m))
    elif "input" in body and "messages" not in body:
        # Responses API: `instructions` is the system prompt, `input` a string or a list of items.
        instructions = body.get("instructions")
        if isinstance(instructions, str) and instructions:
            labels.append("system[0]")
            parts.append(instructions.encode())
        lead = len(parts)
        items = body.get("input")
        for i, item in enumerate(items if isinstance(items, list) else [items]):
            labels.append(f"message {i}")
            parts.append(_dump(item))
    else:
        n_sys = 0
        for i, m in enumerate(body.get("messages") or ()):
            if isinstance(m, dict) and m.get("role") in ("system", "developer") and n_sys == i:
                labels.append(f"system[{n_sys}]")
                n_sys += 1
            else:
                labels.append(f"message {i}")
            parts.append(_dump(m))
        lead = n_sys
    if tools:
        labels.insert(lead, "tools")
        parts.insert(lead, _dump(tools))
        lead += 1
    head = head if head is not None else first_message_head(body, ingress)
    if any(len(p) > CHUNK_BYTES for p in parts):
        return _cut(labels, parts, lead, head)
    # One running hash over the concatenated segments; a copy at each boundary is the digest of the whole
    # prefix so far (SHA-256 is hardware-accelerated on current CPUs: ~3x blake2b's speed here).
    h = hashlib.sha256()
    digests: list[bytes] = []
    ends: list[int] = []
    total = 0
    for p in parts:
        h.update(p)
        digests.append(h.copy().digest()[:16])
        total += len(p)
        ends.append(total)
    return Prompt(tuple(labels), tuple(digests), tuple(ends), head, lead)


def _cut(labels: list[str], parts: list[bytes], lead: int, head: str) -> Prompt:
    """`segments` with its long segments cut into CHUNK_BYTES sub-segments, and the whole-segment view."""
    h = hashlib.sha256()
    fine_labels: list[str] = []
    digests = []
    ends = []
    whole_digests = []
    whole_ends = []
    fine_lead = 0
    total = 0
    for i, (label, p) in enumerate(zip(labels, parts, strict=True)):
        n = len(p)
        if n > CHUNK_BYTES:
            mv = memoryview(p)
            off = CHUNK_BYTES
            while off < n:
                h.update(mv[off - CHUNK_BYTES:off])
                digests.append(h.copy().digest()[:16])
                ends.append(total + off)
                fine_labels.append(label)
                off += CHUNK_BYTES
            h.update(mv[off - CHUNK_BYTES:])
        else:
            h.update(p)
        d = h.copy().digest()[:16]
        total += n
        digests.append(d)
        ends.append(total)
        fine_labels.append(label)
        whole_digests.append(d)
        whole_ends.append(total)
        if i + 1 == lead:
            fine_lead = len(digests)
    coarse = Prompt(tuple(labels), tuple(whole_digests), tuple(whole_ends), head, lead)
    return Prompt(tuple(fine_labels), tuple(digests), tuple(ends), head, fine_lead, coarse)


def first_message_head(body: dict, ingress: str) -> str:
    """The digest of the first message alone (`Prompt.head`): the part `segments` labels "message" first.
    Computed on its own because a lane is named by it on every request, while the whole chain is needed only
    where a prediction is (bench/README.md, "Tail and big body")."""
    first = _NONE
    if ingress == "anthropic":
        messages = body.get("messages") or ()
        if messages:
            first = messages[0]
    elif "input" in body and "messages" not in body:
        items = body.get("input")
        items = items if isinstance(items, list) else [items]
        if items:
            first = items[0]
    else:
        n_sys = 0
        for i, m in enumerate(body.get("messages") or ()):
            if isinstance(m, dict) and m.get("role") in ("system", "developer") and n_sys == i:
                n_sys += 1
                continue
            first = m
            break
    if first is _NONE:
        return "empty"
    return hashlib.sha256(_dump(first)).hexdigest()[:12]


_NONE = object()


def common_prefix(a: tuple[bytes, ...] | list[bytes], b: tuple[bytes, ...] | list[bytes]) -> int:
    """How many leading segments two chains share. Chained digests make a binary search exact."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo
