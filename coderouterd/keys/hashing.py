"""Making and recognising a team key's secret: the secret itself, its keyed hash, the prefix shown for it, and the
rule for key names. Pure functions; nothing here stores anything.

A secret is `crk_` + 43 URL-safe characters (32 random bytes, 256 bits). What is stored is HMAC-SHA256 of the
secret under a hash key the router keeps (docs/decisions.md, "Team keys: a keyed hash"), never the secret."""

from __future__ import annotations

import hashlib
import re
import secrets

from .model import SECRET_PREFIX

SECRET_BYTES = 32  # 256 bits of randomness: no guessing, no dictionary, no precomputed table can reach one
HASH_KEY_BYTES = 32
# The secret's first characters kept for display ("crk_3fA9…"): 4 random characters (24 bits) tell keys apart
# in a list and in a user's config without being any help in guessing the other 252 bits.
PREFIX_CHARS = len(SECRET_PREFIX) + 4

# Short identifiers: what the journal, metrics labels, audit lines and refusals carry. A leading letter or digit,
# then letters, digits, `.`, `_`, `-`; at most 32 characters. Nothing a shell, a URL path or a terminal mangles.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,31}")


def name_problem(name: str) -> str | None:
    """Why `name` is not a valid key name, or None."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        return ("a key name is 1 to 32 characters: letters, digits, '.', '_' or '-', starting with a letter or "
                "a digit")
    return None


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def new_hash_key() -> bytes:
    return secrets.token_bytes(HASH_KEY_BYTES)


def display_prefix(secret: str) -> str:
    return secret[:PREFIX_CHARS]


# HMAC's pads (RFC 2104), as translation tables over the key's bytes.
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))
_BLOCK = 64  # SHA-256's block size


class Hasher:
    """HMAC-SHA256 under the router's hash key: the digest a secret is stored and looked up by.

    The key's inner and outer SHA-256 states are computed once and copied per call: the same bytes as
    `hmac.digest(key, msg, "sha256")` (tested), in about half its time (hmac.digest sets up an HMAC context per
    call), which is most of what a team key adds to a request."""

    __slots__ = ("_inner", "_outer")

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("a hash key has at least 16 bytes")
        if len(key) > _BLOCK:
            key = hashlib.sha256(key).digest()
        key = key.ljust(_BLOCK, b"\0")
        self._inner = hashlib.sha256(key.translate(_IPAD))
        self._outer = hashlib.sha256(key.translate(_OPAD))

    def digest(self, secret: str) -> bytes:
        inner = self._inner.copy()
        inner.update(secret.encode("utf-8", "surrogateescape"))
        outer = self._outer.copy()
        outer.update(inner.digest())
        return outer.digest()

    def hex(self, secret: str) -> str:
        return self.digest(secret).hex()
