"""A co-operative system call latency tracker: the application steers the
kernel tracer through shared memory, and the kernel reports back.

After Sharma and Dagenais ("Enhanced Userspace and In-Kernel Trace
Filtering for Production Systems", JCST 2016, §5.3), built from what
today's kernels offer instead of their kernel module: a ``BPF_F_MMAPABLE``
array map holds the thresholds and the published state, mapped into both
hwtrace and the application, so a threshold update is a plain store (no
system call) and the kernel's counters are plain loads.

Programs on ``raw_syscalls:sys_enter`` and ``sys_exit`` time every call of
the tracked processes (:class:`~.follow.ProcessSet`: a hash map of tgids
that follows their children).  At exit the
latency is compared with the calling thread's threshold for that call;
only slower calls are written to a BPF ring buffer (:data:`RECORD`).

The shared memory (:class:`CoopLayout`, all little-endian 64-bit words; the
same layout in ``include/hwtrace_coop.h``):

* a header: magic, version, rows, columns, the next free row, and global
  counts (calls, recorded, lost, threads beyond the rows);
* a histogram of latencies, one bucket per power of two of nanoseconds;
* per thread a row of state (:data:`STATE_FIELDS`): its tid, calls,
  recorded calls, last call, its latency, the largest, their sum, last
  CPU, migrations, the call in progress, and ``app_state`` (the
  application's word: Sharma and Dagenais's ``proc_state``);
* per thread a row of thresholds, one per system call number and one for
  any call (column :data:`ANY`), in ns: 0 unset, >0 record calls at least
  that slow, <0 never record.  Row 0 holds the defaults for every tracked
  thread.  The kernel takes the first set value of (own row, call), (own
  row, any), (row 0, call), (row 0, any).

A tracked thread gets its row at its first system call (the kernel takes
the next free one with an atomic add and publishes the tid in it), so a
thread finds its row after any system call (:meth:`CoopMap.row_of`).
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..filter.ebpf import isa
from ..filter.ebpf.gen import _Gen
from ..filter.ebpf.isa import R0, R1, R2, R3, R4, R6, R7, R8, R9, R10
from ..filter.sources import tracefs_schema
from ..kernel import bpf
from ..kernel.ringbuf import RingBuffer
from ..kernel.tracepoint import tracefs_root
from .follow import ProcessSet, emit_delete, emit_lookup, emit_tracked, emit_update, field_offset
from .programs import TracepointPrograms

__all__ = ["ANY", "RECORD", "STATE_FIELDS", "CoopLayout", "CoopMap", "LatencyTracker"]

MAGIC = 0x31504F4F43545748  # "HWTCOOP1"
VERSION = 1
COLUMNS = 512  # system call numbers 0..510, and ANY
ANY = COLUMNS - 1
HEADER_WORDS = 64
HIST_WORDS = 64
STATE_WORDS = 16
HEADER_FIELDS = ("magic", "version", "rows", "columns", "next_row", "calls", "recorded",
                 "lost", "overflow")  # fmt: skip
STATE_FIELDS = ("tid", "calls", "recorded", "last_nr", "last_latency", "max_latency",
                "total_latency", "last_cpu", "migrations", "in_call", "app_state",
                "last_threshold")  # fmt: skip

#: One recorded (slow) system call.
RECORD = np.dtype(
    [
        ("enter", "<u8"), ("latency", "<u8"), ("threshold", "<i8"), ("ret", "<i8"),
        ("nr", "<u4"), ("tid", "<u4"), ("pid", "<u4"), ("cpu", "<u4"),
        ("args", "<u8", (6,)), ("comm", "S16"),
    ]
)  # fmt: skip
assert RECORD.itemsize == 112
_ENTRY_SIZE = 64  # enter time, nr, six arguments


@dataclass(frozen=True)
class CoopLayout:
    """Word offsets of the shared memory for ``rows`` thread rows."""

    rows: int = 256

    @property
    def hist(self) -> int:
        return HEADER_WORDS

    @property
    def state(self) -> int:
        return HEADER_WORDS + HIST_WORDS

    @property
    def thresholds(self) -> int:
        return self.state + self.rows * STATE_WORDS

    @property
    def words(self) -> int:
        return self.thresholds + self.rows * COLUMNS


class CoopMap:
    """The shared memory as numpy views over its mmap: ``header``,
    ``hist``, ``state`` (rows x :data:`STATE_WORDS`), ``thresholds``
    (rows x :data:`COLUMNS`).  Stores and loads go straight to the pages
    the kernel programs use."""

    def __init__(self, mm, layout: CoopLayout) -> None:
        self.layout = layout
        self._mm = mm
        self.words = np.frombuffer(mm, np.int64, layout.words)
        self.header = self.words[:HEADER_WORDS]
        self.hist = self.words[layout.hist : layout.hist + HIST_WORDS]
        self.state = self.words[layout.state : layout.thresholds].reshape(layout.rows, STATE_WORDS)
        self.thresholds = self.words[layout.thresholds :].reshape(layout.rows, COLUMNS)

    @classmethod
    def from_fd(cls, fd: int) -> CoopMap:
        """Map the shared memory of a tracker's map (e.g. a descriptor the
        application inherited: ``HWTRACE_COOP_FD``)."""
        import mmap

        head = mmap.mmap(fd, mmap.PAGESIZE, mmap.MAP_SHARED, mmap.PROT_READ)
        words = np.frombuffer(head, np.int64, HEADER_WORDS)
        magic, version, rows, columns = (int(w) for w in words[:4])
        if magic != MAGIC or version != VERSION or columns != COLUMNS or not 2 <= rows <= 1024:
            del words
            head.close()
            raise ValueError(
                f"descriptor {fd} is not hwtrace's shared latency map (version {VERSION})"
            )
        layout = CoopLayout(rows)
        del words
        head.close()
        size = (layout.words * 8 + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(mm, layout)

    @classmethod
    def from_pin(cls, path: str) -> CoopMap:
        """Map the tracker's map pinned at ``path`` (``--pin``)."""
        fd = bpf.obj_get(path)
        try:
            return cls.from_fd(fd)
        finally:
            os.close(fd)  # the mapping keeps the map

    def field(self, name: str) -> int:
        return int(self.header[HEADER_FIELDS.index(name)])

    def row_of(self, tid: int | None = None) -> int | None:
        """The row of thread ``tid`` (default: the calling thread, after a
        system call that gives it one), or None."""
        if tid is None:
            tid = gettid()  # a system call: the kernel assigns the row
        hits = np.flatnonzero(self.state[1:, 0] == tid)
        return int(hits[-1]) + 1 if hits.size else None

    def set_threshold(self, ns: int, nr: int = ANY, *, row: int = 0) -> None:
        """Record calls ``nr`` (default: any) of thread row ``row`` (0: the
        defaults) that take at least ``ns`` ns (0 unset, <0 never): a plain
        store."""
        self.thresholds[row, nr] = ns

    def thread_state(self, row: int) -> dict[str, int]:
        return {name: int(self.state[row, k]) for k, name in enumerate(STATE_FIELDS)}

    def close(self) -> None:
        self.words = self.header = self.hist = self.state = self.thresholds = None  # type: ignore[assignment]
        try:
            self._mm.close()
        except BufferError:
            pass


_libc = ctypes.CDLL(None, use_errno=True)


def gettid() -> int:
    """The calling thread's id, by the system call itself."""
    return int(_libc.syscall(186))


def _atomic_add(dst: int, src: int, off: int, *, fetch: bool = False):
    """``lock *(u64 *)(dst + off) += src`` (with ``fetch``: src = old value)."""
    return isa.insn(isa.STX | isa.ATOMIC | isa.DW, dst, src, off, isa.ADD | (1 if fetch else 0))


def _coop_base(g: _Gen, coop: int, out) -> None:
    """R7 = the shared memory."""
    g.emit(isa.st(isa.W, R10, -16, 0))
    emit_lookup(g, coop, -16)
    g.jump(out, isa.JEQ, R0, 0)
    g.emit(isa.mov(R7, R0))


def _enter_program(
    fds: dict[str, int], layout: CoopLayout, id_off: int, args_off: int
) -> np.ndarray:
    g = _Gen()
    out = g.label("out")
    have, known = g.label("have"), g.label("known")
    g.emit(isa.mov(R6, R1))
    emit_tracked(g, fds["procs"], out)
    _coop_base(g, fds["coop"], out)
    emit_lookup(g, fds["rows"], -12)
    g.jump(have, isa.JNE, R0, 0)
    # A new thread: the next free row, published with its tid.
    g.emit(isa.mov_imm(R9, 1), _atomic_add(R7, R9, 8 * HEADER_FIELDS.index("next_row"), fetch=True))
    use = g.label("use")
    g.jump(use, isa.JLT, R9, layout.rows)
    g.emit(isa.mov_imm(R1, 1), _atomic_add(R7, R1, 8 * HEADER_FIELDS.index("overflow")))
    g.emit(isa.mov_imm(R9, 0))  # beyond the rows: the defaults' row, no state of its own
    g.place(use)
    g.emit(isa.stx(isa.W, R10, R9, -20))
    g.jump(known, isa.JEQ, R9, 0)
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 7, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.mov32(R3, R8), isa.stx(isa.DW, R2, R3, 8 * layout.state))
    g.place(known)
    emit_update(g, fds["rows"], -12, -20)
    g.jump(g_enter := g.label("enter"))
    g.place(have)
    g.emit(isa.ldx(isa.W, R9, R0, 0))
    g.place(g_enter)
    # The entry: time, call, arguments.
    g.emit(isa.call(bpf.FN_KTIME_GET_NS), isa.stx(isa.DW, R10, R0, -88))
    g.emit(isa.ldx(isa.DW, R1, R6, id_off), isa.stx(isa.DW, R10, R1, -80))
    for k in range(6):
        g.emit(isa.ldx(isa.DW, R2, R6, args_off + 8 * k), isa.stx(isa.DW, R10, R2, -72 + 8 * k))
    skip = g.label("skip")
    g.jump(skip, isa.JGE, R9, layout.rows)
    g.jump(skip, isa.JEQ, R9, 0)
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 7, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.alu64(isa.ADD, R1, 1, reg=False))
    g.emit(isa.stx(isa.DW, R2, R1, 8 * (layout.state + STATE_FIELDS.index("in_call"))))
    g.place(skip)
    emit_update(g, fds["entries"], -12, -88)
    g.place(out)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    return isa.program(g.finish())


def _exit_program(fds: dict[str, int], layout: CoopLayout, ret_off: int) -> np.ndarray:
    g = _Gen()
    out, lost = g.label("out"), g.label("lost")
    rec = -128  # the record on the stack (RECORD's layout)
    at = {name: rec + RECORD.fields[name][1] for name in RECORD.names}
    st = {name: 8 * (layout.state + k) for k, name in enumerate(STATE_FIELDS)}
    hdr = {name: 8 * k for k, name in enumerate(HEADER_FIELDS)}
    g.emit(isa.mov(R6, R1))
    emit_tracked(g, fds["procs"], out)
    emit_lookup(g, fds["entries"], -12)
    g.jump(out, isa.JEQ, R0, 0)
    g.emit(isa.mov(R9, R0))
    g.emit(isa.ldx(isa.DW, R1, R9, 0), isa.stx(isa.DW, R10, R1, at["enter"]))
    g.emit(isa.ldx(isa.DW, R1, R9, 8), isa.stx(isa.W, R10, R1, at["nr"]))
    for k in range(6):
        g.emit(isa.ldx(isa.DW, R1, R9, 16 + 8 * k), isa.stx(isa.DW, R10, R1, at["args"] + 8 * k))
    g.emit(isa.st(isa.DW, R9, 0, 0))  # consumed: a later exit without an entry is ignored
    g.emit(isa.ldx(isa.DW, R1, R10, at["enter"]))
    g.jump(out, isa.JEQ, R1, 0)
    _coop_base(g, fds["coop"], out)
    emit_lookup(g, fds["rows"], -12)
    g.jump(out, isa.JEQ, R0, 0)
    g.emit(isa.ldx(isa.W, R9, R0, 0))
    g.jump(out, isa.JGE, R9, layout.rows)
    g.emit(isa.call(bpf.FN_KTIME_GET_NS), isa.ldx(isa.DW, R1, R10, at["enter"]))
    g.emit(isa.alu64(isa.SUB, R0, R1, reg=True), isa.stx(isa.DW, R10, R0, at["latency"]))
    g.emit(isa.ldx(isa.DW, R1, R6, ret_off), isa.stx(isa.DW, R10, R1, at["ret"]))
    g.emit(
        isa.stx(isa.W, R10, R8, at["tid"]), isa.mov(R1, R8), isa.alu64(isa.RSH, R1, 32, reg=False)
    )
    g.emit(isa.stx(isa.W, R10, R1, at["pid"]))
    g.emit(isa.call(bpf.FN_GET_SMP_PROCESSOR_ID), isa.stx(isa.W, R10, R0, at["cpu"]))
    # The threshold: (row, call), (row, any), (0, call), (0, any).
    nr_ok, have_t = g.label("nr"), g.label("t")
    g.emit(isa.ldx(isa.W, R1, R10, at["nr"]))
    g.jump(nr_ok, isa.JLT, R1, ANY)
    g.emit(isa.mov_imm(R1, ANY))
    g.place(nr_ok)
    thr = 8 * layout.thresholds
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 9, reg=False), isa.alu64(isa.ADD, R2, R1, reg=True)
    )
    g.emit(isa.alu64(isa.LSH, R2, 3, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True))
    g.emit(isa.alu64(isa.ADD, R2, thr, reg=False), isa.ldx(isa.DW, R3, R2, 0))
    g.jump(have_t, isa.JNE, R3, 0)
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 12, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.alu64(isa.ADD, R2, thr, reg=False), isa.ldx(isa.DW, R3, R2, 8 * ANY))
    g.jump(have_t, isa.JNE, R3, 0)
    g.emit(
        isa.mov(R2, R1), isa.alu64(isa.LSH, R2, 3, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.alu64(isa.ADD, R2, thr, reg=False), isa.ldx(isa.DW, R3, R2, 0))
    g.jump(have_t, isa.JNE, R3, 0)
    g.emit(
        isa.mov(R2, R7), isa.alu64(isa.ADD, R2, thr, reg=False), isa.ldx(isa.DW, R3, R2, 8 * ANY)
    )
    g.place(have_t)
    g.emit(isa.stx(isa.DW, R10, R3, at["threshold"]))
    # Published state: the thread's row (its own: plain stores), global counts.
    g.emit(isa.mov_imm(R1, 1), _atomic_add(R7, R1, hdr["calls"]))
    rowst = g.label("rowst")
    g.jump(rowst, isa.JEQ, R9, 0)  # no row of its own
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 7, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.ldx(isa.DW, R1, R2, st["calls"]), isa.alu64(isa.ADD, R1, 1, reg=False))
    g.emit(isa.stx(isa.DW, R2, R1, st["calls"]))
    g.emit(isa.ldx(isa.W, R1, R10, at["nr"]), isa.stx(isa.DW, R2, R1, st["last_nr"]))
    g.emit(isa.ldx(isa.DW, R1, R10, at["latency"]), isa.stx(isa.DW, R2, R1, st["last_latency"]))
    g.emit(isa.ldx(isa.DW, R4, R2, st["total_latency"]), isa.alu64(isa.ADD, R4, R1, reg=True))
    g.emit(isa.stx(isa.DW, R2, R4, st["total_latency"]))
    nomax = g.label("nomax")
    g.emit(isa.ldx(isa.DW, R4, R2, st["max_latency"]))
    g.jump(nomax, isa.JGE, R4, R1, reg=True)
    g.emit(isa.stx(isa.DW, R2, R1, st["max_latency"]))
    g.place(nomax)
    same = g.label("same")
    g.emit(isa.ldx(isa.W, R1, R10, at["cpu"]), isa.ldx(isa.DW, R4, R2, st["last_cpu"]))
    g.emit(isa.stx(isa.DW, R2, R1, st["last_cpu"]))
    g.jump(same, isa.JEQ, R4, R1, reg=True)
    g.emit(isa.ldx(isa.DW, R0, R2, st["calls"]))
    g.jump(same, isa.JLE, R0, 1)  # the first call: no migration
    g.emit(isa.ldx(isa.DW, R4, R2, st["migrations"]), isa.alu64(isa.ADD, R4, 1, reg=False))
    g.emit(isa.stx(isa.DW, R2, R4, st["migrations"]))
    g.place(same)
    g.emit(isa.st(isa.DW, R2, st["in_call"], 0), isa.stx(isa.DW, R2, R3, st["last_threshold"]))
    g.place(rowst)
    # The histogram: bucket floor(log2(latency)).
    g.emit(isa.ldx(isa.DW, R1, R10, at["latency"]), isa.mov_imm(R2, 0))
    for bits in (32, 16, 8, 4, 2, 1):
        nxt = g.label(f"b{bits}")
        g.emit(isa.mov(R4, R1), isa.alu64(isa.RSH, R4, bits, reg=False))
        g.jump(nxt, isa.JEQ, R4, 0)
        g.emit(isa.mov(R1, R4), isa.alu64(isa.ADD, R2, bits, reg=False))
        g.place(nxt)
    g.emit(isa.alu64(isa.AND, R2, HIST_WORDS - 1, reg=False), isa.alu64(isa.LSH, R2, 3, reg=False))
    g.emit(isa.alu64(isa.ADD, R2, R7, reg=True), isa.mov_imm(R1, 1))
    g.emit(_atomic_add(R2, R1, 8 * layout.hist))
    # Record only calls at least as slow as the threshold.
    g.emit(isa.ldx(isa.DW, R3, R10, at["threshold"]))
    g.jump(out, isa.JSLE, R3, 0)
    g.emit(isa.ldx(isa.DW, R1, R10, at["latency"]))
    g.jump(out, isa.JLT, R1, R3, reg=True)
    g.emit(isa.mov(R1, R10), isa.alu64(isa.ADD, R1, at["comm"], reg=False))
    g.emit(isa.mov_imm(R2, 16), isa.call(bpf.FN_GET_CURRENT_COMM))
    g.emit(isa.ld_pseudo(R1, bpf.PSEUDO_MAP_FD, fds["ring"]), isa.mov(R2, R10))
    g.emit(isa.alu64(isa.ADD, R2, rec, reg=False), isa.mov_imm(R3, RECORD.itemsize))
    g.emit(isa.mov_imm(R4, 0), isa.call(bpf.FN_RINGBUF_OUTPUT))
    g.jump(lost, isa.JNE, R0, 0)
    g.emit(isa.mov_imm(R1, 1), _atomic_add(R7, R1, hdr["recorded"]))
    g.jump(out, isa.JEQ, R9, 0)
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 7, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.ldx(isa.DW, R1, R2, st["recorded"]), isa.alu64(isa.ADD, R1, 1, reg=False))
    g.emit(isa.stx(isa.DW, R2, R1, st["recorded"]))
    g.jump(out)
    g.place(lost)
    g.emit(isa.mov_imm(R1, 1), _atomic_add(R7, R1, hdr["lost"]))
    g.place(out)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    return isa.program(g.finish())


def _thread_exit_program(fds: dict[str, int], layout: CoopLayout) -> np.ndarray:
    """``sched:sched_process_exit``: forget an exiting thread (its entry
    and row keys; its row says it is in no call any more)."""
    g = _Gen()
    out = g.label("out")
    g.emit(isa.mov(R6, R1))
    emit_tracked(g, fds["procs"], out)
    emit_delete(g, fds["entries"], -12)
    _coop_base(g, fds["coop"], out)
    emit_lookup(g, fds["rows"], -12)
    g.jump(out, isa.JEQ, R0, 0)
    g.emit(isa.ldx(isa.W, R9, R0, 0))
    emit_delete(g, fds["rows"], -12)
    g.jump(out, isa.JGE, R9, layout.rows)
    g.jump(out, isa.JEQ, R9, 0)
    g.emit(
        isa.mov(R2, R9), isa.alu64(isa.LSH, R2, 7, reg=False), isa.alu64(isa.ADD, R2, R7, reg=True)
    )
    g.emit(isa.st(isa.DW, R2, 8 * (layout.state + STATE_FIELDS.index("in_call")), 0))
    g.place(out)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    return isa.program(g.finish())


class LatencyTracker:
    """The tracker's kernel side and its shared memory (:attr:`coop`).

    ``track(pid)`` adds a process (and, from then on, the children it
    forks); :meth:`start` attaches the programs; :meth:`read` returns the
    recorded calls (:data:`RECORD`).  :attr:`coop_fd` is the shared map's
    descriptor, for handing to an application (it maps it with
    :meth:`CoopMap.from_fd` or ``hwtrace_coop_open()``)."""

    def __init__(
        self, *, rows: int = 256, ringbuf_size: int = 1 << 20, tracefs: Path | None = None
    ) -> None:
        if not 2 <= rows <= 1024:
            raise ValueError(f"rows {rows}: 2 to 1024")
        self.layout = CoopLayout(rows)
        self.tracepoints = TracepointPrograms()
        self._objects: list = []
        root = tracefs or tracefs_root()
        enter = tracefs_schema("raw_syscalls", "sys_enter", str(root))
        exit_ = tracefs_schema("raw_syscalls", "sys_exit", str(root))
        try:
            self.coop_map = bpf.Map(bpf.MAP_ARRAY, 4, self.layout.words * 8, 1,
                                    flags=bpf.F_MMAPABLE, name="hwtrace_coop")  # fmt: skip
            self._objects.append(self.coop_map)
            self.process_set = ProcessSet(root)
            self._objects.append(self.process_set)
            self.procs = self.process_set.map
            self.rows = bpf.Map(bpf.MAP_HASH, 4, 4, 65536, name="hwtrace_rows")
            self.entries = bpf.Map(bpf.MAP_HASH, 4, _ENTRY_SIZE, 65536, name="hwtrace_entry")
            self.ring = RingBuffer(ringbuf_size, name="hwtrace_lat")
            self._objects += [self.rows, self.entries, self.ring]
            self.coop = CoopMap(self.coop_map.mmap(), self.layout)
            h = self.coop.header
            h[HEADER_FIELDS.index("magic")] = MAGIC
            h[HEADER_FIELDS.index("version")] = VERSION
            h[HEADER_FIELDS.index("rows")] = rows
            h[HEADER_FIELDS.index("columns")] = COLUMNS
            h[HEADER_FIELDS.index("next_row")] = 1  # row 0: the defaults
            fds = {"coop": self.coop_map.fd, "procs": self.procs.fd, "rows": self.rows.fd,
                   "entries": self.entries.fd, "ring": self.ring.fd}  # fmt: skip
            plan = [
                ("sys_enter", "raw_syscalls", _enter_program(fds, self.layout, field_offset(enter, "id"), field_offset(enter, "args"))),
                ("sys_exit", "raw_syscalls", _exit_program(fds, self.layout, field_offset(exit_, "ret"))),
                ("sched_process_exit", "sched", _thread_exit_program(fds, self.layout)),
            ]  # fmt: skip
            for event, system, insns in plan:
                self.tracepoints.load(insns, f"hwtrace_{event}"[:15], system, event)
        except BaseException:
            self.close()
            raise

    @property
    def coop_fd(self) -> int:
        return self.coop_map.fd

    @property
    def programs(self) -> list[bpf.Program]:
        """The loaded kernel programs."""
        return self.tracepoints.programs

    def track(self, pid: int) -> None:
        """Time the system calls of process ``pid`` and of the children it
        forks from now on (one ``bpf()`` call, the registration)."""
        self.process_set.add(pid)

    def untrack(self, pid: int) -> None:
        self.process_set.remove(pid)

    def start(self) -> None:
        self.process_set.start()
        self.tracepoints.attach()

    def stop(self) -> None:
        if getattr(self, "process_set", None) is not None:
            self.process_set.stop()
        self.tracepoints.detach()

    def read(self) -> np.ndarray:
        """The calls recorded since the last read (:data:`RECORD` rows)."""
        buf, starts, _lengths = self.ring.read()
        if not starts.size:
            return np.zeros(0, RECORD)
        rows = starts[:, None] + np.arange(RECORD.itemsize)[None, :]
        return buf[rows].copy().view(RECORD).reshape(starts.shape[0])

    def pin(self, path: str) -> None:
        """Pin the shared map at ``path`` (a BPF filesystem) so applications
        hwtrace did not start can map it (``HWTRACE_COOP_PIN``).  The pin
        outlives hwtrace until removed: :meth:`close` removes it."""
        self.coop_map.pin(path)
        self.pinned = path

    def share_with_filters(self) -> None:
        """Point the userspace filter tiers' ``set_threshold``/``get_threshold``
        helpers at this map's thresholds: key = row * COLUMNS + call."""
        from ..filter.native import set_threshold_table  # llvmlite, numba: only when shared

        set_threshold_table(self.coop.thresholds.ctypes.data, self.coop.thresholds.size)

    def close(self) -> None:
        self.stop()
        if getattr(self, "pinned", None):
            try:
                os.unlink(self.pinned)
            except OSError:
                pass
            self.pinned = None
        if getattr(self, "coop", None) is not None:
            from ..filter.native import (  # llvmlite, numba: only when shared
                set_threshold_table,
                threshold_table_address,
            )

            if threshold_table_address() == self.coop.thresholds.ctypes.data:
                set_threshold_table(0)
            self.coop.close()
            self.coop = None  # type: ignore[assignment]
        self.tracepoints.close()
        for o in reversed(self._objects):
            o.close()
        self._objects = []

    def __enter__(self) -> LatencyTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
