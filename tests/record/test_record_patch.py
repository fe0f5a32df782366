"""The patch recorder (``hwtrace record --backend patch``) against oracles
nobody here wrote.

* The ptrace stepper: the decoded flow of every thread equals the
  stepper's log of the same program, instruction for instruction.
* valgrind's callgrind: every instruction of the program's own code ran
  as many times as callgrind counted it, and ``hwtrace report``'s
  instructions per function are callgrind's self Ir.

Both runs of a program must take the same path: address space layout
randomization is off (``personality(ADDR_NO_RANDOMIZE)``, inherited by the
launched programs, as ``setarch -R`` does) and symbols are bound at load
time (``LD_BIND_NOW``: lazy binding's path depends on which thread calls
first).  The programs (:mod:`patch_programs`) avoid paths that depend on
how threads interleave.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import iced_x86 as iced
import numpy as np
import pytest
from callgrind import callgrind_self_ir
from callgrind import skip_reason as callgrind_skip
from elftools.elf.elffile import ELFFile
from patch_programs import (
    PROGRAM_NAMES,
    build_async_signals,
    build_bad_calls,
    build_dlopen_library,
    build_epilogues,
    build_forks,
    build_jit,
    build_program,
    expected_output,
)
from test_record_software import SKIP

from hwtrace.analysis.profile import profile_session
from hwtrace.cli.main import main as hwtrace_main
from hwtrace.perf.data import read_perf_data
from hwtrace.pt import packets
from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import decode_trace
from hwtrace.pt.flowrows import Ev
from hwtrace.pt.kinds import Kind
from hwtrace.record import record_software
from hwtrace.record.patch import PatchOptions, PatchRecording, record_patched
from hwtrace.record.patch.output import patch_image, record_patched_perf, write_patch_perf_data
from hwtrace.record.patch.tracer import KILL_POINTS
from hwtrace.session.perfflow import decode_perf
from hwtrace.session.perfsession import PerfSession

pytestmark = pytest.mark.skipif(SKIP is not None, reason=str(SKIP))

ADDR_NO_RANDOMIZE = 0x0040000
# The stepper runs ~40 k instructions a second here: signals (0.4 M
# instructions) is stepped in the suite; all six (threads, each in its own
# order), with return compression on and off, in bench/soak_patch_vs_step.py.
STEPPED = ("signals",)


@pytest.fixture
def same_path(monkeypatch):
    """Launched programs run without ASLR and with symbols bound at load."""
    libc = ctypes.CDLL(None, use_errno=True)
    old = libc.personality(0xFFFFFFFF)
    libc.personality(old | ADDR_NO_RANDOMIZE)
    monkeypatch.setenv("LD_BIND_NOW", "1")
    try:
        yield
    finally:
        libc.personality(old)


def decoded(rec: PatchRecording, debug: Path) -> dict[int, np.ndarray]:
    image = patch_image(rec, debug)
    return {t.tid: decode_trace(t.data, image, PtConfig()).instructions() for t in rec.threads}


def stepped(exe: Path, rec: PatchRecording) -> dict[int, np.ndarray]:
    code = [m for m in rec.maps if "x" in m.prot and m.path and m.path != "[vsyscall]"]
    # One range over all code, so that code mapped later (dlopen) is in it.
    ranges = [(min(m.start for m in code), max(m.end for m in code))]
    steps = record_software([str(exe)], ranges=ranges, registers="basic")
    return {t.tid: t.instructions for t in steps.threads}


def assert_same_flows(name: str, got: dict[int, np.ndarray], want: dict[int, np.ndarray]) -> None:
    """Each thread's instructions equal, threads in creation order (tids
    rise) in both."""
    assert len(got) == len(want)
    for (_, g), (_, w) in zip(sorted(got.items()), sorted(want.items()), strict=True):
        n = min(len(g), len(w))
        first = np.flatnonzero(g[:n] != w[:n])
        where = int(first[0]) if first.size else n
        assert len(g) == len(w) and not first.size, (
            f"{name}: differs at instruction {where} of {len(g)} (stepper: {len(w)})"
        )


@pytest.mark.parametrize("name", STEPPED)
def test_patch_flow_equals_stepper(name, same_path, tmp_path):
    exe = build_program(name)
    # Both runs write to the same kind of file (stdio takes other paths for
    # a terminal, a pipe, /dev/null): the standard output both inherit.
    rec = record_patched([str(exe)])
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0
    assert rec.threads and all(t.lost == 0 for t in rec.threads)
    assert_same_flows(name, decoded(rec, tmp_path), stepped(exe, rec))


PIE_BASE = 0x555555554000  # where Linux loads a PIE without randomization


def pieces_of(exe: Path, function: str) -> list[tuple[int, int]]:
    """Two address ranges cut from ``function`` at instruction boundaries
    (its second quarter, and its last quarter to its end): tracing is
    entered by falling into a range and left by falling out of one, as well
    as by branches."""
    start, size = functions_of(exe)[function]
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        text = elf.get_section_by_name(".text")
        code = text.data()[start - text["sh_addr"] : start - text["sh_addr"] + size]
    ips = [PIE_BASE + i.ip for i in iced.Decoder(64, code, ip=start)]
    n = len(ips)
    return [(ips[n // 4], ips[n // 2]), (ips[3 * n // 4], PIE_BASE + start + size)]


# (program, functions, a function cut into pieces): recursion (deeper
# than the return stack), calls out and back (return points are entries),
# indirect calls, signal handlers, siglongjmp out of a handler.  (A range re-entered where
# a setjmp returns again is not compared: the stepper does not notice it,
# the patch backend and Intel PT do.)
RANGED = [
    ("recursion", ("tree", "add_five"), None),
    ("signals", ("raise_from", "on_usr1", "on_usr2"), None),
    ("recursion", ("even_walk",), "deep"),
]


@pytest.mark.parametrize(("name", "functions", "cut"), RANGED)
def test_address_ranges_equal_stepper(name, functions, cut, same_path, tmp_path):
    """``-f``/``--range`` with the patch backend: only that code is patched
    and traced, TIP.PGE entering and TIP.PGD leaving it (an Intel PT address
    filter); the flow equals the stepper's with the same filter."""
    exe = build_program(name)
    ranges = pieces_of(exe, cut) if cut else []
    rec = record_patched([str(exe)], PatchOptions(functions=functions, ranges=tuple(ranges)))
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0
    assert any(m.path == str(exe) and m.start == PIE_BASE for m in rec.maps)
    assert len(rec.ranges) == len(functions) + len(ranges)
    assert all(t.lost == 0 for t in rec.threads) and rec.traps == 0
    # Only the ranges' branches and the system calls: a few hundred sites
    # (the whole program: about 65,000).
    assert 0 < sum(m["sites"] for m in rec.modules.values()) < 2_000
    got = {tid: ins for tid, ins in decoded(rec, tmp_path).items() if len(ins)}
    steps = record_software([str(exe)], functions=list(functions), ranges=ranges,
                            registers="basic")  # fmt: skip
    want = {t.tid: t.instructions for t in steps.threads if len(t.instructions)}
    assert_same_flows(name, got, want)
    assert sum(len(g) for g in got.values()) > 1_000


def test_patch_program_output(same_path, tmp_path):
    """The recorded programs compute what they compute alone."""
    for name in PROGRAM_NAMES:
        out = tmp_path / f"{name}.out"
        with open(out, "w") as f:
            rec = record_patched([str(build_program(name))], stdout=f)
        assert os.waitstatus_to_exitcode(rec.exit_status) == 0, name
        assert out.read_text() == expected_output(name), name


def test_return_compression_off_records_the_same_flow(same_path, tmp_path):
    """``noretcomp``: every return a TIP; the decoded flow is the one the
    compressed trace (checked against the stepper above) gives, in more
    bytes."""
    exe = str(build_program("recursion"))
    on = record_patched([exe], stdout=subprocess.DEVNULL)
    off = record_patched([exe], PatchOptions(noretcomp=True), stdout=subprocess.DEVNULL)
    (t_on,), (t_off,) = on.threads, off.threads
    assert np.array_equal(decoded(on, tmp_path)[t_on.tid], decoded(off, tmp_path)[t_off.tid])
    assert len(t_off.data) > 1.3 * len(t_on.data)
    # Half the returns are deeper than the 64 a decoder keeps: still TIPs.
    assert t_on.counts["tips"] < 0.6 * t_off.counts["tips"]


def test_time_points_between_psbs(same_path, tmp_path):
    """``mtc_period``: TSC packets at most every 2**N x 40 ns of TSC between
    the PSB+, rising; the flow decodes as without them."""
    exe = str(build_program("recursion"))
    plain = record_patched([exe], stdout=subprocess.DEVNULL)
    timed = record_patched([exe], PatchOptions(mtc_period=3), stdout=subprocess.DEVNULL)
    (t_plain,), (t_timed,) = plain.threads, timed.threads
    assert np.array_equal(decoded(plain, tmp_path)[t_plain.tid],
                          decoded(timed, tmp_path)[t_timed.tid])  # fmt: skip
    tscs, psbs = [], []
    for t in (t_plain, t_timed):
        table = packets.decode(t.data)
        assert not table.err_offset.size
        tscs.append(table.a[table.kind == Kind.TSC].astype(np.int64))
        psbs.append(int((table.kind == Kind.PSB).sum()))
    assert tscs[0].shape[0] < 2 * psbs[0] + 10  # PSB+ and system calls only
    assert tscs[1].shape[0] > 5 * psbs[1]
    assert np.all(np.diff(tscs[1]) > 0)


def test_signals_that_interrupt_trampolines(same_path, tmp_path):
    """A timer's signals land anywhere, inside trampolines and the runtime
    too (the thread is stepped out first): the program computes what it
    computes alone, the trace decodes without a gap and holds every run of
    the handler."""
    exe = build_async_signals()
    alone = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    out = tmp_path / "out"
    with open(out, "w") as f:
        rec = record_patched([str(exe)], stdout=f)
    acc, ticks = out.read_text().splitlines()
    assert acc == alone.splitlines()[0]
    runs = int(ticks.split()[1])
    assert runs > 20
    (thread,) = rec.threads
    flow = decode_trace(thread.data, patch_image(rec, tmp_path), PtConfig())
    assert not flow.gaps
    with open(exe, "rb") as f:
        (handler,) = [s["st_value"] for s in ELFFile(f).get_section_by_name(".symtab").iter_symbols()
                      if s.name == "on_alarm"]  # fmt: skip
    base = min(m.start for m in rec.maps if m.path == str(exe))
    assert int((flow.block_ip == base + handler).sum()) == runs


def test_indirect_calls_into_nothing_fault_where_they_would(same_path, tmp_path):
    """An indirect call to an address nothing is mapped at faults there, as
    it does natively (the program's handler sees that address as its IP,
    not one in the runtime, which handles the call first); the flow,
    through each fault and its handler's siglongjmp, equals the stepper's."""
    exe = build_bad_calls()
    out = tmp_path / "out"
    with open(out, "w") as f:
        record_patched([str(exe)], stdout=f)
    assert out.read_text() == "caught 3 faults at the bad address\n"
    rec = record_patched([str(exe)])  # the output where the stepper's goes
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0
    assert_same_flows("bad-calls", decoded(rec, tmp_path), stepped(exe, rec))


def test_returns_into_code_before_a_moved_block_run_its_copy(same_path, tmp_path):
    """A call's return site that falls through into a block moved whole
    (its int3s in place) is moved with it, so that the return goes on in
    the copy, not through a trap stop at every call (as in python3, where
    such stops took 0.3 s of every run); the flow equals the stepper's."""
    exe = build_epilogues()
    rec = record_patched([str(exe)])
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0
    assert rec.traps == 0
    assert_same_flows("epilogues", decoded(rec, tmp_path), stepped(exe, rec))


def test_full_buffer_drops_then_overflow_packet(tmp_path):
    """A thread whose buffer is full drops packets and runs on; once hwtrace
    drained it (here only at the timer's signal stops: the periodic drain
    is off), the trace goes on with OVF and a FUP, as Intel PT's does.
    hwtrace's decoder and perf resynchronize at every OVF alike."""
    exe = build_async_signals()
    alone = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    out = tmp_path / "out"
    options = PatchOptions(buffer_size=16 << 10, drain_period=3600)
    with open(out, "w") as f:
        rec = record_patched([str(exe)], options, stdout=f)
    assert out.read_text().splitlines()[0] == alone.splitlines()[0]
    (thread,) = rec.threads
    assert thread.lost > 0 and len(thread.data) > 4 * options.buffer_size
    flow = decode_trace(thread.data, patch_image(rec, tmp_path), PtConfig())
    assert not flow.gaps
    overflows = int((flow.event_columns()["type"] == Ev.OVERFLOW).sum())
    assert overflows > 1
    if shutil.which("perf"):
        data = tmp_path / "perf.data"
        write_patch_perf_data(rec, data)
        errors = subprocess.run(["perf", "script", "-i", str(data), "--itrace=e"],
                                capture_output=True, text=True, check=True).stdout  # fmt: skip
        lines = [x for x in errors.splitlines() if "instruction trace error" in x]
        assert len(lines) == overflows and all("Overflow packet" in x for x in lines)


def executed_at(rec: PatchRecording, exe: Path, debug: Path) -> dict[int, int]:
    """How many times each instruction of ``exe`` ran, all threads, by its
    link-time address."""
    image = patch_image(rec, debug)
    ips = np.concatenate([decode_trace(t.data, image, PtConfig()).instructions()
                          for t in rec.threads])  # fmt: skip
    mine = [m for m in rec.maps if m.path == str(exe)]
    lo, hi = min(m.start for m in mine), max(m.end for m in mine)
    with open(exe, "rb") as f:
        vaddr = min(s["p_vaddr"] for s in ELFFile(f).iter_segments() if s["p_type"] == "PT_LOAD")
    bias = lo - vaddr
    at, n = np.unique(ips[(ips >= lo) & (ips < hi)], return_counts=True)
    return dict(zip((at - bias).tolist(), n.tolist(), strict=True))


def unnamed_sections(exe: Path) -> list[tuple[int, int]]:
    """``.init``, ``.fini`` and ``.plt.got``: callgrind files their code
    under no object (``???``, run-time addresses)."""
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        return [(s["sh_addr"], s["sh_addr"] + s["sh_size"]) for s in elf.iter_sections()
                if s.name in (".init", ".fini", ".plt.got")]  # fmt: skip


def classify(exe: Path, addresses) -> tuple[set[int], set[int], tuple[int, int]]:
    """Of ``addresses``: the REP-prefixed string instructions (PT and
    hwtrace count one, callgrind one per iteration) and the calls and
    jumps (tail calls) to ``.plt`` stubs; and ``.plt``'s range."""
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        text = [(s["sh_addr"], s.data()) for s in elf.iter_sections() if s["sh_flags"] & 4]
        plt = elf.get_section_by_name(".plt")
        plt_range = (plt["sh_addr"], plt["sh_addr"] + plt["sh_size"]) if plt else (0, 0)
    rep, calls = set(), set()
    for a in addresses:
        for base, data in text:
            if base <= a < base + len(data):
                ins = next(iter(iced.Decoder(64, data[a - base : a - base + 15], ip=a)))
                if (ins.has_rep_prefix or ins.has_repne_prefix) and ins.is_string_instruction:
                    rep.add(a)
                if ins.flow_control in (
                    iced.FlowControl.CALL,
                    iced.FlowControl.UNCONDITIONAL_BRANCH,
                ):
                    if plt_range[0] <= ins.near_branch_target < plt_range[1]:
                        calls.add(a)
    return rep, calls, plt_range


def assert_counts_equal_callgrind(rec: PatchRecording, exe: Path, theirs: dict[int, int],
                                  debug: Path) -> dict[int, int]:  # fmt: skip
    """Every instruction of ``exe`` ran in ``rec`` as many times as callgrind
    counted it (``theirs``, by link-time address).  callgrind counts a
    ``.plt`` stub's instruction (bound at load: one ``jmp *GOT``) at the call
    or jump that went through it, a REP string instruction once per
    iteration (PT: once), and files ``.init``, ``.fini`` and ``.plt.got``
    under no object."""
    ours = at = executed_at(rec, exe, debug)
    for lo, hi in unnamed_sections(exe):
        ours = {a: n for a, n in ours.items() if not lo <= a < hi}
    rep, plt_calls, (plo, phi) = classify(exe, set(ours) | set(theirs))
    stubs = sum(n for a, n in ours.items() if plo <= a < phi)
    ours = {a: n for a, n in ours.items() if not plo <= a < phi}
    for a in plt_calls:
        ours[a] *= 2
    assert stubs == sum(ours[a] // 2 for a in plt_calls)
    assert set(ours) == set(theirs)
    assert {a: n for a, n in ours.items() if a not in rep} == {
        a: n for a, n in theirs.items() if a not in rep
    }
    assert all(ours[a] <= theirs[a] for a in rep)
    return at


def functions_of(exe: Path) -> dict[str, tuple[int, int]]:
    """``exe``'s functions with a size: name -> (address, size), from its
    symbol tables (aliases share an address)."""
    out = {}
    with open(exe, "rb") as f:
        elf = ELFFile(f)
        for name in (".dynsym", ".symtab"):
            table = elf.get_section_by_name(name)
            for sym in table.iter_symbols() if table else ():
                if sym["st_info"]["type"] == "STT_FUNC" and sym["st_size"] and sym["st_value"]:
                    out[sym.name.split("@")[0]] = (sym["st_value"], sym["st_size"])
    return out


def report_functions(data: Path, exe: Path) -> dict[str, int]:
    """``hwtrace report``'s instructions per function of ``exe`` (its
    profile, every thread added), by name."""
    prof, _ = profile_session(PerfSession.open(data))
    out: dict[str, int] = {}
    for th in prof.threads:
        for k in np.flatnonzero(th.by_insn[1:]).tolist():
            module, _, fn = th.names[k].partition("!")
            if module == exe.name:
                out[fn] = out.get(fn, 0) + int(th.by_insn[k + 1])
    return out


def assert_functions_equal_callgrind(data: Path, exe: Path, theirs: dict[str, int],
                                     at: dict[int, int]) -> None:  # fmt: skip
    """``hwtrace report``'s instructions per function of ``exe`` (from
    perf.data ``data``) equal callgrind's self Ir (``theirs``), compared by
    function address (aliases: callgrind may name ``D1``, hwtrace ``D2``).
    callgrind counts a ``.plt`` stub's instruction in the function that
    called or jumped through it (hwtrace lists ``name@plt``: moved to the
    caller here, by the call sites' counts ``at``), names ``_start``
    ``(below main)``, files ``.plt.got``/``.init``/``.fini`` under no object,
    and names code no sized symbol covers by the address a call entered
    (``0x...``; hwtrace: ``sub_<address>`` from ``.eh_frame_hdr``, or
    ``[unknown]``; compared in total)."""
    funcs = functions_of(exe)
    spans = sorted(funcs.values())

    def function_at(a: int) -> int | None:
        k = bisect.bisect_right(spans, (a, 1 << 64)) - 1
        return spans[k][0] if k >= 0 and spans[k][0] <= a < sum(spans[k]) else None

    cg: dict[int, int] = collections.Counter()
    cg_unnamed = 0
    for fn, n in theirs.items():
        if fn.startswith("0x"):
            cg_unnamed += n
        else:
            cg[funcs["_start" if fn == "(below main)" else fn][0]] += n
    # (callgrind names a stripped function by the address a call entered,
    # hwtrace by its .eh_frame range: a tail call's code is the callee's)
    reported = {fn: n for fn, n in report_functions(data, exe).items()
                if not fn.startswith("sub_")}  # fmt: skip
    ours: dict[int, int] = collections.Counter()
    for fn, n in reported.items():
        if not fn.endswith("@plt"):
            ours[funcs[fn][0]] += n
    rep, plt_calls, (plo, phi) = classify(exe, set(at))
    skip = [(plo, phi), *unnamed_sections(exe)]
    unnamed = sum(n for a, n in at.items() if not any(lo <= a < hi for lo, hi in skip))
    unnamed -= sum(n for fn, n in reported.items() if not fn.endswith("@plt"))
    for site in plt_calls:
        f = function_at(site)
        if f is None:
            unnamed += at[site]
        else:
            ours[f] += at[site]
    with_rep = {function_at(a) for a in rep}
    if None in with_rep:
        assert unnamed <= cg_unnamed
    else:
        assert unnamed == cg_unnamed  # code no sized symbol covers
    assert set(ours) == set(cg)
    assert {a: n for a, n in ours.items() if a not in with_rep} == {
        a: n for a, n in cg.items() if a not in with_rep
    }
    assert all(ours[a] <= cg[a] for a in with_rep)


@pytest.mark.skipif(callgrind_skip() is not None, reason=str(callgrind_skip()))
@pytest.mark.parametrize("name", PROGRAM_NAMES)
def test_patch_instruction_counts_equal_callgrind(name, same_path, tmp_path):
    """The test programs: every instruction as many times as callgrind
    says, and ``hwtrace report``'s instructions per function its self Ir."""
    exe = build_program(name)
    rec = record_patched([str(exe)], stdout=subprocess.DEVNULL)
    theirs = callgrind_self_ir([str(exe)], instructions=True)
    at = assert_counts_equal_callgrind(rec, exe, theirs.ir_at_in(exe), tmp_path)
    write_patch_perf_data(rec, tmp_path / "perf.data")
    assert_functions_equal_callgrind(tmp_path / "perf.data", exe, theirs.self_ir_in(exe), at)


# Real programs from Debian on small inputs: (argv, files made first).  Both
# runs see the same environment (valgrind adds variables to it), the same
# kind of standard output (a pipe) and the same files.
SQL = """create table t(a integer primary key, b text);
with recursive n(x) as (select 1 union all select x + 1 from n where x < 3000)
insert into t select x, printf('%08x', x * 2654435761 % 4294967296) from n;
create index tb on t(b);
select count(*), max(b) from t where a % 7 = 3;
"""
REAL = {
    "xz": ["xz", "-6", "-k", "-f", "{dir}/in"],
    "gzip": ["gzip", "-9", "-k", "-f", "{dir}/in"],
    "sqlite3": ["sqlite3", ":memory:", ".read {dir}/q.sql"],
}


def _valgrind_environment() -> dict[str, str]:
    """The environment a program sees under valgrind (it adds to it)."""
    out = subprocess.run(["valgrind", "-q", "--tool=none", "/usr/bin/env", "-0"],
                         capture_output=True, check=True, env=dict(os.environ)).stdout  # fmt: skip
    return dict(x.split("=", 1) for x in out.decode().split("\0") if "=" in x)


@pytest.mark.skipif(callgrind_skip() is not None, reason=str(callgrind_skip()))
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_programs_instruction_counts_equal_callgrind(name, same_path, tmp_path):
    """Real programs: every instruction of the program's own code ran as
    many times as callgrind counted it."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed")
    exe = Path(os.path.realpath(path))
    (tmp_path / "in").write_bytes(Path(sys.executable).read_bytes()[:40_000])
    (tmp_path / "q.sql").write_text(SQL)
    argv = [str(exe), *(a.format(dir=tmp_path) for a in REAL[name][1:])]
    env = _valgrind_environment()
    rec = record_patched(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0
    for made in tmp_path.glob("in.*"):  # xz's and gzip's output: made anew
        made.unlink()
    theirs = callgrind_self_ir(argv, instructions=True)
    at = assert_counts_equal_callgrind(rec, exe, theirs.ir_at_in(exe), tmp_path)
    write_patch_perf_data(rec, tmp_path / "perf.data")
    assert_functions_equal_callgrind(tmp_path / "perf.data", exe, theirs.self_ir_in(exe), at)


def test_record_cli_patch_backend(same_path, tmp_path, capsys):
    """``hwtrace record --backend patch`` writes a perf.data that hwtrace
    and (where installed) perf decode to the same instructions."""
    exe = build_program("recursion")
    data = tmp_path / "perf.data"
    assert (
        hwtrace_main(["record", "--backend", "patch", "-N", "-o", str(data), "--", str(exe)]) == 0
    )
    err = capsys.readouterr().err
    assert "backend patch" in err and "wrote" in err
    assert hwtrace_main(["script", "-i", str(data)]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(lines) > 1_000_000  # the whole program, from its entry point
    if shutil.which("perf"):
        proc = subprocess.run(["perf", "script", "-i", str(data), "--itrace=i0ns", "-F", "ip"],
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert len(proc.stdout.split()) == len(lines)
    # One function: its instructions only, the same in perf.
    assert hwtrace_main(["record", "--backend", "patch", "-N", "-f", "deep", "-o", str(data), "--",
                         str(exe)]) == 0  # fmt: skip
    assert "tracing 1 address range(s) only" in capsys.readouterr().err
    # Its header keeps the command that recorded it, as perf keeps its own.
    from hwtrace.perf.data import read_perf_data
    from hwtrace.perf.features import Feature

    assert read_perf_data(data).features[Feature.CMDLINE] == [
        "hwtrace", "record", "--backend", "patch", "-N", "-f", "deep", "-o", str(data), "--",
        str(exe),
    ]  # fmt: skip
    assert hwtrace_main(["script", "-i", str(data)]) == 0
    syms = [x.split()[-2].split("+")[0] for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(syms) > 100_000 and set(syms) == {"deep"}
    if shutil.which("perf"):
        proc = subprocess.run(["perf", "script", "-i", str(data), "--itrace=i0ns", "-F", "ip"],
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        assert len(proc.stdout.split()) == len(syms)
    # --call with -f needs stepping: a clear message, no traceback.
    args = ["record", "--backend", "patch", "--call", "deep", "-f", "tree", "--", str(exe)]
    assert hwtrace_main(args) == 2
    assert "use --backend step" in capsys.readouterr().err
    assert hwtrace_main(["record", "--backend", "patch", "-f", "nosuch", "--", str(exe)]) == 1
    assert "function 'nosuch' not found" in capsys.readouterr().err
    # The program it launched is gone, not left stopped under ptrace.
    assert not _children_running(exe)
    args = ["record", "--backend", "patch", "-N", "-o", str(data), "-f", "libnone.so!f", "--"]
    assert hwtrace_main([*args, str(exe)]) == 0
    assert "libnone.so!f: the library was never mapped" in capsys.readouterr().err


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_program_under_another_tracer_is_one_message(tmp_path):
    """hwtrace under ``strace -f``: strace takes the child first (ptrace
    allows one tracer); one message, no traceback."""
    cmd = ["strace", "-f", "-o", "/dev/null", sys.executable, "-m", "hwtrace.cli.main", "record",
           "--backend", "patch", "-N", "-o", str(tmp_path / "x.data"), "--", "/bin/true"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert "another tracer" in proc.stderr and "Traceback" not in proc.stderr


def test_patch_code_matches_its_source(tmp_path):
    """_patchcode.py is what scripts/gen_patchcode.py makes of runtime.S."""
    if shutil.which("as") is None:
        pytest.skip("GNU as is not installed (binutils)")
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "gen_patchcode", root / "scripts/gen_patchcode.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    out = tmp_path / "_patchcode.py"
    gen.write(out)
    assert out.read_text() == (root / "src/hwtrace/record/patch/_patchcode.py").read_text()


PR_SET_CHILD_SUBREAPER = 36


def _children_running(exe: Path) -> list[int]:
    """This process's children running ``exe`` (or having run it: zombies
    too, by their command name)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                head, _, rest = f.read().rpartition(")")
            comm = head.split("(", 1)[1]
            if int(rest.split()[1]) == os.getpid() and comm == exe.name[:15]:
                out.append(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return out


def record_orphaning(point: str, data: Path, out: Path) -> subprocess.CompletedProcess:
    """``hwtrace record --backend patch`` of the ``signals`` program with
    ``HWTRACE_PATCH_KILL_AT=point``; the program, left running when hwtrace
    goes, is reparented to this process (a subreaper for the while), waited
    for and must have ended well with its correct output in ``out``."""
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    try:
        exe = build_program("signals")  # threads of work, signals, handlers
        env = dict(os.environ, HWTRACE_PATCH_KILL_AT=point)
        hwtrace = Path(sys.executable).with_name("hwtrace")
        with open(out, "w") as f:
            proc = subprocess.run([str(hwtrace), "record", "--backend", "patch", "-N", "-o",
                                   str(data), "--", str(exe)], stdout=f, stderr=subprocess.PIPE,
                                  text=True, env=env, timeout=300)  # fmt: skip
        # Not every child: pytest has children of its own.
        for pid in _children_running(exe):
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        assert out.read_text() == expected_output("signals")
        return proc
    finally:
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


@pytest.mark.parametrize("point", KILL_POINTS)
def test_program_runs_on_when_hwtrace_is_killed(point, tmp_path):
    """hwtrace SIGKILLed while it sets up, patches or traces: the program
    runs on to its correct end."""
    proc = record_orphaning(point, tmp_path / "perf.data", tmp_path / "out")
    assert proc.returncode == -signal.SIGKILL, proc.stderr


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGHUP"])
def test_terminate_while_tracing_writes_what_was_recorded(sig, tmp_path):
    """SIGTERM or SIGHUP to hwtrace while the program runs: hwtrace stops
    recording, writes what it has, says so, and the program runs on
    (detached when hwtrace exits) to its correct end."""
    data = tmp_path / "perf.data"
    proc = record_orphaning(f"tracing:{sig}", data, tmp_path / "out")
    assert proc.returncode == 128 + getattr(signal, sig), proc.stderr
    assert f"stopped by {sig}" in proc.stderr and "Traceback" not in proc.stderr
    assert hwtrace_main(["script", "-i", str(data)]) == 0


def test_recording_when_the_caller_has_children(tmp_path):
    """hwtrace waits for the threads it traces, not for every child of its
    caller (which would never end here)."""
    sleeper = subprocess.Popen(["sleep", "600"])
    try:
        rec = record_patched([str(build_program("signals"))], stdout=subprocess.DEVNULL)
        assert os.waitstatus_to_exitcode(rec.exit_status) == 0 and rec.threads
    finally:
        sleeper.kill()
        sleeper.wait()


def test_interrupt_while_tracing_records_on(tmp_path):
    """^C reaches hwtrace while the program runs (the program gets its own):
    hwtrace records on until the program ends and writes the perf.data."""
    exe = build_program("signals")
    out, data = tmp_path / "out", tmp_path / "perf.data"
    env = dict(os.environ, HWTRACE_PATCH_KILL_AT="tracing:SIGINT")
    hwtrace = Path(sys.executable).with_name("hwtrace")
    with open(out, "w") as f:
        proc = subprocess.run([str(hwtrace), "record", "--backend", "patch", "-N", "-o", str(data),
                               "--", str(exe)], stdout=f, stderr=subprocess.PIPE, text=True,
                              env=env, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert out.read_text() == expected_output("signals")
    assert data.stat().st_size > 0


def test_perf_data_written_while_recording(same_path, tmp_path):
    """The trace goes into perf.data while the program runs, in AUXTRACE
    records of whole packets (as perf record writes them), the rest at the
    end: hwtrace and perf read the records of a thread as one trace, the
    same instructions as a recording kept in spool files.  (Drained only
    at the program's signals here, a few KiB at a time: the same records
    every run; the thread goes round its 8 KiB ring.)"""
    exe = build_program("signals")
    kept = record_patched([str(exe)], stdout=subprocess.DEVNULL)
    (expected,) = decoded(kept, tmp_path).values()
    path = tmp_path / "perf.data"
    options = PatchOptions(buffer_size=8 << 10, drain_period=3600)
    rec = record_patched_perf([str(exe)], path, options, stdout=subprocess.DEVNULL)
    ((tid, size, lost),) = [(t.tid, t.size, t.lost) for t in rec.threads]
    data = read_perf_data(path)
    aux = data.auxtrace_columns()
    assert aux["size"].shape[0] >= 3 and int(aux["size"].sum()) >= size > 0 and lost == 0
    assert size > options.buffer_size  # round the ring, nothing lost
    flow = decode_perf(data)
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    np.testing.assert_array_equal(q.instructions(), expected)
    if shutil.which("perf"):
        from test_record_threads import perf_lists

        np.testing.assert_array_equal(perf_lists(path)[tid], expected)


def test_functions_of_a_library_loaded_later(same_path, tmp_path):
    """``-f 'lib!name'`` of a library the program dlopens (twice): looked up
    when its code is mapped, patched before it runs; the flow is the
    whole program's flow (checked against the stepper elsewhere) cut to
    the functions' addresses, a callback into the program left and
    entered again where it returns."""
    exe, lib = build_program("dlopen"), build_dlopen_library()
    functions = tuple(f"{lib.name}!{f}" for f in ("lib_work", "lib_apply"))
    rec = record_patched([str(exe)], PatchOptions(functions=functions))
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0 and rec.traps == 0
    assert len(rec.ranges) == 2
    (got,) = decoded(rec, tmp_path).values()
    whole = record_patched([str(exe)])
    (flow,) = decoded(whole, tmp_path).values()
    inside = np.zeros(flow.shape[0], np.bool_)
    for lo, hi in rec.ranges:
        inside |= (flow >= lo) & (flow < hi)
    assert got.shape[0] > 300_000
    np.testing.assert_array_equal(got, flow[inside])


def test_function_called_often_decodes_without_a_stop_per_call(same_path, tmp_path,
                                                               monkeypatch):  # fmt: skip
    """A function traced alone is enabled (TIP.PGE) at each of its calls;
    the decoder asks the session for the code only where it may change
    (the sideband's next mapping), not at each enable, and the flow is
    perf's."""
    from hwtrace.session import perfflow

    exe = build_program("recursion")
    path = tmp_path / "perf.data"
    rec = record_patched_perf([str(exe)], path, PatchOptions(functions=("add_five",)),
                              stdout=subprocess.DEVNULL)  # fmt: skip
    assert rec.traps == 0
    asked = []
    real = perfflow.QueueContexts.context
    monkeypatch.setattr(perfflow.QueueContexts, "context",
                        lambda self, tsc, ip: asked.append(ip) or real(self, tsc, ip))  # fmt: skip
    flow = decode_perf(read_perf_data(path))
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    ips = q.instructions()
    add_five = PIE_BASE + functions_of(exe)["add_five"][0]
    calls = int((ips == add_five).sum())
    assert calls > 5_000 and len(asked) <= 3
    if shutil.which("perf"):
        from test_record_threads import perf_lists

        np.testing.assert_array_equal(perf_lists(path)[rec.threads[0].tid], ips)


def test_forked_children_run_patched_code_at_once(tmp_path):
    """Children forked without exec (not recorded) run the patched code
    beside each other and the parent, each on control-block state of its
    own: their results are the program's own."""
    exe = build_forks()
    alone = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    out = tmp_path / "out"
    for _ in range(2):
        with open(out, "w") as f:
            rec = record_patched([str(exe)], stdout=f)
        assert out.read_text() == alone
        assert rec.forks == 4 and [t.tid for t in rec.threads] == [rec.pid]


def test_threads_past_the_last_slot_run_untraced(tmp_path):
    """More threads than control blocks with a buffer: the others run
    unrecorded, each on a private control block, and the program's output
    is its own."""
    out = tmp_path / "out"
    with open(out, "w") as f:
        rec = record_patched([str(build_program("threads"))], PatchOptions(max_threads=2),
                             stdout=f)  # fmt: skip
    assert out.read_text() == expected_output("threads")
    assert 1 <= len(rec.threads) < 5


def test_exec_is_followed(same_path, tmp_path):
    """The recorded process runs another program (a shell's ``exec``, a
    wrapper script): hwtrace follows it, as perf does, with the new
    program's COMM (exec) and MMAP2; its trace, from its entry point on,
    is that of the program recorded alone."""
    exe = build_program("recursion")
    kept = record_patched([str(exe)], stdout=subprocess.DEVNULL)
    (alone,) = decoded(kept, tmp_path).values()
    path = tmp_path / "perf.data"
    rec = record_patched_perf(["/bin/sh", "-c", f"exec {exe}"], path, stdout=subprocess.DEVNULL)
    assert [e.comm for e in rec.execs] == [exe.name[:15]] and not rec.exec_error
    data = read_perf_data(path)
    flow = decode_perf(data)
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    got = q.instructions()
    assert got.shape[0] > alone.shape[0]  # the shell's part, then the program's
    np.testing.assert_array_equal(got[-alone.shape[0] :], alone)
    if shutil.which("perf"):
        from test_record_threads import perf_lists

        np.testing.assert_array_equal(perf_lists(path)[q.tid], got)


def test_children_that_exec_are_followed(same_path, tmp_path):
    """With ``follow_fork``, a child that runs another program (a shell
    running two commands) is recorded on in it, as ``perf record`` follows
    it: the new program's COMM (exec) and MMAP2 under the child's pid, its
    trace from its entry point on that of the program recorded alone; the
    parent's trace goes on unharmed."""
    exe = build_program("recursion")
    kept = record_patched([str(exe)], stdout=subprocess.DEVNULL)
    (alone,) = decoded(kept, tmp_path).values()
    path = tmp_path / "perf.data"
    argv = ["/bin/sh", "-c", f"{exe}; {exe}; echo done"]
    rec = record_patched_perf(argv, path, PatchOptions(follow_fork=True), stdout=subprocess.DEVNULL)
    children = sorted({t.pid for t in rec.threads} - {rec.pid})
    assert len(children) == 2 and not rec.exec_error
    assert [(e.pid, e.comm) for e in rec.execs] == [(c, exe.name[:15]) for c in children]
    flow = decode_perf(read_perf_data(path))
    assert not flow.problems and flow.n_gaps == 0
    got = {q.tid: q.instructions() for q in flow.queues}
    for child in children:
        assert got[child].shape[0] > alone.shape[0]  # the shell's fork, then the program
        np.testing.assert_array_equal(got[child][-alone.shape[0] :], alone)
    assert got[rec.pid].shape[0] > 10_000
    if shutil.which("perf"):
        from test_record_threads import perf_lists

        theirs = perf_lists(path)
        for tid, ours in got.items():
            np.testing.assert_array_equal(theirs[tid], ours)


def test_repeat_recordings_reuse_their_plans(tmp_path, monkeypatch):
    """A program recorded again (its addresses not randomized, by default)
    is patched from the plans cached the first time: no plan is made
    again, and the trace is the same."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    plans = tmp_path / "cache" / "hwtrace" / "patch-plans"
    exe = build_program("recursion")
    first = record_patched([str(exe)], stdout=subprocess.DEVNULL)
    made = {p.name: p.stat().st_ino for p in plans.iterdir()}  # a plan made anew: a new file
    assert len(made) >= 3  # the program, libc, the dynamic loader
    second = record_patched([str(exe)], stdout=subprocess.DEVNULL)
    assert {p.name: p.stat().st_ino for p in plans.iterdir()} == made
    assert second.modules == first.modules
    (a,) = decoded(first, tmp_path).values()
    (b,) = decoded(second, tmp_path).values()
    np.testing.assert_array_equal(a, b)


def test_code_written_at_run_time_is_a_stated_gap(same_path, tmp_path):
    """A program that writes code and runs it (W^X: mapped writable, then
    executable): the program's results are its own; hwtrace names the
    memory it did not trace, and the trace has a gap where the program
    branched into it, the code before decoded."""
    exe = build_jit()
    alone = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    out = tmp_path / "out"
    with open(out, "w") as f:
        rec = record_patched([str(exe)], stdout=f)
    assert out.read_text() == alone
    page = int(alone.split()[1], 16)
    assert [(m.start, m.path) for m in rec.untraced] == [(page, "")]
    (thread,) = rec.threads
    flow = decode_trace(thread.data, patch_image(rec, tmp_path), PtConfig())
    assert flow.gaps and flow.gaps[0].ip == page
    assert flow.instructions().shape[0] > 100  # up to the first call into it


def test_program_killed_while_recorded(tmp_path):
    """A program killed while it is recorded (here a shell that SIGKILLs
    itself): hwtrace writes what was recorded and exits with the program's
    status, 128 + the signal, as perf record does; a failing program's
    status is passed on too."""
    data = tmp_path / "perf.data"
    argv = ["record", "--backend", "patch", "-N", "-o", str(data), "--"]
    assert hwtrace_main([*argv, "/bin/sh", "-c", "kill -9 $$"]) == 128 + signal.SIGKILL
    flow = decode_perf(read_perf_data(data))
    assert not flow.problems and flow.n_gaps == 0
    (q,) = flow.queues
    assert q.instructions().shape[0] > 10_000  # the shell, up to its kill
    assert hwtrace_main([*argv, "/bin/false"]) == 1


def test_follow_fork_records_the_children(same_path, tmp_path):
    """``follow_fork``: every forked child is recorded too, from the
    instruction after the fork; each process's flow equals the ptrace
    stepper's (following forks too), and perf reads the perf.data's
    per-process traces alike."""
    argv = [str(build_forks()), "120"]
    # (Both runs write to this process's standard output: its kind is
    # part of the path printf takes.)
    rec = record_patched(argv, PatchOptions(follow_fork=True))
    ours = decoded(rec, tmp_path)
    assert len(ours) == 5 and len({t.pid for t in rec.threads}) == 5
    code = [m for m in rec.maps if "x" in m.prot and m.path and m.path != "[vsyscall]"]
    ranges = [(min(m.start for m in code), max(m.end for m in code))]
    steps = record_software(argv, ranges=ranges, registers="basic", follow_fork=True)
    theirs = {t.tid: t.instructions for t in steps.threads}
    assert len(theirs) == 5
    for (_, a), (_, b) in zip(sorted(ours.items()), sorted(theirs.items()), strict=True):
        np.testing.assert_array_equal(a, b)  # in order of creation
    if shutil.which("perf"):
        from test_record_threads import perf_lists

        path = tmp_path / "perf.data"
        write_patch_perf_data(rec, path)
        got = perf_lists(path)
        assert set(got) == set(ours)
        for tid, flow in ours.items():
            np.testing.assert_array_equal(got[tid], flow)


def test_followed_children_keep_their_redirect_table(tmp_path):
    """With ``follow_fork``, the parent loads a library while its children
    run: hwtrace makes the parent a new redirect table, which the children
    (whose memory does not have it) must not be given: their results are
    their own."""
    argv = [str(build_forks()), "20000", str(build_dlopen_library())]
    alone = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    out = tmp_path / "out"
    with open(out, "w") as f:
        rec = record_patched(argv, PatchOptions(follow_fork=True), stdout=f)
    assert out.read_text() == alone
    assert len({t.pid for t in rec.threads}) == 5 and rec.mapped


def _recursion_plan():
    """The recursion program's .text swept and planned as the patcher does
    (at PIE_BASE): its code map, a reader of its bytes and the plan."""
    from hwtrace.record.patch.layout import ARENA_STUBS, FAR_OFFSET, FAR_SPAN, plan_module
    from hwtrace.record.patch.sites import sweep

    exe = build_program("recursion")
    with open(exe, "rb") as f:
        text = ELFFile(f).get_section_by_name(".text")
        lo, data = PIE_BASE + text["sh_addr"], text.data()

    def read(address: int, size: int) -> bytes:
        return data[address - lo : address - lo + size]

    cm = sweep(read, [(lo, lo + len(data))])
    # Arenas as the patcher maps them: near below the module, and the far
    # stub space for jumps whose displacement's top byte must be 0xCC.
    far_lo = (lo - FAR_OFFSET) & ~0xFFF
    far = [(far_lo, far_lo + FAR_SPAN, np.zeros(FAR_SPAN, np.uint8))]
    return cm, read, plan_module(cm, read, (PIE_BASE - 2 * ARENA_STUBS, PIE_BASE), far)


def test_windows_start_where_their_blocks_do():
    """A window reaches back to its block's first instruction (past padding
    NOPs), so the trampolines' direct branches, which go to the copy of
    their target where it has one, keep a loop inside trampolines instead
    of jumping back to the program's code and in again."""
    from hwtrace.record.patch.sites import K_OTHER

    cm, read, plan = _recursion_plan()
    ips = cm.ips.astype(np.int64)
    ends = ips + cm.lens.astype(np.int64)
    # A block starts at a leader or after a control transfer (or a gap).
    starts = cm.leaders.copy()
    starts[1:] |= (cm.kinds[:-1] != K_OTHER) | (ends[:-1] != ips[1:])
    pad = np.array([read(int(a), int(n))[:1] in (b"\x90", b"\x66", b"\x0f") for a, n
                    in zip(cm.ips, cm.lens, strict=True)])  # fmt: skip
    at_start = set(ips[starts & ~pad].tolist())
    # (A block opened by padding starts at its first other instruction.)
    at_start |= {int(ips[k + 1]) for k in np.flatnonzero(pad[:-1] & ~pad[1:])}
    windows = [a for a, b in plan.patches if b[:1] == b"\xe9"]
    assert len(windows) > 30
    share = sum(a in at_start for a in windows) / len(windows)
    assert share > 0.9, share


def test_flags_liveness_follows_iced():
    """A conditional branch's bit may clobber the arithmetic flags only
    where the code it goes to writes all six before reading any (iced-x86's
    per-instruction flags, straight-line code and direct jumps)."""
    from hwtrace.record.patch._loops import flags_dead_everywhere
    from hwtrace.record.patch.sites import sweep

    code = bytes.fromhex(
        "83f801"  # 0  cmp eax, 1          writes all: dead
        "ffc0"  # 1    inc eax             CF left, then add writes it: dead
        "01d8"  # 2    add eax, ebx        dead
        "ffc0"  # 3    inc eax             CF left, adc reads it: live
        "11d8"  # 4    adc eax, ebx        live
        "b801000000"  # 5 mov eax, 1       then a jump to xor: dead
        "eb03"  # 6    jmp +3
        "0f42c3"  # 7  cmovb eax, ebx      live
        "31c0"  # 8    xor eax, eax        dead
        "7202"  # 9    jb                  live
        "90"  # 10     nop                 then ret: live (not followed)
        "c3"  # 11     ret
    )
    lo = 0x1000

    def read(address: int, size: int) -> bytes:
        return code[address - lo : address - lo + size]

    cm = sweep(read, [(lo, lo + len(code))])
    dead = flags_dead_everywhere(cm.ips, cm.lens, cm.kinds, cm.flags, cm.targets)
    assert dead.tolist() == [True, True, True, False, False, True, True, False, True, False,
                             False, False]  # fmt: skip


def test_direct_calls_keep_their_place():
    """A 5-byte direct call stays where it is, only its displacement
    changed, to a thunk that pushes its return address onto the runtime's
    return stack and jumps to the callee: the processor's return stack
    still pairs the call with its return."""
    from hwtrace.record.patch import _patchcode as pc
    from hwtrace.record.patch.sites import K_CALL

    cm, _, plan = _recursion_plan()
    code = dict(plan.code)
    patched = dict(plan.patches)
    ips, lens = cm.ips.astype(np.int64), cm.lens.astype(np.int64)
    calls = np.flatnonzero((cm.kinds == K_CALL) & (lens == 5)
                           & (cm.targets.astype(np.int64) != ips + lens))  # fmt: skip
    assert len(calls) >= 8
    covered = sorted((a, a + len(b)) for a, b in plan.patches if len(b) != 4)
    for k in calls.tolist():
        ip = int(ips[k])
        rel = patched.get(ip + 1)
        assert rel is not None, hex(ip)
        thunk = ip + 5 + int.from_bytes(rel, "little", signed=True)
        assert thunk >= plan.runtime and thunk in code
        body = code[thunk]
        neg = int.from_bytes(body[pc.F_push_neg : pc.F_push_neg + 8], "little", signed=True)
        assert neg == -(ip + 5)
        assert not any(a < ip + 5 and ip < b for a, b in covered), hex(ip)  # no window over it


def test_redirect_table_as_the_runtime_probes_it():
    """Every int3 address is found from its home slot by a linear probe
    (runtime.S's TABLE_PROBE, emulated here), and an address that is not
    in the table ends at an empty slot: random addresses and a dense run
    (a block moved whole), whose home slots collide."""
    import random

    from hwtrace.record.patch.layout import REDIRECT_HASH, AddressMap, redirect_table

    rng = random.Random(7)
    redirects = {rng.randrange(0x400000, 1 << 47): rng.randrange(1, 1 << 47) for _ in range(20000)}
    redirects.update({0x555555554000 + 3 * i: i + 1 for i in range(5000)})
    table, mask = redirect_table(AddressMap(redirects))
    # (An AddressMap answers as the dict it was made of.)
    assert all(AddressMap(redirects).get(k) == v for k, v in list(redirects.items())[:500])

    def probe(key: int) -> int | None:
        slot = ((key * REDIRECT_HASH) % (1 << 64) >> 12) & mask
        while True:
            if table[2 * slot] == key:
                return int(table[2 * slot + 1])
            if table[2 * slot] == 0:
                return None
            slot += 1

    assert all(probe(k) == v for k, v in redirects.items())
    assert probe(0x555555554001) is None and probe(0x7FFF00000000) is None


def test_a_programs_mixed_address_spaces_go_to_parquet_by_key(same_path, tmp_path):
    """A program that maps more code as it runs (dlopen, twice) has
    batches whose blocks were decoded in different address spaces (a
    block keeps the image it was first decoded in): a stream to Parquet
    gives them by block key, not laid out, each row's as decode_perf
    keeps it, and the dataset's space column holds them."""
    import pyarrow.dataset as pads

    from hwtrace.columns import Keyed
    from hwtrace.session.perfflow import stream_perf

    exe = build_program("dlopen")
    path = tmp_path / "perf.data"
    rec = record_patched_perf([str(exe)], path, PatchOptions(), stdout=subprocess.DEVNULL)
    assert os.waitstatus_to_exitcode(rec.exit_status) == 0
    data = read_perf_data(path)
    (q,) = decode_perf(data).queues
    images = q.flow.block_image
    assert images is not None and np.unique(images).shape[0] > 1
    got = []
    stream_perf(data, got.append, batch_rows=1 << 12, runs=False, deferred=True)
    assert any(isinstance(b.image, Keyed) for b in got)
    np.testing.assert_array_equal(np.concatenate([np.asarray(b.image) for b in got]), images)
    out = tmp_path / "ds"
    assert hwtrace_main(["decode", "-i", str(path), "-o", str(out)]) == 0
    rows = pads.dataset(out / "blocks", format="parquet", partitioning="hive").to_table(
        columns=["row", "space"]
    )
    order = np.argsort(rows.column("row").to_numpy())
    np.testing.assert_array_equal(rows.column("space").to_numpy()[order], images)
