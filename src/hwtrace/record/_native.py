"""The compiled core of the software recorder: raw system calls and the
single-step loop.

System calls are issued with the ``syscall`` instruction itself (inline
assembly emitted through llvmlite from a numba intrinsic), so the loop needs
neither libc's variadic ``ptrace``/``syscall`` wrappers nor the interpreter:
per stepped instruction it runs ``PTRACE_SINGLESTEP``, ``wait4``,
``PTRACE_GETREGS``, reads the stepping clock (``rdtsc`` or
``clock_gettime(CLOCK_MONOTONIC)``), checks the address ranges and appends
the instruction's address, time and registers to numpy buffers.  It returns
to Python only when the tracee leaves the ranges, stops for a signal, exits,
or the buffers are full.
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
PTRACE_GETSIGINFO = 0x4202
PTRACE_O_TRACEEXEC = 0x10
PTRACE_O_EXITKILL = 0x100000
PTRACE_EVENT_EXEC = 4

WALL = 0x40000000  # __WALL: wait for threads and processes alike
SIGTRAP = 5
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

# Stepping clocks.
CLOCK_TSC = 0
CLOCK_MONO = 1

# Why the step loop returned.
STOP_LEFT = 1  # the tracee is about to run an instruction outside the ranges
STOP_SIGNAL = 2  # a signal stop (not the single-step trap); the instruction did not run
STOP_EXIT = 3  # the tracee exited or was killed
STOP_FULL = 4  # the buffers are full (or the instruction limit is reached)
STOP_ERROR = 5  # a system call failed (``-errno`` in the status)


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
def step_loop(pid, ips, times, regs, cols, n, limit, lo, hi, clock, scratch, state):
    """Log the tracee's current state, single-step it, and repeat while it
    stays inside the ranges ``[lo[k], hi[k])``.

    Each logged row (``ips[n]``, ``times[n]``, ``regs[n, :]`` = the registers
    ``cols`` of ``user_regs_struct``) is the state just before the
    instruction runs; it is logged, then stepped.  ``scratch`` (27 uint64)
    holds the last registers read; ``state`` (int64[4]) gets the last wait
    status (or ``-errno``) in ``state[0]`` and, on ``STOP_LEFT`` and
    ``STOP_FULL``, the time of the state not logged in ``state[1]``.
    Returns ``(n, why)`` with ``why`` one of the ``STOP_*`` codes.
    """
    status = np.zeros(2, np.int32)
    ts = np.zeros(2, np.int64)
    ncols = cols.shape[0]
    sptr = scratch.ctypes.data
    while True:
        r = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_GETREGS), np.int64(pid),
                      np.int64(0), sptr)  # fmt: skip
        if r < 0:
            state[0] = r
            return n, STOP_ERROR
        t = _now(clock, ts)
        ip = scratch[R_RIP]
        if not _in_ranges(ip, lo, hi):
            state[1] = np.int64(t)
            return n, STOP_LEFT
        if n >= limit:
            state[1] = np.int64(t)
            return n, STOP_FULL
        ips[n] = ip
        times[n] = t
        for c in range(ncols):
            regs[n, c] = scratch[cols[c]]
        n += 1
        r = _syscall4(np.int64(SYS_PTRACE), np.int64(PTRACE_SINGLESTEP), np.int64(pid),
                      np.int64(0), np.int64(0))  # fmt: skip
        if r < 0:
            state[0] = r
            return n, STOP_ERROR
        while True:
            r = _syscall4(np.int64(SYS_WAIT4), np.int64(pid), status.ctypes.data,
                          np.int64(WALL), np.int64(0))  # fmt: skip
            if r != -4:  # EINTR: wait again
                break
        if r < 0:
            state[0] = r
            return n, STOP_ERROR
        s = status[0]
        state[0] = s
        if (s & 0x7F) == 0 or ((s & 0x7F) != 0x7F):
            return n, STOP_EXIT  # exited or killed by a signal
        if ((s >> 8) & 0xFFFF) != SIGTRAP:
            return n, STOP_SIGNAL


def warm_up() -> None:
    """Compile (or load from the cache) the kernels before forking a tracee."""
    status = np.zeros(2, np.int32)
    scratch = np.zeros(N_REGS, np.uint64)
    step_loop(
        -1,
        np.zeros(1, np.uint64),
        np.zeros(1, np.uint64),
        np.zeros((1, 1), np.uint64),
        np.zeros(1, np.int64),
        0,
        0,
        np.zeros(1, np.uint64),
        np.zeros(1, np.uint64),
        CLOCK_TSC,
        scratch,
        np.zeros(4, np.int64),
    )
    ptrace(PTRACE_PEEKUSER, -1, 0, 0)
    wait4(-1, status, 1)  # WNOHANG
    rdtsc()
    monotonic_ns(np.zeros(2, np.int64))
