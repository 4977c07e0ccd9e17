"""The hot path pays only for what a request uses (issue 25, item 6): work that cannot change a decision or be
compared later is not done. Each test counts the calls of the costly step, so it fails if the work comes back."""

from __future__ import annotations

import pytest

from coderouterd.affinity import service as aff_service
from coderouterd.affinity.service import Affinity, Placement
from coderouterd.config.schema import ConfigModel
from coderouterd.routing.request import ClientRequest


class _Strategy:
    upstream_wire = "openai"
    raw_usage = None
    timings = None

    def __init__(self, usage: dict, raw_usage: dict | None = None) -> None:
        self.usage = usage
        self.raw_usage = raw_usage


_NO_CACHE_FIGURE = {"input_tokens": 5000, "output_tokens": 5}


def _config(**profiles) -> ConfigModel:
    return ConfigModel.model_validate({
        "providers": {"a": {"base_url": "http://127.0.0.1:9/v1"}, "b": {"base_url": "http://127.0.0.1:8/v1"}},
        "profiles": profiles or {"default": {"providers": ["a", "b"]}}})


def _request() -> ClientRequest:
    body = {"model": "m", "system": "be brief", "messages": [{"role": "user", "content": "hi " * 2000}],
            "tools": [{"name": "t", "input_schema": {"type": "object"}}]}
    return ClientRequest(ingress="anthropic", body=body, raw=b"{}", headers={}, stream=False, model="m",
                         request_id="r")


@pytest.fixture
def digests(monkeypatch):
    """How many times the whole prompt was digested."""
    calls = []
    real = aff_service.segments

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(aff_service, "segments", counting)
    return calls


def _answer(aff: Affinity, provider: str, strategy: _Strategy):
    t = aff.ticket(_request())
    assert t is not None
    aff.finish(t, Placement(provider, None, None), None, ok=True, strategy=strategy)  # type: ignore[arg-type]
    return t


def _cached(n: int) -> _Strategy:
    return _Strategy(_NO_CACHE_FIGURE, {"prompt_tokens_details": {"cached_tokens": n}})


@pytest.mark.parametrize("strategy", [_Strategy(_NO_CACHE_FIGURE), _cached(0)], ids=["no figure", "never a hit"])
def test_no_digest_for_a_backend_without_slots_or_a_cache_seen_hitting_in_a_fallback_chain(digests, strategy):
    aff = Affinity(_config())
    t = _answer(aff, "a", strategy)
    t = _answer(aff, "a", strategy)
    assert digests == []
    assert t.session is not None and t.lane_label is None  # the session is named; no lane: nothing to choose
    assert t.predicted_tokens is None and not aff.index.lanes and t.bust is None


def test_the_hit_ratio_still_counts_a_prompt_that_was_not_digested(digests):
    aff = Affinity(_config())
    _answer(aff, "a", _cached(0))
    assert aff.provider_status("a")["hit_ratio"] == 0.0 and digests == []


def test_digests_from_the_first_reported_hit_on_and_then_a_bust_is_named(digests):
    aff = Affinity(_config())
    _answer(aff, "a", _cached(0))
    assert digests == []
    t = _answer(aff, "a", _cached(4000))
    assert digests == [1] and t.predicted_tokens is not None and aff.index.last_prompt(t.lane) is not None
    t = _answer(aff, "a", _cached(0))  # the same prompt again, nothing reused: compared with the last one
    assert digests == [1, 1] and t.bust is not None


@pytest.mark.parametrize("profile", [{"providers": ["a", "b"], "mode": "race"},
                                     {"providers": ["a", "b"], "adaptive": True}])
def test_digests_when_a_profile_orders_the_provider_by_what_it_cached(digests, profile):
    aff = Affinity(_config(default={"providers": ["a"]}, equals=profile))
    _answer(aff, "a", _Strategy(_NO_CACHE_FIGURE))
    assert digests == [1]


def test_a_reload_that_adds_a_race_profile_turns_digests_on(digests):
    aff = Affinity(_config())
    _answer(aff, "b", _Strategy(_NO_CACHE_FIGURE))
    assert digests == []
    aff.configure(_config(default={"providers": ["a", "b"], "mode": "race"}))
    _answer(aff, "b", _Strategy(_NO_CACHE_FIGURE))
    assert digests == [1]


def test_a_single_provider_race_is_no_choice(digests):
    aff = Affinity(_config(default={"providers": ["a"], "mode": "race"}))
    _answer(aff, "a", _Strategy(_NO_CACHE_FIGURE))
    assert digests == []


def test_session_digests_are_remembered_within_bounds(monkeypatch):
    from coderouterd.affinity import session as sess

    monkeypatch.setattr(sess, "_HASHED", {})
    monkeypatch.setattr(sess, "_HASHED_MAX", 3)
    calls = []
    real = sess.hashlib.blake2b

    def counting(*a, **kw):
        calls.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(sess.hashlib, "blake2b", counting)
    first = sess.hash_key("s:abc")
    assert [sess.hash_key("s:abc") for _ in range(4)] == [first] * 4 and len(calls) == 1
    long = "x" * (sess._HASHED_KEY_MAX + 1)
    sess.hash_key(long)
    sess.hash_key(long)
    assert len(calls) == 3 and long not in sess._HASHED
    for k in ("a", "b", "c", "d"):
        sess.hash_key(k)
    assert len(sess._HASHED) <= 3
