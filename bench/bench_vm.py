"""``hwtrace vm`` (HAVAna) throughput against the packet decoders.

The analysis needs only packets (PIP, VMCS, OVF and timing), so it must
keep up with a packet decoder over the same bytes.  This writes (once) a
KVM host trace of 4 pCPUs with ``hwtrace.analysis.vmgen`` (two VMs with a
migration and an overflow on pCPUs 0-1, Sharma's prime computation on
pCPU 2 and its three guest workers on pCPU 3; 40 branch packets per MTC
period, TNT-8 and every fourth a TIP, stand in for control flow), each
stream tiled to ``--mib`` MiB, then times
in one run:

* libipt's packet decoder (``pt_pkt_next`` in a C loop), per file;
* hwtrace's packet decoder into columns (``decode_range``) and counting
  only (``count_packets``), per file;
* ``hwtrace.analysis.vm.analyze`` over the 4 files (decoding, time model,
  state machine, intervals).

Best of R runs; MB = 1e6 bytes.

    python bench/bench_vm.py [--mib 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "vm"
sys.path.insert(0, str(HERE.parent / "src"))

from hwtrace.analysis.vm import analyze  # noqa: E402
from hwtrace.analysis.vmgen import mixed_scenario, prime_scenario, workers_scenario  # noqa: E402
from hwtrace.pt.packets import count_packets, decode_range, map_file, psb_chunks  # noqa: E402


def make(mib: int) -> tuple[dict[int, Path], object]:
    OUT.mkdir(parents=True, exist_ok=True)
    mixed = mixed_scenario()
    parts = {0: mixed, 1: mixed, 2: prime_scenario(), 3: workers_scenario(vcpu=0x77000)}
    paths = {}
    for pcpu, sc in parts.items():
        sc.filler = 40
        path = OUT / f"cpu{pcpu}-{mib}M.pt"
        paths[pcpu] = path
        if path.exists():
            continue
        one = sc.streams()[pcpu if sc is mixed else 0]
        data = sc.tiled(one, max(1, (mib << 20) // len(one)))
        path.write_bytes(data)
    return paths, mixed.config


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def decode_columns(path: Path) -> int:
    buf = map_file(path)
    n = 0
    for s, e in psb_chunks(buf, 16 << 20):
        n += len(decode_range(buf, s, e))
    return n


def run() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="MiB per pCPU (4 pCPUs)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    paths, config = make(args.mib)
    total = sum(p.stat().st_size for p in paths.values())
    oracle = common.load_oracle()
    rows = []
    libipt = 0.0
    if oracle.skip_reason is None:
        libipt = sum(oracle.loop_bench(p, args.repeat)["best_seconds"] for p in paths.values())
    files = {k: str(v) for k, v in paths.items()}
    decode_columns(paths[3])  # compile
    analyze({0: files[3]}, config)
    t_cols = sum(best(lambda p=p: decode_columns(p), args.repeat) for p in paths.values())
    t_count = sum(best(lambda p=p: count_packets(str(p)), args.repeat) for p in paths.values())
    result = None

    def analysis() -> None:
        nonlocal result
        result = analyze(files, config)

    t_vm = best(analysis, args.repeat)
    mb = total / 1e6
    for name, t in (("libipt pt_pkt_next (C)", libipt), ("hwtrace decode into columns", t_cols),
                    ("hwtrace count packets", t_count), ("hwtrace vm analysis", t_vm)):  # fmt: skip
        if t:
            rows.append((name, f"{t:,.2f}", f"{mb / t:,.0f}", f"{t / t_vm:,.2f}x"))
    common.print_table(
        f"hwtrace vm over {mb:,.0f} MB of 4-pCPU KVM host trace (best of {args.repeat}); "
        f"{result.stats['vm_exits']:,} VM exits, {result.intervals.shape[0]:,} intervals",
        ("", "seconds", "MB/s", "time / analysis"),
        rows,
        width=120,
    )
    return 0


if __name__ == "__main__":
    sys.exit(common.bench_main("bench_vm", run, interrupted="nothing left running"))
