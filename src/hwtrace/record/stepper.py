"""Single-step real processes, every thread, inside chosen code.

What is traced: the address ranges of chosen functions (``-f``, like an
Intel PT address filter) and the whole dynamic extent of chosen calls
(``--call``: from a function's entry until it returns, everything it calls
included).  Everything else runs at full speed.

``int3`` breakpoints sit at every range's start, at every traced call's
entry and at the resume points of frames that left the traced code (the
return address of a call that went outside a range, the interrupted
instruction of a signal whose handler is outside).  They stay in while the
process runs; a thread that hits one is single-stepped from there by the
compiled loop of :func:`hwtrace.record._native.step_threads`, which logs
each instruction's address, the stepping clock, the registers and the
thread, until the thread is about to run an instruction it does not trace.
The loop steps all such threads at once, waiting on any of them
(``wait4(-1, __WALL)``).  To run the instruction under a breakpoint, the
other free-running threads are stopped (``tgkill(SIGSTOP)``), the original
byte goes back for that one step and the ``int3`` after it; threads being
stepped need not stop, they run one known instruction at a time.

A call's extent ends when the stack pointer rises above its value at the
entry (the return popped it; a ``longjmp`` or an exception unwound past it;
a tail call's callee returned).  That is the cut a decoder makes in a trace
of the whole address space, and it is what Intel PT with tracing enabled at
the entry (TIP.PGE) and disabled at the return (TIP.PGD) shows.

Threads: every thread of the traced process is followed
(``PTRACE_O_TRACECLONE``; when attaching, every thread that exists), each
with its own log.  Child processes are followed with ``follow_fork``
(``PTRACE_O_TRACEFORK``/``VFORK``, through ``exec``, where the functions are
looked up again in the new program); otherwise a forked child gets its
copy of memory back without breakpoints and is let go, and a vfork child
(which shares its parent's memory) is watched, untraced, until it execs or
exits.  ``PTRACE_O_TRACEEXIT`` stops each thread as it exits, with its
registers, which tell whether its last stepped instruction ran.  A launched
or exec'd process runs free to its program's entry, where its libraries are
mapped and its functions are looked up; threads and children its libraries'
constructors start on the way (LTTng-UST starts its listener threads there)
are followed like any other.

Signals are passed through.  A signal stop while stepping means the logged
instruction has not run yet; the signal is delivered with a single step,
after which the thread is either in its handler (the instruction did not
run: an interrupt, logged as such when the handler is traced, else the
traced stretch ends with a resume point at the interrupted instruction), or
past the instruction (the signal was ignored), or gone.

The log of each thread is the state before each executed instruction, in
order, with :class:`Segment` rows saying where each stretch of tracing began
and how it ended.  Code is captured from the process's memory, page by
page, just before its first stepped instruction runs (breakpoint bytes put
back), so the log can be turned into Intel PT after the process is gone.
Before each step the instruction's bytes are compared with that capture:
code rewritten since (a JIT reusing its buffer, a static key patched) is
captured again, as a :class:`CodeChange` at the time it first ran, so each
instruction is known in the bytes it ran.

Limits: a range is noticed when entered at its start or at a resume point
(not when jumped into from outside elsewhere); ``int3`` executed by the
tracee inside traced code is taken for a single-step trap; a breakpoint's
instruction is stepped with the other free threads stopped, so one that
blocks until such a thread runs (a system call at a resume point waiting on
it) hangs the recording; mappings are read when a process image starts
(launch, attach, exec), not for code mapped later.
"""

from __future__ import annotations

import bisect
import errno
import os
import shutil
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..image.process import Mapping, program_entry, read_maps
from . import _native as nat
from .errors import RecordError
from .functions import TracedRange, resolve_functions

__all__ = [
    "END_EXIT",
    "END_LEFT",
    "END_LIMIT",
    "END_SIGNAL",
    "END_STOPPED",
    "Mapping",
    "ProcessImage",
    "RecordError",
    "Segment",
    "StepLog",
    "StepRecording",
    "TaskEvent",
    "TracedRange",
    "read_maps",
    "resolve_functions",
    "step_process",
    "step_threads",
]

# How a traced segment ended.
END_LEFT = "left"  # a branch, call or return went outside the traced code
END_SIGNAL = "signal"  # a signal handler outside the traced code interrupted it
END_EXIT = "exit"  # the thread exited (or was killed, or its process exec'd) in it
END_LIMIT = "limit"  # the instruction limit was reached
END_STOPPED = "stopped"  # recording stopped (an exec not followed)

REGISTERS_ALL = nat.REGISTER_NAMES
REGISTERS_BASIC = ("rip", "rsp", "eflags")

_PAGE = 0x1000
_PLAIN_TRAP = (signal.SIGTRAP << 8) | 0x7F  # a single-step (or int3) trap, no event
_OPTIONS = (
    nat.PTRACE_O_TRACECLONE
    | nat.PTRACE_O_TRACEFORK
    | nat.PTRACE_O_TRACEVFORK
    | nat.PTRACE_O_TRACEVFORKDONE
    | nat.PTRACE_O_TRACEEXEC
    | nat.PTRACE_O_TRACEEXIT
)


@dataclass(frozen=True)
class Segment:
    """Rows ``start .. end`` of a thread's log were traced without a break.

    ``end_ip`` is where execution went after row ``end - 1`` (0 when it is
    not known: the process exited there; for a signal handled outside the
    traced code, the interrupted instruction, where execution resumes),
    ``end_time`` when that was seen (stepping clock), ``end_reason`` one of
    the ``END_*`` strings and ``interrupts`` the signals delivered inside
    the segment to traced handlers: ``(row of the handler's first
    instruction, interrupted IP, signal)``.
    """

    start: int
    end: int
    end_ip: int
    end_time: int
    end_reason: str
    interrupts: tuple[tuple[int, int, int], ...] = ()


@dataclass
class StepLog:
    """What the stepper saw of one thread in one process image: one row per
    executed instruction it traced."""

    ips: np.ndarray  # uint64
    times: np.ndarray  # uint64, stepping clock before the instruction ran
    registers: np.ndarray  # uint64 (rows, len(register_names))
    register_names: tuple[str, ...]
    segments: list[Segment]
    ranges: list[TracedRange]
    pid: int
    comm: str
    argv: tuple[str, ...] | None  # None when attached
    maps: list[Mapping]
    clock: str  # "tsc" or "monotonic"
    code: dict[int, bytes]  # address -> code bytes there, as they were when first stepped
    exit_status: int | None = None  # wait status when the thread ended while recorded
    signals: list[tuple[int, int, bool]] = field(default_factory=list)  # (row, signal, caught)
    # PTWRITEs the stepper carried out for a CPU without them: (row, payload, size)
    ptwrites: list[tuple[int, int, int]] = field(default_factory=list)
    stopped_because: str = ""
    clock_pairs: list[tuple[int, int]] = field(default_factory=list)  # (stepping clock, ns)
    tid: int = 0  # 0: the pid
    cpu: int = -1  # the CPU the thread was on when its tracing began
    image: int = 0  # index of its process image in StepRecording.images
    calls: list[TracedRange] = field(default_factory=list)  # the traced calls' functions
    # Code rewritten after its first capture, in time order (its process
    # image's, shared by its threads).
    changes: list[CodeChange] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.tid:
            self.tid = self.pid
        self._starts = sorted(self.code)

    def code_versions(self) -> tuple[np.ndarray, list]:
        """Which version of the code each row ran in, and a ``read(address,
        size)`` per version: version ``v`` is the first captures with the
        first ``v`` :attr:`changes` on top."""
        times = np.array([c.time for c in self.changes], np.int64)
        versions = np.searchsorted(times, self.times.astype(np.int64), side="right")
        readers = [self.read_code]
        pages = dict(self.code)
        for k in range(int(versions.max()) if versions.shape[0] else 0):
            change = self.changes[k]
            pages[change.address] = change.data
            readers.append(_reader(dict(pages)))
        return versions, readers

    def register(self, name: str) -> np.ndarray:
        """One register's column, e.g. ``log.register("rsp")``."""
        try:
            return self.registers[:, self.register_names.index(name)]
        except ValueError:
            raise KeyError(f"register {name!r} was not logged") from None

    def read_code(self, address: int, size: int) -> bytes:
        """Code bytes as they were when first stepped (b"" where none was
        captured); a read runs on across adjacent captured chunks."""
        if len(self._starts) != len(self.code):
            self._starts = sorted(self.code)
        return _read_chunks(self.code, self._starts, address, size)


def _read_chunks(code: dict[int, bytes], starts: list[int], address: int, size: int) -> bytes:
    out = b""
    while size > 0:
        i = bisect.bisect_right(starts, address) - 1
        if i < 0:
            break
        start = starts[i]
        data = code[start]
        off = address - start
        if off >= len(data):
            break
        piece = data[off : off + size]
        out += piece
        address += len(piece)
        size -= len(piece)
    return out


def _reader(code: dict[int, bytes]):
    starts = sorted(code)
    return lambda address, size: _read_chunks(code, starts, address, size)


@dataclass(frozen=True)
class CodeChange:
    """A code page seen with new bytes: ``data`` (the whole page, the
    recorder's breakpoints taken out) from ``time`` (stepping clock, just
    before the step that first ran them) on; ``tid``, ``cpu`` and ``ip``
    say which thread ran them first, where."""

    time: int
    address: int
    data: bytes
    tid: int
    cpu: int
    ip: int


@dataclass(frozen=True)
class PageCapture:
    """When a code page was first captured (just before its first stepped
    instruction ran), by which thread, at which instruction."""

    time: int
    tid: int
    cpu: int
    ip: int


@dataclass(frozen=True)
class TaskEvent:
    """Something that happened to a thread or process, at ``time`` (stepping
    clock): ``kind`` is ``"start"`` (a process image was found: launch,
    attach; ``image`` says which), ``"exec"`` (a process image replaced its
    predecessor), ``"comm"`` (a thread's name, when it is first seen or has
    changed), ``"fork"`` (a thread or process created: ``ppid``/``ptid`` its
    creator) or ``"exit"``."""

    time: int
    kind: str
    pid: int
    tid: int
    ppid: int = 0
    ptid: int = 0
    comm: str = ""
    image: int = -1


@dataclass
class ProcessImage:
    """A process from its start (launch, attach, fork) or exec on: its
    mappings (when it started), traced ranges and calls, and the code
    captured from its memory."""

    pid: int
    comm: str
    argv: tuple[str, ...] | None
    maps: list[Mapping]
    ranges: list[TracedRange]
    calls: list[TracedRange]
    code: dict[int, bytes]
    time: int  # stepping clock when it was found
    exit_status: int | None = None
    vdso: bytes = b""  # the vDSO's bytes (its code runs untraced by no file)
    captures: dict[int, PageCapture] = field(default_factory=dict)  # of ``code``'s pages
    changes: list[CodeChange] = field(default_factory=list)  # code rewritten later


@dataclass
class StepRecording:
    """Everything the stepper saw: a :class:`StepLog` per thread (per process
    image), the processes' images and the thread/process events in order."""

    logs: list[StepLog]
    images: list[ProcessImage]
    events: list[TaskEvent]
    pid: int  # the launched or attached process
    clock: str
    clock_pairs: list[tuple[int, int]]
    stopped_because: str = ""
    exit_status: int | None = None  # the launched or attached process's
    notes: list[str] = field(default_factory=list)
    # How far a stepping-clock time converted to CLOCK_MONOTONIC through
    # the pairs may be off: half the widest window a pair was read in (the
    # two clocks taken to run at one rate in between).
    clock_error_ns: int = 0

    @property
    def main(self) -> StepLog:
        """The first thread of the launched or attached process."""
        return self.logs[0]


# -- /proc -------------------------------------------------------------------


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _thread_stat(pid: int, tid: int) -> tuple[str, int]:
    """A thread's name and the CPU it last ran on (``/proc/PID/task/TID/stat``)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            text = f.read()
    except OSError:
        return "", -1
    name = text[text.find("(") + 1 : text.rfind(")")]
    rest = text[text.rfind(")") + 2 :].split()
    return name, int(rest[36]) if len(rest) > 36 else -1  # field 39: processor


def _thread_state(pid: int, tid: int) -> str:
    """A thread's state letter (``t``: stopped by its tracer); "" when gone."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            text = f.read()
    except OSError:
        return ""
    return text[text.rfind(")") + 2 :][:1]


def _caught_signals(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _auxv_entry(pid: int) -> int:
    entry = program_entry(pid)
    if entry is None:
        raise RecordError(f"process {pid}: no AT_ENTRY in /proc/{pid}/auxv")
    return entry


def _describe_status(status: int) -> str:
    if os.WIFEXITED(status):
        return f"exited with status {os.WEXITSTATUS(status)}"
    if os.WIFSIGNALED(status):
        return f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"wait status {status:#x}"


def _wait(tid: int, status: np.ndarray) -> int:
    """``wait4(tid, __WALL)``, again on EINTR: the status, or -1 when there is
    nothing to wait for."""
    while True:
        r = nat.wait4(tid, status, nat.WALL)
        if r != -errno.EINTR:
            break
    return int(status[0]) if r > 0 else -1


# -- address spaces, processes and threads ----------------------------------------


def ptwrite_operand(code: bytes, ip: int, regs: np.ndarray, read) -> tuple[int, int, int] | None:
    """If ``code`` at ``ip`` is a PTWRITE: its operand's value (from the
    registers ``regs``, in ``REGISTER_NAMES`` order, or memory through
    ``read(address, size)``), its size in bytes and the next IP."""
    import iced_x86 as X

    insn = X.Decoder(64, code, ip=ip).decode()
    if insn.mnemonic != X.Mnemonic.PTWRITE:
        return None

    def reg(r: int) -> int:
        if r == X.Register.RIP:
            return 0  # iced gives RIP-relative displacements as absolute addresses
        full = X.RegisterExt.full_register(r)
        name = _REG_NAME.get(full)
        value = int(regs[nat.REGISTER_NAMES.index(name)]) if name else 0
        width = X.RegisterExt.size(r)
        return value & ((1 << (8 * width)) - 1)

    if insn.op0_kind == X.OpKind.REGISTER:
        size = X.RegisterExt.size(insn.op0_register)
        value = reg(insn.op0_register)
    else:
        size = 8 if insn.memory_size == X.MemorySize.UINT64 else 4
        address = insn.memory_displacement + reg(insn.memory_base)
        if insn.memory_index != X.Register.NONE:
            address += reg(insn.memory_index) * insn.memory_index_scale
        segment = insn.memory_segment
        if segment == X.Register.FS:
            address += int(regs[nat.REGISTER_NAMES.index("fs_base")])
        elif segment == X.Register.GS:
            address += int(regs[nat.REGISTER_NAMES.index("gs_base")])
        data = read(address & 0xFFFFFFFFFFFFFFFF, size)
        if len(data) != size:
            return None  # unreadable: let the program take its signal
        value = int.from_bytes(data, "little")
    return value, size, insn.next_ip


def _register_names() -> dict[int, str]:
    import iced_x86 as X

    return {
        getattr(X.Register, n.upper()): n
        for n in ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp")
        + tuple(f"r{k}" for k in range(8, 16))
    }


_REG_NAME = _register_names()


class _Space:
    """One address space: a process image's memory (shared by a vfork child
    until it execs) and the breakpoints in it.

    ``armed`` maps every address that should hold an ``int3`` to its original
    byte; ``lifted`` counts the step-overs that have the original byte back
    in for one instruction; ``gone`` remembers addresses whose breakpoint
    was taken out (a thread may have hit it just before).
    """

    def __init__(self, mem: int) -> None:
        self.mem = mem
        self.armed: dict[int, bytes] = {}
        self.lifted: dict[int, int] = {}
        self.gone: set[int] = set()
        self.entries: set[int] = set()  # range starts and call entries
        self.procs: list[_Proc] = []

    def read(self, address: int, size: int) -> bytes:
        try:
            return os.pread(self.mem, size, address)
        except OSError:
            return b""

    def write(self, address: int, data: bytes) -> None:
        try:
            os.pwrite(self.mem, data, address)
        except OSError as exc:
            raise RecordError(
                f"cannot write a breakpoint at {address:#x}: {exc.strerror}"
            ) from None

    def restore(self, address: int, data: bytes) -> None:
        """Write ``data`` back; memory that is gone (the process exited or
        exec'd) needs nothing.  Taking a breakpoint out (``data`` not int3)
        leaves bytes the process wrote over it since (code it patched)."""
        try:
            if data != b"\xcc" and os.pread(self.mem, 1, address) != b"\xcc":
                return
            os.pwrite(self.mem, data, address)
        except OSError:
            pass

    def arm(self, address: int) -> None:
        if address in self.armed:
            return
        orig = self.read(address, 1)
        if len(orig) != 1:
            return  # nothing mapped there: a thread that goes there faults
        self.armed[address] = orig
        self.gone.discard(address)
        if address not in self.lifted:
            self.write(address, b"\xcc")

    def wanted(self, address: int) -> bool:
        if address in self.entries:
            return True
        return any(address in t.pending for p in self.procs for t in p.threads)

    def refresh(self, address: int) -> None:
        """Take the breakpoint at ``address`` out if nothing wants it any more."""
        if address in self.armed and not self.wanted(address):
            orig = self.armed.pop(address)
            self.gone.add(address)
            if address not in self.lifted:
                self.restore(address, orig)

    def disarm_all(self) -> None:
        for address, orig in self.armed.items():
            self.gone.add(address)
            if address not in self.lifted:
                self.restore(address, orig)
        self.armed.clear()
        self.entries.clear()

    def lift(self, address: int) -> None:
        k = self.lifted.get(address, 0)
        self.lifted[address] = k + 1
        if k == 0 and address in self.armed:
            self.restore(address, self.armed[address])

    def drop(self, address: int) -> None:
        k = self.lifted.pop(address) - 1
        if k:
            self.lifted[address] = k
        elif address in self.armed:
            self.restore(address, b"\xcc")

    def rewritten(self, address: int, size: int) -> None:
        """The process wrote code over some of its breakpoints in ``address``
        .. ``address + size`` (a patched site): what it wrote is their
        original byte now, and the breakpoints go back in."""
        for a in [a for a in self.armed if address <= a < address + size]:
            if a in self.lifted:
                continue
            now = self.read(a, 1)
            if now and now != b"\xcc":
                self.armed[a] = now
                self.restore(a, b"\xcc")

    def original(self, address: int, data: bytes) -> bytes:
        """``data`` read at ``address`` with the original bytes under the
        breakpoints in it."""
        hit = [a for a in self.armed if address <= a < address + len(data) and a not in self.lifted]
        if not hit:
            return data
        buf = bytearray(data)
        for a in hit:
            buf[a - address] = self.armed[a][0]
        return bytes(buf)


class _Proc:
    """A traced process image: a pid from its start (launch, attach, fork) or
    exec on.  ``recorded`` False: its threads are never traced (a vfork child
    not followed, watched until it execs)."""

    def __init__(self, pid: int, index: int, space: _Space | None, recorded: bool) -> None:
        self.pid = pid
        self.index = index
        self.mem = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        self.space = space if space is not None else _Space(self.mem)
        self.space.procs.append(self)
        self.recorded = recorded
        self.threads: list[_Thread] = []
        self.ranges: list[TracedRange] = []
        self.calls: list[TracedRange] = []
        self.image: ProcessImage | None = None
        self.entry: tuple[int, bytes] | None = None  # running to the program's entry
        # How its image is set up there: argv, event kind, missing functions allowed.
        self.entry_setup: tuple[tuple[str, ...] | None, str, bool] = (None, "exec", True)
        self.alive = True

    def in_ranges(self, ip: int) -> bool:
        return any(r.start <= ip < r.end for r in self.ranges)

    def close(self) -> None:
        if self.mem >= 0:
            if self.space.mem == self.mem:
                others = [p for p in self.space.procs if p is not self and p.mem >= 0]
                self.space.mem = others[0].mem if others else -1
            os.close(self.mem)
            self.mem = -1
        if self in self.space.procs:
            self.space.procs.remove(self)


@dataclass
class _Delivery:
    """A signal being delivered to a stepped thread with single steps."""

    row: int  # the thread's row whose instruction has not run (-1: none in this stretch)
    ip: int  # the interrupted instruction
    rsp: int
    extent: int  # the thread's call extent then
    caught: bool = False
    last_signal: int = 0


class _Thread:
    """One thread in one process image (a slot of the step loop's arrays)."""

    def __init__(self, tid: int, proc: _Proc, slot: int, comm: str) -> None:
        self.tid = tid
        self.proc = proc
        self.slot = slot
        self.comm = comm
        self.new = True  # its first stop is still to come
        self.stepping = False  # inside traced code: a stretch is open
        self.running = False  # resumed with PTRACE_CONT, no report since
        self.held: int | None = None  # free, kept stopped while the world is: its signal
        self.sigstops = 0  # our SIGSTOPs not seen yet
        self.stepover: int | None = None  # the breakpoint address it is being stepped over
        self.delivery: _Delivery | None = None
        self.in_vfork = False  # blocked in vfork until the child execs or exits
        self.exiting = False
        self.gone = False
        self.detach_at_start = False
        self.seg_start = 0
        self.interrupts: list[tuple[int, int, int]] = []
        self.segments: list[Segment] = []
        self.signals: list[tuple[int, int, bool]] = []
        self.ptwrites: list[tuple[int, int, int]] = []  # (row, payload, size)
        self.pending: dict[int, list[tuple[int, int]]] = {}  # resume point -> (rsp, extent)
        self.exit_status: int | None = None
        self.exit_time: int | None = None
        self.cpu = -1


# -- the recorder -----------------------------------------------------------------


class _Recorder:
    """The event loop around :func:`hwtrace.record._native.step_threads`."""

    def __init__(
        self,
        functions: Sequence[str],
        calls: Sequence[str],
        ranges: Sequence[tuple[int, int]],
        clock: str,
        register_names: tuple[str, ...],
        max_instructions: int | None,
        follow_fork: bool,
    ) -> None:
        self.functions = list(functions)
        self.call_names = list(calls)
        self.abs_ranges = [TracedRange(lo, hi) for lo, hi in ranges]
        self.clock = nat.CLOCK_TSC if clock == "tsc" else nat.CLOCK_MONO
        self.names = register_names
        self.rsp_col = register_names.index("rsp")
        self.cols = np.array([nat.REGISTER_NAMES.index(n) for n in register_names], np.int64)
        self.limit = max_instructions if max_instructions is not None else (1 << 62)
        self.follow_fork = follow_fork
        cap = 1 << 14
        self.ips = np.zeros(cap, np.uint64)
        self.times = np.zeros(cap, np.uint64)
        self.regs = np.zeros((cap, len(self.cols)), np.uint64)
        self.rslot = np.full(cap, -1, np.int64)
        self.n = 0
        nslot = 8
        self.tids = np.zeros(nslot, np.int64)
        self.sproc = np.zeros(nslot, np.int64)
        self.extent = np.zeros(nslot, np.uint64)
        self.count = np.zeros(nslot, np.int64)
        self.last = np.full(nslot, -1, np.int64)
        self.restart = np.zeros(nslot, np.int64)
        self.mode = np.zeros(nslot, np.int64)
        self.kick = np.zeros(nslot, np.int64)
        self.slots: list[_Thread] = []
        self.procs: list[_Proc] = []
        self.images: list[ProcessImage] = []
        self.events: list[TaskEvent] = []
        self.by_tid: dict[int, _Thread] = {}
        self.early: dict[int, int] = {}  # reports of tasks not announced yet
        self.deferred: list[tuple[_Thread, int]] = []
        self.stepovers: set[_Thread] = set()
        self.world_stopped = False
        self.recording = True
        self.stopped_because = ""
        self.notes: list[str] = []
        self.exit_statuses: dict[int, int] = {}
        self.launched = True
        self.scratch = np.zeros(nat.N_REGS, np.uint64)
        self.regbuf = np.zeros(nat.N_REGS, np.uint64)
        self.out = np.zeros(8, np.int64)
        self.step_work = nat.step_work()
        self.status = np.zeros(2, np.int32)
        self.siginfo = np.zeros(16, np.uint64)
        self.msg = np.zeros(1, np.uint64)
        self.ts = np.zeros(2, np.int64)
        # Captured code pages: sorted keys, each one's row in page_data.
        self.pages = np.zeros(0, np.uint64)
        self.page_rows = np.zeros(0, np.int64)
        self.page_data = np.zeros((64, _PAGE), np.uint8)
        self.page_valid = np.zeros(64, np.int64)
        self.mems = np.zeros(0, np.int64)
        self.codebuf = np.zeros(16, np.uint8)
        self._points()
        self._ranges()

    # -- clock and ptrace ------------------------------------------------------

    def now(self) -> int:
        return int(nat.rdtsc()) if self.clock == nat.CLOCK_TSC else int(nat.monotonic_ns(self.ts))

    def ptrace(self, request: int, t: _Thread, data: int = 0, what: str = "ptrace") -> int:
        """A ptrace request on ``t``; ESRCH (the thread is dying; its report
        will come) is returned, other failures raise."""
        r = int(nat.ptrace(request, t.tid, 0, data))
        if r < 0 and r != -errno.ESRCH:
            raise RecordError(f"thread {t.tid}: {what} failed: {os.strerror(-r)}")
        return r

    def getregs(self, t: _Thread) -> np.ndarray | None:
        r = self.ptrace(nat.PTRACE_GETREGS, t, self.regbuf.ctypes.data, "PTRACE_GETREGS")
        return None if r < 0 else self.regbuf

    def setregs(self, t: _Thread) -> None:
        self.ptrace(nat.PTRACE_SETREGS, t, self.regbuf.ctypes.data, "PTRACE_SETREGS")

    def event_msg(self, t: _Thread) -> int:
        self.ptrace(nat.PTRACE_GETEVENTMSG, t, self.msg.ctypes.data, "PTRACE_GETEVENTMSG")
        return int(self.msg[0])

    def group_stop(self, t: _Thread) -> bool:
        """Whether the current stop is a group-stop (no signal to deliver)."""
        r = nat.ptrace(nat.PTRACE_GETSIGINFO, t.tid, 0, self.siginfo.ctypes.data)
        return r == -errno.EINVAL

    # -- bookkeeping -------------------------------------------------------------

    def add_proc(self, pid: int, space: _Space | None, recorded: bool) -> _Proc:
        proc = _Proc(pid, len(self.procs), space, recorded)
        self.procs.append(proc)
        return proc

    def add_thread(self, tid: int, proc: _Proc, comm: str) -> _Thread:
        slot = len(self.slots)
        if slot >= self.tids.shape[0]:
            size = 2 * self.tids.shape[0]
            for name in ("tids", "sproc", "extent", "count", "restart", "mode", "kick"):
                setattr(self, name, np.resize(getattr(self, name), size))
                getattr(self, name)[slot:] = 0
            self.last = np.resize(self.last, size)
            self.last[slot:] = -1
        t = _Thread(tid, proc, slot, comm)
        self.slots.append(t)
        self.tids[slot] = tid
        self.sproc[slot] = proc.index
        self.extent[slot] = 0
        self.count[slot] = 0
        self.last[slot] = -1
        self.restart[slot] = 0
        self.mode[slot] = 0
        self.kick[slot] = 0
        proc.threads.append(t)
        self.by_tid[tid] = t
        return t

    def retire(self, t: _Thread) -> None:
        """The thread (in this process image) is done: its slot takes no reports."""
        t.gone = True
        self.tids[t.slot] = 0
        self.mode[t.slot] = 0
        self.kick[t.slot] = 0
        self.stepovers.discard(t)
        if self.by_tid.get(t.tid) is t:
            del self.by_tid[t.tid]
        proc = t.proc
        if t in proc.threads:
            proc.threads.remove(t)
        for a in list(t.pending):
            del t.pending[a]
            if proc.space.mem >= 0:
                proc.space.refresh(a)
        if not proc.threads and proc.alive:
            proc.alive = False
            proc.close()
        self._points()

    def _points(self) -> None:
        """The breakpoints actually in memory, for the loop."""
        addrs, owner = [], []
        for p in self.procs:
            if not p.alive:
                continue
            for a in p.space.armed:
                if a not in p.space.lifted:
                    addrs.append(a)
                    owner.append(p.index)
        self.bpt = np.array(addrs, np.uint64)
        self.bown = np.array(owner, np.int64)
        # Where the loop reads each process's code (see _native._code_changed).
        self.mems = np.array([p.mem if p.alive else -1 for p in self.procs], np.int64)

    def _ranges(self) -> None:
        lo, hi, owner = [], [], []
        for p in self.procs:
            if p.alive and p.recorded and self.recording:
                for r in p.ranges:
                    lo.append(r.start)
                    hi.append(r.end)
                    owner.append(p.index)
        self.rlo = np.array(lo, np.uint64)
        self.rhi = np.array(hi, np.uint64)
        self.rown = np.array(owner, np.int64)

    def _page(self, key: int, rewritten: bool = False) -> tuple[_Proc, int, bytes]:
        """A code page's process, address and bytes now (breakpoints taken
        out; ``rewritten``: the process may have written over some)."""
        proc = self.procs[key >> nat.PAGE_KEY_SHIFT]
        address = (key & ((1 << nat.PAGE_KEY_SHIFT) - 1)) << 12
        if rewritten:
            proc.space.rewritten(address, _PAGE)
        try:
            data = os.pread(proc.mem, _PAGE, address)
        except OSError:
            data = b""
        return proc, address, proc.space.original(address, data) if data else b""

    def capture(self, key: int, t: _Thread, when: int) -> None:
        """Copy a code page from the process's memory (breakpoints taken out)."""
        proc, address, data = self._page(key)
        if proc.image is not None and data:
            proc.image.code[address] = data
            ip = int(self.scratch[nat.R_RIP])
            proc.image.captures[address] = PageCapture(when, t.tid, t.cpu, ip)
        row = len(self.pages)
        if row >= self.page_data.shape[0]:
            grown = np.zeros((2 * row, _PAGE), np.uint8)
            grown[:row] = self.page_data
            self.page_data = grown
            self.page_valid = np.resize(self.page_valid, 2 * row)
        self.page_data[row, : len(data)] = np.frombuffer(data, np.uint8)
        self.page_valid[row] = len(data)
        i = int(np.searchsorted(self.pages, np.uint64(key)))
        self.pages = np.insert(self.pages, i, np.uint64(key))
        self.page_rows = np.insert(self.page_rows, i, row)

    def recapture(self, key: int, t: _Thread, when: int) -> None:
        """A captured code page holds other bytes now: keep them as a change
        from ``when`` on (the thread is about to run them)."""
        proc, address, data = self._page(key, rewritten=True)
        i = int(np.searchsorted(self.pages, np.uint64(key)))
        row = int(self.page_rows[i])
        old = self.page_data[row, : self.page_valid[row]].tobytes()
        self.page_data[row, : len(data)] = np.frombuffer(data, np.uint8)
        self.page_valid[row] = len(data)
        if data == old:
            # Only a breakpoint the loop did not know of yet.
            self._points()
        elif data and proc.image is not None:
            ip = int(self.scratch[nat.R_RIP])
            proc.image.changes.append(CodeChange(when, address, data, t.tid, t.cpu, ip))

    def grow(self) -> None:
        cap = self.ips.shape[0] * 2
        self.ips = np.resize(self.ips, cap)
        self.times = np.resize(self.times, cap)
        self.rslot = np.resize(self.rslot, cap)
        self.rslot[self.n :] = -1
        regs = np.zeros((cap, self.regs.shape[1]), np.uint64)
        regs[: self.n] = self.regs[: self.n]
        self.regs = regs

    def row_pending(self, t: _Thread) -> bool:
        """Whether the thread's last logged row, in its open stretch, has not
        run yet (at a signal stop: not when it was a system call whose
        restart was being stepped through)."""
        s = t.slot
        return bool(self.count[s] > t.seg_start and not self.restart[s])

    def drop_last(self, t: _Thread) -> None:
        """The thread's last logged instruction did not run: forget it."""
        s = t.slot
        g = int(self.last[s])
        if g < 0:
            return
        self.rslot[g] = -1
        self.count[s] -= 1
        self.last[s] = nat.previous_row(self.rslot, g, s)

    # -- stretches -----------------------------------------------------------------

    def inside(self, t: _Thread, ip: int, rsp: int) -> bool:
        e = int(self.extent[t.slot])
        return bool(e and rsp <= e) or t.proc.in_ranges(ip)

    def begin_stretch(self, t: _Thread) -> None:
        t.stepping = True
        t.seg_start = int(self.count[t.slot])
        t.interrupts = []
        comm, cpu = _thread_stat(t.proc.pid, t.tid)
        if t.cpu < 0:
            t.cpu = cpu
        if comm and comm != t.comm:
            t.comm = comm
            self.events.append(TaskEvent(self.now(), "comm", t.proc.pid, t.tid, comm=comm))

    def close_segment(self, t: _Thread, end_ip: int, end_time: int, reason: str) -> None:
        c = int(self.count[t.slot])
        if c > t.seg_start:
            t.segments.append(
                Segment(t.seg_start, c, end_ip, end_time, reason, tuple(t.interrupts))
            )
        t.seg_start = c
        t.interrupts = []
        t.stepping = False
        self.mode[t.slot] = 0

    def consume(self, t: _Thread, at: int, rsp: int) -> int:
        """Forget ``t``'s resume points of frames at or below the current one;
        the call extent saved with the one at ``at`` (0: none)."""
        found = 0
        space = t.proc.space
        for a in list(t.pending):
            keep = []
            for e_rsp, ext in t.pending[a]:
                if e_rsp > rsp or (e_rsp == rsp and a != at):
                    keep.append((e_rsp, ext))
                elif a == at and e_rsp == rsp:
                    found = found or ext
            if keep:
                t.pending[a] = keep
            else:
                del t.pending[a]
                space.refresh(a)
        return found

    def add_resume_point(self, t: _Thread, at: int, rsp: int, extent: int) -> None:
        t.pending.setdefault(at, []).append((rsp, extent))
        self.arm(t.proc.space, at)

    def arm(self, space: _Space, at: int) -> None:
        """A breakpoint at ``at``; threads the loop has just stepped there (in
        flight) keep the original byte until their step is seen."""
        if at in space.armed:
            return
        takers = self.borrowers(None, space, at)
        if takers:
            self.stop_world()
        self.hold_original(takers, space, at)
        space.arm(at)

    def hold_original(self, takers: list[_Thread], space: _Space, at: int) -> None:
        """Threads stepped at ``at`` while its original byte was there, their
        step not seen yet: the byte stays lifted for them until it is."""
        for b in takers:
            space.lift(at)
            b.stepover = at
            self.stepovers.add(b)
            self.mode[b.slot] = 0

    def note_call(self, t: _Thread, rsp: int) -> None:
        """If the last stepped instruction was a call leaving the ranges, the
        frame resumes at its return address: a resume point."""
        s = t.slot
        if self.count[s] <= t.seg_start:
            return
        last = int(self.last[s])
        prev_ip = int(self.ips[last])
        prev_rsp = int(self.regs[last, self.rsp_col])
        if rsp != prev_rsp - 8:
            return
        data = t.proc.space.read(rsp, 8)
        if len(data) != 8:
            return
        ret = int.from_bytes(data, "little")
        if not (prev_ip < ret <= prev_ip + 15) or not t.proc.in_ranges(ret):
            return
        self.add_resume_point(t, ret, prev_rsp, 0)

    # -- resuming ------------------------------------------------------------------

    def resume_free(self, t: _Thread, sig: int) -> None:
        self.mode[t.slot] = 0
        if self.world_stopped and not t.exiting:
            t.held = sig
            return
        if self.ptrace(nat.PTRACE_CONT, t, sig, "PTRACE_CONT") == 0:
            t.running = True

    def step(self, t: _Thread, sig: int = 0) -> None:
        """One single step issued from here (its report comes back to the loop)."""
        self.ptrace(nat.PTRACE_SINGLESTEP, t, sig, "PTRACE_SINGLESTEP")

    def borrowers(self, t: _Thread | None, space: _Space, at: int) -> list[_Thread]:
        """Threads (other than ``t``) the loop stepped at ``at`` (their last
        row) while it held its original byte, whose step has not been seen:
        in flight."""
        out = []
        for b in self.slots:
            s = b.slot
            if b is t or b.gone or b.proc.space is not space or b.stepover is not None:
                continue
            if self.mode[s] == 1 and not self.kick[s] and self.last[s] >= 0:
                if int(self.ips[int(self.last[s])]) == at:
                    out.append(b)
        return out

    def resume_as_before(self, t: _Thread) -> None:
        """Go on after a stop that interrupted what the thread was doing."""
        if t.stepping or t.stepover is not None or t.delivery is not None:
            regs = self.getregs(t)
            if regs is None:
                return
            rip = int(regs[nat.R_RIP])
            if rip in t.proc.space.armed and t.stepover != rip:
                self.lift(t, rip)  # the step may run the instruction under it
            self.step(t)
        else:
            self.resume_free(t, 0)

    def stop_world(self) -> None:
        """Stop every free-running thread (for a breakpoint's step-over)."""
        if self.world_stopped:
            return
        self.world_stopped = True
        targets = [
            t for t in self.slots if t.running and not t.gone and not t.in_vfork and not t.exiting
        ]
        for t in targets:
            if nat.tgkill(t.proc.pid, t.tid, signal.SIGSTOP) == 0:
                t.sigstops += 1
        for t in targets:
            st = _wait(t.tid, self.status)
            t.running = False
            if st < 0:
                continue
            if os.WIFSTOPPED(st) and os.WSTOPSIG(st) == signal.SIGSTOP and not st >> 16:
                if t.sigstops:
                    t.sigstops -= 1
                    t.held = 0
                    continue
            self.deferred.append((t, st))

    def resume_world(self) -> None:
        self.world_stopped = False
        for t in self.slots:
            if t.held is not None and not t.gone:
                sig, t.held = t.held, None
                self.resume_free(t, sig)

    def lift(self, t: _Thread, at: int) -> None:
        """Put the original byte back under the breakpoint at ``at`` for
        ``t``'s next step, with the other free threads stopped; its next
        report ends that (:meth:`end_stepover`)."""
        self.stop_world()
        t.proc.space.lift(at)
        t.stepover = at
        self.stepovers.add(t)
        self._points()
        self.mode[t.slot] = 0

    def step_over(self, t: _Thread, at: int, log: bool) -> None:
        """Run the instruction under the breakpoint at ``at``; logged (and
        stepping on) when ``log``."""
        self.lift(t, at)
        if log:
            self.kick[t.slot] = 1
        else:
            self.step(t)

    def end_stepover(self, t: _Thread) -> None:
        at, t.stepover = t.stepover, None
        self.stepovers.discard(t)
        if at is not None and t.proc.mem >= 0:
            self.hold_original(self.borrowers(t, t.proc.space, at), t.proc.space, at)
            t.proc.space.drop(at)
        self._points()
        if t.stepping:
            self.mode[t.slot] = 1
        if not self.stepovers and self.world_stopped:
            self.resume_world()

    # -- the loop ---------------------------------------------------------------------

    def live(self) -> bool:
        return any(not t.gone for t in self.slots)

    def busy(self) -> bool:
        """Whether a thread is being stepped (a report of it is still to come)."""
        return any(
            not t.gone and (t.stepping or t.stepover is not None or t.delivery is not None)
            for t in self.slots
        )

    def run(self) -> None:
        while True:
            while self.deferred:
                t, st = self.deferred.pop(0)
                self.report(t.tid, t, st)
            if not self.live():
                return
            if not self.recording and not self.launched and not self.busy():
                return  # attached: let it go (detach_all)
            limit = min(self.limit, self.ips.shape[0])
            n, why = nat.step_threads(
                (self.tids, self.sproc, self.extent, self.count, self.last, self.restart),
                self.mode, self.kick,
                (self.ips, self.times, self.regs, self.rslot), self.cols, self.n, limit,
                (self.rlo, self.rhi, self.rown), (self.bpt, self.bown),
                (self.pages, self.page_rows, self.page_data, self.page_valid, self.mems,
                 self.codebuf),
                self.clock, self.scratch, self.out, self.step_work,
            )  # fmt: skip
            self.n = int(n)
            out = self.out
            s = int(out[0])
            t = self.slots[s] if 0 <= s < len(self.slots) else None
            if why == nat.STOP_EVENT:
                pid = int(out[3])
                self.report(pid, t if t is not None else self.by_tid.get(pid), int(out[1]))
            elif why == nat.STOP_LEFT:
                self.left(t, int(out[2]))
            elif why == nat.STOP_BREAKPOINT:
                self.at_point(t, int(out[2]))
            elif why == nat.STOP_NEWPAGE:
                self.capture(int(out[5]), t, int(out[2]))
                self.kick[s] = 1
            elif why == nat.STOP_CHANGED:
                self.recapture(int(out[5]), t, int(out[2]))
                self.kick[s] = 1
            elif why == nat.STOP_PTWRITE:
                if self.carry_out_ptwrite(t):
                    self.kick[s] = 1
                else:
                    self.step(t)  # not one after all: it runs, its trap comes as any step's
            elif why == nat.STOP_FULL:
                if self.n >= self.limit:
                    ip = int(self.scratch[nat.R_RIP])
                    if t.stepover is not None:
                        self.end_stepover(t)
                    self.close_segment(t, ip, int(out[2]), END_LIMIT)
                    self.resume_free(t, 0)
                    self.stop_recording(f"the instruction limit ({self.limit}) was reached")
                else:
                    self.grow()
                    self.kick[s] = 1
            elif why == nat.STOP_ERROR:
                r = int(out[1])
                if r != -errno.ESRCH or t is None:
                    raise RecordError(f"ptrace failed: {os.strerror(-r)}")
                # The thread is being killed; its exit report will come.
                if out[4]:
                    self.drop_last(t)
            elif why == nat.STOP_NOCHILD:
                for t in self.slots:
                    if not t.gone:
                        self.retire(t)
                return
            # STOP_INTR: back to the interpreter, which raises for ^C.

    # -- what the loop hands back ----------------------------------------------------------

    def left(self, t: _Thread, when: int) -> None:
        """``t`` is about to run an instruction it does not trace."""
        self.note_call(t, int(self.scratch[nat.R_RSP]))
        self.close_segment(t, int(self.scratch[nat.R_RIP]), when, END_LEFT)
        self.resume_free(t, 0)

    def at_point(self, t: _Thread, when: int) -> None:
        """``t``, being stepped, is about to run a breakpoint's instruction."""
        ip = int(self.scratch[nat.R_RIP])
        rsp = int(self.scratch[nat.R_RSP])
        self.enter(t, ip, rsp)
        if self.inside(t, ip, rsp):
            self.step_over(t, ip, log=True)
        else:
            self.left(t, when)  # it runs into the breakpoint again, free

    def enter(self, t: _Thread, ip: int, rsp: int) -> None:
        """A thread at a breakpoint: its resume point is used up; a traced
        call's entry opens the call's extent."""
        ext = self.consume(t, ip, rsp)
        if not (self.recording and t.proc.recorded):
            return
        s = t.slot
        if ext and not self.extent[s]:
            self.extent[s] = ext
        if not self.extent[s] and any(c.start == ip for c in t.proc.calls):
            self.extent[s] = rsp

    def hit(self, t: _Thread, at: int, regs: np.ndarray) -> None:
        """A free thread hit the breakpoint at ``at``."""
        regs[nat.R_RIP] = at
        self.setregs(t)
        rsp = int(regs[nat.R_RSP])
        self.enter(t, at, rsp)
        inside = self.recording and t.proc.recorded and self.inside(t, at, rsp)
        if inside:
            self.begin_stretch(t)
        if at in t.proc.space.armed:
            self.step_over(t, at, log=inside)
        elif inside:  # taken out meanwhile: nothing to step over
            self.mode[t.slot] = 1
            self.kick[t.slot] = 1
        else:
            self.resume_free(t, 0)

    def report(self, pid: int, t: _Thread | None, st: int) -> None:
        """A wait status the loop does not handle itself."""
        if t is None or t.gone:
            if t is None and os.WIFSTOPPED(st):
                self.early[pid] = st  # a new task; its creator's event comes later
            return
        t.running = False
        if os.WIFEXITED(st) or os.WIFSIGNALED(st):
            self.exited(t, st)
            return
        if t.new:
            self.started(t, st)
            return
        event = st >> 16
        sig = os.WSTOPSIG(st)
        if not event and sig == signal.SIGSTOP and t.sigstops:
            # Ours, from stopping the world: whatever was under way goes on
            # (a step-over's instruction has not run yet).
            t.sigstops -= 1
            self.resume_as_before(t)
            return
        stepped_over = t.stepover is not None
        if stepped_over:
            self.end_stepover(t)
        if event:
            self.event(t, event)
            return
        if proc_entry := t.proc.entry:
            if st == _PLAIN_TRAP:
                regs = self.getregs(t)
                if regs is not None and int(regs[nat.R_RIP]) - 1 == proc_entry[0]:
                    self.reached_entry(t, regs)
                    return
        if t.stepping and not self.recording:
            self.end_stretch(t, st)
            return
        if t.delivery is not None:
            self.deliver_next(t, st)
            return
        if t.stepping:
            if st == _PLAIN_TRAP or self.emulate_ptwrite(t, st):
                self.mode[t.slot] = 1
                self.kick[t.slot] = 1
            else:
                self.deliver_begin(t, st)
            return
        if st == _PLAIN_TRAP:
            if stepped_over:
                self.resume_free(t, 0)
                return
            regs = self.getregs(t)
            if regs is None:
                return
            at = int(regs[nat.R_RIP]) - 1
            space = t.proc.space
            if at in space.armed:
                self.hit(t, at, regs)
                return
            if at in space.gone:  # hit just before it was taken out
                regs[nat.R_RIP] = at
                self.setregs(t)
                self.resume_free(t, 0)
                return
        if self.group_stop(t):
            self.resume_free(t, 0)
        else:
            self.resume_free(t, sig)

    def started(self, t: _Thread, st: int) -> None:
        """The first stop of a new thread or process."""
        t.new = False
        if not os.WIFSTOPPED(st) or os.WSTOPSIG(st) != signal.SIGSTOP or st >> 16:
            self.report(t.tid, t, st)  # not the usual SIGSTOP: take it as it comes
            return
        if t.detach_at_start:
            nat.ptrace(nat.PTRACE_DETACH, t.tid, 0, 0)
            self.retire(t)
            return
        self.started_free(t)

    def event(self, t: _Thread, event: int) -> None:
        if event == nat.PTRACE_EVENT_EXIT:
            self.exiting(t)
        elif event in (nat.PTRACE_EVENT_CLONE, nat.PTRACE_EVENT_FORK, nat.PTRACE_EVENT_VFORK):
            child = self.event_msg(t)
            self.spawned(t, event, child)
            if event == nat.PTRACE_EVENT_VFORK:
                t.in_vfork = True
            self.resume_as_before(t)
        elif event == nat.PTRACE_EVENT_VFORK_DONE:
            t.in_vfork = False
            self.resume_as_before(t)
        elif event == nat.PTRACE_EVENT_EXEC:
            self.execed(t)
        else:
            self.resume_as_before(t)

    def exiting(self, t: _Thread) -> None:
        """PTRACE_EVENT_EXIT: the thread is on its way out; its registers say
        whether its last stepped instruction ran (the exit system call did,
        an instruction a fatal signal or another thread's exit_group
        interrupted did not)."""
        t.exiting = True
        t.exit_time = self.now()
        t.delivery = None
        if t.stepping:
            regs = self.getregs(t)
            end_ip = 0
            if regs is not None:
                end_ip = int(regs[nat.R_RIP])
                s = t.slot
                if self.row_pending(t) and int(self.ips[int(self.last[s])]) == end_ip:
                    self.drop_last(t)
            self.close_segment(t, end_ip, self.now(), END_EXIT)
        self.mode[t.slot] = 0
        self.ptrace(nat.PTRACE_CONT, t, 0, "PTRACE_CONT")

    def exited(self, t: _Thread, st: int) -> None:
        if t.stepping:  # no PTRACE_EVENT_EXIT stop was seen
            end_ip = 0
            if os.WIFSIGNALED(st) and self.row_pending(t):
                end_ip = int(self.ips[int(self.last[t.slot])])
                self.drop_last(t)
            self.close_segment(t, end_ip, self.now(), END_EXIT)
        t.exit_status = st
        proc = t.proc
        if t.tid == proc.pid:
            self.exit_statuses[proc.pid] = st
            if proc.image is not None:
                proc.image.exit_status = st
        when = t.exit_time if t.exit_time is not None else self.now()
        self.events.append(TaskEvent(when, "exit", proc.pid, t.tid))
        self.retire(t)

    def spawned(self, t: _Thread, event: int, child: int) -> None:
        now = self.now()
        proc = t.proc
        if event == nat.PTRACE_EVENT_CLONE:
            nt = self.add_thread(child, proc, t.comm)
            self.events.append(TaskEvent(now, "fork", proc.pid, child, proc.pid, t.tid))
        else:
            follow = self.follow_fork and proc.recorded and self.recording
            if event == nat.PTRACE_EVENT_VFORK or follow:
                shared = proc.space if event == nat.PTRACE_EVENT_VFORK else None
                cp = self.add_proc(child, shared, follow)
                if shared is None:  # a copy of the parent's memory, breakpoints and all
                    space = cp.space
                    space.armed = dict(proc.space.armed)
                    space.entries = set(proc.space.entries)
                    for a in proc.space.lifted:
                        if a in space.armed:
                            space.write(a, b"\xcc")
                cp.ranges, cp.calls = list(proc.ranges), list(proc.calls)
                cp.entry, cp.entry_setup = proc.entry, proc.entry_setup
                if proc.image is not None:
                    img = proc.image
                    cp.image = ProcessImage(
                        child, img.comm, img.argv, img.maps, cp.ranges, cp.calls, {}, now,
                        vdso=img.vdso,
                    )  # fmt: skip
                    if follow:
                        self.images.append(cp.image)
                nt = self.add_thread(child, cp, t.comm)
                if follow:  # it goes on in the same calls, on its copy of the stack
                    self.extent[nt.slot] = self.extent[t.slot]
                    self.events.append(TaskEvent(now, "fork", child, child, proc.pid, t.tid))
                self._ranges()
                self._points()
            else:
                # Not followed: its copy of memory gets the original bytes back.
                mem = os.open(f"/proc/{child}/mem", os.O_RDWR)
                try:
                    for a, orig in proc.space.armed.items():
                        if a not in proc.space.lifted:
                            os.pwrite(mem, orig, a)
                    if proc.entry is not None:  # forked before its parent reached the entry
                        os.pwrite(mem, proc.entry[1], proc.entry[0])
                finally:
                    os.close(mem)
                ghost = self.add_proc(child, None, False)
                nt = self.add_thread(child, ghost, t.comm)
                nt.detach_at_start = True
        if child in self.early:
            self.report(child, nt, self.early.pop(child))

    def execed(self, t: _Thread) -> None:
        former = self.event_msg(t)
        proc = t.proc
        pid = proc.pid
        if former != t.tid and former in self.by_tid:
            # A thread other than the leader exec'd: it is the leader now.
            leader, t = t, self.by_tid[former]
            self.retire(leader)
            del self.by_tid[former]
            t.tid = pid
            self.by_tid[pid] = t
        for other in list(proc.threads):
            if other is not t:
                self.retire(other)
        if t.stepping:
            self.close_segment(t, 0, self.now(), END_EXIT)  # the old image ran its last
        if not proc.recorded:  # an unfollowed vfork child: its own memory now
            nat.ptrace(nat.PTRACE_DETACH, pid, 0, 0)
            self.retire(t)
            return
        follow = self.follow_fork and self.recording
        self.retire(t)
        np_ = self.add_proc(pid, None, follow)
        nt = self.add_thread(pid, np_, _comm(pid))
        nt.new = False
        if not follow:  # watched on, untraced
            if self.recording:
                self.stop_recording("the process called exec")
            self.resume_free(nt, 0)
            return
        # Followed: a new image; run it to its program's entry to read it.
        self.run_to_entry(np_, nt, None, "exec", missing_ok=True)

    def run_to_entry(
        self, proc: _Proc, t: _Thread, argv: tuple[str, ...] | None, kind: str, missing_ok: bool
    ) -> None:
        """Set a process that is at its exec going to its program's entry,
        where its libraries are mapped and its image is read.  It runs in the
        loop like any other: library constructors may start threads (LTTng-UST
        starts its listeners there), fork or take signals on the way."""
        entry = _auxv_entry(proc.pid)
        proc.entry = (entry, proc.space.read(entry, 1))
        proc.entry_setup = (argv, kind, missing_ok)
        proc.space.write(entry, b"\xcc")
        self.resume_free(t, 0)

    def reached_entry(self, t: _Thread, regs: np.ndarray) -> None:
        """A launched or exec'd (followed) process reached its program's entry."""
        proc = t.proc
        entry, orig = proc.entry
        proc.entry = None
        proc.space.write(entry, orig)
        regs[nat.R_RIP] = entry
        self.setregs(t)
        argv, kind, missing_ok = proc.entry_setup
        self.setup_image(proc, argv, kind, missing_ok)
        t.comm = proc.image.comm
        self.started_free(t)

    def started_free(self, t: _Thread) -> None:
        """Set a stopped thread going from where it is: stepped when it is
        in its traced code, through the breakpoint when it is at one (not run
        yet: as if hit), else free."""
        regs = self.getregs(t)
        if regs is None:
            return
        ip, rsp = int(regs[nat.R_RIP]), int(regs[nat.R_RSP])
        if ip in t.proc.space.armed:
            self.hit(t, ip, regs)
        elif self.recording and t.proc.recorded and self.inside(t, ip, rsp):
            self.begin_stretch(t)
            self.mode[t.slot] = 1
            self.kick[t.slot] = 1
        else:
            self.resume_free(t, 0)

    # -- PTWRITE on a CPU without it ---------------------------------------------------

    def emulate_ptwrite(self, t: _Thread, st: int) -> bool:
        """A SIGILL at a PTWRITE the CPU lacks, while stepping: do what the
        instruction would (log its operand, as the PTW packet Intel PT would
        write) and go on after it, so software recording carries PTWRITE
        events as hardware does.  False: not that (the signal is delivered)."""
        if os.WSTOPSIG(st) != signal.SIGILL or st >> 16 or not self.row_pending(t):
            return False
        if self.group_stop(t):
            return False
        return self.carry_out_ptwrite(t)

    def carry_out_ptwrite(self, t: _Thread) -> bool:
        """The thread stands at its last logged row, a PTWRITE that has not
        run: log its operand (the PTW packet Intel PT would write) and put
        the thread after it.  False: it is not one (nothing done)."""
        regs = self.getregs(t)
        if regs is None:
            return False
        rip = int(regs[nat.R_RIP])
        if rip != int(self.ips[int(self.last[t.slot])]):
            return False
        got = ptwrite_operand(
            t.proc.space.original(rip, t.proc.space.read(rip, 15)), rip, regs, t.proc.space.read
        )
        if got is None:
            return False
        payload, size, next_ip = got
        t.ptwrites.append((int(self.count[t.slot]) - 1, payload, size))
        regs[nat.R_RIP] = next_ip
        self.setregs(t)
        return True

    # -- signals while stepping ------------------------------------------------------

    def deliver_begin(self, t: _Thread, st: int) -> None:
        """A signal stop while stepping: the last logged instruction has not
        run.  Deliver the signal(s) with single steps and see where the
        thread went."""
        s = t.slot
        regs = self.getregs(t)
        if regs is None:
            return
        row = int(self.count[s]) - 1
        x = int(self.ips[int(self.last[s])]) if self.row_pending(t) else int(regs[nat.R_RIP])
        t.delivery = _Delivery(row, x, int(regs[nat.R_RSP]), int(self.extent[s]))
        self.mode[s] = 0
        self.deliver_next(t, st)

    def deliver_next(self, t: _Thread, st: int) -> None:
        d = t.delivery
        if st == _PLAIN_TRAP:
            self.deliver_end(t)
            return
        sig = os.WSTOPSIG(st)
        if self.group_stop(t):
            sig = 0
        else:
            caught = bool(_caught_signals(t.proc.pid) >> (sig - 1) & 1)
            d.caught = d.caught or caught
            d.last_signal = sig
            t.signals.append((d.row, sig, caught))
        regs = self.getregs(t)
        if regs is None:
            return
        rip = int(regs[nat.R_RIP])
        if rip in t.proc.space.armed:  # the step may run the instruction
            self.lift(t, rip)
        self.step(t, sig)

    def deliver_end(self, t: _Thread) -> None:
        d, t.delivery = t.delivery, None
        s = t.slot
        if not d.caught:  # the instruction ran; go on from where it went
            self.mode[s] = 1
            self.kick[s] = 1
            return
        if self.row_pending(t):
            self.drop_last(t)  # it did not run: the handler came first
        regs = self.getregs(t)
        if regs is None:
            return
        handler, rsp = int(regs[nat.R_RIP]), int(regs[nat.R_RSP])
        # The handler's sigreturn resumes the interrupted instruction.
        self.add_resume_point(t, d.ip, d.rsp, d.extent)
        self._points()
        if self.inside(t, handler, rsp):
            if self.count[s] > t.seg_start:
                t.interrupts.append((int(self.count[s]), d.ip, d.last_signal))
            self.mode[s] = 1
            self.kick[s] = 1
            return
        # As an asynchronous disable: FUP(interrupted IP) + TIP.PGD.
        self.close_segment(t, d.ip, self.now(), END_SIGNAL)
        self.resume_free(t, 0)

    # -- the end ------------------------------------------------------------------------

    def end_stretch(self, t: _Thread, st: int) -> None:
        """Recording stopped while ``t`` was stepped: close its stretch where
        it is."""
        d, t.delivery = t.delivery, None
        sig = 0
        if st == _PLAIN_TRAP:
            if d is not None and d.caught and self.row_pending(t):
                self.drop_last(t)
                end_ip = d.ip
            else:
                regs = self.getregs(t)
                end_ip = int(regs[nat.R_RIP]) if regs is not None else 0
        else:  # a signal: the last instruction has not run
            sig = 0 if self.group_stop(t) else os.WSTOPSIG(st)
            regs = self.getregs(t)
            end_ip = int(regs[nat.R_RIP]) if regs is not None else 0
            if self.row_pending(t):
                end_ip = int(self.ips[int(self.last[t.slot])])
                self.drop_last(t)
        self.close_segment(t, end_ip, self.now(), END_LIMIT)
        self.resume_free(t, sig)

    def stop_recording(self, reason: str) -> None:
        """No more tracing: stepped threads close their stretches at their
        next stop; the breakpoints come out."""
        self.recording = False
        self.stopped_because = reason
        self.extent[:] = 0
        for t in self.slots:
            if t.stepping and not t.gone:
                self.mode[t.slot] = 0
                if self.kick[t.slot]:  # stopped, not looked at yet: it ends here
                    self.kick[t.slot] = 0
                    regs = self.getregs(t)
                    end_ip = int(regs[nat.R_RIP]) if regs is not None else 0
                    self.close_segment(t, end_ip, self.now(), END_LIMIT)
                    if t.stepover is None:
                        self.resume_free(t, 0)
        for p in self.procs:
            if p.alive and p.mem >= 0 and p.space.mem >= 0:
                p.space.disarm_all()
        for t in self.slots:
            t.pending.clear()
        self._points()
        self._ranges()

    def setup_image(
        self, proc: _Proc, argv: tuple[str, ...] | None, kind: str, missing_ok: bool
    ) -> None:
        """Read a process image's mappings, find its traced functions and
        calls, arm their breakpoints."""
        pid = proc.pid
        maps = read_maps(pid)
        comm = _comm(pid)
        proc.ranges = resolve_functions(pid, maps, self.functions, missing_ok=missing_ok)
        proc.ranges += [r for r in self.abs_ranges if not missing_ok or proc.space.read(r.start, 1)]
        proc.calls = resolve_functions(pid, maps, self.call_names, missing_ok=missing_ok)
        now = self.now()
        proc.image = ProcessImage(pid, comm, argv, maps, proc.ranges, proc.calls, {}, now)
        # The vDSO is in no file: its bytes are kept (as perf record keeps
        # them) so its code can be decoded.
        for m in maps:
            if m.path == "[vdso]":
                proc.image.vdso = proc.space.read(m.start, m.length)
        self.images.append(proc.image)
        self.events.append(TaskEvent(now, kind, pid, pid, comm=comm, image=len(self.images) - 1))
        if missing_ok:
            found = {r.name for r in proc.ranges + proc.calls}
            lost = [f for f in self.functions + self.call_names if f not in found]
            if lost:
                self.notes.append(f"process {pid} ({comm}): not found: {', '.join(lost)}")
        for r in proc.ranges:
            if not missing_ok and not proc.space.read(r.start, 1):
                raise RecordError(f"range {r.start:#x}-{r.end:#x} is not mapped in process {pid}")
        if self.recording:
            proc.space.entries |= {r.start for r in proc.ranges} | {c.start for c in proc.calls}
            for a in sorted(proc.space.entries):
                self.arm(proc.space, a)
        self._ranges()
        self._points()

    def detach_all(self) -> None:
        """Let attached processes go: breakpoints out, every thread stopped in
        a ptrace-stop with none of our SIGSTOPs pending, detached with the
        signal it was to get (at a breakpoint it hit, its IP moved back)."""
        for p in self.procs:
            if p.alive and p.mem >= 0 and p.space.mem >= 0:
                p.space.disarm_all()
        for t in self.slots:
            if t.gone:
                continue
            sig = t.held or 0
            t.held = None
            # A free thread's trap is a breakpoint; a stepped one's, a step.
            free = not (t.stepping or t.stepover is not None or t.delivery is not None)
            stopped = _thread_state(t.proc.pid, t.tid) == "t"
            if stopped and not t.sigstops and not t.new:
                r = nat.wait4(t.tid, self.status, nat.WALL | 1)  # WNOHANG: a report?
                statuses = [int(self.status[0])] if r > 0 else []
                more = False
            else:
                if not stopped and not t.sigstops and not t.new:
                    if nat.tgkill(t.proc.pid, t.tid, signal.SIGSTOP) == 0:
                        t.sigstops += 1
                elif stopped:
                    nat.ptrace(nat.PTRACE_CONT, t.tid, 0, 0)
                statuses, more = [], True
            while statuses or more:
                st = statuses.pop() if statuses else _wait(t.tid, self.status)
                if st < 0 or os.WIFEXITED(st) or os.WIFSIGNALED(st):
                    t.gone = True
                    break
                ssig = 0 if st >> 16 else os.WSTOPSIG(st)
                if ssig == signal.SIGSTOP and (t.sigstops or t.new):
                    if t.new:
                        t.new = False
                    else:
                        t.sigstops -= 1
                    if not t.sigstops:
                        break
                    ssig = 0
                elif st == _PLAIN_TRAP:
                    regs = self.getregs(t)
                    if free and regs is not None and int(regs[nat.R_RIP]) - 1 in t.proc.space.gone:
                        regs[nat.R_RIP] -= 1
                        self.setregs(t)
                    ssig = 0
                free = True  # it has run free since
                sig = sig or ssig
                if not more:
                    break
                nat.ptrace(nat.PTRACE_CONT, t.tid, 0, 0)
            if not t.gone:
                nat.ptrace(nat.PTRACE_DETACH, t.tid, 0, sig)
            t.gone = True

    def kill_all(self) -> None:
        """Launched processes go when recording fails or is interrupted."""
        for p in self.procs:
            if p.alive:
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for t in reversed(self.slots):  # a leader reports its end after its threads
            while not t.gone:
                st = _wait(t.tid, self.status)
                if st < 0 or os.WIFEXITED(st) or os.WIFSIGNALED(st):
                    t.gone = True
                else:
                    nat.ptrace(nat.PTRACE_CONT, t.tid, 0, 0)

    def logs(self, clock: str, pairs: list[tuple[int, int]]) -> list[StepLog]:
        """One :class:`StepLog` per thread slot that logged something (the
        first slot always)."""
        n = self.n
        order = np.argsort(self.rslot[:n], kind="stable")
        keys = self.rslot[:n][order]
        out = []
        for t in self.slots:
            lo, hi = np.searchsorted(keys, [t.slot, t.slot + 1])
            rows = order[lo:hi]
            if rows.shape[0] == 0 and t.slot != 0:
                continue
            img = t.proc.image
            out.append(
                StepLog(
                    ips=self.ips[rows],
                    times=self.times[rows],
                    registers=self.regs[rows],
                    register_names=self.names,
                    segments=t.segments,
                    ranges=t.proc.ranges,
                    pid=t.proc.pid,
                    comm=t.comm,
                    argv=img.argv if img else None,
                    maps=img.maps if img else [],
                    clock=clock,
                    code=img.code if img else {},
                    exit_status=t.exit_status,
                    signals=t.signals,
                    ptwrites=t.ptwrites,
                    stopped_because=self.stopped_because,
                    clock_pairs=pairs,
                    tid=t.tid,
                    cpu=t.cpu,
                    image=self.images.index(img) if img in self.images else 0,
                    calls=t.proc.calls,
                    changes=img.changes if img else [],
                )
            )
        return out


# -- starting -------------------------------------------------------------------------


def _launch(argv: Sequence[str], status: np.ndarray, options: int = _OPTIONS) -> int:
    """fork, PTRACE_TRACEME, exec: the child stops at its exec (traced with
    ``options``, and killed if the tracer goes)."""
    if not argv:
        raise RecordError("no command to run")
    exe = shutil.which(argv[0]) if "/" not in argv[0] else argv[0]
    if exe is None or not os.path.isfile(exe):
        raise RecordError(f"{argv[0]}: command not found")
    if not os.access(exe, os.X_OK):
        raise RecordError(f"{argv[0]}: not executable")
    nat.warm_up()
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    rfd, wfd = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(rfd)
            if libc.ptrace(nat.PTRACE_TRACEME, 0, None, None) != 0:
                os.write(wfd, f"PTRACE_TRACEME: {os.strerror(ctypes.get_errno())}".encode())
                os._exit(126)
            os.execv(exe, list(argv))
        except BaseException as exc:
            try:
                os.write(wfd, str(exc).encode()[:500])
            finally:
                os._exit(127)
    os.close(wfd)
    s = _wait(pid, status)
    why = os.read(rfd, 1000).decode(errors="replace")
    os.close(rfd)
    if s < 0 or not os.WIFSTOPPED(s):
        raise RecordError(
            f"{argv[0]}: could not start it under ptrace: {why or _describe_status(s)}"
        )
    r = nat.ptrace(nat.PTRACE_SETOPTIONS, pid, 0, nat.PTRACE_O_EXITKILL | options)
    if r < 0:
        os.kill(pid, signal.SIGKILL)
        _wait(pid, status)
        raise RecordError(f"process {pid}: PTRACE_SETOPTIONS failed: {os.strerror(-r)}")
    return pid


def _attach(pid: int, status: np.ndarray, options: int = _OPTIONS) -> list[int]:
    """Attach to every thread of a process (again until no new one shows up);
    each is stopped when this returns (traced with ``options``).  The
    threads' tids, the leader first."""
    if not os.path.isdir(f"/proc/{pid}"):
        raise RecordError(f"no process {pid}")
    nat.warm_up()
    attached: list[int] = []
    while True:
        try:
            tids = sorted(int(x) for x in os.listdir(f"/proc/{pid}/task"))
        except OSError as exc:
            raise RecordError(f"process {pid}: {exc.strerror}") from None
        new = [t for t in tids if t not in attached]
        if not new:
            break
        for tid in sorted(new, key=lambda t: t != pid):
            r = nat.ptrace(nat.PTRACE_ATTACH, tid, 0, 0)
            if r == -errno.ESRCH and tid != pid:
                continue  # it exited meanwhile
            if r < 0:
                for done in attached:
                    nat.ptrace(nat.PTRACE_DETACH, done, 0, 0)
                hint = ""
                if r in (-errno.EPERM, -errno.EACCES):
                    hint = (
                        " (ptrace not permitted: see /proc/sys/kernel/yama/ptrace_scope "
                        "or CAP_SYS_PTRACE)"
                    )
                raise RecordError(f"cannot attach to process {pid}: {os.strerror(-r)}{hint}")
            # Wait for the SIGSTOP of the attach; other signals arriving first are kept.
            pending = []
            while True:
                s = _wait(tid, status)
                if s < 0 or not os.WIFSTOPPED(s):
                    if tid == pid:
                        raise RecordError(f"process {pid} {_describe_status(s)} while attaching")
                    break
                sig = os.WSTOPSIG(s)
                if sig == signal.SIGSTOP:
                    attached.append(tid)
                    break
                pending.append(sig)
                nat.ptrace(nat.PTRACE_CONT, tid, 0, 0)
            for sig in pending:  # pragma: no cover - rare: re-raise what we swallowed
                nat.tgkill(pid, tid, sig)
            if tid in attached:
                nat.ptrace(nat.PTRACE_SETOPTIONS, tid, 0, options)
    return attached


_CLOCK_TRIES = 5


def _clock_pair(clock: str, ts: np.ndarray, windows: list[int]) -> tuple[int, int]:
    """(stepping clock, CLOCK_MONOTONIC ns) read together; the window's
    half width goes to ``windows``.  The narrowest of a few reads: one
    preempted between its monotonic reads would widen the placement error
    of every event to the time the recorder was off the CPU."""
    best: tuple[int, int, int] | None = None
    for _ in range(_CLOCK_TRIES):
        a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        c = int(nat.rdtsc()) if clock == "tsc" else int(nat.monotonic_ns(ts))
        b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        if best is None or b - a < best[2] - best[0]:
            best = (a, c, b)
    assert best is not None
    a, c, b = best
    windows.append((b - a + 1) // 2)
    return c, (a + b) // 2


def step_threads(
    target: Sequence[str] | int,
    *,
    functions: Sequence[str] = (),
    calls: Sequence[str] = (),
    ranges: Sequence[tuple[int, int]] = (),
    follow_fork: bool = False,
    clock: str = "tsc",
    registers: str = "all",
    max_instructions: int | None = None,
) -> StepRecording:
    """Run ``target`` (an argv list to launch, or a pid to attach to) and
    single-step its threads inside ``functions`` (``name`` or
    ``module!name``), ``ranges`` (``(start, end)`` addresses, end exclusive)
    and the calls of ``calls`` (each call of such a function with everything
    it calls, until it returns).

    ``follow_fork``: child processes too (through exec); ``clock``:
    ``"tsc"`` (``rdtsc``) or ``"monotonic"`` (CLOCK_MONOTONIC ns);
    ``registers``: ``"all"`` (the 27 of ``user_regs_struct``) or ``"basic"``
    (rip, rsp, eflags); ``max_instructions``: stop stepping after that many
    (the processes then run on untraced).  A launched process runs to its
    end; an attached one is detached when recording stops or it exits.
    """
    if clock not in ("tsc", "monotonic"):
        raise RecordError(f"unknown clock {clock!r} (tsc or monotonic)")
    if registers not in ("all", "basic"):
        raise RecordError(f"unknown register set {registers!r} (all or basic)")
    if not functions and not ranges and not calls:
        raise RecordError("nothing to trace: give functions, calls or address ranges")
    for lo, hi in ranges:
        if not 0 <= lo < hi < 1 << 64:
            raise RecordError(f"bad address range {lo:#x}-{hi:#x}")
    if max_instructions is not None and max_instructions < 1:
        raise RecordError("max_instructions must be positive")
    names = REGISTERS_ALL if registers == "all" else REGISTERS_BASIC
    rec = _Recorder(functions, calls, ranges, clock, names, max_instructions, follow_fork)
    status = rec.status
    launched = not isinstance(target, int)
    rec.launched = launched
    if launched:
        argv: tuple[str, ...] | None = tuple(target)
        pid = _launch(list(target), status)
        tids = [pid]
    else:
        argv = None
        pid = int(target)
        tids = _attach(pid, status)
    pairs: list[tuple[int, int]] = []
    windows: list[int] = []
    try:
        proc = rec.add_proc(pid, None, True)
        for tid in tids:
            t = rec.add_thread(tid, proc, "")
            t.new = False
        if launched:
            pairs.append(_clock_pair(clock, rec.ts, windows))
            proc.threads[0].comm = _comm(pid)
            rec.run_to_entry(proc, proc.threads[0], argv, "start", missing_ok=False)
        else:
            rec.setup_image(proc, argv, "start", missing_ok=False)
            for t in proc.threads:
                t.comm = _thread_stat(pid, t.tid)[0] or proc.image.comm
                if t.tid != pid:
                    rec.events.append(TaskEvent(proc.image.time, "comm", pid, t.tid, comm=t.comm))
            pairs.append(_clock_pair(clock, rec.ts, windows))
            for t in list(proc.threads):
                rec.started_free(t)
        try:
            rec.run()
            if not launched and rec.live():
                rec.detach_all()
        finally:
            if time.clock_gettime_ns(time.CLOCK_MONOTONIC) - pairs[0][1] < 50_000_000:
                time.sleep(0.05)  # a baseline long enough to calibrate the TSC
            pairs.append(_clock_pair(clock, rec.ts, windows))
    except BaseException:
        if launched:
            rec.kill_all()
            if not rec.slots:
                os.kill(pid, signal.SIGKILL)
                _wait(pid, status)
        else:
            try:
                rec.detach_all()
            except RecordError:
                pass
            if not rec.slots:
                for tid in tids:
                    nat.ptrace(nat.PTRACE_DETACH, tid, 0, 0)
        raise
    finally:
        for p in rec.procs:
            p.close()
    return StepRecording(
        logs=rec.logs(clock, pairs),
        images=rec.images,
        events=rec.events,
        pid=pid,
        clock=clock,
        clock_pairs=pairs,
        stopped_because=rec.stopped_because,
        exit_status=rec.exit_statuses.get(pid),
        notes=rec.notes,
        clock_error_ns=0 if clock == "monotonic" else max(windows),
    )


def step_process(target: Sequence[str] | int, **options: Any) -> StepLog:
    """:func:`step_threads`, for the log of the launched or attached thread
    (the first thread of the process); its ``exit_status`` is the process's."""
    recording = step_threads(target, **options)
    log = recording.main
    log.exit_status = recording.exit_status
    log.stopped_because = recording.stopped_because
    return log
