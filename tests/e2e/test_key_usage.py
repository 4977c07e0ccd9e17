"""Who spent what, on the real daemon with real team keys (issue 41): requests made with the official anthropic and
openai SDKs are journaled with their key's name (never the secret), refusals that name a key too; `corectl --json
usage --by key`, `corectl journal tail --key` and `corectl explain` read them back; /metrics carries the key on
requests, tokens, cost and refusals; the dashboard's Keys view shows each key against its cap."""

from __future__ import annotations

import os

import anthropic
import httpx
import openai
import orjson
import pytest

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.config import daemon_config, openai_at, warn
from tests.support.daemon import DaemonProcess
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

COST = {"input": 3.0, "output": 15.0}
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture
def team(tmp_path):
    with FakeServer("openai", name="cloud", models=["m"]) as up:
        cfg = daemon_config(providers={"cloud": openai_at(up.url, model="m", paid=True, cost=COST)},
                            profiles={"default": warn("cloud"), "coding": warn("cloud")})
        d = DaemonProcess(cfg, tmp_path).start()
        try:
            yield d
        finally:
            d.stop()


def corectl(d: DaemonProcess, *args: str):
    env = {**os.environ, "CODEROUTER_SOCKET": str(d.state_dir / "coderouterd.sock"),
           "CODEROUTER_STATE_DIR": str(d.state_dir)}
    return cli.corectl(list(args), env=env)


def create(d: DaemonProcess, name: str, *opts: str) -> str:
    r = corectl(d, "--json", "keys", "create", name, *opts)
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)["key"]


def _usage(d: DaemonProcess) -> dict:
    r = corectl(d, "--json", "usage", "--by", "key")
    assert r.returncode == 0, r.stderr
    return orjson.loads(r.stdout)


def test_requests_and_refusals_are_counted_per_key_everywhere(team):
    d = team
    alice = create(d, "alice", "--monthly-usd", "10", "--profiles", "default")
    bob = create(d, "bob", "--profiles", "coding")
    carol = create(d, "carol")
    create(d, "dave")  # never used: listed all the same, with nothing spent
    assert corectl(d, "keys", "revoke", "carol").returncode == 0

    claude = anthropic.Anthropic(base_url=d.url, api_key=alice, max_retries=0, timeout=20)
    for i in range(2):
        claude.messages.create(model="m", max_tokens=20, messages=USER, extra_headers={"x-request-id": f"alice-{i}"})
    codex = openai.OpenAI(base_url=d.url + "/v1", api_key=bob, max_retries=0, timeout=20)
    codex.chat.completions.create(model="m", messages=USER, extra_headers={"x-coderouter-profile": "coding"})
    with pytest.raises(openai.PermissionDeniedError):  # 403: outside bob's scope
        codex.chat.completions.create(model="m", messages=USER, extra_headers={"x-request-id": "bob-denied"})
    with pytest.raises(anthropic.AuthenticationError):  # 401: carol's key was revoked
        anthropic.Anthropic(base_url=d.url, api_key=carol, max_retries=0, timeout=20).messages.create(
            model="m", max_tokens=20, messages=USER)
    with pytest.raises(openai.AuthenticationError):  # 401: a key nobody has: counted, never journaled
        openai.OpenAI(base_url=d.url + "/v1", api_key="crk_" + "x" * 40, max_retries=0,
                      timeout=20).chat.completions.create(model="m", messages=USER)

    # corectl usage --by key: one entry per key, from the journal
    def all_journaled() -> dict | None:
        u = _usage(d)
        return u if sum(e["requests"] for e in u["keys"]) == 5 else None

    usage = wait_for(all_journaled)
    assert usage, _usage(d)
    by = {e["name"]: e for e in usage["keys"]}
    assert sorted(by) == ["alice", "bob", "carol", "dave"]
    assert (by["dave"]["requests"], by["dave"]["last_used"]) == (0, None)
    assert by["alice"]["requests"] == 2 and by["alice"]["refusals"] == {}
    assert by["alice"]["input_tokens"] > 0 and by["alice"]["output_tokens"] > 0 and by["alice"]["spend_usd"] > 0
    assert by["bob"]["requests"] == 2 and by["bob"]["refusals"] == {"key_scope": 1}
    assert by["carol"]["refusals"] == {"key_revoked": 1} and by["carol"]["spend_usd"] == 0
    assert by["alice"]["last_used"] is not None and usage["no_key"] is None

    # journal --key and explain name the key
    r = corectl(d, "--json", "journal", "tail", "--key", "alice")
    assert r.returncode == 0 and [x["request_id"] for x in orjson.loads(r.stdout)["rows"]] == ["alice-0", "alice-1"]
    r = corectl(d, "--json", "explain", "alice-1")
    assert r.returncode == 0 and orjson.loads(r.stdout)["trace"]["key"] == "alice"
    r = corectl(d, "--json", "explain", "bob-denied")  # a refusal, from the journal
    assert r.returncode == 0 and orjson.loads(r.stdout)["trace"]["key"] == "bob"
    r = corectl(d, "usage")
    assert r.returncode == 0 and "alice" in r.stdout and "key_scope 1" in r.stdout

    # /metrics: the key on requests, tokens, cost and refusals
    s = scrape(d, alice)  # team keys exist: /metrics is read with one
    assert total(s, "coderouter_requests_total", key="alice") == 2
    assert total(s, "coderouter_tokens_total", key="alice", kind="input") == by["alice"]["input_tokens"]
    assert total(s, "coderouter_cost_usd_total", key="alice") == pytest.approx(by["alice"]["spend_usd"])
    assert total(s, "coderouter_refusals_total", key="bob", reason="key_scope") == 1
    assert total(s, "coderouter_refusals_total", key="carol", reason="key_revoked") == 1
    assert total(s, "coderouter_refusals_total", key="", reason="key_unknown") == 1

    # the dashboard's Keys view: alice against her cap, from the same journal
    view = httpx.get(d.url + "/ui/api/keys", headers={"authorization": f"Bearer {alice}"}, timeout=10).json()
    keys = {k["name"]: k for k in view["keys"]}
    assert keys["alice"]["cap_usd"] == 10.0 and keys["alice"]["spend_usd"] == pytest.approx(by["alice"]["spend_usd"])
    assert keys["carol"]["state"] == "revoked" and view["registry"] is True
    # the same view on the admin socket, for scripts
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(d.state_dir / "coderouterd.sock")),
                      base_url="http://coderouterd", timeout=10) as admin:
        admin_view = admin.get("/v1/history/keys", params={"range": "1h"}).json()
        assert admin.get("/v1/history/keys", params={"range": "2y"}).status_code == 400
    assert {k["name"]: k["spend_usd"] for k in admin_view["keys"]} == {n: k["spend_usd"] for n, k in keys.items()}

    # never a secret at rest: the journal holds names only
    db = (d.state_dir / "state.db").read_bytes() + b"".join(
        p.read_bytes() for p in d.state_dir.glob("state.db-wal"))
    for secret in (alice, bob, carol):
        assert secret.encode() not in db
