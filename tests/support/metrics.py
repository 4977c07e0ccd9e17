"""Reading a daemon's /metrics in tests, one way: the Prometheus client library's own parser, so a test reads
the exposition as a scraper does (a line the format does not allow fails the parse) rather than by splitting
lines.

    samples = scrape(d)                                     # every sample: (name, sorted labels) -> value
    total(samples, "coderouter_requests_total", provider="good", status="200")
    series(samples, "coderouter_provider_available")        # [(labels, value), ...] for per-label views
"""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def scrape(d, token: str | None = None, *, timeout: float = 10.0) -> Samples:
    """GET `d.url`/metrics (with the scrape token, if the config sets one) and parse it; it must answer 200."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(d.url + "/metrics", headers=headers, timeout=timeout)
    assert r.status_code == 200, r.text
    return parse(r.text)


def series(samples: Samples, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """The samples named `name` whose labels include `labels`, each as (all its labels, value)."""
    out = []
    for (n, lab), v in samples.items():
        got = dict(lab)
        if n == name and all(got.get(k) == x for k, x in labels.items()):
            out.append((got, v))
    return out


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum over the samples named `name` whose labels include `labels` (0 when there is none)."""
    return sum(v for _lab, v in series(samples, name, **labels))
