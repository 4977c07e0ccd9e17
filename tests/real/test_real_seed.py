"""Issue 44 §0 on the real llama-server (SmolLM2-135M): new conversations start warm. Four conversations sharing a
long system prompt and tools, two turns each, on four slots of a fresh server managed by coderouterd: each new
conversation's first turn is seeded from a slot holding the shared prefix (copied: save, then restore into its
own slot), so the run processes at most 1.10x the tokens the best any cache could do would (the shared prefix
computed once), counted by what the server reports it reused. bench/real_llama.py --scenario shared runs the full
scale, with seeding off and the head's code beside it; its figures are in bench/README.md."""

from __future__ import annotations

import pytest

from bench.real_llama import SHARED_ENV_SUITE, SHARED_SUITE, print_shared_table, shared
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


def test_a_new_session_starts_from_the_static_part_of_a_system_block_that_ends_in_its_own_environment(tmp_path):
    """Each session's system block (~5 KB, longer than one 4 KB piece of the affinity digests) ends in its own
    environment section, as Claude Code's does: the sessions share only the static part, and each new one is
    still seeded from it (the copy gives the whole donor slot: the server reuses every token up to the first that
    differs)."""
    paths()
    r = shared(SHARED_ENV_SUITE, tmp_path)
    print()
    print_shared_table([{"scenario": SHARED_ENV_SUITE.name, "run": "seeding", **r}])
    assert r["seeded"] >= SHARED_ENV_SUITE.sessions - 1, r
    assert r["processed_tokens"] <= 1.10 * r["ideal_processed"], r
