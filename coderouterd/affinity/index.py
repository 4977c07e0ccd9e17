"""The prefix index: what each backend (and each of its slots) is believed to hold, and how fast it is.

Updated after every answer with the prompt that was sent, and corrected by what the backend reports it
reused: the reported cached tokens calibrate bytes-per-token, and a turn that reused less than predicted is
a cache bust (see bust.py). Pure: time comes in as arguments; snapshot()/restore() for the state store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from .canonical import Prompt, common_prefix
from .slots import SlotTable

MAX_LANES = 256  # lanes whose last prompt is remembered (for bust naming and unslotted predictions)
DEFAULT_BYTES_PER_TOKEN = 3.6
DEFAULT_S_PER_TOKEN = 1 / 400  # a laptop's prompt processing until measured
MIN_BYTES_PER_TOKEN = 1.0
MAX_BYTES_PER_TOKEN = 16.0
EMA = 0.2


@dataclass(slots=True)
class ProviderPrefixes:
    """One backend. `slots` is set when the backend exposes llama-server slots."""

    slots: SlotTable | None = None
    bytes_per_token: float = DEFAULT_BYTES_PER_TOKEN
    s_per_token: float = DEFAULT_S_PER_TOKEN
    measured: bool = False  # s_per_token came from this backend, not the default
    mean_duration_s: float = 0.0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    # Share of predicted reuse the backend actually reported (EMA): a backend that evicts early, or does not
    # cache at all, stops looking attractive to `expected_ttft_s`.
    realised: float = 1.0

    @property
    def hit_ratio(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None

    def learn(self, *, prompt_bytes: int, prompt_tokens: int, cached_tokens: int, processed_tokens: int,
              prefill_s: float | None, duration_s: float) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += min(cached_tokens, prompt_tokens)
        if prompt_tokens > 20 and prompt_bytes > 200:
            sample = prompt_bytes / prompt_tokens
            # Text tokenises at a few bytes a token. A sample far outside that says the template did not render
            # what the bytes hold (SmolLM2's drops tool schemas: 40 KB of them became 20 tokens), and one such
            # sample made every later prediction of this server's cache near zero.
            if MIN_BYTES_PER_TOKEN <= sample <= MAX_BYTES_PER_TOKEN:
                self.bytes_per_token += EMA * (sample - self.bytes_per_token)
        if prefill_s is not None and processed_tokens > 50 and prefill_s > 0:
            rate = prefill_s / processed_tokens
            self.s_per_token = rate if not self.measured else self.s_per_token + EMA * (rate - self.s_per_token)
            self.measured = True
        self.mean_duration_s = duration_s if not self.mean_duration_s else \
            self.mean_duration_s + EMA * (duration_s - self.mean_duration_s)

    def correct(self, predicted_tokens: int, cached_tokens: int) -> None:
        if predicted_tokens >= 64:
            self.realised += EMA * (min(1.0, cached_tokens / predicted_tokens) - self.realised)


@dataclass
class PrefixIndex:
    providers: dict[str, ProviderPrefixes] = field(default_factory=dict)
    # lane -> (provider, its last prompt there, the prompt tokens the backend reported for it (0 = unknown));
    # for bust detection and unslotted predictions
    lanes: OrderedDict[str, tuple[str, Prompt, int]] = field(default_factory=OrderedDict)
    # provider -> requests in flight there: the upstream's one count (upstream/upstream.py), handed in by the daemon;
    # none counted when nothing is handed in (a tool, a test of the index alone).
    in_flight: Callable[[str], int] = field(default=lambda _name: 0)

    def provider(self, name: str) -> ProviderPrefixes:
        p = self.providers.get(name)
        if p is None:
            p = self.providers[name] = ProviderPrefixes()
        return p

    def last_prompt(self, lane: str) -> tuple[str, Prompt, int] | None:
        return self.lanes.get(lane)

    def remember(self, lane: str, provider: str, prompt: Prompt, prompt_tokens: int = 0) -> None:
        self.lanes[lane] = (provider, prompt, prompt_tokens)
        self.lanes.move_to_end(lane)
        while len(self.lanes) > MAX_LANES:
            self.lanes.popitem(last=False)

    def forget_provider(self, provider: str) -> None:
        """Lanes whose last prompt went to `provider` forget it (its cache is gone)."""
        for lane in [lane for lane, (prov, _p, _t) in self.lanes.items() if prov == provider]:
            del self.lanes[lane]

    def predict(self, provider: str, lane: str, prompt: Prompt) -> int:
        """Bytes of `prompt` the backend is expected to hold, before any slot choice: the best slot for a
        slotted backend; else the longest prefix of any recent prompt sent there (one shared cache)."""
        p = self.providers.get(provider)
        if p is not None and p.slots is not None:
            own = p.slots.owned(lane)
            if own is not None:
                return own.reuse(prompt)
            saved = p.slots.saved.get(lane)
            best = max((s.reuse(prompt) for s in p.slots.slots if s.lane is None), default=0)
            if saved is not None and p.slots.can_save:
                best = max(best, prompt.upto(common_prefix(saved.digests, prompt.digests)))
            return best
        best = 0
        for prov, prev, _tokens in self.lanes.values():
            if prov == provider:
                best = max(best, prompt.upto(common_prefix(prev.digests, prompt.digests)))
        return best

    def expected_ttft_s(self, provider: str, lane: str, prompt: Prompt) -> float:
        """Uncached tokens x measured prompt rate, plus the queue in front of this request."""
        p = self.provider(provider)
        uncached = max(0, prompt.size - self.predict(provider, lane, prompt) * p.realised) / p.bytes_per_token
        width = len(p.slots.slots) if p.slots is not None else 1
        queue = (self.in_flight(provider) / width) * p.mean_duration_s
        return uncached * p.s_per_token + queue

    # -- persistence ----------------------------------------------------------------------------------------

    def snapshot(self, provider: str) -> dict:
        p = self.provider(provider)
        return {
            "bytes_per_token": p.bytes_per_token, "s_per_token": p.s_per_token, "measured": p.measured,
            "mean_duration_s": p.mean_duration_s, "prompt_tokens": p.prompt_tokens,
            "cached_tokens": p.cached_tokens, "realised": p.realised,
            "slots": p.slots.snapshot() if p.slots is not None else None,
        }

    def restore(self, provider: str, snap: dict) -> None:
        p = self.provider(provider)
        try:
            p.bytes_per_token = float(snap.get("bytes_per_token") or DEFAULT_BYTES_PER_TOKEN)
            p.s_per_token = float(snap.get("s_per_token") or DEFAULT_S_PER_TOKEN)
            p.measured = bool(snap.get("measured"))
            p.mean_duration_s = float(snap.get("mean_duration_s") or 0.0)
            p.prompt_tokens = int(snap.get("prompt_tokens") or 0)
            p.cached_tokens = int(snap.get("cached_tokens") or 0)
            p.realised = min(1.0, max(0.0, float(snap.get("realised", 1.0))))
        except (TypeError, ValueError):
            return
        slots = snap.get("slots")
        if isinstance(slots, dict):
            n = len(slots.get("slots") or ())
            if n:
                p.slots = SlotTable(n)
                p.slots.restore(slots)
