"""The dashboard's HTTP surface on the real daemon, without a browser (tests/browser/ has the browser's side):
the same view-models as the admin API, only its own files, read-only, the live feed ending with the server,
and a switch to turn it off."""

from __future__ import annotations

import httpx
import pytest

from tests.fakes.runner import FakeServer
from tests.support.wait import wait_for

CONFIG = """
[server]
port = {PORT}
drain_timeout_s = 10
@SERVER@

[state]
enabled = @STATE@

[providers.cloud]
kind = "anthropic"
base_url = "@CLOUD@/v1"
model = "claude-sonnet-5"
paid = true
monthly_budget_usd = 10
cost = { input = 3.0, output = 15.0 }

[profiles.default]
providers = ["cloud"]
"""


@pytest.fixture(scope="module")
def cloud():
    with FakeServer("anthropic", name="cloud") as f:
        yield f


def _config(cloud, *, server: str = "", state: bool = True) -> str:
    return (CONFIG.replace("@CLOUD@", cloud.url).replace("@SERVER@", server)
            .replace("@STATE@", "true" if state else "false"))


def _chat(d, rid: str) -> None:
    r = httpx.post(d.url + "/v1/chat/completions", headers={"x-request-id": rid}, timeout=20,
                   json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text


def _admin(d) -> httpx.Client:
    sock = str(d.state_dir / "coderouterd.sock")
    return httpx.Client(transport=httpx.HTTPTransport(uds=sock), base_url="http://coderouterd", timeout=10)


def _wait_admin(admin: httpx.Client) -> None:
    def answers() -> bool:
        try:
            return admin.get("/v1/status").status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_for(answers, 30), "the admin API did not answer"


def test_the_page_reads_the_admin_apis_view_models(start_daemon, cloud):
    d = start_daemon(_config(cloud))
    _chat(d, "dash-1")
    ui = d.url + "/ui/api"
    assert wait_for(lambda: httpx.get(ui + "/requests").json()["requests"], 30)  # the journal's writer: every 250 ms
    with _admin(d) as admin:
        _wait_admin(admin)
        for path in ("/history/spend", "/history/requests?limit=5&provider=cloud", "/history/trends?range=6h"):
            page = httpx.get(ui + path.replace("/history", "")).json()
            api = admin.get("/v1" + path).json()
            if "t" in page:  # the window ends at "now", read twice a few ms apart
                page.pop("t"), api.pop("t")
            assert page == api, path
        providers = admin.get("/v1/providers").json()["providers"]
    now = httpx.get(ui + "/now").json()
    assert [p["name"] for p in now["providers"]] == [p["name"] for p in providers] == ["cloud"]
    assert now["providers"][0]["budget"]["spent"] > 0
    spend = httpx.get(ui + "/spend").json()
    assert spend["providers"]["cloud"]["daily"][spend["today"]] == pytest.approx(
        spend["providers"]["cloud"]["spent"])  # the journal's day and the budget ledger agree
    trace = httpx.get(ui + "/requests/dash-1").json()
    assert trace["source"] == "memory" and trace["trace"]["served_by"] == "cloud"
    assert httpx.get(ui + "/requests/nope").status_code == 404


def test_only_its_own_files_read_only_and_strict_headers(start_daemon, cloud):
    d = start_daemon(_config(cloud))
    page = httpx.get(d.url + "/ui")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "<script>" not in page.text and "style=" not in page.text  # no inline code: the CSP would block it
    assert not any(k.startswith("access-control-") for k in page.headers)
    for name in ("app.js", "ui.css", "uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE.txt"):
        r = httpx.get(f"{d.url}/ui/static/{name}")
        assert r.status_code == 200 and r.content, name
        assert r.headers["x-content-type-options"] == "nosniff"
    assert "MIT License" in httpx.get(d.url + "/ui/static/uPlot.LICENSE.txt").text
    for path in ("/ui/static/index.html", "/ui/static/login.html", "/ui/static/vendor/LICENSE",
                 "/ui/static/../app.py", "/ui/static/%2e%2e/app.py", "/ui/app.py", "/ui/api/../../healthz"):
        r = httpx.get(d.url + path)
        assert r.status_code == 404 or (path.endswith("healthz") and r.status_code == 200), path
        assert "import" not in r.text, path
    for method in ("POST", "PUT", "DELETE"):
        r = httpx.request(method, d.url + "/ui/api/now")
        assert r.status_code == 405, method
        assert "content-security-policy" in r.headers
    # A request that names the dashboard's path but another Host: refused before anything is read.
    r = httpx.get(d.url + "/ui/api/now", headers={"host": f"attacker.example:{d.port}"})
    assert r.status_code == 403 and "cloud" not in r.text


def test_an_open_live_feed_does_not_hold_up_the_stop(start_daemon, cloud):
    # A drain timeout (600 s) far beyond the stop's own wait (60 s): a stop held up by the feed would be killed,
    # and say so by its exit code, whatever the machine's load. No time is asserted.
    d = start_daemon(_config(cloud).replace("drain_timeout_s = 10", "drain_timeout_s = 600"))
    with httpx.stream("GET", d.url + "/ui/api/events", timeout=20) as feed:
        assert feed.status_code == 200 and feed.headers["content-type"] == "text/event-stream"
        lines = feed.iter_lines()
        assert next(lines).startswith("retry:")
        _chat(d, "dash-live-1")
        for line in lines:  # the stream's own read timeout (20 s) is the ceiling; no time is asserted
            if line.startswith("data:"):
                assert "dash-live-1" in line and '"messages"' not in line
                break
        assert d.stop(timeout=60) == 0  # the feed ended at once instead of making the stop wait for it


def test_without_a_journal_and_switched_off(start_daemon, cloud, tmp_path):
    d = start_daemon(_config(cloud, state=False))
    _chat(d, "dash-mem-1")
    reqs = httpx.get(d.url + "/ui/api/requests").json()
    assert reqs["source"] == "memory" and reqs["requests"][0]["request_id"] == "dash-mem-1"
    assert httpx.get(d.url + "/ui/api/trends").json()["journal"] is False
    d.stop()
    off = start_daemon(_config(cloud, server="dashboard = false"))
    for path in ("/ui", "/ui/api/now", "/ui/static/app.js"):
        assert httpx.get(off.url + path).status_code == 404, path
    assert httpx.get(off.url + "/healthz").status_code == 200


def test_with_keys_the_page_and_its_data_need_one(start_daemon, cloud):
    d = start_daemon(_config(cloud, server='api_keys = ["dash-key"]'))
    page = httpx.get(d.url + "/ui")
    assert page.status_code == 401 and 'name="key"' in page.text and "providers-table" not in page.text
    assert httpx.get(d.url + "/ui/api/now").status_code == 401
    assert httpx.get(d.url + "/ui/api/now", headers={"x-api-key": "wrong"}).status_code == 401
    assert httpx.get(d.url + "/ui/api/now", headers={"x-api-key": "dash-key"}).status_code == 200
    own = {"origin": d.url}
    assert httpx.post(d.url + "/ui/login", data={"key": "dash-key"},
                      headers={"origin": "http://attacker.example"}).status_code == 403
    wrong = httpx.post(d.url + "/ui/login", data={"key": "nope"}, headers=own)
    assert wrong.status_code == 401 and "set-cookie" not in wrong.headers
    ok = httpx.post(d.url + "/ui/login", data={"key": "dash-key"}, headers=own)
    assert ok.status_code == 303 and ok.headers["location"] == "/ui"
    cookie = ok.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "dash-key" not in cookie
    jar = {"cookie": cookie.split(";")[0]}
    assert httpx.get(d.url + "/ui/api/now", headers=jar).status_code == 200
    assert httpx.get(d.url + "/ui", headers=jar).status_code == 200
    # The proxy's clients are unaffected: the same key still opens /v1, the cookie does not.
    assert httpx.get(d.url + "/v1/models", headers=jar).status_code == 401


def test_every_answer_is_typed_by_the_admin_apis_models(start_daemon, cloud):
    from coderouterd.admin import apitype

    d = start_daemon(_config(cloud))
    for i in range(3):
        _chat(d, f"dash-typed-{i}")
    ui = d.url + "/ui/api"
    assert wait_for(lambda: len(httpx.get(ui + "/requests").json()["requests"]) >= 3, 30)
    models = {"/now": apitype.DashboardNow, "/profiles": apitype.ProfilesAnswer, "/spend": apitype.SpendAnswer,
              "/trends?range=1h": apitype.TrendsAnswer, "/requests": apitype.HistoryRequestsAnswer,
              "/requests/dash-typed-0": apitype.DashboardTrace}
    for path, model in models.items():
        model.model_validate(httpx.get(ui + path).json())  # raises on any disagreement
    with _admin(d) as admin:
        _wait_admin(admin)
        assert httpx.get(ui + "/profiles").json() == admin.get("/v1/profiles").json()
    # Paging: the page after the newest two is the oldest one.
    first = httpx.get(ui + "/requests?limit=2").json()["requests"]
    assert [r["request_id"] for r in first] == ["dash-typed-2", "dash-typed-1"]
    older = httpx.get(ui + "/requests", params={"limit": 2, "before": first[-1]["ts"]}).json()["requests"]
    assert [r["request_id"] for r in older] == ["dash-typed-0"]
    assert httpx.get(ui + "/requests?before=soon").status_code == 400
    # The tokens over time agree with the journal's rows.
    trends = httpx.get(ui + "/trends?range=1h").json()["providers"]["cloud"]
    rows = httpx.get(ui + "/requests").json()["requests"]
    assert sum(v or 0 for v in trends["input_tokens"]) == sum(r["input_tokens"] for r in rows)
    assert sum(v or 0 for v in trends["output_tokens"]) == sum(r["output_tokens"] for r in rows)
    assert sum(v or 0 for v in trends["requests"]) == 3


def test_head_and_revalidation_of_the_page_and_its_files(start_daemon, cloud):
    d = start_daemon(_config(cloud))
    head = httpx.head(d.url + "/ui")
    assert head.status_code == 200 and head.content == b"" and int(head.headers["content-length"]) > 1000
    for path in ("/ui", "/ui/static/app.js", "/ui/static/ui.css"):
        r = httpx.get(d.url + path)
        etag = r.headers["etag"]
        assert r.headers["cache-control"] == "no-cache" and etag.startswith('"'), path
        again = httpx.get(d.url + path, headers={"if-none-match": etag})
        assert again.status_code == 304 and again.content == b"" and again.headers["etag"] == etag, path
    assert httpx.head(d.url + "/ui/api/now").status_code == 405  # the data is read with GET only
