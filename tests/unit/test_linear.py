"""Request transformations are linear in the request (issue 23, item 5), and the linear versions say exactly
what the ones they replace said.

Timing: each path of bench/linear.py at 1x, 10x and 100x a size; each 10x step may cost at most 30x (a
quadratic path costs 100x per step, as it did: 8,000 namespace tools took 58 s, 200,000 merged messages 29 s).
Generous on purpose: a loaded 2-core machine must not make it flaky. Measured in the thread's CPU time, not wall
time, so competing processes cannot stretch one size's run: what is compared is the work the path does. The
figures themselves are bench/linear.py's."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.linear import PATHS, growth
from coderouterd.translate.anthropic_request_to_openai import _as_parts, _merge_runs, _parts_content
from coderouterd.translate.responses_request import NS_SEP, translate_request

STEP = 30  # the most one 10x step may cost, in multiples of the previous size's time
CAP_S = 10.0  # absolute, at 100x: ~0.25 s of CPU idle, a ceiling 40x beyond it


@pytest.mark.parametrize("path", list(PATHS))
def test_time_grows_linearly_with_the_request(path):
    t = growth(path, 500, 3, stop_ratio=STEP, clock=time.thread_time)
    assert len(t) == 3, f"{path}: 10x the size took {t[1] / t[0]:.0f}x the time ({t})"
    assert t[2] < STEP * t[1], f"{path}: 100x the size took {t[2] / t[1]:.0f}x the 10x time ({t})"
    assert t[2] < CAP_S, t


# -- the same answers as before ------------------------------------------------------------------------------


def _pairwise(messages: list[dict]) -> list[dict]:
    """The merge as it was (one message into the previous at a time, quadratic): the reference."""
    out: list[dict] = []
    for msg in messages:
        msg = dict(msg)
        if out and msg["role"] in ("user", "assistant") and out[-1]["role"] == msg["role"]:
            prev = out[-1]
            if prev["role"] == "assistant":
                texts = [t for t in (prev.get("content"), msg.get("content")) if t]
                prev["content"] = "\n\n".join(texts) if texts else None
                calls = prev.get("tool_calls", []) + msg.get("tool_calls", [])
                if calls:
                    prev["tool_calls"] = calls
            else:
                prev["content"] = _parts_content(_as_parts(prev["content"]) + _as_parts(msg["content"]))
        else:
            out.append(msg)
    return out


_TEXT = st.sampled_from(["", "a", "b c"])
_PART = st.one_of(st.builds(lambda t: {"type": "text", "text": t}, _TEXT),
                  st.just({"type": "image_url", "image_url": {"url": "data:x"}}))
_USER = st.builds(lambda c: {"role": "user", "content": c if isinstance(c, str) else _parts_content(c)},
                  st.one_of(_TEXT, st.lists(_PART, min_size=1, max_size=3)))
_ASSISTANT = st.builds(lambda c, n: {"role": "assistant", "content": c or None,
                                     **({"tool_calls": [{"id": f"t{i}"} for i in range(n)]} if n else {})},
                       _TEXT, st.integers(0, 2))
_OTHER = st.sampled_from([{"role": "tool", "tool_call_id": "t", "content": "r"}, {"role": "system", "content": "s"}])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_USER, _ASSISTANT, _OTHER), max_size=12))
def test_runs_merge_exactly_as_pairwise_merging_did(messages):
    import copy

    assert _merge_runs(copy.deepcopy(messages)) == _pairwise(copy.deepcopy(messages))


@settings(max_examples=200, deadline=None)
@given(dups=st.integers(1, 30), plain_suffixes=st.sets(st.integers(1, 40), max_size=10))
def test_flattened_names_are_unique_never_shadow_a_plain_function_and_map_back(dups, plain_suffixes):
    base = f"ns{NS_SEP}f"
    plain = [{"type": "function", "name": base}] + [{"type": "function", "name": f"{base}_{k}"}
                                                     for k in plain_suffixes]
    ns = [{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "f"}]} for _ in range(dups)]
    rq = translate_request({"model": "m", "input": [
        {"role": "user", "content": "x"},
        {"type": "function_call", "call_id": "c", "name": "f", "namespace": "ns", "arguments": "{}"}],
        "tools": plain + ns})
    names = [t["function"]["name"] for t in rq.chat["tools"]]
    flat = names[len(plain):]
    assert len(set(names)) == len(names)
    assert all(rq.client_tool_name(n) == ("ns", "f") for n in flat)
    assert all(len(n) <= len(base) + 4 for n in flat)  # suffixes are numbers, not one "_" per duplicate
    # a call names the first tool of that (namespace, name), as before
    assert rq.chat["messages"][-1]["tool_calls"][0]["function"]["name"] == flat[0]
