"""Decoding a perf.data as a stream keeps the trace's pages resident only
where the decoder is: a queue's trace spooled from several AUXTRACE
records into a mapped temporary file, decoded range by range, is let go
behind it (the last window of each range included)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from hwtrace.perf.data import read_perf_data
from hwtrace.perf.records import RecordType
from hwtrace.session.perfflow import stream_perf

HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]

LOOP = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long spin(long n) {
    long x = 0;
    for (long i = 0; i < n; i++)
        if ((unsigned)(i * 2654435761u) >> 31) x++;
    return x;
}
int main(int argc, char **argv) { printf("%ld\n", spin(atol(argv[1]))); return 0; }
"""


def _spooled_resident_kb() -> int:
    """Resident KiB of this process's mappings of deleted files (the
    spooled queue traces)."""
    total, mapping = 0, ""
    with open("/proc/self/smaps") as f:
        for line in f:
            if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
                mapping = line
            elif line.startswith("Rss:") and "(deleted)" in mapping:
                total += int(line.split()[1])
    return total


def test_spooled_trace_is_let_go_behind_the_decoder(tmp_path):
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    exe = compile_program(LOOP, "spin-loop", ("-O1",))
    out = tmp_path / "loop.data"
    got = subprocess.run([*HWTRACE, "record", "--backend", "patch", "--no-mtc", "-o", str(out),
                          "-f", "spin", "--", str(exe), "100000000"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    data = read_perf_data(out)
    aux = data.auxtrace_columns()
    trace_kb = int(aux["size"].sum()) >> 10
    assert len(aux["size"]) >= 2 and trace_kb > 8 << 10  # spooled, several MiB
    assert (data.records["type"] == RecordType.AUXTRACE).sum() == len(aux["size"])
    peak = 0

    def on_blocks(_) -> None:
        nonlocal peak
        peak = max(peak, _spooled_resident_kb())

    stream_perf(data, on_blocks)
    # (a few windows and the kernel's fault-around: 2 MiB here; all of it
    # when the ranges' last windows were not let go)
    assert 0 < peak < trace_kb // 4, (peak, trace_kb)
