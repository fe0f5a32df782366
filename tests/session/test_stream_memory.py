"""Decoding a perf.data as a stream keeps the trace's pages resident only
where the decoder is: a queue's trace spooled from several AUXTRACE
records into a mapped temporary file, decoded range by range, is let go
behind it (the last window of each range included)."""

from __future__ import annotations

import re
import subprocess
import sys
import weakref

import pytest

from hwtrace.perf.data import read_perf_data
from hwtrace.perf.records import RecordType
from hwtrace.session.perfflow import SUPERSEDED_SYMBOLS_KEPT, stream_perf

HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]

SPIN = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((noinline)) long spin(long n) {
    long x = 0;
    for (long i = 0; i < n; i++)
        if ((unsigned)(i * 2654435761u) >> 31) x++;
    return x;
}
"""
LOOP = (
    SPIN
    + r"""
int main(int argc, char **argv) { printf("%ld\n", spin(atol(argv[1]))); return 0; }
"""
)


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

    # (batches of 2^18 rows: a reading every ~40 KB of trace, a few a
    # decoder's window; each reads smaps, ~10 ms here, and 2^15-row
    # batches made that the test's time, minutes on a busy machine)
    stream_perf(data, on_blocks, batch_rows=1 << 18)
    # (a few windows and the kernel's fault-around: 2 MiB here; all of it
    # when the ranges' last windows were not let go)
    assert 0 < peak < trace_kb // 4, (peak, trace_kb)


CHAIN = (
    SPIN
    + r"""
int main(int argc, char **argv) {
    long n = atol(argv[1]);
    printf("%ld %ld\n", n, spin(200000));
    fflush(stdout);
    if (n > 0) {
        char next[24];
        snprintf(next, sizeof next, "%ld", n - 1);
        execl("/proc/self/exe", argv[0], next, (char *)0);
    }
    return 0;
}
"""
)


def test_code_of_a_program_exec_d_away_is_let_go(tmp_path):
    """A program that execs another (here itself, seven times) leaves its
    address space for good: a stream lets the decoder's code table of it
    go (and the listing's text with it) once its rows are passed on,
    rather than keep one per program exec'd."""
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    exe = compile_program(CHAIN, "exec-chain", ("-O1",))
    out = tmp_path / "chain.data"
    got = subprocess.run([*HWTRACE, "record", "--backend", "patch", "-o", str(out), "--",
                          str(exe), "7"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.split()[::2] == [str(n) for n in range(7, -1, -1)]
    # (weak references, one an object seen: a table let go frees its
    # address, and the next one may be given it, so id() cannot tell them)
    tables: list[weakref.ref] = []
    symbols: list[weakref.ref] = []
    insns = 0

    def note(seen: list[weakref.ref], obj: object) -> None:
        if not any(ref() is obj for ref in seen):
            seen.append(weakref.ref(obj))

    def on_blocks(b) -> None:
        nonlocal insns
        insns += int(b.ninsn.sum())
        for image, _ in b.images():
            note(tables, b.queue.listing_table(image))
            note(symbols, b.queue.symbols(image))

    stream = stream_perf(read_perf_data(out), on_blocks)
    assert insns > 8 * 200_000
    live = [t for t in (ref() for ref in tables) if t is not None]
    # (one table a program, but those the decoder took over as a program
    # mapped more: the last program's alone lives on)
    assert len(tables) >= 8 and len(live) == 1, (len(tables), len(live))
    q = stream.queues[0]
    assert q.listing_table(0) is not live[0]  # (decoded again when asked)
    # The symbols of each image a program had as it mapped its libraries
    # (merged tables): those of the images left behind are let go but for
    # the last few asked for, and merged again when asked for.
    kept = sum(ref() is not None for ref in symbols)
    assert len(symbols) >= 8 and kept <= SUPERSEDED_SYMBOLS_KEPT + 1, (len(symbols), kept)
    assert sum("spin" in q.symbols(i).names for i in range(len(q.images))) >= 8
