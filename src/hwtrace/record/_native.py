"""The compiled core of the software recorder: raw system calls and the
single-step loop.

System calls are issued with the ``syscall`` instruction itself (inline
assembly emitted through llvmlite from a numba intrinsic, defined once numba
is imported; the loops come from hwtrace's native library, see
:mod:`hwtrace.aot`), so the loop needs
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

import ctypes

import numpy as np

from .. import aot
from ..isa import tsc as _tsc
from ..isa.tsc import rdtsc

# x86-64 Linux system call numbers.
SYS_READ, SYS_OPEN, SYS_CLOSE = 0, 2, 3
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
PTRACE_O_TRACESYSGOOD = 0x1
PTRACE_SYSCALL = 24
PTRACE_GET_SYSCALL_INFO = 0x420E
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
R_RDI = REGISTER_NAMES.index("rdi")
R_RSI = REGISTER_NAMES.index("rsi")
R_RDX = REGISTER_NAMES.index("rdx")

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
STOP_PTWRITE = 10  # the instruction (logged, not run) is a PTWRITE: Python carries it out

# Traced-page keys: process index << 40 | page number.
PAGE_KEY_SHIFT = 40


# Python stand-ins of the intrinsics _numba_extensions defines.
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _syscall4(nr: int, a1: int, a2: int, a3: int, a4: int) -> int:
    r = _libc.syscall(*(ctypes.c_long(int(v)) for v in (nr, a1, a2, a3, a4)))
    return -ctypes.get_errno() if r == -1 else r


read_tsc = rdtsc


def _numba_extensions() -> None:
    import llvmlite.binding as llvm
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    # numba's code generator needs the assembly parser for inline ``syscall``.
    llvm.initialize_native_asmparser()

    @intrinsic
    def syscall4(typingctx, nr, a1, a2, a3, a4):
        """``syscall(nr, a1, a2, a3, a4)`` with the ``syscall`` instruction;
        the kernel's return value (``-errno`` on failure)."""
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

    globals()["_syscall4"] = syscall4
    globals()["read_tsc"] = _tsc.read_tsc


aot.on_numba(_numba_extensions)


@aot.njit(cache=True, _nrt=False)
def syscall4(nr: int, a1: int, a2: int, a3: int, a4: int) -> int:
    return _syscall4(np.int64(nr), np.int64(a1), np.int64(a2), np.int64(a3), np.int64(a4))


@aot.njit(cache=True, _nrt=False)
def ptrace(request: int, pid: int, addr: int, data: int) -> int:
    """The raw ptrace system call: 0 or a result, ``-errno`` on failure."""
    return _syscall4(np.int64(SYS_PTRACE), np.int64(request), np.int64(pid), np.int64(addr),
                     np.int64(data))  # fmt: skip


@aot.njit(cache=True, _nrt=False)
def wait4(pid: int, status: np.ndarray, options: int) -> int:
    """``wait4(pid, &status[0], options, NULL)``: the pid, or ``-errno``."""
    return _syscall4(np.int64(SYS_WAIT4), np.int64(pid), status.ctypes.data, np.int64(options),
                     np.int64(0))  # fmt: skip


@aot.njit(cache=True, _nrt=False)
def monotonic_ns(ts: np.ndarray) -> np.uint64:
    """CLOCK_MONOTONIC in nanoseconds (``ts``: two int64 of scratch)."""
    _syscall4(np.int64(SYS_CLOCK_GETTIME), np.int64(CLOCK_MONOTONIC), ts.ctypes.data,
              np.int64(0), np.int64(0))  # fmt: skip
    return np.uint64(ts[0] * 1_000_000_000 + ts[1])


@aot.njit(cache=True, _nrt=False)
def _now(clock, ts):
    if clock == CLOCK_TSC:
        return read_tsc()
    return monotonic_ns(ts)


@aot.njit(cache=True, _nrt=False)
def _in_ranges(ip, lo, hi):
    for k in range(lo.shape[0]):
        if lo[k] <= ip and ip < hi[k]:
            return True
    return False


@aot.njit(cache=True, _nrt=False)
def _in_ranges_of(ip, p, lo, hi, owner):
    for k in range(lo.shape[0]):
        if owner[k] == p and lo[k] <= ip and ip < hi[k]:
            return True
    return False


@aot.njit(cache=True, _nrt=False)
def _armed(ip, p, points, owner):
    for k in range(points.shape[0]):
        if points[k] == ip and owner[k] == p:
            return True
    return False


@aot.njit(cache=True, _nrt=False)
def _page_missing(ip, p, pages):
    key = (np.uint64(p) << np.uint64(PAGE_KEY_SHIFT)) | (ip >> np.uint64(12))
    i = np.searchsorted(pages, key)
    if i < pages.shape[0] and pages[i] == key:
        return np.uint64(0)
    return key | np.uint64(1 << 63)


@aot.njit(cache=True, _nrt=False)
def _page_row(a, p, pages, rows):
    """The captured page's row for address ``a`` of process ``p`` (-1: none)."""
    key = (np.uint64(p) << np.uint64(PAGE_KEY_SHIFT)) | (a >> np.uint64(12))
    i = np.searchsorted(pages, key)
    if i < pages.shape[0] and pages[i] == key:
        return rows[i]
    return -1


@aot.njit(cache=True, _nrt=False)
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


@aot.njit(cache=True, _nrt=False)
def _code_byte(a, p, code):
    """The captured code byte at address ``a`` of process ``p`` (-1: none)."""
    pages, rows, data, valid = code[0], code[1], code[2], code[3]
    row = _page_row(a, p, pages, rows)
    off = np.int64(a & np.uint64(0xFFF))
    if row < 0 or off >= valid[row]:
        return -1
    return np.int64(data[row, off])


@aot.njit(cache=True, _nrt=False)
def _is_ptwrite(ip, p, code):
    """Whether the instruction at ``ip`` is a PTWRITE (F3, a REX prefix or
    not, 0F AE /4).  A CPU that has the instruction runs it as a no-op
    while Intel PT does not trace (as in a virtual machine that does not
    expose Intel PT): no SIGILL tells the recorder then."""
    if _code_byte(ip, p, code) != 0xF3:
        return False
    k = ip + np.uint64(1)
    b = _code_byte(k, p, code)
    if 0x40 <= b <= 0x4F:
        k += np.uint64(1)
        b = _code_byte(k, p, code)
    if b != 0x0F or _code_byte(k + np.uint64(1), p, code) != 0xAE:
        return False
    modrm = _code_byte(k + np.uint64(2), p, code)
    return modrm >= 0 and (modrm >> 3) & 7 == 4


@aot.njit(cache=True, _nrt=False)
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


@aot.njit(cache=True, _nrt=False)
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
    if _is_ptwrite(ip, p, code):
        return n, STOP_PTWRITE
    return n, _single_step(tid, out, 1)


@aot.njit(cache=True, nogil=True, _nrt=False)
def step_threads(slots, mode, kick, log, cols, n, limit, ranges, points, code, clock, scratch,
                 out, work):  # fmt: skip
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
    ``(n, why)``; ``out`` says more (see the ``STOP_*`` codes).  ``work``:
    a wait status's and a clock reading's room (:func:`step_work`).
    """
    status, ts = work
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


# -- the code capture agent's loop (hwtrace.record.jitcapture) ------------------------

SYS_MMAP, SYS_MPROTECT, SYS_MUNMAP, SYS_PKEY_MPROTECT = 9, 10, 11, 329
PROT_EXEC = 4
CAP_SYSCALL = 1  # a thread at the entry or exit of a call that may change code pages
CAP_EVENT = 2  # any other report: out[1] the wait status, out[3] the tid
CAP_INTR = 3
CAP_NOCHILD = 4
CAP_ERROR = 5
CAP_FULL = 6  # the ring of captured pages is full: drain it
PROT_READ, PROT_WRITE = 1, 2
PAGE_ARMED, PAGE_EXECUTABLE = 0, 1
SEGV_ACCERR = 2
SIGSEGV = 11
# struct ptrace_syscall_info (as int64 words): op (byte 0), then at word 3
# the call's number (entry) or return value (exit), its arguments after.
_SI_OP_ENTRY, _SI_OP_EXIT = 1, 2


@aot.njit(cache=True, _nrt=False)
def _overlaps(lo, n, pages):
    """Does ``[lo, lo + n)`` overlap any page in the sorted ``pages``?"""
    if n <= 0 or pages.shape[0] == 0:
        return False
    first = lo & ~np.uint64(0xFFF)
    i = np.searchsorted(pages, first)
    return i < pages.shape[0] and pages[i] < lo + n


@aot.njit(cache=True, _nrt=False)
def _put_decimal(buf, at, v):
    """Write ``v`` in decimal at ``buf[at:]``; the index after it."""
    k = 1
    rest = v // 10
    while rest:
        k += 1
        rest //= 10
    for j in range(k - 1, -1, -1):
        buf[at + j] = 48 + v % 10
        v //= 10
    return at + k


@aot.njit(cache=True, _nrt=False)
def _thread_cpu(pid, tid, scratch):
    """The CPU ``tid`` last ran on (field 39 of /proc/PID/task/TID/stat), or -1.
    (The path is made in ``scratch``, which then takes the file.)"""
    path = scratch
    at = 0
    for c in b"/proc/":
        path[at] = c
        at += 1
    at = _put_decimal(path, at, pid)
    for c in b"/task/":
        path[at] = c
        at += 1
    at = _put_decimal(path, at, tid)
    for c in b"/stat":
        path[at] = c
        at += 1
    path[at] = 0
    fd = _syscall4(np.int64(SYS_OPEN), path.ctypes.data, np.int64(0), np.int64(0), np.int64(0))
    if fd < 0:
        return -1
    n = _syscall4(np.int64(SYS_READ), fd, scratch.ctypes.data, np.int64(scratch.shape[0]),
                  np.int64(0))  # fmt: skip
    _syscall4(np.int64(SYS_CLOSE), fd, np.int64(0), np.int64(0), np.int64(0))
    close = -1
    for j in range(max(n, 0)):
        if scratch[j] == 41:  # ')'
            close = j
    if close < 0:
        return -1
    field = 2  # the state after ") "
    j = close + 2
    while j < n and field < 39:
        if scratch[j] == 32:
            field += 1
        j += 1
    v = 0
    got = False
    while j < n and 48 <= scratch[j] <= 57:
        v = v * 10 + (scratch[j] - 48)
        got = True
        j += 1
    return v if got else -1


@aot.njit(cache=True, _nrt=False)
def inject_mprotect(tid, gadget, address, size, prot, saved, regs, status):
    """Make stopped thread ``tid`` run ``mprotect(address, size, prot)`` at
    the ``syscall`` instruction ``gadget`` (``saved``, ``regs``: registers'
    scratch, ``status`` a wait status's); its result, -errno on failure."""
    r = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GETREGS), tid, np.int64(0),
                  saved.ctypes.data)  # fmt: skip
    if r < 0:
        return r
    for k in range(saved.shape[0]):
        regs[k] = saved[k]
    regs[R_RIP] = gadget
    regs[R_RAX] = SYS_MPROTECT
    regs[R_ORIG_RAX] = np.uint64(0xFFFFFFFFFFFFFFFF)  # no restart logic for our call
    regs[R_RDI] = address
    regs[R_RSI] = size
    regs[R_RDX] = prot
    _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SETREGS), tid, np.int64(0), regs.ctypes.data)
    r = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SINGLESTEP), tid, np.int64(0),
                  np.int64(0))  # fmt: skip
    if r < 0:
        return r
    r = _syscall4(np.int64(SYS_WAIT4), tid, status.ctypes.data, np.int64(WALL), np.int64(0))
    if r < 0 or (status[0] & 0xFF) != 0x7F:
        return np.int64(-3)  # ESRCH: gone
    _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GETREGS), tid, np.int64(0), regs.ctypes.data)
    result = np.int64(regs[R_RAX])
    _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SETREGS), tid, np.int64(0), saved.ctypes.data)
    return result


@aot.njit(cache=True, _nrt=False)
def _page_hash(page):
    h = np.uint64(0xCBF29CE484222325)
    words = page.view(np.uint64)
    for k in range(words.shape[0]):
        h = (h ^ words[k]) * np.uint64(0x100000001B3)
    return h


@aot.njit(cache=True, _nrt=False)
def _code_fault(tid, pages, state, want, last, ring, meta, ctx, siginfo, regs, saved, status,
                scratch):  # fmt: skip
    """A SIGSEGV of ``tid``: if it is an access to a tracked page, handle it
    (exec: capture the page when it changed, make it executable and not
    writable; write: make it writable and not executable) and return 1; 0
    when it is the program's own fault; -1 when the ring is full first."""
    pid, mem, gadget = ctx[0], ctx[1], np.uint64(ctx[2])
    _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GETSIGINFO), tid, np.int64(0),
              siginfo.ctypes.data)  # fmt: skip
    code = np.int64(siginfo[1] & np.uint64(0xFFFFFFFF))  # si_code: the third int
    address = siginfo[2]
    page = address & ~np.uint64(0xFFF)
    i = np.searchsorted(pages, page)
    if code != SEGV_ACCERR or i >= pages.shape[0] or pages[i] != page:
        return 0
    if state[i] == PAGE_ARMED:
        _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GETREGS), tid, np.int64(0),
                  regs.ctypes.data)  # fmt: skip
        ip = regs[R_RIP]
        # An instruction fetch faults at the IP, or at the page start when
        # the instruction runs into it; any other access there is the
        # program's own fault (the page keeps what else it asked for).
        if address != ip and not (address == page and ip < address and address - ip < 16):
            return 0
        if ctx[3] >= ring.shape[0]:
            return -1
        t = read_tsc()
        n = ctx[3]
        got = _syscall4(np.int64(SYS_PREAD64), mem, ring[n].ctypes.data, np.int64(4096),
                        np.int64(page))  # fmt: skip
        ctx[4] += 1  # exec faults
        if got == 4096:
            h = _page_hash(ring[n])
            if h != last[i]:
                last[i] = h
                meta[n, 0] = np.int64(t)
                meta[n, 1] = np.int64(page)
                meta[n, 2] = tid
                meta[n, 3] = np.int64(ip)
                meta[n, 4] = _thread_cpu(pid, tid, scratch)
                ctx[3] = n + 1
        prot = (want[i] | PROT_READ) & ~PROT_WRITE
        state[i] = PAGE_EXECUTABLE
    else:
        if not want[i] & PROT_WRITE:
            return 0
        ctx[5] += 1  # write faults
        prot = (want[i] | PROT_READ) & ~PROT_EXEC
        state[i] = PAGE_ARMED
    inject_mprotect(tid, gadget, page, 4096, prot, saved, regs, status)
    return 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def capture_wait(tids, watch, pages, state, want, last, ring, meta, ctx, info, out, work):
    """Run the traced threads (resumed with ``PTRACE_SYSCALL``) until one
    needs Python: at the entry of ``mmap``/``mprotect``/``pkey_mprotect``
    asking for ``PROT_EXEC``, or of one of those or ``munmap`` touching a
    page in ``pages`` (sorted, the tracked ones); at the exit of a call
    ``watch[slot]`` marks; or any other report but the faults on tracked
    pages, which are handled here (:func:`_code_fault`: ``state``,
    ``want``, ``last`` per page; captured pages go to ``ring`` with their
    (TSC, page, tid, IP, CPU) in ``meta``).  ``ctx``: pid, the
    ``/proc/PID/mem`` descriptor, the ``syscall`` gadget, pages in the ring,
    exec faults, write faults, TSC ticks spent in fault handling.  ``info``
    receives the thread's ``ptrace_syscall_info`` (int64 words).  Returns a
    ``CAP_*`` code with ``out`` = (slot, status, _, tid).  ``work``: room
    for what the loop reads (:func:`capture_work`)."""
    status, status2, siginfo, regs, saved, scratch = work
    buf = info.ctypes.data
    if tids.shape[0] == 0:
        return CAP_NOCHILD
    while True:
        if ctx[3] >= ring.shape[0]:
            return CAP_FULL  # before waiting: a fault always finds a free slot
        r = _syscall4(np.int64(SYS_WAIT4), np.int64(-1), status.ctypes.data, np.int64(WALL),
                      np.int64(0))  # fmt: skip
        if r == -4:
            return CAP_INTR
        if r < 0:
            out[1] = r
            return CAP_NOCHILD if r == -10 else CAP_ERROR
        st = np.int64(status[0])
        s = -1
        for k in range(tids.shape[0]):
            if tids[k] == r:
                s = k
                break
        out[0] = s
        out[1] = st
        out[3] = r
        if s >= 0 and (st & 0xFFFF) == ((SIGSEGV << 8) | 0x7F):
            t0 = read_tsc()
            got = _code_fault(r, pages, state, want, last, ring, meta, ctx, siginfo, regs,
                              saved, status2, scratch)  # fmt: skip
            if got < 0:
                return CAP_FULL
            if got == 0:
                return CAP_EVENT
            ctx[6] += np.int64(read_tsc() - t0)
            _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SYSCALL), r, np.int64(0), np.int64(0))
            continue
        if s < 0 or (st & 0xFFFF) != (((SIGTRAP | 0x80) << 8) | 0x7F):
            return CAP_EVENT
        got = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GET_SYSCALL_INFO), r,
                        np.int64(info.shape[0] * 8), buf)  # fmt: skip
        if got < 0:
            out[1] = got
            return CAP_ERROR
        op = info[0] & 0xFF
        if op == _SI_OP_ENTRY:
            nr = info[3]
            lo = np.uint64(info[4])
            n = np.uint64(info[5])
            prot = info[6]
            if nr == SYS_MMAP or nr == SYS_MPROTECT or nr == SYS_PKEY_MPROTECT:
                if prot & PROT_EXEC or _overlaps(lo, n, pages):
                    return CAP_SYSCALL
            elif nr == SYS_MUNMAP and _overlaps(lo, n, pages):
                return CAP_SYSCALL
        elif op == _SI_OP_EXIT and watch[s]:
            return CAP_SYSCALL
        r2 = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SYSCALL), r, np.int64(0), np.int64(0))
        if r2 < 0 and r2 != -3:  # ESRCH: it is gone, its exit comes next
            out[1] = r2
            return CAP_ERROR


@aot.njit(cache=True, _nrt=False)
def previous_row(rslot: np.ndarray, row: int, slot: int) -> int:
    """The last row before ``row`` logged for ``slot`` (-1: none)."""
    for k in range(row - 1, -1, -1):
        if rslot[k] == slot:
            return k
    return -1


@aot.njit(cache=True, _nrt=False)
def tgkill(tgid: int, tid: int, sig: int) -> int:
    return _syscall4(np.int64(SYS_TGKILL), np.int64(tgid), np.int64(tid), np.int64(sig),
                     np.int64(0))  # fmt: skip


def step_work() -> tuple[np.ndarray, np.ndarray]:
    """:func:`step_threads`'s room: a wait status, a clock reading."""
    return np.zeros(2, np.int32), np.zeros(2, np.int64)


def capture_work() -> tuple[np.ndarray, ...]:
    """:func:`capture_wait`'s room: two wait statuses, a siginfo, two
    register sets, a /proc file's bytes."""
    return (
        np.zeros(2, np.int32), np.zeros(2, np.int32), np.zeros(16, np.uint64),
        np.zeros(N_REGS, np.uint64), np.zeros(N_REGS, np.uint64), np.zeros(1024, np.uint8),
    )  # fmt: skip


def warm_up() -> None:
    """Compile (or load from the library or the cache) the kernels before
    forking a tracee."""
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
        step_work(),
    )
    previous_row(i64, 0, 0)
    capture_wait(np.zeros(0, np.int64), i64, np.zeros(0, np.uint64), i64, i64, u64,
                 np.zeros((1, 4096), np.uint8), np.zeros((1, 5), np.int64), np.zeros(8, np.int64),
                 np.zeros(12, np.int64), np.zeros(8, np.int64), capture_work())  # fmt: skip
    tgkill(-1, -1, 0)
    ptrace(PTRACE_PEEKUSER, -1, 0, 0)
    wait4(-1, status, 1)  # WNOHANG
    rdtsc()
    monotonic_ns(np.zeros(2, np.int64))
