"""``hwtrace decode`` at scale: a real trace tiled to many GiB, decoded in
one process and on 1 and 2 local Dask workers, with peak memory, throughput
and output size, and the per-task overhead model's terms measured on it.

The input: bench_flow's cached trace (bench/out/flow-*/flow.pt, 122 million
instructions of compiled code, a PSB+ with TSC every 4 KiB) repeated from
its first PSB on.  Each copy's TSC packets are moved forward by a multiple
of 2**16 crystal clocks (TMA's CTC field width), past the previous copy's
end, so perf time keeps rising and the MTC/TMA values stay consistent.
The tiles go to a temporary file in bench/out, which is wrapped as a
perf.data (:func:`hwtrace.perf.wrap.wrap_raw_trace`) and deleted; the
perf.data and the outputs are deleted at the end unless ``--keep``.

Measured: the single-process ``hwtrace decode`` (peak RSS of the child
process, MB/s of trace, instructions/s, output size), then
:func:`hwtrace.cluster.decode_to_parquet` on 1 and 2 local Dask workers (what
``--workers`` runs: the workers write the blocks; peak RSS per worker, read
from ``/proc/self/status`` VmHWM by ``Client.run``, and of the client, and
the client's CPU time), and the model's terms:

* per task: Dask's scheduling cost (tiny summaries on a warm cluster, their
  own time subtracted);
* per worker: setup (its first task, which parses the perf.data, sideband
  and ELF, minus the same task warm);
* summary pass: a worker decoding a piece of the big input and summarising
  it, per MB;
* write pass: a worker decoding that piece again, attributing the blocks
  and writing the Parquet rows, per MB;
* client: its CPU time per MB in the run with the most workers (planning,
  numbering pieces, Dask's client and the local scheduler).

    python bench/bench_scale.py [--gib 10] [--workers 1,2] [--keep] [--no-single]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out"
sys.path.insert(0, str(HERE))

from bench_cluster import predict  # noqa: E402

PY = sys.executable


def flow_workload() -> Path:
    dirs = sorted(OUT.glob("flow-" + "?" * 16), key=lambda p: p.stat().st_mtime)
    done = [d for d in dirs if (d / "flow.pt").is_file() and (d / "flow.json").is_file()]
    if not done:
        raise SystemExit("no cached bench_flow trace: run bench/bench_flow.py once first")
    return done[-1]


def tile(src: Path, dst: Path, size: int, ctc_ratio: int) -> tuple[int, int]:
    """Write ``src``'s trace, from its first PSB, repeated to ``size`` bytes
    or more (whole copies), each copy's TSCs shifted past the previous
    copy's; returns (bytes, copies)."""
    from hwtrace.pt.kinds import Kind
    from hwtrace.pt.packets import decode_range, map_file, sync_forward

    buf = map_file(src)
    p0 = sync_forward(buf, 0)
    body = np.array(buf[p0:])
    table = decode_range(body, 0, body.shape[0])
    at = table.offset[table.kind == Kind.TSC].astype(np.int64)
    tsc = table.a[table.kind == Kind.TSC].astype(np.uint64)
    span = int(tsc.max() - tsc.min()) + (1 << 20)
    unit = ctc_ratio << 16  # TSC ticks in 2**16 crystal clocks
    step = -(-span // unit) * unit
    copies = max(1, -(-size // body.shape[0]))
    head = np.array(buf[:p0])
    with open(dst, "wb") as f:
        f.write(head.tobytes())
        for k in range(copies):
            new = tsc + np.uint64(k * step)
            for j in range(7):  # TSC[55:0], little endian, after the 0x19 byte
                body[at + 1 + j] = ((new >> np.uint64(8 * j)) & np.uint64(0xFF)).astype(np.uint8)
            f.write(body.tobytes())
    return p0 + copies * body.shape[0], copies


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def run_decode(data: Path, out: Path, extra: list[str]) -> dict:
    """``hwtrace decode`` in a child process; its time, peak RSS, summary."""
    shutil.rmtree(out, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    p = subprocess.run([PY, "-m", "hwtrace.cli.main", "decode", str(data), "-o", str(out),
                        "--no-progress", *extra], capture_output=True, text=True)  # fmt: skip
    seconds = time.perf_counter() - t
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if p.returncode:
        raise SystemExit(f"decode {extra} failed:\n{p.stderr}")
    meta = json.loads((out / "_meta.json").read_text())
    return {"seconds": seconds, "client_maxrss_mb": rss / 1024 if rss > before else None,
            "decode_seconds": meta["decode_seconds"], "instructions": meta["instructions_decoded"],
            "blocks": meta["rows"]["blocks"], "output_bytes": du(out), "stderr": p.stderr}  # fmt: skip


def _vmhwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def run_workers(data: Path, out: Path, workers: int, task_bytes: int) -> dict:
    """``decode_to_parquet`` on a local cluster of ``workers`` processes
    (the workers write the blocks, as ``hwtrace decode --workers``);
    per-worker VmHWM, the client's CPU time (its scheduler included)."""
    from distributed import Client, LocalCluster

    from hwtrace.cluster import decode_to_parquet
    from hwtrace.export.parquet import FlowParquetWriter

    shutil.rmtree(out, ignore_errors=True)
    import logging

    import dask

    from hwtrace.cluster.decode import LOCAL_CLUSTER_CONFIG

    # The local cluster as ``hwtrace decode --workers`` starts it.
    with dask.config.set(LOCAL_CLUSTER_CONFIG), \
            LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                         dashboard_address=None, silence_logs=logging.ERROR) as lc, \
            Client(lc) as c:  # fmt: skip
        address = lc.scheduler_address
        writer = FlowParquetWriter(out, {"bench": "scale"})
        peak = {"client": 0}

        def watch() -> None:
            while not stop.is_set():
                peak["client"] = max(peak["client"], _vmhwm())
                stop.wait(1)

        stop = threading.Event()
        th = threading.Thread(target=watch, daemon=True)
        th.start()
        t = time.perf_counter()
        cpu = time.process_time()
        flow, _ = decode_to_parquet(str(data), writer, cluster=address, task_bytes=task_bytes)
        for q in flow.queues:
            writer.write_gaps(q, q.gaps)
        meta = writer.close()
        seconds = time.perf_counter() - t
        client_cpu = time.process_time() - cpu
        stop.set()
        th.join()
        hwm = c.run(_vmhwm)
    return {"seconds": seconds, "client_cpu_seconds": client_cpu,
            "worker_vmhwm_mb": sorted(v / 2**20 for v in hwm.values()),
            "client_vmhwm_mb": _vmhwm() / 2**20, "blocks": meta["rows"]["blocks"],
            "instructions": writer.n_insn, "output_bytes": du(out)}  # fmt: skip


def model_terms(data: Path, total: int, single: dict | None, client_cpu: float | None,
                task_bytes: int) -> dict:  # fmt: skip
    """The model's terms on the big input (see the module doc)."""
    import tempfile

    from distributed import Client, LocalCluster

    from hwtrace.cluster.decode import PieceTask, _open_input, _plan, summarize_piece, write_piece
    from hwtrace.export.parquet import FlowParquetWriter

    t = time.perf_counter()
    plans = _plan(str(data), None, task_bytes, None)[4]
    plan_s = time.perf_counter() - t
    pieces = plans[0]
    piece = pieces[len(pieces) // 2]
    piece_bytes = piece[-1][1] - piece[0][0]
    tiny = [piece[0]]
    t = time.perf_counter()
    _open_input(str(data), None)
    setup_local = time.perf_counter() - t
    # A worker's two passes over a piece: decode and summarise; decode
    # again, attribute and write the Parquet rows.
    t = time.perf_counter()
    s = summarize_piece(PieceTask(str(data), None, 0, piece))
    summary = (time.perf_counter() - t) / piece_bytes
    with tempfile.TemporaryDirectory(dir=OUT) as d:
        w = FlowParquetWriter(Path(d) / "f", {"bench": "scale"})
        settings = {"metadata": {"bench": "scale"}, "bucket_ns": w.bucket_ns,
                    "instructions": False, "batch_rows": 1 << 17}  # fmt: skip
        fix = {"part": "q0-p0", "images": np.arange(len(s["images"])),
               "n_images": len(s["images"]), "row": 0, "gap": False, "drop_lead_ptw": True,
               "lead": [], "follow": None}  # fmt: skip
        t = time.perf_counter()
        write_piece(PieceTask(str(data), None, 0, piece), fix, str(w.root), settings)
        write = (time.perf_counter() - t) / piece_bytes
    t = time.perf_counter()
    summarize_piece(PieceTask(str(data), None, 0, tiny))
    tiny_s = time.perf_counter() - t
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as lc, Client(lc) as c:  # fmt: skip
        args = (summarize_piece, PieceTask(str(data), None, 0, tiny))
        t = time.perf_counter()
        c.submit(*args, pure=False).result()
        cold = time.perf_counter() - t
        t = time.perf_counter()
        c.submit(*args, pure=False).result()
        warm = time.perf_counter() - t
        t = time.perf_counter()
        for _ in range(20):
            c.submit(*args, pure=False).result()
        sched = max((time.perf_counter() - t) / 20 - tiny_s, 1e-4)
    return {"plan_seconds": plan_s, "setup_seconds": max(cold - warm, setup_local),
            "sched_seconds": sched, "summary_s_per_byte": summary, "write_s_per_byte": write,
            "client_s_per_byte": client_cpu / total if client_cpu is not None else None,
            "task_bytes": task_bytes}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=10.0, help="trace size to tile to (GiB)")
    ap.add_argument("--workers", default="1,2", help="local worker counts to run")
    ap.add_argument("--no-single", action="store_true", help="skip the single-process run")
    ap.add_argument("--no-model", action="store_true", help="skip the model's measurements")
    ap.add_argument("--keep", action="store_true", help="keep the perf.data and the outputs")
    ap.add_argument("--json", metavar="FILE", help="also write the numbers here")
    ap.add_argument(
        "--task-mib",
        type=float,
        default=None,
        help="trace per Dask task (MiB; default: decode_to_parquet's)",
    )
    a = ap.parse_args()
    from hwtrace.perf.wrap import wrap_raw_trace
    from hwtrace.pt.config import PtConfig

    src = flow_workload()
    meta = json.loads((src / "flow.json").read_text())
    config = PtConfig(**meta["config"])
    work = OUT / f"scale-{a.gib:g}g"
    work.mkdir(parents=True, exist_ok=True)
    pt, data = work / "tiled.pt", work / "tiled.data"
    result: dict = {"gib": a.gib}
    try:
        t = time.perf_counter()
        size, copies = tile(src / "flow.pt", pt, int(a.gib * 2**30), config.cpuid_0x15_ebx)
        result["tile_seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        wrap_raw_trace(pt, data, elf=[(src / "flow_workload", None)], config=config)
        result["wrap_seconds"] = time.perf_counter() - t
        pt.unlink()
        mb = size / 1e6
        insns = copies * meta["instructions"]
        print(f"input: {copies} copies of {src.name}/flow.pt, {size / 2**30:.2f} GiB, "
              f"{insns:,} instructions; tiled in {result['tile_seconds']:.1f} s, wrapped in "
              f"{result['wrap_seconds']:.1f} s", flush=True)  # fmt: skip
        single = None
        if not a.no_single:
            single = run_decode(data, work / "single", [])
            s = single["decode_seconds"]
            print(f"single process: {single['seconds']:.1f} s ({s:.1f} s decoding), "
                  f"{mb / s:.2f} MB/s, {single['instructions'] / s / 1e6:.1f} Minsn/s, "
                  f"peak RSS {single['client_maxrss_mb']:.0f} MB, output "
                  f"{single['output_bytes'] / 1e6:.1f} MB ({single['blocks']:,} blocks)",
                  flush=True)  # fmt: skip
            assert single["instructions"] == insns, (single["instructions"], insns)
            result["single"] = {k: v for k, v in single.items() if k != "stderr"}
            shutil.rmtree(work / "single", ignore_errors=True) if not a.keep else None
        from hwtrace.cluster.decode import PARQUET_TASK_BYTES

        task_bytes = int(a.task_mib * 2**20) if a.task_mib else PARQUET_TASK_BYTES
        result["task_bytes"] = task_bytes
        rates = {}
        for w in [int(x) for x in a.workers.split(",") if x]:
            r = run_workers(data, work / f"w{w}", w, task_bytes)
            rates[w] = mb / r["seconds"]
            print(f"{w} worker(s): {r['seconds']:.1f} s, {rates[w]:.2f} MB/s, "
                  f"{r['instructions'] / r['seconds'] / 1e6:.1f} Minsn/s, worker VmHWM "
                  f"{', '.join(f'{x:.0f}' for x in r['worker_vmhwm_mb'])} MB, client VmHWM "
                  f"{r['client_vmhwm_mb']:.0f} MB", flush=True)  # fmt: skip
            assert r["instructions"] == insns, (r["instructions"], insns)
            result[f"workers_{w}"] = r
            shutil.rmtree(work / f"w{w}", ignore_errors=True) if not a.keep else None
        if 1 in rates and 2 in rates:
            result["ratio_2_to_1"] = rates[2] / rates[1]
            print(f"throughput 2 workers / 1 worker: {rates[2] / rates[1]:.2f}", flush=True)
        if not a.no_model:
            most = max((k for k in result if k.startswith("workers_")), default=None)
            cpu = result[most]["client_cpu_seconds"] if most else None
            m = model_terms(data, size, single, cpu, task_bytes)
            result["model"] = m
            client = m["client_s_per_byte"] or 0.0
            # A worker summarises each piece, then decodes it again and writes it.
            worker = 1 / (m["summary_s_per_byte"] + m["write_s_per_byte"])
            print(f"model: planning {m['plan_seconds']:.1f} s, per-worker setup "
                  f"{m['setup_seconds']:.2f} s, per task {m['sched_seconds'] * 1e3:.1f} ms, "
                  f"summary pass {m['summary_s_per_byte'] * 1e6:.3f} s/MB, write pass "
                  f"{m['write_s_per_byte'] * 1e6:.3f} s/MB (a worker: {worker / 1e6:.2f} MB/s), "
                  f"client CPU {client * 1e6:.4f} s/MB", flush=True)  # fmt: skip
            big = 64e9
            preds = {}
            for w in (8, 64, 512):
                # Two Dask tasks per piece (summary, write): two scheduling costs.
                s = predict(w, big, m["task_bytes"], worker, m["setup_seconds"],
                            2 * m["sched_seconds"], client)  # fmt: skip
                preds[w] = big / s / 1e6
                print(f"  predicted {w:4d} workers, 64 GB trace: {preds[w]:8.1f} MB/s "
                      f"(client-bound above {1 / client / 1e6:.1f} MB/s)")  # fmt: skip
            result["predicted_mb_s"] = preds
    finally:
        pt.unlink(missing_ok=True)
        if not a.keep:
            data.unlink(missing_ok=True)
            shutil.rmtree(work, ignore_errors=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    main()
