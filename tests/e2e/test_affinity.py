"""Prefix affinity end to end: Claude-Code-shaped sessions through coderouterd to a fake llama-server with
slots, against the same workload sent straight to an identical fake (the server choosing slots itself)."""

from __future__ import annotations

import anthropic
import pytest

from tests.fakes.runner import FakeServer
from tests.support.claude_sessions import drive_router, drive_straight, reuse_report
from tests.support.config import daemon_config, openai_at
from tests.support.metrics import scrape, series

BIG_CTX = 131072  # tokens per slot: these sessions grow past 16k tokens

def config(url: str, **tables) -> str:
    """One llama-server-like fake behind profile default."""
    return daemon_config(providers={"llama": openai_at(url, model="local-model")}, profiles={"default": ["llama"]},
                         **tables)


def _baseline(n_slots: int, slot_save: bool, sessions: int, turns: int) -> dict:
    with FakeServer("llamacpp", name="baseline", n_slots=n_slots, slot_save=slot_save, n_ctx=BIG_CTX) as fake:
        drive_straight(fake.url, sessions, turns)
        return reuse_report(fake.fake.log)


def _through_router(start_daemon, n_slots: int, slot_save: bool, sessions: int, turns: int) -> tuple:
    fake = FakeServer("llamacpp", name="routed", n_slots=n_slots, slot_save=slot_save, n_ctx=BIG_CTX).start()
    d = start_daemon(config(fake.url))
    drive_router(d.url, sessions, turns)
    return reuse_report(fake.fake.log), fake, d


def _assert_conversations_keep_their_slots(log: list[dict], first: bytes) -> None:
    """Each conversation's turns on one slot of its own; background calls (title generation: each a lane of its
    own) on other slots than the conversations'."""
    main: dict[int, set[int]] = {0: set(), 1: set()}
    background: set[int] = set()
    for e in log:
        if b"Generate a concise title" in e["prompt"]:
            background.add(e["slot"])
        else:
            main[0 if first in e["prompt"] else 1].add(e["slot"])
    assert len(main[0]) == len(main[1]) == 1 and main[0] != main[1], (main, background)
    assert background and not background & (main[0] | main[1]), (main, background)


def test_lanes_within_slots_reuse_nearly_all_that_any_assignment_could(start_daemon):
    # 2 sessions x (main + background) = 4 lanes on 4 slots; no save path on the server.
    base = _baseline(4, False, 2, 16)
    fake = None
    try:
        got, fake, d = _through_router(start_daemon, 4, False, 2, 16)
        print("\nbaseline", base, "\nrouted  ", got)
        assert got["of_best"] >= 0.95, (got, base)
        assert got["reused_tokens"] > base["reused_tokens"]
        # Every generation was pinned, and each conversation kept one slot of its own for the whole run: no
        # background call ever landed on a conversation's slot.
        assert all(isinstance(e["id_slot"], int) for e in fake.fake.log)
        _assert_conversations_keep_their_slots(fake.fake.log, b"Session 0:")
    finally:
        if fake is not None:
            fake.stop()


def test_twice_as_many_sessions_as_slots_with_save_restore(start_daemon):
    base = _baseline(2, True, 4, 10)
    fake = None
    try:
        got, fake, _d = _through_router(start_daemon, 2, True, 4, 10)
        print("\nbaseline", base, "\nrouted  ", got)
        assert got["of_best"] >= 0.80, (got, base)
        assert got["reused_tokens"] > base["reused_tokens"]
        actions = {a for a, _, _ in fake.fake.slot_actions}
        assert {"save", "restore"} <= actions
    finally:
        if fake is not None:
            fake.stop()


# -- cache-bust detector, visible in corectl explain, status and /metrics ----------------------------------------

def _corectl(d, *args: str):
    import os

    from tests.support import cli

    env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    env["COLUMNS"] = "220"
    env["CODEROUTER_SOCKET"] = str(d.state_dir / "coderouterd.sock")
    return cli.corectl(list(args), env=env)


def _mutate_system(s):
    s.system_extra = " The current time is 18:42:07."


def _mutate_tools(s):
    s.tools = s.tools[:-1]


def _mutate_old_message(s):
    s.messages[3] = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_00_000",
                                                   "content": "output trimmed by the client"}]}


@pytest.mark.parametrize("mutate,segment", [
    (_mutate_system, "system[1] changed"),
    (_mutate_tools, "tools changed"),
    (_mutate_old_message, "message 3 rewritten"),
])
def test_cache_bust_names_the_segment(start_daemon, mutate, segment):
    import orjson

    from coderouterd.state import read_audit
    from tests.support.claude_sessions import Session

    with FakeServer("llamacpp", name="bust", n_slots=2, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        s = Session(40)
        for _ in range(3):
            client.messages.create(**s.main_body(), extra_headers=s.headers, timeout=60)
            s.advance()
        mutate(s)
        raw = client.messages.with_raw_response.create(**s.main_body(), extra_headers=s.headers, timeout=60)
        rid = raw.headers["x-request-id"]
        # The server really did reprocess part of the prompt: that is what the detector saw.
        assert fake.fake.log[-1]["cache_n"] < 0.9 * fake.fake.log[-2]["n_prompt"]

        explained = _corectl(d, "explain", rid, "--json")
        assert explained.returncode == 0, explained.stderr
        aff = orjson.loads(explained.stdout)["trace"]["affinity"]
        assert aff["cache_bust"]["segment"] == segment and aff["cache_bust"]["cause"] == "request"
        assert aff["slot"] == fake.fake.log[-1]["slot"]
        text = _corectl(d, "explain", rid)
        assert "cache bust" in text.stdout and segment in text.stdout

        d.stop()  # flush the audit log
        busts = [e for e in read_audit(d.state_dir) if e["kind"] == "cache_bust"]
        assert [b["segment"] for b in busts] == [segment] and busts[0]["request_id"] == rid
        # With the daemon gone, explain reads the journal, which kept the segment too.
        from_journal = _corectl(d, "explain", rid, "--state-dir", str(d.state_dir))
        assert "from the journal" in from_journal.stdout and segment in from_journal.stdout


def test_hit_ratio_in_status_metrics_and_journal(start_daemon):
    import orjson

    from coderouterd.state.journal_reader import journal_rows
    from tests.support.claude_sessions import Session

    with FakeServer("llamacpp", name="vis", n_slots=2, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        s = Session(41)
        for _ in range(4):
            client.messages.create(**s.main_body(), extra_headers=s.headers, timeout=60)
            s.advance()
        client.messages.create(**s.background_body(), extra_headers=s.headers, timeout=60)
        log = fake.fake.log
        ratio = sum(e["cache_n"] for e in log) / sum(e["n_prompt"] for e in log)

        st = _corectl(d, "status", "--json")
        assert st.returncode == 0, st.stderr
        cache = next(p for p in orjson.loads(st.stdout)["providers"] if p["name"] == "llama")["cache"]
        assert cache["hit_ratio"] == pytest.approx(ratio, abs=1e-3)
        assert cache["slots"]["total"] == 2 and cache["slots"]["lanes"] == 2
        text = _corectl(d, "status")
        assert f"{ratio * 100:.0f}%" in text.stdout

        (_labels, hit_ratio), = series(scrape(d, timeout=5), "coderouter_prefix_cache_hit_ratio")
        assert hit_ratio == pytest.approx(ratio, abs=1e-3)

        d.stop()
        rows = journal_rows(d.state_dir / "state.db")
        # The four turns in one lane, the title call in another.
        assert len({r["lane"] for r in rows[:4]}) == 1 and rows[4]["lane"] != rows[0]["lane"]
        assert all(r["lane"].startswith("lane:") for r in rows)
        assert len({r["session"] for r in rows}) == 1 and s.id not in rows[0]["session"]
        assert [r["slot"] for r in rows] == [e["slot"] for e in log]
        assert [r["cache_read_tokens"] for r in rows] == [e["cache_n"] for e in log]
        assert all(r["predicted_tokens"] is not None for r in rows)
        # The second turn was predicted to reuse the whole first prompt, and did (bytes-per-token estimate).
        assert rows[1]["predicted_tokens"] == pytest.approx(rows[1]["cache_read_tokens"], rel=0.35)


def test_slot_map_survives_a_daemon_restart(start_daemon):
    from tests.support.claude_sessions import Session

    with FakeServer("llamacpp", name="persist", n_slots=3, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        a, b = Session(50), Session(51)
        for s in (a, b, a, b):
            client.messages.create(**s.main_body(), extra_headers=s.headers, timeout=60)
            s.advance()
        slot_a = fake.fake.log[2]["slot"]
        d.stop()
        d2 = start_daemon(config(fake.url))
        client = anthropic.Anthropic(base_url=d2.url, api_key="x", max_retries=0)
        client.messages.create(**b.main_body(), extra_headers=b.headers, timeout=60)
        client.messages.create(**a.main_body(), extra_headers=a.headers, timeout=60)
        last = fake.fake.log[-1]
        assert last["id_slot"] == slot_a and last["slot"] == slot_a
        assert last["cache_n"] >= 0.9 * fake.fake.log[2]["n_prompt"]


def race_config(a_url: str, b_url: str) -> str:
    return daemon_config(providers={"a": openai_at(a_url, model="local-model"), "b": openai_at(b_url, model="local-model")},
                         profiles={"default": ["a", "b"], "race": {"providers": ["a", "b"], "mode": "race",
                                                                    "race_delay_ms": 20000},
                                   "only-b": ["b"]})


def test_race_prefers_the_backend_holding_the_prefix_but_fallback_keeps_its_order(start_daemon):
    import orjson

    from tests.support.claude_sessions import Session

    with FakeServer("llamacpp", name="a", n_slots=2, n_ctx=BIG_CTX) as fa, FakeServer("llamacpp", name="b", n_slots=2, n_ctx=BIG_CTX) as fb:
        d = start_daemon(race_config(fa.url, fb.url))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        s = Session(60)
        client.messages.create(**s.main_body(), extra_headers={**s.headers, "x-coderouter-profile": "only-b"},
                               timeout=60)
        s.advance()
        raw = client.messages.with_raw_response.create(
            **s.main_body(), extra_headers={**s.headers, "x-coderouter-profile": "race"}, timeout=60)
        assert raw.headers["x-coderouter-provider"] == "b"
        assert len(fa.fake.log) == 0 and len(fb.fake.log) == 2 and fb.fake.log[-1]["cache_n"] > 0
        trace = orjson.loads(_corectl(d, "explain", raw.headers["x-request-id"], "--json").stdout)["trace"]
        assert trace["effective_order"] == ["b", "a"]
        assert any("prefix affinity" in n.get("why", "") for n in trace["order_notes"])
        s.advance()
        raw = client.messages.with_raw_response.create(**s.main_body(), extra_headers=s.headers, timeout=60)
        assert raw.headers["x-coderouter-provider"] == "a"  # a fallback chain's declared order stands


def test_openai_clients_get_lanes_from_prompt_cache_key(start_daemon):
    import openai

    from coderouterd.state.journal_reader import journal_rows
    from tests.support.claude_sessions import TOOLS

    tools = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                               "parameters": t["input_schema"]}} for t in TOOLS]
    with FakeServer("llamacpp", name="oa", n_slots=2, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
        convs = {k: [{"role": "system", "content": "You are a coding agent."},
                     {"role": "user", "content": f"task {k}"}] for k in ("one", "two")}
        for turn in range(3):
            for key, messages in convs.items():
                stream = client.chat.completions.create(model="m", messages=messages, tools=tools, stream=True,
                                                        extra_body={"prompt_cache_key": key})
                for _ in stream:
                    pass
                messages.append({"role": "assistant", "content": f"step {turn}"})
                messages.append({"role": "user", "content": f"result {turn} " * 400})
        log = fake.fake.log
        assert {e["slot"] for e in log[0::2]} != {e["slot"] for e in log[1::2]}  # one slot per conversation
        assert all(e["cache_n"] > 0.9 * p["n_prompt"] for e, p in zip(log[2:], log[:-2], strict=False))
        d.stop()
        rows = journal_rows(d.state_dir / "state.db")
        assert len({r["session"] for r in rows}) == 2
        assert [r["cache_read_tokens"] for r in rows] == [e["cache_n"] for e in log]


def test_concurrent_sessions_and_background_calls_keep_their_slots(start_daemon):
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.claude_sessions import Session

    with FakeServer("llamacpp", name="conc", n_slots=4, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)

        def run(n: int) -> None:
            s = Session(70 + n)
            with ThreadPoolExecutor(2) as pool:
                for _ in range(6):
                    # Claude Code sends its background call while the main turn runs.
                    bg = pool.submit(client.messages.create, **s.background_body(), extra_headers=s.headers,
                                     timeout=60)
                    client.messages.create(**s.main_body(), extra_headers=s.headers, timeout=60)
                    bg.result()
                    s.advance()

        with ThreadPoolExecutor(2) as pool:
            list(pool.map(run, range(2)))
        report = reuse_report(fake.fake.log)
        assert report["requests"] == 24 and report["of_best"] >= 0.9, report
        _assert_conversations_keep_their_slots(fake.fake.log, b"Session 70:")


def test_codex_responses_sessions_get_lanes_from_prompt_cache_key(start_daemon):
    import openai

    from coderouterd.state.journal_reader import journal_rows

    with FakeServer("llamacpp", name="codex", n_slots=2, n_ctx=BIG_CTX) as fake:
        d = start_daemon(config(fake.url))
        client = openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0)
        convs = {k: [{"role": "user", "content": f"task {k}: " + "explain the repository layout " * 40}]
                 for k in ("codex-a", "codex-b")}
        for turn in range(3):
            for key, items in convs.items():
                with client.responses.stream(model="m", input=items, instructions="You are Codex. " * 200,
                                             prompt_cache_key=key) as st:
                    st.get_final_response()
                items.append({"role": "assistant", "content": f"step {turn} done"})
                items.append({"role": "user", "content": f"output of step {turn} " * 300})
        log = fake.fake.log
        assert len({e["slot"] for e in log[0::2]}) == 1 and len({e["slot"] for e in log[1::2]}) == 1
        assert log[0]["slot"] != log[1]["slot"]
        assert all(e["cache_n"] > 0.9 * p["n_prompt"] for e, p in zip(log[2:], log[:-2], strict=False))
        d.stop()
        rows = journal_rows(d.state_dir / "state.db")
        assert len({r["session"] for r in rows}) == 2
        assert [r["cache_read_tokens"] for r in rows] == [e["cache_n"] for e in log]


@pytest.mark.parametrize("tools", [True, False], ids=["tools", "no tools"])
def test_three_sessions_with_title_calls_and_a_compaction_on_three_slots(start_daemon, tools):
    """Issue 33: lanes by prefix. Three interleaved conversations sharing a system prompt, title calls, 3 slots
    with save/restore: the same reuse whether the turns carry tools or not, no cache bust named for a title
    call, and the compaction call goes to the slot holding its conversation's history."""
    from coderouterd.state.journal_reader import journal_rows
    from tests.support.claude_sessions import workload

    with FakeServer("llamacpp", name="three", n_slots=3, slot_save=True, n_ctx=BIG_CTX) as fake:
        # Without tools the prefix every session shares is the system prompt alone (~3k tokens): below the default
        # least prefix worth a slot copy (2,048 tokens of our estimate, ~7 KB), so new sessions would start cold.
        d = start_daemon(config(fake.url, affinity={"clone_min_tokens": 256}))
        client = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0)
        order = workload(3, 5, background_every=2, tools=tools)
        for s, kind in order:
            body = s.main_body() if kind == "main" else s.background_body()
            client.messages.create(**body, extra_headers=s.headers, timeout=60)
            if kind == "main":
                s.advance()
        report = reuse_report(fake.fake.log)
        processed, ideal = report["prompt_tokens"] - report["reused_tokens"], \
            report["prompt_tokens"] - report["best_tokens"]
        print(f"\n{'tools' if tools else 'no tools'}: processed {processed}, ideal {ideal}", report)
        assert processed <= 1.10 * ideal, report
        s0 = order[0][0]
        home = next(e["slot"] for e in reversed(fake.fake.log) if b"Session 0:" in e["prompt"]
                    and b"Generate a concise title" not in e["prompt"])
        client.messages.create(**s0.compaction_body(), extra_headers=s0.headers, timeout=60)
        compaction = fake.fake.log[-1]
        assert compaction["slot"] == home
        if not tools:  # the fake renders tools after the system prompt: without them the history is shared
            assert compaction["cache_n"] >= 0.9 * fake.fake.log[-2]["n_prompt"] or compaction["cache_n"] > 1000
        d.stop()
        rows = journal_rows(d.state_dir / "state.db")
        assert [r["cache_bust"] for r in rows[:-1]] == [None] * (len(rows) - 1)
        titles = [r["lane"] for r, (_s, kind) in zip(rows, order, strict=False) if kind == "background"]
        mains = {r["lane"] for r, (_s, kind) in zip(rows, order, strict=False) if kind == "main"}
        assert len(mains) == 3 and not set(titles) & mains
