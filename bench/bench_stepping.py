"""Single-stepping rate: hwtrace's software recorder against a minimal C loop.

Both step the same workload, ``hot()`` of ``bench/step_workload.c`` (a loop
of shifts, xors and branches, no calls), compiled with ``gcc -O2`` as a
non-PIE executable in this run, from the function's entry to its return:

* ``bench/step_loop.c`` (``gcc -O2``): fork, PTRACE_TRACEME, exec, an int3
  at ``hot``, then PTRACE_SINGLESTEP + waitpid + PTRACE_PEEKUSER(RIP) until
  RIP leaves the function; it times its loop with CLOCK_MONOTONIC;
* hwtrace's stepper (:func:`hwtrace.record.step_process`), which also logs
  every step's address, time and registers (all of ``user_regs_struct``, or
  rip/rsp/eflags); its stepping time is the span of its own stepping clock
  (TSC, converted to ns with the calibration it records);
* and, for information, turning that log into Intel PT
  (:func:`hwtrace.record.encode_log`).

Prints instructions stepped per second, best of N runs, and the ratio to the
C loop (the target: hwtrace within 2x).  Both loops are bound by the kernel's
ptrace round trip, which on a virtual machine is tens of microseconds.

    python bench/bench_stepping.py [--iterations N] [--repeat N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out" / "stepping"
sys.path.insert(0, str(REPO / "src"))

from hwtrace.image import read_elf  # noqa: E402
from hwtrace.record import encode_log, step_process  # noqa: E402


def compile_all(cc: str) -> tuple[Path, Path]:
    OUT.mkdir(parents=True, exist_ok=True)
    workload, loop = OUT / "step_workload", OUT / "step_loop"
    for src, exe, extra in (
        (HERE / "step_workload.c", workload, ["-fno-pie", "-no-pie"]),
        (HERE / "step_loop.c", loop, []),
    ):
        cmd = [cc, "-O2", *extra, "-o", str(exe), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return workload, loop


def run_c(loop: Path, workload: Path, start: int, end: int, iterations: int) -> tuple[int, float]:
    cmd = [str(loop), hex(start), hex(end), str(workload), str(iterations)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1]) / 1e9


def run_hwtrace(workload: Path, iterations: int, registers: str):
    log = step_process([str(workload), str(iterations)], functions=["hot"], registers=registers)
    (c0, n0), (c1, n1) = log.clock_pairs[0], log.clock_pairs[-1]
    ns_per_tick = (n1 - n0) / (c1 - c0)
    seconds = (int(log.times[-1]) - int(log.times[0])) * ns_per_tick / 1e9
    # times[-1] is read before the last instruction runs: n - 1 steps timed.
    return log, log.ips.shape[0], log.ips.shape[0] - 1, seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=4000, help="loop iterations of hot()")
    ap.add_argument("--repeat", type=int, default=2, help="runs per stepper (best is shown)")
    args = ap.parse_args()
    cc = shutil.which("gcc")
    if cc is None:
        sys.exit("gcc is needed to build the workload and the C loop")
    workload, loop = compile_all(cc)
    hot = next(s for s in read_elf(workload).symbols.functions if s[2] == "hot")
    start, end = hot[0], hot[0] + hot[1]

    best: dict[str, tuple[int, float]] = {}  # name -> (steps timed, seconds)
    counts: dict[str, int] = {}  # name -> instructions stepped

    def keep(name: str, insns: int, steps: int, seconds: float) -> None:
        counts[name] = insns
        if name not in best or steps / seconds > best[name][0] / best[name][1]:
            best[name] = (steps, seconds)

    step_process([str(workload), "1"], functions=["hot"])  # numba warm-up
    log = None
    for _ in range(args.repeat):
        steps, seconds = run_c(loop, workload, start, end, args.iterations)
        keep("C loop (gcc -O2)", steps, steps, seconds)
        for registers in ("all", "basic"):
            log, insns, steps, seconds = run_hwtrace(workload, args.iterations, registers)
            keep(f"hwtrace stepper ({registers} registers)", insns, steps, seconds)
    same = "yes" if len(set(counts.values())) == 1 else f"no: {counts}"

    t = time.perf_counter()
    enc, insns, _ = encode_log(log, cyc=True)
    encode_s = time.perf_counter() - t

    base = best["C loop (gcc -O2)"][0] / best["C loop (gcc -O2)"][1]
    rows = []
    for name, (steps, seconds) in best.items():
        rate = steps / seconds
        rows.append(
            (name, f"{counts[name]:,}", f"{seconds:.3f}", f"{rate:,.0f}", f"{base / rate:.2f}x")
        )
    common.print_table(
        f"Single-stepping hot() of step_workload.c ({args.iterations} iterations), "
        f"best of {args.repeat}; same step count: {same}",
        ("stepper", "instructions", "seconds", "insns/s", "time vs C"),
        rows,
    )
    print(
        f"Encoding the last log as Intel PT (encode_log, CYC on): {insns.shape[0]:,} "
        f"instructions -> {len(enc.data):,} bytes in {encode_s:.3f} s "
        f"({insns.shape[0] / encode_s:,.0f} insns/s)"
    )


if __name__ == "__main__":
    main()
