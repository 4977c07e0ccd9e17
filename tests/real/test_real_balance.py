"""`mode = "balance"` on three real llama-servers (bench/real_llama.py's replicas scenario at the suite's small
scale, balance only): 6 conversations from 3 concurrent clients, 5 turns each. Counts, never time: what the
servers say they computed (their /metrics) against the best possible, and requests per replica."""

from __future__ import annotations

import json

import pytest

from bench.real_llama import REPLICAS_SUITE, replicas_run
from tests.support.real_llama import paths

pytestmark = pytest.mark.timeout(900)


def test_balance_keeps_conversations_warm_and_spreads_them_over_three_real_replicas(tmp_path):
    paths()
    got = replicas_run(REPLICAS_SUITE, tmp_path, "balance")
    print(json.dumps(got))
    assert got["requests"] == 30
    assert got["processed_tokens"] <= 1.10 * got["best_processed"], got
    served = list(got["per_replica"].values())
    assert len(served) == 3 and max(served) <= 2 * min(served), got
