"""Packet-decoding throughput: hwtrace against Intel's libipt.

Generates (once) a random but realistic Intel PT stream with libipt's own
encoder, ``bench/out/bench-<size>M.pt`` (seed 1, a PSB+ header every 4096
bytes, the branch-heavy "bench" packet mix), then decodes the whole file with

* libipt's packet decoder (``pt_pkt_next`` in a C loop, best of N runs), and
* hwtrace's decoder (``hwtrace.pt.packets.count_packets``, one warm-up run
  for the numba compile, then best of N runs),

and prints MB/s (MB = 1e6 bytes), packet counts and the speed ratio.

Then whole processes, output to /dev/null, best of N runs, with their peak
resident memory (``ru_maxrss``):

* ``hwtrace ptdump --quiet`` against libipt's ``pt_pkt_next`` loop
  (``bench/libipt/ptpkt_loop.c``, one run per process), and
* ``hwtrace ptdump`` against the same loop printing every packet with
  ``printf`` in Intel's ptdump format (``bench/libipt/ptpkt_print.c``; its
  text and hwtrace's are compared on a prefix of the stream).

With ``--big`` the stream is tiled to 4 GiB (``bench/out/tiled-4G-*.pt``,
deleted afterwards) and both ptdump commands run on it once: their memory
must not grow with the trace.

    python bench/bench_packets.py [--size MiB] [--repeat N] [--big]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
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


def build_peer(name: str) -> Path:
    """``bench/libipt/<name>.c`` built against libipt into bench/out (once
    per source)."""
    source = HERE / "libipt" / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    exe = OUT / f"{name}-{digest}"
    if not exe.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        tmp = exe.with_suffix(".tmp")
        cmd = ["gcc", "-O2", "-Wall", "-Wextra", "-o", str(tmp), str(source), "-lipt"]
        subprocess.run(cmd, check=True)
        tmp.replace(exe)
    return exe


def best_process(cmd: list[str], repeat: int) -> tuple[float, int]:
    """Best wall time of ``repeat`` runs and the largest peak memory."""
    best, rss = float("inf"), 0
    for _ in range(repeat):
        seconds, peak, status = common.run_process(cmd)
        if status not in (0, 2):
            raise RuntimeError(f"{' '.join(cmd)} exited with {status}")
        best, rss = min(best, seconds), max(rss, peak)
    return best, rss


def hwtrace_command() -> list[str]:
    exe = shutil.which("hwtrace", path=str(Path(sys.executable).parent))
    return [exe] if exe else [sys.executable, "-m", "hwtrace.cli.main"]


def same_text(cmd_a: list[str], cmd_b: list[str], path: Path, prefix: int) -> bool:
    """Do two commands print the same text for the first ``prefix`` bytes of
    ``path`` (cut at a PSB)?"""
    data = path.read_bytes()[: prefix + 4096]
    cut = data.rfind(b"\x02\x82" * 8, 0, prefix)
    part = OUT / "prefix.pt"
    part.write_bytes(data[: cut if cut > 0 else prefix])
    try:
        a = subprocess.run([*cmd_a, str(part)], capture_output=True).stdout
        b = subprocess.run([*cmd_b, str(part)], capture_output=True).stdout
    finally:
        part.unlink()
    return a == b and len(a) > 0


def whole_processes(path: Path, repeat: int) -> list[tuple[str, ...]]:
    """hwtrace ptdump against libipt's loops, as whole processes."""
    # The kernels' native library is built after a first use: not in a timed run.
    subprocess.run([*hwtrace_command(), "aot", "warm"], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    loop = build_peer("ptpkt_loop")
    printer = build_peer("ptpkt_print")
    hw = hwtrace_command()
    size = path.stat().st_size
    runs = [
        ("libipt pt_pkt_next loop", [str(loop), str(path), "--repeat", "1"], None),
        ("hwtrace ptdump --quiet", [*hw, "ptdump", "--quiet", str(path)], 0),
        ("libipt loop + printf", [str(printer), str(path)], None),
        ("hwtrace ptdump", [*hw, "ptdump", str(path)], 2),
    ]
    rows = []
    peer = 0.0
    for name, cmd, peer_row in runs:
        print(f"{name}: best of {repeat} ...", flush=True)
        seconds, rss = best_process(cmd, repeat)
        if peer_row is None:
            peer = seconds
            ratio = "1.00x"
        else:
            ratio = f"{peer / seconds:.2f}x"
        rows.append(
            (name, f"{seconds:.2f}", f"{size / 1e6 / seconds:.1f}", f"{rss / 1e6:.0f}", ratio)
        )
    return rows


def big_trace(path: Path) -> list[tuple[str, ...]]:
    hw = hwtrace_command()
    print("tiling the stream to 4 GiB ...", flush=True)
    big = common.tiled(path, 4, OUT)
    rows = []
    try:
        size = big.stat().st_size
        for args in (["--quiet"], []):
            name = " ".join(["hwtrace ptdump", *args])
            print(f"{name} on {size / (1 << 30):.1f} GiB ...", flush=True)
            seconds, rss, status = common.run_process([*hw, "ptdump", *args, str(big)])
            rows.append((name, f"{size:,}", f"{seconds:.1f}", f"{rss / 1e6:.0f}", str(status)))
    finally:
        big.unlink(missing_ok=True)
    return rows


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    common.print_table(
        "Intel PT packet decoding", ("decoder", "MB/s", "packets", "ratio vs libipt"), rows
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, metavar="MiB", help="stream size")
    parser.add_argument("--repeat", type=int, default=5, metavar="N", help="timed runs, best kept")
    parser.add_argument("--big", action="store_true", help="also dump a 4 GiB tiled trace")
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

    print()
    procs = whole_processes(path, min(args.repeat, 3))
    common.print_table(
        "Whole processes, output to /dev/null",
        ("command", "seconds", "MB/s", "peak RSS MB", "speed vs libipt"),
        procs,
        width=100,
    )
    agree = same_text(
        [*hwtrace_command(), "ptdump"], [str(build_peer("ptpkt_print"))], path, 16 << 20
    )
    print(f"hwtrace ptdump and libipt + printf print the same text (16 MiB prefix): {agree}")
    if args.big:
        print()
        common.print_table(
            "A 4 GiB trace (the stream tiled)",
            ("command", "bytes", "seconds", "peak RSS MB", "exit"),
            big_trace(path),
            width=100,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
