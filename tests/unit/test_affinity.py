"""Prefix affinity's pure parts: session keys, lanes, canonical prompt, segment hashes, slot choice,
cache-bust naming, the index, and the provider preference by expected time to first token."""

from __future__ import annotations

import copy
import hashlib
from types import SimpleNamespace

import orjson
import pytest

from coderouterd.affinity import session as sess
from coderouterd.affinity.bust import detect, first_difference
from coderouterd.affinity.canonical import Canonicaliser, common_prefix, first_message_head, segments
from coderouterd.affinity.index import PrefixIndex
from coderouterd.affinity.service import Affinity, _reported_cache, keeps_billing_header
from coderouterd.affinity.slots import SlotTable
from coderouterd.config.schema import AffinityConfig, ProviderConfig
from coderouterd.providers.call import merge_fields
from coderouterd.routing.request import ClientRequest
from tests.support.claude_sessions import Session

SID = "0b7a4c1e-2f7d-4a8e-9c1b-3d2e1f0a9b8c"


# -- session key and lanes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("headers,body,expected,source", [
    ({"x-claude-code-session-id": SID}, {}, "s:" + SID, "header"),
    ({}, {"metadata": {"user_id": '{"device_id":"ab","account_uuid":"","session_id":"' + SID + '"}'}},
     "s:" + SID, "metadata"),
    ({}, {"metadata": {"user_id": f"user_{'a' * 64}_account_acc-1_session_{SID}"}}, "s:" + SID, "metadata"),
    ({"session-id": "abc"}, {}, "s:abc", "header"),
    ({"session_id": "abc"}, {}, "s:abc", "header"),
    ({}, {"prompt_cache_key": "repo-7"}, "pck:repo-7", "prompt_cache_key"),
    ({}, {"metadata": {"user_id": "plain-user"}}, "fp:fingerprint", "fingerprint"),
    ({}, {"metadata": {"user_id": "{not json"}}, "fp:fingerprint", "fingerprint"),
])
def test_session_key_sources_in_order(headers, body, expected, source):
    key = sess.session_key(headers, body, "fingerprint")
    assert (key.key, key.source) == (expected, source)
    assert SID not in key.hashed and len(key.hashed) == 12


def test_header_wins_over_metadata_and_prompt_cache_key():
    body = {"metadata": {"user_id": '{"session_id":"other"}'}, "prompt_cache_key": "k"}
    assert sess.session_key({"x-claude-code-session-id": SID}, body, "f").key == "s:" + SID
    assert sess.session_key({"session-id": "h"}, body, "f").key == "s:other"
    assert sess.from_prompt_cache_key("k").key == "pck:k" and sess.from_prompt_cache_key("") is None


def test_subagents_get_lanes_of_their_own():
    from coderouterd.affinity.lanes import LaneIndex

    s = Session(1)
    main = Canonicaliser().anthropic(s.main_body())
    idx = LaneIndex()

    def lane(body):
        return idx.resolve(segments(body, "anthropic"), session=s.id, named=True, tools=True, model="m")[0]

    lane_main = lane(main)
    sub = copy.deepcopy(main)
    sub["messages"] = [{"role": "user", "content": "Explore the repository and report"}]
    assert lane(sub) != lane_main
    # The same conversation one turn later stays in its lane.
    s.advance()
    assert lane(Canonicaliser().anthropic(s.main_body())) == lane_main


# -- canonical prompt ----------------------------------------------------------------------------------------

def test_billing_header_removed_and_nothing_else_changes():
    s = Session(2)
    a, b = s.main_body(), s.main_body()
    assert a["system"][0]["text"] != b["system"][0]["text"]  # cch differs per request
    canon = Canonicaliser()
    ca, cb = canon.anthropic(a), canon.anthropic(b)
    assert ca["system"] == cb["system"] == a["system"][1:]
    assert ca["messages"] is a["messages"] and ca["tools"] is a["tools"]
    assert segments(ca, "anthropic").digests == segments(cb, "anthropic").digests
    assert a["system"][0]["text"].startswith("x-anthropic-billing-header")  # the client's body is untouched


def test_body_without_noise_is_returned_as_is_and_patterns_are_configurable():
    body = {"system": "stable prompt\nDate: 2026-11-30 18:00", "messages": []}
    assert Canonicaliser().anthropic(body) is body
    cleaned = Canonicaliser([r"^Date: .*$"]).anthropic(body)
    assert cleaned["system"] == "stable prompt"
    oa = {"messages": [{"role": "system", "content": "x-anthropic-billing-header: cch=1;\nrules"},
                       {"role": "user", "content": "hi"}]}
    assert Canonicaliser().openai(oa)["messages"][0]["content"] == "rules"


def test_only_the_real_anthropic_api_keeps_the_billing_header():
    def cfg(kind, url):
        return ProviderConfig(kind=kind, base_url=url)
    assert keeps_billing_header(cfg("anthropic", "https://api.anthropic.com/v1"))
    assert not keeps_billing_header(cfg("anthropic", "http://127.0.0.1:8080/v1"))  # local Anthropic-compatible
    assert not keeps_billing_header(cfg("openai", "https://api.anthropic.com/v1"))
    assert not keeps_billing_header(cfg("anthropic", "https://anthropic.com.evil.example/v1"))


def test_segments_ignore_cache_control_and_chain():
    s = Session(3)
    b1 = Canonicaliser().anthropic(s.main_body())
    p1 = segments(b1, "anthropic")
    # The order a chat template renders them in: the system prompt, the tools, the messages.
    assert p1.whole.labels[:4] == ("system[0]", "system[1]", "tools", "message 0") and p1.whole.lead == 3
    # Long segments are cut finer, each piece named as its segment: system[1] (6 KB) is two, the tools many.
    assert p1.labels[:4] == ("system[0]", "system[1]", "system[1]", "tools") and p1.lead == p1.labels.index("message 0")
    s.advance()
    p2 = segments(Canonicaliser().anthropic(s.main_body()), "anthropic")
    # cache_control moved from message 0's last block to the new last message: the old prefix still matches.
    assert common_prefix(p1.digests, p2.digests) == len(p1.digests)
    assert p2.ends[-1] > p1.ends[-1] and p2.upto(len(p1.digests)) == p1.size


def test_openai_segments_name_system_messages():
    body = {"tools": [{"type": "function", "function": {"name": "f"}}],
            "messages": [{"role": "system", "content": "a"}, {"role": "user", "content": "b"},
                         {"role": "system", "content": "c"}]}
    p = segments(body, "openai")
    assert p.labels == ("system[0]", "tools", "message 1", "message 2") and p.lead == 2
    assert segments({"messages": body["messages"]}, "openai").lead == 1


def test_merge_fields_adds_top_level_keys():
    body = orjson.dumps({"model": "m", "messages": []})
    merged = orjson.loads(merge_fields(body, {"id_slot": 2, "cache_prompt": True}))
    assert merged == {"model": "m", "messages": [], "id_slot": 2, "cache_prompt": True}
    assert orjson.loads(merge_fields(b"{}", {"a": 1})) == {"a": 1}
    assert merge_fields(body, {}) is body


# -- slot choice -----------------------------------------------------------------------------------------------

def _prompts(session: Session, n: int):
    canon = Canonicaliser()
    out = []
    for _ in range(n):
        out.append(segments(canon.anthropic(session.main_body()), "anthropic"))
        session.advance()
    return out


def test_each_lane_keeps_its_slot_and_a_new_lane_takes_a_free_one():
    t = SlotTable(3)
    a, b = _prompts(Session(10), 3), _prompts(Session(11), 2)
    c1 = t.choose("A", a[0])
    t.begin(c1.slot, 1.0)
    t.finish(c1.slot, "A", a[0], 2.0)
    c2 = t.choose("B", b[0])
    assert c2.slot != c1.slot and c2.evicted is None  # not the slot holding A's history
    t.begin(c2.slot, 3.0)
    t.finish(c2.slot, "B", b[0], 4.0)
    c3 = t.choose("A", a[1])
    assert c3.slot == c1.slot and c3.predicted == a[1].upto(len(a[0].digests))


def test_lanes_beyond_slots_evict_lru_with_save_and_restore_on_return():
    t = SlotTable(1, can_save=True)
    a, b = _prompts(Session(12), 2), _prompts(Session(13), 1)
    c = t.choose("A", a[0])
    t.finish(c.slot, "A", a[0], 1.0)
    c = t.choose("B", b[0])
    assert c.evicted == "A" and c.saves and c.saves[0][0] == 0
    saved_name = c.saves[0][1]
    t.finish(c.slot, "B", b[0], 2.0)
    back = t.choose("A", a[1])
    assert back.restore == saved_name and back.predicted == a[1].upto(len(a[0].digests))
    assert back.evicted == "B"


def test_without_save_path_an_evicted_lane_just_starts_over():
    t = SlotTable(1, can_save=False)
    a, b = _prompts(Session(14), 2), _prompts(Session(15), 1)
    t.finish(t.choose("A", a[0]).slot, "A", a[0], 1.0)
    c = t.choose("B", b[0])
    assert c.saves == [] and c.restore is None
    t.finish(c.slot, "B", b[0], 2.0)
    assert t.choose("A", a[1]).restore is None


def test_new_lane_copies_the_shared_prefix_when_it_can():
    t = SlotTable(2, can_save=True, clone_min_bytes=1000)
    a = _prompts(Session(16), 1)
    t.finish(t.choose("A", a[0]).slot, "A", a[0], 1.0)
    b = _prompts(Session(17), 1)
    c = t.choose("B", b[0])
    assert c.restore is not None and c.saves == [(0, c.restore)] and c.slot == 1
    assert c.predicted > 50_000  # tools + system shared by every session


def test_busy_own_slot_waits_only_when_cheaper_than_moving():
    t = SlotTable(2)
    a = _prompts(Session(18), 2)
    t.finish(t.choose("A", a[0]).slot, "A", a[0], 1.0)
    t.begin(0, 2.0)  # A's slot busy (a parallel request of the same lane)
    slow_prefill = t.choose("A", a[1], wait_s=1.0, s_per_byte=1e-3)
    assert slow_prefill.wait and slow_prefill.slot == 0
    fast_prefill = t.choose("A", a[1], wait_s=60.0, s_per_byte=1e-9)
    assert not fast_prefill.wait and fast_prefill.slot == 1


def test_slot_table_snapshot_round_trip():
    t = SlotTable(2, can_save=True)
    a = _prompts(Session(19), 1)
    t.finish(t.choose("A", a[0]).slot, "A", a[0], 5.0)
    snap = orjson.loads(orjson.dumps(t.snapshot()))
    u = SlotTable(2)
    u.restore(snap)
    assert u.owned("A") is not None and u.owned("A").digests == a[0].digests
    u.restore({"slots": [{"digests": ["zz"]}]})  # damaged: forgotten, not fatal
    assert u.owned("A") is None


# -- cache-bust naming -------------------------------------------------------------------------------------------

def _two_turns(mutate):
    s = Session(20)
    canon = Canonicaliser()
    s.advance()
    s.advance()
    prev = segments(canon.anthropic(s.main_body()), "anthropic")
    s.advance()
    mutate(s)
    return prev, segments(canon.anthropic(s.main_body()), "anthropic")


def test_bust_names_system_prompt_tools_and_old_message():
    def system(s):
        s.system_extra = " Today is Monday."

    def tools(s):
        s.tools = list(reversed(s.tools))

    def old_message(s):
        s.messages[4] = {"role": "assistant", "content": [{"type": "text", "text": "rewritten"}]}

    assert first_difference(*_two_turns(system)) == "system[1] changed"
    assert first_difference(*_two_turns(tools)) == "tools changed"
    assert first_difference(*_two_turns(old_message)) == "message 4 rewritten"
    assert first_difference(*_two_turns(lambda s: None)) is None


def test_bust_only_when_far_below_expected():
    prev, cur = _two_turns(lambda s: None)
    assert detect(prev, cur, cached_tokens=9_500, previous_tokens=10_000, min_tokens=100) is None
    backend = detect(prev, cur, cached_tokens=5, previous_tokens=10_000, min_tokens=100)
    assert backend is not None and backend.cause == "backend" and backend.expected_tokens == 10_000
    prev2, cur2 = _two_turns(lambda s: setattr(s, "tools", s.tools[:-1]))
    b = detect(prev2, cur2, cached_tokens=0, previous_tokens=10_000, min_tokens=100)
    assert b is not None and (b.segment, b.cause) == ("tools changed", "request")
    # Small losses are noise, however large in share; unknown counts never fire.
    assert detect(prev2, cur2, cached_tokens=0, previous_tokens=90, min_tokens=100) is None
    assert detect(prev2, cur2, cached_tokens=0, previous_tokens=0, min_tokens=100) is None
    assert detect(None, cur, cached_tokens=0, previous_tokens=10_000, min_tokens=100) is None


# -- what backends report; the index; preference ------------------------------------------------------------------

def test_reported_cache_reads_every_backend_shape():
    assert _reported_cache({}, None, {"cache_n": 900, "prompt_n": 100, "prompt_ms": 50.0}, "openai") == \
        (1000, 900, 100, 0.05)
    usage = {"input_tokens": 100, "cache_read_input_tokens": 900}
    assert _reported_cache(usage, {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 900}}, None,
                           "openai")[:2] == (1000, 900)
    assert _reported_cache({"input_tokens": 10, "cache_read_input_tokens": 0}, {"prompt_tokens": 10}, None,
                           "openai")[1] == -1  # an OpenAI-wire backend that does not say
    assert _reported_cache({"input_tokens": 10, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 0},
                           None, None, "anthropic")[:2] == (15, 5)


def test_index_predicts_and_prefers_the_backend_holding_the_prefix():
    idx = PrefixIndex()
    a = _prompts(Session(21), 2)
    idx.remember("A", "warm", a[0])
    assert idx.predict("warm", "A", a[1]) == a[1].upto(len(a[0].digests))
    assert idx.predict("cold", "A", a[1]) == 0
    assert idx.expected_ttft_s("warm", "A", a[1]) < idx.expected_ttft_s("cold", "A", a[1])
    # A backend that reports none of the predicted reuse stops looking warm.
    before = idx.expected_ttft_s("warm", "A", a[1])
    for _ in range(10):
        idx.provider("warm").correct(10_000, 0)
    assert idx.expected_ttft_s("warm", "A", a[1]) > 5 * before
    snap = orjson.loads(orjson.dumps(idx.snapshot("warm")))
    other = PrefixIndex()
    other.restore("warm", snap)
    assert other.provider("warm").bytes_per_token == idx.provider("warm").bytes_per_token
    assert other.provider("warm").realised == idx.provider("warm").realised < 0.2


def test_prefer_reorders_equals_and_leaves_a_single_candidate_alone():
    from coderouterd.affinity.service import Affinity
    from coderouterd.config.schema import ConfigModel

    cfg = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://x"}},
                                      "profiles": {"default": {"providers": ["p"]}}})
    aff = Affinity(cfg)
    s = Session(22)

    class Req:
        ingress = "anthropic"
        headers = s.headers
        body = s.main_body()
        raw = b""

    t = aff.ticket(Req())
    aff.index.remember(t.lane, "warm", t.prompt)
    order, notes = aff.prefer(["cold", "warm"], t, lambda n: True)
    assert order == ["warm", "cold"] and notes[0]["moved"] == "front"
    assert aff.prefer(["cold"], t, lambda n: True) == (["cold"], [])
    assert aff.prefer(["cold", "warm"], t, lambda n: n != "warm") == (["cold", "warm"], [])


def test_cache_control_anywhere_hashes_like_none():
    plain = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    marked_last = {"role": "user", "content": [{"type": "text", "text": "a"},
                                               {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]}
    marked_first = {"role": "user", "content": [{"cache_control": {"type": "ephemeral", "ttl": "1h"}, "type": "text",
                                                 "text": "a"}, {"type": "text", "text": "b"}]}
    digests = {segments({"messages": [m]}, "anthropic").digests for m in (plain, marked_last, marked_first)}
    assert len(digests) == 1


def test_ollama_reload_risk_warns_for_profiles_switching_models_on_one_server():
    from coderouterd.affinity.ollama import reload_risks
    from coderouterd.config import parse_config_text

    cfg = parse_config_text("""
[server]
default_profile = "mixed"
[providers.small]
kind = "ollama"
base_url = "http://127.0.0.1:11434"
model = "qwen3:8b"
[providers.big]
kind = "ollama"
base_url = "http://127.0.0.1:11434"
model = "qwen3:30b"
[providers.other]
kind = "ollama"
base_url = "http://127.0.0.1:11435"
model = "qwen3:30b"
[profiles.mixed]
providers = ["small", "big"]
mode = "race"
[profiles.fine]
providers = ["big", "other"]
""", "t")
    warnings = reload_risks(cfg)
    assert len(warnings) == 1 and "'mixed' races" in warnings[0] and "small (qwen3:8b)" in warnings[0]


def test_responses_bodies_segment_and_prompt_cache_key_names_the_session():
    from coderouterd.affinity.service import Affinity
    from coderouterd.config.schema import ConfigModel

    body = {"model": "gpt", "instructions": "be brief", "prompt_cache_key": "repo-1",
            "input": [{"role": "user", "content": "hi"}, {"type": "function_call_output", "output": "x"}]}
    p = segments(body, "responses")
    assert p.labels == ("system[0]", "message 0", "message 1")
    cfg = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://x"}},
                                      "profiles": {"default": {"providers": ["p"]}}})

    class Req:
        ingress = "responses"
        headers: dict = {}
        raw = b""

    Req.body = body
    assert Affinity(cfg).ticket(Req()).session.key == "pck:repo-1"
    Req.body = {k: v for k, v in body.items() if k != "prompt_cache_key"}
    assert Affinity(cfg).ticket(Req(), prompt_cache_key="repo-2").session.key == "pck:repo-2"
    assert Affinity(cfg).ticket(Req()).session.source == "fingerprint"


def test_a_fingerprint_session_digests_its_first_message_only_when_asked():
    """Issue 36: a request whose client names no session is named by a digest of its first message; nothing
    before the answer needs it unless a provider is placed by prefix, so the ticket computes it on first use,
    and it is the digest the prompt's segments name (one digest, whichever is asked first)."""
    from coderouterd.affinity.canonical import first_message_head
    from coderouterd.affinity.service import Affinity
    from coderouterd.config.schema import ConfigModel

    cfg = ConfigModel.model_validate({"providers": {"p": {"base_url": "http://x"}},
                                      "profiles": {"default": {"providers": ["p"]}}})

    class Req:
        ingress = "anthropic"
        headers: dict = {}
        raw = b""
        body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "first"},
                                                            {"role": "assistant", "content": "ok"},
                                                            {"role": "user", "content": "second"}]}

    t = Affinity(cfg).ticket(Req())
    assert t.head is None  # not digested yet
    assert t.session == sess.SessionKey("fp:" + first_message_head(t.canonical, "anthropic"), "fingerprint")
    t2 = Affinity(cfg).ticket(Req())
    assert t2.prompt.head == t2.head and t2.session == t.session
    named = Affinity(cfg).ticket(type("R", (Req,), {"headers": {"x-claude-code-session-id": "abc"}})())
    assert named.session.key == "s:abc" and named.head is None


def test_managed_llama_server_gets_a_slot_save_path_unless_it_has_one(tmp_path, monkeypatch):
    from coderouterd.config import parse_config_text
    from coderouterd.servers.llamacpp import with_slot_save_path
    from coderouterd.supervise.from_config import specs_from_config

    d = tmp_path / "slots"
    assert with_slot_save_path(["/opt/bin/llama-server", "-m", "x.gguf"], d) == \
        ["/opt/bin/llama-server", "-m", "x.gguf", "--slot-save-path", str(d)]
    assert with_slot_save_path(["llama-server", "--slot-save-path=/mine"], d) == \
        ["llama-server", "--slot-save-path=/mine"]
    assert with_slot_save_path(["ollama", "serve"], d) == ["ollama", "serve"]

    monkeypatch.setenv("CODEROUTER_STATE_DIR", str(tmp_path))
    text = """
[providers.l]
base_url = "http://127.0.0.1:8080/v1"
process = { command = ["llama-server", "-m", "m.gguf"] }
[profiles.default]
providers = ["l"]
"""
    spec, _ = specs_from_config(parse_config_text(text, "t"))["l"]
    assert spec.command[-2:] == ["--slot-save-path", str(tmp_path / "slots")]
    off = parse_config_text(text + "[affinity]\nmanage_slot_save = false\n", "t")
    assert specs_from_config(off)["l"][0].command == ["llama-server", "-m", "m.gguf"]


def test_saved_slot_files_come_from_a_bounded_pool():
    t = SlotTable(1, can_save=True, max_saved=2, clone_min_bytes=10**9)
    prompts = {lane: _prompts(Session(30 + i), 1)[0] for i, lane in enumerate("ABCDE")}
    files = []
    for lane in "ABCDE":
        c = t.choose(lane, prompts[lane])
        files += [f for _, f in c.saves]
        t.finish(c.slot, lane, prompts[lane], float(len(files)))
    assert len(set(files)) == 2 and list(t.saved) == ["C", "D"]  # A and B's files were reused
    assert t.saved["C"].filename != t.saved["D"].filename


def test_a_moved_lane_does_not_take_back_its_old_slot():
    t = SlotTable(3)
    a = _prompts(Session(35), 2)
    t.finish(t.choose("A", a[0]).slot, "A", a[0], 1.0)
    t.begin(0, 2.0)
    moved = t.choose("A", a[1], wait_s=100.0, s_per_byte=0.0)
    assert not moved.wait and moved.slot != 0
    t.begin(moved.slot, 3.0)
    t.finish(0, "A", a[0], 4.0)  # the earlier request on the old slot ends
    assert [s.id for s in t.slots if s.lane == "A"] == [moved.slot]


# -- the lane's name without the whole chain ------------------------------------------------------------------

_HI = {"role": "user", "content": "hi"}
_C = {"role": "user", "content": "c"}
_ITEM = {"type": "message", "role": "user", "content": "x"}


@pytest.mark.parametrize("ingress,body,first", [
    ("anthropic", {"system": "s", "messages": [_HI, {"role": "assistant", "content": "x"}]}, _HI),
    ("anthropic", {"system": "s", "messages": []}, None),
    ("anthropic", {"messages": ["not a dict"]}, "not a dict"),
    ("openai", {"messages": [{"role": "system", "content": "a"}, {"role": "developer", "content": "b"}, _C,
                             {"role": "system", "content": "late"}]}, _C),
    ("openai", {"messages": [{"role": "system", "content": "only"}]}, None),
    ("openai", {"input": [_ITEM], "instructions": "i"}, _ITEM),
    ("openai", {"input": "just text"}, "just text"),
    ("openai", {"input": None}, "null"),
    ("openai", {"input": []}, None),
    ("openai", {}, None),
])
def test_the_head_is_the_first_message_after_the_leading_system_ones(ingress, body, first):
    """`first_message_head` names a lane; `segments` reports the same head with its chain."""
    expected = "empty" if first is None else \
        hashlib.sha256(b"null" if first == "null" else orjson.dumps(first)).hexdigest()[:12]
    assert first_message_head(body, ingress) == expected
    assert segments(body, ingress).head == expected


def test_the_prompt_chain_is_only_computed_when_asked():
    aff = Affinity(SimpleNamespace(affinity=AffinityConfig(), profiles={}))
    req = ClientRequest(ingress="anthropic", body={"messages": [{"role": "user", "content": "hi"}], "tools": []},
                        raw=b"{}", headers={}, stream=False, model="m", request_id="r")
    t = aff.ticket(req)
    assert t._prompt is None
    assert t.prompt == segments(req.body, "anthropic") and t._prompt is not None


def test_a_lane_whose_own_slot_lost_its_contents_copies_the_shared_prefix_from_another_slot():
    def prompt(s: Session):
        return segments(Canonicaliser().anthropic(s.main_body()), "anthropic")

    a, b = Session(1), Session(2)  # same system prompt and tools, different conversations
    t = SlotTable(2, can_save=True, clone_min_bytes=1024)
    for lane, s in (("A", a), ("B", b)):
        c = t.choose(lane, prompt(s))
        t.begin(c.slot, 1.0)
        t.finish(c.slot, lane, prompt(s), 2.0)
    own_a = t.owned("A").id
    t.forget_contents()  # the server restarted: both slots empty, lanes keep their pins
    c = t.choose("B", prompt(b))
    assert c.slot == t.owned("B").id and c.restore is None and c.predicted == 0  # nothing anywhere to copy
    t.begin(c.slot, 3.0)
    t.finish(c.slot, "B", prompt(b), 4.0)
    a.advance()
    c = t.choose("A", prompt(a))
    assert c.slot == own_a and c.restore is not None and c.saves == [(t.owned("B").id, c.restore)]
    assert c.predicted >= len(Canonicaliser().anthropic(a.main_body())["system"][1]["text"])  # at least the system
    assert "copied the shared prefix" in c.why


def test_a_prompt_whose_bytes_the_template_never_rendered_does_not_teach_the_token_ratio():
    """SmolLM2's template drops tool schemas: 40 KB of them came back as 20-odd prompt tokens, and that one sample
    made every later prediction on the server near zero (a warm turn predicted 4 tokens and reused 146)."""
    idx = PrefixIndex()
    p = idx.provider("local")
    for _ in range(5):
        p.learn(prompt_bytes=4_000, prompt_tokens=1_000, cached_tokens=0, processed_tokens=1_000, prefill_s=None,
                duration_s=1.0)
    steady = p.bytes_per_token
    p.learn(prompt_bytes=40_000, prompt_tokens=25, cached_tokens=0, processed_tokens=25, prefill_s=None,
            duration_s=1.0)
    assert p.bytes_per_token == steady
    p.learn(prompt_bytes=6_000, prompt_tokens=1_000, cached_tokens=0, processed_tokens=1_000, prefill_s=None,
            duration_s=1.0)
    assert p.bytes_per_token > steady  # plausible samples still teach it
