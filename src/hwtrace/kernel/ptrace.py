"""ptrace(2) for x86-64: the call, the requests and options hwtrace uses, and
``struct user_regs_struct``."""

from __future__ import annotations

import ctypes
import signal

__all__ = [
    "PTRACE_CONT",
    "PTRACE_DETACH",
    "PTRACE_GETEVENTMSG",
    "PTRACE_GETREGS",
    "PTRACE_GETSIGINFO",
    "PTRACE_GETSIGMASK",
    "PTRACE_INTERRUPT",
    "PTRACE_O_TRACECLONE",
    "PTRACE_O_TRACEEXEC",
    "PTRACE_O_TRACEEXIT",
    "PTRACE_O_TRACEFORK",
    "PTRACE_O_TRACESYSGOOD",
    "PTRACE_O_TRACEVFORK",
    "PTRACE_SEIZE",
    "PTRACE_SETOPTIONS",
    "PTRACE_SETREGS",
    "PTRACE_SETSIGINFO",
    "PTRACE_SETSIGMASK",
    "PTRACE_SINGLESTEP",
    "PTRACE_SYSCALL",
    "PTRACE_TRACEME",
    "SYSCALL_STOP",
    "WALL",
    "Registers",
    "ptrace",
    "tgkill",
]

PTRACE_TRACEME = 0
PTRACE_CONT = 7
PTRACE_SINGLESTEP = 9
PTRACE_GETREGS = 12
PTRACE_SETREGS = 13
PTRACE_DETACH = 17
PTRACE_SYSCALL = 24
PTRACE_SETOPTIONS = 0x4200
PTRACE_GETEVENTMSG = 0x4201
PTRACE_GETSIGINFO = 0x4202
PTRACE_SETSIGINFO = 0x4203
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
PTRACE_GETSIGMASK, PTRACE_SETSIGMASK = 0x420A, 0x420B
PTRACE_O_TRACESYSGOOD = 1
PTRACE_O_TRACEFORK = 2
PTRACE_O_TRACEVFORK = 4
PTRACE_O_TRACECLONE = 8
PTRACE_O_TRACEEXEC = 0x10
PTRACE_O_TRACEEXIT = 0x40
SYSCALL_STOP = signal.SIGTRAP | 0x80  # a syscall stop, with PTRACE_O_TRACESYSGOOD
WALL = 0x40000000  # __WALL: wait for every kind of child

_libc = ctypes.CDLL(None, use_errno=True)
_ptrace = _libc.ptrace
_ptrace.restype = ctypes.c_long
_ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]


def ptrace(request: int, tid: int, addr: int = 0, data: int = 0) -> int:
    """The call's result, or ``-errno``."""
    r = _ptrace(request, tid, ctypes.c_void_p(addr), ctypes.c_void_p(data))
    if r == -1:
        return -ctypes.get_errno()
    return r


def tgkill(pid: int, tid: int, sig: int) -> int:
    """Send ``sig`` to thread ``tid`` of process ``pid``; 0 or -1."""
    return _libc.syscall(234, pid, tid, sig)


class Registers(ctypes.Structure):
    """``struct user_regs_struct`` (x86-64)."""

    _fields_ = [
        (name, ctypes.c_ulonglong)
        for name in (
            "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8",
            "rax", "rcx", "rdx", "rsi", "rdi", "orig_rax", "rip", "cs", "eflags",
            "rsp", "ss", "fs_base", "gs_base", "ds", "es", "fs", "gs",
        )
    ]  # fmt: skip

    def copy(self) -> Registers:
        out = Registers()
        ctypes.memmove(ctypes.byref(out), ctypes.byref(self), ctypes.sizeof(self))
        return out
