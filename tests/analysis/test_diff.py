"""``hwtrace diff``: two recordings of a program, one of which runs extra
code inside the traced calls (as a software tracer's probe would)."""

from __future__ import annotations

import json

import pytest
from test_record_software import SKIP, compile_program

from hwtrace.cli.main import main

PROGRAM = r"""
#include <stdlib.h>
#define NOINLINE __attribute__((noinline))
static volatile long sink;
NOINLINE void probe(long x) { for (int i = 0; i < 5; i++) sink += x * i; }
NOINLINE long step(long x, int traced) {
    if (traced)
        probe(x);
    return x * 3 + 1;
}
NOINLINE long work(long n, int traced) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += step(i, traced);
    return s;
}
int main(int argc, char **argv) {
    return (int)(work(10, argc > 1 && atoi(argv[1])) & 1);
}
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[str]:
    """The program recorded without and with its probe."""
    if SKIP is not None:
        pytest.skip(str(SKIP))
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    exe = str(compile_program(PROGRAM, "diff", ("-O2", "-g0")))
    tmp = tmp_path_factory.mktemp("diff")
    out = []
    for traced in ("0", "1"):
        rec = record_software([exe, traced], calls=["work"])
        path = tmp / f"run{traced}.data"
        write_perf_data(rec, path)
        out.append(str(path))
    return out


def test_diff_shows_the_extra_path_and_its_cost(runs, tmp_path, capsys):
    out = tmp_path / "d.json"
    folded = tmp_path / "d.folded"
    capsys.readouterr()
    assert main(["diff", *runs, "--json", str(out), "--folded-diff", str(folded)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    paths = {p["key"]: p for p in data["paths"]}
    probe = next(k for k in paths if k.endswith("!probe"))
    assert paths[probe]["only_in"] == "b" and paths[probe]["b"]["calls"] == 10
    step = next(k for k in paths if k.endswith("!step"))
    a, b = paths[step]["a"], paths[step]["b"]
    assert a["calls"] == b["calls"] == 10
    # The recorded call: tracing begins at work's first instruction, a call
    # of it though the call instruction is not in the trace.
    work = step.rsplit(";", 1)[0]
    assert work.endswith("!work") and paths[work]["a"]["calls"] == paths[work]["b"]["calls"] == 1
    # Each traced step runs probe in full: the extra instructions per call
    # are probe's, plus the call and the test that leads to it.
    extra = (b["insn"] - a["insn"]) / 10
    per_probe = paths[probe]["b"]["insn"] / 10
    assert per_probe < extra < per_probe + 8
    assert data["paths"][0]["key"] in (probe, step, paths[step]["key"].rsplit(";", 1)[0])
    functions = {f["key"]: f for f in data["functions"]}
    assert functions[probe.rsplit(";", 1)[1]]["only_in"] == "b"
    assert any(line.startswith(probe + " 0 ") for line in folded.read_text().splitlines())
    assert "B" in text and "probe" in text


def test_paths_are_named_alike_one_at_a_time_and_all_at_once(runs):
    """diff names a profile's addresses all at once (each symbol table
    searched once); :meth:`CallPathProfile.name` one at a time, as the
    reports do."""
    import argparse

    from hwtrace.analysis.feed import CallPathProfile, CodeNames
    from hwtrace.cli.perfinput import decode_session, open_session

    args = argparse.Namespace(input=runs[1], symfs=None, kcore=None, vmlinux=None,
                              kallsyms=None, call=[], all=True, group="comm")  # fmt: skip
    opened = open_session("test", args)
    paths = CallPathProfile(opened.sideband, "comm")
    try:
        decode_session("test", opened, paths.feed)
    finally:
        paths.close()
    result = paths.result()
    addrs = [a for _, a in result.paths] + [0x1234, result.paths[0][1] + 1]
    one = [paths.name(a) for a in addrs]
    assert sum("!probe" in n for n in one) == 1 and one[-2] == ""
    # (names found are kept: a new CodeNames of the same symbols)
    fresh = CodeNames()
    fresh.tables, fresh.images = paths._feed.names.tables, paths._feed.names.images
    assert fresh.names(addrs, with_module=True) == one


def test_a_path_never_called_has_no_per_call_figure():
    """The function tracing began in is entered without a call: its total
    is the run's, not a figure per call (it read as 0 calls of N each)."""
    from hwtrace.analysis.diff import Difference, Stats

    root = Difference("small;_start", Stats(calls=0, insn=36_364), Stats(calls=0, insn=36_400))
    work = Difference("small;_start;work", Stats(calls=4, insn=400), Stats(calls=4, insn=480))
    assert root.a.per_call("insn") is None and root.delta_per_call("insn") is None
    assert root.delta("insn") == 36
    assert work.a.per_call("insn") == 100.0 and work.delta_per_call("insn") == 20.0
