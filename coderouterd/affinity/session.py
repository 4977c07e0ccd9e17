"""Which conversation a request belongs to, and which lane of it.

A session key groups the turns of one conversation so they can be sent to the same backend slot. A lane
splits a session further: Claude Code's background calls (title and summary generation: a small model and
no tools) carry the same session id as the main conversation but a different prompt, so they get a lane of
their own and never evict the main conversation's cached prefix. Subagents share the session id too; their
first message differs, so the main lane is also keyed by a fingerprint of the first message.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

import orjson

# Header, in order of trust. Claude Code sends the first; other agents use one of the generic spellings.
PRIMARY_HEADER = "x-claude-code-session-id"
GENERIC_HEADERS = ("session-id", "session_id")
# Legacy Claude Code metadata.user_id: user_<hex>_account_<uuid>_session_<uuid>
_LEGACY_USER_ID = re.compile(r"_session_([0-9A-Za-z-]{8,})")

MAIN = "main"
BACKGROUND = "background"


@dataclass(frozen=True, slots=True)
class SessionKey:
    key: str
    source: str  # header | metadata | prompt_cache_key | fingerprint

    @property
    def hashed(self) -> str:
        """What the journal keeps: enough to group a session's rows, never the id itself."""
        return hash_key(self.key)


_HASHED: dict[str, str] = {}
_HASHED_MAX = 4096
_HASHED_KEY_MAX = 512  # a client's session id can be long: such keys are hashed every time, never kept


def hash_key(key: str) -> str:
    """Asked four times per request for the same session and lane (journal, trace, lane label): remembered, for
    at most _HASHED_MAX keys of at most _HASHED_KEY_MAX characters (forgotten all at once when full)."""
    h = _HASHED.get(key)
    if h is None:
        h = hashlib.blake2b(key.encode(), digest_size=6).hexdigest()
        if len(key) <= _HASHED_KEY_MAX:
            if len(_HASHED) >= _HASHED_MAX:
                _HASHED.clear()
            _HASHED[key] = h
    return h


def from_prompt_cache_key(key: str) -> SessionKey | None:
    """The Responses (and Chat Completions) `prompt_cache_key`: the client's own name for a cacheable prefix."""
    key = key.strip() if isinstance(key, str) else ""
    return SessionKey("pck:" + key, "prompt_cache_key") if key else None


def _from_metadata(body: dict) -> str | None:
    meta = body.get("metadata")
    if not isinstance(meta, dict):
        return None
    uid = meta.get("user_id")
    if not isinstance(uid, str) or not uid:
        return None
    if uid.startswith("{"):
        try:
            parsed = orjson.loads(uid)
        except orjson.JSONDecodeError:
            return None
        sid = parsed.get("session_id") if isinstance(parsed, dict) else None
        return sid if isinstance(sid, str) and sid else None
    m = _LEGACY_USER_ID.search(uid)
    return m.group(1) if m else None


def session_key(headers: dict[str, str], body: dict, fingerprint: str) -> SessionKey:
    """Headers are lower-cased. `fingerprint` names the canonical prefix, the last resort."""
    sid = headers.get(PRIMARY_HEADER)
    if sid:
        return SessionKey("s:" + sid, "header")
    sid = _from_metadata(body)
    if sid:
        return SessionKey("s:" + sid, "metadata")
    for h in GENERIC_HEADERS:
        sid = headers.get(h)
        if sid:
            return SessionKey("s:" + sid, "header")
    pck = from_prompt_cache_key(body.get("prompt_cache_key"))  # type: ignore[arg-type]
    if pck is not None:
        return pck
    return SessionKey("fp:" + fingerprint, "fingerprint")


def lane_kind(body: dict, session: SessionKey) -> str:
    """An agent's background calls are its requests without tools (every agent turn of Claude Code carries its
    tools). Only for a client that names its session: a plain chat client without tools is a conversation."""
    if body.get("tools") or session.source not in ("header", "metadata"):
        return MAIN
    return BACKGROUND


def lane_id(session: SessionKey, kind: str, first_message_digest: str) -> str:
    if kind == BACKGROUND:
        return f"{session.key}{BACKGROUND_SUFFIX}"
    return f"{session.key}|main|{first_message_digest}"


BACKGROUND_SUFFIX = "|bg"


def is_background(lane: str | None) -> bool:
    return lane is not None and lane.endswith(BACKGROUND_SUFFIX)
