"""`corectl usage --by key`, `corectl journal --key` and the key in `corectl explain`, on a journal written by the
store (the daemon stopped: these read the state directory)."""

from __future__ import annotations

import orjson
import pytest

from corectl.__main__ import main
from tests.unit.test_key_usage import _journal, _month_events


@pytest.fixture
def sdir(tmp_path):
    _journal(tmp_path / "state.db", _month_events())
    return tmp_path


def _run(capsys, sdir, *argv: str) -> tuple[int, str, str]:
    code = main(["--socket", str(sdir / "none.sock"), *argv, "--state-dir", str(sdir)])
    out, err = capsys.readouterr()
    return code, out, err


def test_usage_by_key_as_json_is_one_entry_per_key(capsys, sdir):
    code, out, err = _run(capsys, sdir, "--json", "usage", "--by", "key", "--month", "2026-03")
    assert code == 0, err
    data = orjson.loads(out)
    assert data["month"] == "2026-03" and data["by"] == "key"
    assert [e["name"] for e in data["keys"]] == ["alice", "bob", "carol", "dave"]
    alice = data["keys"][0]
    assert {k: alice[k] for k in ("requests", "input_tokens", "output_tokens", "cached_tokens")} == {
        "requests": 5, "input_tokens": 400, "output_tokens": 60, "cached_tokens": 50}
    assert alice["spend_usd"] == pytest.approx(0.75)
    assert alice["refusals"] == {"key_rpm": 1, "key_scope": 1}
    assert alice["last_used"] == "2026-03-03T00:00:00Z"
    assert data["no_key"]["requests"] == 1


def test_usage_table_names_each_key_its_spend_and_refusals(capsys, sdir, monkeypatch):
    monkeypatch.setenv("COLUMNS", "160")
    code, out, err = _run(capsys, sdir, "usage", "--month", "2026-03")
    assert code == 0, err
    assert "Usage by key, 2026-03" in out
    line = next(ln for ln in out.splitlines() if "alice" in ln)
    assert "$0.75" in line and "key_rpm 1" in line and "key_scope 1" in line
    assert "(no team key)" in out and "never" not in next(ln for ln in out.splitlines() if "dave" in ln)


@pytest.mark.parametrize(("argv", "message"), [(["usage", "--month", "2026-13"], "--month: '2026-13' is not a month"),
                                               (["usage", "--by", "provider"], "--by must be key")])
def test_usage_refuses_a_bad_month_or_grouping(capsys, sdir, argv, message):
    code, _out, err = _run(capsys, sdir, *argv)
    assert code == 2 and message in err


def test_usage_on_an_unreadable_journal_is_one_line_and_exit_1(capsys, tmp_path):
    (tmp_path / "state.db").write_bytes(b"not a database, " * 256)
    code, out, err = _run(capsys, tmp_path, "usage")
    assert code == 1 and err == f"corectl: cannot read the journal {tmp_path / 'state.db'}: file is not a database\n"


def test_journal_tail_and_export_filter_by_key(capsys, sdir, monkeypatch):
    code, out, _ = _run(capsys, sdir, "--json", "journal", "tail", "--key", "bob")
    assert code == 0 and [r["request_id"] for r in orjson.loads(out)["rows"]] == ["b1", "b2"]
    code, out, _ = _run(capsys, sdir, "journal", "export", "--key", "-")
    assert code == 0 and [orjson.loads(x)["request_id"] for x in out.splitlines()] == ["o1"]
    assert orjson.loads(out.splitlines()[0])["key_name"] is None
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = _run(capsys, sdir, "journal", "tail", "--key", "alice", "-n", "3")
    assert code == 0 and "Key" in out and out.count("alice") == 3


def test_explain_from_the_journal_names_the_key(capsys, sdir):
    code, out, err = _run(capsys, sdir, "--json", "explain", "c1")
    assert code == 0, err
    assert orjson.loads(out)["trace"]["key"] == "carol"
    code, out, _ = _run(capsys, sdir, "explain", "c1")
    assert code == 0 and "carol" in out


def test_months_before_any_request_say_so(capsys, sdir):
    code, _out, err = _run(capsys, sdir, "usage", "--month", "2025-01")
    assert code == 0 and "no requests in 2025-01" in err
