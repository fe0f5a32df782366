"""The eBPF verifier: proves a filter program safe to run in-process.

Kernel-like rules for a DAG (no back-edges, so no loops): every path is
followed by one forward pass in instruction order, joining the register and
stack states where paths merge, so verification is linear in the program's
size.  Each rejection is a :class:`~hwtrace.filter.errors.VerifierError`
with ``where="insn N"`` and the rule in plain words.

Instructions accepted (what the interpreter and the JIT implement), with
their run-time semantics:

* ``ALU64``/``ALU`` (K or X): ``ADD SUB MUL DIV MOD OR AND XOR LSH RSH ARSH
  NEG MOV``.  ALU64 sign-extends a K immediate to 64 bits; ALU (32-bit)
  works on the low halves and zero-extends its result.  ``DIV``/``MOD`` are
  unsigned; by a register that is 0: ``x / 0 = 0``, ``x % 0 = x`` (as the
  kernel); by a constant 0: rejected.  Shifts by a constant must be below
  the width; by a register, the count is masked to the width (``& 63`` /
  ``& 31``).  ``NEG`` only as K with ``src = imm = 0``.
* ``ALU | END`` (byte order, ``imm`` 16, 32 or 64): ``to_le`` (K) keeps the
  low ``imm`` bits (zero-extended: the host is little-endian), ``to_be``
  (X) byte-swaps them.  ``ALU64 | END`` (v4 bswap) is not accepted.
* ``LDX | MEM`` of 1, 2, 4, 8 bytes (zero-extended); ``STX | MEM`` and
  ``ST | MEM`` (the K immediate sign-extended to 64 bits, then truncated),
  to the stack only.
* ``LD | DW | IMM`` (``ld_imm64``, two slots) with ``src`` 0,
  ``PSEUDO_RODATA`` or ``PSEUDO_FIELD_PATH``.
* ``JMP``: ``JA``, conditional jumps ``JEQ JNE JGT JGE JLT JLE JSGT JSGE
  JSLT JSLE JSET`` (K immediate sign-extended to 64 bits), ``CALL`` of a
  helper in :data:`~hwtrace.filter.abi.HELPERS`, ``EXIT``.
  ``JMP32``: the same conditional jumps on the low 32 bits (no JA, CALL
  or EXIT).

Not accepted: ``LD_ABS``/``LD_IND``, atomics, sign-extending loads and
moves, signed division, ``gotol`` (cpu v4), bpf-to-bpf calls, any reserved
field that is not 0.

Register types: ``NOT_INIT``, ``SCALAR`` (with its value when it is known:
helper sizes must be constants), pointers to the event, the context, the
stack, rodata (with a constant offset), ``PATH`` (a field path handle, only
for helpers), ``PTR_TO_MEM`` (a checked ``field_addr`` result: the leaf's
slot) and ``PTR_TO_MEM_OR_NULL`` (an unchecked one; ``if rX == 0`` /
``!= 0`` makes it ``SCALAR 0`` on the null side and ``PTR_TO_MEM`` on the
other).  Where paths merge, a register of different kinds on the two sides
becomes unusable (an error only if it is read later).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import numpy as np

from .. import abi
from ..errors import VerifierError
from ..schema import ROOT_CONTEXT
from . import isa

# Register kinds (a register's state is a tuple (kind, a, b)).
NOT_INIT = 0
SCALAR = 1  # a: the value (u64) when known, else None
PTR_TO_EVENT = 2  # a: offset
PTR_TO_CONTEXT = 3  # a: offset
PTR_TO_STACK = 4  # a: offset from R10 (negative)
PTR_TO_RODATA = 5  # a: offset
PATH = 6  # a: index into the program's paths
PTR_TO_MEM = 7  # a: offset, b: size of the region
PTR_TO_MEM_OR_NULL = 8  # a: id (the index of the call that made it), b: size
UNUSABLE = 9  # a: where the paths merged, b: what the two sides held

_POINTERS = (PTR_TO_EVENT, PTR_TO_CONTEXT, PTR_TO_STACK, PTR_TO_RODATA, PTR_TO_MEM)
_NOT_INIT = (NOT_INIT, 0, 0)
_UNKNOWN = (SCALAR, None, 0)

M32 = 0xFFFFFFFF
M64 = (1 << 64) - 1
_MAX_OFFSET = 1 << 29  # pointer offsets beyond this are surely bugs
_STACK_SLOTS = abi.STACK_SIZE // 8
_LD_IMM64 = isa.LD | isa.DW | isa.IMM

_ALU_OPS = {
    isa.ADD: "+",
    isa.SUB: "-",
    isa.MUL: "*",
    isa.DIV: "/",
    isa.OR: "|",
    isa.AND: "&",
    isa.LSH: "<<",
    isa.RSH: ">>",
    isa.NEG: "neg",
    isa.MOD: "%",
    isa.XOR: "^",
    isa.MOV: "mov",
    isa.ARSH: "s>>",
    isa.END: "byte swap",
}
_COND_JUMPS = frozenset(isa.JMP_NAMES)


@dataclass(frozen=True)
class VerifierInfo:
    """What the verifier learnt: ``max_stack_depth`` (bytes below R10 the
    program touches, rounded up to 8), ``insn_count`` (slots), ``reachable``
    (slots on some path from the entry) and the helpers it calls."""

    max_stack_depth: int
    insn_count: int
    reachable: int = 0
    helpers: frozenset[int] = frozenset()


# -- exact constant arithmetic (also the tests' reference for the interpreter) ------


def _signed(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


def alu_eval(op: int, is64: bool, a: int, b: int) -> int:
    """``a op b`` as eBPF computes it (``a``, ``b`` as u64; for 32-bit ops
    their low halves); the result as u64 (32-bit results zero-extended)."""
    bits = 64 if is64 else 32
    mask = (1 << bits) - 1
    a &= mask
    b &= mask
    if op == isa.ADD:
        r = a + b
    elif op == isa.SUB:
        r = a - b
    elif op == isa.MUL:
        r = a * b
    elif op == isa.DIV:
        r = a // b if b else 0
    elif op == isa.MOD:
        r = a % b if b else a
    elif op == isa.OR:
        r = a | b
    elif op == isa.AND:
        r = a & b
    elif op == isa.XOR:
        r = a ^ b
    elif op == isa.LSH:
        r = a << (b & (bits - 1))
    elif op == isa.RSH:
        r = a >> (b & (bits - 1))
    elif op == isa.ARSH:
        r = _signed(a, bits) >> (b & (bits - 1))
    elif op == isa.NEG:
        r = -a
    elif op == isa.MOV:
        r = b
    else:
        raise ValueError(f"no ALU operation {op:#x}")
    return r & mask


def end_eval(to_be: bool, width: int, a: int) -> int:
    """``le16/le32/le64`` (truncate) or ``be16/be32/be64`` (byte swap)."""
    v = a & ((1 << width) - 1)
    if to_be:
        v = int.from_bytes(v.to_bytes(width // 8, "little"), "big")
    return v


# Conditional jumps: the comparison each makes, on the operands as unsigned
# or as signed integers.
_UNSIGNED_TESTS = {
    isa.JEQ: operator.eq,
    isa.JNE: operator.ne,
    isa.JGT: operator.gt,
    isa.JGE: operator.ge,
    isa.JLT: operator.lt,
    isa.JLE: operator.le,
    isa.JSET: lambda a, b: (a & b) != 0,
}
_SIGNED_TESTS = {
    isa.JSGT: operator.gt,
    isa.JSGE: operator.ge,
    isa.JSLT: operator.lt,
    isa.JSLE: operator.le,
}


def jmp_eval(op: int, is64: bool, a: int, b: int) -> bool:
    """Whether a conditional jump is taken (``a``, ``b`` as u64)."""
    bits = 64 if is64 else 32
    mask = (1 << bits) - 1
    a &= mask
    b &= mask
    if op in _SIGNED_TESTS:
        return _SIGNED_TESTS[op](_signed(a, bits), _signed(b, bits))
    if op in _UNSIGNED_TESTS:
        return _UNSIGNED_TESTS[op](a, b)
    raise ValueError(f"no conditional jump {op:#x}")


# -- state -----------------------------------------------------------------------------


# How a value of each kind reads in messages ({a}, {b}: its other two words).
_DESCRIPTIONS = {
    NOT_INIT: "uninitialised",
    PTR_TO_EVENT: "a pointer to event{a:+d}",
    PTR_TO_CONTEXT: "a pointer to context{a:+d}",
    PTR_TO_STACK: "a pointer to the stack at fp{a:+d}",
    PTR_TO_RODATA: "a pointer to rodata{a:+d}",
    PATH: "field path {a}",
    PTR_TO_MEM: "a checked field address{a:+d} ({b}-byte slot)",
    PTR_TO_MEM_OR_NULL: "a possibly-null field address (from the call at insn {a})",
    UNUSABLE: "unusable ({b} on the paths that merge at insn {a})",
}


def _describe(v: tuple) -> str:
    kind, a, b = v
    if kind == SCALAR:
        return "a scalar" if a is None else f"the scalar {_signed(a, 64)}"
    return _DESCRIPTIONS[kind].format(a=a, b=b)


def _join_reg(x: tuple, y: tuple, at: int) -> tuple:
    if x == y:
        return x
    kx, ky = x[0], y[0]
    if kx == NOT_INIT or ky == NOT_INIT:
        return _NOT_INIT
    if kx == SCALAR and ky == SCALAR:
        return _UNKNOWN
    if kx == UNUSABLE:
        return x
    if ky == UNUSABLE:
        return y
    return (UNUSABLE, at, f"{_describe(x)} on one, {_describe(y)} on another")


def _join_slot(x, y, at: int):
    # A slot is an int mask of its initialised bytes, or a spilled register
    # (a tuple: all 8 bytes initialised).
    if x == y:
        return x
    if isinstance(x, tuple) and isinstance(y, tuple):
        return _join_reg(x, y, at)
    mx = 0xFF if isinstance(x, tuple) else x
    my = 0xFF if isinstance(y, tuple) else y
    return mx & my


class _State:
    __slots__ = ("regs", "stack")

    def __init__(self, regs: list, stack: list) -> None:
        self.regs = regs
        self.stack = stack

    def copy(self) -> _State:
        return _State(self.regs[:], self.stack[:])

    def join(self, other: _State, at: int) -> _State:
        regs = [_join_reg(a, b, at) for a, b in zip(self.regs, other.regs, strict=True)]
        stack = [_join_slot(a, b, at) for a, b in zip(self.stack, other.stack, strict=True)]
        return _State(regs, stack)


# -- the verifier ------------------------------------------------------------------------


class _Verifier:
    def __init__(self, program) -> None:
        self.program = program
        insns = np.asarray(program.insns)
        if insns.dtype != abi.INSN:
            raise VerifierError("instructions must be an INSN array", where="insn 0")
        code, dst, src, off, imm = isa.fields(insns)
        self.code = code.tolist()
        self.dst = dst.tolist()
        self.src = src.tolist()
        self.off = off.tolist()
        self.imm = imm.tolist()
        self.n = len(self.code)
        self.rodata_len = len(program.rodata)
        self.paths = program.paths
        self.event_size = program.event_size
        self.context_size = program.context_size
        self.second = bytearray(self.n)  # 1 at the second slot of an ld_imm64
        self.depth = 0
        self.helpers: set[int] = set()
        self.pc = 0

    def fail(self, message: str, pc: int | None = None):
        raise VerifierError(message, where=f"insn {self.pc if pc is None else pc}")

    # -- pass 1: encodings and the control-flow graph ------------------------------

    def check_encodings(self) -> None:
        n = self.n
        if n == 0:
            self.fail("empty program (it must end in exit)", 0)
        if n > abi.MAX_INSNS:
            self.fail(
                f"the program has {n} instructions; the limit is {abi.MAX_INSNS}", abi.MAX_INSNS
            )
        pc = 0
        while pc < n:
            self.pc = pc
            if self.code[pc] == _LD_IMM64:
                if pc + 1 >= n:
                    self.fail("ld_imm64 lacks its second slot (the program ends)")
                self.second[pc + 1] = 1
                self.check_ld_imm64(pc)
                pc += 2
                continue
            self.check_insn(pc)
            pc += 1
        last = n - 2 if self.second[n - 1] else n - 1
        if self.code[last] not in (isa.JMP | isa.EXIT, isa.JMP | isa.JA):
            self.fail(
                "the program falls off its end here: the last instruction must be exit or goto",
                last,
            )
        for pc in range(n):
            c = self.code[pc]
            if self.second[pc] or c & 7 not in (isa.JMP, isa.JMP32):
                continue
            op = c & 0xF0
            if c & 7 == isa.JMP and op in (isa.CALL, isa.EXIT):
                continue
            target = pc + 1 + self.off[pc]
            self.pc = pc
            if target <= pc:
                self.fail(f"back-edge from insn {pc} to insn {target}: loops are not allowed")
            if target >= n:
                self.fail(f"jump out of the program: target insn {target} (the program has {n})")
            if self.second[target]:
                self.fail(
                    f"jump into the second slot of the ld_imm64 at insn {target - 1} "
                    f"(target insn {target})"
                )

    def check_ld_imm64(self, pc: int) -> None:
        if self.code[pc + 1] or self.dst[pc + 1] or self.src[pc + 1] or self.off[pc + 1]:
            self.fail("the second slot of ld_imm64 must have code, registers and offset 0", pc + 1)
        if self.off[pc]:
            self.fail("ld_imm64: the offset field must be 0")
        self.check_dst_writable(pc)
        s = self.src[pc]
        if s == 0:
            return
        if s == abi.PSEUDO_RODATA:
            if self.imm[pc] != 0:
                self.fail("ld_imm64 of rodata: the first immediate must be 0")
            at = self.imm[pc + 1]
            if not 0 <= at <= self.rodata_len:
                self.fail(f"ld_imm64 of rodata{at:+d}: outside rodata ({self.rodata_len} bytes)")
            return
        if s == abi.PSEUDO_FIELD_PATH:
            index = self.imm[pc]
            if not 0 <= index < len(self.paths):
                self.fail(
                    f"ld_imm64 of field path {index}: the program has {len(self.paths)} paths"
                )
            if self.imm[pc + 1] != 0:
                self.fail("ld_imm64 of a field path: the second immediate must be 0")
            p = self.paths[index]
            if p.static_offset is not None:
                ctx = p.root == ROOT_CONTEXT
                size = self.context_size if ctx else self.event_size
                if p.static_offset < 0 or p.static_offset + p.size > size:
                    record = "context" if ctx else "event"
                    self.fail(
                        f"field path {index} ({p.text}) lies outside the {size}-byte {record}"
                    )
            return
        self.fail(
            f"ld_imm64 with unknown source {s} (0, rodata {abi.PSEUDO_RODATA} or field path {abi.PSEUDO_FIELD_PATH})"
        )

    def check_dst_writable(self, pc: int) -> None:
        d = self.dst[pc]
        if d == isa.R10:
            self.fail("R10 (the frame pointer) is read-only")
        if d > 10:
            self.fail(f"invalid register r{d}")

    def check_reg(self, r: int) -> None:
        if r > 10:
            self.fail(f"invalid register r{r}")

    def check_source(self, s: int, imm: int, register: bool, what: str) -> None:
        """The source operand is a register (src, with imm 0) or the
        immediate (with src 0); ``what`` names the instruction form."""
        if register:
            self.check_reg(s)
            if imm:
                self.fail(f"{what}: the immediate must be 0")
        elif s:
            self.fail(f"{what}: the src field must be 0")

    def check_mode(self, c: int, what: str, newer: int = -1, unsupported: str = "") -> None:
        """A load or store must use BPF_MEM; ``newer``, a mode of a later
        instruction set, fails with the message ``unsupported``."""
        mode = c & 0xE0
        if mode == newer:
            self.fail(unsupported)
        if mode != isa.MEM:
            self.fail(f"invalid {what} mode {mode:#x} (opcode {c:#04x})")

    def check_insn(self, pc: int) -> None:
        c, d, s, off, imm = self.code[pc], self.dst[pc], self.src[pc], self.off[pc], self.imm[pc]
        cls = c & 7
        if cls in (isa.ALU, isa.ALU64):
            op, x = c & 0xF0, c & isa.X
            if op not in _ALU_OPS:
                self.fail(f"unknown ALU operation {op:#x} (opcode {c:#04x})")
            self.check_dst_writable(pc)
            if off:
                self.fail(
                    f"ALU {_ALU_OPS[op]}: the offset field must be 0 (signed division and sign-extending moves are not supported)"
                )
            if op == isa.END:
                if cls == isa.ALU64:
                    self.fail(
                        "ALU64 byte swap (bswap, cpu v4) is not supported; use be16/be32/be64"
                    )
                if s:
                    self.fail("byte swap: the src field must be 0")
                if imm not in (16, 32, 64):
                    self.fail(f"byte swap width must be 16, 32 or 64, not {imm}")
                return
            if op == isa.NEG:
                if x or s or imm:
                    self.fail("neg: source, src and immediate must be 0")
                return
            form = "a register source" if x else "an immediate"
            self.check_source(s, imm, bool(x), f"ALU {_ALU_OPS[op]} with {form}")
            if x:
                return
            if op in (isa.DIV, isa.MOD) and imm == 0:
                self.fail("division by the constant 0")
            if op in (isa.LSH, isa.RSH, isa.ARSH):
                bits = 64 if cls == isa.ALU64 else 32
                if not 0 <= imm < bits:
                    self.fail(f"shift by {imm}: a constant shift must be 0..{bits - 1}")
            return
        if cls == isa.LDX:
            self.check_mode(
                c, "load", isa.MEMSX, "sign-extending loads (BPF_MEMSX, cpu v4) are not supported"
            )
            self.check_dst_writable(pc)
            self.check_source(s, imm, True, "load")
            return
        if cls == isa.STX:
            self.check_mode(c, "store", isa.ATOMIC, "atomic operations are not supported")
            self.check_reg(d)
            self.check_source(s, imm, True, "store of a register")
            return
        if cls == isa.ST:
            self.check_mode(c, "store")
            self.check_reg(d)
            self.check_source(s, imm, False, "store of an immediate")
            return
        if cls == isa.LD:
            mode = c & 0xE0
            if mode in (isa.ABS, isa.IND):
                self.fail("LD_ABS/LD_IND (packet access) is not supported")
            self.fail(f"invalid LD opcode {c:#04x} (only ld_imm64, opcode 0x18)")
        # JMP, JMP32
        op, x = c & 0xF0, c & isa.X
        if cls == isa.JMP and op in (isa.JA, isa.CALL, isa.EXIT):
            if op == isa.JA:
                if x or d or s or imm:
                    self.fail("goto: registers and immediate must be 0")
            elif op == isa.CALL:
                if s == 1:
                    self.fail("calls to other eBPF functions (bpf-to-bpf calls) are not supported")
                if x or d or s or off:
                    self.fail("call: registers and offset must be 0")
                if imm not in abi.HELPERS:
                    self.fail(f"call of unknown helper {imm} (helpers: {_helper_list()})")
            else:
                if x or d or s or off or imm:
                    self.fail("exit: registers, offset and immediate must be 0")
            return
        if cls == isa.JMP32 and op == isa.JA:
            self.fail("gotol (JMP32 | JA, cpu v4) is not supported; use goto")
        if op not in _COND_JUMPS:
            what = "JMP32" if cls == isa.JMP32 else "JMP"
            self.fail(f"unknown {what} operation {op:#x} (opcode {c:#04x})")
        self.check_reg(d)
        self.check_source(
            s, imm, bool(x), f"conditional jump on {'a register' if x else 'an immediate'}"
        )

    # -- pass 2: types along every path ---------------------------------------------

    def read(self, st: _State, r: int) -> tuple:
        v = st.regs[r]
        k = v[0]
        if k == NOT_INIT:
            self.fail(f"r{r} is read before it is initialised (on some path to here)")
        if k == UNUSABLE:
            self.fail(
                f"r{r} is used but holds different kinds of value on the paths that merge at "
                f"insn {v[1]} ({v[2]})"
            )
        return v

    def run(self) -> VerifierInfo:
        self.check_encodings()
        n = self.n
        regs = [_NOT_INIT] * 11
        regs[1] = (PTR_TO_EVENT, 0, 0)
        regs[2] = (PTR_TO_CONTEXT, 0, 0)
        regs[10] = (PTR_TO_STACK, 0, 0)
        cur: _State | None = _State(regs, [0] * _STACK_SLOTS)
        pending: dict[int, _State] = {}
        reachable = 0
        pc = 0
        while pc < n:
            self.pc = pc
            other = pending.pop(pc, None)
            if cur is None:
                cur = other
            elif other is not None:
                cur = cur.join(other, pc)
            width = 2 if self.code[pc] == _LD_IMM64 else 1
            if cur is None:  # dead code: only its encoding was checked
                pc += width
                continue
            reachable += width
            cur = self.step(pc, cur, pending)
            pc += width
        assert cur is None  # the last instruction is exit or goto (pass 1)
        depth = -(-self.depth // 8) * 8
        return VerifierInfo(depth, n, reachable, frozenset(self.helpers))

    def branch(self, pending: dict[int, _State], target: int, st: _State) -> None:
        old = pending.get(target)
        pending[target] = st if old is None else old.join(st, target)

    def step(self, pc: int, st: _State, pending: dict[int, _State]) -> _State | None:
        c = self.code[pc]
        cls = c & 7
        if cls in (isa.ALU, isa.ALU64):
            self.alu(pc, st, c, cls == isa.ALU64)
            return st
        if cls == isa.LDX:
            self.ldx(pc, st, c)
            return st
        if cls in (isa.ST, isa.STX):
            self.store(pc, st, c, cls)
            return st
        if cls == isa.LD:  # ld_imm64
            s = self.src[pc]
            if s == 0:
                value = (self.imm[pc] & M32) | ((self.imm[pc + 1] & M32) << 32)
                st.regs[self.dst[pc]] = (SCALAR, value, 0)
            elif s == abi.PSEUDO_RODATA:
                st.regs[self.dst[pc]] = (PTR_TO_RODATA, self.imm[pc + 1], 0)
            else:
                st.regs[self.dst[pc]] = (PATH, self.imm[pc], 0)
            return st
        op = c & 0xF0
        if cls == isa.JMP:
            if op == isa.EXIT:
                r0 = self.read(st, 0)
                if r0[0] != SCALAR:
                    self.fail(f"exit with r0 {_describe(r0)}: a filter returns a scalar verdict")
                return None
            if op == isa.JA:
                self.branch(pending, pc + 1 + self.off[pc], st)
                return None
            if op == isa.CALL:
                self.call(pc, st)
                return st
        return self.cond_jump(pc, st, pending, c, op, cls == isa.JMP)

    # ALU --------------------------------------------------------------------------

    def alu(self, pc: int, st: _State, c: int, is64: bool) -> None:
        op, x = c & 0xF0, c & isa.X
        d = self.dst[pc]
        regs = st.regs
        if op == isa.MOV:
            if x:
                v = self.read(st, self.src[pc])
                if is64:
                    regs[d] = v
                elif v[0] != SCALAR:
                    self.fail(
                        f"32-bit move of r{self.src[pc]}, {_describe(v)}: pointers are 64-bit"
                    )
                else:
                    regs[d] = (SCALAR, None if v[1] is None else v[1] & M32, 0)
            else:
                regs[d] = (SCALAR, self.imm[pc] & (M64 if is64 else M32), 0)
            return
        v = self.read(st, d)
        if op in (isa.NEG, isa.END):
            if v[0] != SCALAR:
                self.fail(f"{_ALU_OPS[op]} of r{d}, {_describe(v)}: only scalars allow it")
            if v[1] is None:
                regs[d] = _UNKNOWN
            elif op == isa.NEG:
                regs[d] = (SCALAR, alu_eval(op, is64, v[1], 0), 0)
            else:
                regs[d] = (SCALAR, end_eval(bool(x), self.imm[pc], v[1]), 0)
            return
        if x:
            s = self.src[pc]
            w = self.read(st, s)
            if w[0] != SCALAR:
                if v[0] == SCALAR:
                    self.fail(
                        f"r{d} {_ALU_OPS[op]}= r{s}: r{s} is {_describe(w)}; pointers cannot be "
                        "arithmetic operands"
                    )
                self.fail(
                    f"r{d} {_ALU_OPS[op]}= r{s}: arithmetic between r{d}, {_describe(v)}, and "
                    f"r{s}, {_describe(w)}, is not allowed"
                )
            b = w[1]
        else:
            b = self.imm[pc] & M64
        if v[0] == SCALAR:
            if v[1] is None or b is None:
                regs[d] = _UNKNOWN
            else:
                regs[d] = (SCALAR, alu_eval(op, is64, v[1], b), 0)
            return
        # Pointer arithmetic: only ptr += const / ptr -= const on 64 bits.
        kind = v[0]
        what = f"r{d} is {_describe(v)}"
        if kind == PTR_TO_MEM_OR_NULL:
            self.fail(f"arithmetic on a possibly-null pointer ({what}): check it against 0 first")
        if kind == PATH:
            self.fail(f"arithmetic on a field path handle ({what}): only helpers take it")
        if not is64:
            self.fail(f"32-bit ALU on a pointer ({what}): pointers are 64-bit")
        if x:
            self.fail(
                f"pointer arithmetic with a register ({what}): only ptr += constant and "
                "ptr -= constant are allowed"
            )
        if op not in (isa.ADD, isa.SUB):
            self.fail(
                f"pointer arithmetic '{_ALU_OPS[op]}' ({what}): only ptr += constant and "
                "ptr -= constant are allowed"
            )
        delta = self.imm[pc] if op == isa.ADD else -self.imm[pc]
        offset = v[1] + delta
        if abs(offset) > _MAX_OFFSET:
            self.fail(f"pointer offset {offset} out of range ({what})")
        regs[d] = (kind, offset, v[2])

    # Memory -----------------------------------------------------------------------

    def region(self, pc: int, v: tuple, r: int, size: int, store: bool) -> int:
        """The checked offset of an access of ``size`` bytes at ``r + off``."""
        kind = v[0]
        access = "store" if store else "load"
        if kind == SCALAR:
            self.fail(
                f"{access} through r{r}, {_describe(v)}: memory is reached only through "
                "pointers (event, context, stack, rodata, a checked field address)"
            )
        if kind == PTR_TO_MEM_OR_NULL:
            self.fail(f"{access} through r{r}, {_describe(v)}: check it against 0 first")
        if kind == PATH:
            self.fail(f"{access} through r{r}, {_describe(v)}: field paths are only for helpers")
        o = v[1] + self.off[pc]
        if kind == PTR_TO_STACK:
            lo, hi, name = -abi.STACK_SIZE, 0, "the stack"
        elif store:
            region = {
                PTR_TO_EVENT: "event",
                PTR_TO_CONTEXT: "context",
                PTR_TO_RODATA: "rodata",
                PTR_TO_MEM: "field",
            }[kind]
            self.fail(
                f"store to read-only {region} memory through r{r}: only the stack is writable"
            )
        elif kind == PTR_TO_EVENT:
            lo, hi, name = 0, self.event_size, f"the {self.event_size}-byte event"
        elif kind == PTR_TO_CONTEXT:
            lo, hi, name = 0, self.context_size, f"the {self.context_size}-byte context"
        elif kind == PTR_TO_RODATA:
            lo, hi, name = 0, self.rodata_len, f"the {self.rodata_len}-byte rodata"
        else:
            lo, hi, name = 0, v[2], f"the {v[2]}-byte field slot"
        if o < lo or o + size > hi:
            base = {
                PTR_TO_EVENT: "event",
                PTR_TO_CONTEXT: "context",
                PTR_TO_STACK: "fp",
                PTR_TO_RODATA: "rodata",
                PTR_TO_MEM: "field",
            }[kind]
            self.fail(
                f"{access} of {size} bytes at {base}{o:+d} is outside {name} "
                f"(allowed: [{lo}, {hi}))"
            )
        return o

    def ldx(self, pc: int, st: _State, c: int) -> None:
        size = isa.SIZE_BYTES[c & 0x18]
        s = self.src[pc]
        v = self.read(st, s)
        o = self.region(pc, v, s, size, store=False)
        result = _UNKNOWN
        if v[0] == PTR_TO_STACK:
            self.depth = max(self.depth, -o)
            stack = st.stack
            i = (abi.STACK_SIZE + o) // 8
            slot = stack[i]
            if size == 8 and o % 8 == 0 and isinstance(slot, tuple):
                result = slot  # a filled spill: the register as it was stored
            else:
                for byte in range(abi.STACK_SIZE + o, abi.STACK_SIZE + o + size):
                    slot = stack[byte // 8]
                    if not isinstance(slot, tuple) and not slot >> (byte % 8) & 1:
                        self.fail(f"read of uninitialised stack at fp{o:+d}")
        st.regs[self.dst[pc]] = result

    def store(self, pc: int, st: _State, c: int, cls: int) -> None:
        size = isa.SIZE_BYTES[c & 0x18]
        d = self.dst[pc]
        base = self.read(st, d)
        o = self.region(pc, base, d, size, store=True)
        if cls == isa.STX:
            value = self.read(st, self.src[pc])
        else:
            value = (SCALAR, self.imm[pc] & M64, 0)
        self.depth = max(self.depth, -o)
        stack = st.stack
        start = abi.STACK_SIZE + o
        if size == 8 and o % 8 == 0:
            stack[start // 8] = value  # a spill (kept whole, pointers included)
            return
        for byte in range(start, start + size):
            i = byte // 8
            slot = stack[i]
            # A partial overwrite turns a spilled register into scalar bytes.
            stack[i] = (0xFF if isinstance(slot, tuple) else slot) | (1 << (byte % 8))

    # Calls --------------------------------------------------------------------------

    def call(self, pc: int, st: _State) -> None:
        helper = self.imm[pc]
        name, kinds = abi.HELPERS[helper]
        self.helpers.add(helper)
        regs = st.regs
        path_index = -1
        for i, kind in enumerate(kinds):
            r = i + 1
            v = self.read(st, r)
            arg = f"argument {r} (r{r}) of {name}"
            if kind == "event":
                if v != (PTR_TO_EVENT, 0, 0):
                    self.fail(
                        f"{arg} must be the event pointer (r1 as received), not {_describe(v)}"
                    )
            elif kind == "context":
                if v != (PTR_TO_CONTEXT, 0, 0):
                    self.fail(
                        f"{arg} must be the context pointer (r2 as received), not {_describe(v)}"
                    )
            elif kind == "path":
                if v[0] != PATH:
                    self.fail(
                        f"{arg} must be a field path (ld_imm64 of a path), not {_describe(v)}"
                    )
                path_index = v[1]
            elif kind == "rodata":
                if v[0] != PTR_TO_RODATA:
                    self.fail(f"{arg} must be a pointer into rodata, not {_describe(v)}")
                if i + 1 >= len(kinds) or kinds[i + 1] != "size":
                    continue
                w = self.read(st, r + 1)
                if w[0] != SCALAR or w[1] is None:
                    self.fail(
                        f"argument {r + 1} (r{r + 1}) of {name} must be a known constant size, "
                        f"not {_describe(w)}"
                    )
                length = w[1]
                if v[1] < 0 or v[1] + length > self.rodata_len:
                    self.fail(
                        f"{name}: {_signed(length, 64)} bytes at rodata{v[1]:+d} go past the end "
                        f"of rodata ({self.rodata_len} bytes)"
                    )
            elif kind == "size":
                if v[0] != SCALAR or v[1] is None:
                    self.fail(f"{arg} must be a known constant size, not {_describe(v)}")
            elif kind == "scalar":
                pass  # any initialised value
            else:  # pragma: no cover - abi and verifier disagree
                self.fail(f"{name}: unknown argument kind {kind!r}")
        for r in range(1, 6):
            regs[r] = _NOT_INIT
        if helper == abi.HELPER_FIELD_ADDR:
            regs[0] = (PTR_TO_MEM_OR_NULL, pc, self.paths[path_index].size)
        else:
            regs[0] = _UNKNOWN

    # Jumps --------------------------------------------------------------------------

    def cond_jump(
        self, pc: int, st: _State, pending: dict[int, _State], c: int, op: int, is64: bool
    ) -> _State | None:
        d = self.dst[pc]
        x = c & isa.X
        a = self.read(st, d)
        if x:
            s = self.src[pc]
            b = self.read(st, s)
        else:
            s = -1
            b = (SCALAR, self.imm[pc] & M64, 0)
        target = pc + 1 + self.off[pc]
        if a[0] != SCALAR or b[0] != SCALAR:
            return self.pointer_jump(pc, st, pending, op, is64, d, a, s, b, target)
        if a[1] is not None and b[1] is not None:
            # Decided now: follow only the path taken.
            if jmp_eval(op, is64, a[1], b[1]):
                self.branch(pending, target, st)
                return None
            return st
        taken = st.copy()
        if is64 and op in (isa.JEQ, isa.JNE):
            # Equality teaches the unknown side its value.
            eq = taken if op == isa.JEQ else st
            if a[1] is None and b[1] is not None:
                eq.regs[d] = b
            elif x and b[1] is None and a[1] is not None:
                eq.regs[s] = a
        self.branch(pending, target, taken)
        return st

    def pointer_jump(self, pc, st, pending, op, is64, d, a, s, b, target) -> _State:
        sym = isa.JMP_NAMES[op]
        if a[0] != SCALAR and b[0] != SCALAR:
            self.fail(f"comparison of two pointers (r{d} {sym} r{s}) is not allowed")
        ptr_reg, ptr, other = (d, a, b) if a[0] != SCALAR else (s, b, a)
        if other[1] != 0 or op not in (isa.JEQ, isa.JNE) or not is64:
            rhs = f"r{s}" if s >= 0 else str(_signed(b[1], 64))
            self.fail(
                f"comparison 'r{d} {sym} {rhs}' of r{ptr_reg}, {_describe(ptr)}: a pointer may only "
                "be compared (64-bit == or !=) with 0"
            )
        taken = st.copy()
        if ptr[0] == PTR_TO_MEM_OR_NULL:
            null, nonnull = (taken, st) if op == isa.JEQ else (st, taken)
            ident = ptr[1]
            checked = (PTR_TO_MEM, 0, ptr[2])
            zero = (SCALAR, 0, 0)
            for state, value in ((null, zero), (nonnull, checked)):
                regs = state.regs
                for r in range(11):
                    if regs[r][0] == PTR_TO_MEM_OR_NULL and regs[r][1] == ident:
                        regs[r] = value
                stack = state.stack
                for i, slot in enumerate(stack):
                    if (
                        isinstance(slot, tuple)
                        and slot[0] == PTR_TO_MEM_OR_NULL
                        and slot[1] == ident
                    ):
                        stack[i] = value
        self.branch(pending, target, taken)
        return st


def _helper_list() -> str:
    return ", ".join(f"{n} {name}" for n, (name, _) in sorted(abi.HELPERS.items()))


def verify(program) -> VerifierInfo:
    """Verify ``program`` (a :class:`~.program.Program`); raises
    :class:`VerifierError` naming the instruction and the rule."""
    return _Verifier(program).run()
