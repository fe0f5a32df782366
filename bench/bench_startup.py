"""Start-up time: ``hwtrace --help`` and ``hwtrace ptdump`` on a 1 KiB trace.

A command-line tool is run on small inputs as often as on large ones, so the
time to start matters.  This times whole processes (wall clock, best of N)

* ``hwtrace --help``, which should cost little more than Python's start,
* ``hwtrace ptdump`` on a 1 KiB trace made by libipt's encoder, and its
  peer: Intel's ptdump when it is installed (Debian does not package it),
  else libipt's ``pt_pkt_next`` loop (``bench/libipt/ptpkt_loop.c``),

with Python alone, ``import numpy`` and ``import numba`` for scale, then
lists what ``hwtrace ptdump`` spends its import time on
(``python -X importtime``).

    python bench/bench_startup.py [--repeat N]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import common
from bench_packets import OUT, build_peer, hwtrace_command


def best(cmd: list[str], repeat: int) -> float:
    return min(common.run_process(cmd)[0] for _ in range(repeat))


def small_trace(oracle) -> Path:
    path = OUT / "startup-1k.pt"
    if not path.is_file():
        OUT.mkdir(parents=True, exist_ok=True)
        oracle.generate(path, 1024, seed=1, mix="bench", psb_period=512)
    return path


def import_costs(cmd: list[str], top: int = 12) -> list[tuple[str, str, str]]:
    """The modules with the largest cumulative import time."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *cmd], capture_output=True, text=True
    )
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[1].strip().isdigit():
            continue
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip())) // 2
        if depth <= 1:  # top-level imports and what they import directly
            rows.append((int(parts[1]), int(parts[0].split(":")[1]), name.strip(), depth))
    rows.sort(reverse=True)
    return [(f"{'  ' * d}{n}", f"{c / 1000:.1f}", f"{s / 1000:.1f}") for c, s, n, d in rows[:top]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20, metavar="N", help="runs, best kept")
    args = parser.parse_args(argv)

    oracle = common.load_oracle()
    if oracle.skip_reason is not None:
        print(f"libipt is not available, cannot make the trace: {oracle.skip_reason}")
        return 2
    trace = small_trace(oracle)
    hw = hwtrace_command()
    # The kernels' native library is built on first use: not in a timed run.
    subprocess.run([*hw, "ptdump", str(trace)], capture_output=True)

    py = sys.executable
    rows = [
        ("python -c pass", best([py, "-c", "pass"], args.repeat), None),
        ("python -c 'import numpy'", best([py, "-c", "import numpy"], args.repeat), None),
        ("python -c 'import numba'", best([py, "-c", "import numba"], args.repeat), None),
        ("hwtrace --help", best([*hw, "--help"], args.repeat), 0.15),
        ("hwtrace ptdump (1 KiB)", best([*hw, "ptdump", str(trace)], args.repeat), 0.3),
    ]
    intel = shutil.which("ptdump")
    if intel:
        rows.append(("Intel ptdump (1 KiB)", best([intel, str(trace)], args.repeat), None))
    else:
        loop = build_peer("ptpkt_loop")
        cmd = [str(loop), str(trace), "--repeat", "1"]
        rows.append(("libipt pt_pkt_next loop (1 KiB)", best(cmd, args.repeat), None))
    common.print_table(
        f"Start-up, wall clock, best of {args.repeat}",
        ("command", "seconds", "target"),
        [(n, f"{t:.3f}", f"< {goal}" if goal else "") for n, t, goal in rows],
        width=90,
    )
    if not intel:
        print("(Intel's ptdump is not installed: libipt's packet loop is the peer)")
    print()
    common.print_table(
        "hwtrace ptdump (1 KiB): import time by module, ms",
        ("module", "cumulative", "self"),
        import_costs(["-m", "hwtrace.cli.main", "ptdump", str(trace)]),
        width=90,
        title_justify="left",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
