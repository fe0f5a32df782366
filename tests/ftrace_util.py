"""Reading a tracefs instance's per-CPU ring buffers for tests."""

from __future__ import annotations

import os
import time
from pathlib import Path


def copy_trace_pipe_raw(inst: Path, dest: Path) -> None:
    """Copy each ``per_cpu/cpuN/trace_pipe_raw`` of instance ``inst`` (its
    tracing off by now) to ``dest/cpuN.raw``.  A read may say "try again"
    with pages still there, so only a run of such answers ends a CPU."""
    for cpu_dir in sorted((inst / "per_cpu").iterdir()):
        fd = os.open(cpu_dir / "trace_pipe_raw", os.O_RDONLY | os.O_NONBLOCK)
        chunks = []
        empty = 0
        try:
            while empty < 5:
                try:
                    chunk = os.read(fd, 4096)
                except BlockingIOError:
                    empty += 1
                    time.sleep(0.001)
                    continue
                if not chunk:
                    break
                empty = 0
                chunks.append(chunk)
        finally:
            os.close(fd)
        (dest / f"{cpu_dir.name}.raw").write_bytes(b"".join(chunks))
