"""Start-up time: every command on a small input, beside perf and Intel's tools.

A command-line tool is run on small inputs as often as on large ones, so the
time to start matters.  This times whole processes (wall clock and peak
resident memory, best of N)

* ``hwtrace --help``, which should cost little more than Python's start,
* ``hwtrace ptdump`` on a 1 KiB trace made by libipt's encoder, and its
  peer: Intel's ptdump when it is installed (Debian does not package it),
  else libipt's ``pt_pkt_next`` loop (``bench/libipt/ptpkt_loop.c``),
* ``hwtrace ptxed`` on a case of Intel's conformance suite, beside libipt's
  ``pt_insn_next`` loop (``bench/libipt/ptflow_loop.c``),
* the analysis commands (``script``, ``report``, ``latency``,
  ``funclatency``, ``diff``, ``events``, ``query``, ``perf-dump``,
  ``characterize``) on a recording of a small C program (``hwtrace
  record``), ``vm``, ``ptwrite`` and ``bts`` on inputs made as the
  hardware writes them, each beside the
  perf command that does the same where there is one (``perf script
  --itrace=i0ns``, ``perf report``, ``perf diff``, ``perf script`` of the
  tracepoint events, ``perf report -D``, ``perf script`` of the BTS
  branches),

with Python alone, ``import numpy`` and ``import numba`` for scale, then
lists what ``hwtrace ptdump`` and ``hwtrace report`` spend their import
time on (``python -X importtime``).  Targets: 0.3 s and 100 MB for a
command on a small input, 0.1 s for ptdump on 1 KiB.

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
    return measure(cmd, repeat)[0]


def measure(cmd: list[str], repeat: int) -> tuple[float, int]:
    """Best wall seconds and the peak resident bytes of that run."""
    return min(common.run_process(cmd)[:2] for _ in range(repeat))


PROGRAM = r"""
#include <stdio.h>
static int work(int n) { int s = 0; for (int i = 0; i < n; i++) s += (i * 7) % 13; return s; }
int main(void) { int s = 0; for (int k = 0; k < 20; k++) s += work(100 + k); printf("%d\n", s); return 0; }
"""


def recordings(hw: list[str]) -> Path | None:
    """A small program recorded twice by ``hwtrace record`` (and its
    tracepoint events by ``perf record`` when perf can), decoded once to
    Parquet; None when this machine cannot record."""
    d = OUT / "startup-small"
    d.mkdir(parents=True, exist_ok=True)
    (d / "small.c").write_text(PROGRAM)
    if subprocess.run(["gcc", "-O1", "-o", d / "small", d / "small.c"]).returncode:
        return None
    for name in ("a.data", "b.data"):
        out = subprocess.run([*hw, "record", "-o", str(d / name), "--", str(d / "small")],
                             capture_output=True, text=True)  # fmt: skip
        if out.returncode:
            print(f"hwtrace record failed: {out.stderr.strip()[-300:]}")
            return None
    shutil.rmtree(d / "dec", ignore_errors=True)
    subprocess.run([*hw, "decode", "-i", str(d / "a.data"), "-o", str(d / "dec")],
                   capture_output=True, check=True)  # fmt: skip
    perf = shutil.which("perf")
    if perf:
        subprocess.run([perf, "record", "-q", "-k", "CLOCK_MONOTONIC", "-e",
                        "syscalls:sys_enter_write", "-o", str(d / "ev.data"), "--",
                        str(d / "small")], capture_output=True)  # fmt: skip
    hardware_inputs(d)
    return d


def hardware_inputs(d: Path) -> None:
    """What this machine cannot record, made as the hardware would have
    written it: a KVM host's Intel PT of two pCPUs (hwtrace's VM
    scenario), 40 PTWRITE events, a perf.data of Intel BTS records."""
    import numpy as np

    from hwtrace.analysis.vmgen import mixed_scenario
    from hwtrace.hwevents.bts import encode_bts
    from hwtrace.hwevents.ptw import MAX_WORDS, encode_events
    from hwtrace.perf.writer import PerfDataWriter

    for pcpu, data in mixed_scenario().streams().items():
        (d / f"vm{pcpu}.pt").write_bytes(data)
    ids = np.ones(40, np.uint64)
    words = np.zeros((40, MAX_WORDS), np.uint64)
    words[:, 0] = np.arange(40)
    times = 1000 + 10 * np.arange(40)
    (d / "ptw.pt").write_bytes(encode_events(ids, words, np.ones(40, np.int64), times))
    with PerfDataWriter(d / "bts.data") as w:
        w.set_intel_bts()
        branches = np.full(8, 0x401005, np.uint64), np.full(8, 0x401000, np.uint64)
        w.add_auxtrace(encode_bts(*branches), tid=1)


def command_rows(hw: list[str], d: Path, repeat: int) -> list[tuple[str, str, str, str, str, str]]:
    """Each analysis command and its perf peer: seconds and MB."""
    a, b, ev = str(d / "a.data"), str(d / "b.data"), str(d / "ev.data")
    perf = shutil.which("perf")
    has_events = (d / "ev.data").is_file()
    cases = [
        ("script", ["script", "-i", a], ["script", "-i", a, "--itrace=i0ns"]),
        ("report", ["report", "-i", a], ["report", "-i", a, "--stdio"]),
        ("latency", ["latency", "-i", a, "--toggle", "work"], None),
        ("funclatency", ["funclatency", "-i", a, "work"], None),
        ("diff", ["diff", a, b], ["diff", a, b]),
        ("query", ["query", str(d / "dec"), "select count(*) from blocks"], None),
        ("perf-dump", ["perf-dump", a], ["report", "-D", "-i", a]),
    ]
    if has_events:
        cases.append(("events", ["events", "-i", a, ev], ["script", "-i", ev]))
        expr = "fd == 1 || count > 5"  # (perf has no filter of recorded events: its listing)
        cases += [
            ("filter", ["filter", expr, ev], ["script", "-i", ev]),
            ("filter --tier lttng", ["filter", "--tier", "lttng", expr, ev], ["script", "-i", ev]),
        ]
    step = str(d / "step.data")
    cases.append(("record --backend step",
                  ["record", "--backend", "step", "-f", "main", "-o", step, "--", str(d / "small")],
                  None))  # fmt: skip
    vm = [x for p in sorted(d.glob("vm*.pt")) for x in ("--cpu", f"{p.stem[2:]}={p}")]
    cases += [
        ("characterize", ["characterize", "-i", a], None),
        ("vm", ["vm", *vm, "--mtc-freq", "3", "--cpuid-0x15.eax", "1", "--cpuid-0x15.ebx", "2"],
         None),
        ("ptwrite", ["ptwrite", str(d / "ptw.pt")], None),
        ("bts", ["bts", "-i", str(d / "bts.data")], ["script", "-i", str(d / "bts.data")]),
    ]  # fmt: skip
    rows = []
    for name, mine, theirs in cases:
        for args in (mine, mine):  # the first run may add loops to the library
            t, mem = measure([*hw, *args], 1)
        t, mem = measure([*hw, *args], repeat)
        peer = ("", "")
        if perf and theirs:
            pt, pmem = measure([perf, *theirs], repeat)
            peer = (f"{pt:.3f}", f"{pmem / 2**20:.0f}")
        rows.append((f"hwtrace {name}", f"{t:.3f}", f"{mem / 2**20:.0f}", *peer, "< 0.3 s, 100 MB"))
    return rows


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


CONFORMANCE = Path(__file__).resolve().parents[2] / "shared" / "conformance" / "libipt"


def ptxed_rows(hw: list[str], repeat: int) -> list[tuple[str, float, float | None]]:
    """``hwtrace ptxed`` on a case of Intel's conformance suite (a trace and
    the code it runs), beside libipt's instruction decoder in a C loop
    (``bench/libipt/ptflow_loop.c``, one run: a whole process, as a ptxed
    run is); none when the suite is not there."""
    manifest = CONFORMANCE / "manifest.json"
    if not manifest.is_file():
        return []
    import json

    case = next(c for c in json.loads(manifest.read_text())["cases"] if c["name"] == "ptet")
    pt, code = CONFORMANCE / "cases" / case["pt"], CONFORMANCE / "cases" / case["bin"]
    org = int(case["org"], 0)
    mine = [*hw, "ptxed", "--raw", f"{code}:{org:#x}", *case["ptxed"]["args"], "--pt", str(pt)]
    loop = build_peer("ptflow_loop")
    theirs = [str(loop), str(pt), "--raw", f"{code}:0:{code.stat().st_size}:{org:#x}",
              "--decoder", "insn", "--repeat", "1"]  # fmt: skip
    return [
        (f"hwtrace ptxed ({case['name']})", best(mine, repeat), 0.3),
        (f"libipt pt_insn_next loop ({case['name']})", best(theirs, repeat), None),
    ]


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

    small = recordings(hw)
    if small is not None:
        common.print_table(
            f"Commands on a small recording ({small}), wall clock, best of {args.repeat}",
            ("command", "seconds", "MB", "perf s", "perf MB", "target"),
            command_rows(hw, small, args.repeat),
            width=100,
        )
        print()
    py = sys.executable
    rows = [
        ("python -c pass", best([py, "-c", "pass"], args.repeat), None),
        ("python -c 'import numpy'", best([py, "-c", "import numpy"], args.repeat), None),
        ("python -c 'import numba'", best([py, "-c", "import numba"], args.repeat), None),
        ("hwtrace --help", best([*hw, "--help"], args.repeat), 0.15),
        ("hwtrace ptdump (1 KiB)", best([*hw, "ptdump", str(trace)], args.repeat), 0.1),
    ]
    intel = shutil.which("ptdump")
    if intel:
        rows.append(("Intel ptdump (1 KiB)", best([intel, str(trace)], args.repeat), None))
    else:
        loop = build_peer("ptpkt_loop")
        cmd = [str(loop), str(trace), "--repeat", "1"]
        rows.append(("libipt pt_pkt_next loop (1 KiB)", best(cmd, args.repeat), None))
    rows += ptxed_rows(hw, args.repeat)
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
    if small is not None:
        print()
        common.print_table(
            "hwtrace report (small recording): import time by module, ms",
            ("module", "cumulative", "self"),
            import_costs(["-m", "hwtrace.cli.main", "report", "-i", str(small / "a.data")]),
            width=90,
            title_justify="left",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
