"""The numba eBPF interpreter: every ALU and jump opcode against Python
expectations, memory of every width, helpers on real records, the Fig. 6
filter of Sharma and Dagenais ("Enhanced Userspace and In-Kernel Trace
Filtering for Production Systems", JCST 2016), ELF objects from LLVM's BPF
back end, the C entry point, and a fuzz test (verified programs never crash
the interpreter)."""

from __future__ import annotations

import ctypes
import os
import pickle
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.filter import abi, native
from hwtrace.filter.ebpf import interp, isa
from hwtrace.filter.ebpf.asm import assemble, listing
from hwtrace.filter.ebpf.program import LinkedProgram, Program
from hwtrace.filter.errors import FilterError, VerifierError
from hwtrace.filter.packing import EventRecord
from hwtrace.filter.schema import DEFAULT_CONTEXT, IntType, Schema, SequenceType

M64 = (1 << 64) - 1
u64s = st.one_of(
    st.integers(0, M64),
    st.sampled_from(
        [
            0,
            1,
            2,
            31,
            32,
            63,
            64,
            0x7FFFFFFF,
            0x80000000,
            0xFFFFFFFF,
            1 << 32,
            1 << 63,
            M64,
            M64 - 1,
        ]
    ),
)
s32s = st.one_of(
    st.integers(-(1 << 31), (1 << 31) - 1), st.sampled_from([0, 1, -1, 31, 32, 63, -(1 << 31)])
)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def prog(text: str, event_size: int = 64, **kw) -> LinkedProgram:
    return Program(assemble(text), event_size=event_size, **kw).link()


def signed64(v: int) -> int:
    v &= M64
    return v - (1 << 64) if v >> 63 else v


# -- a plain-Python model of the ALU and the jumps (written from the ISA doc) ---------


def expect_alu(name: str, bits: int, a: int, b: int) -> int:
    m = (1 << bits) - 1
    a, b = a & m, b & m
    sa = a - (1 << bits) if a >> (bits - 1) else a
    n = b % bits
    r = {
        "add": lambda: a + b,
        "sub": lambda: a - b,
        "mul": lambda: a * b,
        "div": lambda: a // b if b else 0,
        "mod": lambda: a % b if b else a,
        "or": lambda: a | b,
        "and": lambda: a & b,
        "xor": lambda: a ^ b,
        "lsh": lambda: a << n,
        "rsh": lambda: a >> n,
        "arsh": lambda: sa >> n,
        "mov": lambda: b,
        "neg": lambda: -a,
    }[name]()
    return r & m


def expect_jump(name: str, bits: int, a: int, b: int) -> bool:
    m = (1 << bits) - 1
    a, b = a & m, b & m
    sa = a - (1 << bits) if a >> (bits - 1) else a
    sb = b - (1 << bits) if b >> (bits - 1) else b
    return {
        "==": a == b,
        "!=": a != b,
        ">": a > b,
        ">=": a >= b,
        "<": a < b,
        "<=": a <= b,
        "s>": sa > sb,
        "s>=": sa >= sb,
        "s<": sa < sb,
        "s<=": sa <= sb,
        "&": a & b != 0,
    }[name]


ALU_SYMS = {
    "add": "+=",
    "sub": "-=",
    "mul": "*=",
    "div": "/=",
    "mod": "%=",
    "or": "|=",
    "and": "&=",
    "xor": "^=",
    "lsh": "<<=",
    "rsh": ">>=",
    "arsh": "s>>=",
    "mov": "=",
}
JUMPS = ["==", "!=", ">", ">=", "<", "<=", "s>", "s>=", "s<", "s<=", "&"]
_cache: dict[tuple, LinkedProgram] = {}


def two_operands(key: tuple, body: str) -> LinkedProgram:
    """A program with r3, r4 loaded from the event (so one program serves
    every operand pair)."""
    if key not in _cache:
        text = "r3 = *(u64 *)(r1 + 0)\nr4 = *(u64 *)(r1 + 8)\n" + body
        _cache[key] = prog(text, event_size=16)
    return _cache[key]


def run2(p: LinkedProgram, a: int, b: int) -> int:
    ev = np.array([a, b], dtype=np.uint64)
    return p(ev, 0) & M64


@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("name", sorted(ALU_SYMS))
@FAST
@given(a=u64s, b=u64s, imm=s32s)
def test_alu(name: str, bits: int, a: int, b: int, imm: int) -> None:
    r = "r" if bits == 64 else "w"
    sym = ALU_SYMS[name]
    # Register source.
    p = two_operands((name, bits), f"{r}3 {sym} {r}4\nr0 = r3\nexit")
    assert run2(p, a, b) == expect_alu(name, bits, a, b)
    # Immediate source: sign-extended to 64 bits, or its 32 bits for w.
    if name in ("div", "mod") and imm == 0:
        return  # the verifier rejects a constant divisor 0
    if name in ("lsh", "rsh", "arsh"):
        imm %= bits
    k = two_operands((name, bits, imm), f"{r}3 {sym} {imm}\nr0 = r3\nexit")
    assert run2(k, a, b) == expect_alu(name, bits, a, imm & M64)


@pytest.mark.parametrize("bits", [64, 32])
@FAST
@given(a=u64s)
def test_neg(bits: int, a: int) -> None:
    r = "r" if bits == 64 else "w"
    p = two_operands(("neg", bits), f"{r}3 = -{r}3\nr0 = r3\nexit")
    assert run2(p, a, 0) == expect_alu("neg", bits, a, 0)


@pytest.mark.parametrize("width", [16, 32, 64])
@FAST
@given(a=u64s)
def test_byte_order(width: int, a: int) -> None:
    le = two_operands(("le", width), f"r3 = le{width} r3\nr0 = r3\nexit")
    be = two_operands(("be", width), f"r3 = be{width} r3\nr0 = r3\nexit")
    low = a & ((1 << width) - 1)
    assert run2(le, a, 0) == low
    assert run2(be, a, 0) == int.from_bytes(low.to_bytes(width // 8, "little"), "big")


@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("sym", JUMPS)
@FAST
@given(a=u64s, b=u64s, imm=s32s)
def test_conditional_jumps(sym: str, bits: int, a: int, b: int, imm: int) -> None:
    r = "r" if bits == 64 else "w"
    body = "r0 = 1\nif {r}3 {sym} {rhs} goto +1\nr0 = 0\nexit"
    p = two_operands((sym, bits), body.format(r=r, sym=sym, rhs=f"{r}4"))
    assert run2(p, a, b) == int(expect_jump(sym, bits, a, b))
    k = two_operands((sym, bits, imm), body.format(r=r, sym=sym, rhs=imm))
    # The K immediate is sign-extended to 64 bits (JMP32: its 32 bits).
    assert run2(k, a, b) == int(expect_jump(sym, bits, a, imm & M64))
    # Equal operands too (hypothesis rarely draws them).
    assert run2(p, a, a) == int(expect_jump(sym, bits, a, a))


def test_goto_and_ld_imm64() -> None:
    p = prog(
        """
        r0 = 0x8877665544332211 ll
        goto skip
        r0 = 0
        skip: exit
        """
    )
    assert p(0, 0) & M64 == 0x8877665544332211


def test_division_by_zero_register_is_defined() -> None:
    p = two_operands(("div0",), "r5 = 0\nr6 = r3\nr6 /= r5\nr3 %= r5\nr0 = r6\nr0 += r3\nexit")
    assert run2(p, 1234, 0) == 1234  # x / 0 = 0, x % 0 = x
    p32 = two_operands(("div032",), "w5 = 0\nw6 = w3\nw6 /= w5\nw3 %= w5\nr0 = r6\nr0 += r3\nexit")
    assert run2(p32, (7 << 32) | 99, 0) == 99  # 32-bit: the low half, zero-extended


# -- memory ------------------------------------------------------------------------------

SIZES = {1: "u8", 2: "u16", 4: "u32", 8: "u64"}


@pytest.mark.parametrize("size", [1, 2, 4, 8])
@FAST
@given(value=u64s, imm=s32s, slot=st.integers(1, 64), extra=st.integers(0, 7))
def test_stack_store_load(size: int, value: int, imm: int, slot: int, extra: int) -> None:
    t = SIZES[size]
    at = -8 * slot + (extra // size) * size  # any naturally aligned place in the slot
    m = (1 << (8 * size)) - 1
    fill = f"*(u64 *)(r10 - {8 * slot}) = -1\n"
    whole = f"r0 = *(u64 *)(r10 - {8 * slot})\nexit"
    part = f"r0 = *({t} *)(r10 {at:+d})\nexit"
    stx = f"*({t} *)(r10 {at:+d}) = r3\n"
    st_ = f"*({t} *)(r10 {at:+d}) = {imm}\n"

    def slot_after(v: int) -> int:
        # The store writes the low bytes; the slot's other bytes stay 0xff.
        word = bytearray(b"\xff" * 8)
        pos = at + 8 * slot
        word[pos : pos + size] = (v & m).to_bytes(size, "little")
        return int.from_bytes(word, "little")

    assert run2(two_operands(("stx", size, at), fill + stx + part), value, 0) == value & m
    assert run2(two_operands(("stxw", size, at), fill + stx + whole), value, 0) == slot_after(value)
    assert run2(two_operands(("st", size, at, imm), fill + st_ + part), 0, 0) == imm & m
    assert run2(two_operands(("stw", size, at, imm), fill + st_ + whole), 0, 0) == slot_after(imm)


@pytest.mark.parametrize("size", [1, 2, 4, 8])
@FAST
@given(data=st.binary(min_size=48, max_size=48), at=st.integers(0, 40))
def test_event_and_context_loads(size: int, data: bytes, at: int) -> None:
    t = SIZES[size]
    ev = np.frombuffer(bytearray(data), dtype=np.uint8).copy()
    ctx = ev[::-1].copy()
    p = prog(f"r0 = *({t} *)(r1 + {at})\nexit", event_size=48)
    q = prog(f"r0 = *({t} *)(r2 + {at})\nexit", event_size=0, context_size=48)
    # Loads zero-extend.
    assert p(ev, ctx) & M64 == int.from_bytes(ev[at : at + size].tobytes(), "little")
    assert q(ev, ctx) & M64 == int.from_bytes(ctx[at : at + size].tobytes(), "little")


def test_pointer_spill_and_fill() -> None:
    p = prog(
        """
        r6 = r1
        r6 += 8
        *(u64 *)(r10 - 16) = r6     ; spill a pointer to event+8
        r1 = 0
        r7 = *(u64 *)(r10 - 16)     ; fill: a pointer again
        r0 = *(u32 *)(r7 + 4)
        exit
        """,
        event_size=16,
    )
    ev = np.array([0, 0x1234567800000000], dtype=np.uint64)
    assert p(ev, 0) == 0x12345678


# -- helpers on real records -----------------------------------------------------------

SCHEMA = Schema.declare(
    "ev",
    [
        ("name", "string"),
        ("tag", "char[16]"),
        ("n", "u32"),
        ("vals", "s64[4]"),
        ("x", "s64"),
    ],
)


def helper_program(helper: str, path: int, literal: bytes, extra: str = "") -> LinkedProgram:
    text = f"""
        r3 = path[{path}] ll
        r4 = rodata[0] ll
        r5 = {len(literal)}
        call {helper}
        {extra}
        exit
    """
    paths = [SCHEMA.resolve(("name",)), SCHEMA.resolve(("tag",)), SCHEMA.resolve(("vals", 2))]
    return Program(assemble(text), literal, paths, event_size=SCHEMA.size).link()


@pytest.mark.parametrize(
    ("value", "literal", "eq", "glob"),
    [
        ("hello", b"hello", 1, 1),
        ("hello", b"hell", 0, 0),
        ("hell", b"hello", 0, 0),
        ("hello", b"he*", 0, 1),
        ("he*", b"he\\*", 0, 1),
        ("", b"", 1, 1),
        (None, b"x", -1, -1),
    ],
)
def test_str_eq_and_glob(value, literal: bytes, eq: int, glob: int) -> None:
    rec = EventRecord(SCHEMA, {"name": value, "tag": value or ""})
    assert helper_program("str_eq", 0, literal)(rec, 0) == eq
    assert helper_program("str_glob", 0, literal)(rec, 0) == glob
    if value is not None:  # the inline char[16] copy of the same string
        assert helper_program("str_eq", 1, literal)(rec, 0) == eq


def test_str_fields_eq_and_context() -> None:
    paths = [
        SCHEMA.resolve(("name",)),
        SCHEMA.resolve(("tag",)),
        DEFAULT_CONTEXT.resolve(("procname",)),
    ]
    p = Program(
        assemble("r3 = path[0] ll\nr4 = path[1] ll\ncall str_fields_eq\nexit"),
        b"",
        paths,
        event_size=SCHEMA.size,
    ).link()
    assert p(EventRecord(SCHEMA, {"name": "abc", "tag": "abc"}), 0) == 1
    assert p(EventRecord(SCHEMA, {"name": "abc", "tag": "abd"}), 0) == 0
    q = Program(
        assemble("r3 = path[2] ll\nr4 = rodata[0] ll\nr5 = 4\ncall str_eq\nexit"),
        b"bash",
        paths,
        event_size=SCHEMA.size,
    ).link()
    ctx = EventRecord(DEFAULT_CONTEXT, {"procname": "bash"})
    assert q(EventRecord(SCHEMA, {}), ctx) == 1
    assert q(EventRecord(SCHEMA, {}), EventRecord(DEFAULT_CONTEXT, {"procname": "zsh"})) == 0


def test_field_addr_with_null_check() -> None:
    seq = Schema.declare(
        "seq", [("count", "u32"), ("items", SequenceType(IntType(8, True), "ptr", "count"))]
    )
    paths = [seq.resolve(("items", 2))]
    p = Program(
        assemble(
            """
            r3 = path[0] ll
            call field_addr
            if r0 == 0 goto missing
            r0 = *(u64 *)(r0 + 0)
            exit
            missing:
            r0 = -1
            exit
            """
        ),
        b"",
        paths,
        event_size=seq.size,
    ).link()
    assert p(EventRecord(seq, {"items": [10, 20, 30]}), 0) == 30
    assert p(EventRecord(seq, {"items": [10, 20]}), 0) == -1  # index past the length
    assert p(EventRecord(seq, {"items": None}), 0) == -1  # null pointer


def test_scalar_helpers() -> None:
    table = native.threshold_table()
    p = prog("r1 = 17\nr2 = 12345\ncall set_threshold\nr1 = 17\ncall get_threshold\nexit")
    assert p(0, 0) == 12345 and table[17] == 12345
    table[17] = 0
    assert prog("call get_pid\nexit")(0, 0) == os.getpid()
    assert prog("call get_tid\nexit")(0, 0) > 0
    assert prog("call get_cpu\nexit")(0, 0) >= 0
    assert prog("call ktime_ns\nexit")(0, 0) > 0


# -- Sharma and Dagenais's Fig. 6 filter and the C entry point ------------------------------------

FIG6 = """
    r1 = *(u64 *)(r1 + 0)   ; field0
    r2 = 42
    if r1 == r2 goto true
    r0 = 0
    exit
true:
    r0 = 1
    exit
"""


def test_fig6_filter() -> None:
    p = prog(FIG6, event_size=8)
    assert p(np.array([42], dtype=np.int64), 0) == 1
    assert p(np.array([43], dtype=np.int64), 0) == 0
    # The linked program owns its memory and describes itself.
    assert p.count == 7 and p.insns.flags.c_contiguous and p.address == p.insns.ctypes.data
    assert list(p.descriptor) == [p.address, p.count]
    assert p.memory_bytes >= 7 * 8
    # Through the C entry point, as a C harness calls it.
    entry = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(
        interp.run_address
    )
    ev = np.array([42, 41], dtype=np.int64)
    assert entry(p.descriptor_address, ev.ctypes.data, 0) == 1
    assert entry(p.descriptor_address, ev.ctypes.data + 8, 0) == 0
    # And in a native loop over many events.
    addrs = ev.ctypes.data + 8 * np.arange(2, dtype=np.int64)
    out = np.zeros(2, dtype=np.int64)
    interp.run_many(p.address, p.count, addrs, 0, out)
    assert list(out) == [1, 0]


def test_linking_rewrites_pseudo_loads() -> None:
    paths = [SCHEMA.resolve(("x",))]
    p = Program(
        assemble("r3 = rodata[2] ll\nr4 = path[0] ll\nr0 = *(u8 *)(r3 + 0)\nexit"),
        b"abcd",
        paths,
        event_size=SCHEMA.size,
    )
    lp = p.link()
    words = lp.insns
    assert (words["regs"] >> 4).tolist()[:4] == [0, 0, 0, 0]
    lo = lambda i: int(words["imm"][i]) & 0xFFFFFFFF  # noqa: E731
    assert lo(0) | lo(1) << 32 == lp.rodata_address + 2
    assert lo(2) | lo(3) << 32 == lp.path_codes[0].ctypes.data
    assert lp(0, 0) == ord("c")
    # The source program is left as it was.
    assert (p.insns["regs"][0] >> 4) == abi.PSEUDO_RODATA


# -- restricted C through LLVM's BPF back end -------------------------------------------

ELF_IR = r"""
target datalayout = "e-m:e-p:64:64-i64:64-i128:128-n32:64-S128"
target triple = "bpfel"
@limits = internal constant [2 x i64] [i64 42, i64 7], align 8
@msg = private unnamed_addr constant [6 x i8] c"hello\00", align 1

define i64 @filter(ptr %ev, ptr %ctx) section "hwtrace/filter" {
entry:
  %p = getelementptr i8, ptr %ev, i64 8
  %v = load i64, ptr %p, align 8
  %lp = getelementptr [2 x i64], ptr @limits, i64 0, i64 1
  %lim = load i64, ptr %lp, align 8
  %c0 = load i64, ptr @limits, align 8
  %c = icmp eq i64 %v, %c0
  br i1 %c, label %yes, label %no
yes:
  %w = load i64, ptr %ev, align 8
  %d = icmp sgt i64 %w, %lim
  %h = load i8, ptr getelementptr (i8, ptr @msg, i64 1), align 1
  %hz = zext i8 %h to i64
  %d2 = zext i1 %d to i64
  %pidf = inttoptr i64 7 to ptr
  %pid = call i64 %pidf()
  %pz = icmp sgt i64 %pid, 0
  %pz2 = zext i1 %pz to i64
  %r0 = add i64 %d2, %hz
  %r = add i64 %r0, %pz2
  ret i64 %r
no:
  ret i64 0
}
"""

GLOBAL_IR = r"""
target triple = "bpfel"
@counter = global i64 0, align 8
define i64 @f(ptr %ev) section "prog" {
  %v = load i64, ptr @counter, align 8
  ret i64 %v
}
"""


def bpf_object(ir_text: str, tmp_path, name: str = "f.o") -> str:
    llvm = pytest.importorskip("llvmlite.binding")
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple("bpfel")
    except RuntimeError:
        pytest.skip("llvmlite's LLVM has no BPF target")
    module = llvm.parse_assembly(ir_text)
    module.verify()
    obj = target.create_target_machine(opt=2).emit_object(module)
    path = tmp_path / name
    path.write_bytes(obj)
    return str(path)


def test_elf_object_from_llvm(tmp_path) -> None:
    obj = bpf_object(ELF_IR, tmp_path)
    p = Program.from_elf(obj, event_size=16)
    assert p.name.endswith("hwtrace/filter")
    assert b"hello" in p.rodata and p.rodata[:8] == (42).to_bytes(8, "little")
    text = listing(p.insns)
    assert "rodata[" in text and "call get_pid" in text
    lp = p.link()
    # filter(ev) = ev[1] == 42 ? (ev[0] > 7) + 'e' + (pid > 0) : 0
    assert lp(np.array([10, 42], dtype=np.int64), 0) == 1 + ord("e") + 1
    assert lp(np.array([3, 42], dtype=np.int64), 0) == ord("e") + 1
    assert lp(np.array([10, 41], dtype=np.int64), 0) == 0
    # The same section by name; a missing one is named.
    assert len(Program.from_elf(obj, "hwtrace/filter", event_size=16)) == len(p)
    with pytest.raises(FilterError, match="no section 'nope'"):
        Program.from_elf(obj, "nope", event_size=16)
    # The verifier still applies: 8 bytes of event are too few for ev[1].
    with pytest.raises(VerifierError, match="outside the 8-byte event"):
        Program.from_elf(obj, event_size=8).link()


def test_elf_errors(tmp_path) -> None:
    obj = bpf_object(GLOBAL_IR, tmp_path)
    with pytest.raises(
        FilterError, match=r"section 'prog' offset 0x0: relocation against symbol 'counter'"
    ):
        Program.from_elf(obj, event_size=8)
    with pytest.raises(FilterError, match="not an eBPF object"):
        Program.from_elf(sys.executable, event_size=8)
    junk = tmp_path / "junk.o"
    junk.write_bytes(b"not an elf at all")
    with pytest.raises(FilterError, match="not a valid ELF"):
        Program.from_elf(junk, event_size=8)
    with pytest.raises(FilterError, match="cannot open"):
        Program.from_elf(tmp_path / "missing.o", event_size=8)


# -- fuzz: whatever the verifier accepts runs to completion -----------------------------

FUZZ_SCHEMA = Schema.declare(
    "fz", [("a", "s64"), ("b", "u32"), ("s", "string"), ("t", "char[8]"), ("v", "s16[4]")]
)
FUZZ_PATHS = [
    FUZZ_SCHEMA.resolve(("s",)),
    FUZZ_SCHEMA.resolve(("t",)),
    FUZZ_SCHEMA.resolve(("v", 1)),
]
FUZZ_RODATA = b"hello\0world*\0"

_ALU_OPS = [isa.ADD, isa.SUB, isa.MUL, isa.DIV, isa.OR, isa.AND, isa.LSH, isa.RSH, isa.NEG,
            isa.MOD, isa.XOR, isa.MOV, isa.ARSH, isa.END]  # fmt: skip
_regs = st.integers(0, 10)
_small = st.one_of(st.integers(-70, 70), s32s)


@st.composite
def fuzz_insn(draw):
    kind = draw(
        st.sampled_from(
            ["alu", "alu", "alu", "ldx", "stx", "st", "jmp", "jmp", "call", "exit", "snippet"]
        )
    )
    if kind == "alu":
        cls = draw(st.sampled_from([isa.ALU, isa.ALU64]))
        op = draw(st.sampled_from(_ALU_OPS))
        if op == isa.END:
            return [
                isa.insn(
                    isa.ALU | isa.END | draw(st.sampled_from([0, 8])),
                    draw(_regs),
                    0,
                    0,
                    draw(st.sampled_from([16, 32, 64])),
                )
            ]
        if draw(st.booleans()):
            return [isa.insn(cls | op | isa.X, draw(_regs), draw(_regs))]
        return [isa.insn(cls | op, draw(_regs), 0, 0, draw(_small))]
    if kind in ("ldx", "stx", "st"):
        size = draw(st.sampled_from([isa.B, isa.H, isa.W, isa.DW]))
        base = draw(st.sampled_from([1, 2, 10, 6, 7, 8]) | _regs)
        off = draw(st.integers(-80, 80))
        if kind == "ldx":
            return [isa.ldx(size, draw(_regs), base, off)]
        if kind == "stx":
            return [isa.stx(size, base, draw(_regs), off)]
        return [isa.st(size, base, off, draw(_small))]
    if kind == "jmp":
        cls = draw(st.sampled_from([isa.JMP, isa.JMP32]))
        op = draw(st.sampled_from(sorted(isa.JMP_NAMES) + [isa.JA]))
        cls = isa.JMP if op == isa.JA else cls
        x = draw(st.sampled_from([0, isa.X]))
        # Offsets are a fraction of what is left; fixed up once laid out.
        return [
            (
                "jump",
                isa.insn(
                    cls | op | x, draw(_regs), draw(_regs) if x else 0, 0, 0 if x else draw(_small)
                ),
                draw(st.floats(0, 1)),
            )
        ]
    if kind == "call":
        return [isa.call(draw(st.sampled_from(sorted(abi.HELPERS))))]
    if kind == "exit":
        return [isa.exit_()]
    # Snippets that pass the verifier often: helper calls with their arguments.
    which = draw(st.integers(0, 2))
    if which == 0:
        return [isa.mov(1, 7), isa.mov(2, 8), *isa.ld_pseudo(3, abi.PSEUDO_FIELD_PATH, draw(st.integers(0, 2))),
                *isa.ld_pseudo(4, abi.PSEUDO_RODATA, 0, draw(st.integers(0, 6))), isa.mov_imm(5, draw(st.integers(0, 6))),
                isa.call(draw(st.sampled_from([abi.HELPER_STR_EQ, abi.HELPER_STR_GLOB])))]  # fmt: skip
    if which == 1:
        return [isa.mov(1, 7), isa.mov(2, 8), *isa.ld_pseudo(3, abi.PSEUDO_FIELD_PATH, draw(st.integers(0, 2))),
                isa.call(abi.HELPER_FIELD_ADDR), isa.jmp(isa.JEQ, 0, 0, 1, reg=False),
                isa.ldx(draw(st.sampled_from([isa.B, isa.H, isa.W, isa.DW])), draw(_regs), 0, draw(st.integers(-2, 8)))]  # fmt: skip
    return [*isa.ld_pseudo(draw(_regs), abi.PSEUDO_RODATA, 0, draw(st.integers(0, 13))), isa.mov_imm(draw(_regs), draw(_small))]  # fmt: skip


@st.composite
def fuzz_programs(draw) -> Program:
    items = [isa.mov(7, 1), isa.mov(8, 2), isa.mov(6, 10)]
    for r in (0, 3, 4, 5, 9):
        items.append(isa.mov_imm(r, draw(_small)))
    for slot in range(1, draw(st.integers(0, 8)) + 1):
        items.append(isa.stx(isa.DW, 10, draw(_regs), -8 * slot))
    for group in draw(st.lists(fuzz_insn(), min_size=1, max_size=25)):
        items += group
    items += [isa.mov_imm(0, draw(_small)), isa.exit_()] if draw(st.booleans()) else [isa.exit_()]
    flat, fix = [], []
    for it in items:
        if isinstance(it, tuple) and it and it[0] == "jump":
            fix.append((len(flat), it[2]))
            flat.append(it[1])
        else:
            flat.append(it)
    arr = isa.program(flat)
    for at, frac in fix:
        arr["off"][at] = int(frac * (len(arr) - at - 1))
    return Program(arr, FUZZ_RODATA, FUZZ_PATHS, event_size=FUZZ_SCHEMA.size)


RUNNER = textwrap.dedent(
    """
    import pickle, sys
    from hwtrace.filter.packing import EventRecord
    from hwtrace.filter.schema import DEFAULT_CONTEXT
    progs, schema, values = pickle.load(open(sys.argv[1], "rb"))
    events = [EventRecord(schema, v) for v in values]
    ctx = EventRecord(DEFAULT_CONTEXT, {"procname": "fuzz"})
    for i, p in enumerate(progs):
        print(i, flush=True)
        lp = p.link()
        for ev in events:
            lp(ev, ctx)
    print("done", flush=True)
    """
)


def test_fuzz_verified_programs_never_crash(tmp_path) -> None:
    accepted: list[Program] = []
    seen = {"rejected": 0}

    @settings(
        max_examples=400, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(fuzz_programs())
    def check(p: Program) -> None:
        try:
            p.verify()
        except VerifierError as e:
            seen["rejected"] += 1
            where = int(e.where.split()[1])
            assert 0 <= where < len(p), str(e)
            return
        accepted.append(p)

    check()
    assert len(accepted) >= 40, (
        f"only {len(accepted)} of {len(accepted) + seen['rejected']} accepted"
    )
    values = [
        {"a": 5, "b": 7, "s": "hello", "t": "world", "v": [1, 2, 3, 4]},
        {"a": -1, "s": None, "t": "", "v": [0, 0, 0, 0]},
    ]
    data = tmp_path / "progs.pickle"
    data.write_bytes(pickle.dumps((accepted, FUZZ_SCHEMA, values)))
    script = tmp_path / "runner.py"
    script.write_text(RUNNER)
    r = subprocess.run(
        [sys.executable, str(script), str(data)], capture_output=True, text=True, timeout=300
    )
    if r.returncode != 0:
        last = r.stdout.split()[-1] if r.stdout.split() else "0"
        culprit = accepted[int(last)] if last.isdigit() else accepted[0]
        pytest.fail(
            f"verified program crashed the interpreter (exit {r.returncode}):\n"
            f"{listing(culprit.insns)}\n{r.stderr[-2000:]}"
        )
    assert r.stdout.split()[-1] == "done"


@settings(max_examples=300, deadline=None, database=None)
@given(st.binary(min_size=8, max_size=8 * 40).filter(lambda b: len(b) % 8 == 0))
def test_fuzz_random_bytes_rejected_cleanly(data: bytes) -> None:
    arr = np.frombuffer(data, dtype=abi.INSN).copy()
    p = Program(arr, FUZZ_RODATA, FUZZ_PATHS, event_size=FUZZ_SCHEMA.size)
    try:
        p.verify()
    except VerifierError as e:
        assert e.where.startswith("insn ")


def test_library_loops_read_the_shared_table(tmp_path) -> None:
    """The interpreter's loop in a native library read the threshold table
    the process shares though nothing asked the library for a C function
    (each library has its own copy of the table's address, given it when
    the library is loaded)."""
    from hwtrace import aot

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler to link a library with")
    table = native.threshold_table()
    text = "r1 = 17\nr2 = 12345\ncall set_threshold\nr1 = 17\ncall get_threshold\nexit"
    aot.use_library(None)
    try:
        assert prog(text)(0, 0) == 12345  # through numba (the library is built from its code)
        table[17] = 0
        manifest = aot.build(tmp_path, modules=("hwtrace.filter.ebpf.interp",))
        assert manifest is not None and aot.use_library(manifest)
        aot._fallbacks.clear()
        assert prog(text)(0, 0) == 12345 and table[17] == 12345
        assert "hwtrace.filter.ebpf.interp:run" not in aot.fallbacks()
    finally:
        table[17] = 0
        aot.use_library(None)
        aot._library = False  # look for the real one again
