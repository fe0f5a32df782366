"""The LTTng tier (hwtrace.filter.lttng, lttng_vm): every op against
hand-computed verdicts and the oracle, short-circuits seen through the
interpreter's trace mode, LTTng's missing-data rule, shift counts, NaN,
globs, $ctx/$app fields, path-walked loads, the bytecode validator's
messages, the C entry point, the retlif benchmark chain, and a hypothesis
differential test against reference.evaluate."""

from __future__ import annotations

import ctypes
import math
import struct
import time

import numpy as np
import pytest
from filter_strategies import events, expressions, schemas
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import filter as reference

from hwtrace.filter import lttng_vm as vm
from hwtrace.filter.check import compile_check
from hwtrace.filter.errors import FilterError
from hwtrace.filter.lttng import LttngProgram, compile_lttng, generate
from hwtrace.filter.packing import EventRecord, pack_many
from hwtrace.filter.schema import (
    DEFAULT_CONTEXT,
    IntType,
    Schema,
    SequenceType,
    StringType,
    layout,
)

INNER = layout([("x", "s16"), ("y", "string"), ("z", "char[4]")])
S = Schema.declare(
    "ev",
    [
        ("i", "s64"),
        ("u", "u64"),
        ("b", "u8"),
        ("sb", "s8"),
        ("h", "s16"),
        ("w", "u32"),
        ("d", "double"),
        ("f", "float"),
        ("s", "string"),
        ("c", "char[8]"),
        ("l", StringType("data_loc")),
        ("n", "u32"),
        ("q", SequenceType(IntType(4, True), "ptr", "n")),
        ("arr", "s32[4]"),
        ("dq", SequenceType(IntType(2, False), "data_loc")),
        ("t", INNER),
        ("nul", "string"),
    ],
)
VALUES = {
    "i": -5,
    "u": 2**64 - 1,
    "b": 200,
    "sb": -3,
    "h": -300,
    "w": 0xFFFFFFFF,
    "d": 2.5,
    "f": 0.5,
    "s": "hello",
    "c": "abcdefgh",  # fills the inline array: no NUL
    "l": "data",
    "q": [10, 20, 30],
    "arr": [1, 2, 3, 4],
    "dq": [7, 8],
    "t": {"x": -2, "y": "inner", "z": "ab"},
    "nul": None,
}
CTX = {"procname": "lttng-sessiond", "pid": 1234, "cpu_id": 1, "hostname": "box"}


@pytest.fixture(scope="module")
def records():
    return EventRecord(S, VALUES), EventRecord(DEFAULT_CONTEXT, CTX)


def verdict(text, ev, ctx, schema=S, context=DEFAULT_CONTEXT, **options):
    """The LTTng tier's verdict, checked against the oracle."""
    tree = compile_check(text, schema, context, **options)
    program = generate(tree)
    got = program(ev, ctx)
    assert got == reference.evaluate(tree, ev.address, ctx.address), (text, program.disassemble())
    return got, program


# (text, verdict, an op the program must use)
OPS = [
    ("i == -5", True, "EQ_S64"),
    ("i != -5", False, "NE_S64"),
    ("i < -4", True, "LT_S64"),
    ("i <= -5", True, "LE_S64"),
    ("i > -6", True, "GT_S64"),
    ("i >= -4", False, "GE_S64"),
    ("u == -1", True, "LOAD_FIELD_REF_S64"),
    ("u == 0xFFFFFFFFFFFFFFFF", True, "EQ_S64"),
    ("b == 200", True, "LOAD_FIELD_REF_S64"),
    ("sb == -3", True, "LOAD_FIELD_REF_S64"),
    ("h == -300", True, "LOAD_FIELD_REF_S64"),
    ("w == 4294967295", True, "LOAD_FIELD_REF_S64"),
    ("d == 2.5", True, "EQ_DOUBLE"),
    ("d != 2.5", False, "NE_DOUBLE"),
    ("d < 2.4", False, "LT_DOUBLE"),
    ("d <= 2.5", True, "LE_DOUBLE"),
    ("d > f", True, "GT_DOUBLE"),
    ("d >= 2.6", False, "GE_DOUBLE"),
    ("f == 0.5", True, "LOAD_FIELD_REF_DOUBLE"),
    ("d == 2", False, "EQ_DOUBLE_S64"),
    ("d != 2", True, "NE_DOUBLE_S64"),
    ("d > 2", True, "GT_DOUBLE_S64"),
    ("d < 3", True, "LT_DOUBLE_S64"),
    ("d >= 3", False, "GE_DOUBLE_S64"),
    ("d <= 2", False, "LE_DOUBLE_S64"),
    ("3 == d", False, "EQ_S64_DOUBLE"),
    ("3 != d", True, "NE_S64_DOUBLE"),
    ("3 > d", True, "GT_S64_DOUBLE"),
    ("3 < d", False, "LT_S64_DOUBLE"),
    ("2 >= d", False, "GE_S64_DOUBLE"),
    ("2 <= d", True, "LE_S64_DOUBLE"),
    ("i == 2.5", False, "EQ_S64_DOUBLE"),
    ("i & 3 == 3", True, "BIT_AND"),
    ("i | 1 == -5", True, "BIT_OR"),
    ("i ^ -1 == 4", True, "BIT_XOR"),
    ("b << 2 == 800", True, "BIT_LSHIFT"),
    ("u >> 60 == 15", True, "BIT_RSHIFT"),
    ("i >> 1 == 0x7FFFFFFFFFFFFFFD", True, "BIT_RSHIFT"),  # on u64
    ("b << 63 == 0", True, "BIT_LSHIFT"),
    ("~i == 4", True, "UNARY_BIT_NOT"),
    ("-i == 5", True, "UNARY_MINUS_S64"),
    ("+i == -5", True, "UNARY_PLUS_S64"),
    ("!i == 0", True, "UNARY_NOT_S64"),
    ("-d == -2.5", True, "UNARY_MINUS_DOUBLE"),
    ("+d == 2.5", True, "UNARY_PLUS_DOUBLE"),
    ("!d", False, "UNARY_NOT_DOUBLE"),
    ("d", True, "UNARY_NOT_DOUBLE"),  # a double verdict is !!d
    ("i", True, "RETURN"),
    ("2.5 == d", True, "LOAD_DOUBLE"),
    ('s == "hello"', True, "EQ_STRING"),
    ('s != "hello"', False, "NE_STRING"),
    ('s == "hell"', False, "EQ_STRING"),
    ('s == "hello!"', False, "EQ_STRING"),
    ('"hello" == s', True, "LOAD_STRING"),
    ('c == "abcdefgh"', True, "LOAD_FIELD_REF_STRING"),
    ('c == "abcdefg"', False, "LOAD_FIELD_REF_STRING"),
    ('c == "abcdefghi"', False, "LOAD_FIELD_REF_STRING"),
    ("s == c", False, "EQ_STRING"),
    ("s != l", True, "NE_STRING"),
    ('l == "data"', True, "LOAD_FIELD_REF_STRING"),
    ('s == "h*o"', True, "EQ_STAR_GLOB_STRING"),
    ('s != "*z*"', True, "NE_STAR_GLOB_STRING"),
    ('"he*" == s', True, "LOAD_STAR_GLOB_STRING"),
    ('c == "*fgh"', True, "EQ_STAR_GLOB_STRING"),
    ("q[1] == 20", True, "LOAD_FIELD_S64"),
    ("q[2] == 30", True, "LOAD_FIELD_S64"),
    ("arr[3] == 4", True, "LOAD_FIELD_REF_S64"),
    ("dq[1] == 8", True, "LOAD_FIELD_S64"),
    ("t.x == -2", True, "LOAD_FIELD_REF_S64"),
    ('t.y == "inner"', True, "LOAD_FIELD_REF_STRING"),
    ('t.z == "ab"', True, "LOAD_FIELD_REF_STRING"),
    ("i == -5 && d > 2", True, "AND"),
    ("i == -5 && d < 2", False, "AND"),
    ('i == 0 || s == "hello"', True, "OR"),
    ("i == 0 || d < 2", False, "OR"),
    ("(i == -5) == 1", True, "EQ_S64"),
    ("(i && d) == 1", True, "AND"),
    ("(i || 0.0) == 1", True, "OR"),
    ("(b && h) == 1", True, "AND"),  # the right operand becomes 0/1
    ("d && 0.0", False, "AND"),
    ("((i == 0) || b) == 1", True, "OR"),
]


@pytest.mark.parametrize("text,expected,op", OPS, ids=[t for t, _, _ in OPS])
def test_op(records, text, expected, op):
    got, program = verdict(text, *records)
    assert got == expected
    assert any(line.split()[1] == op for line in program.disassemble()), program.disassemble()


def test_every_opcode_is_generated_by_some_test(records):
    used = set()
    texts = [t for t, _, _ in OPS] + [
        "$ctx.pid == 1234",
        '$ctx.procname == "x"',
        "$ctx.pid == 1234.0",
    ]
    for text in texts:
        used |= {op for _, op, _ in compile_lttng(text, S).instructions()}
    used |= {op for _, op, _ in compile_lttng("nosuch == 1", S, unknown="false").instructions()}
    used |= {
        op for _, op, _ in _big_schema_program('x == 1 && y > 1.0 && big == "a"')[0].instructions()
    }
    ctx = Schema.declare("c", [("r", "double")], root=DEFAULT_CONTEXT.root)
    used |= {op for _, op, _ in compile_lttng("$ctx.r > 1", S, ctx).instructions()}
    assert set(vm.OP_NAMES) - used == set(), sorted(vm.OP_NAMES[o] for o in set(vm.OP_NAMES) - used)


# -- short-circuit ----------------------------------------------------------------------

RETLIF = Schema.declare("retlif", [(f"var{k}", "string") for k in range(9)] + [("lyf", "s64")])
CHAIN = " && ".join(f'var{k} == "str{k}"' for k in range(9)) + " && lyf == 42"


def _retlif_values(lyf=42, first="str0"):
    values = {f"var{k}": f"str{k}" for k in range(9)}
    values["var0"] = first
    values["lyf"] = lyf
    return values


def _executed(program, pcs, names):
    ops = dict((pc, vm.OP_NAMES[op]) for pc, op, _ in program.instructions())
    return [ops[pc] for pc in pcs if ops[pc] in names]


def test_false_biased_chain_stops_at_first_false_predicate():
    program = compile_lttng(CHAIN, RETLIF)
    ctx = EventRecord(DEFAULT_CONTEXT, {})
    ok, pcs = program.trace(EventRecord(RETLIF, _retlif_values()), ctx)
    assert ok and _executed(program, pcs, {"EQ_STRING", "EQ_S64"}).count("EQ_STRING") == 9
    assert _executed(program, pcs, {"EQ_S64"}) == ["EQ_S64"]
    ok, pcs = program.trace(EventRecord(RETLIF, _retlif_values(first="nope")), ctx)
    assert not ok
    # One comparison, then the first AND jumps straight to RETURN.
    assert _executed(program, pcs, {"EQ_STRING", "EQ_S64", "AND", "RETURN"}) == [
        "EQ_STRING",
        "AND",
        "RETURN",
    ]
    ok, pcs = program.trace(EventRecord(RETLIF, _retlif_values(lyf=43)), ctx)
    assert not ok and len(_executed(program, pcs, {"EQ_STRING", "EQ_S64"})) == 10


def test_short_circuit_skips_a_missing_field(records):
    ev, ctx = records
    # || decided by the left: the missing field on the right is never read.
    got, program = verdict("i == -5 || nosuch == 1", ev, ctx, unknown="false")
    assert got is True
    assert "LOAD_FIELD_UNLINKED" not in _executed(
        program, program.trace(ev, ctx)[1], set(vm.OP_NAMES.values())
    )
    got, _ = verdict("i == 0 || nosuch == 1", ev, ctx, unknown="false")
    assert got is False
    # && decided by the left: false, and the missing field is not reached.
    got, program = verdict("i == 0 && nosuch == 1", ev, ctx, unknown="false")
    ops = _executed(program, program.trace(ev, ctx)[1], set(vm.OP_NAMES.values()))
    assert got is False and "LOAD_FIELD_UNLINKED" not in ops and ops[-1] == "RETURN"
    got, program = verdict("i == -5 && nosuch == 1", ev, ctx, unknown="false")
    ops = _executed(program, program.trace(ev, ctx)[1], set(vm.OP_NAMES.values()))
    assert got is False and ops[-1] == "LOAD_FIELD_UNLINKED"  # evaluation stopped there
    # A null string pointer skipped by || does not matter either.
    assert verdict('i == -5 || nul == "x"', ev, ctx)[0] is True
    assert verdict('i == 0 || nul == "x"', ev, ctx)[0] is False


# -- missing data -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        'nul == "x"',
        'nul != "x"',
        '!(nul == "x")',
        'nul == "*"',
        "nul == s",
        "q[3] == 0",
        "!(q[3] == 0)",
        "q[3] != 0",
        "arr[4] == 0",
        "arr[4] != 0",
        "dq[2] == 0",
        "!(dq[2] == 7)",
        "i == -5 && q[5] == 0",
        "(q[7] == 0) == 0",
    ],
)
def test_missing_data_makes_the_whole_filter_false(records, text):
    got, _ = verdict(text, *records)
    assert got is False


def test_unknown_fields_lenient_and_strict(records):
    ev, ctx = records
    for text in ["nosuch == 1", "!(nosuch == 1)", 'nosuch != "x"', "$ctx.nosuch == 0"]:
        got, program = verdict(text, ev, ctx, unknown="false")
        assert got is False
        assert any("LOAD_FIELD_UNLINKED" in line for line in program.disassemble())
    with pytest.raises(FilterError) as e:
        compile_lttng("i == 1 && nosuch == 1", S)
    assert e.value.column == 11 and "unknown field" in str(e.value)


def test_null_pointer_and_short_sequence_through_path_walk():
    # A sequence whose pointer is null, and one whose length says 1.
    ev = EventRecord(S, {**VALUES, "q": None})
    ctx = EventRecord(DEFAULT_CONTEXT, CTX)
    assert verdict("q[0] == 0", ev, ctx)[0] is False
    assert verdict("!(q[0] == 0)", ev, ctx)[0] is False
    ev = EventRecord(S, {**VALUES, "q": [5]})
    assert verdict("q[0] == 5", ev, ctx)[0] is True
    assert verdict("q[1] == 0", ev, ctx)[0] is False


# -- shifts and NaN -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected",
    [
        ("b << 64 == 0", False),
        ("!(b << 64 == 0)", False),
        ("b >> 64 != 1", False),
        ("b >> -1 == 0", False),
        ("b << b == 0", False),  # count 200 read at run time
        ("b << sb == 0", False),  # count -3
        ("b << 63 == 0", True),
        ("b >> 7 == 1", True),
        ("1 << 64 == 0", False),  # left for run time by the checker
        ("i == 0 || b << 64", False),
        ("i == -5 || b << 64", True),  # never evaluated
        ("i == 0 && b << 64", False),
    ],
)
def test_shift_count_outside_0_63(records, text, expected):
    assert verdict(text, *records)[0] is expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("d == d", False),
        ("d != d", True),
        ("d < 1", False),
        ("d >= 1", False),
        ("1 > d", False),
        ("1 != d", True),
        ("d > 1.0", False),
        ("!d", False),
        ("d", True),
        ("d && 1", True),
        ("d == 0 || d != 0", True),
        ("-d != -d", True),
        ("(d == d) == 0", True),
        ("f != f", True),
    ],
)
def test_nan(text, expected):
    ev = EventRecord(S, {**VALUES, "d": math.nan, "f": math.nan})
    ctx = EventRecord(DEFAULT_CONTEXT, CTX)
    assert verdict(text, ev, ctx)[0] is expected


def test_infinities_against_s64():
    ctx = EventRecord(DEFAULT_CONTEXT, CTX)
    ev = EventRecord(S, {**VALUES, "d": math.inf, "i": 2**63 - 1})
    assert verdict("d > 9223372036854775807", ev, ctx)[0] is True
    assert verdict("i < d", ev, ctx)[0] is True
    assert verdict("-d < i", ev, ctx)[0] is True
    # 2^63-1 as a double is 2^63: equal to the double literal.
    assert verdict("i == 9223372036854775807.0", ev, ctx)[0] is True


# -- globs -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern,subject,expected",
    [
        ("*", "", True),
        ("*", "anything", True),
        ("a*", "abc", True),
        ("a*", "ba", False),
        ("*b", "ab", True),
        ("*b", "ba", False),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "acb", False),
        ("a*b*c", "abcbc", True),
        ("**", "", True),
        ("*lttng*", "my-lttng-app", True),
        ("lttng-*d", "lttng-sessiond", True),
        ("lttng-*d", "lttng-sessiond2", False),
        ("\\*", "*", True),
        ("\\*", "x", False),
        ("a\\*b", "a*b", True),
        ("a\\*b", "axb", False),
        ("a\\*b*", "a*bcd", True),
        ("a\\\\*", "a\\xyz", True),
        ("a\\\\*", "axyz", False),
        ("日*", "日本語", True),
        ("*語", "日本語", True),
        ("h*llo", "héllo", True),
        ("ab*", "ab\0cd", True),  # the string ends at its NUL
        ("*cd", "ab\0cd", False),
    ],
)
def test_glob(pattern, subject, expected):
    ctx = EventRecord(DEFAULT_CONTEXT, CTX)
    schema = Schema.declare(
        "g", [("s", "string"), ("c", "char[12]"), ("l", StringType("data_loc"))]
    )
    data = subject.encode()
    ev = EventRecord(schema, {"s": data, "c": data[:12], "l": data})
    lit = pattern.replace('"', '\\"')
    for field in ("s", "l") + (("c",) if len(data) <= 12 else ()):
        assert verdict(f'{field} == "{lit}"', ev, ctx, schema)[0] is expected, field
        assert verdict(f'"{lit}" != {field}', ev, ctx, schema)[0] is (not expected), field


def test_literal_on_either_side_and_two_literals_folded(records):
    ev, ctx = records
    assert verdict('"hello" == s', ev, ctx)[0] is True
    assert verdict('"a*" == "abc" && i == -5', ev, ctx)[0] is True  # folded by the checker
    assert verdict('"a*" != "abc" || i == 0', ev, ctx)[0] is False


# -- context -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text,expected,op",
    [
        ('$ctx.procname == "lttng-sessiond"', True, "GET_CONTEXT_REF_STRING"),
        ('$ctx.procname == "lttng*"', True, "GET_CONTEXT_REF_STRING"),
        ('$ctx.procname == "lttng"', False, "GET_CONTEXT_REF_STRING"),
        ("$ctx.pid == 1234", True, "GET_CONTEXT_REF_S64"),
        ("$ctx.pid == 1234 && $ctx.cpu_id == 1 && i == -5", True, "GET_CONTEXT_REF_S64"),
        ("$ctx.pid == i", False, "GET_CONTEXT_REF_S64"),
        ('$ctx.hostname == "box"', True, "GET_CONTEXT_REF_STRING"),
        ("$ctx.hostname == s", False, "EQ_STRING"),
    ],
)
def test_ctx_fields(records, text, expected, op):
    got, program = verdict(text, *records)
    assert got is expected
    assert any(line.split()[1] == op for line in program.disassemble())


def test_app_context_fields():
    ctx_schema = Schema.declare(
        "ctx",
        [
            ("pid", "s64"),
            ("myprov:count", "s32"),
            ("myprov:ratio", "float"),
            ("myprov:name", "string"),
        ],
        root=DEFAULT_CONTEXT.root,
    )
    ctx = EventRecord(
        ctx_schema, {"pid": 7, "myprov:count": -4, "myprov:ratio": 0.25, "myprov:name": "db"}
    )
    ev = EventRecord(S, VALUES)
    assert verdict("$app.myprov:count == -4", ev, ctx, S, ctx_schema)[0] is True
    assert verdict("$app.myprov:ratio < 0.5", ev, ctx, S, ctx_schema)[0] is True
    assert verdict('$app.myprov:name == "d*"', ev, ctx, S, ctx_schema)[0] is True
    got, _ = verdict("$app.myprov:name == s", ev, ctx, S, ctx_schema)
    assert got is False
    assert "GET_CONTEXT_REF_DOUBLE" in "\n".join(
        compile_lttng("$app.myprov:ratio > 0", S, ctx_schema).disassemble()
    )


# -- path-walked loads (offsets past the 16-bit inline operand) ------------------------------


def _big_schema_program(text):
    schema = Schema.declare(
        "big", [("big", "char[70000]"), ("x", "s32"), ("y", "float"), ("s", "string")]
    )
    return compile_lttng(text, schema), schema


def test_fields_past_64k_go_through_the_field_table():
    program, schema = _big_schema_program('x == -7 && y > 1.0 && big == "ab*" && s == "k"')
    text = "\n".join(program.disassemble())
    for op in ("LOAD_FIELD_S64", "LOAD_FIELD_DOUBLE", "LOAD_FIELD_STRING"):
        assert op in text
    assert len(program.fields) == 4
    ctx = EventRecord(DEFAULT_CONTEXT, CTX)
    ev = EventRecord(schema, {"big": "abc", "x": -7, "y": 1.5, "s": "k"})
    tree = compile_check('x == -7 && y > 1.0 && big == "ab*" && s == "k"', schema)
    assert program(ev, ctx) is True and reference.evaluate(tree, ev.address, ctx.address)
    ev = EventRecord(schema, {"big": "abc", "x": -7, "y": 1.5, "s": None})
    assert program(ev, ctx) is False


# -- the program object ------------------------------------------------------------------------


def test_disassembly_and_tables(records):
    program = compile_lttng('s == "hello" && (q[1] == 20 || d > 1.5)', S)
    lines = program.disassemble()
    assert lines[0].split()[:4] == [
        "0",
        "LOAD_FIELD_REF_STRING",
        "offset",
        str(S.field("s").offset),
    ]
    assert lines[0].endswith("; s")
    assert any("LOAD_STRING" in ln and "'hello'" in ln for ln in lines)
    assert any("LOAD_FIELD_S64" in ln and "field 0 q[1]" in ln for ln in lines)
    assert any("LOAD_DOUBLE" in ln and "1.5" in ln for ln in lines)
    assert lines[-1].split()[1] == "RETURN"
    skips = [int(ln.split()[-1]) for ln in lines if ln.split()[1] in ("AND", "OR")]
    starts = {pc for pc, _, _ in program.instructions()}
    assert skips and all(s in starts for s in skips)
    assert program.literals == (b"hello",)
    assert program.fields[0].text == "q[1]"
    assert program.memory_bytes > len(program.bytecode) + 6 * 8
    assert program.stack_depth == 2
    assert program(*records) is True


def test_literal_pool_deduplicates():
    program = compile_lttng('s == "x" || c == "x" || l == "x*"', S)
    assert program.literals == (b"x", b"x*")


def test_c_entry_point(records):
    ev, ctx = records
    fn = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(
        vm.run_address()
    )
    for text, expected in [('s == "h*" && q[2] == 30', 1), ('d < 0 || nul == "x"', 0)]:
        program = compile_lttng(text, S)
        assert program.run_address == vm.run_address()
        assert fn(program.program_address, ev.address, ctx.address) == expected
        assert program(ev, ctx) == bool(expected)


def test_call_accepts_addresses_and_arrays(records):
    ev, ctx = records
    program = compile_lttng("$ctx.pid == 1234", S)
    assert program(ev.address, ctx.address) is True
    buf = np.zeros(DEFAULT_CONTEXT.size, np.uint8)
    assert program(ev, buf) is False
    with pytest.raises(TypeError):
        program("event", ctx)
    # A null record the program would read is refused, not dereferenced.
    assert program.reads_context and not program.reads_event
    assert program(0, ctx) is True
    with pytest.raises(ValueError, match="reads a context record"):
        program(ev)
    with pytest.raises(ValueError, match="reads an event record"):
        compile_lttng("q[1] == 20", S).trace(0, ctx)
    assert compile_lttng("i == -5", S)(ev) is True


def test_glob_escapes_round_trip_through_the_pool():
    program = compile_lttng('s == "a\\\\*\\**"', S)
    assert program.literals == (b"a\\\\*\\**",)


# -- the validator ------------------------------------------------------------------------------


def _s64(v):
    return bytes([vm.LOAD_S64]) + struct.pack("<q", v)


R = bytes([vm.RETURN])


@pytest.mark.parametrize(
    "code,literals,where,words",
    [
        (b"", (), "insn 0", "empty"),
        (bytes([200]), (), "insn 0", "unknown opcode 0xc8"),
        (bytes([vm.LOAD_S64, 1, 2]), (), "insn 0", "past the end"),
        (bytes([vm.EQ_S64]) + R, (), "insn 0", "underflow"),
        (_s64(1) + bytes([vm.LOAD_DOUBLE]) + struct.pack("<d", 1) + bytes([vm.EQ_S64]) + R,
         (), "insn 2", "types"),
        (_s64(1) + R + _s64(1), (), "insn 1", "end with its only RETURN"),
        (_s64(1), (), "insn 1", "end with its only RETURN"),
        (_s64(1) + R + R, (), "insn 1", "end with its only RETURN"),
        (_s64(1) + _s64(1) + R, (), "insn 2", "exactly one s64"),
        (_s64(1) + bytes([vm.AND, 0, 0]) + _s64(1) + R, (), "insn 1", "forward"),
        (_s64(1) + bytes([vm.AND, 13, 0]) + _s64(1) + R, (), "insn 3", "inside an instruction"),
        (_s64(1) + bytes([vm.AND, 30, 0]) + _s64(1) + _s64(1) + R, (), "insn 4", "target 30 differs"),
        (_s64(1) + _s64(1) + bytes([vm.AND, 31, 0]) + _s64(1) + bytes([vm.BIT_AND, vm.BIT_AND]) + R,
         (), "insn 4", "pops below"),
        (bytes([vm.LOAD_STRING, 5, 0]) + R, (), "insn 0", "literal index 5"),
        (bytes([vm.LOAD_STRING, 0, 0, vm.LOAD_STRING, 0, 0, vm.EQ_S64]) + R,
         (b"a",), "insn 2", "types"),
        (bytes([vm.LOAD_STRING, 0, 0, vm.UNARY_NOT_S64]) + R, (b"a",), "insn 1", "types"),
        (bytes([vm.LOAD_STRING, 0, 0, vm.LOAD_STRING, 0, 0, vm.EQ_STAR_GLOB_STRING]) + R,
         (b"a",), "insn 2", "types"),
        (bytes([vm.LOAD_FIELD_REF_S64, 0, 0, 3]) + R, (), "insn 0", "bad operand 3"),
        (bytes([vm.LOAD_FIELD_REF_STRING, 0, 0, 9, 0, 0]) + R, (), "insn 0", "bad operand 9"),
        (bytes([vm.LOAD_FIELD_S64, 0, 0]) + R, (), "insn 0", "field index 0"),
        (bytes([vm.LOAD_DOUBLE]) + struct.pack("<d", 1) + bytes([vm.AND, 13, 0])
         + _s64(1) + R, (), "insn 1", "types"),
    ],
)  # fmt: skip
def test_validator_names_the_instruction(code, literals, where, words):
    with pytest.raises(FilterError) as e:
        LttngProgram(code, literals)
    assert e.value.where == where, str(e.value)
    assert words in str(e.value) and where in str(e.value)


def test_validator_checks_field_kinds():
    path = S.resolve(("q", 1))
    assert path is not None
    LttngProgram(bytes([vm.LOAD_FIELD_S64, 0, 0]) + R, (), (path,))
    with pytest.raises(FilterError, match=r"insn 0.*field 0 does not have the type"):
        LttngProgram(bytes([vm.LOAD_FIELD_STRING, 0, 0, vm.UNARY_NOT_S64]) + R, (), (path,))
    with pytest.raises(FilterError, match="field 0 does not have the type"):
        LttngProgram(bytes([vm.LOAD_FIELD_UNLINKED, 0, 0, 0]) + R, (), (path,))
    LttngProgram(bytes([vm.LOAD_FIELD_UNLINKED, 0, 0, 0]) + R, (), (None,))


def test_stack_depth_limit():
    # Each "i | i ^ i & i << (" leaves four operands pending on the stack.
    nest = "i | i ^ i & i << ("
    deep = nest * 33 + "i" + ")" * 33 + " == 0"
    with pytest.raises(FilterError) as e:
        compile_lttng(deep, S)
    assert "more than the LTTng interpreter's 128 stack entries" in str(e.value)
    assert e.value.column == 1 + len(nest) * 32  # the 129th pending operand
    assert e.value.expression == deep
    ok = nest * 30 + "i" + ")" * 30 + " == 0"
    ev, ctx = EventRecord(S, VALUES), EventRecord(DEFAULT_CONTEXT, CTX)
    program = compile_lttng(ok, S)
    assert program.stack_depth == 121
    assert program(ev, ctx) is reference.evaluate(compile_check(ok, S), ev.address, ctx.address)
    # The validator enforces the same limit on bytecode from elsewhere.
    with pytest.raises(FilterError, match=r"insn 128: .*deeper than the interpreter.s 128"):
        LttngProgram(_s64(1) * 129 + bytes([vm.BIT_AND]) * 128 + R)


def test_codegen_refuses_untyped_trees():
    from hwtrace.filter.parse import parse

    with pytest.raises(FilterError, match="not type-checked"):
        generate(parse("i == 1"))


# -- the benchmark chain ----------------------------------------------------------------------


def test_retlif_chain_native_loop():
    """The 10-predicate chain of Sharma and Dagenais (JCST 2016) over 9 ptr
    strings and an integer, run from a numba loop: counts are exact; ns/event
    is printed."""
    n = 20_000
    program = compile_lttng(CHAIN, RETLIF)
    ctx = EventRecord(DEFAULT_CONTEXT, {})
    code, lits, fields = program.arrays
    rows = [_retlif_values(lyf=42 if k % 4 else 43) for k in range(n)]
    batch = pack_many(RETLIF, rows)
    addresses = batch.addresses.astype(np.int64)
    assert vm.run_many(code, lits, fields, addresses, ctx.address) == n - n // 4
    true_biased = np.full(n, addresses[1], np.int64)
    false_biased = np.full(n, addresses[0], np.int64)
    vm.run_many(code, lits, fields, true_biased[:10], ctx.address)
    for name, events_ in (("TRUE-biased", true_biased), ("FALSE-biased (lyf)", false_biased)):
        best = math.inf
        for _ in range(3):
            t = time.thread_time_ns()
            count = vm.run_many(code, lits, fields, events_, ctx.address)
            best = min(best, (time.thread_time_ns() - t) / n)
        assert count == (n if name.startswith("TRUE") else 0)
        print(f"\nLTTng tier, retlif 10-predicate chain, {name}: {best:.0f} ns/event")


# -- differential test against the oracle -----------------------------------------------------


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_agrees_with_reference(data):
    schema = data.draw(schemas())
    text = data.draw(expressions(schema, DEFAULT_CONTEXT))
    unknown = data.draw(st.sampled_from(["error", "false"]))
    try:
        tree = compile_check(text, schema, DEFAULT_CONTEXT, unknown=unknown)
    except FilterError:
        with pytest.raises(FilterError):
            compile_lttng(text, schema, unknown=unknown)
        return
    program = generate(tree)
    for _ in range(data.draw(st.integers(1, 3))):
        ev = EventRecord(schema, data.draw(events(schema)))
        ctx = EventRecord(DEFAULT_CONTEXT, data.draw(events(DEFAULT_CONTEXT)))
        expected = reference.evaluate(tree, ev.address, ctx.address)
        assert program(ev, ctx) == expected, (text, ev, ctx, program.disassemble())
