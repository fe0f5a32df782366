"""CoreSight packet listings: ``hwtrace csdump`` against OpenCSD's
``trc_pkt_lister``, on the real captures kept in ``tests/data/real``.

Each snapshot is listed whole by ``hwtrace csdump --snapshot DIR`` (every
ETMv4, ETE and STM source) and by the lister once per trace buffer with
ETMv4, ETE or STM sources (``-ss_dir DIR -logstdout -src_name BUFFER``,
``-dstream_format`` for DSTREAM captures), whose times are summed: the same
packets listed.  Both run as whole processes, output to /dev/null, best of
``--repeat``; peak resident memory is GNU time's (the lister's largest
run).  The lines are counted once, from the listings themselves.

    python bench/bench_csdump.py [--repeat N]
"""

from __future__ import annotations

import argparse
import configparser
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
REAL = HERE.parent / "tests" / "data" / "real"
HWTRACE = Path(sys.executable).with_name("hwtrace")
SNAPSHOTS = (
    "opencsd-snapshots/a55-test-tpiu",  # ETMv4 in a DSTREAM capture
    "opencsd-snapshots/juno-uname-002",  # ETMv4, six sources in one ETB
    "opencsd-snapshots/bugfix-exact-match",  # ETMv4, 690,000 packets
    "opencsd-snapshots/stm_only-juno",  # STM
    "opencsd-snapshots-ete/tme_test",  # ETE
)
PROTOCOLS = {"ETM4", "ETMV4", "ETE", "STM"}


def _ini(path: Path) -> configparser.ConfigParser:
    p = configparser.ConfigParser()
    p.optionxform = str  # type: ignore[assignment,method-assign]  # (names keep their case)
    p.read(path)
    return p


def buffers(directory: Path) -> list[tuple[str, str]]:
    """The snapshot's buffers with ETMv4, ETE or STM sources: name, format."""
    types = {}
    for _, fname in _ini(directory / "snapshot.ini").items("device_list"):
        dev = _ini(directory / fname.strip())["device"]
        types[dev["name"].strip()] = dev["type"].strip().split(".")[0].upper()
    trace = _ini(directory / "trace.ini")
    fed = {b.strip() for s, b in trace.items("source_buffers") if types.get(s) in PROTOCOLS}
    out = []
    for sect in (s.strip() for s in trace["trace_buffers"]["buffers"].split(",")):
        if sect and trace[sect]["name"].strip() in fed:
            out.append((trace[sect]["name"].strip(), trace[sect].get("format", "coresight")))
    return out


def lister_cmds(lister: str, directory: Path) -> list[list[str]]:
    return [
        [lister, "-ss_dir", str(directory), "-logstdout", "-src_name", name,
         *(["-dstream_format"] if fmt.strip() == "dstream_coresight" else [])]
        for name, fmt in buffers(directory)
    ]  # fmt: skip


def best(cmds: list[list[str]], repeat: int, cwd: Path) -> tuple[float, int]:
    """Best total wall time of running ``cmds`` one after another, and the
    largest peak memory of one."""
    top, peak = float("inf"), 0
    for _ in range(repeat):
        total = 0.0
        for cmd in cmds:
            seconds, rss, status = _in(cwd, cmd)
            if status != 0:
                raise SystemExit(f"{' '.join(cmd)} exited with {status}")
            total += seconds
            peak = max(peak, rss)
        top = min(top, total)
    return top, peak


def _in(cwd: Path, cmd: list[str]) -> tuple[float, int, int]:
    # (the lister writes its log file into the current directory)
    here = Path.cwd()
    try:
        os.chdir(cwd)
        return common.run_process(cmd)
    finally:
        os.chdir(here)


def count_lines(cmds: list[list[str]], cwd: Path, prefix: bytes = b"Idx:") -> int:
    n = 0
    for cmd in cmds:
        out = subprocess.run(cmd, capture_output=True, cwd=cwd, check=False).stdout
        n += sum(1 for line in out.splitlines() if prefix in line)
    return n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, metavar="N")
    args = parser.parse_args(argv)
    lister = shutil.which("trc_pkt_lister")
    if lister is None:
        print("OpenCSD's trc_pkt_lister is not installed (apt-get install libopencsd-bin)")
        return 2
    # A first run compiles what the warm-up did not and builds the library.
    subprocess.run([str(HWTRACE), "csdump", "--snapshot", str(REAL / SNAPSHOTS[0])],
                   capture_output=True, check=True)  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-csdump-") as tmp:
        cwd = Path(tmp)
        for name in SNAPSHOTS:
            d = REAL / name
            mine_cmd = [[str(HWTRACE), "csdump", "--snapshot", str(d)]]
            theirs_cmds = lister_cmds(lister, d)
            mine_s, mine_rss = best(mine_cmd, args.repeat, cwd)
            theirs_s, theirs_rss = best(theirs_cmds, args.repeat, cwd)
            n_mine = count_lines(mine_cmd, cwd)
            n_theirs = count_lines(theirs_cmds, cwd)
            rows.append((
                name.split("/")[-1], f"{n_mine:,}", f"{n_theirs:,}", f"{mine_s:.3f}",
                f"{theirs_s:.3f}", f"{theirs_s / mine_s:.2f}", f"{mine_rss >> 20}",
                f"{theirs_rss >> 20}",
            ))  # fmt: skip
    common.print_table(
        f"CoreSight listings, whole processes, best of {args.repeat}",
        ("snapshot", "lines", "lister lines", "hwtrace s", "lister s", "x lister",
         "hwtrace MB", "lister MB"),
        rows, width=120,
    )  # fmt: skip
    print("(x lister > 1: hwtrace is faster; lines: those with a packet index, 'Idx:')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
