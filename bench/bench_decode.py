"""Decoding real executions full of events: hwtrace against Intel's libipt.

``bench_flow.py``'s trace has one PSB+ every 4 KiB and no other event.  A
real user-space recording is different: the kernel's work is not traced, so
every system call disables tracing and its return enables it again (FUP,
TIP.PGD, TIP.PGE, MODE.Exec), PSB+ come every few KiB, and timing packets
(MTC, CYC) are everywhere.  This benchmark takes the executed path of
``bench_flow.py``'s workload (real compiled code, run under an emulator) and
encodes it again with hwtrace's encoder in several shapes:

* ``flow``: ``bench_flow.py``'s trace as it is (no events but PSB+);
* ``syscalls-2k``: tracing off for ~150 instructions every ~2,000 (a
  system call), PSB+ every 2 KiB, TSC/MTC, compressed returns;
* ``syscalls-20k-noret``: off every ~20,000, PSB+ every 4 KiB, TSC/MTC,
  no return compression (as with ``noretcomp``);
* ``psb1k-cyc``: off every ~8,000, PSB+ every 1 KiB, TSC/MTC/CYC;
* ``plain-2k``: ``syscalls-2k`` without the system calls (tracing never
  off), the control that prices them: a second table gives what a system
  call costs each decoder beyond its rate on plain flow, in nanoseconds a
  system call: its packets (FUP, TIP.PGD, MODE.Exec, TIP.PGE) and what
  they change around them (the TNT packet cut short before, returns to
  calls made before tracing went off sent as TIPs after).
* ``flow-libxdc``: ``bench_flow.py``'s libxdc trace, the same path as
  libxdc takes it (no return compression, no timing packets: every return
  a TIP); libxdc (kAFL/Nyx's decoder, built by ``bench_flow.py`` from its
  sources against capstone 4) is timed on it too, a fresh decoder and
  warm.  It computes edge coverage only, no instructions: its rate is the
  path's instructions over its time.

and, in one run, decodes each with

* libipt's block decoder (``pt_blk_next`` in ``bench/libipt/ptflow_loop.c``):
  best of N in-process, and one whole process (start-up included);
* ``hwtrace.pt.decode.decode_trace`` in a fresh process, on its first run
  (kernels loaded from hwtrace's native library; OpenBLAS single-threaded,
  as the ``hwtrace`` command runs): block columns kept (what every
  command and analysis uses), only counted, and kept on every core;
* ``hwtrace ptxed --quiet`` and ``--no-inst`` as whole processes, and with
  disassembly (every instruction printed) on the smaller traces.

Output goes to /dev/null.  Rates are given in instructions and in trace
bytes a second (MB/s, the figure libxdc's authors quote).  Every decoder must find the same instruction
count, which is also the encoder's.

With ``--big`` the flow trace is also tiled to 4 GiB (deleted afterwards)
and ``hwtrace ptxed --quiet`` and ``--no-inst`` run on it once each, with
their peak resident memory: it must not grow with the trace.

    python bench/bench_decode.py [--repeat N] [--only NAME] [--insns N] [--big]
                                 [--libxdc-src DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import bench_flow
import common
import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
HWTRACE = Path(sys.executable).with_name("hwtrace")


@dataclass(frozen=True)
class Shape:
    name: str
    off_every: int  # mean instructions between system calls (0: none)
    psb_period: int
    ret_compression: bool = True
    cyc: bool = False


SHAPES = [
    Shape("syscalls-2k", 2_000, 2048),
    Shape("syscalls-20k-noret", 20_000, 4096, ret_compression=False),
    Shape("psb1k-cyc", 8_000, 1024, cyc=True),
    Shape("plain-2k", 0, 2048),
]
# The shape with system calls and its control without (see event_costs).
EVENTS_PAIR = ("syscalls-2k", "plain-2k")
OFF_LENGTH = 150  # instructions not traced per system call (the kernel's)


def _encoder_key(shape: Shape, insns: int, flow_dir: Path) -> str:
    import hashlib

    digest = hashlib.sha256(repr((shape, insns, flow_dir.name)).encode())
    digest.update((REPO / "src" / "hwtrace" / "pt" / "encode.py").read_bytes())
    return digest.hexdigest()[:12]


def make_trace(shape: Shape, workload: bench_flow.Workload, insns: int) -> tuple[Path, dict]:
    """Encode the first ``insns`` instructions of the workload's path in
    ``shape`` (cached in bench/out)."""
    path = OUT / f"decode-{shape.name}-{_encoder_key(shape, insns, workload.directory)}.pt"
    meta_path = path.with_suffix(".json")
    if path.exists() and meta_path.exists():
        return path, json.loads(meta_path.read_text())
    from hwtrace.image import Image
    from hwtrace.pt.encode import encode_path

    print(f"  encoding {path.name} ...", flush=True)
    path_ips = bench_flow.BlockTrace.load(workload.blocks_path).ips()
    if insns < len(path_ips):
        ips, end_ip = path_ips[:insns], int(path_ips[insns])
    else:
        ips, end_ip = path_ips, bench_flow.elf_symbol(workload.elf, "workload_done")
    del path_ips
    rng = np.random.default_rng(7)
    trace_off = []
    p = int(rng.integers(shape.off_every // 2, shape.off_every * 3 // 2)) if shape.off_every else -1
    while 0 <= p and p + OFF_LENGTH + 2 < len(ips) - 1:
        trace_off.append((p, p + OFF_LENGTH))
        p += OFF_LENGTH + int(rng.integers(shape.off_every // 2, shape.off_every * 3 // 2))
    image = Image()
    image.add_elf(workload.elf)
    encoded = encode_path(ips, image, end_ip=end_ip, trace_off=trace_off, psb_period=shape.psb_period,
                          ret_compression=shape.ret_compression, tsc=1 << 40, mtc_freq=3,
                          ctc_ratio=100, cbr=24, cyc=shape.cyc)  # fmt: skip
    path.write_bytes(encoded.data)
    meta = {
        "instructions": len(encoded.expected),
        "system_calls": len(trace_off),
        "trace_bytes": len(encoded.data),
        "config": workload.meta()["config"],
        "encoder_stats": encoded.stats,
    }
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    return path, meta


HWTRACE_RUN = r"""
import json, sys, time
from hwtrace.image import Image
from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import decode_trace
trace, elf, timing, keep, jobs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "1", int(sys.argv[5])
data = open(trace, "rb").read()
image = Image()
image.add_elf(elf)
t0 = time.perf_counter()
result = decode_trace(data, image, PtConfig(**timing), keep_blocks=keep, jobs=jobs)
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "instructions": int(result.n_insn)}))
"""


def hwtrace_first_run(trace: Path, elf: Path, timing: dict, keep: bool, jobs: int) -> dict:
    # (OpenBLAS single-threaded, as the hwtrace command runs: numpy's BLAS
    # threads start at its import and spin for a while, on a core of this
    # two-CPU machine the first run would otherwise share with them)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, "-c", HWTRACE_RUN, str(trace), str(elf), json.dumps(timing),
         "1" if keep else "0", str(jobs)],
        check=True, capture_output=True, text=True, env=env,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def wall(cmd: list[str], repeat: int) -> tuple[float, str]:
    """Best wall time of ``cmd`` (stdout to /dev/null) and its stderr."""
    best, err = float("inf"), ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        best = min(best, time.perf_counter() - t0)
        err = proc.stderr
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)} failed: {err[-2000:]}")
    return best, err


def ptxed_cmd(trace: Path, elf: Path, timing: dict, *extra: str) -> list[str]:
    return [str(HWTRACE), "ptxed", "--pt", str(trace), "--elf", str(elf),
            "--mtc-freq", str(timing["mtc_freq"]), "--nom-freq", str(timing["nom_freq"]),
            "--cpuid-0x15.eax", str(timing["cpuid_0x15_eax"]),
            "--cpuid-0x15.ebx", str(timing["cpuid_0x15_ebx"]), *extra]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, metavar="N")
    parser.add_argument("--only", help="only the workloads whose name contains this")
    parser.add_argument("--insns", type=int, default=40_000_000,
                        help="instructions of the path encoded with events")  # fmt: skip
    parser.add_argument("--disasm-max", type=int, default=50_000_000,
                        help="print with disassembly only traces up to this many instructions")  # fmt: skip
    parser.add_argument("--big", action="store_true", help="also ptxed on a 4 GiB tiled trace")
    parser.add_argument("--libxdc-src", type=Path, metavar="DIR",
                        default=os.environ.get("HWTRACE_LIBXDC_SRC") or None,
                        help="libxdc's source tree (default $HWTRACE_LIBXDC_SRC, else "
                             "bench_flow.py's clone in bench/out)")  # fmt: skip
    args = parser.parse_args(argv)
    oracle = common.load_oracle()
    if oracle.skip_reason is not None:
        print(f"libipt is not available: {oracle.skip_reason}")
        return 2
    workload = bench_flow.prepare(False)
    timing = workload.meta()["config"]
    sections = [(workload.elf, off, size, vaddr) for off, size, vaddr, _ in
                bench_flow.load_segments(workload.elf)]  # fmt: skip
    traces = [("flow", workload.trace, workload.meta())]
    if not args.only or args.only in "flow-libxdc":
        try:
            xdc_trace, xdc_meta = bench_flow.libxdc_trace(workload)
            xdc_meta = {**xdc_meta, "instructions": workload.meta()["instructions"]}
            traces.append(("flow-libxdc", xdc_trace, xdc_meta))
        except bench_flow.LibxdcSkipped as exc:
            print(f"flow-libxdc: skipped ({exc})")
    for shape in SHAPES:
        if args.only and args.only not in shape.name:
            continue
        traces.append((shape.name, *make_trace(shape, workload, args.insns)))
    if args.only:
        traces = [t for t in traces if args.only in t[0]]

    # Fill numba's cache, then build the native kernel library from it, so
    # the timed processes load, not compile (as after a user's first run);
    # no timed process builds it on its way out.
    os.environ["HWTRACE_AOT_AUTOBUILD"] = "0"
    for _, trace, _ in traces:
        hwtrace_first_run(trace, workload.elf, timing, True, 1)
        hwtrace_first_run(trace, workload.elf, timing, False, 1)
    small = min(traces, key=lambda t: t[1].stat().st_size)[1]
    for extra in (("--quiet",), ("--no-inst",), ()):
        subprocess.run(ptxed_cmd(small, workload.elf, timing, *extra), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    subprocess.run([sys.executable, "-m", "hwtrace.aot", "build"], check=True)
    xdc_harness = None
    if any(name == "flow-libxdc" for name, _, _ in traces):
        try:
            xdc_harness, _ = bench_flow.libxdc_harness(args.libxdc_src)
        except bench_flow.LibxdcSkipped as exc:
            print(f"libxdc: skipped ({exc})")

    rows = []
    status = 0
    timed: dict[str, dict[str, float]] = {}
    for name, trace, meta in traces:
        expected = int(meta["instructions"])
        size = trace.stat().st_size
        print(f"{name}: {expected:,} instructions, {size:,} bytes", flush=True)
        blk = oracle.flow_bench(trace, sections, "blk", args.repeat, timing)
        blk_s = float(blk["best_seconds"])
        loop_cmd = oracle.build().ptflow_loop
        raw = [a for f, o, s, v in sections for a in ("--raw", f"{f}:{o:#x}:{s:#x}:{v:#x}")]
        blk_wall, _ = wall([str(loop_cmd), str(trace), "--decoder", "blk", "--repeat", "1",
                            *raw], args.repeat)  # fmt: skip
        results: list[tuple[str, float, int]] = [
            ("libipt pt_blk_next", blk_s, int(blk["instructions"])),
            ("libipt pt_blk_next, whole process", blk_wall, int(blk["instructions"])),
        ]
        for label, keep, jobs in (("kept", True, 1), ("counted", False, 1),
                                  (f"kept, {os.cpu_count()} threads", True, os.cpu_count())):  # fmt: skip
            best = min(
                (hwtrace_first_run(trace, workload.elf, timing, keep, jobs or 1)
                 for _ in range(args.repeat)),
                key=lambda r: r["seconds"],
            )  # fmt: skip
            results.append((f"decode_trace first run, {label}", best["seconds"],
                            best["instructions"]))  # fmt: skip
        if name == "flow-libxdc" and xdc_harness is not None:
            results += libxdc_rows(xdc_harness, workload.elf, trace, args.repeat, expected)
        for label, extra in (("--quiet", ("--quiet",)), ("--no-inst", ("--no-inst",))):
            seconds, _ = wall(ptxed_cmd(trace, workload.elf, timing, *extra), args.repeat)
            results.append((f"hwtrace ptxed {label}, whole process", seconds, expected))
        if expected <= args.disasm_max:
            seconds, _ = wall(ptxed_cmd(trace, workload.elf, timing), 1)
            results.append(("hwtrace ptxed (disassembly), whole process", seconds, expected))
        timed[name] = {"instructions": expected, "system_calls": meta.get("system_calls", 0),
                       **{label: seconds for label, seconds, _ in results}}  # fmt: skip
        for label, seconds, count in results:
            if count != expected:
                status = 1
                print(f"  {label}: {count:,} instructions, expected {expected:,}")
            rows.append((name, label, f"{seconds:.3f}", f"{count / seconds / 1e6:.1f}",
                         f"{size / seconds / 1e6:.1f}", f"{blk_s / seconds:.2f}"))  # fmt: skip
    common.print_table(
        "Decoding with events (output to /dev/null)",
        ("trace", "decoder", "seconds", "M insn/s", "trace MB/s", "x pt_blk_next"),
        rows,
        width=110,
    )
    costs = event_costs(timed)
    if costs:
        common.print_table(
            f"What a system call costs beyond plain flow ({EVENTS_PAIR[0]} against "
            f"{EVENTS_PAIR[1]})",
            ("decoder", "ns / system call", "share of the decode"),
            costs,
            width=100,
        )
    if args.big:
        common.print_table(
            "ptxed on the flow trace tiled to 4 GiB (output to /dev/null)",
            ("command", "bytes", "seconds", "peak RSS MB", "exit"),
            big_trace(workload, timing),
            width=100,
        )
    return status


def libxdc_rows(
    harness: Path, elf: Path, trace: Path, repeat: int, expected: int
) -> list[tuple[str, float, int]]:
    """libxdc on ``trace``: a fresh decoder's run and the best of ``repeat``
    warm ones, as rows counted as the path's ``expected`` instructions
    (libxdc finds edges, not instructions); none when it fails."""
    try:
        got = bench_flow.run_libxdc(harness, elf, trace, repeat)
    except bench_flow.LibxdcSkipped as exc:
        print(f"  libxdc: {exc}")
        return []
    if (
        got["first_result"] not in bench_flow.XDC_SUCCESS
        or got["result"] not in bench_flow.XDC_SUCCESS
    ):
        print(f"  libxdc: {got['first_result']} / {got['result']}")
        return []
    return [
        ("libxdc, fresh decoder (edges only)", got["first_seconds"], expected),
        (f"libxdc, warm caches, best of {repeat} (edges only)", got["best_seconds"], expected),
    ]


def event_costs(timed: dict[str, dict[str, float]]) -> list[tuple[str, str, str]]:
    """Per decoder, the time a system call adds beyond the decoder's rate on
    the same encoding without them: ``(t - t_plain * n / n_plain) /
    calls``, and that as a share of ``t``."""
    with_calls, plain = (timed.get(name) for name in EVENTS_PAIR)
    if not with_calls or not plain or not with_calls["system_calls"]:
        return []
    out = []
    for label in ("libipt pt_blk_next", "decode_trace first run, kept",
                  "decode_trace first run, counted"):  # fmt: skip
        t, t0 = with_calls[label], plain[label]
        extra = t - t0 * with_calls["instructions"] / plain["instructions"]
        out.append((label, f"{extra / with_calls['system_calls'] * 1e9:.0f}",
                     f"{extra / t:.0%}"))  # fmt: skip
    return out


def big_trace(workload: bench_flow.Workload, timing: dict) -> list[tuple[str, ...]]:
    """ptxed's memory on a trace far larger than memory would allow to
    hold: the flow trace repeated to 4 GiB."""
    print("tiling the flow trace to 4 GiB ...", flush=True)
    big = common.tiled(workload.trace, 4, OUT)
    rows = []
    try:
        size = big.stat().st_size
        for extra in ("--quiet", "--no-inst"):
            print(f"hwtrace ptxed {extra} on {size / (1 << 30):.1f} GiB ...", flush=True)
            seconds, rss, code = common.run_process(ptxed_cmd(big, workload.elf, timing, extra))
            rows.append((f"hwtrace ptxed {extra}", f"{size:,}", f"{seconds:.1f}",
                         f"{rss / 1e6:.0f}", str(code)))  # fmt: skip
    finally:
        big.unlink(missing_ok=True)
    return rows


if __name__ == "__main__":
    sys.exit(main())
