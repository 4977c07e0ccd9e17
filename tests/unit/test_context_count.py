"""The context gate's token figure per provider (routing/context_count.py): the ratio a server's reported
prompt_tokens taught replaces the plain estimate, and a server's own count replaces both."""

from __future__ import annotations

import orjson

from coderouterd.routing.request import ClientRequest
from tests.support.routing import Routing, chain_config


def _request(chars: int) -> ClientRequest:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x" * chars}]}
    return ClientRequest(ingress="anthropic", body=body, raw=orjson.dumps(body), headers={}, stream=False,
                         model="m", request_id="req_test")


def _plan(r: Routing, req: ClientRequest, counts=None):
    profile = r.runtime.config.profiles["default"]
    return r.router.plan("default", profile, r.runtime, req, counts=counts)


def test_the_ratio_a_server_reported_replaces_the_plain_estimate():
    r = Routing(chain_config("small", "big", provider_extra={"small": "context_window = 1000"}))
    req = _request(6000)  # ~1,500 tokens by the plain estimate
    plan = _plan(r, req)
    assert plan.candidates == ["big"] and plan.skips[0].reason == "context"
    # Its server counted 600 prompt tokens for 12,000 characters sent (a template that renders less than it is
    # sent): 20 characters a token here, so this prompt is ~300 tokens for it.
    r.runtime.providers["small"].learn_ratio(12_000, 600)
    assert _plan(r, req).candidates == ["small", "big"]
    assert _plan(r, _request(30_000)).candidates == ["big"]  # still too long by the learned ratio


def test_a_servers_own_count_wins_over_any_estimate():
    r = Routing(chain_config("small", "big", provider_extra={"small": "context_window = 1000"}))
    req = _request(6000)
    assert _plan(r, req, counts={"small": 900}).candidates == ["small", "big"]
    plan = _plan(r, _request(100), counts={"small": 1200})
    assert plan.candidates == ["big"]
    assert plan.skips[0].message.startswith("request needs 1,200 tokens by its server")
