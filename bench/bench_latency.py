"""Analyses of the decoded flow against decoding alone, in one run.

On ``bench_flow.py``'s workload (122 M instructions of real compiled code),
each in a fresh process on its first run (kernels from the native library,
as after a user's first command), output dropped:

* libipt's block decoder (``pt_blk_next``, in-process best of N): the
  decoding peer;
* ``decode_trace``, results kept and only counted: decoding alone;
* latency profiles (``hwtrace.analysis.latency``): intervals between the
  entry and the exit of a function called 28 times (sparse), and of one
  called 145,600 times;
* ``funclatency`` of a recursive function called 3.2 million times (every
  call its own interval: one per 38 instructions);
* the call-path profile (instructions and time per call path, the
  folded stacks of ``report --folded``).

Every analysis must see every instruction (checked), and run at more than
half of the rate of decoding alone with results kept.

    python bench/bench_latency.py [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import bench_flow
import common

RUN = r"""
import json, sys, time
from hwtrace.image import Image
from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import decode_trace
from hwtrace.analysis.patterns import PatternSet, parse_sets
from hwtrace.analysis.latency import profile_trace
trace, elf, timing, what = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
image = Image()
image.add_elf(elf)
config = PtConfig(**timing)
t0 = time.perf_counter()
if what in ("kept", "counted"):
    n = decode_trace(trace, image, config, keep_blocks=what == "kept").n_insn
    intervals = 0
else:
    patterns = PatternSet()
    kind, _, func = what.partition(":")
    if kind == "latency":
        parse_sets(patterns, [f"enter:{func}"], [f"exit:{func}"])
    elif kind == "funclatency":
        patterns.add_marker(func, f"exit:{func}")
    res = profile_trace(trace, image, patterns, config, keep=False,
                        calls=kind == "funclatency", profile=kind == "paths")
    n = res.instructions
    intervals = int(res.totals[:, 0].sum()) if kind != "paths" else int((res.path_insns > 0).sum())
print(json.dumps({"seconds": time.perf_counter() - t0, "instructions": int(n),
                  "intervals": intervals}))
"""

CASES = [
    ("decode_trace, results kept", "kept"),
    ("decode_trace, counted", "counted"),
    ("latency enter/exit interpret (sparse)", "latency:interpret.constprop.0"),
    ("latency enter/exit hash_get", "latency:hash_get"),
    ("funclatency tree_insert (recursive)", "funclatency:tree_insert"),
    ("call-path profile", "paths"),
]


def run(trace, elf, timing: dict, what: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", RUN, str(trace), str(elf), json.dumps(timing), what],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, metavar="N")
    args = parser.parse_args(argv)
    oracle = common.load_oracle()
    workload = bench_flow.prepare(False)
    timing = workload.meta()["config"]
    expected = int(workload.meta()["instructions"])
    # Compile every analysis, then build the native library from it, so the
    # timed processes load, not compile.
    os.environ["HWTRACE_AOT_AUTOBUILD"] = "0"
    for _, what in CASES:
        run(workload.trace, workload.elf, timing, what)
    subprocess.run([sys.executable, "-m", "hwtrace.aot", "build"], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    rows = []
    base = None
    if oracle.skip_reason is None:
        sections = [(workload.elf, off, size, vaddr) for off, size, vaddr, _ in
                    bench_flow.load_segments(workload.elf)]  # fmt: skip
        blk = oracle.flow_bench(workload.trace, sections, "blk", args.repeat, timing)
        rows.append(("libipt pt_blk_next", f"{blk['best_seconds']:.3f}",
                     f"{expected / blk['best_seconds'] / 1e6:.1f}", "", ""))  # fmt: skip
    status = 0
    for label, what in CASES:
        best = min((run(workload.trace, workload.elf, timing, what) for _ in range(args.repeat)),
                   key=lambda r: r["seconds"])  # fmt: skip
        if best["instructions"] != expected:
            status = 1
            print(f"{label}: {best['instructions']:,} instructions, expected {expected:,}")
        rate = expected / best["seconds"]
        if base is None:
            base = rate
        rows.append((label, f"{best['seconds']:.3f}", f"{rate / 1e6:.1f}",
                     f"{rate / base:.2f}", f"{best['intervals']:,}" if what != "kept" else ""))  # fmt: skip
    common.print_table(
        f"Analyses on the flow benchmark ({expected:,} instructions)",
        ("", "seconds", "M insn/s", "x decode kept", "intervals / paths"),
        rows,
        width=110,
    )
    return status


if __name__ == "__main__":
    sys.exit(main())
