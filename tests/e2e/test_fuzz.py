"""Property-based fuzzing of every model ingress against the real daemon: hostile mutations of real client
bodies never get a 5xx, every error is in the caller's shape, and the daemon keeps serving. Bounded for CI
(derandomized, a few hundred cases); bench/fuzz.py runs the same generator for 25,000+ cases."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fakes.runner import FakeServer
from tests.support.config import anthropic_at, daemon_config, openai_at
from tests.support.daemon import running
from tests.support.hostile import INGRESSES, check_response, hostile_body, typed_cases

EXAMPLES = 300  # per ingress: ~1,200 requests, well under a minute on a loaded 2-core machine


@pytest.fixture(scope="module")
def daemon(tmp_path_factory):
    with FakeServer("openai", name="oa") as oa, FakeServer("anthropic", name="an") as an:
        vision = {"vision": True}
        text = daemon_config(server={"max_body_mb": 4}, profiles={"default": ["oa"], "cloud": ["an"]},
                             providers={"oa": openai_at(oa.url, capabilities=vision),
                                        "an": anthropic_at(an.url, capabilities=vision)})
        with running(text, tmp_path_factory.mktemp("fuzz")) as d:
            with httpx.Client(base_url=d.url, timeout=20) as client:
                yield d, client


@pytest.mark.parametrize("ingress", sorted(INGRESSES))
def test_hostile_bodies_never_get_a_5xx(daemon, ingress):
    d, client = daemon
    path, shape, base = INGRESSES[ingress]
    failures: list[str] = []

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(body=hostile_body(base), profile=st.sampled_from(["default", "cloud"]))
    def run(body: bytes, profile: str) -> None:
        r = client.post(path, content=body, headers={"content-type": "application/json",
                                                     "x-coderouter-profile": profile,
                                                     "anthropic-version": "2023-06-01"})
        problem = check_response(r.status_code, r.headers, r.content, shape)
        if problem:
            failures.append(f"{profile}: {problem}\n  body: {body[:400]!r}")

    run()
    assert not failures, f"{len(failures)} bad answers; first ones:\n" + "\n".join(failures[:5])
    assert client.get("/healthz").status_code == 200
    assert d.proc.poll() is None


@pytest.mark.parametrize("ingress", ["responses", "chat", "gemini"])
def test_every_place_given_every_type_never_gets_a_5xx(daemon, ingress):
    """Typed cases: each place of a Codex-shaped body (tool outputs as content parts, namespaced and custom
    tools, arguments) holding each JSON type, through a chat upstream and through an Anthropic one (where the
    translation goes deepest: arguments parsed back into objects)."""
    d, client = daemon
    path, shape, base = INGRESSES[ingress]
    failures: list[str] = []
    cases = typed_cases(base)
    for where, body in cases:
        for profile in ("default", "cloud"):
            r = client.post(path, content=body, headers={"content-type": "application/json",
                                                         "x-coderouter-profile": profile})
            problem = check_response(r.status_code, r.headers, r.content, shape)
            if problem:
                failures.append(f"{profile} {where}: {problem}")
    assert not failures, f"{len(failures)} of {2 * len(cases)} bad answers; first ones:\n" + "\n".join(failures[:5])
    assert client.get("/healthz").status_code == 200
    assert d.proc.poll() is None
