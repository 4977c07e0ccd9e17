"""How an upstream attempt can fail, and what each failure means for routing."""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from urllib.parse import urlsplit

# Reasons are short machine words: they appear in x-coderouter-attempts, the journal and the audit log.
CONNECT = "connect_error"
FIRST_BYTE_TIMEOUT = "first_byte_timeout"
IDLE_TIMEOUT = "idle_timeout"
TOTAL_TIMEOUT = "total_timeout"
DISCONNECT = "upstream_disconnect"
STREAM_ERROR = "stream_error"
BAD_RESPONSE = "bad_response"
OVERFLOW = "context_overflow"
MODEL_DISCOVERY = "model_discovery_failed"
BUDGET = "budget_exhausted"
# error_type of a BUDGET refusal that retrying cannot fix before the cap resets (spent, or this request's
# estimate alone is more than is left): the client gets the final budget answer, not "overloaded".
BUDGET_FINAL = "budget_final"
# The request could not be built for this upstream (our translation refused it): the request's doing or ours,
# never the provider's. Another provider (another wire) may still take it.
UNBUILDABLE = "request_unbuildable"
MEMORY_PRESSURE = "memory_pressure"  # the backend ran out of memory: cooldown, fail over
# The upstream answered with a redirect. Never followed (providers/upstream_session.py): our credentials and the
# prompt would go to wherever it points. The provider's failure, like a 5xx.
REDIRECT = "upstream_redirect"
# The upstream sent more than we read (providers/limits.py): a whole answer, an event-stream line or event.
TOO_LARGE = "answer_too_large"

# What llama.cpp, Ollama, LM Studio, vLLM, MLX and CUDA/Metal say when a model does not fit.
_OOM = re.compile(
    r"out of memory|\bOOM\b|failed to allocate|insufficient memory|not enough memory|failed to load model"
    r"|cannot allocate memory|ggml_\w*alloc\w*[^\n]{0,40}failed|cudaMalloc failed"
    r"|kIOGPUCommandBufferCallbackErrorOutOfMemory|requires more system memory|unable to allocate",
    re.I,
)


def is_memory_error(message: str) -> bool:
    return bool(message) and _OOM.search(message) is not None


def stream_error_reason(message: str) -> str:
    """The reason for an error the upstream reported inside its stream."""
    return MEMORY_PRESSURE if is_memory_error(message) else STREAM_ERROR

# Statuses that say "try somewhere else": a bad key or a missing model on one provider must not sink the chain.
_FAILOVER_STATUSES = {401, 402, 403, 404, 408, 409, 429}
# Statuses that say the provider itself is in trouble (these count against its circuit breaker).
_BREAKER_STATUSES = {408, 429}
# Statuses that say the request itself is wrong: the provider answered, so it is alive, and nothing counts.
_REQUEST_STATUSES = {400, 413, 422}


class UpstreamError(Exception):
    def __init__(
        self,
        reason: str,
        *,
        status: int | None = None,
        message: str = "",
        retry_after: float | None = None,
        after_content: bool = False,
        overflow: tuple[int, int] | None = None,
        error_type: str | None = None,
    ) -> None:
        super().__init__(message or reason)
        self.reason = reason
        self.status = status
        self.message = message or reason
        self.retry_after = retry_after
        self.after_content = after_content
        self.overflow = overflow  # (prompt tokens, window) when the backend said the prompt is too long
        self.error_type = error_type

    @property
    def failover(self) -> bool:
        """Whether another provider should be tried. A 400 caused by the request itself would fail everywhere."""
        if self.reason in (OVERFLOW, UNBUILDABLE):
            return True  # overflow: the executor only moves on when a larger window exists
        if self.status is None or self.reason == MEMORY_PRESSURE:
            return True
        return self.status in _FAILOVER_STATUSES or self.status >= 500

    @property
    def counts_against_provider(self) -> bool:
        """Whether this failure is the provider's fault (feeds breakers and health), not the request's."""
        if self.reason in (OVERFLOW, BUDGET, UNBUILDABLE):
            return False
        if self.status is None or self.reason == MEMORY_PRESSURE:
            return True
        return self.status in _BREAKER_STATUSES or self.status >= 500

    @property
    def caused_by_request(self) -> bool:
        """A failure the request caused (it would fail anywhere): the client's to fix, in a 4xx."""
        return self.reason in (OVERFLOW, UNBUILDABLE) or self.status in _REQUEST_STATUSES

    @property
    def provider_answered(self) -> bool:
        """The provider answered with an HTTP error: whatever it said, it is alive."""
        return self.status is not None and self.reason != UNBUILDABLE

    @property
    def auth_failure(self) -> bool:
        """401/403: the provider refuses our credentials. Shown as an `auth` state, not a breaker matter."""
        return self.status in (401, 403)

    @property
    def label(self) -> str:
        if self.status is not None and self.reason.startswith("http"):
            return self.reason
        return self.reason if self.status is None else f"{self.reason}:{self.status}"

    def __repr__(self) -> str:
        return f"UpstreamError({self.reason!r}, status={self.status}, message={self.message[:80]!r})"


def http_error(status: int, message: str, *, retry_after: float | None = None) -> UpstreamError:
    reason = MEMORY_PRESSURE if status >= 400 and is_memory_error(message) else f"http_{status}"
    return UpstreamError(reason, status=status, message=message, retry_after=retry_after)


# The longest wait an upstream may impose through Retry-After. The header is untrusted input: "nan", "1e400" or a
# date in the year 9999 must neither crash the answer nor open a breaker for ever (the breaker is persisted).
MAX_RETRY_AFTER_S = 3600.0


def _seconds(text: str) -> float | None:
    """A finite, non-negative number of seconds clamped to the cap, or None for anything else."""
    try:
        v = float(text)
    except (ValueError, OverflowError):
        return None
    if v != v or v < 0:  # NaN, or a negative wait (nonsense)
        return None
    return min(v, MAX_RETRY_AFTER_S)  # also turns inf into the cap


def _http_date(text: str) -> float | None:
    """The other form RFC 9110 allows: an HTTP date, as seconds from now (0 when already past)."""
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    try:
        delta = (when - datetime.now(UTC)).total_seconds()
    except OverflowError:
        return None
    return min(max(0.0, delta), MAX_RETRY_AFTER_S)


def redirect_error(status: int, location: str | None) -> UpstreamError:
    """A 3xx. Only the target's origin is named: its path or query may carry what the upstream put there."""
    parts = urlsplit(location or "")
    where = f" to {parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""
    # No HTTP status on the error: a 3xx is no answer to pass to the client, and failover needs none.
    return UpstreamError(REDIRECT, message=f"upstream answered HTTP {status} (redirect{where}); redirects are not "
                                           f"followed")


def parse_retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait from `retry-after-ms` (OpenAI, Anthropic) or `retry-after` (seconds or an HTTP date):
    always finite and within [0, MAX_RETRY_AFTER_S], None when absent or unreadable."""
    ms = headers.get("retry-after-ms")
    if ms:
        v = _seconds(ms)
        if v is not None:
            return min(v / 1000.0, MAX_RETRY_AFTER_S)
    after = headers.get("retry-after")
    if not after:
        return None
    seconds = _seconds(after)
    return seconds if seconds is not None else _http_date(after)
