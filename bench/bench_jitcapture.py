"""Capture cost: hwtrace's code capture agent against FlowJIT's figures.

A JIT-like workload (``bench/jit_workload.c``, ``gcc -O2``) compiles N small
functions at run time and calls each; it runs three ways in this run:

* plain: nothing captures anything (the baseline);
* in-process shim (the C peer): the workload captures its own pages with a
  SIGSEGV handler, FlowJIT's state machine without ptrace, the lower bound
  of any user-space capture on this kernel;
* hwtrace's two agents (:func:`hwtrace.record.jitcapture.capture_code`):
  ``ptrace`` captures every page revision from outside, stopping the
  program at each fault; ``in-process`` (root) handles the faults in the
  program itself with generated code, armed from eBPF tracepoint programs.

Workloads: a fresh page made executable with ``mprotect`` per function
(``mprotect``), one writable and executable page rewritten per function
(``rwx``), and functions doing more work (a countdown loop of LOOP
iterations, called CALLS times, as compiled code is run more than once)
for the slowdown of a JIT-heavy program.  Times are the
workload's own for its loop (start-up and the agent's installation left
out).  Reported: the cost per captured revision, ``(time - plain) / N``
(faults, snapshot, protection changes, and what the agent adds to the
system calls), and the slowdown; against
Sharma's 1.3 µs per revision (FlowJIT) (973 ns - 6.8 µs, in the kernel) and its worst
slowdown, 19.3 % (at 60K JIT executions).  Best of R runs.

    python bench/bench_jitcapture.py [--functions N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out" / "jitcapture"
sys.path.insert(0, str(REPO / "src"))

from hwtrace.record.jitagent import in_process_available  # noqa: E402
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


LOOP_NS = OUT / "loop_ns"


def _loop_seconds() -> float:
    """The workload's own time for its loop (JIT_WORKLOAD_NS), so start-up
    and the agent's installation are left out of every configuration."""
    return int(LOOP_NS.read_text()) / 1e9


def plain(cmd: list[str]) -> float:
    _, _, status = common.run_process(cmd)
    if status != 0:
        raise common.BenchError(f"{' '.join(cmd)} exited {status}")
    return _loop_seconds()


def captured(cmd: list[str], n: int, agent: str) -> tuple[float, dict[str, int]]:
    result = capture_code(cmd, agent)
    if result.exit_status != 0:
        raise common.BenchError(f"{' '.join(cmd)} under capture: status {result.exit_status}")
    if result.stats["revisions"] != n:
        got = result.stats["revisions"]
        raise common.BenchError(
            f"{agent} agent, {' '.join(cmd[1:])}: {got} revisions, not {n} ({result.stats})"
        )
    return _loop_seconds(), result.stats


def run() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--functions", type=int, default=5000, help="functions compiled per run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per configuration (best kept)")
    args = ap.parse_args()
    exe = build()
    os.environ["JIT_WORKLOAD_NS"] = str(LOOP_NS)
    n = args.functions
    workloads = [  # (name, mode, loop iterations, calls per compiled function)
        ("mprotect", "0", "0", "1"),
        ("rwx", "1", "0", "1"),
        ("rwx, loop 2,000", "1", "2000", "1"),
        ("rwx, loop 20,000", "1", "20000", "1"),
        ("mprotect, loop 2,000, 50 calls", "0", "2000", "50"),
        ("rwx, loop 2,000, 50 calls", "1", "2000", "50"),
    ]
    agents = ["ptrace"] + (["in-process"] if in_process_available() is None else [])
    for agent in agents:
        capture_code([exe, "1", "0", "0", "0"], agent)  # compile/load everything once
    rows = []
    for name, mode, loop, calls in workloads:
        base = [exe, str(n), mode, loop]
        t_plain = min(plain([*base, "0", calls]) for _ in range(args.repeat))
        t_shim = min(plain([*base, "1", calls]) for _ in range(args.repeat))
        per_shim = (t_shim - t_plain) / n * 1e6
        row = [name, f"{t_plain * 1e3:,.1f}", f"{per_shim:,.2f}"]
        slow = [f"{(t_shim / t_plain - 1) * 100:,.0f}%"]
        for agent in agents:
            runs = [captured([*base, "0", calls], n, agent) for _ in range(args.repeat)]
            t_hw, _ = min(runs, key=lambda r: r[0])
            per_hw = (t_hw - t_plain) / n * 1e6
            row += [f"{per_hw:,.2f}", f"{per_hw / THESIS_US:,.1f}x"]
            slow.append(f"{(t_hw / t_plain - 1) * 100:,.0f}%")
        rows.append(tuple(row + slow))
    heads = ["workload", "plain loop ms", "shim µs/rev"]
    for agent in agents:
        heads += [f"{agent} µs/rev", f"{agent} vs FlowJIT"]
    heads += ["shim slowdown"] + [f"{a} slowdown" for a in agents]
    common.print_table(
        f"Code capture, {n:,} functions compiled and run (best of {args.repeat}; the loop's "
        f"own time); FlowJIT: {THESIS_US} µs per revision, worst slowdown {THESIS_SLOWDOWN}%",
        tuple(heads),
        rows,
        width=200,
    )
    return 0


if __name__ == "__main__":
    sys.exit(common.bench_main("bench_jitcapture", run, interrupted="nothing left running"))
