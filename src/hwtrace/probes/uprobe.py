"""The last fallback: a kernel uprobe through tracefs, counted per process.

Where neither a jump nor a trap tracepoint can be placed (an instruction
that cannot run out of line, no trampoline room within reach), the kernel
can still trap there: a uprobe on the mapped file at the site's offset
(``uprobe_events``, Documentation/trace/uprobetracer.rst).  A uprobe fires
in every process that maps the file, so hits are counted for this process
only, by a counting perf event on the uprobe's tracepoint attached to each
of its threads (``inherit``: threads they create later count too).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__all__ = ["Uprobe", "UprobeError", "tracefs"]

PERF_TYPE_TRACEPOINT = 2
SYS_PERF_EVENT_OPEN = 298
ATTR_SIZE = 128
FLAG_INHERIT = 1 << 1
GROUP = "hwtrace_probe"

_libc = ctypes.CDLL(None, use_errno=True)


class UprobeError(Exception):
    """The kernel would not place the uprobe; the message says why."""


def tracefs() -> Path | None:
    for p in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (p / "uprobe_events").exists():
            return p
    return None


def _append(path: Path, line: str) -> None:
    """One write(2) of ``line``: tracefs control files take a command per
    write, and refuse the seek Python's append mode does."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _perf_event_open(config: int, tid: int) -> int:
    attr = (ctypes.c_uint8 * ATTR_SIZE)()
    ctypes.memmove(attr, PERF_TYPE_TRACEPOINT.to_bytes(4, "little"), 4)
    ctypes.memmove(ctypes.byref(attr, 4), ATTR_SIZE.to_bytes(4, "little"), 4)
    ctypes.memmove(ctypes.byref(attr, 8), config.to_bytes(8, "little"), 8)
    ctypes.memmove(ctypes.byref(attr, 40), FLAG_INHERIT.to_bytes(8, "little"), 8)
    fd = _libc.syscall(SYS_PERF_EVENT_OPEN, attr, tid, -1, -1, ctypes.c_ulong(0))
    if fd < 0:
        err = ctypes.get_errno()
        raise UprobeError(f"perf_event_open on the uprobe for thread {tid}: {os.strerror(err)}")
    return fd


class Uprobe:
    """A uprobe at ``offset`` in ``path``, counted for the threads of ``pid``."""

    def __init__(self, pid: int, path: str, offset: int, ident: int) -> None:
        root = tracefs()
        if root is None:
            raise UprobeError("no tracefs with uprobe_events (mount tracefs, or no CONFIG_UPROBES)")
        self.root = root
        self.name = f"p{pid}_{ident}"
        self.path, self.offset = path, offset
        self.fds: list[int] = []
        try:
            _append(root / "uprobe_events", f"p:{GROUP}/{self.name} {path}:{offset:#x}\n")
        except OSError as e:
            raise UprobeError(f"uprobe at {path}:{offset:#x}: {e.strerror}") from e
        self.placed = True
        try:
            config = int((root / "events" / GROUP / self.name / "id").read_text())
            for tid in sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")):
                try:
                    self.fds.append(_perf_event_open(config, tid))
                except UprobeError:
                    if os.path.exists(f"/proc/{pid}/task/{tid}"):
                        raise
        except BaseException:
            self.remove()
            raise

    def hits(self) -> int:
        total = 0
        for fd in self.fds:
            total += int.from_bytes(os.read(fd, 8), "little")
        return total

    def remove(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
        if self.placed:
            self.placed = False
            try:
                _append(self.root / "uprobe_events", f"-:{GROUP}/{self.name}\n")
            except OSError:
                pass
