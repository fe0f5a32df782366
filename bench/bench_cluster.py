"""Throughput of hwtrace.cluster against the single-process stream_perf, and
a per-task overhead model that predicts it for larger clusters.

The input: a software recording (``hwtrace record``, ptrace single-step) of
the test program's ``work`` loop, cached in bench/out/dist-*/perf.data.
Measured: stream_perf (one process), decode_distributed with workers=1 and
workers=2 (LocalCluster, one thread each), plus the model's terms:

* per worker: shipping/setup (a worker's first task minus a warm one);
* per task: Dask scheduling and result transfer (tiny tasks on a warm
  cluster, their decode time subtracted);
* client: stitching and attribution per MB of trace (the in-process run's
  time minus the workers' decode time);
* decode: a worker's decode rate (MB/s of trace).

Predicted throughput with W workers, T bytes, tasks of B bytes:
``time = setup + (T/B)*sched/min(W, tasks) ... `` spelled out in
:func:`predict`.  Run: ``.venv/bin/python bench/bench_cluster.py [--n N]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "record"))


def recording(n: int) -> Path:
    from test_record_software import build

    from hwtrace.cli.main import main as hwtrace_main

    out = HERE / "out" / f"dist-work{n}"
    path = out / "perf.data"
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        exe = build("pie")
        args = ["record", "-o", str(path), "-f", "work", "-f", "cmp_long", "--", str(exe),
                "work", str(n), str(out / "o")]  # fmt: skip
        assert hwtrace_main(args) == 0
    return path


def run_stream(path: Path) -> tuple[float, int]:
    from hwtrace.perf.data import read_perf_data
    from hwtrace.session.perfflow import stream_perf

    t = time.perf_counter()
    s = stream_perf(read_perf_data(path), lambda b: None)
    return time.perf_counter() - t, sum(q.n_insn for q in s.queues)


def run_dist(path: Path, **kw) -> float:
    from hwtrace.cluster import decode_distributed

    t = time.perf_counter()
    decode_distributed(str(path), lambda b: None, **kw)
    return time.perf_counter() - t


def predict(workers: int, trace: float, task: float, rate: float, setup: float,
            sched: float, stitch: float) -> float:  # fmt: skip
    """Seconds for ``trace`` bytes in tasks of ``task`` bytes on ``workers``
    workers: per-worker setup, then the tasks in waves (each task's decode
    plus its scheduling), bounded below by the client's serial stitching."""
    tasks = max(1, -(-int(trace) // int(task)))
    waves = -(-tasks // workers)
    work = setup + waves * (task / rate + sched)
    return max(work, trace * stitch + tasks * sched / 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=400, help="the work loop's size")
    ap.add_argument("--task-mb", type=float, default=1.0)
    a = ap.parse_args()
    from hwtrace.perf.data import read_perf_data
    from hwtrace.perf.intelpt import iter_queue_traces

    path = recording(a.n)
    total = sum(t.shape[0] for _, _, t in iter_queue_traces(read_perf_data(path)))
    mb = total / 1e6
    task = int(a.task_mb * 1e6)
    chunk = min(task, 1 << 20)
    run_stream(path)  # compile caches
    t1, insns = run_stream(path)
    rows = [("stream_perf (1 process)", t1)]
    t_in = run_dist(path, task_bytes=task, chunk_bytes=chunk)
    rows.append(("in-process tasks", t_in))
    for w in (1, 2):
        rows.append((f"workers={w} (incl. cluster start)", run_dist(path, workers=w,
                     task_bytes=task, chunk_bytes=chunk)))  # fmt: skip
    print(f"trace {mb:.1f} MB, {insns:,} instructions, tasks of {a.task_mb:g} MB")
    for name, t in rows:
        print(f"  {name:36s} {t:7.2f} s  {mb / t:7.2f} MB/s  {insns / t / 1e6:7.2f} Minsn/s")

    # The model's terms, measured on a warm local cluster.
    from distributed import Client, LocalCluster

    from hwtrace.cluster.decode import PieceTask, decode_piece, plan_pieces

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:  # fmt: skip
        data = read_perf_data(path)
        _, _, trace = next(iter_queue_traces(data))
        pieces = plan_pieces(trace, task, chunk)
        t = time.perf_counter()
        c.submit(
            decode_piece, PieceTask(str(path), None, 0, pieces[0], None, True), pure=False
        ).result()
        cold = time.perf_counter() - t
        t = time.perf_counter()
        c.submit(
            decode_piece, PieceTask(str(path), None, 0, pieces[0], None, True), pure=False
        ).result()
        warm = time.perf_counter() - t
        tiny = plan_pieces(trace, 1, 1)[:1]
        c.submit(
            decode_piece, PieceTask(str(path), None, 0, tiny[0], None, True), pure=False
        ).result()
        t0 = time.perf_counter()
        decode_piece(PieceTask(str(path), None, 0, tiny[0], None, True))
        local_tiny = time.perf_counter() - t0
        t = time.perf_counter()
        futs = [c.submit(decode_piece, PieceTask(str(path), None, 0, tiny[0], None, True), pure=False)
                for _ in range(50)]  # fmt: skip
        c.gather(futs)
        sched = max((time.perf_counter() - t) / 50 - local_tiny, 1e-4)
        piece_bytes = sum(e - s for s, e in pieces[0])
        t = time.perf_counter()
        decode_piece(PieceTask(str(path), None, 0, pieces[0], None, True))
        rate = piece_bytes / (time.perf_counter() - t)
    setup = max(cold - warm, 0.0)
    stitch = max(t_in - total / rate, 0.0) / total
    print(
        f"model: setup per worker {setup:.2f} s, scheduling per task {sched * 1e3:.1f} ms, "
        f"client stitching {stitch * 1e6:.3f} s/MB, decode {rate / 1e6:.2f} MB/s per worker"
    )
    big = 64e9
    for w in (8, 64, 512):
        for tb in (32e6, 256e6):
            s = predict(w, big, tb, rate, setup, sched, stitch)
            print(
                f"  predicted {w:4d} workers, 64 GB trace, {tb / 1e6:4.0f} MB tasks: "
                f"{big / s / 1e6:9.1f} MB/s"
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
