"""The fake llama-server's slot model, checked on its own so the affinity tests measure against something
that behaves like llama-server: longest common prefix above the similarity threshold, else LRU; id_slot;
cache_prompt; timings and cached tokens; save/restore only with a save path."""

from __future__ import annotations

import httpx

from tests.fakes.runner import FakeServer


def _chat(http: httpx.Client, text: str, **extra) -> dict:
    body = {"model": "m", "messages": [{"role": "system", "content": "S" * 400}, {"role": "user", "content": text}],
            **extra}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_server_choice_longest_prefix_else_lru_and_timings():
    with FakeServer("llamacpp", n_slots=2) as fake, httpx.Client(base_url=fake.url) as http:
        assert http.get("/props").json()["total_slots"] == 2
        assert [s["id"] for s in http.get("/slots").json()] == [0, 1]
        first = _chat(http, "hello")
        assert first["timings"]["cache_n"] == 0 and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        again = _chat(http, "hello again")  # shares the system prompt: > 10% of the prompt, same slot
        log = fake.fake.log
        assert log[1]["slot"] == log[0]["slot"] and again["timings"]["cache_n"] > 100
        assert again["timings"]["prompt_n"] + again["timings"]["cache_n"] == again["usage"]["prompt_tokens"]
        other = http.post("/v1/chat/completions", json={"model": "m", "messages": [
            {"role": "user", "content": "completely different " * 30}]})
        assert other.status_code == 200 and log[2]["slot"] != log[0]["slot"]  # under 10%: least recently used


def test_id_slot_and_cache_prompt():
    with FakeServer("llamacpp", n_slots=2) as fake, httpx.Client(base_url=fake.url) as http:
        _chat(http, "a", id_slot=1)
        assert fake.fake.log[-1]["slot"] == 1
        assert _chat(http, "a b", id_slot=0)["timings"]["cache_n"] == 0  # slot 0 is empty
        assert _chat(http, "a b c", id_slot=1, cache_prompt=False)["timings"]["cache_n"] == 0
        assert _chat(http, "a b c d", id_slot=1)["timings"]["cache_n"] > 100


def test_save_restore_needs_a_save_path():
    with FakeServer("llamacpp", n_slots=1) as fake, httpx.Client(base_url=fake.url) as http:
        r = http.post("/slots/0?action=save", json={"filename": "a.bin"})
        assert r.status_code == 501 and "--slot-save-path" in r.json()["error"]["message"]
    with FakeServer("llamacpp", n_slots=1, slot_save=True) as fake, httpx.Client(base_url=fake.url) as http:
        _chat(http, "first conversation")
        assert http.post("/slots/0?action=save", json={"filename": "a.bin"}).json()["n_saved"] > 100
        http.post("/v1/chat/completions", json={"model": "m", "messages": [{"role": "user", "content": "x" * 900}]})
        assert http.post("/slots/0?action=restore", json={"filename": "a.bin"}).status_code == 200
        assert _chat(http, "first conversation, continued")["timings"]["cache_n"] > 100
        assert http.post("/slots/0?action=restore", json={"filename": "missing.bin"}).status_code == 400
