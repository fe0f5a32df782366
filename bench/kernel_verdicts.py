"""Soak: kernel filter verdicts against the userspace tiers on many live
events.

Every expression runs as a kernel program that writes every event with
its verdict (``KernelTrace(..., emit="all")``) while a busy workload runs
(process starts, pipes, sleeps, reads); the four userspace tiers then
judge the same records.  Prints, per expression, the events compared and
passed, and any disagreement (there should be none).

    .venv/bin/python bench/kernel_verdicts.py [--seconds 10]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

from hwtrace.filter.apply import apply_filter
from hwtrace.filter.compile import TIERS
from hwtrace.kernel.trace import KernelTrace

CASES = [
    ("sched:sched_switch", 'prev_comm == "sh" || next_comm == "cat*"'),
    ("sched:sched_switch", "prev_state != 0 && (prev_prio & 7) == 0 || next_pid < 100"),
    ("sched:sched_switch", 'prev_comm == "*at" || next_comm == "*wap*" && $ctx.cpu_id == 1'),
    ("sched:sched_switch", '$ctx.procname == next_comm || prev_comm == "k*/1"'),
    ("raw_syscalls:sys_enter", "id == 0 && args[2] > 100 || id == 1 && args[0] == 1"),
    ("raw_syscalls:sys_enter", '$ctx.procname == "cat" && (id == 257 || id == 3)'),
    ("raw_syscalls:sys_enter", "(args[1] & 0xfff) == 0 && id != 9 || $ctx.tid != common_pid"),
    ("raw_syscalls:sys_exit", "ret < 0 || id == 0 && ret >= 4096"),
    ("sched:sched_process_exec", 'filename == "/usr/bin/c*" || old_pid != pid'),
]

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
    sessions = [KernelTrace([e], x, emit="all", ringbuf_size=1 << 26) for e, x in CASES]
    parts: list[list] = [[] for _ in CASES]
    try:
        for t in sessions:
            t.start()
        end = time.monotonic() + args.seconds
        while time.monotonic() < end:
            p = subprocess.Popen(["sh", "-c", WORKLOAD])
            while p.poll() is None:
                time.sleep(0.05)
                for k, t in enumerate(sessions):
                    b = t.read()
                    if len(b):
                        parts[k].append(b)
        for t in sessions:
            t.stop()
        total = bad = 0
        print(f"{'event':26} {'events':>9} {'passed':>8} {'differ':>7}  expression")
        for k, ((event, expr), t) in enumerate(zip(CASES, sessions, strict=True)):
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
            print(
                f"{event:26} {n:9} {passed:8} {differ:7}  {expr}"
                + (f"  ({lost} lost)" if lost else "")
            )
            total += n
            bad += differ
        print(f"{total} events judged by the kernel and by {len(TIERS)} userspace tiers: "
              f"{bad} verdicts differ")  # fmt: skip
        return 1 if bad else 0
    finally:
        for t in sessions:
            t.close()


if __name__ == "__main__":
    sys.exit(main())
