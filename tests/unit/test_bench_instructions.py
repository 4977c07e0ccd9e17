"""bench/instructions.py reads valgrind's counts right: the `summary:` line of cachegrind's and callgrind's out
files (matched to the `events:` line), and cg_annotate's PROGRAM TOTALS. The samples are valgrind 3.19's own
output, cut to the lines that matter plus a cost line each; valgrind itself never runs in the suite."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.instructions import fit_common_background, instructions, parse_annotate_ir, parse_summary

CACHEGRIND_CACHE_SIM = """\
desc: I1 cache:         32768 B, 64 B, 8-way associative
desc: D1 cache:         32768 B, 64 B, 8-way associative
desc: LL cache:         268435456 B, 64 B, direct-mapped
cmd: /bin/true
events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
fl=???
fn=???
0 131 24 23 44 5 0 17 1 1
summary: 127771 1091 1072 29403 1225 1015 10266 343 311
"""

CACHEGRIND_IR_ONLY = """\
desc: I1 cache:
cmd: python -m coderouterd
events: Ir
fl=/usr/lib/libc.so.6
fn=memcpy
0 5000
summary: 1389422
"""

# A dump by client request: `summary:` is the whole process since the previous dump; `totals:` follows it.
CALLGRIND_DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 9365
cmd:  python bench/instructions.py --daemon TREE LIB 5 8 -- --config c.toml
part: 2

desc: I1 cache:
desc: Trigger: Client Request: openai

positions: line
events: Ir
summary: 33794916

ob=(1) /usr/lib/x86_64-linux-gnu/libc.so.6
fl=(1) ???
fn=(1) 0x0000000000028d90
0 12
calls=1 0
0 7000

totals: 36393444
"""

CALLGRIND_TOTALS_ONLY = """\
events: Ir Dr
fn=main
3 100 40
totals: 987654 321
"""


def test_cachegrind_summary_with_cache_simulation_maps_every_event() -> None:
    got = parse_summary(CACHEGRIND_CACHE_SIM)
    assert got["Ir"] == 127771
    assert got["D1mr"] == 1225
    assert got["DLmw"] == 311
    assert len(got) == 9


def test_cachegrind_instructions_only() -> None:
    assert parse_summary(CACHEGRIND_IR_ONLY) == {"Ir": 1389422}


def test_callgrind_dump_reads_summary_not_totals() -> None:
    # The two differ after a ZERO_STATS; the harness relies on summary (every thread since the previous dump).
    assert parse_summary(CALLGRIND_DUMP) == {"Ir": 33794916}


def test_totals_when_there_is_no_summary() -> None:
    assert parse_summary(CALLGRIND_TOTALS_ONLY) == {"Ir": 987654, "Dr": 321}


def test_trailing_zero_events_may_be_left_out() -> None:
    assert parse_summary("events: Ir Dr Dw\nsummary: 10 4\n") == {"Ir": 10, "Dr": 4, "Dw": 0}


def test_trailing_space_after_the_event_names() -> None:
    # cachegrind 3.19 writes "events: Ir I1mr ... DLmw " with a space at the end.
    assert parse_summary("events: Ir Dr \nsummary: 7 3\n") == {"Ir": 7, "Dr": 3}


@pytest.mark.parametrize("text", ["", "events: Ir\nfn=x\n0 5\n", "summary: 5\n", "events: Ir\nsummary: 5x\n"])
def test_not_an_out_file_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_summary(text)


def test_instructions_reads_a_file(tmp_path: Path) -> None:
    p = tmp_path / "cg.out.9365.2"
    p.write_text(CALLGRIND_DUMP)
    assert instructions(p) == 33794916


def test_cg_annotate_program_totals() -> None:
    text = (
        "--------------------------------------------------------------------------------\n"
        "Ir               I1mr           ILmr           Dr\n"
        "--------------------------------------------------------------------------------\n"
        "127,771 (100.0%) 1,091 (100.0%) 1,072 (100.0%) 29,403 (100.0%)  PROGRAM TOTALS\n"
    )
    assert parse_annotate_ir(text) == 127771
    assert parse_annotate_ir("1,290,334,112  PROGRAM TOTALS\n") == 1290334112
    with pytest.raises(ValueError):
        parse_annotate_ir("Ir\n--\n")


def test_common_background_fit_recovers_each_sides_count() -> None:
    # Two sides with the same 0.8 M/s background and 1.60 M vs 1.64 M per request, at varied wall times.
    pts = {"base": [(w, 1.60e6 + 0.8e6 * w) for w in (0.064, 0.181, 0.120)],
           "this": [(w, 1.64e6 + 0.8e6 * w) for w in (0.211, 0.072)]}
    fit = fit_common_background(pts)
    assert fit is not None
    slope, icpt = fit
    assert slope == pytest.approx(0.8e6)
    assert icpt["base"] == pytest.approx(1.60e6)
    assert icpt["this"] == pytest.approx(1.64e6)


def test_common_background_fit_needs_varied_wall_times() -> None:
    assert fit_common_background({"a": [(0.1, 5.0), (0.1, 6.0)], "b": [(0.2, 7.0)]}) is None
