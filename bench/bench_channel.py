"""Per-event cost of hwtrace's software PTW channel against LTTng-UST.

One C program (bench/channel/channel_bench.c, gcc -O2) records N events of
two 64-bit words in a loop, three ways in this run: the loop alone (the
floor), ``hwtrace_emit`` into the channel (a TSC and three PTW packets
per event into the thread's shared-memory sub-buffers, drained whole by
hwtrace while the program runs), and an LTTng-UST tracepoint with the
same two fields, enabled in a session (LTTng's ring buffer, consumed by
its consumer daemon).  ns per event over the loop, best of R runs; the
events the channel kept are decoded and counted.

    python bench/bench_channel.py [--events N] [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import common

HERE = Path(__file__).resolve().parent
OUT = HERE / "out" / "channel"
sys.path.insert(0, str(HERE.parent / "src"))

from hwtrace.hwevents.channel import Channel, header_path  # noqa: E402
from hwtrace.hwevents.ptw import decode_events  # noqa: E402


def build() -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    exe = OUT / "channel_bench"
    src = HERE / "channel" / "channel_bench.c"
    subprocess.run(["gcc", "-O2", f"-I{HERE / 'channel'}", f"-I{header_path().parent}", "-o", str(exe),
                    str(src), "-llttng-ust", "-ldl"], check=True)  # fmt: skip
    return str(exe)


def run_mode(exe: str, n: int, mode: int, env: dict[str, str]) -> float:
    out = subprocess.run(
        [exe, str(n), str(mode)], capture_output=True, text=True, env=env, check=True
    )
    return float(out.stdout.strip())


def with_channel(exe: str, n: int) -> tuple[float, int, int]:
    files: dict[int, object] = {}

    def write(tid: int, view) -> None:
        f = files.get(tid)
        if f is None:
            f = files[tid] = open(OUT / f"channel-{tid}.pt", "wb")
        f.write(view)

    with Channel(areas=4, nsub=16, sub_size=1 << 20) as ch:
        stop = threading.Event()

        def drain() -> None:
            while not stop.is_set():
                ch.drain(write)
                stop.wait(0.0005)

        t = threading.Thread(target=drain)
        t.start()
        try:
            ns = run_mode(exe, n, 1, dict(os.environ, **ch.env()))
        finally:
            stop.set()
            t.join()
        ch.drain(write)
        lost = sum(s["lost"] for s in ch.stats().values())
    for f in files.values():
        f.close()
    kept = sum(len(decode_events(OUT / f"channel-{tid}.pt")) for tid in files)
    for tid in files:
        (OUT / f"channel-{tid}.pt").unlink()
    return ns, kept, lost


def run() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if shutil.which("lttng") is None:
        raise common.BenchError("lttng is not installed (Debian: lttng-tools liblttng-ust-dev)")
    exe = build()
    n = args.events
    env = dict(os.environ)
    floor = min(run_mode(exe, n, 0, env) for _ in range(args.repeat))
    chan = min((with_channel(exe, n) for _ in range(args.repeat)), key=lambda r: r[0])
    with common.session_daemon(OUT / "sessiond.log"):
        session = f"hwbench-{os.getpid()}"
        common.lttng("create", session, f"--output={OUT / 'lttng-trace'}")
        try:
            common.lttng("enable-event", "--userspace", "hwbench:ev", f"--session={session}")
            common.lttng("start", session)
            lt = min(run_mode(exe, n, 2, env) for _ in range(args.repeat))
            stopped = common.lttng("stop", session)
            said = (stopped.stdout + stopped.stderr).strip().replace("\n", " ")
        finally:
            common.lttng("destroy", session, check=False)
    rows = [
        ("loop alone", f"{floor:.2f}", "-", "-"),
        ("hwtrace PTW channel", f"{chan[0]:.2f}", f"{chan[0] - floor:.2f}", f"{chan[1]:,} kept, {chan[2]:,} lost"),
        ("LTTng-UST tracepoint", f"{lt:.2f}", f"{lt - floor:.2f}", f"{(lt - floor) / max(chan[0] - floor, 1e-9):.2f}x the channel"),
    ]  # fmt: skip
    print(f"lttng stop: {said}")
    common.print_table(f"{n:,} events of two 64-bit words, one thread (best of {args.repeat})",
                       ("", "ns/event", "over the loop", ""), rows, width=110)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(common.bench_main("bench_channel", run, interrupted="nothing left running"))
