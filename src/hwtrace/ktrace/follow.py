"""A set of traced processes that follows their children, kept in the
kernel: a hash map of tgids that programs check first.

``task:task_newtask`` (run by the parent, with the clone flags) adds each
new process a traced one creates, but not its new threads (``CLONE_THREAD``:
they share the tgid already in the set); ``sched:sched_process_exit``
removes a process when its last thread exits, so a reused pid is not
traced by mistake.  Also the small code pieces the kernel programs share.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..filter.ebpf import isa
from ..filter.ebpf.gen import _Gen
from ..filter.ebpf.isa import R0, R1, R2, R3, R4, R6, R8, R10
from ..filter.sources import tracefs_schema
from ..kernel import bpf
from ..kernel.tracepoint import TracepointError, tracefs_root
from .programs import TracepointPrograms

__all__ = ["ProcessSet", "field_offset"]

CLONE_THREAD = 0x00010000


def field_offset(schema, name: str) -> int:
    f = schema.field(name)
    if f is None:
        raise TracepointError(f"tracepoint {schema.name} has no field {name!r}")
    return f.offset


def emit_lookup(g: _Gen, fd: int, key_at: int) -> None:
    """R0 = lookup(map fd, key at R10 + key_at)."""
    g.emit(isa.ld_pseudo(R1, bpf.PSEUDO_MAP_FD, fd), isa.mov(R2, R10))
    g.emit(isa.alu64(isa.ADD, R2, key_at, reg=False), isa.call(bpf.FN_MAP_LOOKUP_ELEM))


def emit_update(g: _Gen, fd: int, key_at: int, value_at: int) -> None:
    g.emit(isa.ld_pseudo(R1, bpf.PSEUDO_MAP_FD, fd), isa.mov(R2, R10))
    g.emit(isa.alu64(isa.ADD, R2, key_at, reg=False), isa.mov(R3, R10))
    g.emit(isa.alu64(isa.ADD, R3, value_at, reg=False), isa.mov_imm(R4, 0), isa.call(2))


def emit_delete(g: _Gen, fd: int, key_at: int) -> None:
    g.emit(isa.ld_pseudo(R1, bpf.PSEUDO_MAP_FD, fd), isa.mov(R2, R10))
    g.emit(isa.alu64(isa.ADD, R2, key_at, reg=False), isa.call(3))


def emit_tracked(g: _Gen, procs: int, out) -> None:
    """R8 = pid_tgid, the tid at R10-12 and the tgid at R10-4 (map keys);
    jump to ``out`` unless the tgid is in ``procs``."""
    g.emit(isa.call(bpf.FN_GET_CURRENT_PID_TGID), isa.mov(R8, R0))
    g.emit(isa.stx(isa.W, R10, R0, -12), isa.mov(R1, R0), isa.alu64(isa.RSH, R1, 32, reg=False))
    g.emit(isa.stx(isa.W, R10, R1, -4))
    emit_lookup(g, procs, -4)
    g.jump(out, isa.JEQ, R0, 0)


def newtask_program(procs_fd: int, pid_off: int, flags_off: int) -> np.ndarray:
    """``task:task_newtask``: a traced process's new process joins the set."""
    g = _Gen()
    out = g.label("out")
    g.emit(isa.mov(R6, R1))
    emit_tracked(g, procs_fd, out)
    g.emit(isa.ldx(isa.DW, R1, R6, flags_off), isa.alu64(isa.AND, R1, CLONE_THREAD, reg=False))
    g.jump(out, isa.JNE, R1, 0)  # a thread: its tgid is in already
    g.emit(isa.ldx(isa.W, R1, R6, pid_off), isa.stx(isa.W, R10, R1, -24))
    g.emit(isa.st(isa.W, R10, -28, 1))
    emit_update(g, procs_fd, -24, -28)
    g.place(out)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    return isa.program(g.finish())


def exit_program(procs_fd: int, group_dead_off: int) -> np.ndarray:
    """``sched:sched_process_exit``: a traced process whose last thread
    exits leaves the set."""
    g = _Gen()
    out = g.label("out")
    g.emit(isa.mov(R6, R1))
    emit_tracked(g, procs_fd, out)
    g.emit(isa.ldx(isa.B, R1, R6, group_dead_off))
    g.jump(out, isa.JEQ, R1, 0)
    emit_delete(g, procs_fd, -4)
    g.place(out)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    return isa.program(g.finish())


class ProcessSet:
    """Traced processes (``map``: tgid -> 1) and the programs that keep
    the set following children; :meth:`start`/:meth:`stop` attach and
    detach those programs."""

    def __init__(self, root: Path | None = None, *, capacity: int = 4096) -> None:
        root = root or tracefs_root()
        newtask = tracefs_schema("task", "task_newtask", str(root))
        exit_ = tracefs_schema("sched", "sched_process_exit", str(root))
        self.map = bpf.Map(bpf.MAP_HASH, 4, 4, capacity, name="hwtrace_procs")
        self.tracepoints = TracepointPrograms()
        try:
            code = newtask_program(self.map.fd, field_offset(newtask, "pid"),
                                   field_offset(newtask, "clone_flags"))  # fmt: skip
            self.tracepoints.load(code, "hwtrace_newtask", "task", "task_newtask")
            code = exit_program(self.map.fd, field_offset(exit_, "group_dead"))
            self.tracepoints.load(code, "hwtrace_exit", "sched", "sched_process_exit")
        except BaseException:
            self.close()
            raise

    @property
    def fd(self) -> int:
        return self.map.fd

    def add(self, pid: int) -> None:
        self.map.update(pid.to_bytes(4, "little"), (1).to_bytes(4, "little"))

    def remove(self, pid: int) -> None:
        self.map.delete(pid.to_bytes(4, "little"))

    def __contains__(self, pid: int) -> bool:
        return self.map.lookup(pid.to_bytes(4, "little")) is not None

    def start(self) -> None:
        self.tracepoints.attach()

    def stop(self) -> None:
        self.tracepoints.detach()

    def close(self) -> None:
        self.tracepoints.close()
        self.map.close()
