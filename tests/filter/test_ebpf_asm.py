"""eBPF assembly text: every syntax form, errors with line and column,
labels, the exact round trip of disassembly (any bits), and agreement with
llvm-objdump on code from LLVM's BPF back end."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hwtrace.filter import abi
from hwtrace.filter.ebpf import isa
from hwtrace.filter.ebpf.asm import AsmError, assemble, disassemble, listing
from hwtrace.filter.errors import FilterError

CASES = [
    ("r0 = 1", [isa.mov_imm(0, 1)]),
    ("r0 = -1", [isa.mov_imm(0, -1)]),
    ("r3 = 0xffffffff", [isa.mov_imm(3, -1)]),
    ("w0 = w1", [isa.insn(isa.ALU | isa.MOV | isa.X, 0, 1)]),
    ("w2 = 7", [isa.insn(isa.ALU | isa.MOV | isa.K, 2, 0, 0, 7)]),
    ("r1 += r2", [isa.alu64(isa.ADD, 1, 2, reg=True)]),
    ("r1 -= 3", [isa.alu64(isa.SUB, 1, 3, reg=False)]),
    ("w1 *= w9", [isa.insn(isa.ALU | isa.MUL | isa.X, 1, 9)]),
    ("r1 /= 3", [isa.alu64(isa.DIV, 1, 3, reg=False)]),
    ("r1 %= r3", [isa.alu64(isa.MOD, 1, 3, reg=True)]),
    ("r1 |= 0x10", [isa.alu64(isa.OR, 1, 16, reg=False)]),
    ("r1 &= r2", [isa.alu64(isa.AND, 1, 2, reg=True)]),
    ("r1 ^= -7", [isa.alu64(isa.XOR, 1, -7, reg=False)]),
    ("r1 <<= 32", [isa.alu64(isa.LSH, 1, 32, reg=False)]),
    ("r1 >>= r4", [isa.alu64(isa.RSH, 1, 4, reg=True)]),
    ("r1 s>>= 3", [isa.alu64(isa.ARSH, 1, 3, reg=False)]),
    ("r1 = -r1", [isa.insn(isa.ALU64 | isa.NEG, 1)]),
    ("w4 = -w4", [isa.insn(isa.ALU | isa.NEG, 4)]),
    ("r1 = be16 r1", [isa.insn(isa.ALU | isa.END | isa.X, 1, 0, 0, 16)]),
    ("r5 = le64 r5", [isa.insn(isa.ALU | isa.END | isa.K, 5, 0, 0, 64)]),
    ("r1 = *(u64 *)(r1 + 8)", [isa.ldx(isa.DW, 1, 1, 8)]),
    ("w1 = *(u8 *)(r2 - 3)", [isa.ldx(isa.B, 1, 2, -3)]),
    ("r1 = *(u16 *)(r10 + 0)", [isa.ldx(isa.H, 1, 10, 0)]),
    ("r1 = *(u32 *)(r3)", [isa.ldx(isa.W, 1, 3, 0)]),
    ("*(u32 *)(r10 - 4) = r2", [isa.stx(isa.W, 10, 2, -4)]),
    ("*(u8 *)(r10 - 1) = w2", [isa.stx(isa.B, 10, 2, -1)]),
    ("*(u64 *)(r10 - 16) = -9", [isa.st(isa.DW, 10, -16, -9)]),
    ("r2 = 0x1122334455667788 ll", isa.ld_imm64(2, 0x1122334455667788)),
    ("r2 = -1 ll", isa.ld_imm64(2, -1)),
    ("r3 = rodata[16] ll", isa.ld_pseudo(3, abi.PSEUDO_RODATA, 0, 16)),
    ("r3 = path[2] ll", isa.ld_pseudo(3, abi.PSEUDO_FIELD_PATH, 2, 0)),
    ("if r1 == r2 goto +3", [isa.jmp(isa.JEQ, 1, 2, 3, reg=True)]),
    ("if r1 s> 5 goto -0", [isa.jmp(isa.JSGT, 1, 5, 0, reg=False)]),
    ("if w1 < w2 goto +1", [isa.insn(isa.JMP32 | isa.JLT | isa.X, 1, 2, 1)]),
    ("if w1 s<= -4 goto +2", [isa.insn(isa.JMP32 | isa.JSLE | isa.K, 1, 0, 2, -4)]),
    ("if r0 & 0x4 goto +1", [isa.jmp(isa.JSET, 0, 4, 1, reg=False)]),
    ("if r0 != 0 goto +1 <LBB0_3>", [isa.jmp(isa.JNE, 0, 0, 1, reg=False)]),
    ("goto +3", [isa.ja(3)]),
    ("call 2", [isa.call(2)]),
    ("call str_glob", [isa.call(abi.HELPER_STR_GLOB)]),
    ("exit", [isa.exit_()]),
    (".insn 0x18, 1, 2, -3, 0xffffffff", [(0x18, 0x21, -3, -1)]),
]


@pytest.mark.parametrize(("text", "want"), CASES)
def test_syntax(text: str, want: list) -> None:
    got = assemble(text)
    assert got.tobytes() == np.array(want, dtype=abi.INSN).tobytes()
    # Comments and surrounding space do not matter.
    assert assemble(f"  {text}   ; comment\n# another\n").tobytes() == got.tobytes()


def test_labels() -> None:
    text = """
    start:
        r0 = 0
        if r1 == 0 goto out      ; forward
        r2 = 1 ll                ; two slots
    a: b: r0 = 1
        goto out
    out: exit
    """
    got = assemble(text)
    assert got["off"][1] == 4  # slot 1 -> slot 6
    assert got["off"][5] == 0
    assert listing(got).splitlines()[2] == "    2: r2 = 1 ll"


@pytest.mark.parametrize(
    ("text", "line", "col", "match"),
    [
        ("r0 = 0\nr1 = *(u65 *)(r1 + 0)", 2, 8, "expected u8, u16, u32 or u64"),
        ("r1 += w2", 1, 7, "both registers must be rN"),
        ("r0 = 0\n\nif r1 == r2 goto nowhere", 3, 18, "undefined label 'nowhere'"),
        ("r1 = 0x100000000", 1, 6, "does not fit in 32 bits"),
        ("r11 = 1", 1, 1, "invalid register r11"),
        ("r1 = r11", 1, 6, "invalid register r11"),
        ("r1 = w11", 1, 6, "invalid register w11"),
        ("r1 = 1 2", 1, 8, "unexpected '2' after the instruction"),
        ("foo r1", 1, 1, "unknown instruction 'foo'"),
        ("x: r0 = 1\nx: exit", 2, 1, "label 'x' defined twice"),
        ("call nope", 1, 6, "unknown helper 'nope'"),
        ("r1 = *(u64 *)(r1 + 40000)", 1, 20, "offset 40000 out of range"),
        ("goto +40000", 1, 6, "jump offset 40000 out of range"),
        ("if r1 ~ 3 goto +1", 1, 7, "unexpected character '~'"),
        ("if r1 = 3 goto +1", 1, 7, "expected a comparison"),
        ("if w1 == r2 goto +1", 1, 10, "both registers of a comparison"),
        ("r1 = be16 r2", 1, 11, "byte swap works in place"),
        ("r1 = -r2", 1, 7, "negation works in place"),
        ("w1 = rodata[0] ll", 1, 1, "64-bit register"),
        (".insn 1, 2, 3", 1, 14, "expected ','"),
        (".insn 256, 0, 0, 0, 0", 1, 7, "opcode 256 out of range"),
        ("r1 = *(u64 *)(r1 + 8", 1, 21, "expected '\\)'"),
        ("r1 ** 2", 1, 4, "expected an assignment"),
    ],
)
def test_errors(text: str, line: int, col: int, match: str) -> None:
    with pytest.raises(AsmError) as info:
        assemble(text)
    e = info.value
    assert isinstance(e, FilterError)
    assert e.where == f"line {line}" and e.column == col, str(e)
    assert re.search(match, e.message), e.message
    # The message shows the line with a caret under the column.
    shown = str(e).splitlines()
    assert shown[0] == f"column {col}: line {line}: {e.message}"
    assert shown[2].index("^") == 2 + col - 1


# -- round trip ----------------------------------------------------------------------------

regs = st.integers(0, 10)
s16 = st.integers(-(1 << 15), (1 << 15) - 1)
s32 = st.integers(-(1 << 31), (1 << 31) - 1)
ALU_OPS = [o for o in isa.ALU_NAMES]


@st.composite
def valid_insn(draw) -> list:
    kind = draw(
        st.sampled_from(
            ["alu", "neg", "end", "ldx", "st", "stx", "ld", "jmp", "ja", "call", "exit"]
        )
    )
    cls = draw(st.sampled_from([isa.ALU, isa.ALU64]))
    if kind == "alu":
        op = draw(st.sampled_from(ALU_OPS))
        if draw(st.booleans()):
            return [isa.insn(cls | op | isa.X, draw(regs), draw(regs))]
        return [isa.insn(cls | op, draw(regs), 0, 0, draw(s32))]
    if kind == "neg":
        return [isa.insn(cls | isa.NEG, draw(regs))]
    if kind == "end":
        return [isa.insn(isa.ALU | isa.END | draw(st.sampled_from([isa.K, isa.X])), draw(regs), 0, 0, draw(st.sampled_from([16, 32, 64])))]  # fmt: skip
    size = draw(st.sampled_from([isa.B, isa.H, isa.W, isa.DW]))
    if kind == "ldx":
        return [isa.ldx(size, draw(regs), draw(regs), draw(s16))]
    if kind == "st":
        return [isa.st(size, draw(regs), draw(s16), draw(s32))]
    if kind == "stx":
        return [isa.stx(size, draw(regs), draw(regs), draw(s16))]
    if kind == "ld":
        which = draw(st.integers(0, 2))
        if which == 0:
            return isa.ld_imm64(draw(regs), draw(st.integers(0, (1 << 64) - 1)))
        if which == 1:
            return isa.ld_pseudo(
                draw(regs), abi.PSEUDO_RODATA, 0, draw(st.integers(0, (1 << 31) - 1))
            )
        return isa.ld_pseudo(
            draw(regs), abi.PSEUDO_FIELD_PATH, draw(st.integers(0, (1 << 31) - 1)), 0
        )
    if kind == "jmp":
        jcls = draw(st.sampled_from([isa.JMP, isa.JMP32]))
        op = draw(st.sampled_from(sorted(isa.JMP_NAMES)))
        if draw(st.booleans()):
            return [isa.insn(jcls | op | isa.X, draw(regs), draw(regs), draw(s16))]
        return [isa.insn(jcls | op, draw(regs), 0, draw(s16), draw(s32))]
    if kind == "ja":
        return [isa.ja(draw(s16))]
    if kind == "call":
        return [isa.call(draw(st.one_of(st.sampled_from(sorted(abi.HELPERS)), s32)))]
    return [isa.exit_()]


@settings(max_examples=300, deadline=None)
@given(st.lists(valid_insn(), min_size=1, max_size=30))
def test_round_trip_valid(items: list) -> None:
    arr = isa.program(items)
    lines = disassemble(arr)
    assert not [line for line in lines if line.startswith(".insn")], lines
    assert len(lines) == len(items)
    assert assemble("\n".join(lines)).tobytes() == arr.tobytes()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(min_size=8, max_size=8), min_size=1, max_size=30))
def test_round_trip_any_bits(words: list[bytes]) -> None:
    # Any 8-byte pattern, with ld_imm64 opcodes made likely.
    data = bytearray(b"".join(words))
    for i in range(0, len(data), 16):
        data[i] = 0x18
    arr = np.frombuffer(bytes(data), dtype=abi.INSN)
    text = "\n".join(disassemble(arr))
    assert assemble(text).tobytes() == arr.tobytes()


# -- llvm-objdump ---------------------------------------------------------------------------

IR = r"""
target triple = "bpfel"
@limits = internal constant [2 x i64] [i64 42, i64 7], align 8
define i64 @f(ptr %ev, ptr %ctx) section "prog" {
  %a = load i64, ptr %ev, align 8
  %c = mul i64 %a, 1234605616436508552
  %p = getelementptr i8, ptr %ev, i64 8
  %b32 = load i32, ptr %p, align 4
  %b2 = mul i32 %b32, 7
  %b3 = lshr i32 %b2, 3
  %b4 = icmp ugt i32 %b3, 77
  %b5 = zext i1 %b4 to i64
  %d = xor i64 %c, %b5
  %e = udiv i64 %d, %a
  %lim = load i64, ptr getelementptr ([2 x i64], ptr @limits, i64 0, i64 1), align 8
  %q = alloca i64, align 8
  store volatile i64 %e, ptr %q, align 8
  %h2 = load volatile i64, ptr %q, align 8
  %i = icmp slt i64 %h2, %lim
  %j = select i1 %i, i64 -3, i64 %h2
  %k = call i64 @llvm.bswap.i64(i64 %j)
  %f2 = inttoptr i64 7 to ptr
  %pid = call i64 %f2()
  %r = add i64 %k, %pid
  ret i64 %r
}
declare i64 @llvm.bswap.i64(i64)
"""


def test_agrees_with_llvm_objdump(tmp_path) -> None:
    objdump = shutil.which("llvm-objdump")
    if objdump is None:
        pytest.skip("llvm-objdump not installed")
    llvm = pytest.importorskip("llvmlite.binding")
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    try:
        target = llvm.Target.from_triple("bpfel")
    except RuntimeError:
        pytest.skip("llvmlite's LLVM has no BPF target")
    from elftools.elf.elffile import ELFFile

    module = llvm.parse_assembly(IR)
    for cpu in ("v1", "v3"):
        obj = tmp_path / f"f-{cpu}.o"
        obj.write_bytes(target.create_target_machine(cpu=cpu, opt=2).emit_object(module))
        with obj.open("rb") as f:
            code = ELFFile(f).get_section_by_name("prog").data()
        out = subprocess.run(
            [objdump, "-d", "--no-show-raw-insn", str(obj)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        theirs = []
        for line in out.splitlines():
            m = re.match(r"\s*\d+:\s+(.*)$", line)
            if m:
                theirs.append(re.sub(r"\s*<[^<>]*>$", "", m.group(1)).strip())
        # Their text assembles to the object's bytes.
        assert assemble("\n".join(theirs)).tobytes() == code
        # Ours is the same text (helpers by name, 32-bit loads/stores written with r).
        ours = [
            re.sub(r"^call get_pid$", "call 7", t)
            for t in disassemble(np.frombuffer(code, abi.INSN))
        ]
        assert ours == theirs
