"""``hwtrace vm``: which vCPU and guest process ran when, from a KVM host's
Intel PT alone (HAVAna; see :mod:`hwtrace.analysis.vm`)."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..pt.config import PtConfig
from .common import command_parser, input_file, output_dir, output_file

PROG = "hwtrace vm"


def main(argv: Sequence[str]) -> int:
    """Analyse a KVM host's Intel PT (system-wide mode: PIP, VMCS and timing packets) per
    physical CPU: vCPU states (VM, VMM, IDLE), VM exits, guest processes."""
    p = command_parser(PROG, main)
    p.add_argument("traces", nargs="*", type=input_file, metavar="FILE",
                   help="one raw PT file per pCPU, in order (or vmpt's bundles .xml)")  # fmt: skip
    p.add_argument("-i", "--input", metavar="PERF.DATA",
                   help="a perf.data of perf record -e intel_pt// -a (per-CPU Intel PT, sideband)")  # fmt: skip
    p.add_argument("--cpu", action="append", default=[], metavar="N=FILE",
                   help="the raw PT of pCPU N (repeatable)")  # fmt: skip
    p.add_argument(
        "--mtc-freq", type=int, default=0, metavar="N", help="MTC every 2**N CTC (IA32_RTIT_CTL)"
    )
    p.add_argument("--cpuid-0x15.eax", dest="cpuid_eax", type=int, default=0, metavar="N",
                   help="CPUID 0x15 EAX (the CTC ratio's denominator)")  # fmt: skip
    p.add_argument("--cpuid-0x15.ebx", dest="cpuid_ebx", type=int, default=0, metavar="N",
                   help="CPUID 0x15 EBX (the CTC ratio's numerator)")  # fmt: skip
    p.add_argument("--tsc-hz", type=float, default=0.0, help="TSC frequency, for times in ms")
    p.add_argument(
        "--intervals", type=output_file, metavar="FILE", help="write every interval (.json or .csv)"
    )
    p.add_argument("--html", type=output_file, metavar="FILE", help="write the VM Resource and VM Control Flow "
                   "views as a self-contained HTML time graph")  # fmt: skip
    p.add_argument("--perfetto", type=output_file, metavar="FILE", help="write the views as a Chrome trace-event "
                   "timeline (Perfetto, chrome://tracing)")  # fmt: skip
    p.add_argument("--ctf", type=output_dir, metavar="DIR", help="write the state changes as a CTF trace, and "
                   "DIR.tracecompass.xml, the Trace Compass analysis drawing the two views")  # fmt: skip
    p.add_argument("--bundles", metavar="FILE", help="write vmpt's bundles.xml (with several "
                   "pCPUs, FILE-cpuN.xml each)")  # fmt: skip
    p.add_argument("--top", type=int, default=5, help="longest VM exits listed (default 5)")
    p.add_argument("--window", type=int, default=0, metavar="TICKS",
                   help="contention window (default: a hundredth of the trace)")  # fmt: skip
    a = p.parse_args(list(argv))
    files: dict[int, str] = {}
    for k, path in enumerate(a.traces):
        files[k] = path
    for spec in a.cpu:
        n, sep, path = spec.partition("=")
        if not sep or not n.isdigit():
            p.error(f"--cpu {spec}: expected N=FILE")
        files[int(n)] = path
    if a.input:
        if files:
            p.error("give either a perf.data (-i) or raw PT files, not both")
        return _run_perf(a)
    if not files:
        p.error("give the trace of each pCPU (FILE ... or --cpu N=FILE), or -i perf.data")
    for n, path in files.items():
        try:
            input_file(path)
        except argparse.ArgumentTypeError as e:
            sys.stderr.write(f"{PROG}: pCPU {n}: {e}\n")
            return 1
    config = PtConfig(mtc_freq=a.mtc_freq, cpuid_0x15_eax=a.cpuid_eax, cpuid_0x15_ebx=a.cpuid_ebx)
    from ..analysis.vm import analyze, read_bundles, stream_events, time_resolution

    streams = []
    for n, path in sorted(files.items()):
        if path.endswith(".xml"):
            try:
                streams.append(read_bundles(path, n))
            except ValueError as e:
                sys.stderr.write(f"{PROG}: pCPU {n}: {e}\n")
                return 1
        else:
            streams.append(stream_events(path, n, config))
    result = analyze(streams)
    result.resolution = time_resolution(config)
    return _report(
        a, result, ", ".join(f"pCPU {n}: {Path(f).name}" for n, f in sorted(files.items()))
    )


def _run_perf(a) -> int:
    from ..analysis.vm import analyze_perf
    from ..perf.data import PerfDataError
    from ..session import PerfSession

    try:
        result = analyze_perf(PerfSession.open(a.input, all_calls=True).data)
    except (PerfDataError, OSError, ValueError) as e:
        sys.stderr.write(f"{PROG}: {e}\n")
        return 1
    conv = result.tsc_conversion
    if conv is not None and not a.tsc_hz and getattr(conv, "time_mult", 0):
        # perf's TSC to ns conversion gives the TSC rate.
        a.tsc_hz = 1e9 * (1 << conv.time_shift) / conv.time_mult
    return _report(a, result, Path(a.input).name)


def _report(a, result, names: str) -> int:
    for problem in result.problems:
        sys.stderr.write(f"{PROG}: {problem}\n")
    _summary(result, a.tsc_hz, a.top, a.window)
    if a.intervals:
        _write_intervals(result, a.intervals)
    try:
        if a.html:
            from ..export.html import write_page
            from ..export.vmviews import vm_page

            write_page(a.html, vm_page(result, "hwtrace vm", names, tsc_hz=a.tsc_hz, top=a.top))
        if a.perfetto:
            from ..export.vmviews import write_vm_timeline

            write_vm_timeline(result, a.perfetto, tsc_hz=a.tsc_hz)
        if a.ctf:
            from ..export.vmviews import write_vm_ctf

            write_vm_ctf(result, a.ctf, tsc_hz=a.tsc_hz)
        if a.bundles:
            from ..analysis.vm import write_bundles

            for ev in result.streams:
                out = a.bundles
                if len(result.streams) > 1:
                    out = f"{out[:-4] if out.endswith('.xml') else out}-cpu{ev.pcpu}.xml"
                write_bundles(ev, out)
    except OSError as e:
        sys.stderr.write(f"{PROG}: {e.filename}: {e.strerror}\n")
        return 1
    return 0


def _fmt(ticks: int, hz: float) -> str:
    if not hz:
        return f"{ticks:,} ticks"
    seconds = ticks / hz
    return f"{seconds * 1e3:,.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:,.3f} µs"


def _summary(r, hz: float, top: int, window: int) -> None:
    span = max(r.end - r.start, 1)
    out = sys.stdout
    out.write(f"trace: {len(r.streams)} pCPUs, {_fmt(span, hz)}; {r.stats['vm_exits']:,} VM exits; "
              f"{r.stats['gaps']} gaps\n")  # fmt: skip
    res = r.resolution
    out.write(
        "times: a state change is known to within "
        + (
            f"{_fmt(res, hz)} (one MTC period)\n"
            if res
            else "the timing packets' spacing (no MTC)\n"
        )
    )
    states = r.time_in_states()
    vcpus = sorted(k for (e, k, _) in states if e == "vcpu")
    out.write("\nvCPU (VMCS)       VM        VMM       IDLE      UNKNOWN   exits  longest exit\n")
    exits = r.exits
    for v in vcpus:
        d = states[("vcpu", v, 0)]
        total = max(sum(d.values()), 1)
        mine = exits[exits[:, 0] == v] if exits.shape[0] else exits
        ticks = (
            (mine[:, 2].astype(np.int64) - mine[:, 1].astype(np.int64))
            if mine.shape[0]
            else np.zeros(0)
        )
        cells = "".join(
            f"{100 * d.get(s, 0) / total:8.1f}% " for s in ("VM", "VMM", "IDLE", "UNKNOWN")
        )
        longest = _fmt(int(ticks.max()), hz) if ticks.shape[0] else "-"
        name = r.names.get(("vcpu", v), "")
        out.write(f"{v:#14x}  {cells}{ticks.shape[0]:6}  {longest:>14}  {name}\n")
    vms = sorted(k for (e, k, _) in states if e == "vm")
    if vms:
        out.write("\nVM (VMM CR3)    vCPUs  VMM time\n")
        for vm in vms:
            d = states[("vm", vm, 0)]
            total = max(sum(d.values()), 1)
            n = sum(1 for m in r.vcpu_vm.values() if m == vm)
            out.write(
                f"{vm:#14x}  {n:5}  {_fmt(d.get('VMM', 0), hz)} ({100 * d.get('VMM', 0) / total:.1f}%)\n"
            )
    if exits.shape[0]:
        ticks = exits[:, 2].astype(np.int64) - exits[:, 1].astype(np.int64)
        out.write("\nVM exit durations (VMM time until the next entry or the vCPU left)\n")
        edges = 2 ** np.arange(0, int(np.log2(max(int(ticks.max()), 1))) + 2)
        hist, _ = np.histogram(ticks, bins=np.r_[0, edges])
        for lo, hi, c in zip(np.r_[0, edges[:-1]], edges, hist, strict=True):
            if c:
                out.write(
                    f"  {_fmt(int(lo), hz):>16} - {_fmt(int(hi), hz):<16} {c:8,} {'#' * int(40 * c / hist.max())}\n"
                )
        reasons = r.exit_reasons
        if reasons is not None and (reasons >= 0).any():
            codes, counts = np.unique(reasons[reasons >= 0], return_counts=True)
            parts = [f"{r.reason_names.get(int(c), int(c))} {int(n):,}" for c, n in
                     sorted(zip(codes, counts, strict=True), key=lambda x: -x[1])]  # fmt: skip
            out.write("exit reasons (kvm:kvm_exit): " + ", ".join(parts) + "\n")
        order = np.argsort(-ticks)[:top]
        out.write(f"longest {len(order)} exits:\n")
        for j in order:
            out.write(f"  vCPU {int(exits[j, 0]):#x} at {int(exits[j, 1]):,}: "
                      f"{_fmt(int(ticks[j]), hz)} {r.exit_reason(int(j))}".rstrip() + "\n")  # fmt: skip
    window = window or max(1, span // 100)
    cont = r.contention(window)
    if any(c.any() for c in cont.values()):
        out.write(f"\ncontention: distinct vCPUs run per pCPU in windows of {_fmt(window, hz)}\n")
        for pcpu, c in sorted(cont.items()):
            busy = c[c > 0]
            if busy.shape[0]:
                out.write(f"  pCPU {pcpu}: up to {int(c.max())}, mean {busy.mean():.2f} where any ran, "
                          f"{100 * (c >= 2).mean():.1f}% of windows with 2 or more\n")  # fmt: skip
    per = {(vm, cr3): d.get("VM", 0) for (e, vm, cr3), d in states.items() if e == "process"}
    if per:
        out.write("\nguest process (VM = VMM CR3, CR3)        VM time   share of its VM\n")
        for vm in sorted({k[0] for k in per}):
            total = sum(v for k, v in per.items() if k[0] == vm)
            for (v1, cr3), t in sorted(per.items(), key=lambda kv: -kv[1]):
                if v1 == vm:
                    out.write(f"  {vm:#12x} {cr3:#14x}   {_fmt(t, hz):>14}   "
                              f"{100 * t / max(total, 1):6.1f}%\n")  # fmt: skip


def _write_intervals(r, path: str) -> None:
    from ..analysis.vm import ENTITY_NAMES, STATE_NAMES

    iv = r.intervals
    rows = [
        {"entity": ENTITY_NAMES[e], "key": int(k1), "key2": int(k2), "state": STATE_NAMES[s],
         "start": int(t0), "end": int(t1), "pcpu": int(pc)}
        for e, k1, k2, s, t0, t1, pc in zip(iv["entity"], iv["key"], iv["key2"], iv["state"],
                                            iv["start"], iv["end"], iv["pcpu"], strict=True)
    ]  # fmt: skip
    try:
        with open(path, "w", newline="") as f:
            if path.endswith(".csv"):
                w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["entity"])
                w.writeheader()
                w.writerows(rows)
            else:
                json.dump({"start": r.start, "end": r.end, "intervals": rows}, f)
    except OSError as e:
        sys.stderr.write(f"{PROG}: {path}: {e.strerror}\n")
        raise SystemExit(1) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:]))
