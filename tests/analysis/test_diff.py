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


@pytest.mark.skipif(SKIP is not None, reason=str(SKIP))
def test_diff_shows_the_extra_path_and_its_cost(tmp_path, capsys):
    from hwtrace.record import record_software
    from hwtrace.record.perfdata import write_perf_data

    exe = str(compile_program(PROGRAM, "diff", ("-O2", "-g0")))
    runs = []
    for traced in ("0", "1"):
        rec = record_software([exe, traced], calls=["work"])
        path = tmp_path / f"run{traced}.data"
        write_perf_data(rec, path)
        runs.append(str(path))
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


def test_a_path_never_called_has_no_per_call_figure():
    """The function tracing began in is entered without a call: its total
    is the run's, not a figure per call (it read as 0 calls of N each)."""
    from hwtrace.analysis.diff import Difference, Stats

    root = Difference("small;_start", Stats(calls=0, insn=36_364), Stats(calls=0, insn=36_400))
    work = Difference("small;_start;work", Stats(calls=4, insn=400), Stats(calls=4, insn=480))
    assert root.a.per_call("insn") is None and root.delta_per_call("insn") is None
    assert root.delta("insn") == 36
    assert work.a.per_call("insn") == 100.0 and work.delta_per_call("insn") == 20.0
