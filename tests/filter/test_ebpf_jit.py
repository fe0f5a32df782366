"""The eBPF -> x86-64 JIT against a Python model of eBPF semantics.

Most tests run one instruction inside a harness program: every register
R0-R9 starts with a known value (the operands from the event buffer, the
others sentinels), the instruction runs, and all ten registers are stored
back to the event buffer, so a test sees the result and any register the
sequence clobbered by mistake (rax/rdx around div, rcx around shifts).
"""

from __future__ import annotations

import ctypes
import os
import re
from functools import cache

import iced_x86 as iced
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.filter import abi, native
from hwtrace.filter.ebpf import isa
from hwtrace.filter.ebpf.isa import DW, R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10, B, H, W
from hwtrace.filter.ebpf.jit import REG_MAP, jit_insns
from hwtrace.filter.errors import FilterError
from hwtrace.filter.execmem import CODE_ALIGN, PAGE_SIZE, ExecBuffer
from hwtrace.filter.schema import DEFAULT_CONTEXT, Schema

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1
EDGES = [0, 1, 2, M64, 1 << 63, (1 << 63) - 1, 0x80000000, 0xFFFFFFFF, 0x7FFFFFFF, 0x100000000]
EDGES += [M64 - 0x7FFFFFFF, 63, 64, 31, 32]  # INT64_MIN/INT64_MAX as u64 are above
operand = st.one_of(st.sampled_from(EDGES), st.integers(0, M64))
imm32 = st.one_of(
    st.sampled_from([0, 1, -1, 2, 127, 128, -128, -129, (1 << 31) - 1, -(1 << 31)]),
    st.integers(-(1 << 31), (1 << 31) - 1),
)
reg = st.integers(0, 9)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

SENT = [(0xA5A5 << 48) | (k * 0x0101_0101_0101) for k in range(10)]
OUT, FLAG = 2, 12  # event words: operands at 0 and 1, R0-R9 at 2..11, jump flag at 12


def sx(v: int, bits: int) -> int:
    v &= (1 << bits) - 1
    return v - (1 << bits) if v >> (bits - 1) else v


# -- the model ---------------------------------------------------------------------


def alu_model(op: int, is64: bool, a: int, b: int) -> int:
    bits = 64 if is64 else 32
    m = (1 << bits) - 1
    a &= m
    b &= m
    n = b & (bits - 1)  # shift counts masked, as the kernel's interpreter
    r = {
        isa.ADD: lambda: a + b,
        isa.SUB: lambda: a - b,
        isa.MUL: lambda: a * b,
        isa.DIV: lambda: a // b if b else 0,
        isa.MOD: lambda: a % b if b else a,
        isa.OR: lambda: a | b,
        isa.AND: lambda: a & b,
        isa.XOR: lambda: a ^ b,
        isa.LSH: lambda: a << n,
        isa.RSH: lambda: a >> n,
        isa.ARSH: lambda: sx(a, bits) >> n,
        isa.NEG: lambda: -a,
        isa.MOV: lambda: b,
    }[op]()
    return r & m  # ALU32: zero-extended


def jmp_model(op: int, is32: bool, a: int, b: int) -> bool:
    bits = 32 if is32 else 64
    m = (1 << bits) - 1
    ua, ub = a & m, b & m
    sa, sb = sx(ua, bits), sx(ub, bits)
    return {
        isa.JEQ: ua == ub,
        isa.JNE: ua != ub,
        isa.JGT: ua > ub,
        isa.JGE: ua >= ub,
        isa.JLT: ua < ub,
        isa.JLE: ua <= ub,
        isa.JSGT: sa > sb,
        isa.JSGE: sa >= sb,
        isa.JSLT: sa < sb,
        isa.JSLE: sa <= sb,
        isa.JSET: (ua & ub) != 0,
    }[op]


def end_model(to_be: bool, width: int, a: int) -> int:
    v = a & ((1 << width) - 1)
    if to_be:
        v = int.from_bytes(v.to_bytes(width // 8, "little"), "big")
    return v


# -- the harness -------------------------------------------------------------------


def harness(dst: int, src: int, body: list) -> np.ndarray:
    """Registers set, ``body`` run, R0-R9 and the stack flag dumped."""
    items: list = [isa.stx(DW, R10, R1, -8), isa.st(DW, R10, -24, 0)]
    items += [isa.ld_imm64(k, SENT[k]) for k in range(10) if k not in (R1, dst, src)]
    if dst != R1:
        items.append(isa.ldx(DW, dst, R1, 0))
    if src not in (R1, dst):
        items.append(isa.ldx(DW, src, R1, 8))
    if dst == R1:
        items.append(isa.ldx(DW, R1, R1, 0))
    elif src == R1:
        items.append(isa.ldx(DW, R1, R1, 8))
    else:
        items += [isa.ld_imm64(R1, SENT[R1])]
    items += body
    items += [isa.stx(DW, R10, R0, -16), isa.ldx(DW, R0, R10, -8)]
    items += [isa.stx(DW, R0, k, 8 * (OUT + k)) for k in range(1, 10)]
    items += [isa.ldx(DW, R1, R10, -16), isa.stx(DW, R0, R1, 8 * OUT)]
    items += [isa.ldx(DW, R1, R10, -24), isa.stx(DW, R0, R1, 8 * FLAG), isa.exit_()]
    return isa.program(items)


@cache
def compiled(dst: int, src: int, body: tuple):
    return jit_insns(harness(dst, src, list(body)))


def run(dst: int, src: int, body: tuple, a: int, b: int) -> tuple[list[int], int]:
    """Registers R0-R9 after ``body`` and the flag; ``b`` is ignored when
    ``src == dst`` (the model then sees a == b)."""
    ev = np.zeros(16, dtype=np.uint64)
    ev[0], ev[1] = a, b
    compiled(dst, src, body)(ev.ctypes.data, 0)
    return [int(x) for x in ev[OUT : OUT + 10]], int(ev[FLAG])


def expect_regs(regs: list[int], dst: int, src: int, a: int, b: int, result: int) -> None:
    want = list(SENT)
    want[src] = b
    want[dst] = result
    assert regs == want, [f"r{k}: {x:#x} want {y:#x}" for k, (x, y) in enumerate(zip(regs, want, strict=True)) if x != y]  # fmt: skip


# -- ALU ---------------------------------------------------------------------------

BINARY = [isa.ADD, isa.SUB, isa.MUL, isa.DIV, isa.MOD, isa.OR, isa.AND, isa.XOR]
SHIFTS = [isa.LSH, isa.RSH, isa.ARSH]


@pytest.mark.parametrize("cls", [isa.ALU64, isa.ALU], ids=["alu64", "alu32"])
@pytest.mark.parametrize("op", [*BINARY, *SHIFTS, isa.MOV], ids=lambda o: isa.ALU_NAMES[o])
@FAST
@given(dst=reg, src=reg, a=operand, b=operand)
def test_alu_reg(cls, op, dst, src, a, b):
    if src == dst:
        b = a
    regs, _ = run(dst, src, (isa.insn(cls | op | isa.X, dst, src),), a, b)
    expect_regs(regs, dst, src, a, b, alu_model(op, cls == isa.ALU64, a, b))


@pytest.mark.parametrize("cls", [isa.ALU64, isa.ALU], ids=["alu64", "alu32"])
@pytest.mark.parametrize("op", [*BINARY, isa.MOV], ids=lambda o: isa.ALU_NAMES[o])
@FAST
@given(dst=reg, a=operand, imm=imm32)
def test_alu_imm(cls, op, dst, a, imm):
    src = (dst + 1) % 10  # untouched: keeps its sentinel
    regs, _ = run(dst, src, (isa.insn(cls | op | isa.K, dst, 0, 0, imm),), a, SENT[src])
    expect_regs(regs, dst, src, a, SENT[src], alu_model(op, cls == isa.ALU64, a, imm))


@pytest.mark.parametrize("cls", [isa.ALU64, isa.ALU], ids=["alu64", "alu32"])
@pytest.mark.parametrize("op", SHIFTS, ids=lambda o: isa.ALU_NAMES[o])
@FAST
@given(dst=reg, a=operand, data=st.data())
def test_shift_imm(cls, op, dst, a, data):
    bits = 64 if cls == isa.ALU64 else 32
    imm = data.draw(st.integers(0, bits - 1))  # the verifier's range
    src = (dst + 1) % 10
    regs, _ = run(dst, src, (isa.insn(cls | op | isa.K, dst, 0, 0, imm),), a, SENT[src])
    expect_regs(regs, dst, src, a, SENT[src], alu_model(op, bits == 64, a, imm))


@pytest.mark.parametrize("cls", [isa.ALU64, isa.ALU], ids=["alu64", "alu32"])
@pytest.mark.parametrize("op", SHIFTS, ids=lambda o: isa.ALU_NAMES[o])
@pytest.mark.parametrize(
    "dst,src", [(R4, R1), (R1, R4), (R4, R4), (R0, R3), (R3, R0), (R9, R5), (R4, R9)]
)
def test_shift_by_register_rcx(cls, op, dst, src):
    # R4 is rcx and the count must be in cl: R4 as count, as dst, as both.
    for a, b in [(0x8000_0000_F0F0_1234, 3), (M64, 63), (1, 64 + 5), (0x80000000, 31), (5, 0)]:
        if src == dst:
            b = a
        regs, _ = run(dst, src, (isa.insn(cls | op | isa.X, dst, src),), a, b)
        expect_regs(regs, dst, src, a, b, alu_model(op, cls == isa.ALU64, a, b))


@pytest.mark.parametrize("cls", [isa.ALU64, isa.ALU], ids=["alu64", "alu32"])
@pytest.mark.parametrize("op", [isa.DIV, isa.MOD], ids=["div", "mod"])
@pytest.mark.parametrize("dst", range(10))
@pytest.mark.parametrize("src", [R0, R3, R4, R6])
def test_div_mod_registers_and_zero(cls, op, dst, src):
    # x86 div uses rdx:rax (R3, R0): every pairing, zero divisors included.
    cases = [
        (100, 7),
        (M64, 3),
        (5, 0),
        (M64, 0),
        (1 << 63, M64),
        (0xFFFF_FFFF_0000_0007, 0x1_0000_0000),
    ]
    for a, b in cases:  # the last: a 32-bit zero divisor whose register is not 0
        if src == dst:
            b = a
        regs, _ = run(dst, src, (isa.insn(cls | op | isa.X, dst, src),), a, b)
        expect_regs(regs, dst, src, a, b, alu_model(op, cls == isa.ALU64, a, b))


@pytest.mark.parametrize("cls", [isa.ALU64, isa.ALU], ids=["alu64", "alu32"])
@FAST
@given(dst=reg, a=operand)
def test_neg(cls, dst, a):
    src = (dst + 1) % 10
    regs, _ = run(dst, src, (isa.insn(cls | isa.NEG, dst),), a, SENT[src])
    expect_regs(regs, dst, src, a, SENT[src], alu_model(isa.NEG, cls == isa.ALU64, a, 0))


@pytest.mark.parametrize("to_be", [False, True], ids=["le", "be"])
@pytest.mark.parametrize("width", [16, 32, 64])
@FAST
@given(dst=reg, a=operand)
def test_end(to_be, width, dst, a):
    src = (dst + 1) % 10
    code = isa.ALU | isa.END | (isa.X if to_be else isa.K)
    regs, _ = run(dst, src, (isa.insn(code, dst, 0, 0, width),), a, SENT[src])
    expect_regs(regs, dst, src, a, SENT[src], end_model(to_be, width, a))


@pytest.mark.parametrize("width", [16, 32, 64])
def test_alu64_end_swaps_unconditionally(width):
    a = 0x0102_0304_0506_0708
    regs, _ = run(R5, R6, (isa.insn(isa.ALU64 | isa.END, R5, 0, 0, width),), a, SENT[R6])
    expect_regs(regs, R5, R6, a, SENT[R6], end_model(True, width, a))


@FAST
@given(dst=reg, value=operand)
def test_ld_imm64(dst, value):
    src = (dst + 1) % 10
    regs, _ = run(dst, src, tuple(isa.ld_imm64(dst, value)), 0, SENT[src])
    expect_regs(regs, dst, src, 0, SENT[src], value)


# -- jumps ------------------------------------------------------------------------

CONDS = [isa.JEQ, isa.JNE, isa.JGT, isa.JGE, isa.JLT, isa.JLE]
CONDS += [isa.JSGT, isa.JSGE, isa.JSLT, isa.JSLE, isa.JSET]


def jump_body(first) -> tuple:
    # taken: flag = 1; not taken: flag stays 0.
    return (first, isa.ja(1), isa.st(DW, R10, -24, 1))


@pytest.mark.parametrize("cls", [isa.JMP, isa.JMP32], ids=["jmp", "jmp32"])
@pytest.mark.parametrize("op", CONDS, ids=lambda o: isa.JMP_NAMES[o])
@FAST
@given(dst=reg, src=reg, a=operand, b=operand)
def test_jump_reg(cls, op, dst, src, a, b):
    if src == dst:
        b = a
    regs, flag = run(dst, src, jump_body(isa.insn(cls | op | isa.X, dst, src, 1)), a, b)
    expect_regs(regs, dst, src, a, b, a)
    assert flag == jmp_model(op, cls == isa.JMP32, a, b)


@pytest.mark.parametrize("cls", [isa.JMP, isa.JMP32], ids=["jmp", "jmp32"])
@pytest.mark.parametrize("op", CONDS, ids=lambda o: isa.JMP_NAMES[o])
@FAST
@given(dst=reg, a=operand, imm=imm32)
def test_jump_imm(cls, op, dst, a, imm):
    src = (dst + 1) % 10
    regs, flag = run(dst, src, jump_body(isa.insn(cls | op | isa.K, dst, 0, 1, imm)), a, SENT[src])
    expect_regs(regs, dst, src, a, SENT[src], a)
    assert flag == jmp_model(op, cls == isa.JMP32, a, imm)


@pytest.mark.parametrize("cls", [isa.JMP, isa.JMP32], ids=["jmp", "jmp32"])
@pytest.mark.parametrize("op", CONDS, ids=lambda o: isa.JMP_NAMES[o])
def test_jump_edges(cls, op):
    # Every pair of edge values, both operand forms.
    edges = [0, 1, M64, 1 << 63, (1 << 63) - 1, 0x80000000, 0xFFFFFFFF, 0x7FFFFFFF]
    for a in edges:
        for b in edges:
            _, flag = run(R2, R4, jump_body(isa.insn(cls | op | isa.X, R2, R4, 1)), a, b)
            assert flag == jmp_model(op, cls == isa.JMP32, a, b), (hex(a), hex(b))
        for imm in [0, 1, -1, -(1 << 31), (1 << 31) - 1]:
            _, flag = run(R0, R5, jump_body(isa.insn(cls | op | isa.K, R0, 0, 1, imm)), a, SENT[R5])
            assert flag == jmp_model(op, cls == isa.JMP32, a, imm), (hex(a), imm)


@pytest.mark.parametrize("n", [0, 1, 20, 24, 25, 26, 27, 40])
def test_jump_distances_around_rel8(n):
    # n 5-byte movs between a conditional jump and its target: rel8 up to
    # 127 bytes, rel32 beyond; and a JA back over them.
    prog = isa.program(
        [isa.mov_imm(R0, 5), isa.jmp(isa.JEQ, R1, 0, n + 1, reg=False)]
        + [isa.mov_imm(R0, 1000 + k) for k in range(n)]
        + [isa.exit_(), isa.mov_imm(R0, 7), isa.ja(-(n + 3))]
    )
    jc = jit_insns(prog)
    assert jc(1) == (1000 + n - 1 if n else 5)
    assert jc(0) == (1000 + n - 1 if n else 7)
    kinds = (iced.FlowControl.CONDITIONAL_BRANCH, iced.FlowControl.UNCONDITIONAL_BRANCH)
    jcc, leave, back = [i for i in iced.Decoder(64, jc.code) if i.flow_control in kinds]
    assert jcc.near_branch_target == jc.insn_offsets[n + 3]
    assert leave.near_branch_target == jc.insn_offsets[-1]  # exit: to the epilogue
    assert back.near_branch_target == jc.insn_offsets[2]
    for ins in (jcc, leave, back):
        rel = ins.near_branch_target - ins.next_ip
        short = ins.len == 2
        assert short == (-128 <= rel <= 127)  # the shortest form that fits


def test_ja_zero_and_gotol():
    prog = isa.program(
        [isa.mov_imm(R0, 1), isa.ja(0), isa.insn(isa.JMP32 | isa.JA, 0, 0, 0, 1)]
        + [isa.mov_imm(R0, 2), isa.exit_()]
    )
    assert jit_insns(prog)(0) == 1


# -- memory -----------------------------------------------------------------------

SIZES = [B, H, W, DW]
sizes = st.sampled_from(SIZES)
NBYTES = {B: 1, H: 2, W: 4, DW: 8}


def distinct_regs(k: int):
    return st.lists(st.integers(0, 9), min_size=k, max_size=k, unique=True)


@FAST
@given(
    size=sizes,
    regs=distinct_regs(2),
    off=st.integers(-8, 40),
    data=st.binary(min_size=64, max_size=64),
)
def test_ldx_event(size, regs, off, data):
    dst, base = regs
    buf = (ctypes.c_uint8 * 64).from_buffer_copy(data)
    start = ctypes.addressof(buf) + 16  # room for negative offsets
    prog = isa.program(
        [isa.mov(base, R1), isa.ldx(size, dst, base, off), isa.mov(R0, dst), isa.exit_()]
    )
    got = jit_insns(prog)(start) & M64
    n = NBYTES[size]
    assert got == int.from_bytes(data[16 + off : 16 + off + n], "little")  # zero-extended


@FAST
@given(size=sizes, regs=distinct_regs(2), off=st.integers(-8, 40), value=operand)
def test_stx_event(size, regs, off, value):
    # Byte stores from R1/R2 (rdi/rsi) need a REX prefix to reach dil/sil.
    dst, src = regs
    buf = (ctypes.c_uint8 * 64)(*range(64))
    before = bytes(buf)
    start = ctypes.addressof(buf) + 16
    prog = isa.program([isa.mov(dst, R1), isa.ld_imm64(src, value), isa.stx(size, dst, src, off), isa.mov_imm(R0, 0), isa.exit_()])  # fmt: skip
    jit_insns(prog)(start)
    n = NBYTES[size]
    want = bytearray(before)
    want[16 + off : 16 + off + n] = (value & ((1 << 8 * n) - 1)).to_bytes(n, "little")
    assert bytes(buf) == bytes(want)


@FAST
@given(size=sizes, dst=reg, off=st.integers(-8, 40), imm=imm32)
def test_st_event(size, dst, off, imm):
    buf = (ctypes.c_uint8 * 64)(*range(64))
    before = bytes(buf)
    start = ctypes.addressof(buf) + 16
    prog = isa.program(
        [isa.mov(dst, R1), isa.st(size, dst, off, imm), isa.mov_imm(R0, 0), isa.exit_()]
    )
    jit_insns(prog)(start)
    n = NBYTES[size]
    want = bytearray(before)
    want[16 + off : 16 + off + n] = (imm & ((1 << 8 * n) - 1)).to_bytes(
        n, "little"
    )  # DW: sign-extended
    assert bytes(buf) == bytes(want)


@FAST
@given(store=sizes, load=sizes, regs=distinct_regs(2), at=st.integers(1, 64), value=operand, imm=imm32)  # fmt: skip
def test_stack_store_then_load(store, load, regs, at, value, imm):
    # Through R10 (rbp): a register (STX) and an immediate (ST) stored at one
    # width, read back at another, over 8 zeroed bytes.
    src, dst = regs
    off = -8 * at
    stx_prog = isa.program(
        [isa.st(DW, R10, off, 0), isa.ld_imm64(src, value), isa.stx(store, R10, src, off)]
        + [isa.ldx(load, dst, R10, off), isa.mov(R0, dst), isa.exit_()]
    )
    st_prog = isa.program(
        [isa.st(DW, R10, off, 0), isa.st(store, R10, off, imm), isa.ldx(load, dst, R10, off)]
        + [isa.mov(R0, dst), isa.exit_()]
    )
    ns, nl = NBYTES[store], NBYTES[load]
    for prog, v in [(stx_prog, value), (st_prog, imm)]:
        mem = bytearray(8)
        mem[:ns] = (v & ((1 << 8 * ns) - 1)).to_bytes(ns, "little")
        assert jit_insns(prog)(0) & M64 == int.from_bytes(mem[:nl], "little")


@pytest.mark.parametrize("size", [W, DW])
def test_atomic_add(size):
    buf = (ctypes.c_uint64 * 2)(0xFFFF_FFFF_FFFF_FFF0, 5)
    prog = isa.program(
        [isa.mov_imm(R3, 0x20), isa.insn(isa.STX | isa.ATOMIC | size, R1, R3, 0, isa.ADD)]
        + [isa.mov_imm(R0, 0), isa.exit_()]
    )
    jit_insns(prog)(ctypes.addressof(buf))
    want = 0x10 if size == DW else 0xFFFF_FFFF_0000_0010  # W: only the low half adds
    assert buf[0] == want and buf[1] == 5


# -- helpers ----------------------------------------------------------------------


def test_helper_threshold_calls():
    table = native.threshold_table()
    key, value = 77, -123456789012345
    prog = isa.program(
        [isa.mov_imm(R1, key), isa.ld_imm64(R2, value), isa.call(abi.HELPER_SET_THRESHOLD)]
        + [isa.mov(R6, R0), isa.mov_imm(R1, key), isa.call(abi.HELPER_GET_THRESHOLD)]
        + [isa.alu64(isa.ADD, R0, R6, reg=True), isa.exit_()]
    )
    old = int(table[key])
    try:
        assert jit_insns(prog)(0) == value  # set returned 0
        assert int(table[key]) == value
    finally:
        table[key] = old


def test_helper_get_pid():
    prog = isa.program([isa.call(abi.HELPER_GET_PID), isa.exit_()])
    assert jit_insns(prog)(0) == os.getpid()


EVENT = Schema.declare("ev", [("comm", "char[16]"), ("n", "s64"), ("out", "s64[8]")])
COMM = EVENT.resolve(("comm",))
PROCNAME = DEFAULT_CONTEXT.resolve(("procname",))


def str_eq_program(path_code: np.ndarray, lit: np.ndarray, n: int) -> np.ndarray:
    """str_eq(R1, R2, path, lit, n) with R6-R9 live across the call; stores
    R0 and R6-R9 after it into the event's ``out``."""
    out = EVENT.field("out").offset
    return isa.program(
        [isa.mov(R6, R1), isa.mov(R7, R2), isa.ld_imm64(R8, SENT[8]), isa.ld_imm64(R9, SENT[9])]
        + [isa.ld_imm64(R3, path_code.ctypes.data), isa.ld_imm64(R4, lit.ctypes.data)]
        + [isa.mov_imm(R5, n), isa.call(abi.HELPER_STR_EQ)]
        + [isa.stx(DW, R6, k, out + 8 * i) for i, k in enumerate([R0, R6, R7, R8, R9])]
        + [isa.exit_()]
    )


@pytest.mark.parametrize("path", [COMM, PROCNAME], ids=["event", "context"])
@pytest.mark.parametrize("text", [b"bash", b"bas", b"bashh", b""])
def test_helper_five_arguments_and_callee_saved(path, text):
    ev = np.zeros(EVENT.size // 8, dtype=np.int64)
    ctx = np.zeros(DEFAULT_CONTEXT.size, dtype=np.uint8)
    ev.view(np.uint8)[:4] = np.frombuffer(b"bash", np.uint8)
    ctx[:4] = np.frombuffer(b"bash", np.uint8)
    lit = np.frombuffer(text + b"\0", np.uint8).copy()
    code = path.code.copy()
    prog = str_eq_program(code, lit, len(text))
    jc = jit_insns(prog)
    jc(ev.ctypes.data, ctx.ctypes.data)
    out = ev[EVENT.field("out").offset // 8 :][:5].tolist()
    assert out[0] == int(text == b"bash")
    assert out[1:] == [ev.ctypes.data, ctx.ctypes.data, sx(SENT[8], 64), sx(SENT[9], 64)]


def test_unknown_helper_is_reported_with_index():
    with pytest.raises(FilterError, match=r"insn 1: call to unknown helper 999") as e:
        jit_insns(isa.program([isa.mov_imm(R0, 0), isa.call(999), isa.exit_()]))
    assert e.value.where == "insn 1"


# -- programs ---------------------------------------------------------------------

FIG6 = isa.program(
    [isa.ldx(DW, R1, R1, 0), isa.mov_imm(R2, 42), isa.jmp(isa.JEQ, R1, R2, 2, reg=True)]
    + [isa.mov_imm(R0, 0), isa.exit_(), isa.mov_imm(R0, 1), isa.exit_()]
)


@FAST
@given(field0=st.one_of(st.just(42), st.integers(-(1 << 63), (1 << 63) - 1)))
def test_fig6_field0_equals_42(field0):
    jc = fig6()
    ev = (ctypes.c_int64 * 1)(field0)
    assert jc(ctypes.addressof(ev)) == int(field0 == 42)


@cache
def fig6():
    return jit_insns(FIG6)


def test_disassembly_shows_frame():
    text = fig6().disassemble()
    lines = text.splitlines()
    assert lines[0] == "prologue:"
    body = "\n".join(lines[: lines.index("insn 0:")])
    assert "push rbp" in body and "mov rbp, rsp" in body and "sub rsp, 0x220" in body
    for r in ("rbx", "r13", "r14", "r15"):
        assert re.search(rf"mov qword ptr \[rbp-0x2[0-9a-f]+\], {r}$", body, re.M), r
    epi = text[text.index("epilogue:") :]
    for r in ("rbx", "r13", "r14", "r15"):
        assert re.search(rf"mov {r}, qword ptr \[rbp-0x2[0-9a-f]+\]$", epi, re.M), r
    assert epi.rstrip().endswith("ret") and "leave" in epi
    assert "mov rdi, qword ptr [rdi]" in text and "cmp rdi, rsi" in text


def test_stack_depth_and_alignment():
    # System V wants rsp 16-byte aligned at a call.  R10 (rbp) returned as
    # R0 shows the frame base (entry rsp - 8) is aligned, and the frame
    # below it is a multiple of 16: so rsp at a helper call is aligned.
    leak_r10 = isa.program([isa.mov(R0, R10), isa.call(abi.HELPER_GET_PID), isa.mov(R0, R10), isa.exit_()])  # fmt: skip
    for depth, frame in [(0, 32), (8, 48), (16, 48), (100, 144), (512, 544)]:
        jc = jit_insns(FIG6, stack_depth=depth)
        assert jc.stack_depth == -(-depth // 16) * 16
        assert re.search(rf"sub rsp, {frame:#x}$", jc.disassemble(), re.M)
        assert jc(ctypes.addressof((ctypes.c_int64 * 1)(42))) == 1
        assert jit_insns(leak_r10, stack_depth=depth)(0) % 16 == 0
    # The spills of rbx/r13/r14/r15 are below the 512-byte eBPF stack:
    # filling all of it must leave the caller's registers (restored from
    # the spills on return) intact, and R6-R9 live in registers meanwhile.
    fill = [isa.st(DW, R10, -8 * k, -1) for k in range(1, 65)]
    prog = isa.program(
        [isa.mov_imm(R6, 6), isa.mov_imm(R7, 7), isa.mov_imm(R8, 8), isa.mov_imm(R9, 9), *fill]
        + [isa.mov(R0, R6), isa.alu64(isa.ADD, R0, R7, reg=True)]
        + [isa.alu64(isa.ADD, R0, R8, reg=True), isa.alu64(isa.ADD, R0, R9, reg=True), isa.exit_()]
    )
    assert jit_insns(prog)(0) == 30


def chain_program(
    n: int, path_code: np.ndarray, lits: np.ndarray, width: int, length: int
) -> np.ndarray:
    """A TRUE-biased AND chain of ``n`` str_eq predicates (the benchmark
    shape of Fig. 10 of Sharma and Dagenais, JCST 2016): each calls the
    helper and leaves on a mismatch."""
    items: list = [isa.mov(R6, R1), isa.mov(R7, R2)]
    per = 9  # slots per predicate
    for k in range(n):
        items += [isa.mov(R1, R6), isa.mov(R2, R7), isa.ld_imm64(R3, path_code.ctypes.data)]
        items += [isa.ld_imm64(R4, lits.ctypes.data + k * width), isa.mov_imm(R5, length)]
        items += [isa.call(abi.HELPER_STR_EQ), isa.jmp(isa.JNE, R0, 1, per * (n - k - 1) + 2, reg=False)]  # fmt: skip
    items += [isa.mov_imm(R0, 1), isa.exit_(), isa.mov_imm(R0, 0), isa.exit_()]
    return isa.program(items)


def test_fifty_predicate_str_eq_chain():
    n, width = 50, 8
    lits = np.zeros(n * width, np.uint8)
    for k in range(n):
        lits[k * width : k * width + 4] = np.frombuffer(b"bash", np.uint8)
    code = COMM.code.copy()
    jc = jit_insns(chain_program(n, code, lits, width, 4))
    ev = np.zeros(EVENT.size, np.uint8)
    ev[:4] = np.frombuffer(b"bash", np.uint8)
    assert jc(ev.ctypes.data) == 1
    for k in (0, 17, 49):  # one predicate false: the chain is false
        lits[k * width] = ord("c")
        assert jc(ev.ctypes.data) == 0
        lits[k * width] = ord("b")
    # Near the end the exits fit rel8, early ones need rel32.
    jccs = [i for i in iced.Decoder(64, jc.code) if i.is_jcc_short_or_near]
    assert len(jccs) == n and jccs[0].len == 6 and jccs[-1].len == 2
    assert jc.passes >= 2


# -- properties of the code and its memory -----------------------------------------


def test_every_byte_decodes():
    for prog in [FIG6, harness(R4, R0, [isa.insn(isa.ALU | isa.MOD | isa.X, R4, R0)])]:
        jc = jit_insns(prog)
        decoded = list(iced.Decoder(64, jc.code))
        assert all(not i.is_invalid for i in decoded)
        assert sum(i.len for i in decoded) == jc.code_size


def test_exec_buffer_layout_and_protection():
    code = bytes.fromhex("488d0437c3")  # lea rax, [rdi+rsi]; ret
    offsets = set()
    for _ in range(8):
        with ExecBuffer(code) as buf:
            assert buf.address % CODE_ALIGN == 0 and buf.memory_bytes % PAGE_SIZE == 0
            assert buf.offset + len(code) <= buf.memory_bytes
            mapping = buf.mapping()
            assert mapping[buf.offset : buf.offset + len(code)] == code
            assert mapping.count(0xCC) == buf.memory_bytes - len(code)
            assert buf.as_cfunc(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(40, 2) == 42
            perms = mapping_perms(buf.base)
            assert perms.startswith("r-x"), perms  # W^X: not writable once executable
            offsets.add(buf.offset)
        assert buf.closed and mapping_perms(buf._base) is None
    assert len(offsets) > 1  # randomised
    with ExecBuffer(code, randomize=False) as buf:
        assert buf.offset == 0


def mapping_perms(address: int) -> str | None:
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return line.split()[1]
    return None


def test_exec_buffer_keeps_alive_through_cfunc():
    fn = ExecBuffer(bytes.fromhex("4889f8c3")).as_cfunc(ctypes.c_int64, ctypes.c_int64)
    import gc

    gc.collect()
    assert fn(1234) == 1234


def test_exec_buffer_rejects_empty():
    with pytest.raises(ValueError, match="no code"):
        ExecBuffer(b"")


# -- bad input --------------------------------------------------------------------


@pytest.mark.parametrize(
    "items,where,message",
    [
        ([isa.ja(5), isa.exit_()], "insn 0", "outside the program"),
        ([isa.ja(1), *isa.ld_imm64(R0, 1), isa.exit_()], "insn 0", "second slot"),
        ([isa.insn(isa.LD | isa.DW | isa.IMM, R0, 0, 0, 1)], "insn 0", "second slot"),
        (
            [isa.mov_imm(R0, 0), isa.insn(isa.ALU64 | 0xE0, R0), isa.exit_()],
            "insn 1",
            "unknown ALU",
        ),
        (
            [isa.insn(isa.ALU64 | isa.MOV | isa.X, 11, 0), isa.exit_()],
            "insn 0",
            "r11 does not exist",
        ),
        ([*isa.ld_pseudo(R1, abi.PSEUDO_RODATA, 0), isa.exit_()], "insn 0", "link the program"),
        ([isa.insn(isa.LD | isa.ABS | isa.W), isa.exit_()], "insn 0", "LD ABS"),
        ([isa.insn(isa.ALU | isa.END, R0, 0, 0, 8), isa.exit_()], "insn 0", "byte swap width 8"),
        ([isa.mov_imm(R0, 0), isa.insn(isa.JMP | 0xE0), isa.exit_()], "insn 1", "unknown jump"),
        ([isa.insn(isa.JMP | isa.CALL, 0, 1, 0, 2), isa.exit_()], "insn 0", "eBPF-to-eBPF"),
    ],
)
def test_bad_input_names_the_instruction(items, where, message):
    with pytest.raises(FilterError, match=message) as e:
        jit_insns(isa.program(items))
    assert e.value.where == where


def test_bad_arguments():
    with pytest.raises(FilterError, match="empty"):
        jit_insns(np.zeros(0, dtype=abi.INSN))
    with pytest.raises(FilterError, match=r"abi\.INSN"):
        jit_insns(np.zeros(4, dtype=np.int64))
    with pytest.raises(FilterError, match="stack depth"):
        jit_insns(FIG6, stack_depth=-1)


def test_register_map_is_table_1():
    names = "rax rcx rdx rbx rsp rbp rsi rdi r8 r9 r10 r11 r12 r13 r14 r15".split()
    assert [names[r] for r in REG_MAP] == "rax rdi rsi rdx rcx r8 rbx r13 r14 r15 rbp".split()


# -- random programs ----------------------------------------------------------------


def model_run(insns: np.ndarray) -> int:
    """R0 of an ALU/JMP/ld_imm64 program under the model (u64)."""
    code, dst, src, off, imm = (c.tolist() for c in isa.fields(insns))
    r = [0] * 11
    pc = 0
    while True:
        c, d, s = code[pc], dst[pc], src[pc]
        cls, op = c & 7, c & 0xF0
        if c == isa.LD | DW | isa.IMM:
            r[d] = (imm[pc] & M32) | ((imm[pc + 1] & M32) << 32)
            pc += 2
            continue
        b = r[s] if c & isa.X else imm[pc] & M64
        if cls in (isa.ALU, isa.ALU64):
            if op == isa.END:
                r[d] = end_model(bool(c & isa.X), imm[pc], r[d])
            else:
                r[d] = alu_model(op, cls == isa.ALU64, r[d], b)
        elif op == isa.EXIT:
            return r[0]
        elif op == isa.JA or jmp_model(op, cls == isa.JMP32, r[d], b):
            pc += off[pc]
        pc += 1


@st.composite
def programs(draw) -> np.ndarray:
    """Verifiable straight-line-and-forward-jump programs: every register
    set first, then ALU, byte-swap, conditional jumps and exits."""
    n = draw(st.integers(1, 30))
    items: list = [isa.ld_imm64(k, draw(operand)) for k in range(10)]
    for i in range(n):
        kind = draw(st.sampled_from(["alu", "alu", "alu", "jmp", "jmp", "end", "exit"]))
        d, s = draw(reg), draw(reg)
        if kind == "alu":
            cls = draw(st.sampled_from([isa.ALU64, isa.ALU]))
            op = draw(st.sampled_from([*BINARY, *SHIFTS, isa.MOV, isa.NEG]))
            if op == isa.NEG:
                items.append(isa.insn(cls | op, d))
            elif draw(st.booleans()):
                items.append(isa.insn(cls | op | isa.X, d, s))
            else:
                if op in SHIFTS:
                    imm = draw(st.integers(0, 63 if cls == isa.ALU64 else 31))
                else:
                    imm = draw(imm32.filter(lambda v: v != 0) if op in (isa.DIV, isa.MOD) else imm32)  # fmt: skip
                items.append(isa.insn(cls | op | isa.K, d, 0, 0, imm))
        elif kind == "end":
            to_be = draw(st.booleans())
            items.append(isa.insn(isa.ALU | isa.END | (isa.X if to_be else isa.K), d, 0, 0, draw(st.sampled_from([16, 32, 64]))))  # fmt: skip
        elif kind == "jmp":
            cls = draw(st.sampled_from([isa.JMP, isa.JMP32]))
            op = draw(st.sampled_from([*CONDS, isa.JA] if cls == isa.JMP else CONDS))
            off = draw(st.integers(i + 1, n)) - i - 1
            if op == isa.JA:
                items.append(isa.ja(off))
            elif draw(st.booleans()):
                items.append(isa.insn(cls | op | isa.X, d, s, off))
            else:
                items.append(isa.insn(cls | op | isa.K, d, 0, off, draw(imm32)))
        else:
            items.append(isa.exit_())
    items.append(isa.exit_())
    return isa.program(items)


@settings(max_examples=200, deadline=None)
@given(prog=programs())
def test_random_programs_match_the_model(prog):
    assert jit_insns(prog, stack_depth=0)(0) & M64 == model_run(prog)


@settings(max_examples=100, deadline=None)
@given(prog=programs())
def test_random_verified_programs_match_the_interpreter(prog):
    interp = pytest.importorskip("hwtrace.filter.ebpf.interp")
    from hwtrace.filter.ebpf.jit import jit_compile
    from hwtrace.filter.ebpf.program import Program

    linked = Program(prog, event_size=8).link()  # the verifier must accept it
    jc = jit_compile(linked)
    assert jc.program is linked
    want = int(interp.run(linked.address, linked.count, 0, 0))
    assert jc(0) == want == sx(model_run(prog), 64)


def test_jit_compile_linked_fig6():
    from hwtrace.filter.ebpf.jit import jit_compile
    from hwtrace.filter.ebpf.program import Program

    linked = Program(FIG6, event_size=8).link()
    jc = jit_compile(linked)
    assert (
        jc.stack_depth == 0 and jc.code_size < jit_insns(FIG6).code_size
    )  # no stack, disp8 spills
    for v in (42, 41, -42):
        assert jc(ctypes.addressof((ctypes.c_int64 * 1)(v))) == int(v == 42)


def test_jit_compile_takes_linked_programs_only():
    from hwtrace.filter.ebpf.jit import jit_compile
    from hwtrace.filter.ebpf.program import Program

    with pytest.raises(FilterError, match=r"linked programs only \(Program\.link\(\)"):
        jit_compile(Program(FIG6, event_size=8))  # type: ignore[arg-type]


@pytest.mark.parametrize("size", SIZES, ids=["b", "h", "w", "dw"])
def test_memory_every_register_pair(size):
    # Every base register (rbp and r13 have no displacement-free form, rsi
    # and rdi need REX for byte stores) at offset 0 and a disp32 offset.
    n = NBYTES[size]
    buf = (ctypes.c_uint8 * 1024)(*[(7 * k + 3) & 0xFF for k in range(1024)])
    base_addr = ctypes.addressof(buf) + 512
    for off in (0, -300):
        for dst in range(10):
            for base in range(10):
                if dst == base:
                    continue
                want = int.from_bytes(bytes(buf)[512 + off : 512 + off + n], "little")
                prog = isa.program([isa.mov(base, R1), isa.ldx(size, dst, base, off), isa.mov(R0, dst), isa.exit_()])  # fmt: skip
                assert jit_insns(prog)(base_addr) & M64 == want, (dst, base, off)
                value = 0x8192_A3B4_C5D6_E7F8 ^ (dst << 8 | base)
                prog = isa.program([isa.mov(base, R1), isa.ld_imm64(dst, value), isa.stx(size, base, dst, off), isa.exit_()])  # fmt: skip
                jit_insns(prog)(base_addr)
                got = int.from_bytes(bytes(buf)[512 + off : 512 + off + n], "little")
                assert got == value & ((1 << 8 * n) - 1), (dst, base, off)
