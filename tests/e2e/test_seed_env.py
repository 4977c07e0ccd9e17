"""Issue 44 §0 end to end, for sessions whose long system block ends with per-session text: Claude Code's main
system block ends with an environment section (working directory, date, git status) after thousands of static
tokens. Two sessions then share no whole segment past a short first block; the second session's first turn is
still seeded with most of that block, copied from the first session's slot (affinity/canonical.py cuts long
segments into sub-segments)."""

from __future__ import annotations

import anthropic
import orjson

from tests.e2e.test_affinity import BIG_CTX, _corectl, config
from tests.fakes.runner import FakeServer
from tests.support.claude_sessions import CLAUDE_CODE, INSTRUCTIONS, Session, Shape

STATIC = INSTRUCTIONS * 4  # ~25 KB: about 6,400 of the fake's tokens (4 bytes each)


def _session(n: int) -> Session:
    shape = Shape(CLAUDE_CODE.tools, STATIC, CLAUDE_CODE.agents, CLAUDE_CODE.tool_result_lines,
                  CLAUDE_CODE.max_tokens, CLAUDE_CODE.background_max_tokens)
    s = Session(n, shape=shape)
    s.system_extra = (f"\n<env>\nWorking directory: /home/dev/project-{n}\nIs directory a git repo: Yes\n"
                      f"Platform: linux\nToday's date: 2026-12-0{n % 9 + 1}\n</env>\n"
                      f"gitStatus: On branch feature-{n}\n M src/app_{n}.py")
    return s


def test_a_new_session_is_seeded_with_the_static_part_of_a_system_block_ending_in_its_environment(start_daemon):
    with FakeServer("llamacpp", name="seedenv", n_slots=3, slot_save=True, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        a, b = _session(70), _session(71)
        client.messages.create(**a.main_body(), extra_headers=a.headers, timeout=60)
        raw = client.messages.with_raw_response.create(**b.main_body(), extra_headers=b.headers, timeout=60)
        rid = raw.headers["x-request-id"]
        first, second = fake.fake.log
        assert second["slot"] != first["slot"]  # a lane of its own: A's slot keeps A's conversation
        # The rendered prompts part at B's environment section, inside the static block's slot on the server.
        differ = next(i for i, (x, y) in enumerate(zip(first["prompt"], second["prompt"], strict=False)) if x != y)
        block_tokens = len(STATIC.encode()) // 4
        assert differ // 4 > block_tokens
        # Most of the block came back cached in B's slot: copied from A's.
        assert second["cache_n"] > block_tokens // 2, (second["cache_n"], block_tokens)
        assert second["cache_n"] >= differ // 4 - 1
        restores = [x for x in fake.fake.slot_actions if x[0] == "restore"]
        assert restores and restores[0][1] == second["slot"]

        explained = _corectl(d, "explain", rid, "--json")
        assert explained.returncode == 0, explained.stderr
        aff = orjson.loads(explained.stdout)["trace"]["affinity"]
        seeded = aff["seeded"]
        assert seeded["how"] == "copied" and seeded["from_slot"] == first["slot"], aff
        assert seeded["from_lane"].startswith("lane:") and seeded["from_lane"] != aff["lane"]
        assert seeded["tokens"] > block_tokens // 2
        assert aff["slot_restore"]["outcome"] == "taken", aff
        text = _corectl(d, "explain", rid).stdout
        assert f"seeded from {seeded['from_lane']}: {seeded['tokens']:,} tokens (copied)" in text, text
