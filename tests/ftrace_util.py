"""Reading a tracefs instance's per-CPU ring buffers for tests."""

from __future__ import annotations

import os
from pathlib import Path

from hwtrace.filter.ftrace_raw import read_trace_pipe_raw


def copy_trace_pipe_raw(inst: Path, dest: Path) -> None:
    """Copy each ``per_cpu/cpuN/trace_pipe_raw`` of instance ``inst`` (its
    tracing off by now) to ``dest/cpuN.raw``."""
    for cpu_dir in sorted((inst / "per_cpu").iterdir()):
        fd = os.open(cpu_dir / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
        try:
            data = read_trace_pipe_raw(fd)
        finally:
            os.close(fd)
        (dest / f"{cpu_dir.name}.raw").write_bytes(data)
