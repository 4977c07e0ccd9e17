"""Prefix affinity at run time: the only part of affinity that performs I/O or touches the daemon.

Per request: a Ticket (session, lane, canonical prompt). Per attempt: `place` picks the slot on a backend
that exposes llama-server's slots (as its server said: providers/server_info.py), saves/restores slot state
when lanes outnumber slots, and returns the fields to add to the upstream body (`id_slot`,
`cache_prompt`); `finish` records the outcome, corrects the index from what the backend reports it
reused, and names a cache bust. All of it runs on the event loop without blocking: persistence goes through
the state store (written by its own thread).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import orjson

from ..kvcache.cache import KVCache
from ..kvcache.intent import REQUEST, Intent, Restore
from ..providers.adapters import adapter_for
from ..providers.server_info import ServerDirectory, ServerInfo
from . import session as sess
from .bust import Bust, detect
from .canonical import Canonicaliser, Prompt, first_message_head, segments
from .index import PrefixIndex
from .lanes import LaneIndex
from .slots import SlotTable

if TYPE_CHECKING:
    from ..config.schema import AffinityConfig, ConfigModel, ProviderConfig
    from ..providers.provider import Provider
    from .index import ProviderPrefixes
    from .slots import Choice

log = logging.getLogger("coderouterd.affinity")

PERSIST_EVERY_S = 1.0
MAX_SLOT_WAIT_S = 120.0


class Ticket:
    """What affinity knows about one request, and (for the journal and `corectl explain`) what it did.

    `prompt` (the chained digests of the whole canonical body) is computed on first use: on a backend without
    slots that is after the answer went out (in `finish`), not before. So is `lane`, which the prompt names
    (affinity/lanes.py); where no digest is needed, no lane is named either."""

    __slots__ = ("_prompt", "_lane", "_lanes", "_session", "tools", "model", "canonical", "ingress",
                 "canonical_raw", "slot", "predicted_tokens", "cached_tokens", "bust", "placement_why", "lane_why",
                 "continues", "head", "restore", "seeded", "moved")

    def __init__(self, prompt: Prompt | None, session: sess.SessionKey | None, lanes: LaneIndex, canonical: dict,
                 ingress: str, head: str | None = None, *, tools: bool = False, model: str | None = None) -> None:
        """`session`: the client's name for it; None: the first message's fingerprint names it, digested on first
        use (`session`)."""
        self._prompt = prompt
        self._lane: str | None = None
        self._lanes = lanes
        self.head = head  # first_message_head of the canonical body, when it was computed
        self._session = session
        self.tools = tools  # tie-breaks only: never what decides a lane
        self.model = model
        self.canonical = canonical  # the body with per-request noise removed (same object when nothing was)
        self.ingress = ingress
        self.canonical_raw: bytes | None = None
        self.slot: int | None = None
        self.predicted_tokens: int | None = None
        self.cached_tokens: int | None = None
        self.bust: Bust | None = None
        self.placement_why = ""
        self.lane_why = ""
        self.continues = False  # the request continues its lane's history (else no cache bust can be named)
        self.restore: Restore | None = None  # a saved slot state restored for this turn, and what became of it
        self.seeded: dict | None = None  # a new lane started from another slot's prefix (copied, or placed there)
        self.moved: dict | None = None  # its lane's saved slot file moved here from a replica that went down

    @property
    def session(self) -> sess.SessionKey:
        """The client's name for the session, else the fingerprint of the first message. The fingerprint is a
        digest of that message, computed on first use: where no provider is placed by prefix and no profile orders
        by it, that is after the answer went out (the journal's session column), not before (issue 36)."""
        if self._session is None:
            if self.head is None:
                try:
                    self.head = first_message_head(self.canonical, self.ingress)
                except (TypeError, ValueError, AttributeError):  # a shape nobody anticipated: one fingerprint for all
                    self.head = "empty"
            self._session = sess.SessionKey("fp:" + self.head, "fingerprint")
        return self._session

    @property
    def prompt(self) -> Prompt:
        if self._prompt is None:
            self._prompt = segments(self.canonical, self.ingress, self.head)
            self.head = self._prompt.head  # the same digest the session's fingerprint is
        return self._prompt

    @property
    def lane(self) -> str:
        if self._lane is None:
            self._lane, self.lane_why, self.continues = self._lanes.resolve(
                self.prompt, session=self.session.key, named=self.session.source != "fingerprint",
                tools=self.tools, model=self.model)
        return self._lane

    @property
    def lane_label(self) -> str | None:
        return f"lane:{sess.hash_key(self._lane)[:6]}" if self._lane is not None else None

    def note(self) -> dict:
        out: dict[str, object] = {
            "session": self.session.hashed, "session_source": self.session.source, "lane": self.lane_label,
            "slot": self.slot, "predicted_tokens": self.predicted_tokens, "cached_tokens": self.cached_tokens,
            "placement": self.placement_why, "lane_choice": self.lane_why}
        if self.restore is not None:
            out["slot_restore"] = self.restore.as_dict()
        if self.seeded is not None:
            out["seeded"] = self.seeded
        if self.moved is not None:
            out["moved"] = self.moved
        if self.bust is not None:
            out["cache_bust"] = {"segment": self.bust.segment, "cause": self.bust.cause,
                                 "expected_tokens": self.bust.expected_tokens,
                                 "cached_tokens": self.bust.cached_tokens}
        return out


def seed_words(seeded: dict) -> str:
    """"seeded from lane:1a2b3c: 1,112 tokens" (copied from its slot), or "... (placed in its slot)"."""
    who = seeded.get("from_lane") or f"slot {seeded.get('from_slot')}"
    how = "copied" if seeded.get("how") == "copied" else "placed in its slot"
    return f"seeded from {who}: {seeded.get('tokens') or 0:,} tokens ({how})"


@dataclass(slots=True)
class Placement:
    provider: str
    slot: int | None
    predicted_bytes: int | None  # None: not predicted yet (see `place`)
    fields: dict = field(default_factory=dict)
    started: float = 0.0


def keeps_billing_header(cfg: ProviderConfig) -> bool:
    """Only the real Anthropic API reads the billing header; any other upstream (including a local
    Anthropic-compatible server) gets the canonical prompt."""
    return adapter_for(cfg).keeps_billing_header()


def _reported_cache(usage: dict, raw_usage: dict | None, timings: dict | None,
                    upstream_wire: str) -> tuple[int, int, int | None, float | None]:
    """(prompt tokens, cached tokens, processed tokens, prefill seconds) as the backend reports them;
    cached is -1 when the backend does not say (then neither hit ratio nor bust detection use it)."""
    if timings and isinstance(timings.get("cache_n"), int) and isinstance(timings.get("prompt_n"), int):
        cached, processed = timings["cache_n"], timings["prompt_n"]
        ms = timings.get("prompt_ms")
        return cached + processed, cached, processed, (ms / 1000) if isinstance(ms, (int, float)) else None
    prompt = (usage.get("input_tokens") or 0) + (usage.get("cache_read_input_tokens") or 0) + \
        (usage.get("cache_creation_input_tokens") or 0)
    if upstream_wire == "anthropic":
        if "cache_read_input_tokens" in usage:
            cached = usage.get("cache_read_input_tokens") or 0
            return prompt, cached, prompt - cached, None
        return prompt, -1, None, None
    details = (raw_usage or {}).get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        cached = details["cached_tokens"]
        return prompt, cached, prompt - cached, None
    return prompt, -1, None, None


class RequestView(Protocol):
    """What affinity reads of a client's request (routing/request.py's ClientRequest)."""

    ingress: str
    body: dict
    raw: bytes
    headers: dict[str, str]


class AnswerView(Protocol):
    """What affinity learns from an answer: the strategy's usage and, where the wire has them, the upstream's
    own usage and timings (providers/strategy.py)."""

    @property
    def usage(self) -> dict | None: ...

    @property
    def upstream_wire(self) -> str: ...


class Affinity:
    def __init__(self, config: ConfigModel, *, publish: Callable | None = None, persist: Callable | None = None,
                 clock: Callable[[], float] = time.monotonic, servers: ServerDirectory | None = None,
                 in_flight: Callable[[str], int] | None = None) -> None:
        """`in_flight(provider)`: requests in flight there, the upstream's one count (the queue in front of a
        request, and whether a server is idle enough for a background save)."""
        self.index = PrefixIndex()
        if in_flight is not None:
            self.index.in_flight = in_flight
        self.lanes = LaneIndex()  # which lane each request extends (global: a lane's turns may change backend)
        self.publish = publish
        self.persist = persist  # (provider, snapshot) -> None: store.set, written by the store's thread
        self.clock = clock
        # What each server said about itself (kind, slots, context window), shared with the context gate.
        self._own_servers = servers is None  # built here (tests, tools): stopped here too
        self.servers = servers if servers is not None else ServerDirectory(
            timeout_s=config.affinity.probe_timeout_s, clock=clock)
        self._released: dict[tuple[str, int], asyncio.Event] = {}
        self._dirty: set[str] = set()  # providers whose index changed since their last snapshot
        # Slot files: caches that outlive the server (saved before stops and when idle, restored, kept on a
        # budget). `warm` is its name in the daemon (its hooks and views).
        self.warm = self.kvcache = KVCache(self, clock=clock, publish=publish)
        self.configure(config)

    def configure(self, config: ConfigModel) -> None:
        self.cfg: AffinityConfig = config.affinity
        self.kvcache.configure(self.cfg)
        self.canonicaliser = Canonicaliser(self.cfg.strip_patterns)
        # Providers some profile treats as equals (race, adaptive order): `prefer` orders them by what the index
        # predicts they cached, so what they answered is worth remembering even when they report nothing.
        self.compared = frozenset(name for prof in config.profiles.values()
                                  if (prof.mode in ("race", "balance") or prof.adaptive) and len(prof.providers) > 1
                                  for name in prof.providers)

    def restore(self, snapshots: dict[str, dict]) -> None:
        for provider, snap in snapshots.items():
            if isinstance(snap, dict):
                self.index.restore(provider, snap)
                self.kvcache.restore_costs(provider, snap.get("copy_costs"))
                table = self.index.provider(provider).slots
                for slot in table.slots if table is not None else ():
                    if slot.lane is not None:
                        self.lanes.adopt(slot.lane, slot.digests)
                for lane, saved in table.saved.items() if table is not None else ():
                    self.lanes.adopt(lane, saved.digests)

    def server_restarted(self, providers: Iterable[str]) -> None:
        """The process behind these providers started afresh: its KV cache died with its predecessor. Never
        predict it: slots are emptied, the lanes' last prompts there forgotten (no cache bust is named against
        a cache that is gone), and the slot table is discovered again (the new server may have other slots)."""
        for name in providers:
            p = self.index.providers.get(name)
            if p is not None and p.slots is not None:
                p.slots.forget_contents()
            self.index.forget_provider(name)
            self.servers.forget(name)
            self.kvcache.forget((name,))
            self.persist_soon(name)

    # -- per request ----------------------------------------------------------------------------------------

    def ticket(self, req: RequestView, *, prompt_cache_key: str | None = None) -> Ticket | None:
        """`prompt_cache_key`: for an ingress that carries it outside the body it parses (the Responses API
        converted to another shape); it outranks only the prefix fingerprint, as in `session_key`."""
        if not self.cfg.enabled:
            return None
        try:
            canonical = self.canonicaliser.canonical(req.body, req.ingress)
            # Named by the client, or else (None) by the first message's fingerprint, digested when first asked.
            key = sess.named_session_key(req.headers, req.body)
            if key is None and prompt_cache_key:
                key = sess.from_prompt_cache_key(prompt_cache_key)
            model = req.body.get("model")
        except (TypeError, ValueError, AttributeError) as e:
            # A body shape nobody anticipated costs this request its affinity, never the request itself.
            log.debug("no prefix affinity for this request: %s", e)
            return None
        return Ticket(None, key, self.lanes, canonical, req.ingress, tools=bool(req.body.get("tools")),
                      model=model if isinstance(model, str) else None)

    def body_for(self, ticket: Ticket | None, provider: Provider, req: RequestView) -> tuple[dict, bytes]:
        """The client body as this provider should get it: canonical, except for the real Anthropic API."""
        if ticket is None or ticket.canonical is req.body or keeps_billing_header(provider.cfg):
            return req.body, req.raw
        if adapter_for(provider.cfg).wire != "anthropic" or req.ingress != "anthropic":
            # Translating strategies build their body from the dict; only Anthropic passthrough sends raw bytes.
            return ticket.canonical, req.raw
        if ticket.canonical_raw is None:
            ticket.canonical_raw = orjson.dumps(ticket.canonical)
        return ticket.canonical, ticket.canonical_raw

    # -- per attempt ----------------------------------------------------------------------------------------

    async def place(self, ticket: Ticket | None, provider: Provider,
                    follow: Callable[[], Awaitable[dict | None]] | None = None) -> Placement | None:
        """`follow`: a balance profile's lane moving here off a replica that went down (routing/balance.py): it
        moves the lane's saved slot file once this server's key is known, before the slot is chosen, so the turn
        restores it. What it returns (what moved) goes in the request's record."""
        if ticket is None or not provider.cfg.affinity:
            return None
        name = provider.name
        p = self.index.provider(name)
        # The server's answer is nearly always known already: awaited only while a discovery runs (no coroutine
        # per request otherwise).
        running = self.servers.refresh(provider)
        if running is not None:
            await asyncio.shield(running)
        info = self.servers.info(provider)
        table = self._slots(provider, info)
        if table is not None:
            # Once per server instance: which saved states are valid, by its /props as discovery read it.
            await self.kvcache.prepare(provider, table, info.props if info is not None else None)
        moved = await follow() if follow is not None and table is not None else None
        now = self.clock()
        if table is None:
            # No slot to choose: the prediction (for the record) is made in `finish`, after the answer went out.
            return Placement(name, None, None, started=now)
        for _ in range(8):
            own = table.owned(ticket.lane)
            wait_s = max(0.0, p.mean_duration_s - (now - own.busy_since)) if own is not None and own.busy \
                and p.mean_duration_s else MAX_SLOT_WAIT_S
            choice = table.choose(ticket.lane, ticket.prompt, wait_s=wait_s,
                                  s_per_byte=p.s_per_token / p.bytes_per_token, spare=self.lanes.spare,
                                  seed_pays=self._seed_pays(name, p))
            if not choice.wait:
                break
            ev = self._released.setdefault((name, choice.slot), asyncio.Event())
            try:
                await asyncio.wait_for(ev.wait(), timeout=min(MAX_SLOT_WAIT_S, max(1.0, 2 * wait_s)))
            except TimeoutError:
                break
            now = self.clock()
        table.begin(choice.slot, now)
        ticket.restore = None  # an earlier attempt's (another provider's) was recorded at its finish
        if choice.saves or choice.restore:
            try:
                ticket.restore = await self._save_restore(provider, table, choice)
            except asyncio.CancelledError:
                table.finish(choice.slot, ticket.lane, None, self.clock())
                raise
        ticket.placement_why = choice.why
        ticket.moved = moved
        if moved is not None:
            ticket.placement_why += f"; saved slot file moved from {moved['from']} ({moved['tokens']:,} tokens)"
        ticket.seeded = None
        if choice.seeded is not None:
            sid, donor, got = choice.seeded
            # A copy whose save or restore failed seeded nothing (the turn's record shows the failure).
            if choice.restore is None or (ticket.restore is not None and ticket.restore.problem is None):
                ticket.seeded = {"from_lane": f"lane:{sess.hash_key(donor)[:6]}" if donor is not None else None,
                                 "from_slot": sid, "tokens": int(got / p.bytes_per_token),
                                 "how": "copied" if choice.restore is not None else "placed"}
                ticket.placement_why += "; " + seed_words(ticket.seeded)
        return Placement(name, choice.slot, choice.predicted, {"id_slot": choice.slot, "cache_prompt": True},
                         started=now)

    def _seed_pays(self, name: str, p: ProviderPrefixes) -> Callable[[int, int], bool]:
        """Whether copying a slot (save, then restore into another) costs this server less than computing the
        prefix it gives: its measured save and restore times (kvcache/costs.py) against its prefill speed, as its
        `timings` report it (index.py; a laptop's speed until measured). A server whose copies were never timed
        gets one: that is how it is learnt."""

        def pays(gain_bytes: int, donor_bytes: int) -> bool:
            copy_s = self.kvcache.copy_s(name, donor_bytes / p.bytes_per_token)
            return copy_s is None or copy_s < gain_bytes / p.bytes_per_token * p.s_per_token

        return pays

    def unplaced(self, ticket: Ticket | None, provider: Provider) -> Placement | None:
        """For an attempt that was not placed (a race): the prediction only, so the outcome is still learned."""
        if ticket is None or not provider.cfg.affinity:
            return None
        return Placement(provider.name, None, self.index.predict(provider.name, ticket.lane, ticket.prompt),
                         started=self.clock())

    async def _save_restore(self, provider: Provider, table: SlotTable, choice: Choice) -> Restore | None:
        """The choice's saves and restore, through kvcache's one path; what became of the restore."""
        out = await self.kvcache.execute(provider, Intent(
            REQUEST, tuple(choice.saves), (choice.slot, choice.restore) if choice.restore is not None else None))
        if choice.restore is not None and not out.restored:
            # The restore did not happen: the slot holds whatever it held, which we no longer know.
            s = table.slots[choice.slot]
            s.digests, s.ends = (), ()
            choice.predicted = 0
        return out.restore

    def _slots(self, provider: Provider, info: ServerInfo | None) -> SlotTable | None:
        """The backend's slot table, from what its server said (`info`; providers/server_info.py: asked once per
        base_url, again a minute after it did not answer)."""
        n = info.slots if info is not None else 0
        p = self.index.provider(provider.name)
        if not n:
            p.slots = None
            return None
        if p.slots is not None and len(p.slots.slots) == n and p.slots.configured:
            return p.slots  # set up already, with what it learnt since (e.g. that saving is refused)
        if p.slots is None:
            p.slots = SlotTable(n)
        p.slots.resize(n)
        p.slots.configured = True
        p.slots.files.can_save = self.cfg.max_saved_slots > 0
        p.slots.files.max_saved = self.cfg.max_saved_slots
        p.slots.clone_min_bytes = int(self.cfg.clone_min_tokens * p.bytes_per_token)
        return p.slots

    def finish(self, ticket: Ticket | None, placement: Placement | None, provider: Provider, *, ok: bool,
               strategy: AnswerView | None = None, request_id: str = "") -> None:
        """After an attempt (success or failure). Never raises into the request path."""
        if ticket is None or placement is None:
            return
        name = placement.provider
        p = self.index.provider(name)
        now = self.clock()
        table = p.slots
        if placement.slot is not None and table is not None and placement.slot < len(table.slots):
            table.finish(placement.slot, ticket.lane, ticket.prompt if ok else None, now)
            ev = self._released.pop((name, placement.slot), None)
            if ev is not None:
                ev.set()
        if not ok or strategy is None:
            r = ticket.restore
            if r is not None and r.problem is not None and ticket.bust is None:
                ticket.bust = Bust(r.describe(), "slot file", r.tokens, 0)
                self._publish_bust(ticket, name, request_id)
            return
        # What the backend reused teaches the index. Not deferred with the request's record
        # (after_response.py): for a big prompt the digests take longer than the next upstream's answer, and
        # here, right after the answer, the client's next request is still on its way (measured,
        # bench/README.md "Tail and big body").
        self._learn(ticket, placement, p, strategy, request_id, now)

    def _learn(self, ticket: Ticket, placement: Placement, p: ProviderPrefixes, strategy: AnswerView, request_id: str,
               now: float) -> None:
        name = placement.provider
        ticket.slot = placement.slot
        usage = strategy.usage or {}
        prompt_tokens, cached, processed, prefill_s = _reported_cache(
            usage, getattr(strategy, "raw_usage", None), getattr(strategy, "timings", None), strategy.upstream_wire)
        if cached <= 0 and not p.cached_tokens and p.slots is None and name not in self.compared:
            # Nothing could use this prompt's digests: no slot to choose on this backend, no profile that orders
            # it by what it cached, and no cache to check a prediction or name a bust against (it reports no
            # cached tokens, or has never reported one reused: a cache never seen hitting cannot be busted).
            # Digesting a 95 KB prompt costs 150-250 µs of CPU. The lane and session are still recorded, and
            # the hit ratio still counts this prompt; the first answer that reports a hit turns digests on.
            if cached == 0 and prompt_tokens > 0:
                p.prompt_tokens += prompt_tokens
            return
        if placement.predicted_bytes is None:
            placement.predicted_bytes = self.index.predict(name, ticket.lane, ticket.prompt)
        ticket.predicted_tokens = int(placement.predicted_bytes / p.bytes_per_token)
        previous = self.index.last_prompt(ticket.lane)
        if cached >= 0 and prompt_tokens > 0:
            ticket.cached_tokens = cached
            p.learn(prompt_bytes=ticket.prompt.size, prompt_tokens=prompt_tokens, cached_tokens=cached,
                    processed_tokens=processed or 0, prefill_s=prefill_s, duration_s=now - placement.started)
            p.correct(ticket.predicted_tokens, cached)
            if previous is not None and previous[0] == name and ticket.continues:
                ticket.bust = detect(previous[1], ticket.prompt, cached_tokens=cached, previous_tokens=previous[2],
                                     min_tokens=self.cfg.bust_min_tokens)
            r = ticket.restore
            if r is not None and (r.problem is not None or not self.kvcache.prove(
                    name, r, cached_tokens=cached, predicted_tokens=ticket.predicted_tokens)):
                # The saved state did not come back (refused, failed, or accepted and not taken): the turn's
                # loss is the slot file's doing, whatever else differs.
                ticket.bust = Bust(r.describe(), "slot file", r.expected_tokens or r.tokens, cached)
            if ticket.bust is not None:
                self._publish_bust(ticket, name, request_id)
        self.index.remember(ticket.lane, name, ticket.prompt, prompt_tokens if cached >= 0 else 0)
        self.persist_soon(name)

    def _publish_bust(self, ticket: Ticket, name: str, request_id: str) -> None:
        if ticket.bust is not None and self.publish is not None:
            from ..state.events import CacheBust

            b = ticket.bust
            self.publish(CacheBust(request_id=request_id, provider=name, lane=ticket.lane_label or "",
                                   session=ticket.session.hashed, segment=b.segment, cause=b.cause,
                                   expected_tokens=b.expected_tokens, cached_tokens=b.cached_tokens))

    # -- what kvcache reads (kvcache/cache.py Host) -------------------------------------------------------------

    def table(self, name: str) -> SlotTable | None:
        p = self.index.providers.get(name)
        return p.slots if p is not None else None

    def names(self) -> list[str]:
        return list(self.index.providers)

    def in_flight(self, name: str) -> int:
        """The upstream's one in-flight count (what the lease counts), for the idle save's check."""
        return self.index.in_flight(name)

    def persist_soon(self, provider: str) -> None:
        """At most one snapshot per provider per PERSIST_EVERY_S: a snapshot of many slots and saved lanes is
        not free, and the store itself only flushes once a second."""
        if self.persist is None or provider in self._dirty:
            return
        self._dirty.add(provider)
        asyncio.get_running_loop().call_later(PERSIST_EVERY_S, self._persist_now, provider)

    def _persist_now(self, provider: str) -> None:
        if provider in self._dirty and self.persist is not None:
            self._dirty.discard(provider)
            snap = self.index.snapshot(provider)
            costs = self.kvcache.costs_snapshot(provider)  # what a slot copy costs it, learnt (kvcache/costs.py)
            if costs is not None:
                snap["copy_costs"] = costs
            self.persist(provider, snap)

    def flush(self) -> None:
        """Snapshot whatever changed since the last one (at shutdown, before the store closes)."""
        for provider in list(self._dirty):
            self._persist_now(provider)

    async def stop(self) -> None:
        """Shutdown: server discoveries still under way are cancelled and awaited before the pools they use
        close."""
        await self.kvcache.stop()
        if self._own_servers:
            await self.servers.stop()

    # -- choosing among equally acceptable providers ---------------------------------------------------------

    def prefer(self, candidates: list[str], ticket: Ticket | None, enabled: Callable[[str], bool]) -> \
            tuple[list[str], list[dict]]:
        """Stable order by expected time to first token; only for providers a profile treats as equals
        (race, adaptive order, panic), never for a fallback chain."""
        if ticket is None or len(candidates) < 2:
            return candidates, []
        ttft = {c: self.index.expected_ttft_s(c, ticket.lane, ticket.prompt) for c in candidates if enabled(c)}
        if len(ttft) < 2:
            return candidates, []
        order = sorted(candidates, key=lambda c: (ttft.get(c, float("inf")) if c in ttft else float("inf")))
        order = [c for c in order if c in ttft] + [c for c in candidates if c not in ttft]
        if order == candidates:
            return candidates, []
        first = order[0]
        return order, [{"provider": first, "moved": "front",
                        "why": f"prefix affinity: expected time to first token {ttft[first]:.2f}s, best of "
                               + ", ".join(f"{c} {ttft[c]:.2f}s" for c in candidates if c in ttft)}]

    # -- visibility -----------------------------------------------------------------------------------------

    def provider_status(self, name: str) -> dict:
        p = self.index.providers.get(name)
        if p is None:
            return {"prompt_tokens": 0, "cached_tokens": 0, "hit_ratio": None, "slots": None}
        slots = None
        if p.slots is not None:
            slots = {"total": len(p.slots.slots), "busy": sum(1 for s in p.slots.slots if s.busy),
                     "lanes": sum(1 for s in p.slots.slots if s.lane), "saved": len(p.slots.saved),
                     "save_restore": p.slots.can_save, "warm": self.kvcache.status(name)}
        return {"prompt_tokens": p.prompt_tokens, "cached_tokens": p.cached_tokens,
                "hit_ratio": round(p.hit_ratio, 4) if p.hit_ratio is not None else None, "slots": slots,
                "prompt_s_per_token": round(p.s_per_token, 6) if p.measured else None}
