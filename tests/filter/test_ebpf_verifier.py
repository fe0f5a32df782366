"""The eBPF verifier: each rule rejects with the instruction index and the
rule in words; safe programs (including compiled-code patterns) pass; it
stays linear on 4096-instruction programs; its constant knowledge agrees
with the interpreter."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ebpf_interp import ALU_SYMS, JUMPS, expect_alu, expect_jump, s32s, u64s

from hwtrace.filter import abi
from hwtrace.filter.ebpf import isa
from hwtrace.filter.ebpf.asm import assemble
from hwtrace.filter.ebpf.program import Program
from hwtrace.filter.ebpf.verifier import VerifierInfo, verify
from hwtrace.filter.errors import VerifierError
from hwtrace.filter.schema import DEFAULT_CONTEXT, Schema

SCHEMA = Schema.declare("ev", [("name", "string"), ("tag", "char[8]"), ("x", "s64")])  # 24 bytes
PATHS = [SCHEMA.resolve(("name",)), SCHEMA.resolve(("tag",)), SCHEMA.resolve(("x",))]
RODATA = b"hello\0glob*\0"


def program(text_or_insns, **kw) -> Program:
    insns = assemble(text_or_insns) if isinstance(text_or_insns, str) else text_or_insns
    kw.setdefault("event_size", SCHEMA.size)
    return Program(insns, kw.pop("rodata", RODATA), kw.pop("paths", PATHS), **kw)


def ok(text, **kw) -> VerifierInfo:
    return verify(program(text, **kw))


def reject(text, insn: int, match: str, **kw) -> VerifierError:
    with pytest.raises(VerifierError) as info:
        verify(program(text, **kw))
    e = info.value
    assert e.where == f"insn {insn}", f"{e} (expected insn {insn})"
    assert re.search(match, e.message), f"{e.message!r} does not match {match!r}"
    assert str(e).startswith(f"insn {insn}: ")
    return e


# -- control flow ---------------------------------------------------------------------


def test_back_edge() -> None:
    text = "r0 = 0\nr1 = 1\nr2 = 2\nl3: r0 += 1\nr3 = 4\nr4 = 5\nr5 = 6\ngoto l3\nexit"
    reject(text, 7, r"^back-edge from insn 7 to insn 3: loops are not allowed$")
    reject("r0 = 0\nif r0 == 0 goto -1\nexit", 1, "back-edge from insn 1 to insn 1")


def test_jump_targets() -> None:
    reject("r0 = 0\ngoto +5\nexit", 1, r"jump out of the program: target insn 7")
    reject("r0 = 0\nif r0 > 1 goto +1\nr1 = 5 ll\nexit", 1, "second slot of the ld_imm64 at insn 2")
    reject("r0 = 0\nexit\nr0 = 1", 2, "falls off its end")
    reject("r0 = 0", 0, "falls off its end")
    reject("r0 = 0\nr1 = 1 ll", 1, "falls off its end")  # names the ld_imm64, not its second slot
    reject("", 0, "empty program")


def test_size_limit() -> None:
    body = [isa.mov_imm(0, 0)] * (abi.MAX_INSNS - 1) + [isa.exit_()]
    assert ok(isa.program(body)).insn_count == abi.MAX_INSNS
    reject(
        isa.program([isa.mov_imm(0, 0)] + body),
        abi.MAX_INSNS,
        "4097 instructions; the limit is 4096",
    )


def test_dead_code_is_allowed_and_constant_branches_prune() -> None:
    # After exit: never runs, only its encoding is checked.
    info = ok("r0 = 0\nexit\nr0 = *(u64 *)(r9 + 0)\nexit")
    assert info.reachable == 2
    reject("r0 = 0\nexit\n.insn 0xff, 0, 0, 0, 0", 2, "unknown")
    # A branch decided by constants: the bad path is never taken.
    ok("r1 = 5\nr0 = 0\nif r1 > 4 goto +1\nr0 = *(u64 *)(r9 + 0)\nexit")
    reject("r1 = 4\nr0 = 0\nif r1 > 4 goto +1\nr0 = *(u64 *)(r9 + 0)\nexit", 3, "r9 is read before")


# -- encodings -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (".insn 0x20, 0, 0, 0, 0", "LD_ABS/LD_IND"),
        (".insn 0x40, 0, 0, 0, 0", "LD_ABS/LD_IND"),
        (".insn 0x00, 0, 0, 0, 0", "invalid LD opcode"),
        (".insn 0xdb, 10, 1, -8, 0", "atomic operations are not supported"),
        (".insn 0xc3, 10, 1, -8, 1", "atomic operations are not supported"),
        (".insn 0xe7, 0, 0, 0, 1", "unknown ALU operation 0xe0"),
        (".insn 0xf4, 0, 0, 0, 1", "unknown ALU operation 0xf0"),
        (".insn 0xe5, 0, 0, 0, 0", "unknown JMP operation 0xe0"),
        (".insn 0x06, 0, 0, 0, 0", "gotol"),
        (".insn 0x86, 0, 0, 0, 7", "unknown JMP32 operation 0x80"),
        (".insn 0x07, 0, 1, 0, 5", "the src field must be 0"),
        (".insn 0x0f, 0, 1, 0, 5", "the immediate must be 0"),
        (".insn 0x07, 0, 0, 1, 5", "the offset field must be 0"),
        (".insn 0x95, 0, 0, 0, 1", "exit: registers, offset and immediate must be 0"),
        (".insn 0x85, 0, 0, 0, 99", "call of unknown helper 99"),
        (".insn 0x85, 0, 1, 0, 1", "bpf-to-bpf calls"),
        (".insn 0x05, 0, 0, 0, 3", "goto: registers and immediate must be 0"),
        (".insn 0x81, 0, 1, 0, 0", "BPF_MEMSX"),
        (".insn 0xd7, 0, 0, 0, 16", "bswap"),
        (".insn 0xd4, 0, 0, 0, 8", "byte swap width must be 16, 32 or 64"),
        (".insn 0x87, 0, 0, 0, 1", "neg: source, src and immediate must be 0"),
        (".insn 0x67, 0, 0, 0, 64", "shift by 64: a constant shift must be 0..63"),
        (".insn 0x64, 0, 0, 0, 32", "shift by 32: a constant shift must be 0..31"),
        (".insn 0x37, 0, 0, 0, 0", "division by the constant 0"),
        (".insn 0x94, 0, 0, 0, 0", "division by the constant 0"),
        (".insn 0xb7, 11, 0, 0, 0", "invalid register r11"),
        (".insn 0xbf, 0, 12, 0, 0", "invalid register r12"),
        (".insn 0x15, 0, 0, 0, 0\n.insn 0x1d, 0, 13, 0, 0", "invalid register r13"),
        (".insn 0x79, 0, 11, 0, 0", "invalid register r11"),
        (".insn 0x62, 10, 1, -8, 0", "the src field must be 0"),
        (".insn 0x63, 10, 1, -8, 3", "the immediate must be 0"),
        (".insn 0x61, 0, 1, 0, 3", "load: the immediate must be 0"),
        (".insn 0x1d, 0, 1, 0, 3", "the immediate must be 0"),
        (".insn 0x15, 0, 1, 0, 3", "the src field must be 0"),
    ],
)
def test_invalid_encodings(raw: str, match: str) -> None:
    lines = raw.split("\n")
    text = "r0 = 0\n" + raw + "\nexit"
    reject(text, len(lines), match)


def test_ld_imm64_encodings() -> None:
    reject("r0 = 0\n.insn 0x18, 1, 0, 0, 0", 1, "lacks its second slot")
    reject(
        "r0 = 0\n.insn 0x18, 1, 0, 0, 0\n.insn 0x07, 0, 0, 0, 0\nexit", 2, "second slot of ld_imm64"
    )
    reject(
        "r0 = 0\n.insn 0x18, 1, 2, 0, 1\n.insn 0, 0, 0, 0, 0\nexit", 1, "first immediate must be 0"
    )
    reject("r0 = 0\nr1 = rodata[13] ll\nexit", 1, r"rodata\+13: outside rodata \(12 bytes\)")
    ok("r0 = 0\nr1 = rodata[12] ll\nexit")  # one past the end: a pointer, not an access
    reject("r0 = 0\nr1 = path[3] ll\nexit", 1, "field path 3: the program has 3 paths")
    reject(
        "r0 = 0\n.insn 0x18, 1, 7, 0, 0\n.insn 0, 0, 0, 0, 1\nexit", 1, "second immediate must be 0"
    )
    reject("r0 = 0\n.insn 0x18, 1, 3, 0, 0\n.insn 0, 0, 0, 0, 0\nexit", 1, "unknown source 3")
    reject("r0 = 0\nr10 = 1 ll\nexit", 1, "R10 .* is read-only")
    # A path outside the record the program is verified for.
    reject(
        "r0 = 0\nr1 = path[2] ll\nexit",
        1,
        r"field path 2 \(x\) lies outside the 16-byte event",
        event_size=16,
    )


# -- registers ----------------------------------------------------------------------------


def test_registers() -> None:
    reject("r0 = r3\nexit", 0, r"^r3 is read before it is initialised")
    reject("r0 = 0\nr10 = 1\nexit", 1, r"R10 \(the frame pointer\) is read-only")
    reject("r0 = 0\nr10 += 8\nexit", 1, "R10 .* read-only")
    reject("exit", 0, "r0 is read before it is initialised")
    reject("r0 = r1\nexit", 1, "exit with r0 a pointer to event\\+0: a filter returns a scalar")
    reject("r0 = 0\nr1 = 1\nif r1 > r3 goto +0\nexit", 2, "r3 is read before")


def test_join_of_different_kinds() -> None:
    # r3 is a pointer on one path and a scalar on the other: fine until read.
    ok("r0 = 0\nr3 = r1\nif r0 == 0 goto +1\nr3 = 0\nr0 = 1\nexit", event_size=8)
    e = reject(
        "r5 = *(u64 *)(r1 + 0)\nr3 = r1\nif r5 == 0 goto +1\nr3 = 0\nr0 = *(u64 *)(r3 + 0)\nexit",
        4,
        "r3 is used but holds different kinds of value on the paths that merge at insn 4",
    )
    assert "pointer to event+0" in e.message and "the scalar 0" in e.message
    # Two pointers to the same region at different offsets cannot be used either.
    reject(
        "r5 = *(u64 *)(r1 + 0)\nr3 = r1\nif r5 == 0 goto +1\nr3 += 8\nr0 = *(u64 *)(r3 + 0)\nexit",
        4,
        "different kinds of value",
    )
    # Scalars merge to an unknown scalar; the constant is lost.
    reject(
        "r5 = *(u64 *)(r1 + 0)\nr6 = 4\nif r5 == 0 goto +1\nr6 = 5\n"
        "r3 = path[0] ll\nr4 = rodata[0] ll\nr5 = r6\ncall str_eq\nexit",
        9,
        r"argument 5 \(r5\) of str_eq must be a known constant size, not a scalar",
    )


# -- memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "insn", "match"),
    [
        (
            "r0 = *(u64 *)(r1 + 24)",
            0,
            r"load of 8 bytes at event\+24 is outside the 24-byte event \(allowed: \[0, 24\)\)",
        ),
        ("r0 = *(u64 *)(r1 + 17)", 0, "load of 8 bytes at event\\+17 is outside"),
        ("r0 = *(u8 *)(r1 - 1)", 0, "event-1 is outside"),
        ("r1 += 40\nr0 = *(u16 *)(r1 - 9)", 1, r"load of 2 bytes at event\+31 is outside"),
        (
            "r0 = *(u64 *)(r2 + 320)",
            0,
            f"context\\+320 is outside the {DEFAULT_CONTEXT.size}-byte context",
        ),
        (
            "r0 = *(u8 *)(r10 + 0)",
            0,
            r"load of 1 bytes at fp\+0 is outside the stack \(allowed: \[-512, 0\)\)",
        ),
        ("*(u64 *)(r10 - 520) = 1\nr0 = 0", 0, r"store of 8 bytes at fp-520 is outside the stack"),
        (
            "r3 = rodata[8] ll\nr0 = *(u64 *)(r3 + 0)",
            2,
            r"load of 8 bytes at rodata\+8 is outside the 12-byte rodata",
        ),
        ("*(u64 *)(r1 + 0) = 1\nr0 = 0", 0, "store to read-only event memory through r1"),
        ("*(u8 *)(r2 + 0) = r1\nr0 = 0", 0, "store to read-only context memory through r2"),
        ("r3 = rodata[0] ll\n*(u8 *)(r3 + 0) = 0\nr0 = 0", 2, "store to read-only rodata memory"),
        (
            "r3 = 8\nr0 = *(u64 *)(r3 + 0)",
            1,
            "load through r3, the scalar 8: memory is reached only through pointers",
        ),
        ("r3 = path[0] ll\nr0 = *(u64 *)(r3 + 0)", 2, "field paths are only for helpers"),
        ("r0 = *(u64 *)(r10 - 16)", 0, r"^read of uninitialised stack at fp-16$"),
        (
            "*(u32 *)(r10 - 16) = 1\nr0 = *(u64 *)(r10 - 16)",
            1,
            "read of uninitialised stack at fp-16",
        ),
        ("*(u8 *)(r10 - 1) = 1\nr0 = *(u16 *)(r10 - 2)", 1, "read of uninitialised stack at fp-2"),
    ],
)
def test_memory_rules(text: str, insn: int, match: str) -> None:
    reject(text + "\nexit", insn, match)


def test_memory_accepted() -> None:
    info = ok(
        """
        r0 = *(u64 *)(r1 + 16)        ; the last 8 bytes of the event
        r3 = *(u8 *)(r2 + 15)         ; context
        r4 = rodata[4] ll
        r4 = *(u64 *)(r4 + 0)         ; rodata[4..12)
        *(u32 *)(r10 - 20) = 7        ; partly initialised slot...
        r5 = *(u32 *)(r10 - 20)       ; ...read where written
        r6 = r10
        r6 += -512
        *(u8 *)(r6 + 0) = r5          ; the deepest byte
        r6 = *(u8 *)(r10 - 512)
        r0 = 0
        exit
        """
    )
    assert info.max_stack_depth == 512
    assert ok("*(u32 *)(r10 - 20) = 1\nr0 = *(u16 *)(r10 - 18)\nexit").max_stack_depth == 24


def test_spill_and_fill() -> None:
    # A pointer spilled and filled by a DW load of the same slot stays a pointer.
    ok("*(u64 *)(r10 - 8) = r1\nr3 = *(u64 *)(r10 - 8)\nr0 = *(u64 *)(r3 + 0)\nexit")
    # A partial overwrite leaves scalar bytes: the fill is a scalar.
    reject(
        "*(u64 *)(r10 - 8) = r1\n*(u8 *)(r10 - 8) = 0\nr3 = *(u64 *)(r10 - 8)\nr0 = *(u64 *)(r3 + 0)\nexit",
        3,
        "load through r3, a scalar",
    )
    # A narrower fill is a scalar too.
    reject(
        "*(u64 *)(r10 - 8) = r1\nr3 = *(u32 *)(r10 - 8)\nr0 = *(u64 *)(r3 + 0)\nexit",
        2,
        "load through r3, a scalar",
    )
    # Spilled constants keep their value (a helper size may be spilled).
    ok(
        "*(u64 *)(r10 - 8) = 5\nr3 = path[0] ll\nr4 = rodata[0] ll\nr5 = *(u64 *)(r10 - 8)\n"
        "call str_eq\nexit"
    )


# -- pointer arithmetic and comparisons -------------------------------------------------


@pytest.mark.parametrize(
    ("text", "insn", "match"),
    [
        ("r1 *= 2", 0, "pointer arithmetic '\\*' .* only ptr \\+= constant and ptr -= constant"),
        ("r1 ^= 1", 0, "pointer arithmetic '\\^'"),
        ("r1 <<= 1", 0, "pointer arithmetic '<<'"),
        ("r3 = 8\nr1 += r3", 1, "pointer arithmetic with a register"),
        (
            "r3 = 8\nr3 += r1",
            1,
            "r3 \\+= r1: r1 is a pointer to event\\+0; pointers cannot be arithmetic operands",
        ),
        (
            "r1 -= r2",
            0,
            "arithmetic between r1, a pointer to event\\+0, and r2, a pointer to context\\+0",
        ),
        ("w1 += 8", 0, "32-bit ALU on a pointer"),
        ("w3 = w1", 0, "32-bit move of r1"),
        ("r1 = -r1", 0, "neg of r1, a pointer to event\\+0: only scalars allow it"),
        ("r1 = be16 r1", 0, "byte swap of r1"),
        ("r3 = path[0] ll\nr3 += 8", 2, "arithmetic on a field path handle"),
        ("r1 += 0x20000000\nr1 += 0x20000000", 1, "pointer offset 1073741824 out of range"),
        ("if r1 == 5 goto +0", 0, "a pointer may only be compared \\(64-bit == or !=\\) with 0"),
        ("if r1 > 0 goto +0", 0, "a pointer may only be compared"),
        ("if w1 == 0 goto +0", 0, "a pointer may only be compared"),
        ("if r1 == r2 goto +0", 0, "comparison of two pointers \\(r1 == r2\\)"),
        ("r3 = 7\nif r3 != r10 goto +0", 1, "a pointer may only be compared"),
    ],
)
def test_pointer_rules(text: str, insn: int, match: str) -> None:
    reject(text + "\nr0 = 0\nexit", insn, match)


def test_pointer_arithmetic_accepted() -> None:
    ok("r1 += 16\nr1 -= 8\nr0 = *(u64 *)(r1 + 8)\nexit")  # event+8+8: the last 8 bytes
    ok("if r1 != 0 goto +0\nr3 = 0\nif r3 == r1 goto +0\nr0 = 0\nexit")  # pointer vs 0


# -- helpers ------------------------------------------------------------------------------------

CALL = "r3 = path[0] ll\nr4 = rodata[0] ll\nr5 = 5\n{pre}call str_eq\n{post}exit"


def test_helper_arguments() -> None:
    ok(CALL.format(pre="", post=""))
    reject(
        CALL.format(pre="r1 += 8\n", post=""),
        6,
        r"argument 1 \(r1\) of str_eq must be the event pointer",
    )
    reject(
        CALL.format(pre="r2 = r1\n", post=""),
        6,
        r"argument 2 \(r2\) of str_eq must be the context pointer",
    )
    reject(
        CALL.format(pre="r3 = 0\n", post=""), 6, r"argument 3 \(r3\) of str_eq must be a field path"
    )
    reject(
        CALL.format(pre="r4 = r10\n", post=""),
        6,
        r"argument 4 \(r4\) of str_eq must be a pointer into rodata",
    )
    reject(
        CALL.format(pre="r4 += 8\n", post=""),
        6,
        r"str_eq: 5 bytes at rodata\+8 go past the end of rodata \(12 bytes\)",
    )
    reject(CALL.format(pre="r5 = *(u64 *)(r1 + 0)\n", post=""), 6, "must be a known constant size")
    reject(CALL.format(pre="r5 = -1\n", post=""), 6, "-1 bytes at rodata")
    ok(CALL.format(pre="r4 += 7\n", post=""))  # 7 + 5 = 12: exactly to the end
    # After a call, r1-r5 are clobbered and r0 is a scalar.
    reject(CALL.format(pre="", post="r0 = r1\n"), 6, "r1 is read before it is initialised")
    reject(CALL.format(pre="", post="r0 = *(u64 *)(r0 + 0)\n"), 6, "load through r0, a scalar")
    ok(CALL.format(pre="r6 = r1\n", post="r0 = *(u64 *)(r6 + 0)\n"))  # r6 survives
    reject(
        "r1 = 3\ncall get_threshold\nr1 = r0\nr2 = r3\ncall set_threshold\nexit", 3, "r3 is read"
    )
    reject("r3 = path[0] ll\nr4 = path[1] ll\nr2 = 0\ncall str_fields_eq\nexit", 5, "argument 2")
    reject("call get_pid\ncall get_threshold\nexit", 1, r"r1 is read before")
    info = ok("call get_pid\nr6 = r0\ncall ktime_ns\nr0 += r6\nexit")
    assert info.helpers == {abi.HELPER_GET_PID, abi.HELPER_KTIME_NS}


def test_field_addr_null_check() -> None:
    head = "r3 = path[{}] ll\ncall field_addr\n"
    # Used before the check.
    reject(
        head.format(2) + "r0 = *(u64 *)(r0 + 0)\nexit",
        3,
        r"possibly-null field address .* check it against 0 first",
    )
    reject(head.format(2) + "r0 += 8\nexit", 3, "arithmetic on a possibly-null pointer")
    # After the check: a pointer to the leaf's slot (8 bytes for s64 x).
    ok(head.format(2) + "if r0 == 0 goto +1\nr0 = *(u64 *)(r0 + 0)\nexit")
    ok(head.format(2) + "if r0 != 0 goto +1\nexit\nr0 = *(u64 *)(r0 + 0)\nexit")
    reject(
        head.format(2) + "if r0 == 0 goto +1\nr0 = *(u64 *)(r0 + 1)\nexit",
        4,
        r"field\+1 is outside the 8-byte field slot",
    )
    reject(
        head.format(1) + "if r0 == 0 goto +1\nr0 = *(u8 *)(r0 + 8)\nexit", 4, "8-byte field slot"
    )  # char[8]
    reject(
        head.format(2) + "if r0 == 0 goto +1\n*(u8 *)(r0 + 0) = 1\nr0 = 0\nexit",
        4,
        "store to read-only field memory",
    )
    # The null side is the scalar 0: loading through it is rejected.
    reject(
        head.format(2) + "if r0 != 0 goto +1\nr0 = *(u8 *)(r0 + 0)\nexit",
        4,
        "load through r0, the scalar 0",
    )
    # Copies and spills learn from the check too (same call).
    ok(head.format(2) + "r6 = r0\n*(u64 *)(r10 - 8) = r0\nif r0 == 0 goto +3\n"
       "r7 = *(u64 *)(r10 - 8)\nr0 = *(u64 *)(r6 + 0)\nr0 = *(u64 *)(r7 + 0)\nexit")  # fmt: skip
    # A comparison with a non-zero value or a 32-bit one teaches nothing: rejected.
    reject(head.format(2) + "if r0 == 1 goto +1\nexit\nexit", 3, "a pointer may only be compared")
    # exit with an unchecked pointer.
    reject(head.format(2) + "exit", 3, "exit with r0 a possibly-null field address")


# -- compiled-code shapes and scale -----------------------------------------------------------


def chain_program(n: int) -> Program:
    """``n`` str_eq predicates AND-chained, as a code generator emits them
    (callee-saved copies of r1/r2, one jump to a shared false exit each)."""
    items: list = [isa.mov(6, 1), isa.mov(7, 2)]
    for i in range(n):
        items += [
            isa.mov(1, 6),
            isa.mov(2, 7),
            isa.ld_pseudo(3, abi.PSEUDO_FIELD_PATH, i % 2),
            isa.ld_pseudo(4, abi.PSEUDO_RODATA, 0, 6 if i % 2 else 0),
            isa.mov_imm(5, 5),
            isa.call(abi.HELPER_STR_GLOB if i % 2 else abi.HELPER_STR_EQ),
            isa.stx(isa.DW, 10, 0, -8 * (1 + i % 64)),
            isa.jmp(isa.JNE, 0, 1, 0, reg=False),
        ]
    items += [isa.mov_imm(0, 1), isa.exit_(), isa.mov_imm(0, 0), isa.exit_()]
    arr = isa.program(items)
    false_at = len(arr) - 2
    for i in np.flatnonzero(arr["code"] == (isa.JMP | isa.JNE)):
        arr["off"][i] = false_at - i - 1
    return program(arr)


def test_4096_instructions_verify_fast() -> None:
    n = (abi.MAX_INSNS - 6) // 10
    p = chain_program(n)
    assert len(p) <= abi.MAX_INSNS
    verify(p)  # warm up
    t = time.perf_counter()
    info = verify(p)
    elapsed = time.perf_counter() - t
    assert info.insn_count == len(p) and info.reachable == len(p)
    assert info.max_stack_depth == 512
    assert elapsed < 1.0, f"{elapsed:.2f} s for {len(p)} instructions"
    # Straight-line ALU code of the full size, too.
    body = (
        [isa.mov_imm(0, 0)]
        + [isa.alu64(isa.ADD, 0, 1, reg=False)] * (abi.MAX_INSNS - 2)
        + [isa.exit_()]
    )
    t = time.perf_counter()
    verify(program(isa.program(body)))
    assert time.perf_counter() - t < 1.0


def test_chain_program_runs() -> None:
    from hwtrace.filter.packing import EventRecord

    lp = chain_program(20).link()
    assert lp(EventRecord(SCHEMA, {"name": "hello", "tag": "globby"}), 0) == 1
    assert lp(EventRecord(SCHEMA, {"name": "hello", "tag": "glo"}), 0) == 0
    assert lp(EventRecord(SCHEMA, {"name": None, "tag": "glob"}), 0) == 0


# -- the verifier's constants agree with the interpreter ------------------------------------
# Each program takes the unsafe path (a load through the uninitialised r9)
# unless the verifier computed the same value as Python; the interpreter
# then has to return 1.

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("name", sorted(ALU_SYMS))
@SETTINGS
@given(a=u64s, b=u64s, imm=s32s, use_imm=st.booleans())
def test_constant_folding_matches(
    name: str, bits: int, a: int, b: int, imm: int, use_imm: bool
) -> None:
    r = "r" if bits == 64 else "w"
    if use_imm:
        if name in ("div", "mod") and imm == 0:
            return
        if name in ("lsh", "rsh", "arsh"):
            imm %= bits
        rhs, b = str(imm), imm & ((1 << 64) - 1)
    else:
        rhs = f"{r}4"
    want = expect_alu(name, bits, a, b)
    text = (
        f"r3 = {a:#x} ll\nr4 = {b & ((1 << 64) - 1):#x} ll\n{r}3 {ALU_SYMS[name]} {rhs}\n"
        f"r5 = {want:#x} ll\nr0 = 1\nif r3 == r5 goto +1\nr0 = *(u64 *)(r9 + 0)\nexit"
    )
    p = program(text)
    verify(p)
    assert p.link()(0, 0) == 1


@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("sym", JUMPS)
@SETTINGS
@given(a=u64s, b=u64s)
def test_constant_branches_match(sym: str, bits: int, a: int, b: int) -> None:
    r = "r" if bits == 64 else "w"
    taken = expect_jump(sym, bits, a, b)
    # The path Python says is never taken has the bad load.
    unsafe = "r0 = *(u64 *)(r9 + 0)"
    fall, target = (unsafe, "r0 = 1") if taken else ("r0 = 1", unsafe)
    text = (
        f"r3 = {a:#x} ll\nr4 = {b:#x} ll\nif {r}3 {sym} {r}4 goto +2\n{fall}\nexit\n{target}\nexit"
    )
    p = program(text)
    verify(p)
    assert p.link()(0, 0) == 1
