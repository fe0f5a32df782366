"""Record a program by patching its code: Intel PT without PT hardware.

The program is started under ptrace and stopped at its entry point, its
libraries loaded.  Every executable module (the program, its libraries,
the dynamic loader, the vDSO) is swept (:mod:`.sites`) and laid out
(:mod:`.layout`); trampolines and the runtime routines go into arenas
mapped into the process next to each module, the patches over its code,
all while it is stopped.  The thread's GS base points at its control block
in a shared-memory file that hwtrace maps too; its trace buffer follows.
The thread then starts at the runtime's start routine (PSB+, TIP.PGE at
the entry) and runs at nearly its own speed, writing its Intel PT into the
buffer.  hwtrace stays attached, waiting for the events ptrace reports:
``int3`` traps at trap sites and inside windows (sent on to their
trampolines), and the end of the process.
"""

from __future__ import annotations

import bisect
import ctypes
import errno
import gc
import hashlib
import io
import mmap
import os
import signal
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import numpy as np
from elftools.elf.constants import SH_FLAGS
from elftools.elf.elffile import ELFFile

from ...columns import distinct
from ...image.process import Mapping, load_bias, program_entry, read_maps
from ...isa.tsc import rdtsc
from ...kernel.ptrace import (
    PTRACE_CONT,
    PTRACE_DETACH,
    PTRACE_GETREGS,
    PTRACE_GETSIGINFO,
    PTRACE_O_TRACECLONE,
    PTRACE_O_TRACEEXEC,
    PTRACE_O_TRACEEXIT,
    PTRACE_O_TRACEFORK,
    PTRACE_O_TRACESYSGOOD,
    PTRACE_O_TRACEVFORK,
    PTRACE_SETOPTIONS,
    PTRACE_SETREGS,
    PTRACE_SETSIGINFO,
    PTRACE_SINGLESTEP,
    PTRACE_SYSCALL,
    PTRACE_TRACEME,
    WALL,
    Registers,
    ptrace,
    tgkill,
)
from . import _patchcode as pc
from .layout import (
    ARENA_STUBS,
    FAR_OFFSET,
    FAR_SPAN,
    AddressMap,
    ModulePlan,
    PlanError,
    plan_module_cached,
    redirect_table,
)
from .sites import INSTRUMENTED, K_CALL, CodeMap, sweep_file

__all__ = [
    "ExecRecord",
    "PatchError",
    "PatchOptions",
    "PatchRecording",
    "PatchThread",
    "TraceSink",
    "record_patched",
]

PAGE = 0x1000
POOL_HINT = 0x300000000000  # where the buffers are asked to go (a hint)
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
_libc.waitpid.argtypes = (ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.c_int)


def _wait_any() -> tuple[int, int] | None:
    """waitpid(-1, __WALL) through libc: the event, or None when a signal
    interrupted the wait.  (os.waitpid retries after a handler unless it
    raises, and an exception raised by a handler just after the call
    returned would lose the event it reported, leaving that thread stopped
    for good.)"""
    status = ctypes.c_int()
    got = _libc.waitpid(-1, ctypes.byref(status), WALL)
    if got >= 0:
        return got, status.value
    err = ctypes.get_errno()
    if err == errno.EINTR:
        return None
    if err == errno.ECHILD:
        raise ChildProcessError(err, os.strerror(err))
    raise OSError(err, os.strerror(err))


ADDR_NO_RANDOMIZE = 0x0040000  # personality(2)
CHUNK = 16 << 20  # trace bytes copied out at a time (at most)
SLACK = 512  # room past END for the largest group of packets a routine writes
# Buffer pages hwtrace allocates ahead of a thread's first lap round its
# ring, so that the thread maps pages already there instead of allocating
# and clearing each one in its own page fault (about a quarter of a branchy
# program's time under tracing in a VM, where a fresh page is also the
# host's fault).
AHEAD = 8 << 20
_KEEP_SIZE = 0x01  # FALLOC_FL_KEEP_SIZE
_MADV_POPULATE_WRITE = 23  # (Linux 5.14) fault the pages in writable, as a write would
TCB_SIZE = 2 * PAGE  # the control block, then the return stack (runtime.S's SHADOW)
SINK_SIZE = TCB_SIZE + PAGE  # a sink's control block and room for SLACK
SYS_OPEN, SYS_CLOSE, SYS_MMAP, SYS_MUNMAP, SYS_RT_SIGACTION = 2, 3, 9, 11, 13
SA_SIGINFO, SA_ONSTACK, SA_RESTART, SA_RESTORER = 0x4, 0x08000000, 0x10000000, 0x04000000
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
MAP_SHARED, MAP_PRIVATE, MAP_ANONYMOUS, MAP_FIXED_NOREPLACE = 1, 2, 0x20, 0x100000
_EVENT_FORK, _EVENT_VFORK, _EVENT_EXEC, _EVENT_EXIT = 1, 2, 4, 6


class PatchError(Exception):
    """The program could not be recorded (a message for the user)."""


@dataclass(frozen=True)
class PatchOptions:
    """``psb_period``: bytes between PSB+; ``tsc``: TSC packets (in PSB+ and
    around system calls); ``buffer_size``: each thread's ring buffer, the
    trace bytes it may have written that hwtrace has not yet copied out
    (past them, packets are dropped and an OVF follows, as Intel PT does
    when its buffer is full; memory: up to this much per thread);
    ``drain_period``: seconds between hwtrace's copies; ``mtc_period``:
    time points between PSB+ as MTC packets would give them, every 2**N
    ticks of a 25 MHz crystal clock (N = 3: 320 ns; None: none): a routine
    writing packets adds a TSC packet when that much time went by since the
    last (a rdtsc in every routine: interp runs 1.8x slower);
    ``max_threads``: threads recorded at once (more run unrecorded);
    ``noretcomp``: every return a TIP (no return compression);
    ``follow_fork``: children forked are recorded too (each thread its own
    trace, from the instruction after the fork; until it runs another
    program, which is not followed); ``aslr``:
    the program's addresses randomized (by default not, as gdb and rr
    launch programs: repeat recordings reuse their patch plans, cached by
    address, and their addresses compare across recordings);
    ``functions`` (``name`` or ``module!name``) and ``ranges`` (``(start,
    end)`` addresses): trace only there, as an Intel PT address filter
    (TIP.PGE entering, TIP.PGD leaving), with only that code patched
    (and the system calls); a range is entered at its start or where a
    call made inside it returns, as ``--backend step`` has it.  Functions
    are looked up again in a program the process execs; ranges are not.
    ``calls`` (functions): trace each call of them with everything it
    runs, from the entry until the stack rises above it (its return, a
    longjmp or an exception past it), all code patched."""

    psb_period: int = 4096
    tsc: bool = True
    buffer_size: int = 64 << 20
    max_threads: int = 64
    noretcomp: bool = False
    drain_period: float = 0.002
    mtc_period: int | None = None
    aslr: bool = False
    follow_fork: bool = False
    functions: tuple[str, ...] = ()
    ranges: tuple[tuple[int, int], ...] = ()
    calls: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.psb_period <= 0:
            raise ValueError(f"psb_period {self.psb_period}: bytes between PSB+, more than 0")
        if self.mtc_period is not None and not 0 <= self.mtc_period <= 15:
            raise ValueError(f"mtc_period {self.mtc_period}: 0 to 15")

    @property
    def ranged(self) -> bool:
        """Only chosen code is traced (an address filter)."""
        return bool(self.functions or self.ranges)

    @property
    def gated(self) -> bool:
        """Tracing is on only at times: in chosen code or calls."""
        return self.ranged or bool(self.calls)


class ExecRecord(NamedTuple):
    """A program a recorded process exec'd (recorded on from its entry)."""

    tsc: int
    comm: str
    maps: list[Mapping]
    vdso: bytes
    pid: int


@dataclass
class PatchThread:
    """One thread's trace."""

    pid: int
    tid: int
    data: bytes | mmap.mmap  # the spool file mapped; b"" when a sink took it
    lost: int  # packets dropped because the buffer was full
    counts: dict[str, int] = field(default_factory=dict)
    size: int = 0  # trace bytes


@dataclass
class PatchRecording:
    """A program recorded by code patching: its threads' Intel PT and the
    mappings it ran with."""

    pid: int
    argv: tuple[str, ...]
    maps: list[Mapping]
    vdso: bytes
    threads: list[PatchThread]
    exit_status: int
    modules: dict[str, dict[str, int]]  # per module: sites, windows, stubs, traps
    traps: int  # int3 traps taken (sent on to a trampoline by hwtrace)
    setup_seconds: float
    comm: str = ""
    options: PatchOptions = field(default_factory=PatchOptions)
    # (TSC, CLOCK_MONOTONIC ns) read together when tracing began and ended
    clock_pairs: list[tuple[int, int]] = field(default_factory=list)
    forks: int = 0  # child processes (not recorded)
    # (TSC when patched, mapping, pid) of modules mapped later (dlopen), patched
    mapped: list[tuple[int, Mapping, int]] = field(default_factory=list)
    # The signal (SIGTERM, SIGHUP) that stopped the recording before the
    # program ended (which runs on, untraced); 0: it ended.
    stopped_by: int = 0
    # Why copying the traces out failed (a full disk): they end there.
    write_error: str = ""
    # Each program the process or a recorded child exec'd (recorded on from
    # its entry point; ``maps`` is the first program's)
    execs: list[ExecRecord] = field(default_factory=list)
    exec_error: str = ""  # why a program it exec'd was not recorded
    # Executable mappings that ran unpatched (anonymous code: a JIT's): the
    # trace has a gap from each branch into them to the next PSB+.
    untraced: list[Mapping] = field(default_factory=list)
    # (TSC, pid, tid, parent pid) of each child process and thread recorded
    # (``follow_fork``)
    forked: list[tuple[int, int, int, int]] = field(default_factory=list)
    # The address ranges traced (functions resolved), when only they were
    ranges: list[tuple[int, int]] = field(default_factory=list)
    # The entries of the functions whose calls were traced (``calls``)
    calls: list[tuple[int, str]] = field(default_factory=list)
    # module!name functions (``functions``, ``calls``) of libraries never mapped
    unresolved: list[str] = field(default_factory=list)


class TraceSink(Protocol):
    """Where the threads' traces go while the program runs, instead of
    spool files (:func:`hwtrace.record.patch.output.record_patched_perf`
    writes them into perf.data as they come)."""

    def begin(self, head: PatchRecording) -> None:
        """Tracing starts: ``head`` has the program, its mappings and the
        first clock pair (no threads yet)."""

    def add(self, tid: int, data: memoryview) -> None:
        """Thread ``tid``'s next stretch of trace (whole packets; an
        empty one when a thread ends having written nothing).  Called from
        hwtrace's draining thread, one call at a time."""


class _Target:
    """The stopped process: memory through /proc/PID/mem, system calls run
    by its stopped thread at a ``syscall`` instruction (``gadget``, else one
    written over its current instruction and put back)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.tid = pid  # the thread that runs hwtrace's system calls (stopped)
        self.gadget = 0  # a syscall instruction to run them at (0: written at rip)
        self.fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)

    def read(self, address: int, size: int) -> bytes:
        try:
            return os.pread(self.fd, size, address)
        except OSError:
            return b""

    def write(self, address: int, data: bytes) -> None:
        done = os.pwrite(self.fd, data, address)
        if done != len(data):
            raise PatchError(f"could not write {len(data)} bytes at {address:#x}")

    def regs(self) -> Registers:
        r = Registers()
        if ptrace(PTRACE_GETREGS, self.tid, 0, ctypes.addressof(r)) < 0:
            raise PatchError(f"thread {self.tid}: cannot read its registers")
        return r

    def set_regs(self, r: Registers) -> None:
        if ptrace(PTRACE_SETREGS, self.tid, 0, ctypes.addressof(r)) < 0:
            raise PatchError(f"thread {self.tid}: cannot set its registers")

    def syscall(self, nr: int, *args: int) -> int:
        saved = self.regs()
        held: list[int] = []
        at = self.gadget or saved.rip
        orig = b"" if self.gadget else self.read(at, 2)
        if orig:
            self.write(at, b"\x0f\x05")
        try:
            r = saved.copy()
            r.rip = at
            r.rax = nr
            r.orig_rax = (1 << 64) - 1
            for name, v in zip(("rdi", "rsi", "rdx", "r10", "r8", "r9"), args, strict=False):
                setattr(r, name, v & ((1 << 64) - 1))
            self.set_regs(r)
            # To the system call's entry and exit (not a single step: a
            # thread whose tracer dies after a step keeps the trap flag).
            for _ in range(2):
                if ptrace(PTRACE_SYSCALL, self.tid, 0, 0) < 0:
                    raise PatchError(f"thread {self.tid}: cannot run a system call")
                while True:
                    _, status = os.waitpid(self.tid, WALL)
                    if not os.WIFSTOPPED(status):
                        raise PatchError(f"process {self.pid} ended while hwtrace worked on it")
                    sig = os.WSTOPSIG(status)
                    if sig == signal.SIGTRAP | 0x80:
                        break
                    if sig not in (signal.SIGTRAP, signal.SIGSTOP):
                        held.append(sig)  # sent again when the call is done
                    ptrace(PTRACE_SYSCALL, self.tid, 0, 0)
            out = self.regs().rax
        finally:
            if orig:
                self.write(at, orig)
            self.set_regs(saved)
            for sig in held:
                tgkill(self.pid, self.tid, sig)
        return out - (1 << 64) if out >= 1 << 63 else out

    def map(self, address: int, size: int, prot: int, flags: int, fd: int = -1) -> int:
        return self.syscall(SYS_MMAP, address, size, prot, flags, fd & ((1 << 64) - 1), 0)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


KILL_POINTS = ("buffers", "trampolines", "patches", "tracing")


def kill_point(name: str) -> None:
    """``HWTRACE_PATCH_KILL_AT=NAME[:SIGNAL]`` (a testing aid): hwtrace sends
    itself SIGKILL (or SIGNAL, e.g. ``SIGINT``) here, to show the program
    runs on (see :data:`KILL_POINTS`)."""
    where, _, sig = os.environ.get("HWTRACE_PATCH_KILL_AT", "").partition(":")
    if where == name:
        os.kill(os.getpid(), getattr(signal, sig) if sig else signal.SIGKILL)


def clock_pair() -> tuple[int, int]:
    """The TSC and CLOCK_MONOTONIC (ns, the middle of the read) together."""
    a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    c = int(rdtsc())
    b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    return c, (a + b) // 2


def _comm(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return ""


def _launch(argv: Sequence[str], popen: dict, aslr: bool = True) -> subprocess.Popen:
    """``argv`` started under ptrace, stopped at its exec; ``aslr``
    False: without address randomization (``setarch -R``)."""

    def traceme() -> None:
        if not aslr:
            _libc.personality(_libc.personality(0xFFFFFFFF) | ADDR_NO_RANDOMIZE)
        if ptrace(PTRACE_TRACEME, 0) != 0:
            raise OSError("PTRACE_TRACEME failed")

    try:
        proc = subprocess.Popen(list(argv), preexec_fn=traceme, **popen)
    except OSError as e:
        raise PatchError(f"{argv[0]}: {e.strerror}") from None
    except subprocess.SubprocessError:
        # ptrace allows one tracer: hwtrace runs under a debugger or
        # strace -f, which took the child first.
        raise PatchError(f"{argv[0]}: cannot be traced by hwtrace: another tracer "
                         f"(a debugger, strace -f) traces it") from None  # fmt: skip
    _, status = os.waitpid(proc.pid, WALL)
    if not os.WIFSTOPPED(status):
        raise PatchError(f"{argv[0]}: did not start")
    return proc


def _kill_traced(pid: int) -> None:
    """Kill a launched program hwtrace traces, and reap it.  (Not with
    ``Popen.kill``: its poll takes a ptrace-stop for an end and then sends
    nothing, which left the program stopped.)"""
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        return
    while True:
        try:
            _, status = os.waitpid(pid, WALL)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return
        # A ptrace-stop reported before the kill (or at its exit event):
        # let it go on to die.
        ptrace(PTRACE_CONT, pid, 0, 0)


def _map_pool(t: _Target, pool: _Pool, path: str, address: int, flags: int) -> int:
    """Map the buffers' file (at ``path``) into the program at ``address``
    (``flags``: MAP_FIXED_NOREPLACE for that address, else a hint)."""
    page = t.map(0, PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
    if page < 0:
        raise PatchError(f"the program cannot map a page: {os.strerror(-page)}")
    t.write(page, path.encode() + b"\0")
    tfd = t.syscall(SYS_OPEN, page, os.O_RDWR)
    t.syscall(SYS_MUNMAP, page, PAGE)
    if tfd < 0:
        raise PatchError(f"the program cannot open {path}: {os.strerror(-tfd)}")
    base = t.map(address, pool.size, PROT_READ | PROT_WRITE, MAP_SHARED | flags, tfd)
    t.syscall(SYS_CLOSE, tfd)
    if base < 0 or (flags and base != address):
        raise PatchError(f"the program cannot map its trace buffers: {os.strerror(-base)}")
    return base


def _patch_image(t: _Target, pool: _Pool, opt: PatchOptions, maps: list[Mapping],
                 first: bool = True) -> _Patcher:  # fmt: skip
    """Patch the stopped program's code (its buffers mapped): the private
    sinks first and the thread's GS base on the sink, so that were hwtrace
    killed while it patches, the patched code would run, untraced.  With
    address ranges, the functions are looked up in it (and ``ranges``, in
    the ``first`` program only)."""
    r = t.regs()
    r.gs_base = pool.map_sinks(t)
    t.set_regs(r)
    kill_point("buffers")
    if opt.ranged:
        pool.ranges = _resolve_ranges(t.pid, maps, opt, first, pool)
    if opt.calls:
        found, pool.later_calls = _functions(t.pid, maps, opt.calls, first)
        pool.calls = [(r.start, r.name) for r in found]
    patcher = _Patcher(t, opt)
    patcher.pool = pool
    patcher.patch_new(maps)
    t.gadget = patcher.runtime + pc.RT_SYSCALL
    return patcher


def _mapped(maps: list[Mapping], module: str) -> bool:
    """Is a file named ``module`` (or by its soname) mapped?"""
    names = {os.path.basename(m.path) for m in maps if m.path.startswith("/")}
    return any(n == module or n.startswith(module + ".") for n in names)


def _functions(pid: int, maps: list[Mapping], names: Sequence[str],
               first: bool) -> tuple[list, list[str]]:  # fmt: skip
    """The functions ``names`` in the process (``TracedRange``s; in a
    program it exec'd, not ``first``, those it has), and the names left
    for later: ``module!name`` of a module not mapped yet (a library it
    will dlopen)."""
    from ..errors import RecordError
    from ..functions import resolve_functions

    later = [n for n in names if "!" in n and not _mapped(maps, n.rpartition("!")[0])]
    try:
        found = resolve_functions(pid, maps, [n for n in names if n not in later],
                                  missing_ok=not first)  # fmt: skip
    except RecordError as e:
        raise PatchError(str(e)) from None
    return found, later


def _resolve_ranges(pid: int, maps: list[Mapping], opt: PatchOptions, first: bool,
                    pool: _Pool) -> list[tuple[int, int]]:  # fmt: skip
    found, pool.later_functions = _functions(pid, maps, opt.functions, first)
    out = [(r.start, r.end) for r in found] + (list(opt.ranges) if first else [])
    bad = [(lo, hi) for lo, hi in out if not 0 <= lo < hi < 1 << 64]
    if bad:
        raise PatchError(f"address range {bad[0][0]:#x}-{bad[0][1]:#x} is empty")
    if len(out) > pc.MAXRANGES:
        raise PatchError(f"{len(out)} address ranges: at most {pc.MAXRANGES} are supported")
    return out


def _to_entry(t: _Target) -> tuple[int, list[Mapping], str]:
    """Run the program (stopped at its exec) to its entry point, its
    libraries loaded: the entry, its mappings and its name."""
    entry = program_entry(t.pid)
    if entry is None:
        raise PatchError(f"process {t.pid}: no entry point in its auxiliary vector")
    _run_to_entry(t, entry)
    return entry, read_maps(t.pid), _comm(t.pid)


def _run_to_entry(t: _Target, entry: int) -> None:
    orig = t.read(entry, 1)
    t.write(entry, b"\xcc")
    ptrace(PTRACE_CONT, t.pid, 0, 0)
    while True:
        _, status = os.waitpid(t.pid, WALL)
        if not os.WIFSTOPPED(status):
            raise PatchError("the program ended before its entry point")
        sig = os.WSTOPSIG(status)
        if sig == signal.SIGTRAP and status >> 16 == 0:
            break
        ptrace(PTRACE_CONT, t.pid, 0, 0 if sig == signal.SIGTRAP else sig)
    t.write(entry, orig)
    r = t.regs()
    r.rip = entry
    t.set_regs(r)


@dataclass
class _Module:
    path: str
    lo: int
    hi: int
    sections: list[tuple[int, int]]
    functions: np.ndarray
    code: dict[int, bytes] = field(default_factory=dict)

    def reader(self, t: _Target):
        for lo, hi in self.sections:
            self.code[lo] = t.read(lo, hi - lo)
        spans = sorted(self.code.items())

        def read(address: int, size: int) -> bytes:
            for lo, data in spans:
                if lo <= address < lo + len(data):
                    off = address - lo
                    if off + size <= len(data):
                        return data[off : off + size]
            return t.read(address, size)

        return read


def _elf_layout(elf: ELFFile, bias: int) -> tuple[list[tuple[int, int]], np.ndarray]:
    sections = []
    for s in elf.iter_sections():
        if (
            s["sh_flags"] & SH_FLAGS.SHF_EXECINSTR
            and s["sh_type"] == "SHT_PROGBITS"
            and s["sh_size"]
        ):
            sections.append((s["sh_addr"] + bias, s["sh_addr"] + s["sh_size"] + bias))
    funcs = [np.zeros(0, np.uint64)]
    for name in (".symtab", ".dynsym"):
        tab = elf.get_section_by_name(name)
        if tab is None or tab["sh_type"] == "SHT_NOBITS":
            continue
        # The table as an array (ELF64 Elf64_Sym): pyelftools parses a
        # symbol at a time, 0.5 s for python3's modules.
        syms = np.frombuffer(tab.data(), _ELF64_SYM, len(tab.data()) // _ELF64_SYM.itemsize)
        kind = syms["info"] & 0xF
        keep = ((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC)) & (syms["value"] != 0)
        funcs.append(syms["value"][keep] + np.uint64(bias & ((1 << 64) - 1)))
    return sorted(sections), distinct(np.concatenate(funcs))


_ELF64_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"),
                       ("value", "<u8"), ("size", "<u8")])  # fmt: skip
_STT_FUNC, _STT_GNU_IFUNC = 2, 10


def _load_vaddr(elf: ELFFile) -> int:
    return min(s["p_vaddr"] for s in elf.iter_segments() if s["p_type"] == "PT_LOAD")


def _modules(t: _Target, maps: list[Mapping]) -> tuple[list[_Module], bytes]:
    """The executable modules of ``maps`` (ELF files and the vDSO, read from
    the process), and the vDSO's bytes."""
    out = []
    vdso = b""
    paths = []
    for m in maps:
        if "x" in m.prot and m.path and m.path not in paths:
            paths.append(m.path)
    for path in paths:
        mine = [m for m in maps if m.path == path]
        lo, hi = min(m.start for m in mine), max(m.end for m in mine)
        if path == "[vdso]":
            vdso = t.read(lo, hi - lo)
            elf = ELFFile(io.BytesIO(vdso))
            sections, funcs = _elf_layout(elf, lo - _load_vaddr(elf))
        elif path.startswith("/"):
            try:
                with open(path, "rb") as f:
                    elf = ELFFile(f)
                    bias = load_bias(maps, path, _load_vaddr(elf))
                    if bias is None:
                        continue
                    sections, funcs = _elf_layout(elf, bias)
            except OSError:
                continue
        else:
            continue
        if sections:
            out.append(_Module(path, lo, hi, sections, funcs))
    return out, vdso


def _free_below(maps: list[Mapping], top: int, size: int, floor: int) -> int | None:
    """The highest page-aligned ``a`` with ``[a, a + size)`` free, ``a + size
    <= top`` and ``a >= floor``."""
    a = (top - size) & ~(PAGE - 1)
    for m in sorted(maps, key=lambda m: -m.start):
        if a < floor:
            return None
        if m.start >= a + size:
            continue
        if m.end <= a:
            break
        a = (m.start - size) & ~(PAGE - 1)
    return a if a >= floor else None


def _free_above(maps: list[Mapping], bottom: int, size: int, ceiling: int) -> int | None:
    """The lowest page-aligned ``a >= bottom`` with ``[a, a + size)`` free
    and ``a + size <= ceiling``."""
    a = (bottom + PAGE - 1) & ~(PAGE - 1)
    for m in sorted(maps, key=lambda m: m.start):
        if m.end <= a:
            continue
        if m.start >= a + size:
            break
        a = (m.end + PAGE - 1) & ~(PAGE - 1)
    return a if a + size <= ceiling else None


HEAP_ROOM = 256 << 20  # left free above a module for a heap growing there (brk)


class _Patcher:
    """The modules patched in the process, and the patching of code mapped
    later (a library dlopen'ed)."""

    def __init__(self, t: _Target, opt: PatchOptions) -> None:
        self.t = t
        self.pid = t.pid  # the process whose image this is
        self.opt = opt
        self.plans: dict[str, ModulePlan] = {}
        self.redirects = AddressMap()
        self.runtime = 0
        self.scratch = 0
        self.notify: set[int] = set()  # where the runtime stops for new code
        # code ranges patched, with one of their patches (address, bytes)
        self.done: list[tuple[int, int, tuple[int, bytes] | None]] = []
        self.by_place: dict[tuple[str, int], ModulePlan] = {}
        self.vdso = b""
        self.table = (0, 0)  # the redirect table: address, mask
        self.pool: _Pool | None = None
        self.arenas: list[tuple[int, int]] = []
        self.origin = AddressMap()  # moved instruction -> its original address
        self.syscalls: dict[int, int] = {}  # a trampoline's syscall -> the original
        self.parts: list[tuple[int, int, int]] = []  # instrumented instructions' code
        self.halts: set[int] = set()  # where rt_async_off stops (after its int3)
        self.sigreturns: set[int] = set()
        self.own_trap_handler = False  # the program has one: not replaced
        # Far stub space (start, end, occupancy), shared by modules close
        # to each other: their far ranges overlap.
        self.far_pieces: list[tuple[int, int, np.ndarray]] = []

    @property
    def ranges(self) -> list[tuple[int, int]] | None:
        """The address ranges traced (None: all code), the pool's."""
        return self.pool.ranges if self.pool is not None else None

    @property
    def calls(self) -> list[tuple[int, str]] | None:
        """The entries of the functions whose calls are traced, the pool's."""
        return self.pool.calls if self.pool is not None else None

    def in_ranges(self, ip: int) -> bool:
        """Is ``ip`` traced (in the address ranges, when there are)?"""
        return self.ranges is None or any(lo <= ip < hi for lo, hi in self.ranges)

    def untraced(self, maps: list[Mapping]) -> list[Mapping]:
        """The executable mappings of ``maps`` that run untraced: neither a
        module hwtrace patched nor its own (anonymous code: a JIT's)."""
        known = [(lo, hi) for lo, hi, _ in self.done] + self.arenas
        known += [(lo, hi) for lo, hi, _ in self.far_pieces]
        return [m for m in maps if "x" in m.prot and m.path != "[vsyscall]"
                and not any(lo <= m.start < hi for lo, hi in known)]  # fmt: skip

    def in_arena(self, ip: int) -> bool:
        return any(lo <= ip < hi for lo, hi in self.arenas)

    def original(self, ip: int) -> int | None:
        """The program's instruction whose moved copy (or instrumentation)
        is at ``ip``, or None."""
        at = self.origin.get(ip)
        if at is not None:
            return at
        k = bisect.bisect_right(self.parts, (ip, 1 << 64, 0)) - 1
        if k >= 0 and self.parts[k][0] <= ip < self.parts[k][1]:
            return self.parts[k][2]
        return None

    def patch_new(self, maps: list[Mapping]) -> int:
        """Patch every executable module of ``maps`` not patched yet;
        returns how many.  In an order that leaves the process able to run
        on at every step, were hwtrace killed: all modules laid out, the
        redirect table (with every new int3) written, the trampolines, the
        SIGTRAP handler, and only then the jumps and int3s."""
        t = self.t
        modules, vdso = _modules(t, maps)
        self.vdso = self.vdso or vdso
        new = [m for m in modules if not self._patched(m)]
        plans: list[tuple[_Module, ModulePlan, bool]] = []
        for mod in new:
            old = self.by_place.get((mod.path, mod.lo))
            if old is not None and self._same_code(old, mod):
                # Mapped again where it was (dlclose, dlopen): its trampolines
                # are still in place, only its own pages are new.
                plans.append((mod, old, False))
                continue
            plan = self._plan(mod)
            plans.append((mod, plan, True))
            self.plans[mod.path] = plan
            self.by_place[(mod.path, mod.lo)] = plan
            self.arenas += plan.arenas
            self.origin.update(plan.origin)
            self.syscalls.update(plan.syscalls)
            self.parts += plan.parts
            self.halts.add(plan.runtime + pc.RT_HALT + 1)
            self.sigreturns.add(plan.runtime + pc.RT_SIGRETURN_NOTIFY + 1)
            self.notify.add(plan.runtime + pc.RT_NOTIFY + 1)
            self.redirects.update(plan.redirects)
            # The runtime's own int3s go on after themselves (for the
            # in-process handler; hwtrace, when there, stops them first).
            for at in (pc.RT_NOTIFY, pc.RT_SIGRETURN_NOTIFY, pc.RT_HALT):
                self.redirects[plan.runtime + at] = plan.runtime + at + 1
        self.parts.sort()
        if not plans:
            return 0
        self._table()
        for _, plan, fresh in plans:
            if fresh:
                for address, data in plan.make_writes()[0]:
                    t.write(address, data)
        kill_point("trampolines")
        if not self.runtime:
            first = plans[0][1]
            self.runtime, self.scratch = first.runtime, first.scratch
            self._handler()
        for n, (mod, plan, _) in enumerate(plans):
            for address, data in plan.make_writes()[1]:
                t.write(address, data)
            self.done.append((mod.lo, mod.hi, plan.patches[0] if plan.patches else None))
            if n == 0:
                kill_point("patches")  # some modules patched, not all
        return len(plans)

    def _plan(self, mod: _Module) -> ModulePlan:
        t = self.t
        read = mod.reader(t)
        identity = None  # a file's: its own
        if not mod.path.startswith("/"):  # the vDSO, say: its bytes
            code = hashlib.sha256()
            for lo, hi in mod.sections:
                code.update(read(lo, hi - lo))
            identity = code.hexdigest()
        cm: CodeMap = sweep_file(mod.path, mod.lo, read, mod.sections, mod.functions, identity)
        body = int(np.isin(cm.kinds, np.array((*INSTRUMENTED, K_CALL))).sum()) * 256 + 2 * PAGE
        size = (ARENA_STUBS + len(pc.RUNTIME) + body + PAGE - 1) & ~(PAGE - 1)
        now = read_maps(t.pid)
        # Below the module, else (a program linked at a low address) above
        # it, past room for its heap; within a rel32's reach of all of it.
        near = _free_below(now, mod.lo, size, max(mod.hi - (1 << 31) + size, PAGE))
        if near is None:
            near = _free_above(now, mod.hi + HEAP_ROOM, size, mod.lo + (1 << 31) - (1 << 20))
        if near is None or t.map(near, size, PROT_READ | PROT_EXEC,
                                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE) != near:  # fmt: skip
            raise PatchError(f"{mod.path}: no room for its trampolines near {mod.lo:#x}")
        far = self._far(mod)
        ranges = entries = None
        if self.ranges is not None:
            ranges = np.array([r for r in self.ranges if r[0] < mod.hi and mod.lo < r[1]],
                              np.int64).reshape(-1, 2)  # fmt: skip
        if self.calls is not None:
            entries = np.array([a for a, _ in self.calls if mod.lo <= a < mod.hi], np.int64)
        try:
            retcomp = not self.opt.noretcomp
            return plan_module_cached(mod.path, cm, read, mod.sections, (near, near + size),
                                      far, retcomp, ranges, entries, identity)  # fmt: skip
        except PlanError as e:
            raise PatchError(f"{mod.path}: {e}") from None

    def _table(self) -> None:
        """The redirect table the runtime looks indirect branch targets (and
        the SIGTRAP handler int3s) up in, made anew in the process (the old
        one stays for threads reading it now)."""
        words, mask = redirect_table(self.redirects)
        size = (words.nbytes + PAGE - 1) & ~(PAGE - 1)
        at = self.t.map(0, size, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS)
        if at < 0:
            raise PatchError(f"no memory for the redirect table: {os.strerror(-at)}")
        self.t.write(at, words.tobytes())
        self.table = (at, mask)
        if self.pool is not None:
            self.pool.set_table(self.pid, at, mask)

    def _far(self, mod: _Module) -> list[tuple[int, int, np.ndarray]]:
        """The far stub space for ``mod``'s jumps whose displacement's top
        byte must be 0xCC: the pieces already mapped there, and the rest of
        the range mapped now where it is free."""
        lo = (mod.lo - FAR_OFFSET) & ~(PAGE - 1)
        hi = (mod.hi - FAR_OFFSET + FAR_SPAN + PAGE - 1) & ~(PAGE - 1)
        if lo <= PAGE:
            return []
        have = sorted(p for p in self.far_pieces if p[0] < hi and lo < p[1])
        gaps, at = [], lo
        for plo, phi, _ in have:
            if plo > at:
                gaps.append((at, plo))
            at = max(at, phi)
        if at < hi:
            gaps.append((at, hi))
        for glo, ghi in gaps:
            got = self.t.map(glo, ghi - glo, PROT_READ | PROT_EXEC,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE)  # fmt: skip
            if got == glo:
                piece = (glo, ghi, np.zeros(ghi - glo, np.uint8))
                self.far_pieces.append(piece)
                have.append(piece)
        return sorted(have, key=lambda p: p[0])

    def _handler(self) -> None:
        """The runtime's SIGTRAP handler, for int3s met when hwtrace is gone
        (kept out where the program has a SIGTRAP handler of its own)."""
        act = struct.pack("<QQQQ", self.runtime + pc.RT_TRAP_HANDLER,
                          SA_SIGINFO | SA_RESTORER | SA_ONSTACK | SA_RESTART,
                          self.runtime + pc.RT_RESTORER, 0)  # fmt: skip
        at = self.scratch
        self.t.write(at, act + bytes(32))
        got = self.t.syscall(SYS_RT_SIGACTION, signal.SIGTRAP, at, at + 32, 8)
        old = self.t.read(at + 32, 8)
        self.t.write(at, bytes(64))
        if got == 0 and old != bytes(8):
            self.t.write(at, self.t.read(at + 32, 32))  # the program's: put back
            self.t.syscall(SYS_RT_SIGACTION, signal.SIGTRAP, at, 0, 8)
            self.own_trap_handler = True

    def _patched(self, mod: _Module) -> bool:
        """Is ``mod`` patched (its range patched, one of its patches still
        there: the module was not unmapped since)?"""
        for lo, hi, sample in self.done:
            if lo < mod.hi and mod.lo < hi:
                if sample is None or self.t.read(sample[0], len(sample[1])) == sample[1]:
                    return True
        return False

    def _same_code(self, plan: ModulePlan, mod: _Module) -> bool:
        return all(self.t.read(lo, len(data)) == data for lo, data in plan.source.items())


def record_patched(
    argv: Sequence[str],
    options: PatchOptions | None = None,
    *,
    sink: TraceSink | None = None,
    **popen: Any,
) -> PatchRecording:
    """Run ``argv`` to its end, recording every instruction of it from its
    entry point as Intel PT, by code patching; ``popen``: keywords for
    :class:`subprocess.Popen` (``stdin``, ``stdout``, ``cwd``, ``env``).
    The threads' traces come back mapped from spool files, or go to
    ``sink`` as they are written (the threads' ``data`` then empty)."""
    opt = options or PatchOptions()
    began = time.monotonic()
    first = clock_pair()  # with another later: the TSC's rate
    proc = _launch(argv, popen, opt.aslr)
    pid = proc.pid
    t = _Target(pid)
    shm_path = ""
    pool: _Pool | None = None
    # No garbage collector passes over the plans (millions of objects for
    # a large program) while they are made and the program runs: hwtrace
    # makes little cyclic garbage.
    collecting = gc.isenabled()
    gc.disable()
    try:
        options = (PTRACE_O_TRACECLONE | PTRACE_O_TRACEEXIT | PTRACE_O_TRACEFORK
                   | PTRACE_O_TRACEVFORK | PTRACE_O_TRACEEXEC | PTRACE_O_TRACESYSGOOD)  # fmt: skip
        ptrace(PTRACE_SETOPTIONS, pid, 0, options)
        entry, maps0, comm = _to_entry(t)
        # The threads' control blocks and trace buffers, shared with hwtrace,
        # mapped first and the thread's GS base on the sink: were hwtrace
        # killed while it patches, the patched code would run, untraced.
        pool = _Pool(opt, pid, sink)
        shm_path = pool.path
        # Away from the code, whose trampolines need the room next to it.
        pool.base = _map_pool(t, pool, shm_path, POOL_HINT, 0)
        os.unlink(shm_path)
        shm_path = ""
        patcher = _patch_image(t, pool, opt, maps0)
        runtime = patcher.runtime
        if opt.tsc and opt.mtc_period is not None:
            tsc, ns = clock_pair()
            per_ns = (tsc - first[0]) / max(ns - first[1], 1)
            pool.tsc_step = max(1, int((40 << opt.mtc_period) * per_ns))
        tcb = pool.claim(pid, entry)
        r = t.regs()
        r.gs_base = tcb
        if patcher.in_ranges(entry) and patcher.calls is None:
            r.rip = runtime + pc.RT_START
        t.set_regs(r)
        setup = time.monotonic() - began
        pairs = [clock_pair()]
        run = _Run(pid, patcher, pool)
        run.untraced.update((m.start, m) for m in patcher.untraced(maps0))
        if sink is not None:
            sink.begin(PatchRecording(pid, tuple(argv), maps0, patcher.vdso, [], 0, {}, 0,
                                      setup, comm, opt, list(pairs),
                                      ranges=list(pool.ranges or []),
                                      calls=list(pool.calls or [])))  # fmt: skip
        pool.start_draining()
        # ^C reaches the program too (one process group): it decides; hwtrace
        # records on until it ends.
        # SIGTERM and SIGHUP stop the recording between two of hwtrace's
        # steps: what was recorded is kept, and the program runs on
        # untraced once hwtrace exits (the kernel detaches its tracees).
        previous = {sig: signal.signal(sig, handler) for sig, handler in
                    ((signal.SIGINT, signal.SIG_IGN), (signal.SIGTERM, run.request_stop),
                     (signal.SIGHUP, run.request_stop))}  # fmt: skip
        try:
            status = run.run()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        pairs.append(clock_pair())
        threads = run.finished + [pool.release(tid) for tid in list(pool.slots)]
        return PatchRecording(pid, tuple(argv), maps0, patcher.vdso, threads, status,
                              {p: pl.stats for p, pl in run.plans.items()}, run.traps, setup,
                              comm, opt, pairs, run.forks, run.mapped, run.stop_signal,
                              (pool.error.strerror or str(pool.error)) if pool.error else "",
                              run.execs, run.exec_error, list(run.untraced.values()),
                              run.forked, list(pool.ranges or []),
                              list(pool.calls or []),
                              pool.later_functions + pool.later_calls)  # fmt: skip
    except KeyboardInterrupt:
        # Interrupted while setting up: the program, stopped, runs on
        # untraced (its GS base is on the sink once anything is patched).
        ptrace(PTRACE_DETACH, pid, 0, 0)
        raise
    except BaseException:
        _kill_traced(pid)
        raise
    finally:
        if collecting:
            gc.enable()
        t.close()
        if shm_path:
            os.unlink(shm_path)
        if pool is not None:
            pool.close()


@dataclass
class _Sinks:
    """A process's private control blocks whose buffers are always full
    (:meth:`_Pool.map_sinks`)."""

    target: _Target
    base: int
    free: list[int]


class _Pool:
    """The threads' control blocks and trace buffers: one shared-memory file
    of ``max_threads`` slots (a control block, then a ring of
    ``buffer_size`` bytes), sparse (threads it does not record, and
    processes, run on private sinks: :meth:`map_sinks`).  While the
    program runs, a thread of hwtrace's copies what each thread wrote to a
    spool file (or the sink) and says how far it got (the block's DONE): a
    thread goes on writing round its ring until it would write over what
    hwtrace has not copied, and drops packets from there (OVF once there is
    room again, as Intel PT does when its buffer is full).  Were hwtrace
    gone, a thread writes one more ring's worth and drops the rest.  The
    ring's pages stay mapped: a thread faults each in once, not once per
    page it writes (runtime.S: MAKE_ROOM)."""

    def __init__(self, opt: PatchOptions, pid: int, sink: TraceSink | None = None) -> None:
        self.opt = opt
        self.pid = pid
        self.out = sink
        # Copied out in stretches this large (fewer, larger AUXTRACE records:
        # a decoder joins them), or when the thread ends.
        self.ring = max(opt.buffer_size & ~(PAGE - 1), 2 * PAGE)
        self.chunk = max(PAGE, min(CHUNK, self.ring // 4))
        self.error: OSError | None = None  # writing a trace out failed
        self.slot_size = TCB_SIZE + self.ring
        self.size = self.slot_size * opt.max_threads
        self.fd, self.path = tempfile.mkstemp(prefix=f"hwtrace-patch-{pid}-", dir="/dev/shm")
        os.ftruncate(self.fd, self.size)
        self.shared = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)  # fmt: skip
        self.view = memoryview(self.shared)
        self.base = 0
        self.free = list(range(opt.max_threads - 1, -1, -1))
        self.slots: dict[int, int] = {}  # tid -> slot
        self.dropped = 0  # threads past the last slot: not recorded
        self.spools: dict[int, Any] = {}  # slot -> its spool file (no sink)
        self.tids: dict[int, int] = {}  # slot -> thread
        self.pids: dict[int, int] = {}  # slot -> its thread's process
        self.drained: dict[int, int] = {}  # slot -> buffer bytes copied out
        self.lap: dict[int, int] = {}  # slot -> the lap round its ring copied from
        self.off: dict[int, int] = {}  # slot -> where in the ring that copy goes on
        self.ahead: dict[int, int] = {}  # slot -> buffer bytes allocated
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.drainer: threading.Thread | None = None
        self.tsc_step = 0  # TSC ticks between time points (runtime.S's TSCSTEP)
        # Per process: the redirect table its new control blocks read, and
        # (by the process whose image hwtrace patched: the program, or one
        # that exec'd) every table made there, oldest first, and its sinks.
        self.tables: dict[int, tuple[int, int]] = {}
        self.made: dict[int, list[tuple[int, int]]] = {}
        self.sink_sets: dict[int, _Sinks] = {}
        self.sink_of: dict[int, tuple[_Sinks, int]] = {}  # tid -> its private sink
        self.ranges: list[tuple[int, int]] | None = None  # traced only there
        self.calls: list[tuple[int, str]] | None = None  # traced only in their calls
        # module!name functions (ranges, calls) of modules not mapped yet
        self.later_functions: list[str] = []
        self.later_calls: list[str] = []

    def add_ranges(self, ranges: list[tuple[int, int]]) -> None:
        """More ranges (a library mapped later): every control block's
        ranges, the pairs before their count."""
        self.ranges = [*(self.ranges or []), *ranges][: pc.MAXRANGES]
        for k in list(self.slots.values()):
            self._write_ranges(self.words(k))

    def _range_words(self, w: np.ndarray) -> None:
        """Tracing off (a thread starts outside the ranges, or, with no
        ranges, is enabled by the system call that made it), the ranges."""
        w[pc.ON // 8] = 0
        w[pc.SYSON // 8] = int(self.ranges is None and self.calls is None)
        # The routines' fast paths: only when a routine knows all it writes
        # from the block (runtime.S's RESTORE sets FASTEND).
        w[pc.FASTEND // 8] = 0
        w[pc.FASTOK // 8] = int(self.ranges is None and self.calls is None and not self.tsc_step)
        w[pc.CALLMODE // 8] = int(self.calls is not None)
        w[pc.EXTENT // 8] = 0
        self._write_ranges(w)

    def _write_ranges(self, w: np.ndarray) -> None:
        # The pairs first: a running thread reads no more than the count.
        rs = self.ranges or []
        for n, (lo, hi) in enumerate(rs):
            w[pc.RANGES // 8 + 2 * n] = lo
            w[pc.RANGES // 8 + 2 * n + 1] = hi
        w[pc.RANGEBYTES // 8] = 16 * len(rs)

    def words(self, k: int) -> np.ndarray:
        """Slot ``k``'s control block, as 64-bit words (shared with the program)."""
        return np.frombuffer(self.shared, np.uint64, TCB_SIZE // 8, k * self.slot_size)

    def map_sinks(self, t: _Target) -> int:
        """Control blocks whose buffers are always full, private to the
        process ``t`` (whose image hwtrace patches now): a forked child runs
        on its own copy of the first (a fork copies private memory), threads
        past the last slot on the others.  A control block holds the
        registers its routines save: two threads on one would overwrite
        each other's.  Returns the first's address."""
        n = self.opt.max_threads + 1
        at = t.map(0, n * SINK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        if at < 0:
            raise PatchError(f"the program cannot map its control blocks: {os.strerror(-at)}")
        sinks = self.sink_sets[t.pid] = _Sinks(t, at, list(range(n - 1, 0, -1)))
        table = self.tables.get(t.pid, (0, 0))
        for i in range(n):
            tcb = at + i * SINK_SIZE
            w = np.zeros(pc.WRAPEND // 8 + 1, np.uint64)
            w[pc.SELF // 8] = tcb
            w[pc.W // 8] = pc.W0
            w[pc.CUR // 8] = w[pc.END // 8] = tcb + TCB_SIZE
            w[pc.LAPEND // 8] = 1 << 62  # no ring: END stays 0, it is always full
            w[pc.NEXTPSB // 8] = 1 << 62
            w[pc.PSBPERIOD // 8] = 1 << 20
            w[pc.RTABLE // 8], w[pc.RMASK // 8] = table
            sinks.target.write(tcb, w.tobytes())
        return at

    def child_sink(self, image: int) -> int:
        """The control block of a process forked from one running image
        ``image``'s (its own copy)."""
        return self.sink_sets[image].base

    def thread_sink(self, tid: int, image: int) -> int:
        """A private control block for a thread hwtrace does not record,
        in a process running image ``image``'s (the first when none is left)."""
        sinks = self.sink_sets[image]
        i = sinks.free.pop() if sinks.free else 0
        self.sink_of[tid] = (sinks, i)
        return sinks.base + i * SINK_SIZE

    def forget(self, tid: int) -> None:
        """Thread ``tid`` (not recorded) ended: its control block is free."""
        sinks, i = self.sink_of.pop(tid, (None, 0))
        if sinks is not None and i:
            sinks.free.append(i)

    def claim(self, tid: int, entry: int = 0, pid: int = 0, image: int = 0) -> int:
        """A control block for a new thread of process ``pid`` (default: the
        program's), which runs image ``image``'s code (default: its
        process's); its trace starts with PSB+; a sink when none is left."""
        pid = pid or self.pid
        image = image or pid
        with self.lock:
            if not self.free:
                self.dropped += 1
                return self.thread_sink(tid, image)
            k = self.free.pop()
            self.slots[tid] = k
            self.tids[k] = tid
            self.pids[k] = pid
            if self.out is None:
                self.spools[k] = tempfile.TemporaryFile(prefix=f"hwtrace-patch-{self.pid}-{tid}-")
            self.drained[k] = self.lap[k] = self.off[k] = 0
            self.ahead[k] = 0  # the draining thread's next pass allocates
        w = self.words(k)
        w[:] = 0
        tcb = self.base + k * self.slot_size
        buf = tcb + TCB_SIZE
        w[pc.SELF // 8] = tcb
        w[pc.W // 8] = pc.W0
        w[pc.CUR // 8] = w[pc.RINGBASE // 8] = buf
        w[pc.RINGSIZE // 8] = self.ring
        w[pc.END // 8] = w[pc.LAPEND // 8] = w[pc.ENDBASE // 8] = buf + self.ring - SLACK
        w[pc.NEXTPSB // 8] = buf
        w[pc.PSBPERIOD // 8] = max(self.opt.psb_period, 64)
        w[pc.TSCON // 8] = int(self.opt.tsc)
        w[pc.TSCSTEP // 8] = self.tsc_step
        w[pc.NEXTIP // 8] = entry
        w[pc.TARGET // 8] = entry
        w[pc.RTABLE // 8], w[pc.RMASK // 8] = self.tables.get(pid, (0, 0))
        self._range_words(w)
        return tcb

    def inherit_table(self, child: int, image: int) -> None:
        """A recorded child process (forked from one running image
        ``image``'s) reads the newest redirect table in its memory: the one
        its parent had when it forked (hwtrace may learn of the child after
        the parent made another, which the child has not)."""
        try:
            t = _Target(child)
        except OSError:
            return
        try:
            made = reversed(self.made.get(image, []))
            mapped = (table for table in made if len(t.read(table[0], 8)) == 8)
            table = next(mapped, None)
            if table is not None:
                self.tables[child] = table
        finally:
            t.close()

    def restart(self, tid: int, entry: int) -> int:
        """Thread ``tid``'s control block, to trace on at ``entry`` (a new
        program: PSB+ at once, the return stack emptied)."""
        k = self.slots[tid]
        w = self.words(k)
        w[pc.W // 8] = pc.W0
        w[pc.NEXTPSB // 8] = w[pc.CUR // 8]
        w[pc.NEXTIP // 8] = w[pc.TARGET // 8] = entry
        w[pc.RTABLE // 8], w[pc.RMASK // 8] = self.tables.get(self.pids[k], (0, 0))
        w[TCB_SIZE // 16 : TCB_SIZE // 8] = 0  # the return stack
        self._range_words(w)
        return self.base + k * self.slot_size

    def _drain(self, k: int, final: bool = False) -> None:
        """Copy what slot ``k``'s thread wrote since the last time to its
        spool or the sink once there is a chunk of it (all of it when
        ``final``) and tell the thread (DONE) that it may write there again
        (the lock held).  The runtime stores CUR after the packets below it,
        and before LAPS when it starts a lap."""
        w = self.words(k)
        at = k * self.slot_size + TCB_SIZE
        buf = self.base + at
        laps = int(w[pc.LAPS // 8])
        cur = int(w[pc.CUR // 8]) - buf
        lap, off = self.lap[k], self.off[k]
        pieces = []
        if laps != lap:  # a lap ended (one: the thread never passes DONE)
            end = int(w[pc.WRAPEND // 8]) - buf
            if end > off:
                pieces.append((off, end))
            lap, off = laps, 0
        if cur > off:  # (else the thread started a lap after LAPS was read)
            pieces.append((off, cur))
            off = cur
        size = sum(hi - lo for lo, hi in pieces)
        done = self.drained[k]
        if size >= self.chunk or (final and (size or (self.out is not None and not done))):
            for lo, hi in pieces or [(0, 0)]:
                data = self.view[at + lo : at + hi]
                if self.out is not None:
                    self.out.add(self.tids[k], data)
                else:
                    self.spools[k].write(data)
            self.drained[k] = done + size
            self.lap[k], self.off[k] = lap, off
            w[pc.DONE // 8] = lap * self.ring + off
        self._allocate_ahead(k, cur if laps == 0 else self.ring)

    def _allocate_ahead(self, k: int, cur: int) -> None:
        """Pages for the :data:`AHEAD` bytes of slot ``k``'s ring past
        ``cur`` (its thread's next write in its first lap), allocated and
        cleared here, on hwtrace's thread: a tmpfs page is cleared at its
        first fault, not when fallocate allocates it, and clearing the pages
        in the program's faults took a third of a fast-tracing program's
        time."""
        want = min(cur + AHEAD, self.ring)
        have = self.ahead[k]
        if want <= have or (want - have < AHEAD // 4 and want < self.ring):
            return  # (a quarter of AHEAD at a time, or the ring's last pages)
        at = k * self.slot_size + TCB_SIZE
        lo = max(have, cur & ~(PAGE - 1))
        try:
            self.shared.madvise(_MADV_POPULATE_WRITE, at + lo, want - lo)
        except OSError:  # (before Linux 5.14) allocated only: cleared in the program
            if _libc.fallocate(self.fd, _KEEP_SIZE, at + lo, want - lo) != 0:
                return
        self.ahead[k] = want

    def drain(self, tid: int) -> None:
        """Drain thread ``tid``'s buffer now (hwtrace has it stopped)."""
        with self.lock:
            k = self.slots.get(tid)
            if k is not None:
                self._drain(k)

    def _drain_all(self) -> None:
        # SIGTERM and SIGHUP go to the thread waiting for ptrace events.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
        while not self.stop.wait(self.opt.drain_period):
            with self.lock:
                try:
                    for k in self.slots.values():
                        self._drain(k)
                except OSError as e:
                    # (A full disk.) The threads drop what follows, with OVF.
                    self.error = e
                    return

    def start_draining(self) -> None:
        self.drainer = threading.Thread(target=self._drain_all, name="hwtrace-drain", daemon=True)
        self.drainer.start()

    def set_table(self, pid: int, address: int, mask: int) -> None:
        """Every control block of process ``pid``, whose image hwtrace
        patched (and those claimed later), reads this table (its children
        keep theirs)."""
        self.tables[pid] = (address, mask)
        self.made.setdefault(pid, []).append((address, mask))
        for k in [k for k in self.slots.values() if self.pids[k] == pid]:
            w = self.words(k)
            w[pc.RTABLE // 8], w[pc.RMASK // 8] = address, mask
        sinks = self.sink_sets.get(pid)
        if sinks is not None:
            for i in range(self.opt.max_threads + 1):
                tcb = sinks.base + i * SINK_SIZE
                sinks.target.write(tcb + pc.RTABLE, struct.pack("<QQ", address, mask))

    def release(self, tid: int) -> PatchThread:
        """The trace of a thread that ended; its slot is free again."""
        with self.lock:
            k = self.slots.pop(tid)
            if self.error is None:
                self._drain(k, final=True)
            spool = self.spools.pop(k, None)
            size = self.drained.pop(k)
            self.ahead.pop(k)
            del self.lap[k], self.off[k], self.tids[k]
            pid = self.pids.pop(k)
        _libc.fallocate(self.fd, _PUNCH_HOLE, k * self.slot_size + TCB_SIZE, self.ring)
        # The spool as the trace (a mapping of it: traces can be large).
        data: bytes | mmap.mmap = b""
        if spool is not None:
            if size:
                spool.flush()
                data = mmap.mmap(spool.fileno(), size, mmap.MAP_PRIVATE, mmap.PROT_READ)
            spool.close()
        w = self.words(k)
        counts = {name.lower(): int(w[getattr(pc, name) // 8])
                  for name in ("TNTBITS", "TIPS", "PGES", "REDIRECTS")}  # fmt: skip
        thread = PatchThread(pid, tid, data, int(w[pc.LOST // 8]), counts, size)
        del w
        self.free.append(k)
        return thread

    def close(self) -> None:
        """Stop draining; the buffers are let go (the program's mapping stays)."""
        self.stop.set()
        if self.drainer is not None:
            self.drainer.join()
        with self.lock:
            for spool in self.spools.values():
                spool.close()
            self.spools.clear()
        self.view.release()
        try:
            self.shared.close()
        except BufferError:
            # A view of it is still held (by the traceback of the error
            # that ends the recording): unmapped when that goes.
            pass
        os.close(self.fd)


class _Run:
    """hwtrace's side while the program runs: traps sent on to their
    trampolines, new threads given a control block, ended threads' traces
    kept, forked children (not recorded) given the sink."""

    def __init__(self, pid: int, patcher: _Patcher, pool: _Pool) -> None:
        self.pid = pid
        # The image each process runs: patched in it (the program, a
        # process that exec'd), or in the one it was forked from.
        self.images: dict[int, _Patcher] = {pid: patcher}
        self.pool = pool
        self.plans = dict(patcher.plans)  # every image's modules
        self.untraced: dict[int, Mapping] = {}  # code that ran unpatched, by start
        self.execs: list[ExecRecord] = []
        self.exec_error = ""  # why a program exec'd could not be recorded
        self.follow = patcher.opt.follow_fork
        self.process: dict[int, int] = {}  # a recorded child's thread -> its process
        # (TSC, pid, tid, parent pid) of each recorded child process and thread
        self.forked: list[tuple[int, int, int, int]] = []
        self.mapped: list[tuple[int, Mapping, int]] = []  # (TSC, mapping, pid) of code mapped later
        self.held: list[tuple[int, int]] = []  # (tid, signal) that came while hwtrace worked
        self.status = 0  # the process's wait status
        self.traps = 0
        self.finished: list[PatchThread] = []
        self.forks = 0
        self.known = {pid}
        self.live = {pid}  # traced threads and children not reaped yet
        self.children: set[int] = set()  # forked processes, let go at exec
        self.regs = Registers()
        self.stop_signal = 0  # asked to stop recording (SIGTERM, SIGHUP)
        self.stopping: set[int] = set()  # threads sent a SIGSTOP to be let go at
        # Per thread, for each signal handler running: was the thread in a
        # traced call when the signal came (``calls``)?
        self.was_on: dict[int, list[bool]] = {}

    def _stop_all(self) -> None:
        """Recording is to stop: a SIGSTOP to every thread and child, each
        let go (detached, the SIGSTOP suppressed) at its stop for it; stops
        before that are served as usual (a signal is delivered, an int3
        sent on), so the program misses nothing."""
        for tid in list(self.live):
            self.stopping.add(tid)
            tgkill(self._process_of(tid), tid, signal.SIGSTOP)

    def _process_of(self, tid: int) -> int:
        """The process of a traced thread (tgkill's tgid)."""
        if tid in self.process:
            return self.process[tid]
        return tid if tid in self.children else self.pid

    def _image(self, tid: int) -> _Patcher:
        """The image thread ``tid`` runs."""
        image = self.images.get(self._process_of(tid))
        return image if image is not None else self.images[self.pid]

    def _let_go(self, tid: int) -> None:
        ptrace(PTRACE_DETACH, tid, 0, 0)
        self.live.discard(tid)
        self.children.discard(tid)
        if tid in self.pool.slots:
            self.finished.append(self.pool.release(tid))

    def request_stop(self, sig: int, frame: object) -> None:
        """SIGTERM/SIGHUP handler: stop before the next wait (the signal
        ends a wait in progress: it interrupts the system call)."""
        self.stop_signal = sig

    def _getregs(self, tid: int) -> bool:
        return ptrace(PTRACE_GETREGS, tid, 0, ctypes.addressof(self.regs)) == 0

    def _setregs(self, tid: int) -> None:
        ptrace(PTRACE_SETREGS, tid, 0, ctypes.addressof(self.regs))

    def _born(self, tid: int, thread: bool) -> None:
        self.known.add(tid)
        self.live.add(tid)
        if not self._getregs(tid):
            return
        if thread:
            self.regs.gs_base = self.pool.claim(tid)
        else:
            self.children.add(tid)
            group = _thread_group(tid)
            parent = group if group != tid else _parent(tid)
            # A new process runs the image of the one it was forked from
            # (which may exec another since), a new thread its process's.
            image = self.images.get(parent) or self.images[self.pid]
            if group == tid:
                self.images[tid] = image
            if self.follow and group:
                # Recorded: a control block and buffer of its own (shared
                # memory: the fork kept the mapping), its trace from the
                # instruction after the fork (the system call's trampoline
                # enables tracing there).
                self.process[tid] = group
                if group == tid:
                    self.pool.inherit_table(tid, image.pid)
                self.forked.append((int(rdtsc()), group, tid, parent))
                self.regs.gs_base = self.pool.claim(tid, pid=group, image=image.pid)
            else:
                # A forked process runs on its copy of the children's sink; a
                # thread of one (which no fork copied) on one of its own.
                leader = group == tid
                self.regs.gs_base = (self.pool.child_sink(image.pid) if leader
                                     else self.pool.thread_sink(tid, image.pid))  # fmt: skip
        self._setregs(tid)

    def _new_code(self, tid: int, image: _Patcher) -> None:
        """The thread mapped code executable: patch it before it runs."""
        t = image.t
        t.tid = tid
        before = len(image.done)
        maps = read_maps(image.pid)
        self._find_later(maps)
        image.patch_new(maps)
        self.untraced.update((m.start, m) for m in image.untraced(maps))
        now = int(rdtsc())
        for lo, hi, _ in image.done[before:]:
            self.mapped += [(now, m, image.pid) for m in maps if lo <= m.start < hi]

    def _find_later(self, maps: list[Mapping]) -> None:
        """The functions of libraries mapped now (``-f``, ``--call`` of
        ``module!name``): their ranges and entries, before their code is
        patched."""
        pool = self.pool
        if pool.later_functions:
            found, pool.later_functions = _functions(self.pid, maps, pool.later_functions, False)
            if found:
                pool.add_ranges([(r.start, r.end) for r in found])
        if pool.later_calls:
            found, pool.later_calls = _functions(self.pid, maps, pool.later_calls, False)
            pool.calls = [*(pool.calls or []), *((r.start, r.name) for r in found)]

    def _exec(self, pid: int) -> bool:
        """Recorded process ``pid`` ran a new program (``perf record``
        follows an exec too): run it to its entry point, map the buffers
        again where they were, patch it, and trace on from its entry (PSB+,
        TIP.PGE) in the same buffer.  False: it could not be, the process is
        let go (it runs on untraced)."""
        tasks = set(os.listdir(f"/proc/{pid}/task"))
        pool = self.pool
        gone = [x for x, k in pool.slots.items() if pool.pids[k] == pid and str(x) not in tasks]
        for tid in gone:
            self.finished.append(pool.release(tid))  # ended by the exec
        old = self._image(pid)
        t = _Target(pid)  # /proc/PID/mem is the old address space's
        try:
            entry, maps, comm = _to_entry(t)
            _map_pool(t, pool, f"/proc/{os.getpid()}/fd/{pool.fd}", pool.base, MAP_FIXED_NOREPLACE)
            patcher = _patch_image(t, pool, old.opt, maps, first=False)
        except (PatchError, OSError) as e:
            self.exec_error = str(e)
            t.close()
            if pid in pool.slots:
                self.finished.append(pool.release(pid))
            self.live.discard(pid)
            self.children.discard(pid)
            ptrace(PTRACE_DETACH, pid, 0, 0)
            return False
        self.execs.append(ExecRecord(int(rdtsc()), comm, maps, patcher.vdso, pid))
        if old.pid == pid:
            old.t.close()  # (a forked child's is its parent's)
        self.untraced.update((m.start, m) for m in patcher.untraced(maps))
        self.images[pid] = patcher
        self.plans.update(patcher.plans)
        tcb = pool.restart(pid, entry) if pid in pool.slots else pool.claim(pid, entry, pid=pid)
        r = t.regs()
        r.gs_base = tcb
        if patcher.in_ranges(entry) and patcher.calls is None:
            r.rip = patcher.runtime + pc.RT_START
        t.set_regs(r)
        return True

    def run(self) -> int:
        ptrace(PTRACE_CONT, self.pid, 0, 0)
        kill_point("tracing")
        # Until every thread and child it traces is gone (waiting for any
        # child: hwtrace's caller may have children of its own, which are
        # not waited for once none of the traced ones is left).
        while self.live:
            for tid, sig in self.held:
                tgkill(self._process_of(tid), tid, sig)  # signals that came while hwtrace worked
            self.held.clear()
            if self.stop_signal and not self.stopping:
                self._stop_all()
            try:
                got = _wait_any()
            except ChildProcessError:
                return self.status
            if got is None:
                continue  # a signal: a stop request, if SIGTERM or SIGHUP
            tid, status = got
            if os.WIFEXITED(status) or os.WIFSIGNALED(status):
                if tid == self.pid:
                    self.status = status
                self.live.discard(tid)
                self.pool.forget(tid)
                self.children.discard(tid)
                if tid in self.pool.slots:
                    self.finished.append(self.pool.release(tid))
                continue
            sig = os.WSTOPSIG(status)
            event = status >> 16
            if tid not in self.known:
                # A new thread or child's first stop (before or after its
                # creator's event stop).
                self._born(tid, _is_thread(self.pid, tid))
                if sig == signal.SIGSTOP and event == 0:
                    sig = 0
                    if self.stopping:
                        self._let_go(tid)
                        continue
            if sig == signal.SIGSTOP and event == 0 and tid in self.stopping:
                self._let_go(tid)  # the stop hwtrace asked for
                continue
            if sig == signal.SIGTRAP and event:
                if event in (_EVENT_FORK, _EVENT_VFORK):
                    self.forks += 1
                elif event == _EVENT_EXIT and tid in self.pool.slots:
                    self.finished.append(self.pool.release(tid))
                elif event == _EVENT_EXEC and tid in self.children:
                    if tid in self.pool.slots and not self._image(tid).opt.gated:
                        # A recorded child runs another program: recorded on.
                        if not self._exec(tid):
                            continue
                    else:
                        # A child that hwtrace does not record runs its new
                        # program free: nothing of the patched image is left
                        # in it.  With address ranges or calls (which name the
                        # program's functions), a recorded child's trace ends
                        # at its exec (the TIP.PGD before the system call).
                        self.children.discard(tid)
                        self.live.discard(tid)
                        self.pool.forget(tid)
                        self.images.pop(tid, None)
                        self.process.pop(tid, None)
                        if tid in self.pool.slots:
                            self.finished.append(self.pool.release(tid))
                        ptrace(PTRACE_DETACH, tid, 0, 0)
                        continue
                elif event == _EVENT_EXEC and tid == self.pid:
                    if not self._exec(tid):
                        continue
                ptrace(PTRACE_CONT, tid, 0, 0)
                continue
            if sig == signal.SIGTRAP and self._getregs(tid):
                image = self._image(tid)
                # (A forked child maps new code in its own copy of the image
                # it was forked from: not patched, a stated gap.)
                if self.regs.rip in image.notify and image.pid == self._process_of(tid):
                    self._new_code(tid, image)
                    ptrace(PTRACE_CONT, tid, 0, 0)
                    continue
                if self.regs.rip in image.sigreturns and tid in self.pool.slots:
                    self._sigreturn(tid)
                    continue
                to = image.redirects.get(self.regs.rip - 1)
                if to is not None:
                    self.traps += 1
                    self.regs.rip = to
                    self._setregs(tid)
                    ptrace(PTRACE_CONT, tid, 0, 0)
                    continue
            if sig and tid in self.pool.slots and sig != signal.SIGSTOP:
                sig = self._signal(tid, sig)
            ptrace(PTRACE_CONT, tid, 0, sig)
        return self.status

    # -- signals ------------------------------------------------------------------------

    def _wait_trap(self, tid: int, where: set[int] | None, step: bool = False) -> bool:
        """Wait for ``tid``'s next SIGTRAP (at ``where``, if given); signals
        meanwhile are held back for later (sent again when hwtrace goes on).
        ``step``: after a single step, a signal's stop comes before the step
        ran: it returns then, the thread where it was."""
        while True:
            try:
                _, status = os.waitpid(tid, WALL)
            except ChildProcessError:
                return False
            if not os.WIFSTOPPED(status):
                self.live.discard(tid)
                self.pool.forget(tid)
                if tid == self.pid:
                    self.status = status
                if tid in self.pool.slots:
                    self.finished.append(self.pool.release(tid))
                return False
            sig = os.WSTOPSIG(status)
            if sig == signal.SIGTRAP and status >> 16 == 0:
                if where is None or (self._getregs(tid) and self.regs.rip in where):
                    return True
            if sig & 0x80 and sig & 0x7F == signal.SIGTRAP:
                return True  # a syscall stop
            deliver = 0
            if sig in _FAULTS and sig != signal.SIGTRAP and not step:
                # A fault would come again at once if held: the program's.
                deliver = sig
            elif sig not in (signal.SIGTRAP, signal.SIGSTOP):
                self._hold(tid, sig)
            if step:
                return self._getregs(tid)
            ptrace(PTRACE_SYSCALL if where is None else PTRACE_CONT, tid, 0, deliver)

    def _hold(self, tid: int, sig: int) -> None:
        """Send ``sig`` again when hwtrace goes on (once: a standard signal
        pending twice is pending once)."""
        if sig >= signal.SIGRTMIN or (tid, sig) not in self.held:
            self.held.append((tid, sig))

    def _tcb_words(self, tid: int) -> np.ndarray:
        return self.pool.words(self.pool.slots[tid])

    def _copy_of(self, tid: int, ip: int) -> int:
        """Where a thread at ``ip`` goes on: the copy where ``ip`` is an
        int3 of the patches (a signal put the thread back at a moved
        instruction's original), so that it takes no trap there."""
        return self._image(tid).redirects.get(ip, ip)

    def _resume_at_copy(self, tid: int) -> None:
        """The stopped thread on at :meth:`_copy_of` its IP, untraced."""
        to = self._copy_of(tid, self.regs.rip)
        if to != self.regs.rip:
            self.regs.rip = to
            self._setregs(tid)

    def _enable_at(self, tid: int, ip: int) -> None:
        """Set the stopped thread to enable tracing (TIP.PGE) at ``ip`` and
        run on there (where ``ip`` is traced)."""
        image = self._image(tid)
        if not image.in_ranges(ip):
            self._resume_at_copy(tid)
            return
        w = self._tcb_words(tid)
        w[pc.NEXTIP // 8] = ip
        w[pc.TARGET // 8] = self._copy_of(tid, ip)
        self.regs.rip = image.runtime + pc.RT_START
        self._setregs(tid)

    def _signal(self, tid: int, sig: int) -> int:
        """A signal for a recorded thread, before the kernel delivers it:
        tracing is disabled where the thread is (FUP, TIP.PGD) and enabled
        at the handler's first instruction; returns the signal to deliver
        now (0: delivered here)."""
        self.pool.drain(tid)
        how = _disposition(self._process_of(tid), sig)
        if how in ("ignored", "stop") or not self._getregs(tid):
            return sig
        info = ctypes.create_string_buffer(128)
        ptrace(PTRACE_GETSIGINFO, tid, 0, ctypes.addressof(info))
        rip = self.regs.rip
        image = self._image(tid)
        off = rip - 2 in image.syscalls  # after a trampoline's system call
        w = self._tcb_words(tid)
        # In a traced call (calls' extents): on, or off for a system call
        # (its trampoline enables again), or about to be enabled.
        inside = bool(w[pc.ON // 8]) or (off and bool(w[pc.SYSON // 8]))
        if rip == image.runtime + pc.RT_START:
            inside = True
            # About to enable tracing (after a handler, say): it is off, and
            # enabled again where the thread goes on after this handler (the
            # original address; TARGET may be its copy, for an int3 there).
            self.regs.rip = rip = int(self._tcb_words(tid)[pc.NEXTIP // 8])
            self._setregs(tid)
            off = True
        if not off and image.in_arena(rip):
            if sig in _FAULTS:
                # A fault in a moved instruction is the original's.
                orig = image.original(rip)
                if orig is None:
                    return sig  # inside the runtime: a fault of hwtrace's, passed on
                self.regs.rip = orig
                self._setregs(tid)
            else:
                at = self._safe_point(tid)
                if at is None:
                    return 0
                if at == "int3":
                    self._hold(tid, sig)  # after hwtrace served the int3
                    return 0
                off = at == "syscall"
            rip = self.regs.rip
        if not off and image.opt.gated:
            off = not w[pc.ON // 8]  # outside the ranges or calls
        if not off:
            # Interrupted in the program's own code (tracing was on).
            saved = self.regs.copy()
            w = self._tcb_words(tid)
            w[pc.NEXTIP // 8] = rip
            self.regs.rip = image.runtime + pc.RT_ASYNC_OFF
            self._setregs(tid)
            ptrace(PTRACE_CONT, tid, 0, 0)
            if not self._wait_trap(tid, image.halts):
                return 0
            self.regs = saved
            self._setregs(tid)
        if how != "caught":
            return sig  # fatal: the trace ends disabled
        ptrace(PTRACE_SETSIGINFO, tid, 0, ctypes.addressof(info))
        # The step stops at the handler's first instruction (before it runs),
        # or earlier at another signal's stop with the thread already there.
        ptrace(PTRACE_SINGLESTEP, tid, 0, sig)
        if not self._wait_trap(tid, None, step=True) or not self._getregs(tid):
            return 0
        if image.calls is not None:
            # The handler runs in the call (on its stack, below): traced
            # if the call was; back after it, likewise.
            self.was_on.setdefault(tid, []).append(inside)
            if not inside:
                return 0
        self._enable_at(tid, self.regs.rip)
        return 0

    def _safe_point(self, tid: int) -> str | None:
        """Single-step a thread that a signal interrupted inside a trampoline
        or the runtime (whose saved registers a handler running the same
        code would overwrite) to where the handler may run: ``"code"``
        (original code, or a moved instruction: the thread is put at the
        original), ``"syscall"`` (at a trampoline's system call: tracing is
        off), ``"int3"`` (at one of the runtime's stops for hwtrace, which
        the thread is to run first); None: the thread is gone."""
        p = self._image(tid)
        for _ in range(_SAFE_STEPS):
            rip = self.regs.rip
            if not p.in_arena(rip):
                return "code"
            orig = p.origin.get(rip)
            if orig is not None:
                self.regs.rip = orig
                self._setregs(tid)
                return "code"
            if rip in p.syscalls:
                return "syscall"
            if rip + 1 in p.notify or rip + 1 in p.sigreturns or rip + 1 in p.halts:
                return "int3"
            ptrace(PTRACE_SINGLESTEP, tid, 0, 0)
            if not self._wait_trap(tid, None, step=True) or not self._getregs(tid):
                return None
        return "code"  # not expected: no routine runs that long

    def _sigreturn(self, tid: int) -> None:
        """The thread is about to run rt_sigreturn: follow it to the
        system call's exit and enable tracing where it goes back to (unless
        that is a trampoline after a system call, which enables itself)."""
        ptrace(PTRACE_SYSCALL, tid, 0, 0)
        if not self._wait_trap(tid, None):  # the entry
            return
        ptrace(PTRACE_SYSCALL, tid, 0, 0)
        if not self._wait_trap(tid, None) or not self._getregs(tid):  # the exit
            return
        rip = self.regs.rip
        image = self._image(tid)
        stack = self.was_on.get(tid)
        if image.calls is not None and not (stack.pop() if stack else False):
            self._resume_at_copy(tid)  # it interrupted the thread outside the calls
        elif not image.in_arena(rip):
            self._enable_at(tid, rip)
        elif image.ranges is not None:
            # After a system call in a trampoline, which enables tracing
            # if it was on there (a handler outside the ranges ran since).
            at = image.syscalls.get(rip - 2)
            if at is not None and image.in_ranges(at):
                self._tcb_words(tid)[pc.SYSON // 8] = 1
        ptrace(PTRACE_CONT, tid, 0, 0)


_SAFE_STEPS = 100_000


_FAULTS = (signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGTRAP)
_DEFAULT_IGNORED = (signal.SIGCHLD, signal.SIGCONT, signal.SIGURG, signal.SIGWINCH)
_STOPS = (signal.SIGSTOP, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


def _disposition(pid: int, sig: int) -> str:
    """``"caught"``, ``"ignored"``, ``"stop"`` or ``"fatal"``: what
    delivering ``sig`` to process ``pid`` does (/proc/PID/status)."""
    masks = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(("SigIgn:", "SigCgt:")):
                    masks[line[:6]] = int(line.split()[1], 16)
    except OSError:
        return "fatal"
    bit = 1 << (sig - 1)
    if masks.get("SigCgt", 0) & bit:
        return "caught"
    if masks.get("SigIgn", 0) & bit or sig in _DEFAULT_IGNORED:
        return "ignored"
    return "stop" if sig in _STOPS else "fatal"


def _status(tid: int, name: str) -> int:
    """A number of thread ``tid``'s /proc status (0: gone)."""
    try:
        with open(f"/proc/{tid}/status") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _parent(pid: int) -> int:
    """Process ``pid``'s parent (0: gone)."""
    return _status(pid, "PPid")


def _thread_group(tid: int) -> int:
    """The process (thread group) of thread ``tid`` (0: gone)."""
    return _status(tid, "Tgid")


def _is_thread(pid: int, tid: int) -> bool:
    """Is ``tid`` a thread of process ``pid`` (not a child process)?"""
    return os.path.exists(f"/proc/{pid}/task/{tid}")
