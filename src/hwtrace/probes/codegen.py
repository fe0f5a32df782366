"""Machine code put into the traced process: the gadgets hwtrace borrows a
thread with, the runtime (a SIGTRAP redirect handler) and the trampolines.

Everything is built as iced-x86 instructions and laid out by its
``BlockEncoder``, which resolves the branches between them; nothing needs a
compiler or an assembler at run time.

Runtime region, mapped once per process (``RUNTIME_SIZE`` bytes)::

    code page (R-X)       data pages (RW-), from R + PAGE
                          +0x000 redirect entries in use (high-water mark)
                          +0x008 traps redirected
    +0x10 restorer        +0x010 traps passed on to the previous handler
    +0x40 SIGTRAP handler +0x020 previous sigaction, +0x040 ours, +0x060 SIG_DFL
                          +0x100 scratch
                          +PAGE  redirect table: (from, to) pairs

The handler looks the trapping address (``rip - 1``) up in the redirect
table and sends the thread there; any other trap goes to the handler that
was installed before (or the default action, re-raised).  It lives in the
target, so traps need no round trip to hwtrace and keep working if hwtrace
dies.  Entries are only appended (a free slot is filled ``to`` first, then
``from`` by one 8-byte store), marked retired when their tracepoint is
removed (bit 63 of ``to``, one 8-byte store) and cleared when nothing can
trap there any more, so a concurrent lookup always sees whole entries.  A
live entry wins over retired ones for the same address, wherever it is in
the table: retired entries only serve threads still inside removed code.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from iced_x86 import BlockEncoder, Code, Instruction, MemoryOperand, Register

from .relocate import Relocated
from .rings import F_CPU, F_KIND, F_PROBE, F_REGS, F_SEQ, F_TID, F_TSC, HEADER_BYTES
from .rings import SLOT_BYTES as SB

__all__ = [
    "PAGE",
    "RESUME_CONTEXT",
    "RESUME_SIZE",
    "RESUME_STORE",
    "RESUME_SYSCALL",
    "RETIRED",
    "RUNTIME_SIZE",
    "TABLE_CAPACITY",
    "Asm",
    "runtime_code",
    "trampoline",
]

PAGE = 0x1000
TABLE_PAGES = 16
TABLE_CAPACITY = TABLE_PAGES * PAGE // 16
RUNTIME_SIZE = PAGE + PAGE + TABLE_PAGES * PAGE

# Offsets in the code page.
RESTORER = 0x10
HANDLER = 0x40
SIGACTION_BYTES = 32  # a kernel struct sigaction (x86-64): handler, flags, restorer, mask
# Offsets in the data pages (from the code page's start): three counters,
# then the previous, our and the default SIGTRAP action.
D = PAGE
COUNT, REDIRECTED, PASSED = (D + 8 * k for k in range(3))
OLD_ACTION, NEW_ACTION, DFL_ACTION = (D + 0x020 + SIGACTION_BYTES * k for k in range(3))
SCRATCH = D + 0x100
TABLE = D + PAGE

SI_KERNEL = 0x80  # si_code of an int3 trap
UC_RIP = 168  # offsetof(ucontext_t, uc_mcontext.gregs[REG_RIP]), glibc x86-64
SA_SIGINFO, SA_ONSTACK, SA_RESTART, SA_RESTORER = 0x4, 0x08000000, 0x10000000, 0x04000000
SIGTRAP = 5
SYS_RT_SIGACTION, SYS_RT_SIGRETURN, SYS_GETPID, SYS_GETTID, SYS_TGKILL = 13, 15, 39, 186, 234

RAX, RCX, RDX, RSI, RDI, RSP = (
    Register.RAX, Register.RCX, Register.RDX, Register.RSI, Register.RDI, Register.RSP,
)  # fmt: skip
R8, R10 = Register.R8, Register.R10
RETIRED = 1 << 63  # in a redirect entry's ``to``: its tracepoint was removed


def mem(base: int, displ: int = 0, size: int = 0) -> MemoryOperand:
    """``[base + displ]``; with base RIP, ``displ`` is the absolute target."""
    if base == Register.RIP:
        return MemoryOperand(Register.RIP, displ=displ)
    if displ == 0:
        return MemoryOperand(base)
    return MemoryOperand(base, displ=displ, displ_size=size or (1 if -128 <= displ < 128 else 8))


class Asm:
    """A list of iced-x86 instructions with labels, encoded at one address.

    Labels are fake instruction addresses: a branch to a label targets the
    instruction placed after it, which ``BlockEncoder`` then relocates.
    """

    _LABELS = 1 << 60
    _PLAIN = 1 << 61

    def __init__(self) -> None:
        self.instructions: list[Instruction] = []
        self._pending: list[int] = []
        self._labels = 0

    def new_label(self) -> int:
        self._labels += 1
        return self._LABELS + self._labels * 16

    def place(self, label: int) -> None:
        self._pending.append(label)

    def __call__(self, instr: Instruction) -> Asm:
        if self._pending:
            label = self._pending.pop()
            if self._pending:
                raise ValueError("two labels on one instruction")
            instr.ip = label
        else:
            instr.ip = self._PLAIN + len(self.instructions) * 16
        self.instructions.append(instr)
        return self

    def encode(self, address: int) -> bytes:
        if self._pending:
            raise ValueError("a label at the end of the code")
        encoder = BlockEncoder(64)
        encoder.add_many(self.instructions)
        return encoder.encode(address)

    # -- shorthands -------------------------------------------------------------------
    def lea(self, reg: int, m: MemoryOperand) -> None:
        self(Instruction.create_reg_mem(Code.LEA_R64_M, reg, m))

    def jcc(self, code: int, target: int) -> None:
        """A branch of kind ``code`` to ``target`` (a label or an address)."""
        self(Instruction.create_branch(code, target))

    def locked_inc(self, m: MemoryOperand) -> None:
        """``lock inc qword [m]``: a counter any thread may bump."""
        inc = Instruction.create_mem(Code.INC_RM64, m)
        inc.has_lock_prefix = True
        self(inc)


I = Instruction  # noqa: E741 - short name for the constructors below


def runtime_code(base: int) -> bytes:
    """The code page of the runtime region mapped at ``base``."""
    out = bytearray(b"\xcc" * HANDLER)
    out[RESTORER : RESTORER + 7] = b"\xb8\x0f\x00\x00\x00\x0f\x05"  # mov eax,15; syscall
    return bytes(out) + _trap_handler(base + HANDLER, base)


# The resume block: the gadgets a borrowed thread runs hwtrace's system calls
# and stores with.  Each ends in a system call, where hwtrace takes the
# thread back (PTRACE_SYSCALL); if hwtrace is gone, the thread runs on into
# code that puts back its signal mask (hwtrace blocks every signal while it
# borrows the thread, so that none is taken from the thread meanwhile),
# reloads every register hwtrace or the calls may have changed from the
# context (the thread's own, :meth:`~.ptrace.SeizedThread.continuation`) and
# jumps back to where the thread was.  Flags and rsp are never changed.
RESUME_SYSCALL = 0x00  # syscall; jmp restore
RESUME_STORE = 0x04  # mov [rdi],rsi; syscall (getpid); restore
RESUME_CONTEXT = 0x70  # rax rcx rdx rsi rdi r8 r9 r10 r11, rip, the signal mask
RESUME_SIZE = RESUME_CONTEXT + 11 * 8
_RESUMED = ("rax", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10", "r11")
SYS_RT_SIGPROCMASK, SIG_SETMASK = 14, 2


def resume_block(address: int) -> bytes:
    """The resume block at ``address`` (its context written apart, by
    :func:`resume_context`)."""
    code = b"\x0f\x05\xeb\x05" + b"\x48\x89\x37\x0f\x05"  # jmp rel8 +5: to the restore
    context = address + RESUME_CONTEXT
    a = Asm()
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EAX, SYS_RT_SIGPROCMASK))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EDI, SIG_SETMASK))
    a.lea(RSI, mem(Register.RIP, context + 8 * (len(_RESUMED) + 1)))
    a(I.create_reg_reg(Code.XOR_R32_RM32, Register.EDX, Register.EDX))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.R10D, 8))
    a(I.create(Code.SYSCALL))
    for i, name in enumerate(_RESUMED):
        a(I.create_reg_mem(Code.MOV_R64_RM64, REGISTERS[name], mem(Register.RIP, context + 8 * i)))
    a(I.create_mem(Code.JMP_RM64, mem(Register.RIP, context + 8 * len(_RESUMED))))
    code += a.encode(address + len(code))
    assert len(code) <= RESUME_CONTEXT
    return code + b"\xcc" * (RESUME_CONTEXT - len(code))


def resume_context(regs, mask: int) -> bytes:
    """The context part of the resume block, from ``regs``
    (:class:`~.ptrace.Registers`) and the signal mask to put back."""
    values = [getattr(regs, name) for name in _RESUMED] + [regs.rip, mask]
    return b"".join(v.to_bytes(8, "little") for v in values)


def _trap_handler(address: int, base: int) -> bytes:
    """``handler(sig, info, uc)``: rdi, rsi and rdx are kept for the previous
    handler; only caller-saved scratch registers are used."""
    a = Asm()
    loop, nxt, end, hit, passed, ignore, dfl = (a.new_label() for _ in range(7))
    r9 = Register.R9
    a(I.create_mem_i32(Code.CMP_RM32_IMM32, mem(RSI, 8), SI_KERNEL))
    a.jcc(Code.JNE_REL32_64, passed)
    a(I.create_reg_mem(Code.MOV_R64_RM64, RAX, mem(RDX, UC_RIP)))
    a.lea(RAX, mem(RAX, -1))
    a(I.create_reg_mem(Code.MOV_R64_RM64, RCX, mem(Register.RIP, base + COUNT)))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.R8D, TABLE_CAPACITY))
    a(I.create_reg_reg(Code.CMP_RM64_R64, RCX, R8))
    a(I.create_reg_reg(Code.CMOVA_R64_RM64, RCX, R8))
    a.lea(R8, mem(Register.RIP, base + TABLE))
    a(I.create_reg_reg(Code.XOR_R32_RM32, Register.R9D, Register.R9D))  # no retired match yet
    a.place(loop)
    a(I.create_reg_reg(Code.TEST_RM64_R64, RCX, RCX))
    a.jcc(Code.JE_REL32_64, end)
    a(I.create_mem_reg(Code.CMP_RM64_R64, mem(R8), RAX))
    a.jcc(Code.JNE_REL32_64, nxt)
    a(I.create_reg_mem(Code.MOV_R64_RM64, R10, mem(R8, 8)))  # read once: it may be retired now
    a(I.create_reg_reg(Code.TEST_RM64_R64, R10, R10))
    a.jcc(Code.JNS_REL32_64, hit)  # a live entry wins at once
    a(I.create_reg_reg(Code.MOV_R64_RM64, r9, R10))  # retired: only if no live one matches
    a.place(nxt)
    a(I.create_reg_i32(Code.ADD_RM64_IMM8, R8, 16))
    a(I.create_reg(Code.DEC_RM64, RCX))
    a(I.create_branch(Code.JMP_REL32_64, loop))
    a.place(end)
    a(I.create_reg_reg(Code.TEST_RM64_R64, r9, r9))
    a.jcc(Code.JE_REL32_64, passed)
    a(I.create_reg_reg(Code.MOV_R64_RM64, R10, r9))
    a(I.create_reg_i32(Code.BTR_RM64_IMM8, R10, 63))
    a.place(hit)
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(RDX, UC_RIP), R10))
    a.locked_inc(mem(Register.RIP, base + REDIRECTED))
    a(I.create(Code.RETNQ))
    a.place(passed)
    a.locked_inc(mem(Register.RIP, base + PASSED))
    a(I.create_reg_mem(Code.MOV_R64_RM64, RAX, mem(Register.RIP, base + OLD_ACTION)))
    a(I.create_reg_i32(Code.CMP_RM64_IMM8, RAX, 1))
    a.jcc(Code.JE_REL32_64, ignore)
    a.jcc(Code.JB_REL32_64, dfl)
    a(I.create_reg(Code.JMP_RM64, RAX))  # the previous handler, with (sig, info, uc)
    a.place(ignore)
    a(I.create(Code.RETNQ))
    a.place(dfl)
    # Default action: put it back and re-raise; the signal stays blocked until
    # this handler returns, then kills the process as it would have.
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EAX, SYS_RT_SIGACTION))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EDI, SIGTRAP))
    a.lea(RSI, mem(Register.RIP, base + DFL_ACTION))
    a(I.create_reg_reg(Code.XOR_R32_RM32, Register.EDX, Register.EDX))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.R10D, 8))
    a(I.create(Code.SYSCALL))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EAX, SYS_GETPID))
    a(I.create(Code.SYSCALL))
    a(I.create_reg_reg(Code.MOV_R64_RM64, R8, RAX))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EAX, SYS_GETTID))
    a(I.create(Code.SYSCALL))
    a(I.create_reg_reg(Code.MOV_R64_RM64, RSI, RAX))
    a(I.create_reg_reg(Code.MOV_R64_RM64, RDI, R8))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EDX, SIGTRAP))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EAX, SYS_TGKILL))
    a(I.create(Code.SYSCALL))
    a(I.create(Code.RETNQ))
    return a.encode(address)


def sigaction_bytes(handler: int, flags: int, restorer: int, mask: int = 0) -> bytes:
    """A kernel ``struct sigaction`` for ``rt_sigaction`` (x86-64)."""
    return b"".join(v.to_bytes(8, "little") for v in (handler, flags, restorer, mask))


def runtime_actions(base: int) -> tuple[bytes, bytes]:
    """Our SIGTRAP action and the default one used to re-raise."""
    flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART | SA_RESTORER
    ours = sigaction_bytes(base + HANDLER, flags, base + RESTORER)
    default = sigaction_bytes(0, SA_RESTORER, base + RESTORER)
    return ours, default


# -- trampolines ------------------------------------------------------------------

HEADER_SIZE = 24  # the counting prologue, an upper bound
EVENT_HEADER_SIZE = 224  # the event-writing one


def trampoline(address: int, head: bytes, body: Relocated, back: int | None) -> bytes:
    """A tracepoint's trampoline at ``address``: ``head`` (what a hit does:
    :func:`counting_header` or :func:`event_header`, made for ``address``),
    the relocated instructions ``body`` (encoded for ``address + len(head)``),
    and a jump ``back`` (None when the relocated code never falls through)."""
    if body.address != address + len(head):
        raise ValueError("the relocated code was not encoded for its place")
    out = head + body.code
    if back is not None:
        a = Asm()
        a(I.create_branch(Code.JMP_REL32_64, back))
        out += a.encode(address + len(out))
    return out


def counting_header(address: int, counter: int, *, red_zone: bool = True) -> bytes:
    """Count the hit at ``counter`` (an 8-byte slot in the data mirror).

    The red zone (128 bytes under ``rsp`` that a leaf function may use) is
    stepped over before anything is pushed, with ``lea``, which leaves the
    flags alone."""
    a = Asm()
    if red_zone:
        a.lea(RSP, mem(RSP, -128))
    a(I.create(Code.PUSHFQ))
    a.locked_inc(mem(Register.RIP, counter))
    a(I.create(Code.POPFQ))
    if red_zone:
        a.lea(RSP, mem(RSP, 128))
    code = a.encode(address)
    assert len(code) <= HEADER_SIZE
    return code


REGISTERS = {
    name: getattr(Register, name.upper())
    for name in ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp",
                 "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15")
}  # fmt: skip
ARGUMENTS = ("rdi", "rsi", "rdx", "rcx", "r8", "r9")  # System V AMD64 integer arguments
_SAVED = ("r9", "r8", "rbx", "rdx", "rcx", "rax")  # pushed by the event header, last first
_FRAME = 8 * (len(_SAVED) + 1)  # and the flags


@dataclass(frozen=True)
class EventSpec:
    """What an event tracepoint records and where: ``rings`` is the shared
    buffers' address in the target, ``tid_offset`` where glibc keeps the
    thread id from the thread pointer (``fs:``), or -1."""

    probe: int
    rings: int
    slots_offset: int
    buffer_shift: int
    buffers: int
    slots: int
    tid_offset: int
    regs: tuple[str, ...] = ARGUMENTS[:4]
    kind: int = 0
    rdpid: bool = False  # the CPU has RDPID (CPUID.7.0:ECX[22])


def cpu_has_rdpid() -> bool:
    """Whether this machine's CPUs have RDPID (``/proc/cpuinfo`` flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return " rdpid" in line
    except OSError:
        pass
    return False


def event_header(address: int, counter: int, spec: EventSpec, site: int) -> bytes:
    """Count the hit, then write an event (:mod:`.rings`) — TSC, CPU, thread,
    tracepoint, the chosen registers as they were at the site — into the
    buffer of this CPU, restoring every register and the flags after."""
    a = Asm()
    a.lea(RSP, mem(RSP, -128))
    _push_state(a, _SAVED)
    a.locked_inc(mem(Register.RIP, counter))
    rbx = Register.RBX
    if spec.rdpid:
        # rdtsc + rdpid: half the cost of rdtscp here, same TSC and TSC_AUX.
        a(I.create(Code.RDTSC))
        a(I.create_reg(Code.RDPID_R64, RCX))
    else:
        a(I.create(Code.RDTSCP))  # edx:eax = TSC, ecx = TSC_AUX (cpu | node << 12 on Linux)
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, RDX, 32))
    a(I.create_reg_reg(Code.OR_R64_RM64, RAX, RDX))
    a(I.create_reg_i32(Code.AND_RM32_IMM32, Register.ECX, 0xFFF & (spec.buffers - 1)))
    r9 = Register.R9
    a(I.create_reg_u64(Code.MOV_R64_IMM64, r9, spec.rings))
    a(I.create_reg_reg(Code.MOV_R32_RM32, Register.EBX, Register.ECX))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, rbx, HEADER_BYTES.bit_length() - 1))
    a(I.create_reg_reg(Code.ADD_R64_RM64, rbx, r9))  # rbx = this CPU's buffer header
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.EDX, 1))
    xadd = I.create_mem_reg(Code.XADD_RM64_R64, mem(rbx), RDX)
    xadd.has_lock_prefix = True
    a(xadd)  # rdx = this event's index
    a(I.create_reg_reg(Code.MOV_R64_RM64, R8, RDX))
    a(I.create_reg_i32(Code.AND_RM64_IMM32, R8, spec.slots - 1))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, R8, SB.bit_length() - 1))
    a(I.create_reg_reg(Code.MOV_R64_RM64, rbx, RCX))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, rbx, spec.buffer_shift))
    a(I.create_reg_reg(Code.ADD_R64_RM64, rbx, R8))
    a.lea(rbx, MemoryOperand(rbx, r9, 1, spec.slots_offset, 8))  # rbx = the slot
    a(I.create_mem_i32(Code.MOV_RM64_IMM32, mem(rbx, F_SEQ), 0))  # invalid while written
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(rbx, F_TSC), RAX))
    a(I.create_mem_reg(Code.MOV_RM32_R32, mem(rbx, F_CPU), Register.ECX))
    if spec.tid_offset >= 0:
        tid = MemoryOperand(Register.NONE, displ=spec.tid_offset, displ_size=8)
        load = I.create_reg_mem(Code.MOV_R32_RM32, Register.EAX, tid)
        load.segment_prefix = Register.FS
        a(load)
    else:
        a(I.create_reg_reg(Code.XOR_R32_RM32, Register.EAX, Register.EAX))
    a(I.create_mem_reg(Code.MOV_RM32_R32, mem(rbx, F_TID), Register.EAX))
    a(I.create_mem_u32(Code.MOV_RM32_IMM32, mem(rbx, F_PROBE), spec.probe))
    a(I.create_mem_u32(Code.MOV_RM32_IMM32, mem(rbx, F_KIND), spec.kind))
    for i, name in enumerate(spec.regs):
        if name in _SAVED:
            a(I.create_reg_mem(Code.MOV_R64_RM64, RAX, mem(RSP, 8 * _SAVED.index(name))))
        elif name == "rsp":
            a.lea(RAX, mem(RSP, _FRAME + 128))
        elif name == "rip":
            a(I.create_reg_u64(Code.MOV_R64_IMM64, RAX, site))
        else:
            a(I.create_reg_reg(Code.MOV_R64_RM64, RAX, REGISTERS[name]))
        a(I.create_mem_reg(Code.MOV_RM64_R64, mem(rbx, F_REGS + 8 * i), RAX))
    a(I.create_reg(Code.INC_RM64, RDX))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(rbx, F_SEQ), RDX))  # commit
    _pop_state(a, _SAVED)
    a.lea(RSP, mem(RSP, 128))
    return a.encode(address)


# -- entry/exit tracepoints ----------------------------------------------------------
#
# An entry tracepoint at a function's first instruction also swaps the return
# address for the tracepoint's exit stub, and keeps the real one on a
# per-thread stack of (return address, rsp at entry) in a table of thread
# slots keyed by the thread pointer (``fs:0``, the TCB's pointer to itself
# in the x86-64 TLS ABI).  Entries whose rsp is at or below the current one
# belong to frames that are gone (longjmp, a dead thread's reused stack) and
# are dropped at the next entry; the exit stub pops down to the entry whose
# rsp matches, as uretprobes do.

THREAD_SLOTS = 1024
RETURN_DEPTH = 62
THREAD_SLOT_BYTES = 16 + 16 * RETURN_DEPTH + 16  # key, depth, entries, pad to 1 KiB
THREAD_TABLE_SIZE = THREAD_SLOTS * THREAD_SLOT_BYTES
_PROBES = 16  # slots tried from the hash
_HOOK_SAVED = ("r9", "r8", "rdx", "rcx", "rax")  # pushed after the flags, last first
EXIT_COUNTER = 8  # the exits' counter, after the entries' one


def _push_state(a: Asm, regs: Sequence[str]) -> int:
    """Save the flags and ``regs`` (pushed last first); returns the bytes pushed."""
    a(I.create(Code.PUSHFQ))
    for r in reversed(regs):
        a(I.create_reg(Code.PUSH_R64, REGISTERS[r]))
    return 8 * (len(regs) + 1)


def _pop_state(a: Asm, regs: Sequence[str]) -> None:
    for r in regs:
        a(I.create_reg(Code.POP_R64, REGISTERS[r]))
    a(I.create(Code.POPFQ))


def _find_thread_slot(a: Asm, table: int, found: int, missing: int, claim: bool) -> None:
    """rdx = this thread's slot in the table at ``table`` (claimed if
    ``claim`` and free), then jump to ``found``; else to ``missing``.
    Uses rax, rcx, rdx, r8, r9."""
    fs0 = I.create_reg_mem(Code.MOV_R64_RM64, RAX, MemoryOperand(Register.NONE, displ=0,
                                                                   displ_size=8))  # fmt: skip
    fs0.segment_prefix = Register.FS
    a(fs0)  # rax = the thread pointer
    a(I.create_reg_reg(Code.MOV_R64_RM64, RCX, RAX))
    a(I.create_reg_i32(Code.SHR_RM64_IMM8, RCX, 12))  # TCBs are page aligned or near
    a(I.create_reg_u64(Code.MOV_R64_IMM64, R8, table))
    a(I.create_reg_i32(Code.MOV_R32_IMM32, Register.R9D, _PROBES))
    loop, nxt = a.new_label(), a.new_label()
    a.place(loop)
    a(I.create_reg_i32(Code.AND_RM32_IMM32, Register.ECX, THREAD_SLOTS - 1))
    a(I.create_reg_reg(Code.MOV_R32_RM32, Register.EDX, Register.ECX))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, RDX, THREAD_SLOT_BYTES.bit_length() - 1))
    a(I.create_reg_reg(Code.ADD_R64_RM64, RDX, R8))
    a(I.create_mem_reg(Code.CMP_RM64_R64, mem(RDX), RAX))
    a.jcc(Code.JE_REL32_64, found)
    if claim:
        a(I.create_mem_i32(Code.CMP_RM64_IMM8, mem(RDX), 0))
        a.jcc(Code.JNE_REL32_64, nxt)
        # Free: claim it with lock cmpxchg (expects rax = 0, writes the key).
        a(I.create_reg_reg(Code.XCHG_R64_RAX, R8, RAX))  # r8 = key, rax = table
        a(I.create_reg(Code.PUSH_R64, RAX))
        a(I.create_reg_reg(Code.XOR_R32_RM32, Register.EAX, Register.EAX))
        cx = I.create_mem_reg(Code.CMPXCHG_RM64_R64, mem(RDX), R8)
        cx.has_lock_prefix = True
        a(cx)
        a(I.create_reg(Code.POP_R64, RAX))
        a(I.create_reg_reg(Code.XCHG_R64_RAX, R8, RAX))  # rax = key, r8 = table
        a(I.create_mem_reg(Code.CMP_RM64_R64, mem(RDX), RAX))  # ours now, or a racing thread's
        a.jcc(Code.JE_REL32_64, found)
    a.place(nxt)
    a(I.create_reg(Code.INC_RM32, Register.ECX))
    a(I.create_reg(Code.DEC_RM32, Register.R9D))
    a.jcc(Code.JNE_REL32_64, loop)
    a(I.create_branch(Code.JMP_REL32_64, missing))


def return_hook(address: int, table: int, exit_stub: int) -> bytes:
    """At a function's entry: push (return address, rsp) on this thread's
    stack and make the function return to ``exit_stub``.  No slot or a full
    stack: the call goes untraced at its exit, nothing else changes."""
    a = Asm()
    found, done, push, prune = (a.new_label() for _ in range(4))
    frame = _push_state(a, _HOOK_SAVED)
    _find_thread_slot(a, table, found, done, claim=True)
    a.place(found)
    a.lea(R8, mem(RSP, frame))  # r8 = rsp at entry: it points at the return address
    a(I.create_reg_mem(Code.MOV_R64_RM64, RCX, mem(RDX, 8)))  # depth
    a.place(prune)
    a(I.create_reg_reg(Code.TEST_RM64_R64, RCX, RCX))
    a.jcc(Code.JE_REL32_64, push)
    a(I.create_reg_reg(Code.MOV_R64_RM64, RAX, RCX))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, RAX, 4))
    a(I.create_mem_reg(Code.CMP_RM64_R64, MemoryOperand(RDX, RAX, 1, 8, 1), R8))
    a.jcc(Code.JA_REL32_64, push)  # the top entry's frame is still live
    a(I.create_reg(Code.DEC_RM64, RCX))
    a(I.create_branch(Code.JMP_REL32_64, prune))
    a.place(push)
    a(I.create_reg_i32(Code.CMP_RM64_IMM8, RCX, RETURN_DEPTH))
    a.jcc(Code.JAE_REL32_64, done)
    a(I.create_reg_reg(Code.MOV_R64_RM64, RAX, RCX))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, RAX, 4))
    a.lea(RAX, MemoryOperand(RDX, RAX, 1, 16, 1))  # the new entry
    a(I.create_reg_mem(Code.MOV_R64_RM64, Register.R9, mem(R8)))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(RAX), Register.R9))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(RAX, 8), R8))
    a(I.create_reg(Code.INC_RM64, RCX))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(RDX, 8), RCX))
    a(I.create_reg_u64(Code.MOV_R64_IMM64, Register.R9, exit_stub))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(R8), Register.R9))
    a.place(done)
    _pop_state(a, _HOOK_SAVED)
    return a.encode(address)


def exit_stub(address: int, table: int, head: bytes) -> bytes:
    """Where a hooked function returns: a slot for the real return address,
    ``head`` (count the exit, record it; made for ``address + 1``), then pop
    this thread's stack down to the entry of this frame and return there."""
    a = Asm()
    a(I.create_reg(Code.PUSH_R64, RAX))  # the slot the final ret pops
    code = a.encode(address)
    assert len(code) == 1
    code += head
    a = Asm()
    found, pop, lost = a.new_label(), a.new_label(), a.new_label()
    frame = _push_state(a, _HOOK_SAVED)
    _find_thread_slot(a, table, found, lost, claim=False)
    a.place(found)
    a.lea(R8, mem(RSP, frame))  # r8 = the slot = rsp at entry
    a(I.create_reg_mem(Code.MOV_R64_RM64, RCX, mem(RDX, 8)))
    a.place(pop)
    a(I.create_reg_reg(Code.TEST_RM64_R64, RCX, RCX))
    a.jcc(Code.JE_REL32_64, lost)
    a(I.create_reg(Code.DEC_RM64, RCX))
    a(I.create_reg_reg(Code.MOV_R64_RM64, RAX, RCX))
    a(I.create_reg_i32(Code.SHL_RM64_IMM8, RAX, 4))
    a(I.create_reg_mem(Code.CMP_R64_RM64, R8, MemoryOperand(RDX, RAX, 1, 24, 1)))
    a.jcc(Code.JNE_REL32_64, pop)  # a deeper frame left by longjmp: drop it
    a(I.create_reg_mem(Code.MOV_R64_RM64, Register.R9, MemoryOperand(RDX, RAX, 1, 16, 1)))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(R8), Register.R9))
    a(I.create_mem_reg(Code.MOV_RM64_R64, mem(RDX, 8), RCX))
    _pop_state(a, _HOOK_SAVED)
    a(I.create(Code.RETNQ))
    a.place(lost)
    a(I.create(Code.UD2))  # no record of this frame: cannot happen; fail loudly
    return code + a.encode(address + len(code))


def jump_bytes(site: int, target: int) -> bytes:
    """``jmp rel32`` at ``site`` to ``target``."""
    rel = target - (site + 5)
    return b"\xe9" + (rel & 0xFFFFFFFF).to_bytes(4, "little")
