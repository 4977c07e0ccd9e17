"""tests/support/config.py writes the TOML the hand-written test configs did, and the daemon accepts it."""

from __future__ import annotations

import tomllib

from coderouterd.config.loader import parse_config_text
from tests.support.config import daemon_config, upstream


def test_the_built_config_reads_back_as_the_values_it_was_built_from():
    text = daemon_config(
        server={"stream_hold_s": 0.3},
        breaker={"failures": 3, "recovery_s": 1.5},
        providers={"bad": "http://127.0.0.1:1", "cloud": upstream("http://127.0.0.1:2", kind="anthropic",
                                                                  timeouts={"connect": 1}, paid=True),
                   "managed": {"base_url": "http://127.0.0.1:3/v1",
                               "process": {"command": ["python", "-c", 'print("a \\\\ b")'], "startsecs": 0.2}}},
        profiles={"default": ["bad", "cloud"], "chain": {"providers": ["managed"], "health_action": "warn"}},
        routes=[{"model": "*passthrough*", "profile": "default"}],
        extra='[affinity]\nclone_min_tokens = 128\n')
    assert "port = {PORT}\n" in text
    got = tomllib.loads(text.replace("{PORT}", "8088"))
    assert got == {
        "server": {"port": 8088, "stream_hold_s": 0.3},
        "breaker": {"failures": 3, "recovery_s": 1.5},
        "providers": {"bad": {"base_url": "http://127.0.0.1:1/v1"},
                      "cloud": {"base_url": "http://127.0.0.1:2/v1", "kind": "anthropic", "timeouts": {"connect": 1},
                                "paid": True},
                      "managed": {"base_url": "http://127.0.0.1:3/v1",
                                  "process": {"command": ["python", "-c", 'print("a \\\\ b")'], "startsecs": 0.2}}},
        "profiles": {"default": {"providers": ["bad", "cloud"]},
                     "chain": {"providers": ["managed"], "health_action": "warn"}},
        "routes": [{"model": "*passthrough*", "profile": "default"}],
        "affinity": {"clone_min_tokens": 128},
    }
    cfg = parse_config_text(text.replace("{PORT}", "8088"), "test")
    assert cfg.providers["managed"].process is not None and cfg.profiles["chain"].providers == ["managed"]
