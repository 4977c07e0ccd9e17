"""kvcache/costs.py learnt copy costs outlive the daemon: kept in the server's persisted affinity snapshot under the
key they were learnt for, and given back only to a server that names the same model file, context and build."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from coderouterd.affinity.service import Affinity
from coderouterd.affinity.slots import SlotTable
from coderouterd.config.schema import ConfigModel
from coderouterd.kvcache.costs import CopyCosts, Line, cost_key


def _props(model: str = "/models/coder.gguf", n_ctx: int = 65536, build: str = "b5000") -> dict:
    return {"model_path": model, "build_info": build, "default_generation_settings": {"n_ctx": n_ctx}}


def _affinity(persisted: dict) -> Affinity:
    cfg = ConfigModel.model_validate({"providers": {"llama": {"base_url": "http://x"}},
                                      "profiles": {"default": {"providers": ["llama"]}}})
    return Affinity(cfg, persist=lambda name, snap: persisted.__setitem__(name, snap))


def _place(aff: Affinity, props: dict | None) -> None:
    """The first placement on the server: kvcache learns what its costs are keyed by (an unmanaged server here)."""
    asyncio.run(aff.kvcache.prepare(SimpleNamespace(name="llama"), SlotTable(2), props))  # type: ignore[arg-type]


def _learnt(aff: Affinity) -> CopyCosts:
    c = aff.kvcache.costs.setdefault("llama", CopyCosts())
    c.save.add(1000, 0.02)
    c.save.add(4000, 0.05)
    c.restore.add(1000, 0.01)
    return c


def test_a_cost_line_round_trips_and_a_damaged_one_is_refused():
    c = CopyCosts()
    c.save.add(1000, 0.02)
    c.restore.add(3000, 0.03)
    key, back = CopyCosts.from_snapshot(c.snapshot("k1")) or ("", CopyCosts())
    assert key == "k1" and back.copy_s(2000) == c.copy_s(2000) is not None
    for bad in (None, {}, {"key": "k1"}, {"key": "", "save": [1, 1, 1, 1, 1, 1], "restore": [1, 1, 1, 1, 1, 1]},
                {"key": "k1", "save": [1, 1, 1, 1, 1, True], "restore": [1, 1, 1, 1, 1, 1]},
                {"key": "k1", "save": [1, 1, "nan", 1, 1, 1], "restore": [1, 1, 1, 1, 1, 1]},
                {"key": "k1", "save": [0, 1, 1, 1, 1, 2], "restore": [1, 1, 1, 1, 1, 1]},
                {"key": "k1", "save": [1, -1, 1, 1, 1, 1], "restore": [1, 1, 1, 1, 1, 1]}):
        assert CopyCosts.from_snapshot(bad) is None, bad
    assert Line.from_list(Line().to_list()).at(10) is None


def test_the_key_is_the_model_the_context_and_the_build():
    base = cost_key(_props())
    assert base is not None and base == cost_key(_props())
    assert len({base, cost_key(_props(model="/models/other.gguf")), cost_key(_props(n_ctx=4096)),
                cost_key(_props(build="b5001"))}) == 4
    assert cost_key(None) is None and cost_key({"model_path": "/m.gguf"}) is None  # no context: not keyed
    assert cost_key(_props(model="")) is None


def test_learnt_costs_outlive_a_daemon_restart_for_the_same_server():
    persisted: dict = {}
    aff = _affinity(persisted)
    _place(aff, _props())
    c = _learnt(aff)
    aff._dirty.add("llama")
    aff._persist_now("llama")
    assert persisted["llama"]["copy_costs"]["key"] == cost_key(_props())

    again = _affinity({})
    again.restore(persisted)
    assert again.kvcache.copy_s("llama", 2000) is None  # not yet: the server has not said what it runs
    # Persisted again before its first placement (another restart soon after): still kept.
    assert again.kvcache.costs_snapshot("llama") == persisted["llama"]["copy_costs"]
    _place(again, _props())
    assert again.kvcache.copy_s("llama", 2000) == pytest.approx(c.copy_s(2000))


@pytest.mark.parametrize("other", [_props(model="/models/other.gguf"), _props(n_ctx=4096), _props(build="b6000")],
                         ids=["model", "context", "build"])
def test_a_server_with_another_key_does_not_inherit_them(other):
    persisted: dict = {}
    aff = _affinity(persisted)
    _place(aff, _props())
    _learnt(aff)
    aff._dirty.add("llama")
    aff._persist_now("llama")

    again = _affinity({})
    again.restore(persisted)
    _place(again, other)
    assert again.kvcache.copy_s("llama", 2000) is None
    assert again.kvcache.costs_snapshot("llama") is None  # and the old ones are not written back


def test_a_server_restarted_keeps_them_only_with_the_same_model():
    aff = _affinity({})
    _place(aff, _props())
    _learnt(aff)
    aff.kvcache.forget(["llama"])
    _place(aff, _props())
    assert aff.kvcache.copy_s("llama", 2000) is not None
    aff.kvcache.forget(["llama"])
    _place(aff, _props(model="/models/other.gguf"))
    assert aff.kvcache.copy_s("llama", 2000) is None
