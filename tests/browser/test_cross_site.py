"""Another site's page in real Chromium tries to spend the user's budget through the API on loopback.

A page served from another origin (http://localhost:P, a different site from 127.0.0.1) tries the three ways a
page can POST without asking: `fetch` with a text/plain body (no preflight), an auto-submitted form, and
`navigator.sendBeacon`. Each reaches the daemon, is refused (the daemon counts it in /metrics, which is the
event the test waits for), and nothing reaches the upstream or is journaled as served. A page under a name
rebound to 127.0.0.1 is refused by Host. A listed origin (`[server] cors_origins`) gets a real preflight and a
readable answer: access can be opened deliberately."""

from __future__ import annotations

import http.server
import threading

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.config import daemon_config
from tests.support.daemon import DaemonProcess, free_port
from tests.support.metrics import scrape, total
from tests.support.wait import wait_for

from .conftest import REBOUND_HOST

ATTACK = """<!doctype html><html><body>
<iframe name="sink" style="display:none"></iframe>
<form id="f" method="POST" action="@API@/v1/chat/completions" target="sink" enctype="text/plain">
<input name='{"model":"m","messages":[{"role":"user","content":"spend","x":"' value='"}]}'>
</form>
<script>
const body = JSON.stringify({model: "m", messages: [{role: "user", content: "spend"}]});
window.results = {};
fetch("@API@/v1/chat/completions", {method: "POST", mode: "no-cors", body: body})
  .then(() => window.results.fetch = "sent", e => window.results.fetch = "error: " + e);
fetch("@API@/v1/messages", {method: "POST", body: body, headers: {"content-type": "text/plain"}})
  .then(r => window.results.read = "read " + r.status, e => window.results.read = "blocked");
window.results.beacon = navigator.sendBeacon("@API@/v1/chat/completions", new Blob([body]));
document.getElementById("f").submit();
</script></body></html>"""

FRIEND = """<!doctype html><html><body><script>
fetch("@API@/v1/chat/completions", {method: "POST", headers: {"content-type": "application/json"},
      body: JSON.stringify({model: "m", messages: [{role: "user", content: "hi"}]})})
  .then(r => r.json()).then(j => window.answer = j.choices[0].message.content, e => window.answer = "error: " + e);
</script></body></html>"""


class _Pages:
    """A static web server on loopback standing in for other sites: path -> HTML."""

    def __init__(self, pages: dict[str, str]) -> None:
        self.port = free_port()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (the stdlib's name)
                page = outer.pages.get(self.path)
                data = (page or "not here").encode()
                self.send_response(200 if page else 404)
                self.send_header("content-type", "text/html; charset=utf-8")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        self.pages = pages
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _posts(up) -> int:
    return sum(1 for r in up.requests if r["method"] == "POST")


def _refused(d) -> float:
    return total(scrape(d), "coderouter_browser_refused_total")


def _wait(cond, timeout: float = 30.0) -> bool:
    return bool(wait_for(cond, timeout, step=0.1))


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    pages = _Pages({})
    friend_origin = f"http://localhost:{pages.port}"
    with FakeServer("openai", name="local") as up:
        cfg = daemon_config(providers={"local": up.url}, profiles={"default": ["local"]},
                            server={"cors_origins": [friend_origin]})
        d = DaemonProcess(cfg, tmp_path_factory.mktemp("cross_site")).start()
        api = d.url  # http://127.0.0.1:PORT: the address every page aims at
        pages.pages["/attack.html"] = ATTACK.replace("@API@", api)
        pages.pages["/friend.html"] = FRIEND.replace("@API@", api)
        try:
            yield d, up, pages
        finally:
            d.stop()
            pages.close()


def test_another_sites_page_cannot_spend_through_fetch_a_form_or_a_beacon(page, site):
    d, up, pages = site
    up.reset()
    before = _refused(d)
    # Served under another site's name (the browser resolves it to 127.0.0.1), not a listed origin.
    page.goto(f"http://{REBOUND_HOST}:{pages.port}/attack.html")
    page.wait_for_function("() => window.results.fetch && window.results.read", timeout=30_000)
    results = page.evaluate("() => window.results")
    assert results["read"] == "blocked", results  # the answer is never readable either
    # Four requests were sent (two fetches, the beacon, the form): wait until the daemon has refused all four.
    assert _wait(lambda: _refused(d) >= before + 4), (before, _refused(d))
    assert _posts(up) == 0
    journal = httpx.get(d.url + "/ui/api/requests", timeout=10).json()
    assert not [r for r in journal.get("requests", []) if r.get("status") == 200], journal


def test_a_rebound_name_is_refused_by_host(page, site):
    d, up, _pages = site
    up.reset()
    answer = page.goto(f"http://{REBOUND_HOST}:{d.port}/v1/models")
    assert answer.status == 403
    assert "allowed_hosts" in page.content()
    # The same page, same-origin with the rebound name, cannot POST either.
    out = page.evaluate("""async () => {
        const r = await fetch("/v1/chat/completions", {method: "POST", headers: {"content-type": "application/json"},
            body: JSON.stringify({model: "m", messages: [{role: "user", content: "spend"}]})});
        return r.status;
    }""")
    assert out == 403
    assert _posts(up) == 0


def test_a_listed_origin_is_answered_with_cors(page, site):
    d, up, pages = site
    up.reset()
    page.goto(f"http://localhost:{pages.port}/friend.html")
    page.wait_for_function("() => window.answer !== undefined", timeout=30_000)
    answer = page.evaluate("() => window.answer")
    assert isinstance(answer, str) and not answer.startswith("error"), answer
    assert _posts(up) == 1
