"""The dashboard's Keys view-model (admin/key_usage.py) and its endpoint (GET /ui/api/keys): each key's spend
against its cap from the journal, its requests and refusals per bucket, its rate over the last minute against its
limits, and what the "needs attention" strip says: over 80% of the cap, blocked, expiring within 7 days."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from datetime import UTC, datetime
from types import SimpleNamespace

import orjson
import pytest

from coderouterd.admin.key_usage import keys_answer
from coderouterd.keys.model import TeamKey
from coderouterd.state.events import RequestFinished
from coderouterd.state.journal_reader import JournalUnreadable, SqliteJournal
from coderouterd.state.refusals import KEY_EXPIRED, KEY_RPM, refusal_event
from coderouterd.state.store import Store
from coderouterd.ui.app import DashboardApp
from tests.unit.test_ui_app import _call, _daemon

NOW = datetime(2026, 3, 20, 12, 0, tzinfo=UTC).timestamp()
HOUR = 3600.0
DAY = 86_400.0
OK = [{"provider": "cloud", "outcome": "ok", "reason": "ok"}]


@dataclass(frozen=True)
class _Entry:
    key: TeamKey
    last_used: float | None = None


class _Directory:
    required = False  # what the dashboard's gate reads of the registry: no team key required (loopback open)

    def __init__(self, *entries: _Entry) -> None:
        self.entries = list(entries)

    def records(self):
        return self.entries


def _served(rid: str, ts: float, key: str | None, usd: float, tokens: int = 100) -> RequestFinished:
    return RequestFinished(rid, "anthropic", "default", "cloud", ts=ts, key_name=key, cost_usd=usd,
                           input_tokens=tokens, output_tokens=tokens // 2, attempts=OK)


def _events() -> list[RequestFinished]:
    return [
        # alice: 8.50 of her 10 USD, two requests in the last minute
        _served("a1", NOW - 5 * HOUR, "alice", 8.0),
        _served("a2", NOW - 30, "alice", 0.25, tokens=1000),
        _served("a3", NOW - 10, "alice", 0.25, tokens=1000),
        # bob: his rpm refused him twice in the last minute
        _served("b1", NOW - 2 * HOUR, "bob", 0.5),
        refusal_event(request_id="b2", ingress="openai", status=429, reason=KEY_RPM, key_name="bob", ts=NOW - 20),
        refusal_event(request_id="b3", ingress="openai", status=429, reason=KEY_RPM, key_name="bob", ts=NOW - 5),
        # dan: the key guard's own 429 (guards/key_limits.py: error class rate_limited, nothing tried)
        RequestFinished("d1", "anthropic", "default", None, ts=NOW - 15, key_name="dan", status=429,
                        error_class="rate_limited"),
        # ed: a budget refusal in routing (every provider skipped for budget: 402 billing_error)
        RequestFinished("x1", "anthropic", "default", None, ts=NOW - 12, key_name="ed", status=402,
                        error_class="billing_error", attempts=[{"provider": "cloud", "outcome": "skipped",
                                                                "reason": "budget"}]),
        # carol: her cap is spent
        _served("c1", NOW - 3 * HOUR, "carol", 5.0),
        # a key the directory no longer has; an expired key's refusal
        _served("g1", NOW - 4 * HOUR, "ghost", 0.1),
        refusal_event(request_id="e1", ingress="anthropic", status=401, reason=KEY_EXPIRED, key_name="erin",
                      ts=NOW - HOUR),
        _served("o1", NOW - HOUR, None, 1.0),
    ]


def _directory() -> _Directory:
    return _Directory(
        _Entry(TeamKey("alice", "crk_a", monthly_usd=10.0, rpm=30, tpm=10_000, concurrency=2)),
        _Entry(TeamKey("bob", "crk_b", monthly_usd=100.0, rpm=2)),
        _Entry(TeamKey("carol", "crk_c", monthly_usd=5.0)),
        _Entry(TeamKey("dan", "crk_dan", rpm=1)),
        _Entry(TeamKey("dave", "crk_d", expires_at=NOW + 3 * DAY), last_used=NOW - 40 * DAY),
        _Entry(TeamKey("erin", "crk_e", expires_at=NOW - DAY)),
        _Entry(TeamKey("frank", "crk_f", expires_at=NOW + 30 * DAY, revoked_at=NOW - DAY)),
        _Entry(TeamKey("gina", "crk_g", expires_at=NOW + 2 * DAY, revoked_at=NOW - HOUR)),
    )


@pytest.fixture
def journal(tmp_path):
    store = Store(tmp_path / "state.db", flush_interval_s=60, journal_retention_days=36_500)
    store.open()
    store.journal_sink()(_events())
    store.close()
    return SqliteJournal(tmp_path / "state.db")


def _answer(journal, directory=None):
    return asyncio.run(keys_answer(journal, directory, span=DAY, step=1800.0, range_name="24h", now=NOW))


def test_each_key_spend_against_its_cap_rate_now_and_limits(journal):
    a = _answer(journal, _directory())
    keys = {k.name: k for k in a.keys}
    assert sorted(keys) == ["alice", "bob", "carol", "dan", "dave", "ed", "erin", "frank", "ghost", "gina"]
    alice = keys["alice"]
    assert (alice.spend_usd, alice.cap_usd, alice.ratio) == (pytest.approx(8.5), 10.0, pytest.approx(0.85))
    assert alice.rate == {"rpm": 2, "rpm_limit": 30, "tpm": 3000, "tpm_limit": 10_000, "concurrency_limit": 2,
                          "refused_last_minute": 0}
    assert alice.last_used == NOW - 10 and not alice.blocked
    assert keys["dave"].last_used == NOW - 40 * DAY  # from the directory: no row in the journal
    assert (keys["erin"].state, keys["frank"].state, keys["ghost"].state) == ("expired", "revoked", "unknown")
    assert keys["ghost"].cap_usd is None and keys["ghost"].rate["rpm_limit"] is None
    # requests and refusals per bucket of the window: bob's two refusals are in the last bucket
    assert len(a.t) == len(keys["bob"].series["requests"]) == 48 and a.t[-1] < NOW <= a.t[-1] + 1800
    assert sum(keys["bob"].series["requests"]) == 3 and keys["bob"].series["refusals"][-1] == 2
    assert a.registry and a.journal


def test_the_attention_strip_names_near_cap_blocked_and_expiring_keys(journal):
    a = _answer(journal, _directory())
    got = {(x["kind"], x["key"]): x["text"] for x in a.attention}
    assert got == {
        ("key_cap", "alice"): "key alice has used 85% of its monthly cap (8.50 of 10.00 USD)",
        ("key_blocked", "bob"): "key bob is blocked by its rpm limit",
        ("key_blocked", "carol"): "key carol is blocked by its monthly cap (5.00 of 5.00 USD)",
        ("key_blocked", "dan"): "key dan is blocked by its rate limits",
        ("key_blocked", "ed"): "key ed is blocked by a spent budget (its own, a provider's or the global cap)",
        ("key_expiring", "dave"): "key dave expires in 3 days",
    }  # erin expired already, frank and gina are revoked: nothing to warn of


def test_without_a_directory_the_journal_alone_is_shown(journal):
    a = _answer(journal)
    assert not a.registry
    keys = {k.name: k for k in a.keys}
    assert sorted(keys) == ["alice", "bob", "carol", "dan", "ed", "erin", "ghost"]
    assert keys["alice"].cap_usd is None and keys["alice"].state == "unknown"
    # blocked by its rate is still seen from the journal's refusals
    assert [(x["kind"], x["key"]) for x in a.attention] == [("key_blocked", "bob"), ("key_blocked", "dan"),
                                                             ("key_blocked", "ed")]


def test_no_journal_and_no_keys_is_an_empty_view():
    a = _answer(None)
    assert a.keys == [] and a.attention == [] and not a.journal


def test_the_endpoint_answers_the_view_and_refuses_a_bad_range(tmp_path):
    store = Store(tmp_path / "state.db", flush_interval_s=60, journal_retention_days=36_500)
    store.open()
    store.journal_sink()([_served("x1", NOW, "alice", 1.0)])
    store.close()
    d = _daemon(tmp_path)
    d.keys = _Directory(_Entry(TeamKey("zed", "crk_z", monthly_usd=1.0)))
    d.runtime.config.state = SimpleNamespace(backend="sqlite")
    status, _h, body = _call(DashboardApp(d), "/ui/api/keys", query=b"range=30d")
    assert status == 200, body
    data = orjson.loads(body)
    assert data["range"] == "30d" and data["registry"] is True
    assert "zed" in [k["name"] for k in data["keys"]]
    assert b"crk_" not in body  # not even a secret's display prefix is part of the view
    status, _h, body = _call(DashboardApp(d), "/ui/api/keys", query=b"range=2y")
    assert status == 400 and "unknown range" in orjson.loads(body)["error"]


class _Down(SqliteJournal):
    """A shared journal whose database does not answer."""

    def _run(self, sql, args):
        raise JournalUnreadable("postgresql://x@db/cr", "connection refused", shared=True)

    def usage_by_key(self, since, until):
        raise JournalUnreadable("postgresql://x@db/cr", "connection refused", shared=True)


def test_the_shared_journal_is_read_first_and_this_machines_while_it_cannot_be(journal, tmp_path):
    # the shared journal has every instance's rows: here, another instance's alone
    other = tmp_path / "other.db"
    store = Store(other, flush_interval_s=60, journal_retention_days=36_500)
    store.open()
    store.journal_sink()([_served("z1", NOW - 60, "zoe", 4.0)])
    store.close()
    shared = asyncio.run(keys_answer(journal, None, span=DAY, step=1800.0, range_name="24h", now=NOW,
                                     shared=SqliteJournal(other)))
    assert shared.source == "shared" and [k.name for k in shared.keys] == ["zoe"]
    down = asyncio.run(keys_answer(journal, None, span=DAY, step=1800.0, range_name="24h", now=NOW,
                                   shared=_Down(other)))
    assert down.source == "local: the shared journal cannot be read"
    assert "alice" in [k.name for k in down.keys]
