"""hwtrace's virtual STM + ETB: per-event cost, and loss / stall as the ETB's
size and the event rate vary (Vergé et al. 2017, §3.1).

(a) Per-event cost.  One C program (bench/stm/stm_bench.c, gcc -O2)
records N events of two 64-bit words in a loop, in one run: the loop
alone (the floor), hwtrace's software PTW channel (drained whole while it
runs, as bench_channel.py does), hwtrace's virtual STM (``hwtrace_stm_emit``:
STPv2 packets into a shared-memory ETB drained by a Python consumer every
0.5 ms and whenever a stalled producer asks) with the stall and the drop
policy, each with a 4 KiB ETB (real ETBs' size) and a 1 MiB one (the
producer's own cost, the consumer never the bottleneck), and an LTTng-UST
tracepoint with the same two fields.  ns per event over the loop, best of
R runs; the STM's kept events are decoded and counted.

(b) Loss and stall.  The same program emits the paper's event (one 24-bit
integer, a D32MTS packet) paced at 1e4..1e7 events/s for a fixed time,
into ETBs of 1..64 KiB drained by the Python consumer every millisecond
(and, with the stall policy, when a producer finds the ETB full): the
fraction of events lost (drop) and the producer's time spent stalled
(stall), measured, next to :func:`hwtrace.hwevents.vstm.simulate_etb`
with the consumer's cost fitted from the same runs.  A table, a JSON file
and a self-contained SVG plot go to bench/out/stm/.

    python bench/bench_stm.py [--events N] [--repeat R] [--duration S]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import common
import numpy as np

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "stm"
sys.path.insert(0, str(HERE.parent / "src"))

import bench_channel  # noqa: E402

from hwtrace.hwevents.vstm import VirtualStm, header_path, simulate_etb  # noqa: E402

PAPER = [
    "Fig. 3 (Pandaboard, 1e7 events, 24-bit payload): STM + ETB cuts LTTng-UST's tracing delay by about 91 %",
    "Fig. 5 (Beagleboard): ETM + ETB loses events above about 1e5 events/s (ETB full, not drained in time)",
    "§2.2 design: with the STM, a full ETB makes the producer stop and yield to the consumer; nothing is lost",
]
SIZES = (1024, 4096, 16384, 65536)
RATES = (1e4, 3e4, 1e5, 3e5, 1e6, 3e6, 1e7)
PERIOD = 1e-3  # the consumer's sleep in (b)


def build() -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    exe = OUT / "stm_bench"
    src = HERE / "stm" / "stm_bench.c"
    subprocess.run(["gcc", "-O2", f"-I{HERE / 'channel'}", f"-I{header_path().parent}", "-o", str(exe),
                    str(src), "-llttng-ust", "-ldl"], check=True)  # fmt: skip
    return str(exe)


# -- (a) per-event cost --------------------------------------------------------


def with_stm(exe: str, n: int, size: int, policy: str) -> dict:
    with VirtualStm(size, policy) as stm:
        stm.start(5e-4)
        try:
            ns = bench_channel.run_mode(exe, n, 3, dict(os.environ, **stm.env()))
        finally:
            stm.stop()
        c = stm.counters()
        ev = stm.events()
    c.update(ns=ns, decoded=len(ev), complete=int(ev.complete.sum()))
    if c["decoded"] != c["events"] or c["complete"] != c["decoded"]:
        raise common.BenchError(
            f"STM {policy} {size}: {c['events']} written, {c['decoded']} decoded"
        )
    return c


def per_event(exe: str, n: int, repeat: int) -> tuple[list[tuple[str, ...]], dict]:
    env = dict(os.environ)
    floor = min(bench_channel.run_mode(exe, n, 0, env) for _ in range(repeat))
    chan = min((bench_channel.with_channel(exe, n) for _ in range(repeat)), key=lambda r: r[0])
    stm = {}
    for policy in ("stall", "drop"):
        for size in (4096, 1 << 20):
            stm[policy, size] = min(
                (with_stm(exe, n, size, policy) for _ in range(repeat)), key=lambda r: r["ns"]
            )
    lt, said = None, "LTTng is not installed (Debian: lttng-tools liblttng-ust-dev)"
    if shutil.which("lttng") is not None:
        with common.session_daemon(OUT / "sessiond.log"):
            session = f"hwbench-stm-{os.getpid()}"
            common.lttng("create", session, f"--output={OUT / 'lttng-trace'}")
            try:
                common.lttng("enable-event", "--userspace", "hwbench:ev", f"--session={session}")
                common.lttng("start", session)
                lt = min(bench_channel.run_mode(exe, n, 2, env) for _ in range(repeat))
                stopped = common.lttng("stop", session)
                said = (stopped.stdout + stopped.stderr).strip().replace("\n", " ")
            finally:
                common.lttng("destroy", session, check=False)
            shutil.rmtree(OUT / "lttng-trace", ignore_errors=True)

    def vs_lttng(ns: float) -> str:
        if lt is None:
            return "-"
        ratio = (ns - floor) / max(lt - floor, 1e-9)
        return (
            f"{100 * (1 - ratio):.0f} % less than LTTng"
            if ratio <= 1
            else f"{ratio:.1f}x LTTng's cost"
        )

    rows = [("loop alone", f"{floor:.2f}", "-", "-", "-"),
            ("hwtrace PTW channel", f"{chan[0]:.2f}", f"{chan[0] - floor:.2f}", f"{chan[1]:,} kept, {chan[2]:,} lost",
             vs_lttng(chan[0]))]  # fmt: skip
    for (policy, size), c in stm.items():
        what = f"{c['events']:,} kept"
        what += (
            f", {c['stalls']:,} stalls, {c['stall_ns'] / 1e6:.0f} ms"
            if policy == "stall"
            else f", {c['dropped']:,} dropped"
        )
        rows.append((f"hwtrace STM {policy}, {size // 1024} KiB ETB", f"{c['ns']:.2f}", f"{c['ns'] - floor:.2f}", what,
                     vs_lttng(c["ns"])))  # fmt: skip
    if lt is not None:
        rows.append(("LTTng-UST tracepoint", f"{lt:.2f}", f"{lt - floor:.2f}", "-", "-"))
    result = {"events": n, "repeat": repeat, "floor_ns": floor, "ptw_channel_ns": chan[0], "ptw_kept": chan[1],
              "ptw_lost": chan[2], "lttng_ns": lt, "lttng_stop": said,
              "stm": {f"{p}-{s}": c for (p, s), c in stm.items()}}  # fmt: skip
    return rows, result


# -- (b) loss and stall ---------------------------------------------------------


def paced(exe: str, size: int, policy: str, rate: float, duration: float) -> dict:
    n = max(int(rate * duration), 1)
    with VirtualStm(size, policy, keep=False) as stm:
        stm.start(PERIOD)
        try:
            out = subprocess.run([exe, str(n), "4", repr(rate)], env=dict(os.environ, **stm.env()),
                                 capture_output=True, text=True, check=True, timeout=120)  # fmt: skip
        finally:
            stm.stop()
        c = stm.counters()
        drain_s, sleeps = stm.drain_s, stm.sleeps
    elapsed, hz = (float(x) for x in out.stdout.split())
    if c["events"] + c["dropped"] != n:
        raise common.BenchError(f"{policy} {size} {rate:g}: {c['events']} + {c['dropped']} != {n}")
    return {"size": size, "policy": policy, "rate": rate, "attempted": n, "written": c["events"],
            "dropped": c["dropped"], "loss": c["dropped"] / n, "stalls": c["stalls"], "stall_s": c["stall_ns"] / 1e9,
            "stall_fraction": c["stall_ns"] / 1e9 / elapsed, "elapsed_s": elapsed, "nominal_s": n / rate,
            "bytes": c["bytes"], "event_bytes": (c["bytes"] - 13) / max(c["events"], 1), "drains": c["drains"],
            "drain_s": drain_s, "tsc_hz": hz, "sleeps": sleeps}  # fmt: skip


def calibrate(runs: list[dict]) -> dict:
    """The consumer's costs for the model, from the measured runs: a drain
    takes overhead + bytes / rate (least squares over every run); its cycle
    is the sleep plus the drain (the lowest-rate drop run: elapsed / drains);
    a stalled producer waits for the consumer's wake-up plus one drain of a
    full ETB (median over the stall runs that stalled)."""
    a = np.array([[r["drains"], r["bytes"]] for r in runs if r["drains"]], float)
    b = np.array([r["drain_s"] for r in runs if r["drains"]], float)
    (overhead, per_byte), *_ = np.linalg.lstsq(a, b, rcond=None)
    overhead, per_byte = max(overhead, 1e-7), max(per_byte, 1e-12)
    low = min(
        (r for r in runs if r["policy"] == "drop" and r["size"] == max(SIZES)),
        key=lambda r: r["rate"],
    )
    period = max(low["elapsed_s"] / max(low["drains"], 1) - overhead, PERIOD)
    waits = [r["stall_s"] / r["stalls"] - (overhead + r["size"] * per_byte) for r in runs
             if r["policy"] == "stall" and r["stalls"] >= 10]  # fmt: skip
    latency = float(np.median(waits)) if waits else 50e-6
    return {"drain_overhead_s": float(overhead), "drain_rate_Bps": float(1 / per_byte), "drain_period_s": float(period),
            "wake_latency_s": max(latency, 0.0)}  # fmt: skip


def model(rate: float, size: int, policy: str, event_bytes: float, cal: dict, event_cost: float,
          duration: float, sleeps) -> dict:  # fmt: skip
    return simulate_etb(rate, event_bytes, size, cal["drain_period_s"], cal["drain_rate_Bps"], policy, duration,
                        drain_overhead_s=cal["drain_overhead_s"], wake_latency_s=cal["wake_latency_s"],
                        event_cost_s=event_cost, sleeps=sleeps)  # fmt: skip


# -- the plot -------------------------------------------------------------------

_COLOURS = {1024: "#d62728", 4096: "#ff7f0e", 16384: "#2ca02c", 65536: "#1f77b4"}


def _esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def svg_plot(runs: list[dict], curves: dict, path: Path, note: str) -> None:
    """Two panels (loss under drop, stall time under stall) against the
    event rate (log scale): model lines, measured dots."""
    w, h = 1000, 520
    pw, ph, top = 400, 320, 70
    lefts = (70, 560)
    lo, hi = 4.0, 7.0
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
           'font-family="sans-serif" font-size="12">', f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="24" text-anchor="middle" font-size="16">hwtrace virtual STM + ETB: '
           'events lost (drop) and producer stalled (stall) vs event rate and ETB size</text>']  # fmt: skip
    panels = (("drop", "loss", "events lost (drop policy), %"),
              ("stall", "stall_fraction", "producer time stalled (stall policy), %"))  # fmt: skip
    for (policy, key, label), x0 in zip(panels, lefts, strict=True):

        def px(rate: float, x0: int = x0) -> float:
            return x0 + (np.log10(rate) - lo) / (hi - lo) * pw

        def py(frac: float) -> float:
            return top + ph - min(max(frac, 0.0), 1.0) * ph

        out.append(
            f'<rect x="{x0}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>'
        )
        for e in range(4, 8):
            x = px(10.0**e)
            out.append(
                f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#ddd"/>'
            )
            out.append(f'<text x="{x:.1f}" y="{top + ph + 16}" text-anchor="middle">1e{e}</text>')
        for p in range(0, 101, 20):
            y = py(p / 100)
            out.append(f'<line x1="{x0}" y1="{y:.1f}" x2="{x0 + pw}" y2="{y:.1f}" stroke="#eee"/>')
            out.append(f'<text x="{x0 - 6}" y="{y + 4:.1f}" text-anchor="end">{p}</text>')
        out.append(
            f'<text x="{x0 + pw / 2}" y="{top + ph + 36}" text-anchor="middle">events per second</text>'
        )
        out.append(
            f'<text x="{x0 + pw / 2}" y="{top - 10}" text-anchor="middle" font-size="13">{_esc(label)}</text>'
        )
        x = px(1e5)
        out.append(
            f'<line x1="{x:.1f}" y1="{top}" x2="{x:.1f}" y2="{top + ph}" stroke="#777" stroke-dasharray="5,4"/>'
        )
        if policy == "drop":
            out.append(
                f'<text x="{x + 4:.1f}" y="{top + 14}" fill="#555">paper: ETM+ETB loses above ~1e5/s</text>'
            )
        else:
            out.append(
                f'<text x="{x + 4:.1f}" y="{top + 14}" fill="#555">paper: STM stalls, loses nothing</text>'
            )
        for size, colour in _COLOURS.items():
            pts = curves.get((policy, size), [])
            if pts:
                d = " ".join(
                    f"{'M' if i == 0 else 'L'}{px(r):.1f},{py(v):.1f}"
                    for i, (r, v) in enumerate(pts)
                )
                out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
            for r in runs:
                if r["policy"] == policy and r["size"] == size:
                    out.append(f'<circle cx="{px(r["rate"]):.1f}" cy="{py(r[key]):.1f}" r="4" fill="{colour}" '
                               'stroke="black" stroke-width="0.5"/>')  # fmt: skip
    ly = top + ph + 60
    for i, (size, colour) in enumerate(_COLOURS.items()):
        x = 70 + i * 150
        out.append(
            f'<line x1="{x}" y1="{ly}" x2="{x + 24}" y2="{ly}" stroke="{colour}" stroke-width="2"/>'
        )
        out.append(
            f'<circle cx="{x + 12}" cy="{ly}" r="4" fill="{colour}" stroke="black" stroke-width="0.5"/>'
        )
        out.append(f'<text x="{x + 30}" y="{ly + 4}">ETB {size // 1024} KiB</text>')
    out.append(
        f'<text x="670" y="{ly + 4}" fill="#333">lines: model (simulate_etb); dots: measured</text>'
    )
    for i, line in enumerate([note, *PAPER[:2]]):
        out.append(
            f'<text x="70" y="{ly + 26 + 16 * i}" fill="#333" font-size="11">{_esc(line)}</text>'
        )
    out.append("</svg>")
    path.write_text("\n".join(out) + "\n")


# -- main -----------------------------------------------------------------------


def run() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=0.2, help="seconds per paced run in (b)")
    args = ap.parse_args()
    t_start = time.perf_counter()
    exe = build()
    n = args.events

    rows, cost = per_event(exe, n, args.repeat)
    if cost["lttng_ns"] is not None:
        print(f"lttng stop: {cost['lttng_stop']}")
    common.print_table(f"{n:,} events of two 64-bit words, one thread (best of {args.repeat}), {common.cpu_model()}",
                       ("", "ns/event", "over the loop", "", "vs LTTng-UST"), rows, width=130)  # fmt: skip

    runs = [paced(exe, size, policy, rate, args.duration) for policy in ("drop", "stall") for size in SIZES
            for rate in RATES]  # fmt: skip
    cal = calibrate(runs)
    event_cost = max(cost["stm"][f"stall-{1 << 20}"]["ns"] * 1e-9, 1e-9)
    big = sorted(
        (r for r in runs if r["size"] == max(SIZES) and r["policy"] == "stall"),
        key=lambda r: r["rate"],
    )
    lr, eb = np.log10([r["rate"] for r in big]), [r["event_bytes"] for r in big]

    def bytes_at(rate: float) -> float:
        return float(np.interp(np.log10(rate), lr, eb))

    pooled = np.concatenate([r["sleeps"] for r in runs if r["sleeps"]] or [[PERIOD]])
    np.random.default_rng(0).shuffle(pooled)
    table = []
    for r in runs:
        m = model(
            r["rate"],
            r["size"],
            r["policy"],
            r["event_bytes"],
            cal,
            event_cost,
            args.duration,
            r["sleeps"],
        )
        r["model"] = m
        if r["policy"] == "drop":
            table.append((f"drop  {r['size'] // 1024:>2} KiB", f"{r['rate']:.0e}", f"{r['event_bytes']:.1f}",
                          f"{100 * r['loss']:.1f}", f"{100 * m['loss']:.1f}", "", ""))  # fmt: skip
        else:
            table.append((f"stall {r['size'] // 1024:>2} KiB", f"{r['rate']:.0e}", f"{r['event_bytes']:.1f}",
                          f"{r['stalls']:,}", "", f"{100 * r['stall_fraction']:.1f}",
                          f"{100 * m['stall_fraction']:.1f}"))  # fmt: skip
    print()
    sl = np.array(pooled) * 1e3
    print(
        f"Consumer (fitted): drain = {cal['drain_overhead_s'] * 1e6:.1f} us + {1e9 * 1024 / cal['drain_rate_Bps']:.0f} "
        f"ns/KiB; wake-up on full {cal['wake_latency_s'] * 1e6:.1f} us; its {PERIOD * 1e3:g} ms sleeps took "
        f"{np.median(sl):.2f} ms median, {np.percentile(sl, 99):.2f} ms p99, {sl.max():.1f} ms max "
        f"({len(sl):,} sleeps); producer {event_cost * 1e9:.0f} ns/event; load average {os.getloadavg()[0]:.1f}"
    )
    common.print_table(f"Paced D32 events for {args.duration:g} s, consumer every {PERIOD * 1e3:g} ms: measured vs model",
                       ("ETB", "events/s", "B/event", "lost % (drop) / stalls", "model lost %", "stalled % of time",
                        "model stalled %"), table, width=130)  # fmt: skip

    grid = np.logspace(4, 7, 31)
    curves: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for policy, key in (("drop", "loss"), ("stall", "stall_fraction")):
        for size in SIZES:
            curves[policy, size] = [(float(g), model(g, size, policy, bytes_at(g), cal, event_cost, args.duration,
                                                     pooled)[key]) for g in grid]  # fmt: skip
    note = (
        f"consumer: Python thread, {PERIOD * 1e3:g} ms sleeps (model: the measured ones), drain "
        f"{cal['drain_overhead_s'] * 1e6:.0f} us (fitted); {args.duration:g} s per point; {common.cpu_model()}"
    )
    svg_plot(runs, curves, OUT / "loss_stall.svg", note)
    elapsed = time.perf_counter() - t_start
    for r in runs:
        sl = r.pop("sleeps")
        r["sleep_ms_median"] = float(np.median(sl) * 1e3) if sl else None
        r["sleep_ms_max"] = float(max(sl) * 1e3) if sl else None
    result = {"per_event": cost, "paced": runs, "calibration": cal, "event_cost_s": event_cost,
              "paper": PAPER, "cpu": common.cpu_model(), "bench_seconds": elapsed}  # fmt: skip
    (OUT / "results.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    print("Paper (§3.1):")
    for p in PAPER:
        print(f"  {p}")
    print(f"Wrote {OUT / 'results.json'} and {OUT / 'loss_stall.svg'}; {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(common.bench_main("bench_stm", run, interrupted="nothing left running"))
