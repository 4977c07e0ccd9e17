"""Issue 41: a client that leaves mid-stream. The upstream (a paid one) streams slowly; the client, an official
SDK, reads part of the answer and closes its stream. What the upstream produced until then was billed: the
journal row names the provider with nonzero tokens (the upstream's count where it reported one, our estimate
of what was relayed where it did not, marked `usage_estimated`), the spend is settled against the provider's
budget and the global one, and no reservation is left held."""

from __future__ import annotations

import sqlite3

import anthropic
import openai
import pytest

from tests.fakes.runner import FakeServer
from tests.support.daemon import DaemonProcess, admin_get
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

# 400 pieces of "tokN " 20 ms apart: eight seconds of answer, of which the client reads about a twentieth.
SLOW = "slow_stream;n=400;delay=0.02"
READ = 20

CONFIG = """
[server]
port = {PORT}

[budget]
global_monthly_usd = 50.0

[providers.cloud]
kind = "anthropic"
base_url = "@ANTHROPIC@/v1"
model = "claude-fake"
paid = true
cost = { input = 3.0, output = 15.0 }
monthly_budget_usd = 20.0

[providers.paid]
kind = "openai"
base_url = "@OPENAI@/v1"
model = "m"
paid = true
cost = { input = 3.0, output = 15.0 }
monthly_budget_usd = 20.0

[profiles.default]
providers = ["cloud"]

[profiles.openai]
providers = ["paid"]
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gone")
    with FakeServer("anthropic", name="cloud", behaviour=SLOW) as cloud, \
            FakeServer("openai", name="paid", models=["m"], behaviour=SLOW) as paid:
        d = DaemonProcess(CONFIG.replace("@ANTHROPIC@", cloud.url).replace("@OPENAI@", paid.url), tmp)
        d.start()
        try:
            yield d, cloud, paid
        finally:
            d.stop()


def _row(d: DaemonProcess, request_id: str) -> dict | None:
    conn = sqlite3.connect(f"file:{d.state_dir / 'state.db'}?mode=ro", uri=True, timeout=5)
    try:
        conn.row_factory = sqlite3.Row
        row = conn.execute("SELECT * FROM journal WHERE request_id = ?", (request_id,)).fetchone()
        return dict(row) if row is not None else None
    finally:
        conn.close()


def _journaled(d: DaemonProcess, request_id: str) -> dict:
    assert wait_for(lambda: _row(d, request_id) is not None, 30), "the request never reached the journal"
    row = _row(d, request_id)
    assert row is not None
    return row


def _budget(d: DaemonProcess) -> dict:
    status = admin_get(d.state_dir / "coderouterd.sock")
    assert status is not None
    return status["budget"]


def _settled(d: DaemonProcess, provider: str, before: float) -> dict:
    """The budget once this request's spend is in: its provider's spend grew, nothing is held."""
    assert wait_for(lambda: _budget(d)["providers"][provider]["spent"] > before, 30), _budget(d)
    return _budget(d)


def _cut_anthropic(d: DaemonProcess) -> str:
    client = anthropic.Anthropic(base_url=d.url, api_key="unused", max_retries=0)
    seen = 0
    with client.messages.stream(model="claude-fake", max_tokens=4000,
                                messages=[{"role": "user", "content": "write a long answer"}]) as stream:
        request_id = stream.response.headers["x-request-id"]
        for event in stream:
            if event.type == "content_block_delta":
                seen += 1
                if seen >= READ:
                    break  # leaving the block closes the stream: the client is gone mid-answer
    return request_id


def _cut_openai(d: DaemonProcess) -> str:
    client = openai.OpenAI(base_url=d.url + "/v1", api_key="unused", max_retries=0,
                           default_headers={"x-coderouter-profile": "openai"})
    seen = 0
    stream = client.chat.completions.create(model="m", max_tokens=4000, stream=True,
                                            messages=[{"role": "user", "content": "write a long answer"}])
    request_id = stream.response.headers["x-request-id"]
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen += 1
            if seen >= READ:
                break
    stream.close()
    return request_id


def _assert_cut(row: dict, provider: str) -> None:
    assert row["provider"] == provider  # not "-": the provider that streamed is named
    assert row["error_class"] == "client_disconnected"
    assert READ <= row["output_tokens"] < 400 * 2, row  # what was produced until the cut, not the whole answer
    assert row["input_tokens"] > 0
    assert row["cost_usd"] > 0


def test_anthropic_upstream_reported_input_tokens_and_the_output_is_estimated(env):
    d, cloud, _ = env
    before = _budget(d)["providers"]["cloud"]["spent"]
    request_id = _cut_anthropic(d)
    row = _journaled(d, request_id)
    _assert_cut(row, "cloud")
    # message_start reported the prompt's tokens: those are the upstream's own count.
    assert row["input_tokens"] == cloud.requests[-1]["prompt_tokens"]
    # Its output count comes only with the final message_delta, which never came: the output is our estimate.
    assert row["usage_estimated"] == 1
    budget = _settled(d, "cloud", before)
    assert budget["providers"]["cloud"]["spent"] - before == pytest.approx(row["cost_usd"], rel=1e-6)
    assert budget["providers"]["cloud"]["reserved"] == 0 and budget["global"]["reserved"] == 0
    assert budget["global"]["spent"] >= budget["providers"]["cloud"]["spent"]
    metrics = scrape(d)
    assert total(metrics, "coderouter_tokens_total", provider="cloud", kind="output") >= row["output_tokens"]


def test_openai_upstream_without_usage_is_estimated_and_marked(env):
    d, _, paid = env
    paid.set_behaviour(SLOW)
    before = _budget(d)["providers"]["paid"]["spent"]
    request_id = _cut_openai(d)
    row = _journaled(d, request_id)
    _assert_cut(row, "paid")
    assert row["usage_estimated"] == 1  # the upstream reports usage only after its last chunk
    budget = _settled(d, "paid", before)
    assert budget["providers"]["paid"]["spent"] - before == pytest.approx(row["cost_usd"], rel=1e-6)
    assert budget["providers"]["paid"]["reserved"] == 0 and budget["global"]["reserved"] == 0


def test_openai_upstream_with_running_usage_is_its_own_count(env):
    d, _, paid = env
    paid.set_behaviour(SLOW + ";usage_each=1")  # every chunk carries the usage so far (vLLM's continuous usage)
    try:
        before = _budget(d)["providers"]["paid"]["spent"]
        request_id = _cut_openai(d)
        row = _journaled(d, request_id)
    finally:
        paid.set_behaviour(SLOW)
    _assert_cut(row, "paid")
    assert row["usage_estimated"] == 0  # the upstream's count covered everything it produced
    budget = _settled(d, "paid", before)
    assert budget["providers"]["paid"]["reserved"] == 0 and budget["global"]["reserved"] == 0
