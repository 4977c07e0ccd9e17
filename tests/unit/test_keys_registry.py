"""Team keys below the HTTP layer: secrets and their keyed hash, names, the registry's check (and that an unknown
and a wrong secret take the same path), scope, expiry, rotation's grace, and the service over the local store."""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from dataclasses import replace

import pytest

from coderouterd.ingress.auth import KeyGate, presented_key, scope_refusal
from coderouterd.keys import hashing
from coderouterd.keys import registry as registry_mod
from coderouterd.keys.hashing import Hasher, display_prefix, name_problem, new_hash_key, new_secret
from coderouterd.keys.local import NS_KEYS, LocalKeyStorage
from coderouterd.keys.model import SECRET_PREFIX, TeamKey
from coderouterd.keys.record import KeyRecord, KeySettingsError, parse_expiry, with_settings
from coderouterd.keys.registry import Check, KeyRegistry
from coderouterd.keys.service import KeyProblem, KeyService
from coderouterd.state.events import KeyChanged
from coderouterd.state.memory import MemoryStore


class Clock:
    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _record(hasher: Hasher, name: str, secret: str, **kw) -> KeyRecord:
    return KeyRecord(key=TeamKey(name=name, prefix=display_prefix(secret), **kw), digest=hasher.hex(secret))


# -- secrets and hashing ---------------------------------------------------------------------------------------

def test_secrets_are_long_random_and_recognisable():
    secrets = {new_secret() for _ in range(200)}
    assert len(secrets) == 200
    for s in secrets:
        assert s.startswith(SECRET_PREFIX) == (SECRET_PREFIX == "crk_")
        body = s[len(SECRET_PREFIX):]
        assert re.fullmatch(r"[A-Za-z0-9_-]{43}", body)  # 32 bytes of urlsafe base64: 256 bits
    assert hashing.SECRET_BYTES * 8 >= 256
    s = new_secret()
    assert display_prefix(s) == s[:8] and len(display_prefix(s)) < len(s) // 4


def test_keyed_hash_depends_on_the_hash_key_and_never_holds_the_secret():
    s = new_secret()
    a, b = Hasher(new_hash_key()), Hasher(new_hash_key())
    for key in (new_hash_key(), b"k" * 16, b"long" * 40):  # exactly HMAC-SHA256, short and long keys alike
        for msg in (s, "", "é\udcff"):
            assert Hasher(key).digest(msg) == hmac.digest(key, msg.encode("utf-8", "surrogateescape"), "sha256")
    assert a.digest(s) == a.digest(s) and len(a.digest(s)) == 32
    assert a.digest(s) != b.digest(s)
    assert s not in a.hex(s) and s[4:12] not in a.hex(s)
    with pytest.raises(ValueError):
        Hasher(b"short")


@pytest.mark.parametrize("name", ["alice", "bob-2", "ci.nightly", "A_1", "x" * 32])
def test_valid_names(name):
    assert name_problem(name) is None


@pytest.mark.parametrize("name", ["", "-x", ".x", "x" * 33, "a b", "a/b", "al\x1bice", "é", "a:b"])
def test_invalid_names(name):
    assert name_problem(name)


# -- the registry's check --------------------------------------------------------------------------------------

@pytest.fixture
def reg():
    clock = Clock()
    r = KeyRegistry(clock=clock)
    r.set_hash_key(new_hash_key())
    return r, clock


def test_check_ok_unknown_no_key_revoked_expired(reg):
    r, clock = reg
    assert not r.required
    ok, revoked, expired = new_secret(), new_secret(), new_secret()
    assert r.hasher is not None
    r.replace([_record(r.hasher, "alice", ok), _record(r.hasher, "bob", revoked, revoked_at=clock.t - 5),
               _record(r.hasher, "carol", expired, expires_at=clock.t - 1)])
    assert r.required
    assert r.check(ok, clock.t) == (Check.OK, r.get("alice").key)
    assert r.used == {"alice": clock.t}
    assert r.check("", clock.t) == (Check.NO_KEY, None)
    assert r.check(new_secret(), clock.t) == (Check.UNKNOWN, None)
    assert r.check("sk-not-ours", clock.t) == (Check.UNKNOWN, None)
    verdict, key = r.check(revoked, clock.t)
    assert verdict is Check.REVOKED and key is not None and key.name == "bob"
    verdict, key = r.check(expired, clock.t)
    assert verdict is Check.EXPIRED and key is not None and key.name == "carol"
    assert r.counts(clock.t) == {"active": 1, "expired": 1, "revoked": 1}


def test_unknown_and_wrong_secrets_take_the_same_code_path(reg, monkeypatch):
    """Not a timing test: the same calls happen, with arguments of the same sizes, whether the secret is unknown
    or a near miss of a real one (one character off): one HMAC, one dict lookup, one compare_digest."""
    r, clock = reg
    real = new_secret()
    assert r.hasher is not None
    r.replace([_record(r.hasher, "alice", real)])
    calls: list[tuple] = []

    class Counting(Hasher):
        def digest(self, secret: str) -> bytes:
            d = super().digest(secret)
            calls.append(("digest", len(secret), len(d)))
            return d

    r.hasher = Counting(new_hash_key())
    r.replace([_record(r.hasher, "alice", real)])
    calls.clear()
    real_compare = registry_mod.hmac.compare_digest

    def compare(a, b):
        calls.append(("compare", len(a), len(b)))
        return real_compare(a, b)

    monkeypatch.setattr(registry_mod.hmac, "compare_digest", compare)

    wrong = real[:-1] + ("A" if real[-1] != "A" else "B")
    unknown = new_secret()
    assert r.check(wrong, clock.t) == (Check.UNKNOWN, None)
    trace_wrong = list(calls)
    calls.clear()
    assert r.check(unknown, clock.t) == (Check.UNKNOWN, None)
    trace_unknown = list(calls)
    assert trace_wrong == trace_unknown == [("digest", len(real), 32), ("compare", 32, 32)]
    calls.clear()
    assert r.check(real, clock.t)[0] is Check.OK
    assert calls == trace_unknown  # and a hit costs the same as a miss


def test_rotation_grace_keeps_the_old_secret_until_it_ends(reg):
    r, clock = reg
    old, new = new_secret(), new_secret()
    assert r.hasher is not None
    rec = _record(r.hasher, "alice", new)
    r.replace([replace(rec, prev_digest=r.hasher.hex(old), prev_until=clock.t + 60)])
    assert r.check(old, clock.t)[0] is Check.OK
    assert r.check(new, clock.t)[0] is Check.OK
    assert r.check(old, clock.t + 60)[0] is Check.UNKNOWN
    assert r.check(new, clock.t + 60)[0] is Check.OK


def test_scope_refusal_names_what_the_key_may_use():
    key = TeamKey(name="bob", prefix="crk_abcd", profiles=("coding",), models=("qwen*", "claude-haiku-*"))
    assert scope_refusal(key, "coding", "qwen3-coder") is None
    p = scope_refusal(key, "default", "qwen3")
    assert p is not None and p.status == 403 and p.key == "bob"
    assert "'bob'" in p.message and "profile 'default'" in p.message and "profiles coding" in p.message
    m = scope_refusal(key, "coding", "gpt-5")
    assert m is not None and "model 'gpt-5'" in m.message and "models qwen*, claude-haiku-*" in m.message
    assert scope_refusal(TeamKey(name="any", prefix="crk_x"), "x", "y") is None


def test_presented_key_headers():
    assert presented_key({"x-api-key": " a "}) == "a"
    assert presented_key({"authorization": "Bearer b"}) == "b"
    assert presented_key({"authorization": "bearer  c "}) == "c"
    assert presented_key({"x-goog-api-key": "g"}) == "g"
    assert presented_key({"x-api-key": "a", "authorization": "Bearer b"}) == "a"
    assert presented_key({"authorization": "Basic zzz"}) == ""


def test_gate_operator_keys_and_refusals_name_the_key_never_the_secret(reg):
    r, clock = reg
    gate = KeyGate(r, lambda e: None, clock=clock)
    assert not gate.required([]) and gate.required(["op"])
    refusal, key = gate.admit({"x-api-key": "op"}, ["op"])
    assert refusal is None and key is None  # an operator key: no team key, no limits
    refusal, _ = gate.admit({}, ["op"])
    assert refusal is not None and refusal.status == 401
    secret = new_secret()
    assert r.hasher is not None
    r.replace([_record(r.hasher, "alice", secret, revoked_at=clock.t), _record(r.hasher, "bob", (s2 := new_secret()),
                                                                               expires_at=clock.t - 3600)])
    refusal, _ = gate.admit({"x-api-key": secret}, [])
    assert refusal is not None and refusal.reason == "revoked" and "'alice'" in refusal.message
    assert secret not in refusal.message
    refusal, _ = gate.admit({"authorization": f"Bearer {s2}"}, [])
    assert refusal is not None and refusal.reason == "expired" and "expired at 2027-01-15T07:00:00Z" in refusal.message


# -- settings and expiry ----------------------------------------------------------------------------------------

def test_parse_expiry():
    assert parse_expiry("2027-01-01") == 1798761600.0 + 86400  # the end of that day, UTC
    assert parse_expiry("2027-01-01T12:00:00Z") == 1798761600.0 + 43200
    assert parse_expiry("2027-01-01T12:00") == 1798761600.0 + 43200
    assert parse_expiry("2027-01-01T13:00:00+01:00") == 1798761600.0 + 43200
    assert parse_expiry("never") is None
    with pytest.raises(KeySettingsError):
        parse_expiry("next tuesday")


def test_settings_are_checked():
    k = TeamKey(name="a", prefix="crk_x")
    k2 = with_settings(k, {"monthly_usd": 5, "rpm": 30, "profiles": ["coding", "coding"], "models": ["q*"]})
    assert k2.monthly_usd == 5.0 and k2.rpm == 30 and k2.profiles == ("coding",) and k2.models == ("q*",)
    assert with_settings(k2, {"rpm": None, "profiles": None}).rpm is None
    for bad in ({"rpm": 0}, {"rpm": 1.5}, {"monthly_usd": -1}, {"monthly_usd": float("inf")}, {"tpm": True},
                {"profiles": "coding"}, {"note": "x" * 501}, {"secret": "x"}):
        with pytest.raises(KeySettingsError):
            with_settings(k, bad)


# -- the service over the local store ----------------------------------------------------------------------------

@pytest.fixture
def svc():
    clock = Clock()
    store = MemoryStore()
    r = KeyRegistry(clock=clock)
    storage = LocalKeyStorage(store, r)
    storage.load()
    events: list = []
    return KeyService(r, storage, events.append, clock=clock), r, store, events, clock


def test_create_update_rotate_revoke(svc):
    service, r, store, events, clock = svc
    rec, secret = asyncio.run(service.create("alice", {"monthly_usd": 10.0, "rpm": 30, "note": "laptop"}))
    assert secret.startswith("crk_") and rec.key.prefix == secret[:8]
    assert r.required and r.check(secret, clock.t)[0] is Check.OK
    stored = store.get(NS_KEYS, "alice")
    assert stored["monthly_usd"] == 10.0 and secret not in repr(stored) and secret not in repr(store._data)
    assert [type(e) for e in events] == [KeyChanged] and events[0].action == "created"
    assert secret not in repr(events)
    with pytest.raises(KeyProblem) as e:
        asyncio.run(service.create("alice", {}))
    assert e.value.status == 409
    with pytest.raises(KeyProblem) as e:
        asyncio.run(service.create("bad name", {}))
    assert e.value.status == 400

    asyncio.run(service.update("alice", {"rpm": None, "models": ["qwen*"]}))
    assert r.get("alice").key.rpm is None and r.get("alice").key.models == ("qwen*",)
    assert r.get("alice").key.monthly_usd == 10.0  # left out: unchanged

    _rec, new = asyncio.run(service.rotate("alice", 30.0))
    assert r.check(secret, clock.t)[0] is Check.OK and r.check(new, clock.t)[0] is Check.OK
    clock.t += 31
    assert r.check(secret, clock.t)[0] is Check.UNKNOWN and r.check(new, clock.t)[0] is Check.OK
    _rec, newer = asyncio.run(service.rotate("alice", 0))
    assert r.check(new, clock.t)[0] is Check.UNKNOWN and r.check(newer, clock.t)[0] is Check.OK

    asyncio.run(service.revoke("alice"))
    assert r.check(newer, clock.t)[0] is Check.REVOKED
    assert r.required  # a revoked key still closes the door it opened
    with pytest.raises(KeyProblem) as e:
        asyncio.run(service.update("alice", {"rpm": 5}))
    assert e.value.status == 409
    assert [e.action for e in events] == ["created", "updated", "rotated", "rotated", "revoked"]
    # Created again after a revoke: a new secret, the old one stays dead.
    _rec, again = asyncio.run(service.create("alice", {}))
    assert r.check(again, clock.t)[0] is Check.OK and r.check(newer, clock.t)[0] is Check.UNKNOWN
    with pytest.raises(KeyProblem) as e:
        asyncio.run(service.show("nobody"))
    assert e.value.status == 404
    with pytest.raises(KeyProblem) as e:
        asyncio.run(service.delete("alice"))  # active again: revoke first
    assert e.value.status == 409
    asyncio.run(service.revoke("alice"))
    asyncio.run(service.delete("alice"))
    assert store.get(NS_KEYS, "alice") is None and r.get("alice") is None
    assert not r.required  # none left: the door is as it was before the first key
    assert events[-1].action == "deleted"


def test_expiry_is_recorded_once_and_extending_rearms_it(svc):
    service, r, store, events, clock = svc
    asyncio.run(service.create("carol", {"expires_at": clock.t + 10}))
    asyncio.run(service.note_expiries())
    assert [e.action for e in events] == ["created"]
    clock.t += 11
    for _ in range(3):
        asyncio.run(service.note_expiries())
    assert [e.action for e in events] == ["created", "expired"]
    assert store.get(NS_KEYS, "carol")["expiry_noted"] is True
    asyncio.run(service.update("carol", {"expires_at": clock.t + 10}))
    clock.t += 11
    asyncio.run(service.note_expiries())
    assert [e.action for e in events] == ["created", "expired", "updated", "expired"]


def test_last_use_is_written_behind_and_survives_a_reload(svc):
    service, r, store, events, clock = svc
    _rec, secret = asyncio.run(service.create("dave", {}))
    for _ in range(100):
        r.check(secret, clock.t)
    assert store.get(NS_KEYS, "dave")["last_used"] is None  # nothing written per request
    assert asyncio.run(service.show("dave"))["last_used"] == clock.t  # but shown
    asyncio.run(service.flush_used())
    assert store.get(NS_KEYS, "dave")["last_used"] == clock.t
    r2 = KeyRegistry(clock=clock)
    LocalKeyStorage(store, r2).load()  # a restart: the same hash key, the same keys
    assert r2.check(secret, clock.t)[0] is Check.OK and r2.get("dave").last_used == clock.t


def test_a_dashboard_login_with_a_rotated_away_secret_ends_with_its_grace():
    """A cookie is as good as the secret it was made from: one from the previous secret (during a rotation's grace)
    stops working when that secret does, and one from the current secret keeps working."""
    from coderouterd.ui.guard import COOKIE, UiAuth

    clock = Clock(time.time())
    r = KeyRegistry(clock=clock)
    r.set_hash_key(new_hash_key())
    old, new = new_secret(), new_secret()
    assert r.hasher is not None
    rec = _record(r.hasher, "alice", new)
    r.replace([replace(rec, prev_digest=r.hasher.hex(old), prev_until=clock.t + 60)])
    auth = UiAuth(b"s" * 32)

    def cookie(secret: str) -> dict[str, str]:
        set_cookie = auth.login(secret, [], r)
        assert set_cookie is not None
        return {"cookie": set_cookie.split(";")[0]}

    with_old, with_new = cookie(old), cookie(new)
    assert auth.authorized(with_old, [], r) and auth.authorized(with_new, [], r)
    clock.t += 61  # the grace is over: the old secret opens nothing, nor does what was made from it
    assert r.check(old, clock.t)[0] is Check.UNKNOWN
    assert not auth.authorized(with_old, [], r)
    assert auth.authorized(with_new, [], r)
    assert COOKIE in with_new["cookie"]


def test_shared_keys_never_reached_and_none_cached_keep_the_door_closed():
    """[state] backend = "postgres" on an instance that has never read the keys (a new machine, a state directory
    wiped, a container's ephemeral one) while the database is away: whether keys exist is unknown, so requests need
    a key (an operator key: no team key can be checked yet), as the budget refuses capped spend before the
    ledger's first answer. Once the database has answered with no key at all, loopback is open again."""
    from coderouterd.cluster.keys import SharedKeyStorage

    r = KeyRegistry()
    storage = SharedKeyStorage(object(), MemoryStore(), r, tasks=object())  # type: ignore[arg-type]
    storage.load()  # nothing cached, the database not reached yet
    gate = KeyGate(r, lambda e: None)
    assert gate.required([])
    refusal, _ = gate.admit({}, [])
    assert refusal is not None and refusal.status == 401
    refusal, _ = gate.admit({"x-api-key": new_secret()}, [])
    assert refusal is not None and refusal.status == 401
    refusal, key = gate.admit({"x-api-key": "op"}, ["op"])
    assert refusal is None and key is None  # operator keys keep working meanwhile
    r.replace([])  # the database answered: no key exists
    assert not gate.required([])
