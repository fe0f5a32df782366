"""eBPF -> x86-64 template JIT, after the kernel's ``arch/x86/net/bpf_jit_comp.c``.

One fixed x86-64 sequence per eBPF instruction (no optimisation: that is
clang's or the code generator's job), registers mapped one to one as Table 1
of Sharma and Dagenais ("Enhanced Userspace and In-Kernel Trace Filtering
for Production Systems", JCST 2016)::

    R0 rax  R1 rdi  R2 rsi  R3 rdx  R4 rcx  R5 r8          (caller-saved)
    R6 rbx  R7 r13  R8 r14  R9 r15  R10 rbp (frame pointer) (callee-saved)

r11 is the auxiliary register (divisor, saved rcx around shifts), r12 is
unused.  R1-R5 are the System V argument registers in order, so a helper
call is just ``movabs rax, helper; call rax`` and R0 is the result in rax.

Frame (Fig. 7 of Sharma and Dagenais, without the old skb scratch word)::

    push rbp; mov rbp, rsp; sub rsp, D + 32       D = stack depth rounded to 16
    mov [rbp-D-8], rbx; ... r13, r14, r15         eBPF stack is [rbp-D, rbp)
    <body>
    mov rbx, [rbp-D-8]; ... ; leave; ret          (the epilogue; EXIT jumps here)

rsp stays 16-byte aligned in the body (entry ``rsp = 8 mod 16``, the push of
rbp makes it 0, and D + 32 is a multiple of 16), so helper calls keep the
System V ABI.  R0 and R7 are not cleared on entry, unlike the kernel's
classic-BPF heritage: the verifier rejects a read of an uninitialised
register, and only verified programs are compiled.

Semantics the kernel keeps and the sequences implement: ALU32 results are
zero-extended to 64 bits (x86 32-bit operations do it); shift counts are
masked to 63 (31 for ALU32), as x86 does; division is unsigned with
``x / 0 = 0`` and ``x % 0 = x`` (ALU32: the low 32 bits of x, zero-extended);
64-bit immediates of ALU64, JMP and ``st dw`` are the sign-extended imm32.

Jumps: the kernel's multi-pass scheme.  Pass 0 emits every jump with a rel32
(an upper bound on each instruction's size); each later pass computes
displacements from the previous pass's instruction offsets and uses the
2-byte rel8 form where that displacement fits.  Sizes only shrink from pass
to pass, so once a pass reproduces the previous offsets exactly, its
displacements are exact and its bytes are the result (usually 2-3 passes).

:func:`jit_insns` trusts its input: it checks only what it needs to encode
(known opcodes, registers R0-R10, jump targets inside the program, complete
``ld_imm64``, known helpers) and reports those with the instruction index.
Memory safety, initialised registers and the absence of loops are the
verifier's; :func:`jit_compile` takes a :class:`~.program.LinkedProgram`,
which only exists for a program that passed it.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import abi, native
from ..errors import FilterError
from ..execmem import ExecBuffer
from . import isa

if TYPE_CHECKING:
    from .program import LinkedProgram

# x86 register numbers.
RAX, RCX, RDX, RBX, RSP, RBP, RSI, RDI = range(8)
R8, R9, R10, R11, R12, R13, R14, R15 = range(8, 16)
AUX_REG = R11

#: eBPF register -> x86-64 register (Table 1).
REG_MAP = (RAX, RDI, RSI, RDX, RCX, R8, RBX, R13, R14, R15, RBP)
#: Callee-saved registers the prologue saves below the eBPF stack.
CALLEE_SAVED = (RBX, R13, R14, R15)
_SPILL_BYTES = 8 * len(CALLEE_SAVED)
MAX_PASSES = 32

# Condition codes (the low nibble of Jcc).
_CC = {
    isa.JEQ: 0x4,  # je
    isa.JNE: 0x5,  # jne
    isa.JGT: 0x7,  # ja
    isa.JGE: 0x3,  # jae
    isa.JLT: 0x2,  # jb
    isa.JLE: 0x6,  # jbe
    isa.JSGT: 0xF,  # jg
    isa.JSGE: 0xD,  # jge
    isa.JSLT: 0xC,  # jl
    isa.JSLE: 0xE,  # jle
    isa.JSET: 0x5,  # test; jne
}
_CC_Z = 0x4
# ALU operations with a two-register form (opcode) and a /digit imm form.
_ALU_RR = {isa.ADD: 0x01, isa.SUB: 0x29, isa.AND: 0x21, isa.OR: 0x09, isa.XOR: 0x31}
_ALU_EXT = {isa.ADD: 0, isa.OR: 1, isa.AND: 4, isa.SUB: 5, isa.XOR: 6}
_SHIFT_EXT = {isa.LSH: 4, isa.RSH: 5, isa.ARSH: 7}


def _s8(v: int) -> bool:
    return -128 <= v <= 127


def _i32(v: int) -> bytes:
    return struct.pack("<i", v)


# -- encoding ------------------------------------------------------------------------


def _rex(out: bytearray, w: int, reg: int, rm: int, *, force: bool = False) -> None:
    v = 0x40 | (w << 3) | ((reg >> 3) << 2) | (rm >> 3)
    if v != 0x40 or force:
        out.append(v)


def _rr(
    out: bytearray, op: bytes, reg: int, rm: int, w: int, *, byte: bool = False, p66: bool = False
) -> None:
    """``op`` with a register-direct ModRM (``reg`` may be a /digit)."""
    if p66:
        out.append(0x66)
    # spl/bpl/sil/dil need a REX prefix in byte operations.
    _rex(out, w, reg, rm, force=byte and (4 <= reg <= 7 or 4 <= rm <= 7))
    out += op
    out.append(0xC0 | ((reg & 7) << 3) | (rm & 7))


def _mem(
    out: bytearray,
    op: bytes,
    reg: int,
    base: int,
    disp: int,
    w: int,
    *,
    byte: bool = False,
    p66: bool = False,
) -> None:
    """``op`` with a ``[base + disp]`` ModRM."""
    if p66:
        out.append(0x66)
    _rex(out, w, reg, base, force=byte and 4 <= reg <= 7)
    out += op
    # mod 0 has no displacement, but with rbp/r13 it means rip-relative.
    mod = 0 if disp == 0 and base & 7 != RBP else 1 if _s8(disp) else 2
    out.append((mod << 6) | ((reg & 7) << 3) | (base & 7))
    if base & 7 == RSP:  # rsp/r12 as base need a SIB byte
        out.append(0x24)
    if mod == 1:
        out += struct.pack("<b", disp)
    elif mod == 2:
        out += _i32(disp)


def _mov_rr(out: bytearray, dst: int, src: int, w: int) -> None:
    _rr(out, b"\x89", src, dst, w)


def _mov_imm64(out: bytearray, dst: int, value: int) -> None:
    """The shortest move of a 64-bit constant (``value`` as u64)."""
    value &= (1 << 64) - 1
    if value == 0:
        _rr(out, b"\x31", dst, dst, 0)  # xor r32, r32 (zero-extends)
    elif value <= 0xFFFFFFFF:
        _rex(out, 0, 0, dst)
        out.append(0xB8 | (dst & 7))  # mov r32, imm32 (zero-extends)
        out += struct.pack("<I", value)
    elif value >= (1 << 64) - (1 << 31):
        _rr(out, b"\xc7", 0, dst, 1)  # mov r/m64, imm32 (sign-extends)
        out += _i32(value - (1 << 64))
    else:
        _rex(out, 1, 0, dst)
        out.append(0xB8 | (dst & 7))  # movabs
        out += struct.pack("<Q", value)


def _op_imm(out: bytearray, op8: bytes, op32: bytes, reg: int, rm: int, imm: int, w: int) -> None:
    """An instruction with an immediate, in its sign-extended imm8 form
    (``op8``) when ``imm`` fits a byte, else in its imm32 form (``op32``)."""
    if _s8(imm):
        _rr(out, op8, reg, rm, w)
        out += struct.pack("<b", imm)
    else:
        _rr(out, op32, reg, rm, w)
        out += _i32(imm)


def _alu_imm(out: bytearray, ext: int, dst: int, imm: int, w: int) -> None:
    _op_imm(out, b"\x83", b"\x81", ext, dst, imm, w)  # group 1: /ext r/m, imm


# -- frame ---------------------------------------------------------------------------


def _spill_offsets(depth: int) -> list[int]:
    return [-depth - 8 * (k + 1) for k in range(len(CALLEE_SAVED))]


def _prologue(depth: int) -> bytearray:
    out = bytearray(b"\x55\x48\x89\xe5")  # push rbp; mov rbp, rsp
    frame = depth + _SPILL_BYTES
    if _s8(frame):
        out += b"\x48\x83\xec" + struct.pack("<b", frame)
    else:
        out += b"\x48\x81\xec" + _i32(frame)
    for reg, off in zip(CALLEE_SAVED, _spill_offsets(depth), strict=True):
        _mem(out, b"\x89", reg, RBP, off, 1)
    return out


def _epilogue(depth: int) -> bytearray:
    out = bytearray()
    for reg, off in zip(CALLEE_SAVED, _spill_offsets(depth), strict=True):
        _mem(out, b"\x8b", reg, RBP, off, 1)
    out += b"\xc9\xc3"  # leave; ret
    return out


# -- instructions --------------------------------------------------------------------


def _bad(i: int, message: str) -> FilterError:
    return FilterError(message, where=f"insn {i}")


def _emit_div(out: bytearray, op: int, d: int, s: int | None, imm: int, w: int) -> None:
    """``d = d / s`` or ``d % s`` (unsigned), ``s`` a register or None for
    ``imm``; x86 ``div`` works in rdx:rax, so those are saved unless ``d``
    is one of them, and the divisor goes through r11 first (it may be rax
    or rdx)."""
    body = bytearray()
    if d != RAX:
        body.append(0x50)  # push rax
    if d != RDX:
        body.append(0x52)  # push rdx
    if s is None:
        if w:
            _rr(body, b"\xc7", 0, AUX_REG, 1)  # mov r11, imm32 (sign-extended)
            body += _i32(imm)
        else:
            body += b"\x41\xbb" + _i32(imm)  # mov r11d, imm32
    else:
        _mov_rr(body, AUX_REG, s, 1)
    if d != RAX:
        _mov_rr(body, RAX, d, w)
    body += b"\x31\xd2"  # xor edx, edx
    _rr(body, b"\xf7", 6, AUX_REG, w)  # div r11
    if op == isa.MOD and d != RDX:
        _mov_rr(body, d, RDX, w)
    elif op == isa.DIV and d != RAX:
        _mov_rr(body, d, RAX, w)
    if d != RDX:
        body.append(0x5A)  # pop rdx
    if d != RAX:
        body.append(0x58)  # pop rax

    # Division by zero: x / 0 = 0, x % 0 = x (ALU32: zero-extended).
    zero = bytearray()
    if op == isa.DIV:
        _rr(zero, b"\x31", d, d, 0)  # xor d32, d32
    elif not w:
        _mov_rr(zero, d, d, 0)  # mov d32, d32
    if s is None:
        out += body if imm != 0 else zero
        return
    _rr(out, b"\x85", s, s, w)  # test s, s
    if zero:
        body += b"\xeb" + struct.pack("<b", len(zero))  # jmp over the zero path
    out += bytes((0x70 | _CC_Z, len(body)))  # jz zero path / end
    out += body
    out += zero


def _emit_shift(out: bytearray, op: int, d: int, s: int | None, imm: int, w: int) -> None:
    ext = _SHIFT_EXT[op]
    if s is None:
        count = imm & (63 if w else 31)
        if count == 1:
            _rr(out, b"\xd1", ext, d, w)
        else:
            _rr(out, b"\xc1", ext, d, w)
            out.append(count)
        return
    if s == RCX:
        _rr(out, b"\xd3", ext, d, w)  # shl d, cl
        return
    # The count must be in cl, and rcx is R4: keep R4 in r11 meanwhile (and
    # when R4 is the destination, shift the copy in r11).
    _mov_rr(out, AUX_REG, RCX, 1)
    _mov_rr(out, RCX, s, 1)
    _rr(out, b"\xd3", ext, AUX_REG if d == RCX else d, w)
    _mov_rr(out, RCX, AUX_REG, 1)


def _emit_end(out: bytearray, i: int, d: int, imm: int, to_be: bool) -> None:
    if imm not in (16, 32, 64):
        raise _bad(i, f"byte swap width {imm} (must be 16, 32 or 64)")
    if to_be:
        if imm == 16:
            _rr(out, b"\xc1", 1, d, 0, p66=True)  # ror d16, 8
            out.append(8)
            _rr(out, b"\x0f\xb7", d, d, 0)  # movzx d32, d16
        else:
            _rex(out, int(imm == 64), 0, d)
            out += bytes((0x0F, 0xC8 | (d & 7)))  # bswap
    elif imm == 16:
        _rr(out, b"\x0f\xb7", d, d, 0)  # movzx d32, d16
    elif imm == 32:
        _mov_rr(out, d, d, 0)  # mov d32, d32


def _emit_alu(out: bytearray, i: int, code: int, d: int, s: int, imm: int) -> None:
    w = int(code & 7 == isa.ALU64)
    op = code & 0xF0
    reg_src = bool(code & isa.X)
    if op == isa.END:
        # ALU|END: to_le (K) / to_be (X); ALU64|END (cpu v4): unconditional swap.
        _emit_end(out, i, d, imm, to_be=reg_src or bool(w))
        return
    if op == isa.MOV:
        if reg_src:
            if d != s or not w:  # mov d32, d32 still zero-extends
                _mov_rr(out, d, s, w)
        elif w:
            _mov_imm64(out, d, imm)
        else:
            _mov_imm64(out, d, imm & 0xFFFFFFFF)
        return
    if op in _ALU_RR:
        if reg_src:
            _rr(out, bytes((_ALU_RR[op],)), s, d, w)
        else:
            _alu_imm(out, _ALU_EXT[op], d, imm, w)
        return
    if op == isa.MUL:
        if reg_src:
            _rr(out, b"\x0f\xaf", d, s, w)  # imul d, s (low half: sign-agnostic)
        else:
            _op_imm(out, b"\x6b", b"\x69", d, d, imm, w)  # imul d, d, imm
        return
    if op == isa.NEG:
        _rr(out, b"\xf7", 3, d, w)
        return
    if op in (isa.DIV, isa.MOD):
        _emit_div(out, op, d, s if reg_src else None, imm, w)
        return
    if op in _SHIFT_EXT:
        _emit_shift(out, op, d, s if reg_src else None, imm, w)
        return
    raise _bad(i, f"unknown ALU operation {op:#x} (opcode {code:#04x})")


_LDX_OP = {
    isa.DW: (b"\x8b", 1),
    isa.W: (b"\x8b", 0),
    isa.H: (b"\x0f\xb7", 0),
    isa.B: (b"\x0f\xb6", 0),
}


def _emit_mem(out: bytearray, i: int, code: int, d: int, s: int, off: int, imm: int) -> None:
    cls = code & 7
    size = code & 0x18
    mode = code & 0xE0
    if cls == isa.LDX and mode == isa.MEM:
        op, w = _LDX_OP[size]
        _mem(out, op, d, s, off, w)  # movzx for B/H, mov r32 for W: zero-extended
    elif cls == isa.STX and mode == isa.MEM:
        if size == isa.B:
            _mem(out, b"\x88", s, d, off, 0, byte=True)
        else:
            _mem(out, b"\x89", s, d, off, int(size == isa.DW), p66=size == isa.H)
    elif cls == isa.ST and mode == isa.MEM:
        if size == isa.B:
            _mem(out, b"\xc6", 0, d, off, 0)
            out += struct.pack("<B", imm & 0xFF)
        elif size == isa.H:
            _mem(out, b"\xc7", 0, d, off, 0, p66=True)
            out += struct.pack("<H", imm & 0xFFFF)
        else:
            _mem(out, b"\xc7", 0, d, off, int(size == isa.DW))  # DW: sign-extended imm32
            out += _i32(imm)
    elif cls == isa.STX and mode == isa.ATOMIC and size in (isa.W, isa.DW) and imm == isa.ADD:
        out.append(0xF0)  # lock add [d + off], s  (the classic XADD)
        _mem(out, b"\x01", s, d, off, int(size == isa.DW))
    else:
        raise _bad(i, f"unsupported memory instruction (opcode {code:#04x})")


def _jump(out: bytearray, cc: int | None, rel: int | None) -> None:
    """A jump at the end of an instruction's sequence; ``rel`` from the end
    of the jump, or None in pass 0 (rel32 placeholder)."""
    if rel is not None and _s8(rel):
        out.append(0xEB if cc is None else 0x70 | cc)
        out += struct.pack("<b", rel)
    elif cc is None:
        out.append(0xE9)
        out += _i32(rel or 0)
    else:
        out += bytes((0x0F, 0x80 | cc))
        out += _i32(rel or 0)


def _emit_cond(out: bytearray, code: int, d: int, s: int, imm: int, rel: int | None) -> None:
    w = int(code & 7 == isa.JMP)
    op = code & 0xF0
    if code & isa.X:
        _rr(out, b"\x85" if op == isa.JSET else b"\x39", s, d, w)  # test / cmp d, s
    elif op == isa.JSET:
        if d == RAX:
            _rex(out, w, 0, 0)
            out.append(0xA9)  # test rax, imm32
        else:
            _rr(out, b"\xf7", 0, d, w)
        out += _i32(imm)
    elif imm == 0:
        _rr(out, b"\x85", d, d, w)  # test d, d: the same flags as cmp d, 0
    else:
        _alu_imm(out, 7, d, imm, w)  # cmp d, imm
    _jump(out, _CC[op], rel)


# -- the compiler --------------------------------------------------------------------


def _decode(insns: np.ndarray) -> list[tuple[int, int, int, int, int]]:
    arr = np.ascontiguousarray(np.asarray(insns))
    if arr.dtype != abi.INSN:
        raise FilterError(f"eBPF instructions must be an array of abi.INSN, not {arr.dtype}")
    arr = arr.reshape(-1)
    if len(arr) == 0:
        raise FilterError("empty eBPF program")
    code, dst, src, off, imm = (c.tolist() for c in isa.fields(arr))
    return list(zip(code, dst, src, off, imm, strict=True))


def _check(decoded: list[tuple[int, int, int, int, int]]) -> None:
    """What the encoder needs to hold; the rest is the verifier's."""
    n = len(decoded)
    second: set[int] = set()  # second slots of ld_imm64
    i = 0
    while i < n:
        if decoded[i][0] == isa.LD | isa.DW | isa.IMM:
            if i + 1 >= n:
                raise _bad(i, "ld_imm64 without its second slot")
            second.add(i + 1)
            i += 2
        else:
            i += 1
    for i, (code, dst, src, off, imm) in enumerate(decoded):
        if i in second:
            continue
        if dst > 10 or src > 10:
            raise _bad(i, f"register r{max(dst, src)} does not exist (r0-r10)")
        cls, op = code & 7, code & 0xF0
        if cls in (isa.JMP, isa.JMP32) and (op == isa.JA or op in _CC):
            t = i + 1 + (imm if (op == isa.JA and cls == isa.JMP32) else off)
            if not 0 <= t < n:
                raise _bad(i, f"jump to {t}, outside the program (0-{n - 1})")
            if t in second:
                raise _bad(i, f"jump to {t}, the second slot of an ld_imm64")


def _helper(i: int, number: int) -> int:
    try:
        return native.helper_address(number)
    except KeyError:
        raise _bad(i, f"call to unknown helper {number}") from None


def _emit_body(
    decoded: list[tuple[int, int, int, int, int]],
    prologue: bytes,
    prev: list[int] | None,
    helpers: dict[int, int],
) -> tuple[bytearray, list[int]]:
    """One pass: the code up to the epilogue and ``starts`` (the offset of
    every instruction, then of the epilogue), with jump displacements taken
    from ``prev`` (None: rel32 everywhere)."""
    n = len(decoded)
    out = bytearray(prologue)
    starts = [0] * (n + 1)

    def rel_to(i: int, target: int) -> int | None:
        # Jumps end their instruction's sequence: displacement from its end.
        return None if prev is None else prev[target] - prev[i + 1]

    i = 0
    while i < n:
        starts[i] = len(out)
        code, dst, src, off, imm = decoded[i]
        d, s = REG_MAP[dst], REG_MAP[src]
        cls = code & 7
        if cls in (isa.ALU, isa.ALU64):
            _emit_alu(out, i, code, d, s, imm)
        elif cls == isa.LD:
            if code != isa.LD | isa.DW | isa.IMM or src != 0:
                what = "a pseudo ld_imm64 (link the program first)" if src else "LD ABS/IND"
                raise _bad(i, f"cannot compile {what} (opcode {code:#04x})")
            _mov_imm64(out, d, (imm & 0xFFFFFFFF) | ((decoded[i + 1][4] & 0xFFFFFFFF) << 32))
            starts[i + 1] = len(out)  # the second slot: no code
            i += 2
            continue
        elif cls in (isa.LDX, isa.ST, isa.STX):
            _emit_mem(out, i, code, d, s, off, imm)
        else:  # JMP, JMP32
            op = code & 0xF0
            if op == isa.CALL:
                if src != 0:
                    raise _bad(i, "eBPF-to-eBPF calls are not supported")
                _mov_imm64(out, RAX, helpers[i])
                out += b"\xff\xd0"  # call rax
            elif op == isa.EXIT:
                if i != n - 1:  # the last one falls through into the epilogue
                    _jump(out, None, rel_to(i, n))
            elif op == isa.JA:
                delta = imm if cls == isa.JMP32 else off  # JMP32|JA: gotol
                if delta != 0:
                    _jump(out, None, rel_to(i, i + 1 + delta))
            elif op in _CC:
                _emit_cond(out, code, d, s, imm, rel_to(i, i + 1 + off))
            else:
                raise _bad(i, f"unknown jump operation {op:#x} (opcode {code:#04x})")
        i += 1
    starts[n] = len(out)
    return out, starts


def jit_insns(insns: np.ndarray, *, stack_depth: int = abi.STACK_SIZE) -> JitCode:
    """Machine code for an INSN array, callable as ``int64 f(event, context)``.

    The array must be a verified, linked program (plain ``ld_imm64``
    constants, no pseudo sources): this is the low-level entry point and it
    trusts its input beyond what encoding needs.  ``stack_depth`` is the
    eBPF stack the program uses below R10 (rounded up to 16 bytes).
    """
    if not isinstance(stack_depth, int | np.integer) or not 0 <= stack_depth <= 1 << 20:
        raise FilterError(f"stack depth {stack_depth!r} must be an int from 0 to {1 << 20}")
    decoded = _decode(insns)
    _check(decoded)
    helpers = {
        i: _helper(i, imm)
        for i, (code, _d, src, _o, imm) in enumerate(decoded)
        if code == isa.JMP | isa.CALL and src == 0
    }
    depth = -(-int(stack_depth) // 16) * 16
    prologue = bytes(_prologue(depth))
    out, starts = _emit_body(decoded, prologue, None, helpers)
    passes = 1
    while True:
        out, new = _emit_body(decoded, prologue, starts, helpers)
        passes += 1
        if new == starts:
            break
        if passes >= MAX_PASSES:  # sizes only shrink, so this cannot happen
            raise FilterError(f"JIT: jump sizes did not converge in {MAX_PASSES} passes")
        starts = new
    out += _epilogue(depth)
    return JitCode(bytes(out), starts, len(prologue), passes, depth)


def jit_compile(linked: LinkedProgram, *, inline: bool = True) -> JitCode:
    """Machine code for a verified, linked program (the code holds its
    addresses, so the returned object keeps ``linked`` alive).

    ``inline``: string-equality helper calls on static fields against
    literals become inline byte compares (:mod:`.inline`), as the kernel
    inlines helpers after verification."""
    from .inline import inline_string_helpers
    from .program import LinkedProgram

    if not isinstance(linked, LinkedProgram):
        raise FilterError(
            f"the JIT compiles linked programs only (Program.link() verifies and links), "
            f"not a {type(linked).__name__}"
        )
    insns = inline_string_helpers(linked) if inline else linked.insns
    jc = jit_insns(insns, stack_depth=int(linked.info.max_stack_depth))
    jc.program = linked
    return jc


class JitCode:
    """A compiled eBPF program in executable memory.

    ``address`` is ``int64 f(const void *event, const void *context)``;
    ``code_size`` its bytes; ``memory_bytes`` the mapping they live in;
    ``insn_offsets[i]`` where eBPF instruction ``i``'s code starts (then the
    epilogue's offset); ``passes`` how many emission passes the jump sizing
    took.
    """

    def __init__(
        self, code: bytes, starts: list[int], prologue_size: int, passes: int, stack_depth: int
    ) -> None:
        self._buffer = ExecBuffer(code)
        self.code = code
        self.code_size = len(code)
        self.memory_bytes = self._buffer.memory_bytes
        self.insn_offsets = np.array(starts, dtype=np.int64)
        self.prologue_size = prologue_size
        self.passes = passes
        self.stack_depth = stack_depth
        self.program: Any = None  # the LinkedProgram whose addresses the code holds
        self._fn: Callable[[int, int], int] = self._buffer.as_cfunc(
            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64
        )

    @property
    def address(self) -> int:
        return self._buffer.address

    def __call__(self, event: Any, context: Any = 0) -> int:
        """Run it; ``event``/``context`` are addresses (or objects with one:
        numpy arrays, ctypes instances, writable buffers).  R0 as a signed int."""
        from .program import address_of

        return int(self._fn(address_of(event), address_of(context)))

    def close(self) -> None:
        self._buffer.close()

    def __enter__(self) -> JitCode:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def disassemble(self) -> str:
        """The generated code in Intel syntax, one line per instruction
        (offset, bytes, text), under headings naming the eBPF instruction
        each sequence comes from."""
        import iced_x86 as iced

        fmt = iced.Formatter(iced.FormatterSyntax.INTEL)
        fmt.hex_prefix, fmt.hex_suffix = "0x", ""
        fmt.uppercase_hex = False
        fmt.branch_leading_zeros = False
        fmt.show_branch_size = False
        fmt.space_after_operand_separator = True
        fmt.memory_size_options = iced.MemorySizeOptions.ALWAYS  # the width of every access
        heads: dict[int, list[str]] = {0: ["prologue:"]}
        n = len(self.insn_offsets) - 1
        for i in range(n):
            heads.setdefault(int(self.insn_offsets[i]), []).append(f"insn {i}:")
        heads.setdefault(int(self.insn_offsets[n]), []).append("epilogue:")
        lines = []
        for ins in iced.Decoder(64, self.code, ip=0):
            start = ins.ip
            # Sequences of zero bytes (second ld_imm64 slots, jumps to the
            # next instruction) share a heading line with what follows.
            if start in heads:
                lines.append(" ".join(heads[start]))
            raw = self.code[start : start + ins.len].hex(" ")
            lines.append(f"  {start:#06x}  {raw:<30} {fmt.format(ins)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<JitCode {self.code_size} bytes at {self.address:#x}>"
