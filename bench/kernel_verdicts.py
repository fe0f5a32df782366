"""Soak: kernel filter verdicts against the userspace tiers, and against
ftrace's event filter, on many live events.

Every expression runs as a kernel program that writes every event with
its verdict (``KernelTrace(..., emit="all")``) while a busy workload runs
(process starts, pipes, sleeps, reads); the four userspace tiers then
judge the same records.  Where the expression has an ftrace form, a
tracefs instance (clock ``mono``, the kernel programs' clock) filters the
same tracepoint; for every thread created and gone inside the run (50 ms
in from either end), the events both passed must be the same, in order.  Prints, per expression, the events compared and
passed, and any disagreement (there should be none).

    .venv/bin/python bench/kernel_verdicts.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

from hwtrace.filter.apply import apply_filter
from hwtrace.filter.compile import TIERS
from hwtrace.filter.ftrace_raw import read_trace_pipe_raw
from hwtrace.filter.inputs import open_source
from hwtrace.ktrace.trace import KernelTrace

TRACEFS = Path("/sys/kernel/tracing")


class Instance:
    """A tracefs instance with one event and its ftrace filter, its
    per-CPU raw pages drained into files as the run goes."""

    def __init__(self, event: str, ftrace: str, out: Path) -> None:
        self.path = TRACEFS / "instances" / f"hwtrace-soak-{uuid.uuid4().hex[:8]}"
        self.path.mkdir()
        self.out = out
        system, name = event.split(":")
        self.ev = self.path / "events" / system / name
        self.fds = {}
        try:
            (self.path / "trace_clock").write_text("mono")
            # Room for the whole run: read only once tracing is off (a
            # reader taking pages while events arrive lost some here).
            (self.path / "buffer_size_kb").write_text("65536")
            (self.ev / "filter").write_text(ftrace)
        except OSError as e:
            self.path.rmdir()
            raise SystemExit(f"ftrace refuses the filter {ftrace!r}: {e}") from None
        for cpu_dir in sorted((self.path / "per_cpu").iterdir()):
            fd = os.open(cpu_dir / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
            self.fds[fd] = open(out / f"{cpu_dir.name}.raw", "wb")

    def enable(self, on: bool) -> None:
        (self.ev / "enable").write_text("1" if on else "0")

    def drain(self) -> None:
        """Read every page (tracing is off by now)."""
        for fd, f in self.fds.items():
            f.write(read_trace_pipe_raw(fd, patience=20))

    def lost(self) -> int:
        """Events ftrace overwrote or dropped (per_cpu/cpuN/stats)."""
        n = 0
        for stats in self.path.glob("per_cpu/cpu*/stats"):
            for line in stats.read_text().splitlines():
                key, _, value = line.partition(":")
                if key.strip() in ("overrun", "dropped events"):
                    n += int(value.split()[0])
        return n

    def close(self) -> None:
        for fd, f in self.fds.items():
            os.close(fd)
            f.close()
        self.fds = {}
        if self.path.exists():
            self.enable(False)
            self.path.rmdir()


def _first_difference(a: dict, b: dict) -> str:
    for key in sorted(set(a) | set(b)):
        x, y = a.get(key, []), b.get(key, [])
        if x != y:
            n = next(
                (i for i, (p, q) in enumerate(zip(x, y, strict=False)) if p != q),
                min(len(x), len(y)),
            )
            ours = x[n] if n < len(x) else None
            theirs = y[n] if n < len(y) else None
            return (f"thread {key}: {len(x)} vs {len(y)} events, first difference at {n}: "
                    f"kernel {ours!r}, ftrace {theirs!r}")  # fmt: skip
    return ""


def lived_within(batches, lo: int, hi: int) -> set[int]:
    """Threads created (``task:task_newtask``) and gone
    (``sched:sched_process_exit``) between lo and hi: both tracers saw all
    their events."""
    born: dict[int, int] = {}
    died: dict[int, int] = {}
    for b in batches:
        h = b.header
        for i in range(len(b)):
            e = b.events[int(h["event"][i])]
            rec = b.record(i)
            off = e.schema.field("pid").offset
            pid = int.from_bytes(rec[off : off + 4], "little", signed=True)
            (born if e.name == "task:task_newtask" else died)[pid] = int(h["time"][i])
    return {t for t in born if t in died and lo <= born[t] and died[t] <= hi}


def _payload(rec: bytes, event, fixed: int) -> bytes:
    """The record after its 8 common bytes, racy fields zeroed."""
    out = bytearray(rec[8:fixed])
    for name in RACY.get(event.name, ()):
        f = event.schema.field(name)
        out[f.offset - 8 : f.offset - 8 + f.type.fixed_size] = bytes(f.type.fixed_size)
    return bytes(out)


def ftrace_end(path: Path) -> int:
    """The time up to which every CPU's pages were read: trace_pipe_raw
    here does not hand over the last page of a busy per-CPU buffer (its
    events show in the instance's ``trace`` file, not in any read), so
    the comparison stops where the first CPU's pages do."""
    src = open_source(str(path))
    if not len(src):
        return 0
    return min(int(src.time[src.cpu == c].max()) for c in np.unique(src.cpu).tolist())


def ftrace_rows(path: Path, event, tids: set[int]) -> dict[int, list[bytes]]:
    """Each of threads ``tids``'s events that ftrace kept (payload after the
    8 common bytes), in time order."""
    src = open_source(str(path))
    out: dict[int, list[tuple[int, bytes]]] = {}
    for t in src.types:
        if not t.name.endswith(event.name.split(":")[1]):
            continue
        fixed = t.schema.size
        for j, row in enumerate(t.rows.tolist()):
            off, size = int(t.offsets[j]), int(t.sizes[j])
            rec = src.buf[off : off + size].tobytes()
            tid = int.from_bytes(rec[4:8], "little", signed=True)
            if tid in tids:
                out.setdefault(tid, []).append((int(src.time[row]), _payload(rec, event, fixed)))
    return {k: [p for _, p in sorted(v)] for k, v in out.items()}


def kernel_rows(parts, tids: set[int]) -> dict[int, list[bytes]]:
    out: dict[int, list[tuple[int, bytes]]] = {}
    for b in parts:
        h = b.header
        fixed = b.events[0].schema.size
        keep = np.flatnonzero(h["verdict"].astype(bool) & np.isin(h["tid"], list(tids)))
        for i in keep.tolist():
            rec = _payload(b.record(i), b.events[0], fixed)
            out.setdefault(int(h["tid"][i]), []).append((int(h["time"][i]), rec))
    return {k: [p for _, p in sorted(v)] for k, v in out.items()}


# (event, expression, its ftrace form or None)
CASES = [
    ("sched:sched_switch", 'prev_comm == "sh" || next_comm == "cat*"',
     'prev_comm == "sh" || next_comm ~ "cat*"'),
    ("sched:sched_switch", "prev_state != 0 && (prev_prio & 7) == 0 || next_pid < 100", None),
    ("sched:sched_switch", 'prev_comm == "*at" || next_comm == "*wap*" && $ctx.cpu_id == 1', None),
    ("sched:sched_switch", '$ctx.procname == next_comm || prev_comm == "k*/1"', None),
    ("sched:sched_switch", 'prev_state != 0 && next_comm != "swap*" || prev_prio < 100',
     'prev_state != 0 && !(next_comm ~ "swap*") || prev_prio < 100'),
    ("raw_syscalls:sys_enter", "id == 0 && args[2] > 100 || id == 1 && args[0] == 1", None),
    ("raw_syscalls:sys_enter", '$ctx.procname == "cat" && (id == 257 || id == 3)', None),
    ("raw_syscalls:sys_enter", "(args[1] & 0xfff) == 0 && id != 9 || $ctx.tid != common_pid", None),
    ("raw_syscalls:sys_enter", "id == 0 || id == 1 || id >= 257 && id <= 262 || common_pid < 100",
     "id == 0 || id == 1 || id >= 257 && id <= 262 || common_pid < 100"),
    ("raw_syscalls:sys_exit", "ret < 0 || id == 0 && ret >= 4096",
     "ret < 0 || id == 0 && ret >= 4096"),
    ("sched:sched_process_exec", 'filename == "/usr/bin/c*" || old_pid < 100',
     'filename ~ "/usr/bin/c*" || old_pid < 100'),
]  # fmt: skip
MARGIN_NS = 50_000_000
# Fields the two tracers may see differently for the same event: a
# switching-out task that is exiting has its exit state read by each
# tracer's probe in turn (__trace_sched_switch_state reads p->exit_state),
# and its parent can reap it in between (EXIT_ZOMBIE, then EXIT_DEAD).
RACY = {"sched:sched_switch": ("prev_state",)}

WORKLOAD = (
    "for i in $(seq 1 40); do cat /etc/hostname /etc/passwd > /dev/null; "
    "ls /usr/bin > /dev/null; head -c 100000 /dev/zero | cat > /dev/null; sleep 0.005; done"
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="how long the workload runs")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.stderr.write("needs root\n")
        return 1
    sessions = [KernelTrace([e], x, emit="all", ringbuf_size=1 << 26) for e, x, _ in CASES]
    life = KernelTrace(["task:task_newtask", "sched:sched_process_exit"], None)
    life_batches = []
    parts: list[list] = [[] for _ in CASES]
    ftrace_total = [0]
    tmp = Path(tempfile.mkdtemp(prefix="hwtrace-soak-"))
    instances: dict[int, Instance] = {}
    try:
        for k, (event, _, ftrace) in enumerate(CASES):
            if ftrace is not None:
                (tmp / str(k)).mkdir()
                instances[k] = Instance(event, ftrace, tmp / str(k))
        for inst in instances.values():
            inst.enable(True)
        for t in (life, *sessions):
            t.start()
        lo = time.monotonic_ns() + MARGIN_NS
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            p = subprocess.Popen(["sh", "-c", WORKLOAD])
            while p.poll() is None:
                time.sleep(0.05)
                for k, t in enumerate(sessions):
                    b = t.read()
                    if len(b):
                        parts[k].append(b)
                life_batches.append(life.read())
        hi = time.monotonic_ns() - MARGIN_NS
        for t in (life, *sessions):
            t.stop()
        life_batches.append(life.read())
        for inst in instances.values():
            inst.enable(False)
            (inst.path / "tracing_on").write_text("0")  # the last partial pages too
            inst.drain()
        total = bad = 0
        print(f"{'event':26} {'events':>9} {'passed':>8} {'differ':>7} {'ftrace':>13}  expression")
        for k, ((event, expr, _), t) in enumerate(zip(CASES, sessions, strict=True)):
            b = t.read()
            if len(b):
                parts[k].append(b)
            n = passed = differ = 0
            for batch in parts[k]:
                kernel = batch.header["verdict"].astype(bool)
                src = batch.source()
                for tier in TIERS:
                    differ += int(np.count_nonzero(apply_filter(src, expr, tier).keep != kernel))
                n += len(batch)
                passed += int(kernel.sum())
            lost = t.counts()["lost"]
            oracle = ""
            if k in instances:
                end = min(hi, ftrace_end(tmp / str(k)) - MARGIN_NS)
                tids = lived_within(life_batches, lo, end)
                ours, theirs = (
                    kernel_rows(parts[k], tids),
                    ftrace_rows(tmp / str(k), t.events[0], tids),
                )
                same = sum(len(v) for v in theirs.values())
                if instances[k].lost():
                    print(f"   ftrace lost {instances[k].lost()} events")
                if ours != theirs:
                    differ += 1
                    oracle = "DIFFERENT"
                    print("  ", _first_difference(ours, theirs))
                else:
                    oracle = f"{same} same"
                    ftrace_total[0] += same
            print(f"{event:26} {n:9} {passed:8} {differ:7} {oracle:>13}  {expr}"
                  + (f"  ({lost} lost)" if lost else ""))  # fmt: skip
            total += n
            bad += differ
        print(f"{total} events judged by the kernel and by {len(TIERS)} userspace tiers, "
              f"{ftrace_total[0]} passed by both the kernel programs and ftrace's filters "
              f"(threads that lived within {(hi - lo) / 1e9:.1f} s): "
              f"{bad} differ")  # fmt: skip
        return 1 if bad else 0
    finally:
        for t in (life, *sessions):
            t.close()
        for inst in instances.values():
            inst.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
