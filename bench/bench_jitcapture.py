"""Capture cost: hwtrace's code capture agent against FlowJIT's figures.

A JIT-like workload (``bench/jit_workload.c``, ``gcc -O2``) compiles N small
functions at run time and calls each; it runs three ways in this run:

* plain: nothing captures anything (the baseline);
* in-process shim (the C peer): the workload captures its own pages with a
  SIGSEGV handler, FlowJIT's state machine without ptrace, the lower bound
  of any user-space capture on this kernel;
* hwtrace: :func:`hwtrace.record.jitcapture.capture_code` launches it and
  captures every page revision from outside, with ptrace.

Workloads: a fresh page made executable with ``mprotect`` per function
(``mprotect``), one writable and executable page rewritten per function
(``rwx``), and ``rwx`` functions doing more work (a countdown loop of LOOP
iterations) for the slowdown of a JIT-heavy program.  Reported: the cost
per captured revision, ``(time - plain) / N`` (fault, snapshot, protection
changes, and for hwtrace the system calls it stops at), the time hwtrace
spends in its fault handling per fault, and the slowdown; against the
thesis's 1.3 µs per revision (973 ns - 6.8 µs, in the kernel) and its worst
slowdown, 19.3 % (at 60K JIT executions).  Best of R runs.

    python bench/bench_jitcapture.py [--functions N] [--repeat R]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out" / "jitcapture"
sys.path.insert(0, str(REPO / "src"))

from hwtrace.record.jitcapture import capture_code  # noqa: E402

THESIS_US = 1.3
THESIS_SLOWDOWN = 19.3


def build() -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    exe = OUT / "jit_workload"
    src = HERE / "jit_workload.c"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src)], check=True)
    return str(exe)


def plain(cmd: list[str]) -> float:
    seconds, _, status = common.run_process(cmd)
    if status != 0:
        raise common.BenchError(f"{' '.join(cmd)} exited {status}")
    return seconds


def captured(cmd: list[str], n: int) -> tuple[float, dict[str, int]]:
    t0 = time.perf_counter()
    result = capture_code(cmd)
    seconds = time.perf_counter() - t0
    if result.exit_status != 0:
        raise common.BenchError(f"{' '.join(cmd)} under capture: status {result.exit_status}")
    if result.stats["revisions"] != n:
        raise common.BenchError(f"captured {result.stats['revisions']} revisions, not {n}")
    return seconds, result.stats


def run() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--functions", type=int, default=5000, help="functions compiled per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (best kept)")
    args = ap.parse_args()
    exe = build()
    n = args.functions
    workloads = [
        ("mprotect", "0", "0"),
        ("rwx", "1", "0"),
        ("rwx, loop 2,000", "1", "2000"),
        ("rwx, loop 20,000", "1", "20000"),
    ]
    capture_code([exe, "1", "0", "0", "0"])  # compile/load the capture loop once
    rows = []
    for name, mode, loop in workloads:
        base = [exe, str(n), mode, loop]
        t_plain = min(plain([*base, "0"]) for _ in range(args.repeat))
        t_shim = min(plain([*base, "1"]) for _ in range(args.repeat))
        best = min((captured([*base, "0"], n) for _ in range(args.repeat)), key=lambda r: r[0])
        t_hw, stats = best
        faults = stats["exec_faults"] + stats["write_faults"]
        per_shim = (t_shim - t_plain) / n * 1e6
        per_hw = (t_hw - t_plain) / n * 1e6
        rows.append((
            name,
            f"{t_plain * 1e3:,.1f}",
            f"{per_shim:,.1f}",
            f"{per_hw:,.1f}",
            f"{per_hw / per_shim:,.1f}x" if per_shim > 0 else "-",
            f"{per_hw / THESIS_US:,.0f}x",
            f"{stats['fault_ns'] / max(faults, 1) / 1e3:,.1f}",
            f"{(t_shim / t_plain - 1) * 100:,.0f}%",
            f"{(t_hw / t_plain - 1) * 100:,.0f}%",
        ))  # fmt: skip
    common.print_table(
        f"Code capture, {n:,} functions compiled and run (best of {args.repeat}); "
        f"FlowJIT: {THESIS_US} µs per revision, worst slowdown {THESIS_SLOWDOWN}%",
        (
            "workload", "plain ms", "shim µs/rev", "hwtrace µs/rev", "vs shim",
            "vs FlowJIT", "hwtrace µs/fault", "shim slowdown", "hwtrace slowdown",
        ),
        rows,
        width=160,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(common.bench_main("bench_jitcapture", run, interrupted="nothing left running"))
