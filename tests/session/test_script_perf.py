"""``hwtrace script`` prints what ``perf script --itrace=i0ns --ns -F
comm,tid,time,ip,sym,symoff,dso`` prints, to the byte, on real Intel PT
recordings (DynamoRIO's drpt2trace tests, recorded on Skylake-SP) and on a
dynamically linked program recorded here; perf 6.1 is run live.

Also: ``-i /dev/stdin`` reads a pipe, and ``report`` says nothing about a
vDSO the recording has no copy of (perf does not)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
from realdata import real_input

from hwtrace.cli.main import main

PERF = shutil.which("perf")
FIELDS = ["--itrace=i0ns", "--ns", "-F", "comm,tid,time,ip,sym,symoff,dso"]
HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]


def perf_lists(path: Path, options: Sequence[str] = FIELDS) -> bytes:
    """perf script's instruction listing of ``path`` (skips when perf or
    its Intel PT decoder is missing)."""
    if PERF is None:
        pytest.skip("perf is not installed")
    got = subprocess.run([PERF, "script", "-i", str(path), *options], capture_output=True,
                         timeout=300)  # fmt: skip
    if got.returncode != 0 or not got.stdout:
        pytest.skip(f"perf script cannot decode Intel PT here: {got.stderr.decode()[-200:]}")
    return got.stdout


def hwtrace_lists(path: Path, capsysbinary, options: Sequence[str] = ()) -> bytes:
    capsysbinary.readouterr()
    assert main(["script", "-i", str(path), *options]) == 0
    return capsysbinary.readouterr().out


def first_difference(a: bytes, b: bytes) -> str:
    x, y = a.decode().splitlines(), b.decode().splitlines()
    for k, (p, q) in enumerate(zip(x, y, strict=False)):
        if p != q:
            return f"line {k + 1}:\nperf:    {p}\nhwtrace: {q}"
    return f"{len(x)} lines against {len(y)}"


def wrapped(name: str, tmp_path: Path) -> Path:
    """The raw trace of a drpt2trace test as a perf.data, with the timing
    configuration DynamoRIO's test gives it (family 6 model 85, MTC period
    3, nominal ratio 37, CPUID 0x15 2:308)."""
    from hwtrace.perf.wrap import wrap_raw_trace
    from hwtrace.pt.config import PtConfig

    src = real_input(name)
    config = PtConfig()
    config.mtc_freq, config.nom_freq = 3, 37
    config.cpuid_0x15_eax, config.cpuid_0x15_ebx = 2, 308
    out = tmp_path / f"{name}.data"
    wrap_raw_trace(src / "pt.bin", out, elf=[(src / "hello", None)], config=config)
    return out


def test_real_recording_streams_the_same_kept_compactly(tmp_path):
    """The stream ``decode`` uses (``runs=False``: the decoder keeps its
    rows compactly and replays) gives the blocks of the stream the listing
    uses (whose listing is perf's), times and durations included, on the
    longer real recording (59,234 instructions)."""
    import numpy as np

    from hwtrace.session import PerfSession
    from hwtrace.session.perfflow import stream_perf

    s = PerfSession.open(str(wrapped("drpt2trace-simple-tracedir", tmp_path)))
    got = {}
    for runs in (True, False):
        blocks = []
        flow = stream_perf(s.data, blocks.append, s.locator, kernel=s.kernel,
                           sideband=s.sideband, batch_rows=64, runs=runs)  # fmt: skip
        got[runs] = (
            {c: np.concatenate([getattr(b, c) for b in blocks])
             for c in ("ip", "ninsn", "mode", "ns", "duration", "tid", "pid", "gap", "offset")},
            [str(g) for q in flow.queues for g in q.gaps],
        )  # fmt: skip
    assert int(got[True][0]["ninsn"].sum()) == 59234
    assert got[False][1] == got[True][1]
    for c, v in got[True][0].items():
        np.testing.assert_array_equal(got[False][0][c], v, c)


@pytest.mark.parametrize("name", ["drpt2trace-simple", "drpt2trace-simple-tracedir"])
def test_real_recording_lists_as_perf_does(name, tmp_path, capsysbinary):
    """Every line: zero-size symbols sized up to the next (``_init+0x38``
    for .plt code of a static binary), perf's choice among aliases
    (``__libc_calloc`` over ``__calloc``, ``__GI___fstatat``), ``+0x0``,
    and the time perf estimates from TSC, MTC and CYC for each
    instruction (59,234 instructions in the longer trace)."""
    path = wrapped(name, tmp_path)
    theirs = perf_lists(path)
    mine = hwtrace_lists(path, capsysbinary)
    assert mine == theirs, first_difference(theirs, mine)


def columns(listing: bytes) -> list[tuple[str, str, str]]:
    """Per line: time, address, and ``symbol+offset (module)``."""
    out = []
    for line in listing.decode().splitlines():
        head, _, rest = line.partition(":  ")
        ip, _, name = rest.strip().partition(" ")
        out.append((head.split()[-1], ip, name))
    return out


def test_times_are_perf_times(tmp_path, capsysbinary):
    """Each instruction's time is perf's (the instructions before a branch
    that consumes a packet keep the previous branch's time; MTC and CYC
    as perf converts them), not libipt's: all 59,234 equal."""
    path = wrapped("drpt2trace-simple-tracedir", tmp_path)
    theirs = columns(perf_lists(path))
    mine = columns(hwtrace_lists(path, capsysbinary))
    assert len(theirs) == len(mine) == 59_234
    assert [x[:2] for x in mine] == [x[:2] for x in theirs]


def test_json_lines_say_what_the_text_says(tmp_path, capsysbinary):
    """``script --json``: one JSON object a line, its fields those of the
    text line (which is perf's), per instruction and per block."""
    import json

    path = wrapped("drpt2trace-simple-tracedir", tmp_path)
    for extra in ([], ["--blocks"]):
        capsysbinary.readouterr()
        assert main(["script", "-i", str(path), *extra]) == 0
        text = capsysbinary.readouterr().out.decode().splitlines()
        assert main(["script", "-i", str(path), "--json", *extra]) == 0
        rows = [json.loads(line) for line in capsysbinary.readouterr().out.decode().splitlines()]
        assert len(rows) == len(text) > 1000
        for row, line in zip(rows, text, strict=True):
            head, _, rest = line.partition(":  ")
            comm, tid, when = head.rsplit(None, 2)
            assert (row["comm"], row["tid"]) == (comm.strip(), int(tid))
            assert row["time"] == int(when.replace(".", ""))
            ip, _, name = rest.strip().partition(" ")
            assert row["ip"] == f"0x{ip}"
            if extra:
                name, _, insns = name.rpartition(" ")[0].rpartition(" ")
                assert row["insns"] == int(insns)
            sym, _, dso = name.partition(" (")
            assert row["dso"] == dso[:-1]
            off = f"+{row['symoff']:#x}" if "symoff" in row else ""
            assert f"{row['sym']}{off}" == sym


def test_symbols_as_perf_loads_them():
    """Zero-size symbols reach the next one, aliases as perf picks them,
    PLT entries of a static binary under ``_init``."""
    from hwtrace.image.perfsyms import perf_symbols

    table = perf_symbols(str(real_input("drpt2trace-simple-tracedir") / "hello"))
    names = {a: table.symbolize(a) for a in (0x401038, 0x401750, 0x417B80, 0x443720, 0x440350)}
    assert names == {
        0x401038: "_init+0x38",  # .plt, after .init's _init of size 0
        0x401750: "__do_global_dtors_aux",  # size 0
        0x417B80: "__libc_calloc",  # not __calloc (shorter) nor calloc (weak)
        0x443720: "__GI___fstatat",  # global, longest of 2 leading underscores
        0x440350: "__memmove_evex_unaligned_erms",  # not __memcpy_evex_unaligned_erms
    }


PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 2;
    int *p = calloc(n, sizeof *p);
    for (int i = 0; i < n; i++) p[i] = i * i;
    for (int i = 0; i < n; i++) printf("%d\n", p[i]);
    free(p);
    return 0;
}
"""


@pytest.fixture(scope="module")
def recorded_program(tmp_path_factory) -> Path:
    """A dynamically linked program calling calloc and printf, recorded by
    the software backend (Intel PT with a TSC per step) from main's entry
    to its return: lazy binding in ld.so, PLT stubs, libc."""
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    exe = compile_program(PROGRAM, "calloc-printf", ("-O1",))
    d = tmp_path_factory.mktemp("prog")
    out = d / "p.data"
    got = subprocess.run([*HWTRACE, "record", "-o", str(out), "--call", "main", "--", str(exe), "2"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    return out


def test_program_recorded_here_lists_as_perf_does(recorded_program, capsysbinary):
    """PLT entries as perf synthesises them (``calloc@plt+0x0``), the PLT
    header as ``_init+0x20``, libc's aliases, and the times."""
    theirs = perf_lists(recorded_program)
    mine = hwtrace_lists(recorded_program, capsysbinary)
    assert b"@plt+0x0 (" in mine
    assert mine == theirs, first_difference(theirs, mine)


@pytest.mark.parametrize("backend", ["patch", "step", "patch -z"])
def test_filtered_recording_lists_as_perf_does(backend, tmp_path, capsysbinary):
    """``make demo``'s recording: the patch backend traces two functions
    only (``-f``), so tracing stops at each direct call out of them (TIP.PGD
    naming the callee) and starts again at the return (TIP.PGE), a TSC
    each time.  perf gives the call the time of the packets before its
    TIP.PGD; every line, times included, equals perf's.  The step backend
    writes a TSC per step, so tracing begins again (TIP.PGE) instructions
    after the last TSC: perf's queue takes its estimate there (two ticks an
    instruction since), and a PSB+ comes in the middle of the flow (perf
    walks to its FUP before it reads on).  With ``-z`` the sideband is in
    COMPRESSED records (one zstd stream), as ``perf record -z`` writes it."""
    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(SKIP)
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    root = Path(__file__).resolve().parents[2]
    exe = tmp_path / "demo"
    subprocess.run(["gcc", "-O2", "-o", str(exe), str(root / "examples/demo/demo.c")], check=True)
    out = tmp_path / "demo.data"
    got = subprocess.run([*HWTRACE, "record", "--backend", *backend.split(), "-o", str(out),
                          "-f", "checksum", "-f", "digest", "--", str(exe),
                          "24" if backend == "step" else "64"],
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    if "-z" in backend:
        from hwtrace.perf.data import read_perf_data
        from hwtrace.perf.records import RecordType

        types = read_perf_data(out).records["type"]
        assert (types == RecordType.COMPRESSED).any() and (types == RecordType.MMAP2).any()
    theirs = perf_lists(out)
    mine = hwtrace_lists(out, capsysbinary)
    assert theirs.count(b"\n") > (1000 if backend == "step" else 3000) and b"digest+0x" in theirs
    assert mine == theirs, first_difference(theirs, mine)
    # perf's default fields: each instruction's period and event name after
    # its time (in microseconds), the name as perf makes it from the attrs.
    theirs = perf_lists(out, ("--itrace=i0ns",))
    mine = hwtrace_lists(out, capsysbinary, ("--itrace=i0ns",))
    assert b" instructions:u: " in theirs
    assert mine == theirs, first_difference(theirs, mine)


PTWRITE_PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long work(long n) {
    long s = 0;
    for (long i = 0; i < n; i++) {
        s += i * 3;
        __asm__ volatile("ptwrite %0" :: "r"(s));
    }
    return s;
}
int main(int argc, char **argv) { printf("%ld\n", work(atol(argv[1]))); return 0; }
"""


def test_ptwrite_recording_lists_as_perf_does(tmp_path, capsysbinary):
    """A loop writing PTWRITEs, stepped (the step backend writes each with
    its IP bit and a FUP, and a TSC per step, so a PSB+ falls between a
    branch and a PTWRITE): the instructions after a PTWRITE's FUP keep the
    time of the packets before it, as perf's decoder returns the PTWRITE
    without reading on."""
    from test_record_software import SKIP, compile_program

    if SKIP is not None:
        pytest.skip(SKIP)
    exe = compile_program(PTWRITE_PROGRAM, "ptwrite-loop", ("-O1",))
    out = tmp_path / "ptw.data"
    got = subprocess.run([*HWTRACE, "record", "--backend", "step", "-o", str(out), "-f", "work",
                          "--", str(exe), "300"], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr
    theirs = perf_lists(out)
    mine = hwtrace_lists(out, capsysbinary, FIELDS)
    assert theirs.count(b"work+0x") > 1000
    assert mine == theirs, first_difference(theirs, mine)
    # PTWRITEs as perf lists them: before their instruction, with perf's
    # default fields the payload's text (and its characters when they are
    # printable), with -F the address alone; without i the PTWRITEs only.
    for options in (("--itrace=i0nsw",), ("--itrace=i0nsw", *FIELDS[1:]), ("--itrace=w",)):
        theirs = perf_lists(out, options)
        mine = hwtrace_lists(out, capsysbinary, options)
        assert theirs.count(b" ptwrite:  IP: 1 payload: ") == (0 if "-F" in options else 300)
        assert mine == theirs, first_difference(theirs, mine)


def test_dev_stdin_reads_a_pipe(tmp_path, capsysbinary):
    """``-i /dev/stdin`` under a pipe reads the pipe, as ``-i -`` does."""
    path = wrapped("drpt2trace-simple", tmp_path)
    got = subprocess.run([*HWTRACE, "script", "-i", "/dev/stdin"], input=path.read_bytes(),
                         capture_output=True, timeout=300)  # fmt: skip
    assert got.returncode == 0, got.stderr.decode()
    assert got.stdout == hwtrace_lists(path, capsysbinary)
    assert got.stdout.count(b"\n") == 8


def test_report_is_silent_about_a_vdso_it_has_no_copy_of(capsys):
    """quipper's recording maps ``[vdso]`` (build id in its header) but no
    build-id cache here has it: perf says nothing; the 64 other binaries it
    maps and nothing here holds are counted in one line naming the first,
    none with an empty name."""
    path = real_input("quipper-intel_pt")
    assert main(["report", "-i", str(path)]) == 0
    out = capsys.readouterr().out
    warnings = [x for x in out.splitlines() if x.startswith("warning: ")]
    missing = [x for x in warnings if "binaries not found" in x]
    assert len(missing) == 1 and missing[0].startswith("warning: 64 binaries not found")
    assert "/lib/modules/4.14.18/kernel/drivers/input/joydev.ko, " in missing[0]
    assert missing[0].endswith(" and 61 more")
    assert not [x for x in warnings if x.startswith("warning: :") or "vdso" in x]


def test_problems_fold_only_many_missing_binaries():
    """Up to three binaries not found are named a line each; more are
    counted in one line where the first was, the other problems kept in
    their order."""
    from hwtrace.cli.common import shown_problems

    few = ["/a: binary not found", "x: no kernel code", "/b: binary not found"]
    assert shown_problems(few) == few
    many = ["x: no kernel code", *(f"/m{i}.ko: binary not found" for i in range(5)), "y: other"]
    assert shown_problems(many) == [
        "x: no kernel code",
        "5 binaries not found, their code decoded as gaps (--symfs DIR or perf's build-id "
        "cache finds them): /m0.ko, /m1.ko, /m2.ko and 2 more",
        "y: other",
    ]
