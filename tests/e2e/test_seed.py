"""Issue 44 §0 end to end: a new conversation starts from the shared system prompt and tools another slot holds,
copied into its own slot through the fake llama-server's slot save and restore; `corectl explain` says so and
the restore is proven by the answer's cached tokens."""

from __future__ import annotations

import anthropic
import orjson

from tests.e2e.test_affinity import BIG_CTX, _corectl, config
from tests.fakes.runner import FakeServer
from tests.support.claude_sessions import Session


def test_a_new_conversation_is_seeded_from_the_slot_holding_the_shared_prefix(start_daemon):
    with FakeServer("llamacpp", name="seed", n_slots=3, slot_save=True, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))  # the defaults: costs learnt from the server
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        a, b = Session(60), Session(61)
        client.messages.create(**a.main_body(), extra_headers=a.headers, timeout=60)
        raw = client.messages.with_raw_response.create(**b.main_body(), extra_headers=b.headers, timeout=60)
        rid = raw.headers["x-request-id"]
        first, second = fake.fake.log
        assert second["slot"] != first["slot"]  # a lane of its own: A's slot keeps A's conversation
        saves = [x for x in fake.fake.slot_actions if x[0] == "save"]
        restores = [x for x in fake.fake.slot_actions if x[0] == "restore"]
        assert saves and saves[0][1] == first["slot"] and restores and restores[0][1] == second["slot"]
        # What the two prompts share (system prompt and tools) came back cached in B's slot.
        shared = next(i for i, (x, y) in enumerate(zip(first["prompt"], second["prompt"], strict=False)) if x != y)
        assert second["cache_n"] >= shared // 4 - 1 > 1000

        explained = _corectl(d, "explain", rid, "--json")
        assert explained.returncode == 0, explained.stderr
        aff = orjson.loads(explained.stdout)["trace"]["affinity"]
        seeded = aff["seeded"]
        assert seeded["how"] == "copied" and seeded["from_slot"] == first["slot"]
        assert seeded["from_lane"].startswith("lane:") and seeded["from_lane"] != aff["lane"]
        assert aff["slot_restore"]["outcome"] == "taken", aff
        text = _corectl(d, "explain", rid).stdout
        assert f"seeded from {seeded['from_lane']}: {seeded['tokens']:,} tokens (copied)" in text, text
