"""The eBPF instruction set: opcode fields and instruction builders.

Encoding as the kernel's (``include/uapi/linux/bpf.h``): an 8-bit opcode
(class in the low 3 bits), dst register in the low nibble and src in the
high nibble of the second byte, a signed 16-bit offset, a signed 32-bit
immediate.  ``ld_imm64`` takes two slots (the second holds the high half).
Builders return one :data:`~hwtrace.filter.abi.INSN` record (a tuple) or,
for ``ld_imm64``, a list of two; :func:`program` packs a mixed list.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..abi import INSN

# Classes.
LD, LDX, ST, STX, ALU, JMP, JMP32, ALU64 = range(8)
# Sizes (LD/LDX/ST/STX).
W, H, B, DW = 0x00, 0x08, 0x10, 0x18
SIZE_BYTES = {W: 4, H: 2, B: 1, DW: 8}
# Modes.
IMM, ABS, IND, MEM, MEMSX, ATOMIC = 0x00, 0x20, 0x40, 0x60, 0x80, 0xC0
# Source operand.
K, X = 0x00, 0x08
# ALU operations.
ADD, SUB, MUL, DIV, OR, AND, LSH, RSH, NEG, MOD, XOR, MOV, ARSH, END = (
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0,
)  # fmt: skip
# Jump operations.
JA, JEQ, JGT, JGE, JSET, JNE, JSGT, JSGE, CALL, EXIT, JLT, JLE, JSLT, JSLE = (
    0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80, 0x90, 0xA0, 0xB0, 0xC0, 0xD0,
)  # fmt: skip

R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10 = range(11)

ALU_NAMES = {
    ADD: "+=", SUB: "-=", MUL: "*=", DIV: "/=", OR: "|=", AND: "&=", LSH: "<<=",
    RSH: ">>=", MOD: "%=", XOR: "^=", MOV: "=", ARSH: "s>>=",
}  # fmt: skip
JMP_NAMES = {
    JEQ: "==", JGT: ">", JGE: ">=", JSET: "&", JNE: "!=", JSGT: "s>", JSGE: "s>=",
    JLT: "<", JLE: "<=", JSLT: "s<", JSLE: "s<=",
}  # fmt: skip

Insn = tuple[int, int, int, int]


def insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> Insn:
    return (code & 0xFF, (dst & 0xF) | ((src & 0xF) << 4), off, _s32(imm))


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def alu64(op: int, dst: int, src_or_imm: int, *, reg: bool) -> Insn:
    if reg:
        return insn(ALU64 | op | X, dst, src_or_imm)
    return insn(ALU64 | op | K, dst, 0, 0, src_or_imm)


def mov(dst: int, src: int) -> Insn:
    return insn(ALU64 | MOV | X, dst, src)


def mov32(dst: int, src: int) -> Insn:
    """``dst = (u32) src``: a 32-bit move clears the upper half."""
    return insn(ALU | MOV | X, dst, src)


def mov_imm(dst: int, imm: int) -> Insn:
    return insn(ALU64 | MOV | K, dst, 0, 0, imm)


def ld_imm64(dst: int, value: int, src: int = 0) -> list[Insn]:
    """Two slots; ``src`` a pseudo source (see :mod:`~hwtrace.filter.abi`):
    then ``value`` is the pseudo's first immediate and ``high`` its second."""
    value &= (1 << 64) - 1
    return [insn(LD | DW | IMM, dst, src, 0, value & 0xFFFFFFFF), insn(0, 0, 0, 0, value >> 32)]


def ld_pseudo(dst: int, src: int, first: int, second: int = 0) -> list[Insn]:
    return [insn(LD | DW | IMM, dst, src, 0, first), insn(0, 0, 0, 0, second)]


def ldx(size: int, dst: int, src: int, off: int) -> Insn:
    return insn(LDX | MEM | size, dst, src, off)


def stx(size: int, dst: int, src: int, off: int) -> Insn:
    return insn(STX | MEM | size, dst, src, off)


def st(size: int, dst: int, off: int, imm: int) -> Insn:
    return insn(ST | MEM | size, dst, 0, off, imm)


def jmp(op: int, dst: int, src_or_imm: int, off: int, *, reg: bool) -> Insn:
    if reg:
        return insn(JMP | op | X, dst, src_or_imm, off)
    return insn(JMP | op | K, dst, 0, off, src_or_imm)


def ja(off: int) -> Insn:
    return insn(JMP | JA, 0, 0, off)


def call(helper: int) -> Insn:
    return insn(JMP | CALL, 0, 0, 0, helper)


def exit_() -> Insn:
    return insn(JMP | EXIT)


def program(items: Iterable[Insn | list[Insn]]) -> np.ndarray:
    """Instructions (single ones or ``ld_imm64`` pairs) as an INSN array."""
    flat: list[Insn] = []
    for item in items:
        if isinstance(item, list):
            flat += item
        else:
            flat.append(item)
    return np.array(flat, dtype=INSN)


def fields(insns: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(code, dst, src, off, imm)`` columns of an INSN array."""
    regs = insns["regs"]
    return insns["code"], regs & 0xF, regs >> 4, insns["off"], insns["imm"]
