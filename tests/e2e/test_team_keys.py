"""Team keys on the real daemon, met by the official anthropic and openai SDKs (issue 41): loopback is open until
the first key exists, then every request needs a valid one (operator keys keep working); refusals in each
caller's shape name the key and never the secret (401 unknown/revoked, 401 expired saying when, 403 out of scope);
rotation's grace; the client's key never goes upstream; repeated failures are slowed and audited; and no secret is
left in clear anywhere at rest (state directory, logs, audit log, journal)."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime
from pathlib import Path

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.config import daemon_config, openai_at, warn
from tests.support.daemon import DaemonProcess
from tests.support.wait import wait_for

OPERATOR = "op-key-for-the-team-lead"
CHAT = {"model": "qwen3", "messages": [{"role": "user", "content": "hi"}]}
USER = [{"role": "user", "content": "hi"}]


def _daemon(tmp_path: Path, server: dict):
    with FakeServer("openai", name="local", models=["qwen3"]) as up:
        cfg = daemon_config(providers={"local": openai_at(up.url, model="qwen3")},
                            profiles={"default": warn("local"), "coding": warn("local")}, server=server)
        d = DaemonProcess(cfg, tmp_path).start()
        try:
            yield d, up
        finally:
            d.stop()


@pytest.fixture
def env(tmp_path):
    """A daemon with no operator key: loopback open until the first team key."""
    yield from _daemon(tmp_path, {})


@pytest.fixture
def env_op(tmp_path):
    """A daemon with an operator key in [server] api_keys."""
    yield from _daemon(tmp_path, {"api_keys": [OPERATOR]})


def corectl(d: DaemonProcess, *args: str) -> cli.subprocess.CompletedProcess:
    env = {**os.environ, "CODEROUTER_SOCKET": str(d.state_dir / "coderouterd.sock")}
    return cli.corectl(list(args), env=env)


def create(d: DaemonProcess, name: str, *opts: str) -> str:
    r = corectl(d, "--json", "keys", "create", name, *opts)
    assert r.returncode == 0, r.stderr
    data = orjson.loads(r.stdout)
    assert data["ok"] and data["record"]["name"] == name
    return data["key"]


def oai(d: DaemonProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=d.url + "/v1", api_key=key, max_retries=0, timeout=20)


def say(d: DaemonProcess, key: str) -> str:
    msg = anthropic.Anthropic(base_url=d.url, api_key=key, max_retries=0, timeout=20).messages.create(
        model="qwen3", max_tokens=20, messages=USER)
    return msg.content[0].text  # type: ignore[union-attr]


def test_keys_become_required_once_one_exists_on_every_route(env):
    d, up = env
    # No key yet: loopback is open, as before.
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 200
    status = orjson.loads(corectl(d, "--json", "status").stdout)
    assert status["keys"]["team_keys_required"] is False and sum(status["keys"]["counts"].values()) == 0

    alice = create(d, "alice", "--monthly-usd", "5", "--rpm", "60", "--tpm", "100000", "--concurrency", "2",
                   "--note", "alice's laptop")
    assert alice.startswith("crk_") and len(alice) >= 47

    # Without a key, now: 401 on every route, in each caller's shape, loopback included.
    bare = httpx.post(d.url + "/v1/messages", json={"model": "qwen3", "max_tokens": 5, "messages": USER},
                      headers={"anthropic-version": "2023-06-01"}, timeout=10)
    assert bare.status_code == 401 and bare.json()["type"] == "error"
    assert bare.json()["error"]["type"] == "authentication_error"
    assert "requires an API key" in bare.json()["error"]["message"]
    with pytest.raises(anthropic.AuthenticationError) as ea:
        anthropic.Anthropic(base_url=d.url, api_key="sk-ant-not-ours", max_retries=0).messages.create(
            model="qwen3", max_tokens=5, messages=USER)
    assert ea.value.status_code == 401 and "invalid API key" in str(ea.value)
    with pytest.raises(openai.AuthenticationError) as eo:
        oai(d, "sk-something-else").chat.completions.create(model="qwen3", messages=USER)  # type: ignore[arg-type]
    assert eo.value.status_code == 401 and eo.value.body["type"] == "authentication_error"  # type: ignore[index]
    assert httpx.get(d.url + "/v1/models", timeout=10).status_code == 401
    ct = httpx.post(d.url + "/v1/messages/count_tokens", timeout=10,
                    json={"model": "qwen3", "messages": USER})
    assert ct.status_code == 401 and ct.json()["error"]["type"] == "authentication_error"
    assert httpx.post(d.url + "/v1/responses", json={"model": "qwen3", "input": "hi"}, timeout=10).status_code == 401

    # With alice's key: x-api-key (Claude Code's header), Bearer (OpenAI SDKs, Codex), x-goog-api-key.
    assert say(d, alice)
    r = oai(d, alice).chat.completions.create(model="qwen3", messages=USER)  # type: ignore[arg-type]
    assert r.choices[0].message.content
    g = httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers={"x-goog-api-key": alice}, timeout=20)
    assert g.status_code == 200
    assert oai(d, alice).models.list().data
    n = anthropic.Anthropic(base_url=d.url, api_key=alice, max_retries=0).messages.count_tokens(
        model="qwen3", messages=USER)
    assert n.input_tokens > 0
    # The client's key never went upstream.
    for req in up.requests:
        assert alice not in orjson.dumps(req).decode()

    # Revoked: 401 naming the key.
    assert corectl(d, "keys", "revoke", "alice").returncode == 0
    with pytest.raises(anthropic.AuthenticationError) as ea:
        say(d, alice)
    assert "'alice' was revoked at" in str(ea.value) and alice not in str(ea.value)
    # Still required: revoking the last key does not reopen loopback.
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 401
    status = orjson.loads(corectl(d, "--json", "status").stdout)
    assert status["keys"]["team_keys_required"] is True and status["keys"]["counts"]["revoked"] == 1
    human = corectl(d, "status").stdout
    assert "required on every request" in human and "other machines cannot connect" in human
    # Deleting the last (revoked) key: nothing is required any more, as before the first key.
    assert corectl(d, "keys", "delete", "alice").returncode == 0
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 200


def test_scope_expiry_update_and_rotation(env_op):
    d, up = env_op
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20).status_code == 401
    assert say(d, OPERATOR)  # the operator's key, before and after team keys exist
    bob = create(d, "bob", "--profiles", "coding", "--models", "qwen*,claude-haiku-*")
    # Its profile and models: served.
    ok = httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20,
                    headers={"authorization": f"Bearer {bob}", "x-coderouter-profile": "coding"})
    assert ok.status_code == 200
    # Another profile: 403 naming what it may use.
    with pytest.raises(anthropic.PermissionDeniedError) as ea:
        anthropic.Anthropic(base_url=d.url, api_key=bob, max_retries=0).messages.create(
            model="qwen3", max_tokens=5, messages=USER)
    assert "'bob' may not use profile 'default'" in str(ea.value) and "profiles coding" in str(ea.value)
    # A model outside its globs: 403, OpenAI's shape.
    with pytest.raises(openai.PermissionDeniedError) as eo:
        openai.OpenAI(base_url=d.url + "/v1", api_key=bob, max_retries=0,
                      default_headers={"x-coderouter-profile": "coding"}).chat.completions.create(
            model="gpt-5", messages=USER)  # type: ignore[arg-type]
    assert "model 'gpt-5'" in str(eo.value) and "models qwen*, claude-haiku-*" in str(eo.value)
    # /v1/models lists what it may use.
    listed = {m.id for m in oai(d, bob).models.list().data}
    assert listed == {"qwen3", "profile:coding"}
    assert say(d, OPERATOR)  # operator keys have no scope and no limits
    for req in up.requests:
        assert OPERATOR not in orjson.dumps(req).decode() and bob not in orjson.dumps(req).decode()

    # Expired: 401 saying when.
    carol = create(d, "carol", "--expires", "2020-01-01")
    with pytest.raises(openai.AuthenticationError) as eo:
        oai(d, carol).chat.completions.create(model="qwen3", messages=USER)  # type: ignore[arg-type]
    assert "'carol' expired at 2020-01-02T00:00:00Z" in str(eo.value)
    r = corectl(d, "keys", "update", "carol", "--expires", "2099-12-31T18:00:00Z", "--rpm", "10")
    assert r.returncode == 0 and "10 rpm" in r.stdout
    assert oai(d, carol).chat.completions.create(model="qwen3", messages=USER)  # type: ignore[arg-type]

    # Rotation with a grace: both work; without: the old one stops at once.
    r = corectl(d, "--json", "keys", "rotate", "carol", "--grace", "3600")
    assert r.returncode == 0
    carol2 = orjson.loads(r.stdout)["key"]
    assert carol2 != carol and orjson.loads(r.stdout)["record"]["previous_secret_until"]
    assert say(d, carol) and say(d, carol2)
    carol3 = orjson.loads(corectl(d, "--json", "keys", "rotate", "carol").stdout)["key"]
    assert say(d, carol3)
    with pytest.raises(anthropic.AuthenticationError):
        say(d, carol2)

    # The list and show never carry a secret; bad options are usage errors.
    listing = corectl(d, "--json", "keys", "list")
    assert listing.returncode == 0
    for secret in (bob, carol, carol2, carol3):
        assert secret not in listing.stdout and secret[8:20] not in listing.stdout
    names = [k["name"] for k in orjson.loads(listing.stdout)["keys"]]
    assert names == ["bob", "carol"]
    assert corectl(d, "keys", "create", "x y").returncode == 1
    assert corectl(d, "keys", "create", "bob").returncode == 1  # exists
    assert corectl(d, "keys", "update", "carol", "--rpm", "lots").returncode == 2
    assert corectl(d, "keys", "update", "carol").returncode == 2
    assert corectl(d, "keys", "show", "nobody").returncode == 1


def test_repeated_failures_are_slowed_and_audited_without_locking_out_others(env):
    d, _up = env
    dave = create(d, "dave")
    for _ in range(8):
        r = httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers={"authorization": "Bearer crk_guess"},
                       timeout=20)
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid API key for this coderouterd"
    # The same source with a valid key is served (the delay is for refusals only).
    assert httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {dave}"},
                      timeout=20).status_code == 200
    audit = d.state_dir / "audit.jsonl"

    def lines() -> list[dict]:
        try:
            return [orjson.loads(x) for x in audit.read_bytes().splitlines()]
        except FileNotFoundError:
            return []

    wait_for(lambda: any(x["kind"] == "auth_throttled" for x in lines()), 10, "the throttle's audit line")
    kinds = [x["kind"] for x in lines()]
    assert kinds.count("auth_throttled") == 1
    assert kinds.count("auth_refused") == 1  # eight refusals of one kind from one source: one line a minute
    created = [x for x in lines() if x["kind"] == "key"]
    assert created and created[0]["name"] == "dave" and created[0]["action"] == "created"


def test_no_secret_is_left_in_clear_at_rest(env, tmp_path):
    d, _up = env
    secrets = [create(d, "erin", "--monthly-usd", "1"), create(d, "frank", "--note", "ci")]
    for s in secrets:
        assert say(d, s)
    rotated = orjson.loads(corectl(d, "--json", "keys", "rotate", "erin", "--grace", "60").stdout)["key"]
    secrets.append(rotated)
    assert say(d, rotated)
    corectl(d, "keys", "revoke", "frank")
    with pytest.raises(anthropic.AuthenticationError):
        say(d, secrets[1])
    # Let the write-behind of last use and the journal reach the disk, then stop the daemon (its final flush).
    time.sleep(0.5)
    d.stop()
    export = cli.corectl(["journal", "export", "--state-dir", str(d.state_dir), "--local"])
    assert export.returncode == 0, export.stderr
    exported = export.stdout
    assert len(exported.splitlines()) >= 3  # the requests above, journaled
    haystack: list[tuple[Path, bytes]] = [(p, p.read_bytes()) for p in Path(d.tmp).rglob("*")
                                          if p.is_file() and not p.is_socket()]
    assert any(p.name == "state.db" for p, _ in haystack) and any(p.name == "audit.jsonl" for p, _ in haystack)
    haystack.append((Path("journal export"), exported.encode()))
    for secret in secrets:
        for needle in (secret, secret[4:]):
            found = [str(p) for p, data in haystack if needle.encode() in data]
            assert not found, f"a secret in clear in {found}"


def test_dashboard_login_takes_a_team_key_until_it_is_revoked(env):
    d, _up = env
    gina = create(d, "gina")
    page = {"host": f"127.0.0.1:{d.port}", "origin": f"http://127.0.0.1:{d.port}"}
    assert httpx.get(d.url + "/ui/api/now", timeout=10).status_code == 401
    bad = httpx.post(d.url + "/ui/login", data={"key": "crk_wrong"}, headers=page, timeout=10)
    assert bad.status_code == 401
    r = httpx.post(d.url + "/ui/login", data={"key": gina}, headers=page, timeout=10)
    assert r.status_code == 303
    cookie = r.headers["set-cookie"].split(";")[0]
    assert gina not in cookie and cookie.startswith("coderouter_ui=t.gina.")
    assert httpx.get(d.url + "/ui/api/now", headers={"cookie": cookie}, timeout=10).status_code == 200
    corectl(d, "keys", "revoke", "gina")
    assert httpx.get(d.url + "/ui/api/now", headers={"cookie": cookie}, timeout=10).status_code == 401


def test_beyond_loopback_a_valid_key_passes_the_host_check_and_every_report_says_so(tmp_path):
    """N13: host = "0.0.0.0" with keys and no allowed_hosts refused every other machine, even with a valid key.
    A request carrying a valid key is no rebound browser: it is served under whatever name the machine used."""
    with FakeServer("openai", name="local", models=["qwen3"]) as up:
        cfg = daemon_config(providers={"local": openai_at(up.url, model="qwen3")}, profiles={"default": warn("local")},
                            server={"host": "0.0.0.0", "api_keys": [OPERATOR]})
        d = DaemonProcess(cfg, tmp_path)
        check = cli.run_module("coderouterd", ["--config", str(d.config_path), "--check"], env=d.env)
        assert check.returncode == 0, check.stderr
        assert "other machines: served only with a valid API key" in check.stdout
        assert "a wrong key: 401; without a key: 403" in check.stdout
        d.start()
        try:
            remote = {"host": f"192.0.2.10:{d.port}"}  # the name another machine reaches it by
            refused = httpx.post(d.url + "/v1/chat/completions", json=CHAT, headers=remote, timeout=20)
            assert refused.status_code == 403 and refused.json()["error"]["type"] == "permission_error"
            assert "valid API key" in refused.json()["error"]["message"]
            wrong = httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20,
                               headers={**remote, "authorization": "Bearer crk_not-a-key"})
            assert wrong.status_code == 401  # refused as a wrong key (and counted against its source)
            # A rebinding page could add a header, but not a valid key: what it may read stays closed.
            for p in ("/", "/metrics", "/v1/models"):
                r = httpx.get(d.url + p, headers={**remote, "x-api-key": "crk_guess"}, timeout=10)
                assert r.status_code in (401, 403), p
            op = httpx.post(d.url + "/v1/chat/completions", json=CHAT, timeout=20,
                            headers={**remote, "authorization": f"Bearer {OPERATOR}"})
            assert op.status_code == 200
            hal = create(d, "hal")
            team = anthropic.Anthropic(base_url=d.url, api_key=hal, max_retries=0, default_headers=remote)
            assert team.messages.create(model="qwen3", max_tokens=5, messages=USER).content
            status = orjson.loads(corectl(d, "--json", "status").stdout)
            assert "served only with a valid API key" in status["keys"]["remote_access"]
            assert "served only with a valid API key" in corectl(d, "status").stdout
            assert "other machines: served only with a valid API key" in d.log()
        finally:
            d.stop()


def test_an_expiry_writes_one_audit_line(env):
    d, _up = env
    soon = datetime.fromtimestamp(time.time() + 2, UTC).isoformat(timespec="seconds")
    ivan = create(d, "ivan", "--expires", soon)
    audit = d.state_dir / "audit.jsonl"

    def expired() -> list[dict]:
        try:
            recs = [orjson.loads(x) for x in audit.read_bytes().splitlines()]
        except FileNotFoundError:
            return []
        return [r for r in recs if r["kind"] == "key" and r["action"] == "expired"]

    assert wait_for(lambda: expired(), 30), "no audit line for the expiry"
    with pytest.raises(anthropic.AuthenticationError) as ea:
        say(d, ivan)
    assert "'ivan' expired at" in str(ea.value)
    time.sleep(2.5)  # more than two rounds of the expiry scan: still one line
    lines = expired()
    assert len(lines) == 1 and lines[0]["name"] == "ivan" and lines[0]["detail"]["expired_at"].startswith(soon[:16])


def test_metrics_need_a_key_once_team_keys_exist(env):
    """/metrics names every key with its requests, tokens, spend and refusals: once team keys are required it is
    read with a valid key, like every other route ([metrics] bearer_token, when set, is the scraper's instead)."""
    d, _up = env
    assert httpx.get(d.url + "/metrics", timeout=10).status_code == 200  # no key yet: loopback open, as before
    alice = create(d, "alice")
    bare = httpx.get(d.url + "/metrics", timeout=10)
    assert bare.status_code == 401 and "coderouter_" not in bare.text
    assert httpx.get(d.url + "/metrics", headers={"authorization": "Bearer crk_guess"}, timeout=10).status_code == 401
    ok = httpx.get(d.url + "/metrics", headers={"authorization": f"Bearer {alice}"}, timeout=10)
    assert ok.status_code == 200 and "coderouter_requests_total" in ok.text
