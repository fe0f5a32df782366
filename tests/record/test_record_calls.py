"""``hwtrace record --call FUNC``: each call of FUNC with everything it runs
until it returns (libc, callbacks into the program, recursion), cut where
the stack pointer rises above its value at the entry (a return, a longjmp
past the frame, a tail call's callee returning).  Every instruction of each
call is in the trace, exactly as stepped, for hwtrace and for Linux perf.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_record_software import SKIP, compile_program
from test_record_threads import check_listings, record_cli, stepped

from hwtrace.cli.main import main as hwtrace_main
from hwtrace.image import read_elf
from hwtrace.image.process import load_bias
from hwtrace.record import SoftwareRecording, record_software

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

PROGRAM = r"""
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define NOINLINE __attribute__((noinline))

static volatile long calls, compares;
static jmp_buf back;

NOINLINE int cmp_long(const void *a, const void *b) {
    compares++;
    long x = *(const long *)a, y = *(const long *)b;
    return (x > y) - (x < y);
}
/* Calls into libc, which calls back into the program. */
NOINLINE long sorter(long n, long seed) {
    long v[32];
    calls++;
    for (long i = 0; i < n; i++)
        v[i] = (i * 7919 + seed) % 31;
    qsort(v, n, sizeof v[0], cmp_long);
    return v[0] + v[n - 1];
}
NOINLINE long fib(long n) {
    calls++;
    return n < 2 ? n : fib(n - 1) + fib(n - 2);
}
/* Leaves through longjmp, past its own frame. */
NOINLINE void deep(long n) {
    if (n == 0)
        longjmp(back, 1);
    deep(n - 1);
    calls++;
}
NOINLINE long jumper(long n) {
    calls++;
    deep(n);
    return -1;
}
/* A tail call: its callee's return ends it. */
NOINLINE long tail_target(long x) {
    calls++;
    return x * 3;
}
long tailer(long x);
__asm__(".text\n.globl tailer\n.type tailer, @function\ntailer:\n"
        "    add $1, %rdi\n"
        "    jmp tail_target\n"
        ".size tailer, .-tailer\n");

int main(int argc, char **argv) {
    long s = 0;
    s += sorter(12, 1);
    s += sorter(20, 2);
    s += fib(6);
    if (!setjmp(back))
        s += jumper(4);
    s += tailer(5);
    FILE *out = argc > 1 ? fopen(argv[1], "w") : stdout;
    fprintf(out, "%ld %ld %ld\n", s, calls, compares);
    return 0;
}
"""

CALLS = ["sorter", "fib", "jumper", "tailer"]


def build() -> str:
    flags = ("-O1", "-g0", "-fno-omit-frame-pointer", "-fPIE", "-pie")
    return str(compile_program(PROGRAM, "calls", flags))


def entries(rec: SoftwareRecording) -> dict[int, str]:
    """The traced calls' entry addresses, by name."""
    return {c.start: c.name for c in rec.calls}


def function_address(rec: SoftwareRecording, exe: str, name: str) -> int:
    """Where the program's function ``name`` was loaded."""
    elf = read_elf(exe)
    bias = load_bias(rec.log.maps, exe, elf.min_vaddr)
    return next(start + bias for start, _, sym, _ in elf.symbols.functions if sym == name)


def module_of(rec: SoftwareRecording, ip: int) -> str:
    m = next(m for m in rec.mmaps if m.start <= ip < m.start + m.length)
    return os.path.basename(m.path)


def test_calls_with_everything_they_run(tmp_path, monkeypatch, capsys):
    exe = build()
    path = tmp_path / "perf.data"
    args = [a for c in CALLS for a in ("--call", c)]
    out = tmp_path / "out"
    rec = record_cli(monkeypatch, [*args, "--", exe, str(out)], path)
    assert os.WIFEXITED(rec.exit_status) and os.WEXITSTATUS(rec.exit_status) == 0
    want = stepped(rec)  # each thread's trace is its stepped log, decoded exactly
    (tr,) = rec.threads
    log = tr.log
    assert rec.filters == ""  # the whole address space, cut to the calls
    starts = entries(rec)
    # One traced stretch per call made from main, starting at the entry.
    names = [starts[int(log.ips[seg.start])] for seg in log.segments]
    assert names == ["sorter", "sorter", "fib", "jumper", "tailer"]
    rsp = log.register("rsp")
    text = {m.start: m for m in rec.mmaps if m.path == exe and "x" in m.prot}
    for seg, name in zip(log.segments, names, strict=True):
        rows = slice(seg.start, seg.end)
        # Inside the call, the stack never rises above its entry value; the
        # instruction after the last one is where it did.
        assert (rsp[rows] <= rsp[seg.start]).all()
        last = log.read_code(int(log.ips[seg.end - 1]), 1)
        if name == "jumper":  # cut inside longjmp, as it resets the stack
            assert module_of(rec, int(log.ips[seg.end - 1])) == "libc.so.6"
        else:  # a return to main
            assert last == b"\xc3"
            assert any(m.start <= seg.end_ip < m.start + m.length for m in text.values())
    ips = tr.instructions
    _, calls, compares = map(int, out.read_text().split())
    # libc ran inside the calls (qsort), and called back into the program.
    libc = np.array([module_of(rec, int(ip)) == "libc.so.6" for ip in np.unique(ips)])
    assert libc.any() and not libc.all()
    assert int((ips == function_address(rec, exe, "cmp_long")).sum()) == compares
    fib_entry = next(a for a, n in starts.items() if n == "fib")
    assert int((ips == fib_entry).sum()) == 25  # fib(6) and its recursion, in one call
    assert calls == 2 + 25 + 1 + 1  # sorter x2, fib's, jumper, tail_target (deep never returns)
    check_listings(path, want, capsys)


def test_a_library_function_and_its_callbacks(tmp_path, capsys):
    """``--call libc.so.6!qsort``: the whole sort, the program's comparison
    callbacks included; ``-f`` on it traces only its own few instructions
    (it jumps to qsort_r), as an address filter does."""
    exe = build()
    out = str(tmp_path / "out")
    rec = record_software([exe, out], calls=["libc.so.6!qsort"])
    want = stepped(rec)
    (tr,) = rec.threads
    assert len(tr.log.segments) == 2  # two sorts
    qsort = rec.calls[0]
    assert all(int(tr.log.ips[seg.start]) == qsort.start for seg in tr.log.segments)
    cmp = [ip for ip in np.unique(tr.instructions) if module_of(rec, int(ip)) != "libc.so.6"]
    assert cmp  # the comparison function ran inside the calls
    filtered = record_software([exe, out], functions=["libc.so.6!qsort"])
    (ftr,) = filtered.threads
    assert ftr.instructions.shape[0] <= 2 * (qsort.end - qsort.start)
    assert tr.instructions.shape[0] > 20 * ftr.instructions.shape[0]
    check_listings(tmp_path / "perf.data", want, capsys, rec)


def module_offsets(rec: SoftwareRecording, ips: np.ndarray) -> list[tuple[str, int]]:
    """Each address as (module base name, offset from the module's first
    mapping): the same instruction in two runs of a program (ASLR moves
    the modules)."""
    base: dict[str, int] = {}
    for m in rec.mmaps:
        name = os.path.basename(m.path)
        base[name] = min(base.get(name, m.start), m.start)
    spans = sorted((m.start, m.start + m.length, os.path.basename(m.path)) for m in rec.mmaps)
    starts = np.array([s for s, _, _ in spans], np.uint64)
    out = []
    for ip in ips.tolist():
        k = int(np.searchsorted(starts, ip, side="right")) - 1
        _, end, name = spans[k]
        assert ip < end, hex(ip)
        out.append((name, ip - base[name]))
    return out


def script_ips(args: list[str], capsys) -> np.ndarray:
    capsys.readouterr()
    assert hwtrace_main(["script", *args]) == 0
    lines = capsys.readouterr().out.splitlines()
    return np.array([int(line.split()[3], 16) for line in lines], np.uint64)


def test_calls_cut_when_decoded(tmp_path, capsys):
    """A recording of everything (the whole of main, as a hardware recording
    with ``--call`` traces the whole process), cut to the calls when it is
    decoded, lists exactly what a recording of only those calls steps in
    another run of the program: returns, recursion, tail calls, libc
    calling back into the program.  A ``longjmp`` out of a call ends at the
    jump that leaves it, a few instructions after the software recorder's
    cut (where the stack pointer rises, which the trace does not show)."""
    from hwtrace.perf.notes import note_recording
    from hwtrace.record.perfdata import write_perf_data

    exe = build()
    out = str(tmp_path / "out")
    whole = record_software([exe, out], calls=["main"])
    path = tmp_path / "whole.data"
    write_perf_data(whole, path)
    recorded = record_software([exe, out], calls=CALLS)
    (want,) = stepped(recorded).values()
    want_at = module_offsets(recorded, want)
    options = [a for c in CALLS for a in ("--call", c)]
    got_at = module_offsets(whole, script_ips(["-i", str(path), *options], capsys))
    segments = recorded.threads[0].log.segments
    starts = entries(recorded)
    names = [starts[int(recorded.threads[0].log.ips[seg.start])] for seg in segments]
    assert names == ["sorter", "sorter", "fib", "jumper", "tailer"]
    end = segments[3].end  # where jumper's call ends (the stack pointer rises in longjmp)
    assert got_at[:end] == want_at[:end]
    extra = len(got_at) - len(want_at)
    assert 0 < extra <= 8
    assert got_at[end + extra :] == want_at[end:]  # tailer's call, tail callee and all
    assert all(name == "libc.so.6" for name, _ in got_at[end : end + extra])

    # Recorded for the calls on hardware (everything traced, the calls noted
    # beside the perf.data): cut by default; --all shows everything.
    note_recording(path, calls=CALLS)
    assert module_offsets(whole, script_ips(["-i", str(path)], capsys)) == got_at
    everything = script_ips(["-i", str(path), "--all"], capsys)
    assert everything.shape[0] == whole.threads[0].instructions.shape[0]
    write_perf_data(whole, path)  # written again: the note no longer applies
    assert script_ips(["-i", str(path)], capsys).shape[0] == everything.shape[0]
    capsys.readouterr()
    assert hwtrace_main(["report", "-i", str(path), "--call", "fib"]) == 0
    report = capsys.readouterr().out
    fib = segments[2].end - segments[2].start
    assert f"{fib:,} instructions decoded" in report
    assert "fib" in report and "sorter" not in report


def offsets_in(maps, ips: np.ndarray) -> list[tuple[str, int]]:
    """:func:`module_offsets` for a recording's mappings (``Mapping``s)."""
    base: dict[str, int] = {}
    for m in maps:
        if m.path.startswith("/"):
            name = os.path.basename(m.path)
            base[name] = min(base.get(name, m.start), m.start)
    spans = sorted(
        (m.start, m.end, os.path.basename(m.path)) for m in maps if m.path.startswith("/")
    )
    out = []
    for ip in ips.tolist():
        name = next(n for lo, hi, n in spans if lo <= ip < hi)
        out.append((name, ip - base[name]))
    return out


def test_patch_backend_records_the_calls(tmp_path):
    """``--backend patch --call``: all code patched, tracing on from each
    call's entry until the stack rises above it, in perf.data as perf reads
    it.  The same instructions as the stepper's, but where a ``longjmp``
    leaves a call: the patch backend sees branches, not the stack pointer,
    so it disables before the jump that leaves, after the instruction
    glibc's ``__longjmp`` runs once it reset the stack."""
    from test_record_threads import PERF, perf_lists

    from hwtrace.perf.data import read_perf_data
    from hwtrace.record.patch import PatchOptions
    from hwtrace.record.patch.output import record_patched_perf
    from hwtrace.session.perfflow import decode_perf

    exe = build()
    out = str(tmp_path / "out")
    path = tmp_path / "perf.data"
    rec = record_patched_perf([exe, out], path, PatchOptions(calls=tuple(CALLS)))
    assert os.WEXITSTATUS(rec.exit_status) == 0 and rec.traps <= 1
    assert [name for _, name in rec.calls] == CALLS
    flow = decode_perf(read_perf_data(path))
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    got = q.instructions()
    if PERF is not None:
        np.testing.assert_array_equal(perf_lists(path)[rec.threads[0].tid], got)
    recorded = record_software([exe, out], calls=CALLS)
    (want,) = stepped(recorded).values()
    got_at, want_at = offsets_in(rec.maps, got), module_offsets(recorded, want)
    segments = recorded.threads[0].log.segments
    end = segments[3].end  # jumper's call ends in longjmp
    assert got_at[:end] == want_at[:end]
    extra = len(got_at) - len(want_at)
    assert 0 < extra <= 2
    assert all(name == "libc.so.6" for name, _ in got_at[end : end + extra])
    assert got_at[end + extra :] == want_at[end:]  # tailer's call, tail callee and all


LOOPS = r"""
#define NOINLINE __attribute__((noinline))
static volatile long sink;
/* Taken conditional jumps in a loop, inside the call. */
NOINLINE long spin(long n) {
    long s = 0;
    for (long i = 0; i < n; i++)
        s += i ^ (s >> 3);
    return s;
}
int main(void) {
    for (long i = 0; i < 3000; i++)  /* more taken jumps than the cut keeps frames */
        sink += i;
    sink += spin(2000);
    for (long i = 0; i < 500; i++)
        sink += i;
    return (int)(sink & 1);
}
"""


def test_calls_cut_when_decoded_through_taken_jumps(tmp_path, capsys):
    """A taken conditional jump goes where the instruction says, not
    somewhere only a signal explains: thousands of them before and inside
    the call (more than the cut keeps frames of) and the cut still ends at
    the call's return, as the stack pointer does."""
    from hwtrace.record.perfdata import write_perf_data

    exe = str(compile_program(LOOPS, "loops", ("-O1", "-g0")))
    whole = record_software([exe], calls=["main"])
    path = tmp_path / "whole.data"
    write_perf_data(whole, path)
    spin = record_software([exe], calls=["spin"])
    (want,) = stepped(spin).values()
    got = script_ips(["-i", str(path), "--call", "spin"], capsys)
    assert len(want) > 4 * 2000
    assert module_offsets(whole, got) == module_offsets(spin, want)
