"""Issue 36 item 2: "why is provider X getting no traffic?" has one answer, and `corectl status`, the admin view,
the dashboard's data and /metrics all show it, for a provider whose breaker real requests opened."""

from __future__ import annotations

import os
import re

import httpx
import orjson

from tests.fakes.runner import FakeServer
from tests.support import cli
from tests.support.daemon import DaemonProcess, admin_get
from tests.support.metrics import scrape, series
from tests.support.wait import wait_for


def _config(bad: str, good: str) -> str:
    return f"""
[server]
port = {{PORT}}
[breaker]
failures = 2
recovery_s = 600
[providers.bad]
base_url = "{bad}/v1"
[providers.good]
base_url = "{good}/v1"
[profiles.default]
providers = ["bad", "good"]
"""


def _without_seconds(why: str) -> str:
    """The words with the countdown taken out: each view is read a moment apart."""
    return re.sub(r"retry in \d+ s", "retry in N s", why)


def _metric(d: DaemonProcess) -> dict[str, tuple[str, float]]:
    return {lab["provider"]: (lab["reason"], v) for lab, v in series(scrape(d), "coderouter_provider_available")}


def test_corectl_status_the_admin_view_the_dashboard_and_metrics_give_one_answer(tmp_path):
    with FakeServer("openai", name="bad", behaviour="500") as bad, FakeServer("openai", name="good") as good:
        d = DaemonProcess(_config(bad.url, good.url), tmp_path).start()
        try:
            for _ in range(2):  # two failed generations on bad, each served by good: bad's breaker opens
                r = httpx.post(d.url + "/v1/chat/completions", timeout=20,
                               json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 200 and r.headers["x-coderouter-provider"] == "good"
            sock = str(d.state_dir / "coderouterd.sock")

            def bad_answer() -> dict | None:
                rows = admin_get(sock, "/v1/providers")
                if rows is None:
                    return None
                rows = rows["providers"] if isinstance(rows, dict) else rows
                a = next(p for p in rows if p["name"] == "bad")["availability"]
                return a if a["code"] == "breaker_open" else None

            admin = wait_for(bad_answer, timeout=30)
            assert admin, "bad's breaker never showed open in the admin view"
            assert admin["available"] is False and admin["failures"] == 2
            assert re.fullmatch(r"breaker open after 2 failures, retry in \d+ s", admin["why"]), admin["why"]
            words = _without_seconds(admin["why"])

            env = {k: v for k, v in os.environ.items() if not k.startswith("CODEROUTER_")}
            env["COLUMNS"] = "400"  # wide enough that no line of the answer is folded
            js = cli.corectl(["--socket", sock, "status", "--json"], env=env)
            assert js.returncode == 0, js.stderr
            status = {p["name"]: p["availability"] for p in orjson.loads(js.stdout)["providers"]}
            assert status["bad"]["code"] == "breaker_open" and _without_seconds(status["bad"]["why"]) == words
            assert status["good"] == {**status["good"], "available": True, "code": "ok"}

            human = cli.corectl(["--socket", sock, "status"], env=env)
            assert human.returncode == 0, human.stderr
            row = next(x for x in human.stdout.splitlines() if "│ bad " in x)
            assert "down: breaker open" in row  # the one state word, in the table
            lines = [_without_seconds(x.strip()) for x in human.stdout.splitlines()]
            assert f"bad: no traffic: {words}" in lines  # the words, below it

            now = httpx.get(d.url + "/ui/api/now", timeout=10).json()
            dash = {p["name"]: p["availability"] for p in now["providers"]}
            assert dash["bad"]["code"] == "breaker_open" and _without_seconds(dash["bad"]["why"]) == words

            metric = _metric(d)
            assert metric["bad"] == ("breaker_open", 0.0) and metric["good"] == ("ok", 1.0)
        finally:
            d.stop()
