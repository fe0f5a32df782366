"""Every analysis command runs on a small real input without importing
numba (nor numpy.ma, nor rich into a pipe): its loops come from the native library
(hwtrace.aot), so a command starts like a C tool once the library holds
them.

Each command runs twice in a fresh process: the first run may go through
numba (then the library is built again, as any command does after its
run, here waiting for any other process building it); the second must not
import numba at all.  A loop that allocates (numba's
runtime) or whose types the library cannot hold fails the second run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT.parent / "shared" / "conformance" / "libipt" / "cases"
SNAPSHOTS = ROOT / "tests" / "data" / "real" / "opencsd-snapshots"

PROGRAM = r"""
#include <stdio.h>
static int work(int n) { int s = 0; for (int i = 0; i < n; i++) s += (i * 7) % 13; return s; }
int main(void) { int s = 0; for (int k = 0; k < 20; k++) s += work(100 + k); printf("%d\n", s); return 0; }
"""

# What runs in the fresh process: the command, then whether numba came in.
RUNNER = (
    "import json, sys\n"
    "from hwtrace.cli.main import main\n"
    "rc = main(json.loads(sys.argv[1]))\n"
    "sys.stderr.write('\\nNUMBA-IMPORTED=%s\\n' % ('numba' in sys.modules))\n"
    "sys.stderr.write('\\nNUMPY-MA-IMPORTED=%s\\n' % ('numpy.ma' in sys.modules))\n"
    "sys.stderr.write('\\nRICH-IMPORTED=%s\\n' % ('rich' in sys.modules))\n"
    "sys.exit(rc)\n"
)


def _hwtrace(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUNNER, json.dumps(args)],
        cwd=cwd, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    from test_record_software import SKIP

    if SKIP is not None:
        pytest.skip(SKIP)
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    d = tmp_path_factory.mktemp("startup")
    (d / "small.c").write_text(PROGRAM)
    subprocess.run(["gcc", "-O1", "-o", d / "small", d / "small.c"], check=True)
    for name in ("a.data", "b.data"):
        out = _hwtrace(["record", "-o", name, "--", str(d / "small")], d)
        assert out.returncode == 0, out.stderr
    out = _hwtrace(["decode", "-i", "a.data", "-o", "dec"], d)
    assert out.returncode == 0, out.stderr
    _made_inputs(d)
    return d


def _made_inputs(d: Path) -> None:
    """Inputs this machine cannot record: a KVM host's Intel PT per pCPU
    (hwtrace's VM scenario), PTWRITE events in Intel PT, Intel BTS records
    in a perf.data (as perf writes them)."""
    import numpy as np

    from hwtrace.analysis.vmgen import mixed_scenario
    from hwtrace.hwevents.bts import encode_bts
    from hwtrace.hwevents.ptw import MAX_WORDS, encode_events
    from hwtrace.perf.writer import PerfDataWriter

    for pcpu, data in mixed_scenario().streams().items():
        (d / f"vm{pcpu}.pt").write_bytes(data)
    n = 40
    words = np.zeros((n, MAX_WORDS), np.uint64)
    words[:, 0] = np.arange(n)
    (d / "ptw.pt").write_bytes(
        encode_events(np.ones(n, np.uint64), words, np.ones(n, np.int64), 1000 + 10 * np.arange(n))
    )
    with PerfDataWriter(d / "bts.data") as w:
        w.set_intel_bts()
        w.add_auxtrace(
            encode_bts(np.full(8, 0x401005, np.uint64), np.full(8, 0x401000, np.uint64)), tid=1
        )


def _perf_events(d: Path) -> Path | None:
    """A perf.data with tracepoint samples (perf record), if perf can."""
    perf = shutil.which("perf")
    if perf is None:
        return None
    path = d / "ev.data"
    if not path.exists():
        subprocess.run(
            [perf, "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", "syscalls:sys_enter_write", "-o",
             str(path), "--",
             str(d / "small")],
            capture_output=True, timeout=120,
        )  # fmt: skip
    return path if path.exists() and path.stat().st_size > 0 else None


COMMANDS = {
    "script": ["script", "-i", "a.data"],
    "script-blocks": ["script", "-i", "a.data", "--blocks"],
    "report": ["report", "-i", "a.data"],
    # (its views: the call paths' timeline, flame graph and folded stacks)
    "report-views": [
        "report",
        "-i",
        "a.data",
        "--html",
        "r.html",
        "--timeline",
        "r.json",
        "--folded",
        "r.folded",
    ],
    # (the flow cut to a function's calls)
    "report-call": ["report", "-i", "a.data", "--call", "main"],
    "script-call": ["script", "-i", "a.data", "--call", "main"],
    "latency": ["latency", "-i", "a.data", "--toggle", "work"],
    "funclatency": ["funclatency", "-i", "a.data", "work"],
    "diff": ["diff", "a.data", "b.data"],
    "events": ["events", "-i", "a.data", "EVENTS"],
    "query": ["query", "dec", "select count(*) from blocks"],
    "perf-dump": ["perf-dump", "a.data"],
    "ptxed": ["ptxed", "--raw", f"{CASES}/loop-tnt.bin:0x100000", "--pt", f"{CASES}/loop-tnt.pt"],
    "ptxed-blocks": [
        "ptxed",
        "--block-decoder",
        "--block:show-blocks",
        "--raw",
        f"{CASES}/loop-tnt.bin:0x100000",
        "--pt",
        f"{CASES}/loop-tnt.pt",
    ],
    "ptdump": ["ptdump", f"{CASES}/loop-tnt.pt"],
    # CoreSight: ETMv4 in DSTREAM frames (with the frames listed), several
    # ETMv4 sources merged, STM
    "csdump": ["csdump", "--snapshot", f"{SNAPSHOTS}/a55-test-tpiu", "--raw-frames"],
    "csdump-merged": ["csdump", "--snapshot", f"{SNAPSHOTS}/juno-ret-stck"],
    "csdump-stm": ["csdump", "--snapshot", f"{SNAPSHOTS}/stm_only-juno"],
    "csdump-events": ["csdump", "--snapshot", f"{SNAPSHOTS}/stm_only-juno", "--events"],
    # (the patching backend's plans cached by the first run)
    "record": ["record", "-o", "again.data", "-f", "main", "--", "./small"],
    # (ptrace single-stepping: its system calls and stepping loop)
    "record-step": [
        "record",
        "--backend",
        "step",
        "-o",
        "step.data",
        "-f",
        "main",
        "--",
        "./small",
    ],
    "decode": ["decode", "-i", "a.data", "-o", "dec-again"],
    "characterize": ["characterize", "-i", "a.data"],
    "vm": ["vm", "VMCPUS", "--mtc-freq", "3", "--cpuid-0x15.eax", "1", "--cpuid-0x15.ebx", "2"],
    "vm-views": [
        "vm",
        "VMCPUS",
        "--mtc-freq",
        "3",
        "--cpuid-0x15.eax",
        "1",
        "--cpuid-0x15.ebx",
        "2",
        "--html",
        "v.html",
        "--perfetto",
        "v.json",
    ],
    "ptwrite": ["ptwrite", "ptw.pt"],
    "bts": ["bts", "-i", "bts.data"],
    # (each tier: its interpreters and the JIT's helpers are C functions of
    # the library)
    "filter": ["filter", "fd == 1 || count > 5", "EVENTS"],
    "filter-lttng": ["filter", "--tier", "lttng", "fd == 1 || count > 5", "EVENTS"],
    "filter-ebpf": ["filter", "--tier", "ebpf", "fd == 1 || count > 5", "EVENTS"],
    "filter-llvm": ["filter", "--tier", "llvm", "fd == 1 || count > 5", "EVENTS"],
    # (the events kept, copied into a new perf.data)
    "filter-perf-data": ["filter", "-o", "kept.data", "fd == 1 || count > 5", "EVENTS"],
}
# What a command writes and must not find when it starts.
OUTPUTS = {"decode": "dec-again"}


# Commands whose libraries import numpy.ma themselves (DuckDB's results).
MASKED_ARRAYS = {"query"}


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_runs_without_numba(inputs, name):
    args = list(COMMANDS[name])
    if "EVENTS" in args:
        events = _perf_events(inputs)
        if events is None:
            pytest.skip("perf cannot record tracepoint samples here")
        args[args.index("EVENTS")] = str(events)
    if name.startswith("vm"):
        at = args.index("VMCPUS")
        args[at : at + 1] = [
            a for p in sorted(inputs.glob("vm*.pt")) for a in ("--cpu", f"{p.stem[2:]}={p.name}")
        ]
    if name.startswith(("ptxed", "ptdump")) and not CASES.is_dir():
        pytest.skip(f"Intel's conformance cases are not at {CASES}")
    env_note = "HWTRACE_AOT=numba turns the library off" if os.environ.get("HWTRACE_AOT") else ""
    if env_note:
        pytest.skip(env_note)
    if name in OUTPUTS:
        shutil.rmtree(inputs / OUTPUTS[name], ignore_errors=True)
    first = _hwtrace(args, inputs)
    assert first.returncode == 0, first.stderr
    if "NUMBA-IMPORTED=True" in first.stderr:
        # The command's own build gives up while another process builds.
        build = subprocess.run([sys.executable, "-m", "hwtrace.aot", "build"],
                               capture_output=True, text=True, timeout=900)  # fmt: skip
        assert build.returncode == 0, build.stdout + build.stderr
    if name in OUTPUTS:
        shutil.rmtree(inputs / OUTPUTS[name])
    again = _hwtrace(args, inputs)
    assert again.returncode == 0, again.stderr
    assert "NUMBA-IMPORTED=False" in again.stderr, (first.stderr + again.stderr)[-3000:]
    assert again.stdout == first.stdout
    if name not in MASKED_ARRAYS:
        # numpy.ma is a fortieth of a second of a start (np.unique's first
        # call imports it: hwtrace.columns.distinct does not).
        assert "NUMPY-MA-IMPORTED=False" in again.stderr, again.stderr[-3000:]
    # Into a pipe, text goes out without rich (hwtrace.console).
    assert "RICH-IMPORTED=False" in again.stderr, again.stderr[-3000:]


def test_trace_lists_events_without_numba(tmp_path):
    """hwtrace trace's ring reader and text lines come from the native
    library (its warm-up part), not compiled while the ring fills."""
    if os.geteuid() != 0 or not Path("/sys/kernel/tracing/events/raw_syscalls").is_dir():
        pytest.skip("needs root and tracefs (BPF programs on kernel tracepoints)")
    if os.environ.get("HWTRACE_AOT"):
        pytest.skip("HWTRACE_AOT=numba turns the library off")
    args = ["trace", "raw_syscalls:sys_enter", "-d", "0.3"]
    first = _hwtrace(args, tmp_path)
    if first.returncode != 0 and "BPF" in first.stderr:
        pytest.skip(f"BPF is not usable here: {first.stderr.strip()[-200:]}")
    assert first.returncode == 0, first.stderr
    assert "raw_syscalls:sys_enter: id=" in first.stdout  # (its own system calls, at least)
    # (the library hwtrace aot warm built has them: the first run too)
    assert "NUMBA-IMPORTED=False" in first.stderr, first.stderr[-3000:]
