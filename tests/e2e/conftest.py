from __future__ import annotations

import pytest

from tests.fakes.runner import FakeServer
from tests.support.daemon import DaemonProcess


@pytest.fixture
def start_daemon(tmp_path):
    started: list[DaemonProcess] = []

    def _start(config_text: str, **kw) -> DaemonProcess:
        d = DaemonProcess(config_text, tmp_path, **kw)
        started.append(d)
        return d.start()

    yield _start
    for d in started:
        d.stop()


@pytest.fixture
def fake_openai():
    with FakeServer("openai", name="local") as f:
        yield f


@pytest.fixture
def fake_anthropic():
    with FakeServer("anthropic", name="cloud") as f:
        yield f
