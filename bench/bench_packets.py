"""Packet-decoding throughput: hwtrace against Intel's libipt.

Generates (once) a random but realistic Intel PT stream with libipt's own
encoder, ``bench/out/bench-<size>M.pt`` (seed 1, a PSB+ header every 4096
bytes, the branch-heavy "bench" packet mix), then decodes the whole file with

* libipt's packet decoder (``pt_pkt_next`` in a C loop, best of N runs), and
* hwtrace's decoder (``hwtrace.pt.packets.count_packets``, one warm-up run
  for the numba compile, then best of N runs),

and prints MB/s (MB = 1e6 bytes), packet counts and the speed ratio.

    python bench/bench_packets.py [--size MiB] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
OUT = HERE / "out"
SEED = 1
PSB_PERIOD = 4096


def load_hwtrace() -> tuple[Callable[[str], int] | None, str]:
    """Return ``(count_packets, "")`` or ``(None, why not)``."""
    src = str(REPO / "src")
    try:
        from hwtrace.pt.packets import count_packets
    except Exception:
        if src not in sys.path:
            sys.path.insert(0, src)  # running from a checkout without an install
            for name in [m for m in sys.modules if m == "hwtrace" or m.startswith("hwtrace.")]:
                del sys.modules[name]
        try:
            from hwtrace.pt.packets import count_packets
        except Exception as exc:  # a missing or half-written decoder must not stop the bench
            return None, f"{type(exc).__name__}: {exc}"
    return count_packets, ""


def stream_path(oracle: ModuleType, mib: int) -> Path:
    """The benchmark stream, generated unless a file of the right size exists."""
    size = mib << 20
    path = OUT / f"bench-{mib}M.pt"
    # ptgen stops after the packet that reaches the size: a few bytes more.
    if path.is_file() and size <= path.stat().st_size < size + 64:
        print(f"reusing {path.relative_to(REPO)}")
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"generating {path.relative_to(REPO)} ({mib} MiB, seed {SEED}) ...", flush=True)
    t0 = time.perf_counter()
    tmp = path.with_suffix(".tmp")
    oracle.generate(tmp, size, seed=SEED, mix="bench", psb_period=PSB_PERIOD)
    tmp.replace(path)
    print(f"  done in {time.perf_counter() - t0:.1f} s")
    return path


def time_hwtrace(count_packets: Callable[[str], int], path: Path, repeat: int) -> dict[str, Any]:
    """Best of ``repeat`` runs after one warm-up run (numba compiles on first use)."""
    t0 = time.perf_counter()
    packets = count_packets(str(path))
    warmup = time.perf_counter() - t0
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        n = count_packets(str(path))
        best = min(best, time.perf_counter() - t0)
        if n != packets:
            print(f"warning: hwtrace packet count changed between runs: {packets} then {n}")
    size = path.stat().st_size
    return {
        "bytes": size,
        "packets": packets,
        "best_seconds": best,
        "mb_per_s": size / 1e6 / best,
        "warmup_seconds": warmup,
    }


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    common.print_table(
        "Intel PT packet decoding", ("decoder", "MB/s", "packets", "ratio vs libipt"), rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, metavar="MiB", help="stream size")
    parser.add_argument("--repeat", type=int, default=5, metavar="N", help="timed runs, best kept")
    args = parser.parse_args(argv)
    if args.size < 1 or args.repeat < 1:
        parser.error("--size and --repeat must be at least 1")

    oracle = common.load_oracle()
    if oracle.skip_reason is not None:
        print(f"libipt is not available, cannot generate the stream: {oracle.skip_reason}")
        print("(run `make oracles` as root to install libipt-dev)")
        return 2
    path = stream_path(oracle, args.size)

    print(f"libipt: pt_pkt_next loop, best of {args.repeat} ...", flush=True)
    ref = oracle.loop_bench(path, args.repeat)
    rows = [("libipt 2.0.5", f"{ref['mb_per_s']:.1f}", f"{int(ref['packets']):,}", "1.00x")]

    count_packets, why = load_hwtrace()
    if count_packets is None:
        print(f"hwtrace: cannot import hwtrace.pt.packets.count_packets ({why});")
        print("         reporting libipt only")
        hw = None
    else:
        print(f"hwtrace: count_packets, warm-up + best of {args.repeat} ...", flush=True)
        hw = time_hwtrace(count_packets, path, args.repeat)
        ratio = hw["mb_per_s"] / ref["mb_per_s"]
        rows.append(
            ("hwtrace, 1 thread", f"{hw['mb_per_s']:.1f}", f"{hw['packets']:,}", f"{ratio:.2f}x")
        )
        # PSB-split chunks decoded on every core: how hwtrace decodes large files.
        jobs = os.cpu_count() or 1
        if jobs > 1:
            par = time_hwtrace(lambda p: count_packets(p, jobs=jobs), path, args.repeat)
            ratio = par["mb_per_s"] / ref["mb_per_s"]
            rows.append(
                (f"hwtrace, {jobs} threads", f"{par['mb_per_s']:.1f}", f"{par['packets']:,}",
                 f"{ratio:.2f}x")
            )  # fmt: skip

    print()
    print_table(rows)
    print(f"stream: {path.relative_to(REPO)}, {int(ref['bytes']):,} bytes")
    if ref["errors"]:
        print(f"libipt decode errors: {int(ref['errors'])}")
    if hw is not None:
        print(f"hwtrace warm-up run (includes numba compile): {hw['warmup_seconds']:.2f} s")
        if hw["packets"] == ref["packets"]:
            print(f"packet counts agree: {hw['packets']:,}")
        else:
            diff = hw["packets"] - int(ref["packets"])
            print(
                f"packet counts DISAGREE: libipt {int(ref['packets']):,}, "
                f"hwtrace {hw['packets']:,} ({diff:+,})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
