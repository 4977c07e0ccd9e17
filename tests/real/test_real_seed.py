"""Issue 44 §0 on the real llama-server (SmolLM2-135M): new conversations start warm. Four conversations sharing a
long system prompt and tools, two turns each, on four slots of a fresh server managed by coderouterd: each new
conversation's first turn is seeded from a slot holding the shared prefix (copied: save, then restore into its
own slot), so the run processes at most 1.10x the tokens the best any cache could do would (the shared prefix
computed once), counted by what the server reports it reused. bench/real_llama.py --scenario shared runs the full
scale, with seeding off and the head's code beside it; its figures are in bench/README.md."""

from __future__ import annotations

import pytest

from bench.real_llama import SHARED_SUITE, print_shared_table, shared
from tests.support.real_llama import paths

# A real model on two CPU cores: tens of seconds when the machine is idle, several times that when it is not.
pytestmark = pytest.mark.timeout(900)


def test_new_conversations_start_from_the_shared_prefix_another_slot_holds(tmp_path):
    paths()
    r = shared(SHARED_SUITE, tmp_path)
    print()
    print_shared_table([{"scenario": SHARED_SUITE.name, "run": "seeding", **r}])
    assert r["seeded"] >= SHARED_SUITE.sessions - 1, r  # every conversation after the first, as explain says
    assert r["copies"] >= SHARED_SUITE.sessions - 1, r  # copied (no other slot held it), counted in the status
    assert r["processed_tokens"] <= 1.10 * r["ideal_processed"], r
