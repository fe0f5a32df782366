"""Peak memory of ``hwtrace script``, ``report`` and ``filter`` against input size.

The perf.data commands read their input in bounded pieces: the file is
memory-mapped, each AUX queue is decoded a window at a time and each batch
of decoded blocks is formatted (``script``) or aggregated (``report``) and
dropped.  So peak resident memory should stay flat while the input grows.

The inputs: ``hwtrace record`` of ``examples/demo/demo.c`` (the software
backend, as on any machine), then perf.data files written with
:class:`hwtrace.perf.writer.PerfDataWriter` whose AUX area repeats that
real trace ``N`` times (the sideband, attrs and features copied from the
recording; the trace split into AUXTRACE records of ``--split`` bytes, cut
anywhere, as perf cuts its AUX buffer).  Each command runs under
``/usr/bin/time -f %M`` (peak RSS, KiB); its output is counted, not kept.

``hwtrace filter`` reads a perf.data a range of records at a time; its
inputs are tracepoint recordings written as the filter tests write them
(tests/filter/test_filter_perf_chunks.py: two formats in TRACING_DATA, sideband,
times out of order across rounds), ``--samples`` of them.

    python bench/bench_perf_memory.py [--copies 200,2000] [--split BYTES]
        [--samples 400000,1600000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import importlib.util

from common import REPO, print_table

from hwtrace.perf.data import PerfData, read_perf_data
from hwtrace.perf.features import Feature
from hwtrace.perf.writer import PerfDataWriter

HWTRACE = [sys.executable, "-m", "hwtrace.cli.main"]
TIME = "/usr/bin/time"


def record_demo(d: Path, n: int = 64) -> Path:
    """``hwtrace record`` of the demo's checksum(n) and digest (software backend)."""
    exe = d / "demo"
    subprocess.run(["gcc", "-O2", "-o", exe, REPO / "examples/demo/demo.c"], check=True)
    out = d / "demo.data"
    subprocess.run(
        [*HWTRACE, "record", "-o", out, "-f", "checksum", "-f", "digest", "--", exe, str(n)],
        check=True,
        capture_output=True,
    )
    return out


def repeat_aux(src: PerfData, out: Path, copies: int, split: int = 0) -> int:
    """Write ``out``: ``src`` with each AUX queue's trace repeated ``copies``
    times, in AUXTRACE records of ``split`` bytes (0: one record per copy).
    Every other record, the attrs and the features are copied.  Returns the
    trace bytes written."""
    r = src.records
    aux = {a.data_offset - 48: a for a in src.auxtrace()}
    w = PerfDataWriter(out)
    for ea in src.attrs:
        w.add_attr(ea.attr, list(ea.ids), ea.name)
    pt = src.intel_pt
    if pt is not None:
        w.pmu_mappings["intel_pt"] = pt.pmu_type
    skip = {int(Feature.AUXTRACE), int(Feature.EVENT_DESC), int(Feature.PMU_MAPPINGS)}
    for feat, raw in src.raw_features.items():
        if feat not in skip:
            w.set_feature(feat, raw)
    written = 0
    for i in range(len(src)):
        off = int(r["offset"][i])
        a = aux.get(off)
        if a is None:
            size = int(r["size"][i]) + int(r["payload"][i])
            w.add_bytes(bytes(src.buf[off : off + size]))
            continue
        trace = bytes(a.data)
        whole = trace * copies
        step = split or len(trace)
        for lo in range(0, len(whole), step):
            w.add_auxtrace(
                whole[lo : lo + step], cpu=a.cpu, tid=a.tid, idx=a.idx, reference=a.reference
            )
        written += len(whole)
    w.close()
    return written


def peak_rss(args: list[str], ok: tuple[int, ...] = (0,)) -> tuple[int, float, int]:
    """(peak RSS in KiB, seconds, output bytes) of one command (exit status
    in ``ok``); its output is counted as it comes, never kept."""
    with tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen([TIME, "-f", "%M", *args], stdout=subprocess.PIPE, stderr=err)
        assert proc.stdout is not None
        nout = 0
        while chunk := proc.stdout.read(1 << 20):
            nout += len(chunk)
        rc = proc.wait()
        seconds = time.perf_counter() - t0
        err.seek(0)
        text = err.read().decode(errors="replace").strip().splitlines()
    if rc not in ok:
        raise SystemExit(f"{' '.join(map(str, args))} failed: {' '.join(text[-3:])}")
    return int(text[-1]), seconds, nout


def tracepoint_recording(path: Path, samples: int) -> None:
    """A perf.data of ``samples`` tracepoint samples, written by the filter
    tests' writer (loaded by path: tests/ is not a package)."""
    src = REPO / "tests" / "filter" / "test_filter_perf_chunks.py"
    spec = importlib.util.spec_from_file_location("filter_chunks_writer", src)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._write(path, samples, 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", default="200,2000", help="trace repetitions, comma-separated")
    p.add_argument("--split", type=int, default=1 << 16, help="AUXTRACE record size (bytes)")
    p.add_argument(
        "--samples", default="400000,1600000", help="tracepoint samples for filter (0: skip)"
    )
    p.add_argument("--keep", metavar="DIR", help="keep the perf.data files in DIR")
    a = p.parse_args()
    if shutil.which("gcc") is None or not Path(TIME).exists():
        raise SystemExit("needs gcc and /usr/bin/time")
    d = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="hwtrace-mem-"))
    d.mkdir(parents=True, exist_ok=True)
    try:
        demo = record_demo(d)
        src = read_perf_data(demo)
        # Once each first, so numba's caches are warm: a compilation's own
        # memory is not the command's.
        for cmd in (["script"], ["script", "--blocks"], ["report"]):
            peak_rss([*HWTRACE, *cmd, "-i", str(demo)])
        rows = []
        for copies in (int(c) for c in a.copies.split(",")):
            path = d / f"demo-x{copies}.data"
            trace = repeat_aux(src, path, copies, a.split)
            for cmd in (["script"], ["script", "--blocks"], ["report"]):
                rss, seconds, nout = peak_rss([*HWTRACE, *cmd, "-i", str(path)])
                rows.append(
                    (" ".join(cmd), f"{copies:,}", f"{trace / 2**20:,.1f}",
                     f"{nout / 2**20:,.0f}", f"{rss / 1024:,.0f}", f"{seconds:,.1f}")
                )  # fmt: skip
        print_table(
            "hwtrace script/report: peak RSS against input size",
            ("command", "copies", "trace MiB", "output MiB", "peak RSS MiB", "seconds"),
            rows,
            width=100,
        )
        rows = []
        # The recordings hold records too short for their format (damage the
        # filter reports, exit status 1) as the tests' do.
        filter_ok = (0, 1)
        sizes = [int(c) for c in a.samples.split(",") if int(c)]
        if sizes:
            small = d / "tracepoints-warm.data"
            tracepoint_recording(small, 1000)
            for out in ([], ["-o", str(d / "out.data")], ["--count"]):
                peak_rss([*HWTRACE, "filter", "id > 0", str(small), *out], filter_ok)
        for n in sizes:
            path = d / f"tracepoints-{n}.data"
            tracepoint_recording(path, n)
            size = path.stat().st_size
            for out in ([], ["-o", str(d / "out.data")], ["--count"]):
                rss, seconds, nout = peak_rss(
                    [*HWTRACE, "filter", 'prev_state != 0 || text == "m1*"', str(path), *out],
                    filter_ok,
                )
                rows.append(
                    (" ".join(["filter", *out[:1]]), f"{n:,}", f"{size / 2**20:,.0f}",
                     f"{nout / 2**20:,.0f}", f"{rss / 1024:,.0f}", f"{seconds:,.1f}")
                )  # fmt: skip
        if rows:
            print_table(
                "hwtrace filter: peak RSS against input size",
                ("command", "samples", "input MiB", "stdout MiB", "peak RSS MiB", "seconds"),
                rows,
                width=100,
            )
    finally:
        if not a.keep:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
