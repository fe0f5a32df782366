"""Machine code of the in-process capture agent (:mod:`.jitagent`).

Built with iced-x86, like the probes' runtime; nothing needs a compiler
at run time.  The agent's region in the target, mapped once::

    base + 0x0000  code page (R-X): the handlers below
    base + 0x1000  data page (RW-): lock, switches, counters, actions
    base + 0x2000  page table (RW-): TABLE_SLOTS entries (page key, want)

and a ring shared with hwtrace (a memfd, ``MAP_SHARED``)::

    +0x000 head (u64, next slot written)   +0x040 tail (u64, hwtrace's)
    +0x080 lost (u64)
    +META  NSLOTS records of 64 bytes: seq, page, tsc, tid, pid, cpu, ip
    +DATA  NSLOTS page copies

Handlers (all signals blocked while they run, so a thread never re-enters
them; threads exclude each other with a spin lock whose word is the
owner's tid, which the kernel side reads to ignore the agent's own
system calls):

* ``SIGSEGV``: an access fault on a tracked page.  An instruction fetch
  (page-fault error code bit 4) makes the page readable and executable
  but not writable and copies it into the ring with the TSC, CPU
  (``rdtscp``), thread, process and IP; a write to a page the program
  asked to be writable makes it writable and not executable again.  Any
  other fault goes to the program's own handler (or the default action).
* ``SIG_TRACK_MMAP``/``SIG_TRACK_MPROTECT`` (sent by the kernel side right
  after an ``mmap``/``mprotect`` asking for ``PROT_EXEC`` returned): the
  pages join the table with the protection asked for and lose
  ``PROT_EXEC`` (armed).
* ``SIG_UNTRACK`` (after ``munmap``, ``mprotect`` without ``PROT_EXEC``, a
  fixed ``mmap``): the pages leave the table.
* ``SIG_SIGACTION`` (after ``rt_sigaction(SIGSEGV, ...)``): the program's
  new action is kept to chain to, its old one (not the agent's) is what
  it reads back, and the agent's handler is put back.

After ``mmap``/``mprotect`` returns, the signal is delivered before the
program's next instruction, so no instruction of the program runs between
the call and the arming.
"""

from __future__ import annotations

from functools import partial

from iced_x86 import Code, Instruction, MemoryOperand, Register, RepPrefixKind

from ..probes.codegen import SIGACTION_BYTES, Asm, mem

__all__ = ["Layout", "agent_code"]

PAGE = 0x1000
PROT_READ, PROT_WRITE, PROT_EXEC = 1, 2, 4
SEGV_ACCERR = 2
PF_INSTR = 0x10
SIGSEGV = 11
SYS_MPROTECT, SYS_RT_SIGACTION, SYS_GETPID, SYS_GETTID = 10, 13, 39, 186

# ucontext_t (glibc, x86-64): gregs from offset 40.
UC_R10, UC_RDI, UC_RSI, UC_RDX, UC_RAX, UC_RIP, UC_ERR = (
    40 + 8 * i for i in (2, 8, 9, 12, 13, 16, 19)
)

# Code page offsets.
RESTORER = 0x000
SEGV = 0x040
TRACK_MMAP = 0x300
TRACK_MPROTECT = 0x320
TRACK = 0x340
UNTRACK = 0x480
SIGACTION = 0x580
LOCK = 0x700
PROBE = 0x740
SNAPSHOT = 0x800
CODE_END = 0x1000

# Data page offsets (from base): words, then the SIGSEGV actions: the
# program's, the agent's, the default one, and one to read an action into.
D = PAGE
LOCK_WORD, ENABLED, MIN_PAGE, MAX_PAGE, RING_ADDR = (D + 8 * k for k in range(5))
PROG_ACTION, OUR_ACTION, DFL_ACTION, TMP_ACTION = (D + 0x80 + SIGACTION_BYTES * k for k in range(4))
NAP = D + 0x100  # struct timespec {0, NAP_NS}
SCRATCH = D + 0x200
COUNTERS = ("exec_faults", "write_faults", "chained", "tracked_calls", "table_full", "sigactions")

TABLE = 2 * PAGE
TABLE_BITS = 16
TABLE_SLOTS = 1 << TABLE_BITS
MAX_PROBES = 64
HASH_MULT = 0x9E3779B97F4A7C15
REGION_SIZE = TABLE + 16 * TABLE_SLOTS

# The ring (its header also counts what the handlers did, so the counts
# outlive the process).
HEAD, TAIL, LOST, STALLED = 0x00, 0x40, 0x80, 0x88
# A full ring: the writer sleeps up to WAIT_NAPS times NAP_NS for hwtrace
# to drain it (about 2 s), then marks it stalled (hwtrace gone or stuck)
# and drops snapshots without waiting until hwtrace clears the mark.
WAIT_NAPS = 40_000
NAP_NS = 50_000
SYS_NANOSLEEP = 35
COUNTS = 0x100
EXEC_FAULTS, WRITE_FAULTS, CHAINED, TRACKED, FULL, SIGACTIONS = (COUNTS + 8 * k for k in range(6))
NSLOTS = 1024
META = PAGE
DATA = META + 64 * NSLOTS
RING_SIZE = DATA + PAGE * NSLOTS


class Layout:
    """Where things are for a region mapped at ``base``."""

    def __init__(self, base: int) -> None:
        self.base = base

    def __getattr__(self, name: str) -> int:
        return self.base + globals()[name.upper()]


I = Instruction  # noqa: E741
RAX, RBX, RCX, RDX, RSI, RDI = Register.RAX, Register.RBX, Register.RCX, Register.RDX, Register.RSI, Register.RDI  # fmt: skip
R8, R9, R10, R12, R13, R14, R15 = Register.R8, Register.R9, Register.R10, Register.R12, Register.R13, Register.R14, Register.R15  # fmt: skip
EAX, ECX, EDX, ESI, EDI, R9D, R10D = Register.EAX, Register.ECX, Register.EDX, Register.ESI, Register.EDI, Register.R9D, Register.R10D  # fmt: skip
SAVED = (RBX, R12, R13, R14, R15)


class _Asm(Asm):
    """The probes' assembler with a few shorthands, for a region at ``base``."""

    def __init__(self, base: int) -> None:
        super().__init__()
        self.b = Layout(base)
        self.label = self.new_label

    # -- shorthands ---------------------------------------------------------------
    def data(self, offset: int) -> MemoryOperand:
        return mem(Register.RIP, self.b.base + offset)

    def load(self, reg: int, m: MemoryOperand) -> None:
        self(I.create_reg_mem(Code.MOV_R64_RM64, reg, m))

    def store(self, m: MemoryOperand, reg: int) -> None:
        self(I.create_mem_reg(Code.MOV_RM64_R64, m, reg))

    def mov(self, dst: int, src: int) -> None:
        self(I.create_reg_reg(Code.MOV_R64_RM64, dst, src))

    def imm(self, reg32: int, value: int) -> None:
        self(I.create_reg_i32(Code.MOV_R32_IMM32, reg32, value))

    def op(self, code: int, reg: int, value: int) -> None:
        self(I.create_reg_i32(code, reg, value))

    def rr(self, code: int, a: int, b: int) -> None:
        self(I.create_reg_reg(code, a, b))

    def jmp(self, target: int) -> None:
        self(I.create_branch(Code.JMP_REL32_64, target))

    def call(self, target: int) -> None:
        self(I.create_branch(Code.CALL_REL32_64, target))

    def count(self, offset: int) -> None:
        """One more of a ring header counter (uses rax)."""
        self.load(RAX, self.data(RING_ADDR))
        self.locked_inc(mem(RAX, offset))

    def syscall(self, nr: int) -> None:
        self.imm(EAX, nr)
        self(I.create(Code.SYSCALL))

    def unlock(self) -> None:
        self(I.create_mem_i32(Code.MOV_RM32_IMM32, self.data(LOCK_WORD), 0))

    def push_saved(self) -> None:
        for r in SAVED:
            self(I.create_reg(Code.PUSH_R64, r))

    def pop_saved(self) -> None:
        for r in reversed(SAVED):
            self(I.create_reg(Code.POP_R64, r))

    def ret(self) -> None:
        self(I.create(Code.RETNQ))

    def leave(self) -> None:
        """A handler's end: the lock released, the saved registers back."""
        self.unlock()
        self.pop_saved()
        self.ret()

    def probe(self, page: int, claim: bool = False) -> None:
        """rax = the table entry of the page at register ``page`` (``claim``:
        an empty one if it has none), or 0, and the flags tested on it
        (:func:`_probe`; uses rdi and rsi too)."""
        self.mov(RDI, page)
        if claim:
            self.imm(ESI, 1)
        else:
            self.rr(Code.XOR_R32_RM32, ESI, ESI)
        self.call(self.b.base + PROBE)
        self.rr(Code.TEST_RM64_R64, RAX, RAX)

    def copy32(self, dst: MemoryOperand | int, src: MemoryOperand | int) -> None:
        """32 bytes from src to dst (registers or data operands): rep movsb."""
        for reg, where in ((RDI, dst), (RSI, src)):
            if isinstance(where, MemoryOperand):
                self.lea(reg, where)
            elif where != reg:
                self.mov(reg, where)
        self.imm(ECX, 32)
        self(I.create_movsb(64, rep_prefix=RepPrefixKind.REPE))


def _lock(a: _Asm, base: int) -> None:
    """Take the spin lock with this thread's tid (rax, rcx, r9, r11)."""
    spin, done = a.label(), a.label()
    a.syscall(SYS_GETTID)
    a(I.create_reg_reg(Code.MOV_R32_RM32, R9D, EAX))
    a.place(spin)
    a.rr(Code.XOR_R32_RM32, EAX, EAX)
    x = I.create_mem_reg(Code.CMPXCHG_RM32_R32, a.data(LOCK_WORD), R9D)
    x.has_lock_prefix = True
    a(x)
    a.jcc(Code.JE_REL32_64, done)
    a(I.create(Code.PAUSE))
    a.jmp(spin)
    a.place(done)
    a.ret()


def _probe(a: _Asm, base: int) -> None:
    """rax = the table entry of the page at rdi (esi != 0: claim an empty
    one), or 0; uses rax, rcx, rdx, r8, r10."""
    loop, found, empty, none = a.label(), a.label(), a.label(), a.label()
    a.mov(RAX, RDI)
    a.op(Code.SHR_RM64_IMM8, RAX, 12)
    a.mov(R8, RAX)
    a(I.create_reg_u64(Code.MOV_R64_IMM64, RCX, HASH_MULT))
    a.rr(Code.IMUL_R64_RM64, RAX, RCX)
    a.op(Code.SHR_RM64_IMM8, RAX, 64 - TABLE_BITS)
    a.imm(R10D, MAX_PROBES)
    a.place(loop)
    a.mov(RCX, RAX)
    a.op(Code.SHL_RM64_IMM8, RCX, 4)
    a.lea(RDX, a.data(TABLE))
    a.rr(Code.ADD_R64_RM64, RCX, RDX)
    a.load(RDX, mem(RCX))
    a.rr(Code.CMP_R64_RM64, RDX, R8)
    a.jcc(Code.JE_REL32_64, found)
    a.rr(Code.TEST_RM64_R64, RDX, RDX)
    a.jcc(Code.JE_REL32_64, empty)
    a(I.create_reg(Code.INC_RM64, RAX))
    a.op(Code.AND_RM64_IMM32, RAX, TABLE_SLOTS - 1)
    a(I.create_reg(Code.DEC_RM32, R10D))
    a.jcc(Code.JNE_REL32_64, loop)
    a.jmp(none)
    a.place(found)
    a.mov(RAX, RCX)
    a.ret()
    a.place(empty)
    a.rr(Code.TEST_RM32_R32, ESI, ESI)
    a.jcc(Code.JE_REL32_64, none)
    a(I.create_mem_i32(Code.MOV_RM64_IMM32, mem(RCX, 8), 0))
    a.store(mem(RCX), R8)
    a.mov(RAX, RCX)
    a.ret()
    a.place(none)
    a.rr(Code.XOR_R32_RM32, EAX, EAX)
    a.ret()


def _snapshot(a: _Asm, base: int) -> None:
    """Copy the page at rbx into the ring, with the IP from the ucontext at
    r13 (the lock is held: one writer at a time)."""
    lost, check, room, stall = a.label(), a.label(), a.label(), a.label()
    a.load(R8, a.data(RING_ADDR))
    a.imm(R9D, WAIT_NAPS)
    a.place(check)
    a.load(RAX, mem(R8, HEAD))
    a.mov(RCX, RAX)
    a(I.create_reg_mem(Code.SUB_R64_RM64, RCX, mem(R8, TAIL)))
    a.op(Code.CMP_RM64_IMM32, RCX, NSLOTS)
    a.jcc(Code.JB_REL32_64, room)
    a(I.create_mem_i32(Code.CMP_RM64_IMM8, mem(R8, STALLED), 0))
    a.jcc(Code.JNE_REL32_64, lost)
    a(I.create_reg(Code.DEC_RM32, R9D))
    a.jcc(Code.JE_REL32_64, stall)
    a.lea(RDI, a.data(NAP))
    a.rr(Code.XOR_R32_RM32, ESI, ESI)
    a.syscall(SYS_NANOSLEEP)  # hwtrace drains meanwhile
    a.jmp(check)
    a.place(stall)
    a(I.create_mem_i32(Code.MOV_RM64_IMM32, mem(R8, STALLED), 1))
    a.jmp(lost)
    a.place(room)
    a.mov(R9, RAX)
    a.op(Code.AND_RM64_IMM32, R9, NSLOTS - 1)
    a.mov(RDI, R9)
    a.op(Code.SHL_RM64_IMM8, RDI, 12)
    a.rr(Code.ADD_R64_RM64, RDI, R8)
    a.op(Code.ADD_RM64_IMM32, RDI, DATA)
    a.mov(RSI, RBX)
    a.imm(ECX, PAGE)
    a(I.create_movsb(64, rep_prefix=RepPrefixKind.REPE))
    a.mov(R10, R9)
    a.op(Code.SHL_RM64_IMM8, R10, 6)
    a.rr(Code.ADD_R64_RM64, R10, R8)
    a.op(Code.ADD_RM64_IMM32, R10, META)
    a.store(mem(R10, 8), RBX)
    a(I.create(Code.RDTSCP))  # edx:eax = TSC, ecx = TSC_AUX (cpu | node << 12)
    a.op(Code.SHL_RM64_IMM8, RDX, 32)
    a.rr(Code.OR_R64_RM64, RAX, RDX)
    a.store(mem(R10, 16), RAX)
    a.op(Code.AND_RM32_IMM32, ECX, 0xFFF)
    a(I.create_mem_reg(Code.MOV_RM32_R32, mem(R10, 32), ECX))
    a(I.create_reg_mem(Code.MOV_R32_RM32, EAX, a.data(LOCK_WORD)))  # the lock holds our tid
    a(I.create_mem_reg(Code.MOV_RM32_R32, mem(R10, 24), EAX))
    a.syscall(SYS_GETPID)
    a(I.create_mem_reg(Code.MOV_RM32_R32, mem(R10, 28), EAX))
    a.load(RAX, mem(R13, UC_RIP))
    a.store(mem(R10, 40), RAX)
    a.load(RAX, mem(R8, HEAD))
    a(I.create_reg(Code.INC_RM64, RAX))
    a.store(mem(R10), RAX)  # commit: the sequence number last
    a.store(mem(R8, HEAD), RAX)
    a.ret()
    a.place(lost)
    a.locked_inc(mem(R8, LOST))
    a.ret()


def _mprotect(a: _Asm, address: int, prot: int) -> None:
    """mprotect(address, one page, prot) from registers; rax = result."""
    a.mov(RDI, address)
    a.imm(ESI, PAGE)
    if prot != RDX:
        a.mov(RDX, prot)
    a.syscall(SYS_MPROTECT)


def _sigsegv_action(a: _Asm, new: int | None = None, old: int | None = None) -> None:
    """rt_sigaction(SIGSEGV, new, old): each the data page offset of a
    kernel struct sigaction, or None for NULL."""
    a.imm(EDI, SIGSEGV)
    for reg, reg32, offset in ((RSI, ESI, new), (RDX, EDX, old)):
        if offset is None:
            a.rr(Code.XOR_R32_RM32, reg32, reg32)
        else:
            a.lea(reg, a.data(offset))
    a.imm(R10D, 8)
    a.syscall(SYS_RT_SIGACTION)


def _armed(a: _Asm, want: int) -> None:
    """rdx = the protection of an armed page the program asked ``want``
    (a register) for: not executable, and readable (x86: exec implies read)."""
    a.mov(RDX, want)
    a.op(Code.AND_RM64_IMM32, RDX, ~PROT_EXEC)
    a.op(Code.OR_RM64_IMM32, RDX, PROT_READ)


def _segv(a: _Asm, base: int) -> None:
    write, disabled, unlock_ret, unlock_chain, chain, dfl = (a.label() for _ in range(6))
    a.push_saved()
    a.mov(R14, RDI)
    a.mov(R12, RSI)
    a.mov(R13, RDX)
    a(I.create_mem_i32(Code.CMP_RM32_IMM8, mem(RSI, 8), SEGV_ACCERR))
    a.jcc(Code.JNE_REL32_64, chain)
    a.load(RBX, mem(RSI, 16))
    a.op(Code.AND_RM64_IMM32, RBX, -PAGE)
    a.call(base + LOCK)
    a.probe(RBX)
    a.jcc(Code.JE_REL32_64, unlock_chain)
    a.load(R15, mem(RAX, 8))
    a.rr(Code.TEST_RM64_R64, R15, R15)
    a.jcc(Code.JE_REL32_64, unlock_chain)
    a(I.create_mem_i32(Code.CMP_RM64_IMM8, a.data(ENABLED), 0))
    a.jcc(Code.JE_REL32_64, disabled)
    a(I.create_mem_i32(Code.TEST_RM8_IMM8, mem(R13, UC_ERR), PF_INSTR))
    a.jcc(Code.JE_REL32_64, write)
    # First execution since the page was armed: executable, not writable; copy it.
    a.mov(RDX, R15)
    a.op(Code.AND_RM64_IMM32, RDX, ~PROT_WRITE)
    a.op(Code.OR_RM64_IMM32, RDX, PROT_READ | PROT_EXEC)
    _mprotect(a, RBX, RDX)
    a.rr(Code.TEST_RM64_R64, RAX, RAX)
    a.jcc(Code.JNE_REL32_64, unlock_chain)
    a.count(EXEC_FAULTS)
    a.call(base + SNAPSHOT)
    a.jmp(unlock_ret)
    # A write to a page the program may write: writable, not executable (armed).
    a.place(write)
    a(I.create_reg_i32(Code.TEST_RM64_IMM32, R15, PROT_WRITE))
    a.jcc(Code.JE_REL32_64, unlock_chain)
    _armed(a, R15)
    _mprotect(a, RBX, RDX)
    a.rr(Code.TEST_RM64_R64, RAX, RAX)
    a.jcc(Code.JNE_REL32_64, unlock_chain)
    a.count(WRITE_FAULTS)
    a.jmp(unlock_ret)
    # Capture over: the page gets what the program asked for and is forgotten.
    a.place(disabled)
    _mprotect(a, RBX, R15)
    a.probe(RBX)
    a.jcc(Code.JE_REL32_64, unlock_ret)
    a(I.create_mem_i32(Code.MOV_RM64_IMM32, mem(RAX, 8), 0))
    a.place(unlock_ret)
    a.leave()
    a.place(unlock_chain)
    a.unlock()
    a.place(chain)
    a.count(CHAINED)
    a.mov(RDI, R14)
    a.mov(RSI, R12)
    a.mov(RDX, R13)
    a.pop_saved()
    a.load(RAX, a.data(PROG_ACTION))
    a.op(Code.CMP_RM64_IMM8, RAX, 1)
    a.jcc(Code.JBE_REL32_64, dfl)
    a(I.create_reg(Code.JMP_RM64, RAX))  # the program's handler, with (sig, info, uc)
    # Default (or ignored): put the default action back; the fault comes
    # again when this handler returns and ends the process as it would
    # have.  Under the lock, so the kernel side does not re-arm it.
    a.place(dfl)
    a.call(base + LOCK)
    _sigsegv_action(a, new=DFL_ACTION)
    a.unlock()
    a.ret()


def _track_entry(a: _Asm, base: int, uc_reg: int) -> None:
    a.push_saved()
    a.mov(R13, RDX)
    a.load(RBX, mem(RDX, uc_reg))
    a.jmp(base + TRACK)


def _track(a: _Asm, base: int) -> None:
    """rbx = address, r13 = ucontext (length in rsi, protection in rdx)."""
    loop, done, out, lo_ok, hi_ok = (a.label() for _ in range(5))
    a.op(Code.AND_RM64_IMM32, RBX, -PAGE)
    a.load(R12, mem(R13, UC_RSI))
    a.op(Code.ADD_RM64_IMM32, R12, PAGE - 1)
    a.op(Code.AND_RM64_IMM32, R12, -PAGE)
    a.rr(Code.ADD_R64_RM64, R12, RBX)  # end
    a.load(R14, mem(R13, UC_RDX))
    a.op(Code.AND_RM64_IMM32, R14, 7)  # the protection asked for
    a.mov(R13, RBX)  # start
    a.call(base + LOCK)
    a(I.create_mem_i32(Code.CMP_RM64_IMM8, a.data(ENABLED), 0))
    a.jcc(Code.JE_REL32_64, out)
    a.place(loop)
    a.rr(Code.CMP_R64_RM64, RBX, R12)
    a.jcc(Code.JAE_REL32_64, done)
    a.probe(RBX, claim=True)
    a.jcc(Code.JNE_REL32_64, lo_ok := a.label())
    a.count(FULL)  # table full: the rest stays as the program asked
    a.jmp(done)
    a.place(lo_ok)
    a.store(mem(RAX, 8), R14)
    a(I.create_reg_mem(Code.CMP_R64_RM64, RBX, a.data(MIN_PAGE)))
    a.jcc(Code.JAE_REL32_64, hi_ok)
    a.store(a.data(MIN_PAGE), RBX)
    a.place(hi_ok)
    skip = a.label()
    a(I.create_reg_mem(Code.CMP_R64_RM64, RBX, a.data(MAX_PAGE)))
    a.jcc(Code.JBE_REL32_64, skip)
    a.store(a.data(MAX_PAGE), RBX)
    a.place(skip)
    a.op(Code.ADD_RM64_IMM32, RBX, PAGE)
    a.jmp(loop)
    a.place(done)
    a.mov(RDI, R13)
    a.mov(RSI, RBX)
    a.rr(Code.SUB_R64_RM64, RSI, R13)
    a.jcc(Code.JE_REL32_64, out)
    _armed(a, R14)
    a.syscall(SYS_MPROTECT)
    a.count(TRACKED)
    a.place(out)
    a.leave()


def _untrack(a: _Asm, base: int) -> None:
    loop, nxt, out = a.label(), a.label(), a.label()
    a.push_saved()
    a.load(RBX, mem(RDX, UC_RDI))
    a.op(Code.AND_RM64_IMM32, RBX, -PAGE)
    a.load(R12, mem(RDX, UC_RSI))
    a.rr(Code.ADD_R64_RM64, R12, RBX)
    a.op(Code.ADD_RM64_IMM32, R12, PAGE - 1)
    a.op(Code.AND_RM64_IMM32, R12, -PAGE)
    a.call(base + LOCK)
    a.load(RAX, a.data(MIN_PAGE))
    a.rr(Code.CMP_R64_RM64, RBX, RAX)
    a.rr(Code.CMOVB_R64_RM64, RBX, RAX)
    a.load(RAX, a.data(MAX_PAGE))
    a.op(Code.ADD_RM64_IMM32, RAX, PAGE)
    a.rr(Code.CMP_R64_RM64, R12, RAX)
    a.rr(Code.CMOVA_R64_RM64, R12, RAX)
    a.place(loop)
    a.rr(Code.CMP_R64_RM64, RBX, R12)
    a.jcc(Code.JAE_REL32_64, out)
    a.probe(RBX)
    a.jcc(Code.JE_REL32_64, nxt)
    a(I.create_mem_i32(Code.MOV_RM64_IMM32, mem(RAX, 8), 0))
    a.place(nxt)
    a.op(Code.ADD_RM64_IMM32, RBX, PAGE)
    a.jmp(loop)
    a.place(out)
    a.leave()


def _sigaction(a: _Asm, base: int) -> None:
    no_old, no_new = a.label(), a.label()
    a.push_saved()
    a.mov(R13, RDX)
    a.call(base + LOCK)
    # The action the program just set (the kernel holds it now).
    _sigsegv_action(a, old=TMP_ACTION)
    # What it reads back is its own previous action, not the agent's.
    a.load(RDI, mem(R13, UC_RDX))
    a.rr(Code.TEST_RM64_R64, RDI, RDI)
    a.jcc(Code.JE_REL32_64, no_old)
    a.copy32(RDI, a.data(PROG_ACTION))
    a.place(no_old)
    a(I.create_mem_i32(Code.CMP_RM64_IMM8, mem(R13, UC_RSI), 0))
    a.jcc(Code.JE_REL32_64, no_new)
    a.copy32(a.data(PROG_ACTION), a.data(TMP_ACTION))
    _sigsegv_action(a, new=OUR_ACTION)
    a.count(SIGACTIONS)
    a.place(no_new)
    a.leave()


def agent_code(base: int) -> bytes:
    """The code page for a region at ``base``."""
    page = bytearray(b"\xcc" * PAGE)
    page[RESTORER : RESTORER + 7] = b"\xb8\x0f\x00\x00\x00\x0f\x05"  # mov eax,15; syscall
    # Each handler, and where it goes: from its offset up to the next one's.
    parts = [
        (SEGV, TRACK_MMAP, _segv),
        (TRACK_MMAP, TRACK_MPROTECT, partial(_track_entry, uc_reg=UC_RAX)),
        (TRACK_MPROTECT, TRACK, partial(_track_entry, uc_reg=UC_RDI)),
        (TRACK, UNTRACK, _track),
        (UNTRACK, SIGACTION, _untrack),
        (SIGACTION, LOCK, _sigaction),
        (LOCK, PROBE, _lock),
        (PROBE, SNAPSHOT, _probe),
        (SNAPSHOT, CODE_END, _snapshot),
    ]
    for at, end, build in parts:
        a = _Asm(base)
        build(a, base)
        code = a.encode(base + at)
        if at + len(code) > end:
            raise AssertionError(f"agent code at {at:#x}: {len(code)} bytes do not fit")
        page[at : at + len(code)] = code
    return bytes(page)


def page_key_slot(page: int) -> int:
    """The table slot a page's probe starts at (as :func:`_probe` hashes)."""
    return (((page >> 12) * HASH_MULT) & ((1 << 64) - 1)) >> (64 - TABLE_BITS)
