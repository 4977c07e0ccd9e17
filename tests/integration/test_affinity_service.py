"""Prefix affinity's I/O against fakes on real loopback sockets: slot discovery, save/restore, and what
happens when the server cannot save or exposes no slot API."""

from __future__ import annotations

import asyncio

from coderouterd.affinity.canonical import Canonicaliser
from coderouterd.affinity.service import Affinity
from coderouterd.config import parse_config_text
from coderouterd.providers.provider import Provider
from coderouterd.routing.request import ClientRequest
from tests.fakes.runner import FakeServer
from tests.support.claude_sessions import Session

CFG = """
[providers.p]
kind = "openai"
base_url = "%s/v1"
[profiles.default]
providers = ["p"]
"""


class _Done:
    """What `finish` reads from a strategy: a backend that reported its whole prompt cached."""

    upstream_wire = "openai"
    usage = {"input_tokens": 10, "cache_read_input_tokens": 0}
    raw_usage = None
    timings = None


def _req(s: Session) -> ClientRequest:
    body = s.main_body()
    return ClientRequest(ingress="anthropic", body=body, raw=b"", headers=s.headers, stream=False,
                         model=body["model"], request_id="r")


def _run(fake: FakeServer, scenario):
    cfg = parse_config_text(CFG % fake.url, "t")
    aff = Affinity(cfg)
    provider = Provider("p", cfg.providers["p"])

    async def go():
        try:
            return await scenario(aff, provider)
        finally:
            await provider.close()

    return asyncio.run(go())


def test_slots_discovered_and_evicted_lane_saved_then_restored():
    async def scenario(aff, provider):
        a, b = Session(1), Session(2)
        ta = aff.ticket(_req(a))
        pa = await aff.place(ta, provider)
        aff.finish(ta, pa, provider, ok=True, strategy=_Done())
        tb = aff.ticket(_req(b))
        pb = await aff.place(tb, provider)  # one slot: A is saved first
        aff.finish(tb, pb, provider, ok=True, strategy=_Done())
        a.advance()
        ta2 = aff.ticket(_req(a))
        pa2 = await aff.place(ta2, provider)  # A back: B saved, A restored
        return pa, pb, pa2, ta2

    with FakeServer("llamacpp", n_slots=1, slot_save=True) as fake:
        pa, pb, pa2, ta2 = _run(fake, scenario)
        assert pa.fields == {"id_slot": 0, "cache_prompt": True}
        assert [a for a, _, _ in fake.fake.slot_actions] == ["save", "save", "restore"]
        assert fake.fake.slot_actions[2][2] == fake.fake.slot_actions[0][2]  # A's own file came back
        assert pa2.predicted_bytes > 0.8 * ta2.prompt.size and "restored" in ta2.placement_why
        assert fake.count("/props") == 1 and fake.count("/slots") == 1


def test_server_without_save_path_falls_back_to_plain_eviction():
    async def scenario(aff, provider):
        a, b = Session(3), Session(4)
        for s in (a, b, a):
            t = aff.ticket(_req(s))
            p = await aff.place(t, provider)
            aff.finish(t, p, provider, ok=True, strategy=_Done())
            s.advance()
        return aff.index.provider("p").slots

    with FakeServer("llamacpp", n_slots=1, slot_save=False) as fake:
        table = _run(fake, scenario)
        assert table.can_save is False and table.saved == {}
        # One refused save taught it; no further attempts.
        assert [r["path"] for r in fake.requests if r["method"] == "POST" and r["path"].startswith("/slots")] \
            == ["/slots/0"]


def test_server_without_slot_api_is_left_to_choose():
    async def scenario(aff, provider):
        t = aff.ticket(_req(Session(5)))
        return await aff.place(t, provider)

    with FakeServer("openai") as fake:  # has /props, no /slots: not llama-server's slot API
        placement = _run(fake, scenario)
        assert placement.slot is None and placement.fields == {}


def test_same_lane_waits_for_its_busy_slot_when_cheaper_than_moving():
    async def scenario(aff, provider):
        s = Session(6)
        t1 = aff.ticket(_req(s))
        p1 = await aff.place(t1, provider)
        aff.finish(t1, p1, provider, ok=True, strategy=_Done())
        aff.index.provider("p").mean_duration_s = 0.2
        aff.index.provider("p").s_per_token = 1.0  # prefill is very slow: waiting pays
        t2 = aff.ticket(_req(s))
        p2 = await aff.place(t2, provider)  # the lane's slot is now busy with t2
        t3 = aff.ticket(_req(s))
        waiter = asyncio.ensure_future(aff.place(t3, provider))
        await asyncio.sleep(0.05)
        assert not waiter.done()
        aff.finish(t2, p2, provider, ok=True, strategy=_Done())
        p3 = await asyncio.wait_for(waiter, 5)
        return p1, p3

    with FakeServer("llamacpp", n_slots=2) as fake:
        p1, p3 = _run(fake, scenario)
        assert p3.slot == p1.slot


def test_canonical_body_goes_upstream_but_not_to_the_real_anthropic_api():
    cfg = parse_config_text(CFG % "http://127.0.0.1:1" + """
[providers.cloud]
kind = "anthropic"
base_url = "https://api.anthropic.com/v1"
[providers.local-anthropic]
kind = "anthropic"
base_url = "http://127.0.0.1:2/v1"
""", "t")
    aff = Affinity(cfg)
    req = _req(Session(7))
    t = aff.ticket(req)
    local_body, local_raw = aff.body_for(t, Provider("x", cfg.providers["local-anthropic"]), req)
    assert local_body == Canonicaliser().anthropic(req.body) and b"billing" not in local_raw
    assert aff.body_for(t, Provider("c", cfg.providers["cloud"]), req) == (req.body, req.raw)


def test_affinity_false_on_a_provider_turns_it_off():
    with FakeServer("llamacpp", n_slots=2) as fake:
        cfg = parse_config_text((CFG % fake.url).replace('kind = "openai"', 'kind = "openai"\naffinity = false'), "t")
        aff = Affinity(cfg)
        provider = Provider("p", cfg.providers["p"])

        async def go():
            try:
                return await aff.place(aff.ticket(_req(Session(8))), provider)
            finally:
                await provider.close()

        assert asyncio.run(go()) is None
        assert fake.count("/props") == 0


def test_a_restarted_server_is_never_predicted_to_hold_its_predecessors_cache():
    async def scenario(aff, provider):
        a = Session(1)
        ta = aff.ticket(_req(a))
        pa = await aff.place(ta, provider)
        aff.finish(ta, pa, provider, ok=True, strategy=_Done())
        a.advance()
        warm = aff.index.predict("p", ta.lane, aff.ticket(_req(a)).prompt)
        aff.server_restarted(["p"])  # the supervisor started the process afresh
        a.advance()
        t2 = aff.ticket(_req(a))
        cold = aff.index.predict("p", t2.lane, t2.prompt)
        p2 = await aff.place(t2, provider)
        return warm, cold, p2, aff.index.last_prompt(t2.lane)

    with FakeServer("llamacpp", n_slots=2) as fake:
        warm, cold, p2, last = _run(fake, scenario)
        assert warm > 1000 and cold == 0 and p2.predicted_bytes == 0
        assert p2.slot == 0  # the lane keeps its slot: a pin costs nothing
        assert last is None  # no cache bust is named against a cache that died
        assert fake.count("/props") == 2  # slots discovered again: the new server may have others
