"""``hwtrace decode`` to Parquet beside decoding with the results kept.

On the inputs of ``bench_script.py`` (``flow``: ``bench_flow.py``'s trace
of 122 M instructions; ``syscalls-2k``: the event-dense encoding of the
same path), each in the same run:

* ``kept``: the library decoder with every block kept
  (``decode_trace(keep_blocks=True)``, as ``bench_flow.py`` times it), in
  this process, best of ``--repeat`` after a warm-up; and its first run
  in a fresh process (as ``bench_decode.py`` times it), what a
  ``hwtrace decode`` process's reported time compares with (noted beside
  it);
* ``perf kept``: :func:`hwtrace.session.perfflow.decode_perf` of the
  perf.data (the whole flow kept; its perf times, threads and durations
  are made on first use), and ``perf kept, attributed``: with those
  columns asked for;
* ``decode``: ``hwtrace decode -i X.data -o DIR`` as a whole process
  (blocks, Arrow-readable, zstd), best of ``--repeat``: its wall time, the
  decode time it reports, peak RSS and the size of what it wrote;
* ``decode --compression lz4``: the decode time it reports and the
  blocks' size with LZ4 pages instead of zstd's;
* ``decode (Arrow)``: the same through Arrow's Parquet writer (the writer
  hwtrace used before its own), in this process.

The ratios are instructions per second against ``kept``.

    python bench/bench_parquet.py [--repeat N] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import bench_decode
import bench_flow
import bench_script
import common

HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]


def _kept(workload: bench_flow.Workload, trace: Path, repeat: int) -> tuple[float, int]:
    from hwtrace.pt.decode import decode_trace

    got = bench_flow.time_hwtrace(decode_trace, workload, repeat, 1, True, trace=trace)
    return got["best_seconds"], got["instructions"]


def _perf_kept(data: Path, repeat: int) -> tuple[float, float]:
    """Best seconds of decode_perf, and of decode_perf with each queue's
    perf times, threads, processes and durations asked for."""
    from hwtrace.session import PerfSession
    from hwtrace.session.perfflow import decode_perf

    s = PerfSession.open(str(data))
    best = attributed = float("inf")
    for _ in range(repeat + 1):
        t0 = time.perf_counter()
        flow = decode_perf(s.data, s.locator, kernel=s.kernel, sideband=s.sideband)
        t1 = time.perf_counter()
        for q in flow.queues:
            _ = q.block_ns, q.block_tid, q.block_pid, q.block_duration
        t2 = time.perf_counter()
        best, attributed = min(best, t1 - t0), min(attributed, t2 - t0)
        del flow
    return best, attributed


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*.parquet"))


def _decode(data: Path, scratch: Path, repeat: int, *extra: str) -> tuple[float, float, int, int]:
    """Best wall and reported decode seconds, peak RSS, bytes written
    (``extra``: more options)."""
    best, reported, peak, size = float("inf"), float("inf"), 0, 0
    for i in range(repeat + 1):
        out = scratch / f"decode-{i}"
        seconds, rss, status = common.run_process(
            [*HWTRACE, "decode", "-i", str(data), "-o", str(out), "--no-progress", *extra]
        )
        if status != 0:
            raise common.BenchError(f"hwtrace decode {data}: exit {status}")
        meta = json.loads((out / "_meta.json").read_text())
        size = _size(out / "blocks")
        shutil.rmtree(out)
        if i == 0:
            continue  # (fills numba's caches on a first run)
        best, peak = min(best, seconds), max(peak, rss)
        reported = min(reported, float(meta["decode_seconds"]))
    return best, reported, peak, size


def _decode_arrow(data: Path, scratch: Path) -> tuple[float, int]:
    """``write_dataset`` with Arrow's Parquet writer: seconds, bytes."""
    import hwtrace.export.parquet as P
    from hwtrace.session import PerfSession

    s = PerfSession.open(str(data))
    out = scratch / "arrow"
    saved = P.column_specs
    P.column_specs = lambda *a, **k: None  # type: ignore[assignment]
    try:
        t0 = time.perf_counter()
        P.write_dataset(s, out)
        seconds = time.perf_counter() - t0
    finally:
        P.column_specs = saved
    size = _size(out / "blocks")
    shutil.rmtree(out)
    return seconds, size


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=2, metavar="N")
    p.add_argument("--only", help="only the workloads whose name contains this")
    a = p.parse_args(argv)
    workload = bench_flow.prepare(False)
    timing = workload.meta()["config"]
    inputs = [("flow", workload.trace)]
    shape = next(s for s in bench_decode.SHAPES if s.name == "syscalls-2k")
    trace, _ = bench_decode.make_trace(shape, workload, 40_000_000)
    inputs.append((shape.name, trace))
    if a.only:
        inputs = [i for i in inputs if a.only in i[0]]
    scratch = Path(tempfile.mkdtemp(prefix="hwtrace-parquet-", dir=bench_script.OUT))
    rows = []
    try:
        for name, raw in inputs:
            data = bench_script.wrapped(name, raw, workload.elf, timing)
            print(f"{name}: {raw.stat().st_size:,} bytes of trace", flush=True)
            kept_s, insns = _kept(workload, raw, a.repeat)
            first_s = min(bench_decode.hwtrace_first_run(raw, workload.elf, timing, True, 1)["seconds"]
                          for _ in range(a.repeat))  # fmt: skip
            perf_s, perf_attributed_s = _perf_kept(data, a.repeat)
            wall, reported, rss, size = _decode(data, scratch, a.repeat)
            _, lz4_reported, _, lz4_size = _decode(data, scratch, a.repeat, "--compression", "lz4")
            arrow_s, arrow_size = _decode_arrow(data, scratch)
            for what, s, extra in (
                ("kept (library)", kept_s, ""),
                ("kept, first run in a process", first_s, ""),
                ("perf kept (decode_perf)", perf_s, ""),
                ("perf kept, attributed", perf_attributed_s, ""),
                ("hwtrace decode, process", wall, f"{rss / 2**20:.0f} MB RSS, {size / 1e6:.1f} MB"),
                (
                    "hwtrace decode, reported",
                    reported,
                    f"{first_s / reported:.2f} x kept first run",
                ),
                (
                    "hwtrace decode --compression lz4, reported",
                    lz4_reported,
                    f"{first_s / lz4_reported:.2f} x kept first run, {lz4_size / 1e6:.1f} MB",
                ),
                ("decode with Arrow's writer", arrow_s, f"{arrow_size / 1e6:.1f} MB"),
            ):
                rows.append((name, what, f"{s:.2f}", f"{insns / s / 1e6:.1f}",
                             f"{kept_s / s:.2f}", extra))  # fmt: skip
        common.print_table(
            "Decoding to Parquet beside decoding with results kept (x kept: rate against kept)",
            ("input", "what", "seconds", "M insn/s", "x kept", "notes"),
            rows,
            width=120,
        )  # fmt: skip
        return 0
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(common.bench_main("bench_parquet", main, interrupted="inputs removed"))
