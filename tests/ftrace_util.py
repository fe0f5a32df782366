"""Reading a tracefs instance's per-CPU ring buffers for tests."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hwtrace.filter.ftrace_raw import read_trace_pipe_raw


def ftrace_overruns(inst: Path) -> int:
    """Events instance ``inst``'s buffers lost: overwritten when full
    (``overrun``) or dropped (``dropped events``), over all CPUs.  A busy
    machine's other processes can fill a buffer an event filter lets
    their events into, and the oldest events go first."""
    lost = 0
    for stats in sorted((inst / "per_cpu").glob("cpu*/stats")):
        text = stats.read_text()
        for name in ("overrun", "dropped events"):
            m = re.search(rf"^{name}:\s*(\d+)", text, re.M)
            lost += int(m.group(1)) if m else 0
    return lost


def copy_trace_pipe_raw(inst: Path, dest: Path) -> dict[int, int]:
    """Copy each ``per_cpu/cpuN/trace_pipe_raw`` of instance ``inst`` (its
    tracing off by now) to ``dest/cpuN.raw``.  Returns how many events each
    CPU's buffer held before the copy (``per_cpu/cpuN/stats``), so that a
    caller can tell a complete copy from one the kernel cut short."""
    held = {}
    for cpu_dir in sorted((inst / "per_cpu").iterdir()):
        cpu = int(cpu_dir.name[3:])
        m = re.search(r"^entries:\s*(\d+)", (cpu_dir / "stats").read_text(), re.M)
        held[cpu] = int(m.group(1)) if m else -1
        fd = os.open(cpu_dir / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = read_trace_pipe_raw(fd)
        finally:
            os.close(fd)
        (dest / f"{cpu_dir.name}.raw").write_bytes(data)
    return held
