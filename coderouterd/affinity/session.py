"""Which session a request belongs to: the client's name for it, when it gives one.

A session groups a client's requests: a conversation's turns, its subagents' and its side calls (titles,
summaries, compaction). Which of them a request continues is decided by its prompt (affinity/lanes.py); the
session only breaks ties and tells two conversations that began alike apart.
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
    return named_session_key(headers, body) or SessionKey("fp:" + fingerprint, "fingerprint")


def named_session_key(headers: dict[str, str], body: dict) -> SessionKey | None:
    """The session as the client names it (header, metadata, the body's prompt_cache_key), or None: then only a
    fingerprint of the prompt can name it (`session_key`)."""
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
    return from_prompt_cache_key(body.get("prompt_cache_key"))  # type: ignore[arg-type]
