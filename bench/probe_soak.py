"""Live safety of hwtrace's dynamic tracepoints: a soak run.

A multithreaded C program (tests/data/probe_workload.c) runs the traced
functions on every CPU while hwtrace inserts and removes tracepoints at
many sites of them, jumps and traps, counting and recording, ``--cycles``
times (default 100,000).  Then ``hwtrace probe`` processes are killed with
SIGKILL at random moments while they insert (``--kills`` times).  At the
end every thread's checksum must equal what an untraced run of as many
calls gives, the program's code must be byte for byte what it was, and no
mapping may be left behind by the sessions that closed normally.

    .venv/bin/python bench/probe_soak.py [--cycles N] [--kills K] [--threads T]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "probes"))

from test_probe_live import Target  # noqa: E402

from hwtrace.probes import TRAP, ProbeSession  # noqa: E402

SITES = ["work", "work+0x7", "shorties", "shorties+0x1", "shorties+0x4", "loop_into_window",
         "loop_into_window+0x2", "red_zone+0x5", "red_zone+0xe", "depth", "jumper",
         "thrower"]  # fmt: skip


def build(out: Path) -> Path:
    exe = out / "workload"
    src = ROOT / "tests" / "data" / "probe_workload.c"
    subprocess.run(["gcc", "-O2", "-g", "-o", str(exe), str(src), "-lpthread"], check=True)
    return exe


def check_threads(exe: Path, per_thread: list[list[str]]) -> None:
    check = Target(exe, threads=1)
    try:
        for _, k, n, checksum in per_thread:
            check.send(f"sum {k} {n}")
            got = check.proc.stdout.readline().split()
            if got != ["sum", checksum]:
                raise SystemExit(f"thread {k}: checksum {checksum}, untraced gives {got[1]}")
    finally:
        check.close()


def soak(exe: Path, cycles: int, threads: int, seed: int) -> dict:
    rng = random.Random(seed)
    target = Target(exe, threads)
    code, maps = target.code(), target.maps()
    kinds: dict[str, int] = {}
    t0 = time.perf_counter()
    with ProbeSession(target.pid) as s:
        target.send("spin")
        assert target.proc.stdout.readline().strip() == "spinning"
        live = []
        for i in range(cycles):
            # Up to three tracepoints at once, of every kind, some kept a while.
            spec = rng.choice(SITES)
            returns = spec in ("depth", "jumper", "thrower") and rng.random() < 0.5
            try:
                tp = s.add(spec, kind=TRAP if rng.random() < 0.1 else None,
                           record=rng.random() < 0.2, returns=returns)  # fmt: skip
            except Exception as e:
                if "too close" not in str(e):
                    raise
                tp = None
            if tp is not None:
                kinds[tp.kind + (" entry/exit" if tp.returns else "")] = (
                    kinds.get(tp.kind + (" entry/exit" if tp.returns else ""), 0) + 1
                )
                live.append(tp)
            while len(live) > rng.randint(0, 3):
                s.remove(live.pop(rng.randrange(len(live))))
            if i % 500 == 499:
                s.drain()
                s.reclaim()
            if i % 10000 == 9999:
                print(f"  {i + 1} cycles, {time.perf_counter() - t0:.0f} s", flush=True)
        target.send("stop")
        _, calls = target.result()
        per_thread = [target.proc.stdout.readline().split() for _ in range(threads)]
        traps = s.trap_counts()
    elapsed = time.perf_counter() - t0
    same_code, same_maps = target.code() == code, target.maps() == maps
    target.close()
    check_threads(exe, per_thread)
    if not (same_code and same_maps):
        raise SystemExit(f"code restored: {same_code}, mappings restored: {same_maps}")
    return {"cycles": cycles, "seconds": elapsed, "tracepoints": kinds, "calls": calls,
            "traps_redirected": traps[0], "code_restored": same_code,
            "maps_restored": same_maps, "checksums": "equal to untraced"}  # fmt: skip


def kills(exe: Path, count: int, threads: int, seed: int) -> dict:
    rng = random.Random(seed)
    target = Target(exe, threads)
    target.send("spin")
    assert target.proc.stdout.readline().strip() == "spinning"
    delays = []
    for _ in range(count):
        delay = rng.uniform(0.0, 0.6)  # start-up is ~0.3 s: before, during and after inserting
        p = subprocess.Popen(
            [sys.executable, "-m", "hwtrace.cli.main", "probe", "-p", str(target.pid),
             *rng.sample(SITES[:9], 3)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(delay)
        p.kill()
        p.wait()
        delays.append(delay)
        if target.proc.poll() is not None:
            raise SystemExit(f"the target died after a kill at {delay:.3f} s")
    target.send("stop")
    _, calls = target.result()
    per_thread = [target.proc.stdout.readline().split() for _ in range(threads)]
    target.close()
    check_threads(exe, per_thread)
    return {"kills": count, "calls": calls, "checksums": "equal to untraced",
            "delays_s": [min(delays), max(delays)]}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=100_000)
    ap.add_argument("--kills", type=int, default=50)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        exe = build(Path(d))
        print(f"soak: {args.cycles} insert/remove cycles, {args.threads} threads", flush=True)
        result = {"soak": soak(exe, args.cycles, args.threads, args.seed)}
        print(json.dumps(result["soak"], indent=1), flush=True)
        print(f"kills: {args.kills} hwtrace probe processes killed with SIGKILL", flush=True)
        result["kills"] = kills(exe, args.kills, args.threads, args.seed)
        print(json.dumps(result["kills"], indent=1))
    out = ROOT / "bench" / "out"
    out.mkdir(exist_ok=True)
    (out / "probe_soak.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
