"""Serve the user first (issue 10), end to end: the official SDKs against the real daemon, fake upstreams behind.

One backend with every default is the common set-up; there a hiccup must never become a blackout, client
mistakes never count against the backend, images never end a session, errors come in the caller's shape, and
status tells the truth."""

from __future__ import annotations

import os
import subprocess

import anthropic
import httpx
import openai
import orjson
import pytest

from coderouterd.state.journal_reader import journal_rows
from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.config import daemon_config
from tests.support.daemon import DaemonProcess, admin_get, running
from tests.support.wait import wait_for

USER = [{"role": "user", "content": "hi"}]
PNG_B64 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==")

CONFIG = """
[server]
port = {PORT}
stream_hold_s = 0.3

[providers.solo]
base_url = "@SOLO@/v1"

[providers.novis]
base_url = "@NOVIS@/v1"
capabilities = { vision = false }

[providers.lim]
base_url = "@LIM@/v1"

[providers.key]
base_url = "@KEY@/v1"

[providers.backup]
base_url = "@BACKUP@/v1"

[profiles.default]
providers = ["solo"]

[profiles.novis]
providers = ["novis"]

[profiles.lim]
providers = ["lim"]
panic = false

[profiles.auth]
providers = ["key", "backup"]
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_first")
    with FakeServer("openai", name="solo") as solo, FakeServer("openai", name="novis") as novis, \
            FakeServer("openai", name="lim") as lim, FakeServer("openai", name="key", behaviour="401") as key, \
            FakeServer("openai", name="backup") as backup:
        cfg = (CONFIG.replace("@SOLO@", solo.url).replace("@NOVIS@", novis.url).replace("@LIM@", lim.url)
               .replace("@KEY@", key.url).replace("@BACKUP@", backup.url))
        with running(cfg, tmp) as d:
            yield {"daemon": d, "solo": solo, "novis": novis, "lim": lim, "key": key, "backup": backup}


def claude(env, profile: str = "default") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=env["daemon"].url, api_key="sk-test", max_retries=0, timeout=20,
                               default_headers={"x-coderouter-profile": profile})


def gpt(env, profile: str = "default") -> openai.OpenAI:
    return openai.OpenAI(base_url=env["daemon"].url + "/v1", api_key="sk-test", max_retries=0, timeout=20,
                         default_headers={"x-coderouter-profile": profile})


def corectl(env, *args: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
    e["CODEROUTER_SOCKET"] = str(env["daemon"].state_dir / "coderouterd.sock")
    e["COLUMNS"] = "200"
    return cli.corectl(list(args), env=e, timeout=30)


def status(env) -> dict:
    r = corectl(env, "status", "--json")
    assert r.returncode == 0, r.stderr
    return {p["name"]: p for p in orjson.loads(r.stdout)["providers"]}


def _breaker(d, provider: str) -> dict:
    """A provider's breaker as `corectl status --json` shows it, read over the admin socket (cheap to poll)."""
    snap = admin_get(d.state_dir / "coderouterd.sock")
    assert snap, "the admin socket did not answer"
    return {p["name"]: p for p in snap["providers"]}[provider]["breaker"]


def explain(env, rid: str) -> dict:
    r = corectl(env, "explain", rid, "--json")
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)["trace"]


# -- 1. never route nowhere -------------------------------------------------------------------------------------


def test_one_provider_after_five_500s_serves_the_next_request_at_once(env):
    solo = env["solo"]
    solo.script(["500"] * 5)
    c = claude(env)
    for _ in range(5):
        with pytest.raises(anthropic.InternalServerError):
            c.messages.create(model="m", max_tokens=10, messages=USER)
    # Breaker open and provider excluded as UNHEALTHY: still tried (panic), and served at once: the one attempt
    # the header names is the answer, not a wait for the breaker's recovery.
    raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
    assert raw.headers["x-coderouter-attempts"] == "solo:panic:ok"
    assert raw.parse().content[0].text
    rid = raw.headers["request-id"]
    # The real generation closed the breaker: the stream after it is an ordinary one.
    with c.messages.stream(model="m", max_tokens=10, messages=USER) as s:
        assert "".join(s.text_stream)
        assert s.response.headers["x-coderouter-attempts"] == "solo:ok"
    solo_status = status(env)["solo"]
    assert solo_status["breaker"]["state"] == "closed" and solo_status["health"] == "HEALTHY"
    # The panic attempt is marked in the decision trace and in corectl explain.
    trace = explain(env, rid)
    assert trace["panic"] is True and trace["attempts"][0]["panic"] is True
    assert any(n.get("panic") for n in trace["order_notes"])
    human = corectl(env, "explain", rid)
    assert "ok (panic)" in human.stdout and "panic: every provider was skipped" in human.stdout

    # And in the journal (written by its thread within the flush interval).
    def journal_row():
        r = corectl(env, "journal", "tail", "-n", "50", "--json")
        rows = [row for row in orjson.loads(r.stdout)["rows"] if row["request_id"] == rid] if r.returncode == 0 else []
        return rows[0] if rows else None

    # Until the writer has flushed it (read from here: a corectl per poll costs a process start), then corectl.
    wait_for(lambda: any(r["request_id"] == rid for r in journal_rows(env["daemon"].state_dir / "state.db")))
    row = journal_row()
    assert row is not None
    attempts = row["attempts"] if isinstance(row["attempts"], list) else orjson.loads(row["attempts"])
    assert attempts == [{"provider": "solo", "outcome": "ok", "reason": "ok", "status": 200,
                         "ms": attempts[0]["ms"], "panic": True}]


def test_five_500s_then_a_stream_is_served_too(env):
    solo = env["solo"]
    solo.script(["500"] * 5)
    c = claude(env)
    for _ in range(5):
        with pytest.raises(anthropic.InternalServerError):
            c.messages.create(model="m", max_tokens=10, messages=USER)
    with c.messages.stream(model="m", max_tokens=10, messages=USER) as s:
        assert "".join(s.text_stream)
        assert s.response.headers["x-coderouter-attempts"] == "solo:panic:ok"


# -- 2. only the backend's own failures count -----------------------------------------------------------------


def test_six_context_overflows_are_six_400s_and_the_next_request_is_served(env):
    env["solo"].script(["overflow"] * 6)
    c = claude(env)
    for _ in range(6):
        with pytest.raises(anthropic.BadRequestError) as ei:
            c.messages.create(model="m", max_tokens=10, messages=USER)
        assert ei.value.response.json()["error"]["message"].startswith("prompt is too long")
    raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
    assert raw.headers["x-coderouter-attempts"] == "solo:ok"  # never skipped, never panic
    s = status(env)["solo"]
    assert s["breaker"]["state"] == "closed" and s["breaker"]["consecutive_failures"] == 0


def test_a_client_sending_bad_requests_cannot_take_the_backend_from_others(env):
    env["solo"].script(["400"] * 3)
    c = claude(env)
    for _ in range(3):
        with pytest.raises(anthropic.BadRequestError):
            c.messages.create(model="m", max_tokens=10, messages=USER)
    # Another client, at once: served as if nothing happened.
    raw = gpt(env).chat.completions.with_raw_response.create(model="m", messages=USER)
    assert raw.headers["x-coderouter-attempts"] == "solo:ok"


# -- 3. rate limits reach the client as rate limits -------------------------------------------------------------


def test_a_429_reaches_the_client_as_429_and_the_provider_is_tried_once_it_passed(env):
    lim = env["lim"]
    # 3 s: the next request, sent right after, falls inside it with over 10x to spare on a loaded machine.
    lim.script(["429;retry_after=3"])
    c = claude(env, "lim")
    with pytest.raises(anthropic.RateLimitError) as ei:
        c.messages.create(model="m", max_tokens=10, messages=USER)
    assert ei.value.response.headers["retry-after"] == "3"
    assert ei.value.body["error"]["type"] == "rate_limit_error"
    # The profile opted out of panic: while the retry-after runs, a fast error, upstream untouched.
    before = lim.count("/v1/chat/completions")
    with pytest.raises(anthropic.APIStatusError) as ei:
        c.messages.create(model="m", max_tokens=10, messages=USER)
    assert ei.value.status_code == 529 and lim.count("/v1/chat/completions") == before

    def served() -> str | None:
        try:
            raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
        except anthropic.APIStatusError as e:
            assert e.status_code == 529 and lim.count("/v1/chat/completions") == before  # still the fast error
            return None
        return raw.headers["x-coderouter-attempts"]

    # Once it has passed: closed without a trial, served as an ordinary request.
    assert wait_for(served, 30, step=0.2) == "lim:ok"
    # The OpenAI SDK sees its own rate-limit error, with the retry-after.
    lim.script(["429;retry_after=2"])
    with pytest.raises(openai.RateLimitError) as oe:
        gpt(env, "lim").chat.completions.create(model="m", messages=USER)
    assert oe.value.response.headers["retry-after"] == "2"


# -- 5. images never sink a session ---------------------------------------------------------------------------


def _image_blocks() -> list[dict]:
    img = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    return [
        {"role": "user", "content": [img, {"type": "text", "text": "what is on the screen?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "/tmp/shot.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [img]},
                                     {"type": "text", "text": "and now?"}]},
    ]


def test_images_to_a_provider_declared_without_vision_are_served_as_a_note(env):
    novis = env["novis"]
    raw = claude(env, "novis").messages.with_raw_response.create(model="m", max_tokens=10, messages=_image_blocks())
    assert raw.parse().content[0].text
    sent = orjson.dumps(novis.requests[-1]["json"])
    assert b"image_url" not in sent and PNG_B64.encode() not in sent
    assert sent.count(b"[image omitted: novis does not accept images]") == 2
    trace = explain(env, raw.headers["request-id"])
    assert any(n.get("images_omitted") == 2 for n in trace["order_notes"])
    # The OpenAI wire's image_url too.
    gpt(env, "novis").chat.completions.create(model="m", messages=[{"role": "user", "content": [
        {"type": "text", "text": "look"},
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}"}}]}])
    sent = orjson.dumps(novis.requests[-1]["json"])
    assert b"image_url" not in sent and b"[image omitted: novis does not accept images]" in sent


def test_vision_not_declared_forwards_images(env):
    claude(env).messages.create(model="m", max_tokens=10, messages=_image_blocks()[:1])
    parts = env["solo"].requests[-1]["json"]["messages"][0]["content"]
    assert any(p.get("type") == "image_url" for p in parts)


# -- 6. errors in the caller's shape everywhere -----------------------------------------------------------------


def test_unknown_paths_answer_in_the_callers_shape(env):
    url = env["daemon"].url + "/v1/unknown"
    for headers in ({"anthropic-version": "2023-06-01"}, {"x-api-key": "sk-x"}):
        r = httpx.get(url, headers=headers)
        assert r.status_code == 404
        body = r.json()
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
    r = httpx.get(url)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error" and "type" not in r.json()
    with pytest.raises(anthropic.NotFoundError) as ei:
        claude(env).get("/v1/unknown", cast_to=object)
    assert ei.value.body["error"]["type"] == "not_found_error"


# -- 8. status tells the truth -----------------------------------------------------------------------------------


def test_auth_refusals_show_in_figures_and_as_an_auth_state(env):
    c = claude(env, "auth")
    for _ in range(5):
        raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
        assert raw.headers["x-coderouter-provider"] == "backup"
    s = status(env)
    key = s["key"]
    assert key["figures"]["errors"] == 5 and key["figures"]["samples"] == 5
    assert key["auth"]["status"] == 401
    assert s["backup"]["health"] == "HEALTHY"  # served recently: not "unknown"
    human = corectl(env, "status")
    assert "auth (401)" in human.stdout
    top = corectl(env, "top", "--json")
    assert {p["name"]: p["health"] for p in orjson.loads(top.stdout)["providers"]}["key"] == "auth (401)"


def test_every_streamed_response_names_every_attempt_and_the_winner(env):
    with httpx.stream("POST", env["daemon"].url + "/v1/messages", timeout=20,
                      headers={"x-coderouter-profile": "auth"},
                      json={"model": "m", "max_tokens": 10, "stream": True, "messages": USER}) as r:
        r.read()
        assert r.headers["x-coderouter-attempts"] == "key:http_401,backup:ok"
        assert r.headers["x-coderouter-provider"] == "backup"
    with gpt(env, "auth").chat.completions.with_streaming_response.create(model="m", messages=USER,
                                                                          stream=True) as r:
        assert r.headers["x-coderouter-attempts"] == "key:http_401,backup:ok"


# -- 2. every exit of a half-open trial releases it ---------------------------------------------------------------


def test_a_half_open_trial_the_client_abandons_does_not_wedge_the_breaker(tmp_path):
    with FakeServer("openai", name="t") as t:
        cfg = daemon_config(breaker={"failures": 1, "recovery_s": 0.5}, providers={"t": t.url},
                            profiles={"default": {"providers": ["t"], "health_action": "warn", "panic": False}})
        with running(cfg, tmp_path) as d:
            c = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0, timeout=20)
            t.script(["500"])
            with pytest.raises(anthropic.InternalServerError):
                c.messages.create(model="m", max_tokens=10, messages=USER)
            # Half-open once the recovery has passed (status says so): the next request is the trial.
            assert wait_for(lambda: _breaker(d, "t")["state"] == "half_open", 30)
            t.script(["hang"])
            quick = anthropic.Anthropic(base_url=d.url, api_key="x", max_retries=0, timeout=0.5)
            with pytest.raises(anthropic.APITimeoutError):
                quick.messages.create(model="m", max_tokens=10, messages=USER)  # the client gives up
            # The daemon has seen it leave: the trial is no longer in flight (a wait for that, not a pause).
            assert wait_for(lambda: not _breaker(d, "t")["trial_in_flight"], 30), _breaker(d, "t")
            # The abandoned trial gave its slot back: the next trial is admitted and closes the breaker.
            raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
            assert raw.headers["x-coderouter-attempts"] == "t:ok"


# -- 4. only a real generation closes a breaker failed generations opened ---------------------------------------


def test_a_backend_that_lists_models_but_cannot_generate_stays_out_until_it_generates(tmp_path):
    with FakeServer("openai", name="flaky", behaviour="500") as flaky, FakeServer("openai", name="good") as good:
        cfg = daemon_config(health={"probe_interval_s": 60, "recovery_backoff_s": [0.2, 0.3]},
                            providers={"flaky": flaky.url, "good": good.url}, profiles={"default": ["flaky", "good"]})
        d = DaemonProcess(cfg, tmp_path).start()
        env = {"daemon": d}
        try:
            c = claude(env)
            for _ in range(3):  # three failed generations: breaker open, UNHEALTHY, self-healing probes it
                raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
                assert raw.headers["x-coderouter-provider"] == "good"
            # Several recovery rounds (0.2 s, then 0.3 s apart): the model list answers every time, chat does not.
            wait_for(lambda: flaky.count("/v1/models") >= 2 and flaky.count("/v1/chat/completions") >= 5)
            s = status(env)["flaky"]
            assert s["breaker"]["state"] == "open" and s["health"] == "UNHEALTHY"
            assert flaky.count("/v1/models") >= 2 and flaky.count("/v1/chat/completions") >= 5
            flaky.set_behaviour("ok")
            def healed() -> bool:  # over the admin socket: a corectl per poll costs a process start
                p = {p["name"]: p for p in (admin_get(d.state_dir / "coderouterd.sock") or {"providers": []})["providers"]}
                return p.get("flaky", {}).get("health") == "HEALTHY" and p["flaky"]["breaker"]["state"] == "closed"
            wait_for(healed, step=0.1)
            s = status(env)["flaky"]
            assert s["breaker"]["state"] == "closed" and s["health"] == "HEALTHY"  # a 1-token generation did it
            raw = c.messages.with_raw_response.create(model="m", max_tokens=10, messages=USER)
            assert raw.headers["x-coderouter-attempts"] == "flaky:ok"
        finally:
            d.stop()
