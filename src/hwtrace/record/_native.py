"""The compiled core of the software recorder: raw system calls and the
single-step loop.

System calls are issued with the ``syscall`` instruction itself (inline
assembly emitted through llvmlite from a numba intrinsic), so the loop needs
neither libc's variadic ``ptrace``/``syscall`` wrappers nor the interpreter:
it waits for any traced thread (``wait4(-1, __WALL)``), and per stepped
instruction runs ``PTRACE_GETREGS``, reads the stepping clock (``rdtsc`` or
``clock_gettime(CLOCK_MONOTONIC)``), checks the thread's address ranges and
call extent, appends the instruction's address, time, registers and thread
to numpy buffers and issues ``PTRACE_SINGLESTEP``.  Several threads are
stepped at once, each its own stop-and-go.  It returns to Python only for
what is not a plain step of a traced thread: a thread leaving its traced
code or reaching a breakpoint, a signal, a ptrace event, an exit, full
buffers.
"""

from __future__ import annotations

import llvmlite.binding as llvm
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# numba's code generator needs the assembly parser for inline ``syscall``.
llvm.initialize_native_asmparser()

# x86-64 Linux system call numbers.
SYS_PREAD64 = 17
SYS_WAIT4 = 61
SYS_KILL = 62
SYS_PTRACE = 101
SYS_CLOCK_GETTIME = 228
SYS_TGKILL = 234

# ptrace requests and options.
PTRACE_TRACEME = 0
PTRACE_PEEKUSER = 3
PTRACE_CONT = 7
PTRACE_KILL = 8
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_ATTACH = 16
PTRACE_DETACH = 17
PTRACE_SETOPTIONS = 0x4200
PTRACE_GETEVENTMSG = 0x4201
PTRACE_GETSIGINFO = 0x4202
PTRACE_O_TRACEFORK = 0x2
PTRACE_O_TRACEVFORK = 0x4
PTRACE_O_TRACECLONE = 0x8
PTRACE_O_TRACEEXEC = 0x10
PTRACE_O_TRACEVFORKDONE = 0x20
PTRACE_O_TRACEEXIT = 0x40
PTRACE_O_EXITKILL = 0x100000
PTRACE_EVENT_FORK = 1
PTRACE_EVENT_VFORK = 2
PTRACE_EVENT_CLONE = 3
PTRACE_EVENT_EXEC = 4
PTRACE_EVENT_VFORK_DONE = 5
PTRACE_EVENT_EXIT = 6

WALL = 0x40000000  # __WALL: wait for threads and processes alike
SIGTRAP = 5
SIGSTOP = 19
CLOCK_MONOTONIC = 1

# struct user_regs_struct, in order (27 unsigned longs).
REGISTER_NAMES = (
    "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
    "rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags",
    "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs",
)  # fmt: skip
N_REGS = len(REGISTER_NAMES)
R_RIP = REGISTER_NAMES.index("rip")
R_RSP = REGISTER_NAMES.index("rsp")
R_EFLAGS = REGISTER_NAMES.index("eflags")
R_RAX = REGISTER_NAMES.index("rax")
R_ORIG_RAX = REGISTER_NAMES.index("orig_rax")

# Stepping clocks.
CLOCK_TSC = 0
CLOCK_MONO = 1

# Why the step loop returned (``out[0]`` is the thread's slot, or -1).
STOP_LEFT = 1  # the thread is about to run an instruction outside (not logged); out[2]: time
STOP_EVENT = 2  # a report the loop leaves to Python: out[1] wait status, out[3] the pid
STOP_BREAKPOINT = 3  # the thread is about to run an armed breakpoint's address (not logged)
STOP_FULL = 4  # the buffers are full or the instruction limit is reached (not logged)
STOP_ERROR = 5  # a system call failed: out[1] = -errno; out[4] = 1 when a row was logged
STOP_NEWPAGE = 6  # the instruction is on a code page not captured yet: out[5] the page key
STOP_INTR = 7  # waiting was interrupted by a signal to the recorder (^C): check it
STOP_NOCHILD = 8  # nothing is left to wait for
STOP_CHANGED = 9  # the code at the instruction differs from its page's capture: out[5] the page key

# Traced-page keys: process index << 40 | page number.
PAGE_KEY_SHIFT = 40


@intrinsic
def _syscall4(typingctx, nr, a1, a2, a3, a4):
    """``syscall(nr, a1, a2, a3, a4)`` with the ``syscall`` instruction; the
    kernel's return value (``-errno`` on failure)."""
    sig = types.int64(nr, a1, a2, a3, a4)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        vals = [
            context.cast(builder, v, t, types.int64)
            for v, t in zip(args, signature.args, strict=True)
        ]
        fnty = ir.FunctionType(i64, [i64] * 5)
        return builder.asm(
            fnty,
            "syscall",
            "={rax},{rax},{rdi},{rsi},{rdx},{r10},~{rcx},~{r11},~{memory}",
            vals,
            side_effect=True,
        )

    return sig, codegen


@intrinsic
def _rdtsc(typingctx):
    """The time stamp counter (``llvm.readcyclecounter``, i.e. ``rdtsc``)."""
    sig = types.uint64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True)
def syscall4(nr: int, a1: int, a2: int, a3: int, a4: int) -> int:
    return _syscall4(np.int64(nr), np.int64(a1), np.int64(a2), np.int64(a3), np.int64(a4))


@njit(cache=True)
def ptrace(request: int, pid: int, addr: int, data: int) -> int:
    """The raw ptrace system call: 0 or a result, ``-errno`` on failure."""
    return _syscall4(np.int64(SYS_PTRACE), np.int64(request), np.int64(pid), np.int64(addr),
                     np.int64(data))  # fmt: skip


@njit(cache=True)
def wait4(pid: int, status: np.ndarray, options: int) -> int:
    """``wait4(pid, &status[0], options, NULL)``: the pid, or ``-errno``."""
    return _syscall4(np.int64(SYS_WAIT4), np.int64(pid), status.ctypes.data, np.int64(options),
                     np.int64(0))  # fmt: skip


@njit(cache=True)
def rdtsc() -> np.uint64:
    return _rdtsc()


@njit(cache=True)
def monotonic_ns(ts: np.ndarray) -> np.uint64:
    """CLOCK_MONOTONIC in nanoseconds (``ts``: two int64 of scratch)."""
    _syscall4(np.int64(SYS_CLOCK_GETTIME), np.int64(CLOCK_MONOTONIC), ts.ctypes.data,
              np.int64(0), np.int64(0))  # fmt: skip
    return np.uint64(ts[0] * 1_000_000_000 + ts[1])


@njit(cache=True)
def _now(clock, ts):
    if clock == CLOCK_TSC:
        return _rdtsc()
    return monotonic_ns(ts)


@njit(cache=True)
def _in_ranges(ip, lo, hi):
    for k in range(lo.shape[0]):
        if lo[k] <= ip and ip < hi[k]:
            return True
    return False


@njit(cache=True)
def _in_ranges_of(ip, p, lo, hi, owner):
    for k in range(lo.shape[0]):
        if owner[k] == p and lo[k] <= ip and ip < hi[k]:
            return True
    return False


@njit(cache=True)
def _armed(ip, p, points, owner):
    for k in range(points.shape[0]):
        if points[k] == ip and owner[k] == p:
            return True
    return False


@njit(cache=True)
def _page_missing(ip, p, pages):
    key = (np.uint64(p) << np.uint64(PAGE_KEY_SHIFT)) | (ip >> np.uint64(12))
    i = np.searchsorted(pages, key)
    if i < pages.shape[0] and pages[i] == key:
        return np.uint64(0)
    return key | np.uint64(1 << 63)


@njit(cache=True)
def _page_row(a, p, pages, rows):
    """The captured page's row for address ``a`` of process ``p`` (-1: none)."""
    key = (np.uint64(p) << np.uint64(PAGE_KEY_SHIFT)) | (a >> np.uint64(12))
    i = np.searchsorted(pages, key)
    if i < pages.shape[0] and pages[i] == key:
        return rows[i]
    return -1


@njit(cache=True)
def _code_changed(ip, p, code, points):
    """Has the code at ``ip`` (the 16 bytes from it) changed since its pages
    were captured?  Returns the page key of the first changed byte, or 0.
    Bytes under the recorder's own breakpoints are not compared while the
    breakpoint is there (code written over one is a change)."""
    pages, rows, data, valid, mems, buf = code
    if p >= mems.shape[0] or mems[p] < 0:
        return np.uint64(0)
    got = _syscall4(np.int64(SYS_PREAD64), mems[p], buf.ctypes.data, np.int64(16), np.int64(ip))
    bpt, bown = points
    for k in range(max(got, 0)):
        a = ip + np.uint64(k)
        row = _page_row(a, p, pages, rows)
        off = np.int64(a & np.uint64(0xFFF))
        if row < 0 or off >= valid[row] or data[row, off] == buf[k]:
            continue
        if buf[k] == 0xCC and _armed(a, p, bpt, bown):
            continue  # the recorder's own breakpoint
        return (np.uint64(p) << np.uint64(PAGE_KEY_SHIFT)) | (a >> np.uint64(12))
    return np.uint64(0)


@njit(cache=True)
def _single_step(tid, out, logged):
    """PTRACE_SINGLESTEP: 0, or STOP_ERROR with ``-errno`` in ``out[1]``
    (``out[4]``: whether a row was logged for the step)."""
    r = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SINGLESTEP), tid, np.int64(0),
                  np.int64(0))  # fmt: skip
    if r < 0:
        out[1] = r
        out[4] = logged
        return STOP_ERROR
    return 0


@njit(cache=True)
def _visit(s, slots, log, cols, n, limit, ranges, points, code, clock, scratch, ts, out):
    """Read thread ``s``'s registers; if it is about to run an instruction
    it traces, log it and single-step it.  Returns ``(n, why)``, ``why`` 0
    when it was stepped."""
    pages = code[0]
    tids, proc, extent, count, last, restart = slots
    ips, times, regs, rslot = log
    lo, hi, owner = ranges
    bpt, bown = points
    tid = tids[s]
    out[0] = s
    r = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GETREGS), tid, np.int64(0),
                  scratch.ctypes.data)  # fmt: skip
    if r < 0:
        out[1] = r
        out[4] = 0
        return n, STOP_ERROR
    ax = np.int64(scratch[R_RAX])
    if -516 <= ax <= -512 and np.int64(scratch[R_ORIG_RAX]) >= 0:
        # A system call's exit reported before the kernel restarts it
        # (-ERESTART*: the IP goes back to the syscall instruction, or a
        # handler runs first): nothing new to log; step on.
        restart[s] = 1
        return n, _single_step(tid, out, 0)
    t = _now(clock, ts)
    out[2] = np.int64(t)
    ip = scratch[R_RIP]
    p = proc[s]
    inside = False
    e = extent[s]
    if e != 0:
        if scratch[R_RSP] <= e:
            inside = True
        else:
            extent[s] = 0  # the call returned (or unwound past its frame)
    if not inside and not _in_ranges_of(ip, p, lo, hi, owner):
        return n, STOP_LEFT
    if _armed(ip, p, bpt, bown):
        return n, STOP_BREAKPOINT
    for a in (ip, ip + np.uint64(15)):
        key = _page_missing(a, p, pages)
        if key != 0:
            out[5] = np.int64(key & np.uint64((1 << 63) - 1))
            return n, STOP_NEWPAGE
    key = _code_changed(ip, p, code, points)
    if key != 0:
        out[5] = np.int64(key)
        return n, STOP_CHANGED
    if n >= limit:
        return n, STOP_FULL
    ips[n] = ip
    times[n] = t
    for c in range(cols.shape[0]):
        regs[n, c] = scratch[cols[c]]
    rslot[n] = s
    restart[s] = 0
    count[s] += 1
    last[s] = n
    n += 1
    return n, _single_step(tid, out, 1)


@njit(cache=True, nogil=True)
def step_threads(slots, mode, kick, log, cols, n, limit, ranges, points, code, clock, scratch,
                 out):  # fmt: skip
    """Single-step every thread that is in its traced code, logging each
    instruction, until something needs Python.

    Per thread slot ``s``: ``slots`` = (tids, process index, call extent (the
    stack pointer at the traced call's entry; 0: none), rows logged, last
    row, 1 while the thread steps through a system call's restart (its last
    row, the system call, ran)); ``mode[s]`` 1 when the loop steps it (its single-step traps are
    its own to handle), 0 when each of its reports goes back to Python;
    ``kick[s]`` 1 to look at it first (it is stopped, not yet looked at).
    A thread traces the instruction it is about to run when that is inside
    its process's ``ranges`` (lo, hi, process) or inside its call extent
    (its stack pointer at or below the entry's).  ``log`` = (ips, times,
    registers ``cols`` of ``user_regs_struct``, slot) per row: the state
    before the instruction ran.  ``points`` (address, process) are the armed
    breakpoints, never stepped here; ``code`` the code pages captured:
    (sorted page keys, each one's row in the next two, page bytes (rows x
    4096), valid bytes per row, each process's ``/proc/PID/mem`` descriptor
    (-1: none), 16 bytes of scratch).  Before each step the instruction's
    bytes are read and compared with the capture (``STOP_CHANGED``), so
    code rewritten since it was captured is seen.  Waits with ``wait4(-1, __WALL)``, without the
    interpreter lock (other Python threads run meanwhile).  Returns
    ``(n, why)``; ``out`` says more (see the ``STOP_*`` codes).
    """
    status = np.zeros(2, np.int32)
    ts = np.zeros(2, np.int64)
    tids = slots[0]
    nslots = tids.shape[0]
    if nslots == 0:
        return n, STOP_NOCHILD
    for s in range(nslots):
        if kick[s] != 0:
            kick[s] = 0
            n, why = _visit(s, slots, log, cols, n, limit, ranges, points, code, clock, scratch,
                            ts, out)  # fmt: skip
            if why != 0:
                return n, why
    while True:
        r = _syscall4(np.int64(SYS_WAIT4), np.int64(-1), status.ctypes.data, np.int64(WALL),
                      np.int64(0))  # fmt: skip
        if r == -4:  # EINTR: let the interpreter see the signal
            return n, STOP_INTR
        if r < 0:
            out[1] = r
            return n, STOP_NOCHILD if r == -10 else STOP_ERROR
        st = status[0]
        s = -1
        for k in range(nslots):
            if tids[k] == r:
                s = k
                break
        if s < 0 or mode[s] != 1 or st != ((SIGTRAP << 8) | 0x7F):
            out[0] = s
            out[1] = st
            out[3] = r
            return n, STOP_EVENT
        n, why = _visit(s, slots, log, cols, n, limit, ranges, points, code, clock, scratch, ts,
                        out)  # fmt: skip
        if why != 0:
            return n, why


@njit(cache=True)
def previous_row(rslot: np.ndarray, row: int, slot: int) -> int:
    """The last row before ``row`` logged for ``slot`` (-1: none)."""
    for k in range(row - 1, -1, -1):
        if rslot[k] == slot:
            return k
    return -1


@njit(cache=True)
def tgkill(tgid: int, tid: int, sig: int) -> int:
    return _syscall4(np.int64(SYS_TGKILL), np.int64(tgid), np.int64(tid), np.int64(sig),
                     np.int64(0))  # fmt: skip


def warm_up() -> None:
    """Compile (or load from the cache) the kernels before forking a tracee."""
    status = np.zeros(2, np.int32)
    i64, u64 = np.zeros(1, np.int64), np.zeros(1, np.uint64)
    step_threads(
        (np.zeros(0, np.int64), i64, u64, i64, i64, i64),
        np.zeros(0, np.int64),
        np.zeros(0, np.int64),
        (u64, u64, np.zeros((1, 1), np.uint64), i64),
        i64,
        0,
        0,
        (u64, u64, i64),
        (u64, i64),
        (
            np.zeros(0, np.uint64),
            i64,
            np.zeros((1, 4096), np.uint8),
            i64,
            i64,
            np.zeros(16, np.uint8),
        ),
        CLOCK_TSC,
        np.zeros(N_REGS, np.uint64),
        np.zeros(8, np.int64),
    )
    previous_row(i64, 0, 0)
    tgkill(-1, -1, 0)
    ptrace(PTRACE_PEEKUSER, -1, 0, 0)
    wait4(-1, status, 1)  # WNOHANG
    rdtsc()
    monotonic_ns(np.zeros(2, np.int64))
