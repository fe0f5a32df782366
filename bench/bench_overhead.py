"""Recording overhead: each workload alone and under every tracer, in one run.

Workloads (``peers.py``, sources in ``bench/overhead_workloads/``): C
microbenchmarks (a branchy Collatz kernel and sort, a switch-dispatch
bytecode interpreter, fib/Ackermann recursion, a C++ STL/exceptions
program) and Debian programs (``xz -9``, ``gzip -9`` on generated text,
``sqlite3 :memory:`` on a query script, ``python3`` on a pure-Python
script), each about 0.3-1 s natively.  Runners: native, valgrind's lackey
(superblock trace) and callgrind, Frida's Stalker (block coverage), and
``extra_runners``: hwtrace's own backends, name -> callable(workload)
returning one run's seconds or a :class:`peers.RunResult`.  Prints best
wall seconds and the slowdown against native, with a geometric-mean row
over the workloads each runner finished (timeouts left out); writes bench/out/overhead.json.

    python bench/bench_overhead.py [--quick] [--only NAME ...] [--repeat N]
                                   [--runners native,lackey,...] [--timeout S]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import common
import peers
from peers import RunResult, Workload

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"

ExtraRunner = Callable[[Workload], "float | RunResult"]

# hwtrace's backends are plugged in here: name -> callable(workload) that runs
# the workload once and returns its wall seconds, or a RunResult (e.g.
# ``peers.under_command(["hwtrace", "record", "--backend", "patch", "-o", F,
# "--"], w, repeat=1)`` checks the output too).  Each is called --repeat
# times and the best kept; one that raises subprocess.TimeoutExpired (the
# step backend beyond its cap) is reported as a timeout.
extra_runners: dict[str, ExtraRunner] = {}


def _hwtrace(backend: str, *options: str) -> ExtraRunner:
    """``hwtrace record --backend BACKEND`` of the whole program: wall time
    of the command, set-up (the sweep and patching of every module) included."""

    def run(w: Workload) -> RunResult:
        with tempfile.TemporaryDirectory(dir=OUT) as tmp:
            prefix = [str(Path(sys.executable).with_name("hwtrace")), "record", "--backend", backend, "-N",
                      "-o", f"{tmp}/perf.data", *options, "--"]  # fmt: skip
            return peers.under_command(prefix, w, repeat=1, timeout=STEP_CAP)

    return run


STEP_CAP = 300.0  # seconds: stepping runs ~40 k instructions a second here
extra_runners["patch"] = _hwtrace("patch")
# The step backend steps chosen code: main with everything it calls.
extra_runners["step"] = _hwtrace("step", "--call", "main")


def run_extra(fn: ExtraRunner, w: Workload, repeat: int) -> RunResult:
    runs: list[float] = []
    matched: bool | None = None
    for _ in range(repeat):
        try:
            r = fn(w)
        except subprocess.TimeoutExpired as e:
            return RunResult(min(runs) if runs else None, matched, runs, f"timeout: {e}")
        if isinstance(r, RunResult):
            if r.seconds is None:
                return r
            runs.append(r.seconds)
            matched = r.matched if matched is None else bool(matched and r.matched)
        else:
            runs.append(float(r))
    return RunResult(min(runs), matched, runs)


PEERS: dict[str, Callable[..., RunResult]] = {
    "native": peers.native,
    "lackey": lambda w, **kw: peers.valgrind(w, "lackey", **kw),
    "callgrind": lambda w, **kw: peers.valgrind(w, "callgrind", **kw),
    "nulgrind": lambda w, **kw: peers.valgrind(w, "none", **kw),
    "stalker": peers.frida_stalker,
}
DEFAULT_RUNNERS = ("native", "lackey", "callgrind", "stalker")


def cell(r: RunResult, base: RunResult) -> str:
    if r.seconds is None:
        return r.note.split(":")[0] if r.note else "-"
    text = f"{r.seconds:.2f}"
    if r.note.startswith("timeout"):
        text = f">{r.seconds:.0f}"
    if base.seconds and r is not base:
        text += f" ({r.seconds / base.seconds:,.1f}x)"
    if r.matched is False:
        text += " WRONG"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="workloads at 1/4 size, one run each")
    ap.add_argument("--only", action="append", default=[], help="workloads whose name has NAME")
    ap.add_argument("--repeat", type=int, help="runs per runner (best kept; default 3, quick 1)")
    ap.add_argument("--runners",
                    help=f"comma-separated, of {', '.join(PEERS)} and the extra runners "
                    f"(default: {','.join(DEFAULT_RUNNERS)} and every extra runner)")  # fmt: skip
    ap.add_argument(
        "--timeout", type=float, help="cap on one run, seconds (default 600, quick 120)"
    )
    args = ap.parse_args(argv)
    repeat = args.repeat or (1 if args.quick else 3)
    timeout = args.timeout or (120 if args.quick else 600)
    scale = 0.25 if args.quick else 1.0
    names = [n for n in (args.runners or ",".join(DEFAULT_RUNNERS)).split(",") if n]
    unknown = [n for n in names if n not in PEERS and n not in extra_runners]
    if unknown:
        ap.error(f"unknown runners: {', '.join(unknown)}")
    if "native" not in names:
        names.insert(0, "native")
    if args.runners is None:
        names += [n for n in extra_runners if n not in names]

    workloads = peers.setup_workloads(scale, args.only)
    results: dict[str, dict[str, RunResult]] = {}
    for w in workloads:
        results[w.name] = {}
        for name in names:
            t0 = time.perf_counter()
            if name in extra_runners:
                r = run_extra(extra_runners[name], w, repeat)
            else:
                r = PEERS[name](w, repeat=repeat, timeout=timeout)
            results[w.name][name] = r
            print(f"{w.name:10} {name:10} {time.perf_counter() - t0:7.1f} s  "
                  f"{cell(r, results[w.name]['native'])}  {r.note}", file=sys.stderr)  # fmt: skip

    rows = []
    for w in workloads:
        base = results[w.name]["native"]
        rows.append((w.name, *(cell(results[w.name][n], base) for n in names)))
    geo = ["geomean"]
    for n in names:
        ratios = [
            results[w.name][n].seconds / results[w.name]["native"].seconds
            for w in workloads
            if results[w.name][n].seconds and not results[w.name][n].note.startswith("timeout")
        ]
        geo.append(f"{math.exp(sum(map(math.log, ratios)) / len(ratios)):,.1f}x" if ratios else "-")
    geo[1] = "1.0x"
    rows.append(tuple(geo))
    common.print_table(
        f"Wall seconds, best of {repeat} (slowdown vs native){', quick sizes' if args.quick else ''}",
        ("workload", *names),
        rows,
        width=160,
    )
    for w in workloads:
        for n in names:
            r = results[w.name][n]
            if r.note and (not r.available or r.matched is False or r.seconds is None):
                print(f"{w.name} / {n}: {r.note}")

    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / ("overhead-quick.json" if args.quick else "overhead.json")
    path.write_text(json.dumps({
        "cpu": common.cpu_model(),
        "repeat": repeat,
        "scale": scale,
        "timeout_s": timeout,
        "workloads": [
            {**asdict(w), "argv": list(w.argv), "stdin": str(w.stdin) if w.stdin else None,
             "results": {n: asdict(results[w.name][n]) for n in names}}
            for w in workloads
        ],
    }, indent=1))  # fmt: skip
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
