"""Instruction listings: ``hwtrace script`` against ``perf script --itrace=i0ns``.

Both print one line per instruction of a perf.data's Intel PT
(``--ns -F comm,tid,time,ip,sym,symoff,dso``, the line hwtrace prints by
default).  The inputs are perf.data files hwtrace writes around a raw trace
(:func:`hwtrace.perf.wrap.wrap_raw_trace`: the ``intel_pt`` event, COMM,
MMAP2 of the program, the trace as AUXTRACE), which perf reads as it reads
``perf record -e intel_pt//u``'s:

* ``flow``: ``bench_flow.py``'s trace (122 M instructions of a real
  compiled program run under an emulator; MTC timing, PSB+ every 4 KiB);
* ``syscalls-2k``: ``bench_decode.py``'s event-dense encoding of the same
  path (tracing off every ~2,000 instructions, TSC/MTC);
* ``demo``: ``hwtrace record`` of ``examples/demo`` (the software backend,
  as on any machine), its AUX trace repeated to a few million
  instructions (``bench_perf_memory.py``'s way).

Each command runs as a whole process, best of ``--repeat``, with its output
to /dev/null (what the tool itself costs) and, once, into a pipe whose
reader counts the lines (what a consumer sees; both tools must list the
same number).  Peak resident memory is GNU time's.

    python bench/bench_script.py [--repeat N] [--only NAME] [--no-pipe]
        [--demo-copies N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench_decode
import bench_flow
import common

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]
PERF_FIELDS = ["--itrace=i0ns", "--ns", "-F", "comm,tid,time,ip,sym,symoff,dso"]


def wrapped(name: str, trace: Path, elf: Path, timing: dict) -> Path:
    """``trace`` as a perf.data (kept in bench/out beside the trace)."""
    from hwtrace.perf.wrap import wrap_raw_trace
    from hwtrace.pt.config import PtConfig

    out = OUT / f"script-{name}-{trace.stem}.data"
    if not out.exists() or out.stat().st_mtime < trace.stat().st_mtime:
        tmp = out.with_suffix(".tmp")
        wrap_raw_trace(trace, tmp, elf=[(elf, None)], config=PtConfig(**timing))
        tmp.replace(out)
    return out


def demo_recording(directory: Path, copies: int) -> Path:
    """``hwtrace record`` of the demo, its trace repeated ``copies`` times."""
    import bench_perf_memory

    from hwtrace.perf.data import read_perf_data

    demo = bench_perf_memory.record_demo(directory)
    out = directory / f"demo-x{copies}.data"
    bench_perf_memory.repeat_aux(read_perf_data(demo), out, copies, 1 << 16)
    return out


def best_devnull(cmd: list[str], repeat: int) -> tuple[float, int]:
    """Best wall seconds and the largest peak RSS of ``cmd`` with its output
    to /dev/null."""
    best, peak = float("inf"), 0
    for _ in range(repeat):
        seconds, rss, status = common.run_process(cmd)
        if status != 0:
            raise common.BenchError(f"{' '.join(cmd)}: exit {status}")
        best, peak = min(best, seconds), max(peak, rss)
    return best, peak


def piped(cmd: list[str]) -> tuple[float, int]:
    """Wall seconds and lines of ``cmd`` read through a pipe."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    lines = 0
    while chunk := proc.stdout.read(1 << 20):
        lines += chunk.count(b"\n")
    if proc.wait() != 0:
        raise common.BenchError(f"{' '.join(cmd)}: exit {proc.returncode}")
    return time.perf_counter() - t0, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, metavar="N")
    p.add_argument("--only", help="only the workloads whose name contains this")
    p.add_argument("--no-pipe", action="store_true", help="skip the runs through a pipe")
    p.add_argument("--demo-copies", type=int, default=2000, metavar="N")
    a = p.parse_args(argv)
    if shutil.which("perf") is None:
        raise common.BenchError("perf is not installed (apt-get install linux-perf)")
    workload = bench_flow.prepare(False)
    timing = workload.meta()["config"]
    inputs: list[tuple[str, Path]] = [("flow", wrapped("flow", workload.trace, workload.elf,
                                                       timing))]  # fmt: skip
    shape = next(s for s in bench_decode.SHAPES if s.name == "syscalls-2k")
    trace, _ = bench_decode.make_trace(shape, workload, 40_000_000)
    inputs.append((shape.name, wrapped(shape.name, trace, workload.elf, timing)))
    scratch = Path(tempfile.mkdtemp(prefix="hwtrace-script-"))
    try:
        inputs.append(("demo", demo_recording(scratch, a.demo_copies)))
        if a.only:
            inputs = [i for i in inputs if a.only in i[0]]
        # A first run of each fills numba's caches and the native library,
        # so the timed runs load, not compile (as a user's second run).
        for _, path in inputs:
            subprocess.run([*HWTRACE, "script", "-i", str(path)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        rows = []
        for name, path in inputs:
            perf = ["perf", "script", "-i", str(path), *PERF_FIELDS]
            mine = [*HWTRACE, "script", "-i", str(path)]
            print(f"{name}: {path.stat().st_size:,} bytes", flush=True)
            perf_s, perf_rss = best_devnull(perf, 1)
            mine_s, mine_rss = best_devnull(mine, a.repeat)
            blocks_s, blocks_rss = best_devnull([*mine, "--blocks"], a.repeat)
            json_s, json_rss = best_devnull([*mine, "--json"], a.repeat)
            if a.no_pipe:
                _, lines = piped(mine)
                perf_pipe = mine_pipe = float("nan")
                perf_lines = lines
            else:
                perf_pipe, perf_lines = piped(perf)
                mine_pipe, lines = piped(mine)
            if perf_lines != lines:
                # perf's decoder and libipt's (whose counts hwtrace's equal,
                # bench_decode.py) differ on some synchronous disables.
                print(f"  perf lists {perf_lines:,} lines, hwtrace {lines:,}")
            perf_rate = perf_lines / perf_s
            for tool, count, s, rss, pipe_s in (
                ("perf script", perf_lines, perf_s, perf_rss, perf_pipe),
                ("hwtrace script", lines, mine_s, mine_rss, mine_pipe),
            ):
                rows.append((name, tool, f"{count:,}", f"{s:.2f}", f"{count / s / 1e6:.2f}",
                             f"{count / s / perf_rate:.1f}", f"{pipe_s:.2f}",
                             f"{rss / 2**20:.0f}"))  # fmt: skip
            rows.append((name, "hwtrace script --blocks", "", f"{blocks_s:.2f}", "", "", "",
                         f"{blocks_rss / 2**20:.0f}"))  # fmt: skip
            rows.append((name, "hwtrace script --json", f"{lines:,}", f"{json_s:.2f}",
                         f"{lines / json_s / 1e6:.2f}", f"{lines / json_s / perf_rate:.1f}", "",
                         f"{json_rss / 2**20:.0f}"))  # fmt: skip
        common.print_table(
            "Instruction listings (output to /dev/null; piped: read by a line counter)",
            ("input", "command", "lines", "seconds", "M lines/s", "x perf lines/s", "piped s",
             "peak RSS MB"),
            rows,
            width=120,
        )  # fmt: skip
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(common.bench_main("bench_script", main, interrupted="inputs removed"))
