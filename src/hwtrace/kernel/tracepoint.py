"""Kernel tracepoints: finding them in tracefs and attaching BPF programs.

A ``BPF_PROG_TYPE_TRACEPOINT`` program runs when it is attached to a perf
event on the tracepoint (``perf_event_open(PERF_TYPE_TRACEPOINT)`` with the
event's tracefs ``id``, then ``PERF_EVENT_IOC_SET_BPF``), as bcc and
libbpf attach them.  The program runs for every hit of the tracepoint on
every CPU (the kernel keeps attached programs per tracepoint, not per perf
event), so one perf event per tracepoint is enough; closing it detaches.
"""

from __future__ import annotations

import ctypes
import errno
import fnmatch
import os
import struct
from pathlib import Path

from .bpf import BpfError, Program

__all__ = ["Attachment", "TracepointError", "event_id", "expand_events", "tracefs_root"]

SYS_PERF_EVENT_OPEN = 298
PERF_TYPE_TRACEPOINT = 2
PERF_FLAG_FD_CLOEXEC = 1 << 3
PERF_EVENT_IOC_ENABLE = 0x2400
PERF_EVENT_IOC_SET_BPF = 0x40042408
ATTR_SIZE = 128

_libc = ctypes.CDLL(None, use_errno=True)


class TracepointError(Exception):
    """An event that does not exist, or tracefs that cannot be read."""


def tracefs_root() -> Path:
    for p in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (p / "events").is_dir():
            return p
    raise TracepointError(
        "no tracefs: mount it (mount -t tracefs nodev /sys/kernel/tracing) and run as root"
    )


def _split(name: str) -> tuple[str, str]:
    system, sep, event = name.partition(":")
    if not sep or not system or not event or "/" in name:
        raise TracepointError(f"{name!r}: an event is named SYSTEM:EVENT (e.g. sched:sched_switch)")
    return system, event


def expand_events(names: list[str], root: Path | None = None) -> list[tuple[str, str]]:
    """``SYSTEM:EVENT`` names, with ``*``/``?`` globs in either part, as
    (system, event) pairs in the order given (each once)."""
    root = root or tracefs_root()
    out: list[tuple[str, str]] = []
    for name in names:
        system, event = _split(name)
        events = root / "events"
        found = []
        systems = sorted(p.name for p in events.iterdir() if p.is_dir())
        for s in fnmatch.filter(systems, system):
            for e in sorted(p.name for p in (events / s).iterdir() if (p / "format").exists()):
                if fnmatch.fnmatchcase(e, event):
                    found.append((s, e))
        if not found:
            raise TracepointError(f"no event {name} in {events}")
        for pair in found:
            if pair not in out:
                out.append(pair)
    return out


def event_id(system: str, event: str, root: Path | None = None) -> int:
    root = root or tracefs_root()
    path = root / "events" / system / event / "id"
    try:
        return int(path.read_text())
    except FileNotFoundError:
        raise TracepointError(f"no event {system}:{event} ({path} not found)") from None
    except (OSError, ValueError) as e:
        raise TracepointError(f"cannot read {path}: {e}") from None


def perf_event_open_tracepoint(tp_id: int, cpu: int = 0, pid: int = -1) -> int:
    attr = (ctypes.c_uint8 * ATTR_SIZE)()
    struct.pack_into("<IIQQ", attr, 0, PERF_TYPE_TRACEPOINT, ATTR_SIZE, tp_id, 1)
    fd = _libc.syscall(
        SYS_PERF_EVENT_OPEN, attr, pid, cpu, -1, ctypes.c_ulong(PERF_FLAG_FD_CLOEXEC)
    )
    if fd < 0:
        err = ctypes.get_errno()
        why = (
            "not permitted (run as root)"
            if err in (errno.EACCES, errno.EPERM)
            else os.strerror(err)
        )
        raise TracepointError(f"perf_event_open on tracepoint {tp_id}: {why}")
    return fd


class Attachment:
    """``program`` attached to tracepoint ``system:event`` until closed."""

    def __init__(self, program: Program, system: str, event: str, root: Path | None = None) -> None:
        self.name = f"{system}:{event}"
        self.fd = perf_event_open_tracepoint(event_id(system, event, root))
        try:
            if _libc.ioctl(self.fd, PERF_EVENT_IOC_SET_BPF, program.fd) < 0:
                err = ctypes.get_errno()
                raise BpfError(f"attach to {self.name}: {os.strerror(err)}", err)
            _libc.ioctl(self.fd, PERF_EVENT_IOC_ENABLE, 0)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        try:
            self.close()
        except OSError:
            pass
