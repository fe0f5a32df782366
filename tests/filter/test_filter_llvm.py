"""The LLVM tier (hwtrace.filter.llvm): every operator and type rule, each
string storage, field paths through pointers and data_loc with their
missing-data rule, globs against native.glob_match, differential runs
against the oracle (reference.evaluate), and the emitted object linked into
a C program."""

from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
import textwrap
import time

import pytest
from filter_strategies import events, expressions, schemas
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from oracles import filter as reference

from hwtrace.filter import ast, native
from hwtrace.filter.check import check
from hwtrace.filter.errors import FilterError
from hwtrace.filter.llvm import compile_llvm
from hwtrace.filter.packing import EventRecord
from hwtrace.filter.parse import parse
from hwtrace.filter.schema import (
    DEFAULT_CONTEXT,
    ArrayType,
    Field,
    IntType,
    Schema,
    SequenceType,
    StringType,
    StructType,
    layout,
)

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")
ZERO_CONTEXT = EventRecord(DEFAULT_CONTEXT, {})


def typed(text: str, schema: Schema, *, fold: bool = False, unknown: str = "error") -> ast.Node:
    """The checked tree; unfolded by default, so the tier (not the checker)
    computes literal-only operators too."""
    return check(parse(text), schema, DEFAULT_CONTEXT, unknown=unknown, text=text, fold=fold)  # type: ignore[arg-type]


def verdict(
    text: str,
    schema: Schema,
    values: dict | EventRecord | None = None,
    context: dict | None = None,
    **kw,
) -> bool:
    """The LLVM tier's verdict on one record; the oracle must agree."""
    tree = typed(text, schema, **kw)
    rec = values if isinstance(values, EventRecord) else EventRecord(schema, values or {})
    ctx = EventRecord(DEFAULT_CONTEXT, context) if context is not None else ZERO_CONTEXT
    got = compile_llvm(tree)(rec, ctx)
    assert got is reference.evaluate(tree, rec.address, ctx.address), text
    return got


def _u32_at(address: int) -> ctypes.c_uint32:
    return ctypes.c_uint32.from_address(address)


# -- numbers ------------------------------------------------------------------------------

INTS = Schema.declare(
    "ints",
    [
        ("s8", "s8"),
        ("u8", "u8"),
        ("s16", "s16"),
        ("u16", "u16"),
        ("s32", "s32"),
        ("u32", "u32"),
        ("s64", "s64"),
        ("u64", "u64"),
        ("f32", "float"),
        ("f64", "double"),
    ],
)


def test_integer_leaves_widen_by_width_and_signedness():
    ones = {n: -1 for n in ("s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64")}
    expect = {"s8": -1, "u8": 255, "s16": -1, "u16": 65535, "s32": -1, "u32": 2**32 - 1}
    expect |= {"s64": -1, "u64": -1}  # u64 wraps to s64
    for name, v in expect.items():
        assert verdict(f"{name} == {v}", INTS, ones), name
        assert not verdict(f"{name} == {v - 1}", INTS, ones), name
    assert verdict("u64 == 0xFFFFFFFFFFFFFFFF", INTS, ones)
    # u64 max is s64 -1: less than zero in the signed comparison.
    assert verdict("u64 < 0", INTS, ones)
    assert not verdict("u32 < 0", INTS, ones)


def test_unaligned_static_field_is_one_load():
    sch = Schema("odd", StructType((Field("v", IntType(4, True), 3),), 8))
    buf = ctypes.create_string_buffer(b"\0\0\0" + (-123456).to_bytes(4, "little", signed=True))
    f = compile_llvm(typed("v == -123456", sch))
    assert f(ctypes.addressof(buf), ZERO_CONTEXT)
    body = f.asm().split(":\n", 1)[1]
    assert "3(%rdi)" in body  # the load at offset 3, no path walk


def test_floats_widen_and_compare_as_doubles():
    rec = EventRecord(INTS, {"f32": 0.1, "f64": 2.5, "s64": 3})
    assert verdict("f32 == 0.100000001490116119384765625", INTS, rec)  # the widened float
    assert not verdict("f32 == 0.1", INTS, rec)
    assert not verdict("f64 > s64", INTS, rec)
    assert verdict("f64 < s64", INTS, rec)
    assert verdict("3.0 == s64", INTS, rec)
    # s64 against double: the integer converts to double (2^53 + 1 rounds).
    assert verdict("9007199254740993 == 9007199254740992.0", INTS)
    assert not verdict("9007199254740993 == 9007199254740992", INTS)


@pytest.mark.parametrize(
    ("o", "expect"),
    [("==", False), ("!=", True), ("<", False), ("<=", False), (">", False), (">=", False)],
)
def test_nan_compares_as_c(o, expect):
    rec = EventRecord(INTS, {"f64": math.nan, "f32": math.nan})
    assert verdict(f"f64 {o} f64", INTS, rec) is expect
    assert verdict(f"f32 {o} 1", INTS, rec) is expect
    assert verdict(f"1.0 {o} f64", INTS, rec) is expect


def test_nan_truth_and_not():
    rec = EventRecord(INTS, {"f64": math.nan})
    assert verdict("f64", INTS, rec)  # nonzero: true, as C
    assert not verdict("!f64", INTS, rec)
    assert verdict("f64 && 1", INTS, rec)
    assert not verdict("0.0", INTS)
    assert not verdict("-0.0", INTS)
    assert verdict("!0.0", INTS)
    assert verdict("!-0.0", INTS)


@pytest.mark.parametrize(
    ("o", "a", "b", "expect"),
    [
        ("<", -1, 1, True),
        ("<", 1, -1, False),
        ("<=", 5, 5, True),
        (">", -(2**63), 2**63 - 1, False),
        (">=", 2**63 - 1, -(2**63), True),
        ("==", 7, 7, True),
        ("!=", 7, 7, False),
        ("!=", -1, 1, True),
    ],
)
def test_s64_comparisons_are_signed(o, a, b, expect):
    rec = EventRecord(INTS, {"s64": a, "u64": b})
    assert verdict(f"s64 {o} u64", INTS, rec) is expect
    assert verdict(f"{a} {o} {b}", INTS) is expect


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("12 & 10", 8),
        ("12 | 10", 14),
        ("12 ^ 10", 6),
        ("~0", -1),
        ("1 << 63", -(2**63)),
        ("-1 >> 60", 15),  # logical: computed on u64
        ("0x8000000000000000 >> 63", 1),
        ("-(-9223372036854775808)", -(2**63)),  # wrapping
        ("-5", -5),
        ("+-5", -5),
        ("!0", 1),
        ("!9", 0),
        ("2 && 3", 1),
        ("0 || -4", 1),
        ("0 && 1", 0),
        ("0 || 0.0", 0),
        ("(1 == 1) == 1", 1),
        ("~~7", 7),
    ],
)
def test_integer_operators(text, value):
    assert verdict(f"({text}) == {value}", INTS)
    assert not verdict(f"({text}) == {value ^ 1}", INTS)


def test_operators_on_fields():
    rec = EventRecord(INTS, {"f64": 2.5, "s64": -(2**63), "u32": 0xF0, "s8": -1})
    assert verdict("-f64 == -2.5", INTS, rec)
    assert verdict("-s64 == s64", INTS, rec)
    assert verdict("-0.0 < 1", INTS, rec)
    assert verdict("(u32 & 0x30) == 0x30", INTS, rec)
    assert verdict("u32 & 0x30 == 0x30", INTS, rec)  # bitwise binds tighter
    assert verdict("(s8 | 0) == -1", INTS, rec)
    assert verdict("~s8 == 0", INTS, rec)
    assert verdict("!s64 == 0", INTS, rec)


@pytest.mark.parametrize("count", [64, 65, 1000, -1, -(2**63)])
def test_shift_count_out_of_range_makes_the_whole_expression_false(count):
    rec = EventRecord(INTS, {"s64": count, "u8": 1})
    assert not verdict("(u8 << s64) == 0", INTS, rec)
    assert not verdict("!((u8 << s64) == 12345)", INTS, rec)  # not just the comparison
    assert not verdict("((1 >> s64) == 7) || 1", INTS, rec)
    # Short-circuit: never evaluated.
    assert verdict("1 || (u8 << s64) == 0", INTS, rec)
    assert not verdict("!(0 && (u8 << s64) == 0) && 0", INTS, rec)
    assert verdict("!(0 && (u8 << s64) == 0)", INTS, rec)


def test_shift_count_in_range_from_a_field():
    for count in (0, 1, 62, 63):
        rec = EventRecord(INTS, {"s64": count})
        assert verdict(f"(1 << s64) == {(1 << count) & (2**64 - 1)}", INTS, rec)
        assert verdict(f"(-1 >> s64) == {(2**64 - 1) >> count}", INTS, rec)


def test_missing_fields_and_short_circuit():
    rec = EventRecord(INTS, {"s64": 1})
    lenient = dict(unknown="false")
    assert verdict("s64 == 1 || nope == 1", INTS, rec, **lenient)
    assert not verdict("nope == 1 || s64 == 1", INTS, rec, **lenient)  # first: all false
    assert not verdict("s64 == 1 && nope == 1", INTS, rec, **lenient)
    assert not verdict("!(nope == 1)", INTS, rec, **lenient)
    assert not verdict("nope != 1", INTS, rec, **lenient)
    assert not verdict('nope == "x"', INTS, rec, **lenient)
    assert not verdict('nope != "x*"', INTS, rec, **lenient)
    assert not verdict("$ctx.nope != 1", INTS, rec, **lenient)
    assert verdict("s64 == 2 || !(s64 == 2)", INTS, rec)


def test_logical_results_are_0_or_1():
    rec = EventRecord(INTS, {"s64": 5, "f64": 0.5})
    assert verdict("(s64 && f64) == 1", INTS, rec)
    assert verdict("(0 || s64) == 1", INTS, rec)
    assert verdict("(s64 || nope) == 1", INTS, rec, unknown="false")


# -- strings --------------------------------------------------------------------------------

STRS = Schema.declare(
    "strs",
    [
        ("p", "string"),
        ("q", "string"),
        ("i", "char[8]"),
        ("j", "char[4]"),
        ("d", StringType("data_loc")),
        ("e", StringType("data_loc")),
        ("n", "s32"),
    ],
)

STRING_CASES = [
    ("abc", "abc", True),
    ("abc", "abcd", False),
    ("abcd", "abc", False),
    ("", "", True),
    ("", "a", False),
    ("a", "", False),
    ("str0", "str1", False),
    ("hello world", "hello world", True),
    ("héllo", "héllo", True),
    ("a*b", r"a\*b", True),
    ("axb", r"a\*b", False),
    ('q"\\', r"q\"\\", True),
]


@pytest.mark.parametrize(("value", "literal", "expect"), STRING_CASES)
@pytest.mark.parametrize("field", ["p", "i", "d"])
def test_string_equals_literal_each_storage(field, value, literal, expect):
    raw = value.encode()
    if field == "i" and len(raw) > 8:
        expect = False  # truncated to the capacity
    rec = EventRecord(STRS, {field: value})
    assert verdict(f'{field} == "{literal}"', STRS, rec) is expect
    assert verdict(f'{field} != "{literal}"', STRS, rec) is (not expect)
    assert verdict(f'"{literal}" == {field}', STRS, rec) is expect


def test_inline_string_full_capacity_has_no_nul():
    rec = EventRecord(STRS, {"j": "abcd", "n": ord("Z")})  # the byte after j is not a NUL
    assert verdict('j == "abcd"', STRS, rec)
    assert not verdict('j == "abcdZ"', STRS, rec)
    assert not verdict('j == "abc"', STRS, rec)
    assert verdict('j == "ab*"', STRS, rec)
    assert verdict('j == "*cd"', STRS, rec)
    assert not verdict('j == "*dZ"', STRS, rec)
    assert verdict('j == "a*d"', STRS, rec)


def test_data_loc_string_ends_at_its_length_or_nul():
    rec = EventRecord(STRS, {"d": "abcXYZ", "e": ""})
    d = _u32_at(rec.address + STRS.field("d").offset)
    e = _u32_at(rec.address + STRS.field("e").offset)
    e.value = (d.value & 0xFFFF) | 3 << 16  # e: the same bytes, length 3: "abc"
    assert verdict('e == "abc"', STRS, rec)
    assert not verdict('e == "abcX"', STRS, rec)
    assert verdict('e == "*bc"', STRS, rec)
    assert not verdict('e == "*X*"', STRS, rec)
    assert not verdict('d == "abc"', STRS, rec)
    assert verdict('d == "abcXYZ"', STRS, rec)
    assert not verdict("d == e", STRS, rec)
    e.value = (d.value & 0xFFFF) | 6 << 16  # length 6, no NUL inside
    assert verdict('e == "abcXYZ"', STRS, rec)
    assert verdict("d == e", STRS, rec)
    assert verdict('e == "*YZ"', STRS, rec)
    e.value = (d.value & 0xFFFF) | 0 << 16  # empty
    assert verdict('e == ""', STRS, rec)
    assert verdict('e == "*"', STRS, rec)
    assert not verdict('e == "a*"', STRS, rec)
    # A NUL inside the length ends it earlier.
    rec = EventRecord(STRS, {"d": b"ab\0cd"})
    assert verdict('d == "ab"', STRS, rec)
    assert not verdict('d == "ab*d"', STRS, rec)


def test_literal_with_nul_never_equals():
    # The parser has no escape for NUL: the tree by hand.
    rec = EventRecord(STRS, {"p": "ab", "i": "ab", "d": "ab"})
    for name in ("p", "i", "d"):
        f = typed(f'{name} == "x"', STRS)
        for op, want in (("==", False), ("!=", True)):
            f.op, f.right = op, ast.StrLit((b"ab\0",), type="string")
            got = compile_llvm(f)(rec, ZERO_CONTEXT)
            assert got is want is reference.evaluate(f, rec.address, ZERO_CONTEXT.address)


def test_null_string_pointer_makes_the_whole_expression_false():
    rec = EventRecord(STRS, {"p": None, "i": "x"})
    assert not verdict('p == "x"', STRS, rec)
    assert not verdict('p != "x"', STRS, rec)
    assert not verdict('p == "*"', STRS, rec)
    assert not verdict("p != i", STRS, rec)
    assert not verdict("i != p", STRS, rec)
    assert verdict('i == "x" || p == "x"', STRS, rec)


@pytest.mark.parametrize(
    ("a", "b", "expect"),
    [
        ("abc", "abc", True),
        ("abc", "abd", False),
        ("ab", "abc", False),
        ("abc", "ab", False),
        ("", "", True),
        ("abcdefgh", "abcdefgh", True),  # inline at full capacity
    ],
)
def test_field_against_field_across_storages(a, b, expect):
    rec = EventRecord(STRS, dict(p=a, q=b, i=a, j=b[:4], d=a, e=b))
    assert verdict("p == q", STRS, rec) is expect
    assert verdict("i == e", STRS, rec) is expect
    assert verdict("d == q", STRS, rec) is expect
    assert verdict("d != e", STRS, rec) is not expect
    assert verdict("j == p", STRS, rec) is (b[:4] == a)
    assert verdict("p == p", STRS, rec)


GLOB_CASES = [
    ("ab*", "abc", True),  # prefix
    ("ab*", "ab", True),
    ("ab*", "a", False),
    ("*bc", "abc", True),  # suffix
    ("*bc", "bcx", False),
    ("*bc", "c", False),
    ("a*c", "abc", True),  # middle star
    ("a*c", "ac", True),
    ("a*c", "a", False),
    ("ab*ba", "aba", False),  # prefix and suffix must not overlap
    ("ab*ba", "abba", True),
    ("*b*", "abc", True),  # a part in the middle
    ("*b*", "ac", False),
    ("a*b*c*d", "axbxcxd", True),  # several stars
    ("a*b*c*d", "axcxbxd", False),
    ("a*bc*bd*", "abcbd", True),
    ("a*bc*bd*", "abdbc", False),
    ("*aa*a", "aaa", True),
    ("*aa*a", "aa", False),
    ("*", "", True),
    ("*", "anything", True),
    ("**", "", True),
    ("a**b", "ab", True),  # an empty middle part
    (r"a\*b*", "a*bc", True),  # escaped star: a literal "*"
    (r"a\*b*", "axbc", False),
    (r"*x\*", "ax*", True),
    (r"*x\*", "axy", False),
    ("*é*", "héllo", True),
]


@pytest.mark.parametrize(("pattern", "value", "expect"), GLOB_CASES)
@pytest.mark.parametrize("field", ["p", "i", "d"])
def test_glob(field, pattern, value, expect):
    rec = EventRecord(STRS, {field: value})
    assert verdict(f'{field} == "{pattern}"', STRS, rec) is expect
    assert verdict(f'"{pattern}" != {field}', STRS, rec) is (not expect)


def test_glob_and_compare_code_is_self_contained():
    # No libc: LLVM would make the length loop strlen.
    tree = typed('p == "a*b*c" && q == "*x" && p == q && e == "*y"', STRS)
    assert "call" not in compile_llvm(tree).asm()


def _pattern(parts: tuple[bytes, ...]) -> bytes:
    """The raw pattern native.glob_match takes (``*`` wildcard, ``\\`` escapes)."""
    return b"*".join(p.replace(b"\\", b"\\\\").replace(b"*", b"\\*") for p in parts)


def _native(fn, value: bytes, bound: int, pattern: bytes) -> bool:
    s = ctypes.create_string_buffer(value, len(value) + 1)
    p = ctypes.create_string_buffer(pattern, len(pattern) + 1)
    return bool(fn(ctypes.addressof(s), bound, ctypes.addressof(p), len(pattern)))


_alphabet = st.sampled_from(b"ab*\\").map(lambda c: bytes([c]))
_text = st.lists(_alphabet, max_size=7).map(b"".join)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(_text, min_size=1, max_size=4), value=_text)
def test_glob_and_equality_agree_with_native(parts, value):
    """Against native.glob_match / str_equal (the helpers the other tiers
    call), with any bytes in the parts (stars and backslashes included)."""
    parts = tuple(parts) if len(parts) > 1 else (parts[0], b"")
    exact = b"".join(parts)  # the same text without wildcards
    rec = EventRecord(STRS, {"p": value, "i": value, "d": value})
    # data_loc: the record's length counts the NUL, as tracefs.
    for field, bound in (("p", native.NO_LIMIT), ("i", 8), ("d", len(value) + 1)):
        v = value[:8] if field == "i" else value
        tree = typed(f'{field} == "x"', STRS)
        tree.right = ast.StrLit(parts, type="string")
        want = _native(native.glob_match, v, bound, _pattern(parts))
        assert compile_llvm(tree)(rec, ZERO_CONTEXT) is want, (field, parts, value)
        tree.right = ast.StrLit((exact,), type="string")
        want = _native(native.str_equal, v, bound, exact)
        assert compile_llvm(tree)(rec, ZERO_CONTEXT) is want, (field, exact, value)


def test_two_literals_unfolded_match_as_the_checker_folds():
    assert verdict('"abc" == "abc"', STRS)
    assert not verdict('"abc" == "abd"', STRS)
    assert verdict('"a*" == "abc"', STRS)
    assert verdict('"xbc" != "a*"', STRS)
    assert verdict('"a*" == "abc"', STRS, fold=True)
    with pytest.raises(FilterError, match="two glob patterns"):
        tree = typed('"abc" == "abd"', STRS)
        tree.left = ast.StrLit((b"a", b""), type="string")
        tree.right = ast.StrLit((b"", b"b"), type="string")
        compile_llvm(tree)


# -- paths: arrays, sequences, pointers, data_loc ---------------------------------------------

ITEM = layout([("id", "s16"), ("name", "string"), ("tag", "char[4]")])
SEQS = Schema.declare(
    "seqs",
    [
        ("arr", ArrayType(IntType(4, True), 3)),
        ("n", "u8"),
        ("items", SequenceType(ITEM, "ptr", "n")),
        ("m", "s32"),
        ("vals", SequenceType(IntType(8, True), "ptr", "m")),
        ("dl", SequenceType(IntType(2, False), "data_loc")),
        ("inner", layout([("k", "u32"), ("s", "char[8]")])),
    ],
)


def seqs(**values) -> EventRecord:
    return EventRecord(SEQS, dict(arr=[10, -20, 30]) | values)


def test_static_array_and_nested_struct():
    rec = seqs(inner=dict(k=0xFFFFFFFF, s="inner"))
    assert verdict("arr[1] == -20", SEQS, rec)
    assert verdict("arr[2] == 30", SEQS, rec)
    assert verdict("inner.k == 4294967295", SEQS, rec)
    assert verdict('inner.s == "inner"', SEQS, rec)
    assert verdict('inner.s == "in*er"', SEQS, rec)
    # Index past a static array's length: missing, the whole expression false.
    assert typed("arr[3] == 0", SEQS).left.path.static_offset is None
    assert not verdict("arr[3] != 0", SEQS, rec)
    assert verdict("arr[0] == 10 || arr[5] == 0", SEQS, rec)


def test_pointer_sequence_of_structs_with_length_and_null():
    items = [dict(id=-1, name="zero", tag="t0"), dict(id=7, name="one", tag="t1t1")]
    rec = seqs(items=items)
    assert verdict("items[0].id == -1", SEQS, rec)
    assert verdict('items[1].name == "one"', SEQS, rec)
    assert verdict('items[1].tag == "t1t1"', SEQS, rec)
    assert verdict('items[0].name == "z*o"', SEQS, rec)
    assert verdict("items[0].name != items[1].name", SEQS, rec)
    assert not verdict("items[2].id != 0", SEQS, rec)  # past the length
    rec = seqs(items=items, n=1)  # a length that says less
    assert not verdict("items[1].id != 0", SEQS, rec)
    assert verdict("items[0].id == -1", SEQS, rec)
    rec = seqs(items=None, n=2)  # null pointer
    assert not verdict("items[0].id != 0", SEQS, rec)
    assert not verdict('items[0].name != ""', SEQS, rec)
    rec = seqs(items=[dict(id=1, name=None, tag="")] * 2)  # null string inside
    assert not verdict('items[1].name != ""', SEQS, rec)
    assert verdict("items[1].id == 1", SEQS, rec)


def test_signed_length_negative_is_empty():
    rec = seqs(vals=[5, 6], m=-1)
    assert not verdict("vals[0] != 0", SEQS, rec)
    rec = seqs(vals=[5, 6])
    assert verdict("vals[1] == 6", SEQS, rec)
    # The u8 length 255 is not negative.
    rec = seqs(items=[dict(id=3, name="", tag="")] * 255)
    assert verdict("items[254].id == 3", SEQS, rec)


def test_data_loc_sequence_length_counts_bytes():
    rec = seqs(dl=[1, 65535, 3])
    assert verdict("dl[1] == 65535", SEQS, rec)
    assert verdict("dl[2] == 3", SEQS, rec)
    assert not verdict("dl[3] != 0", SEQS, rec)
    assert not verdict("dl[0] != 0", SEQS, seqs(dl=[]))


def test_context_fields():
    ctx = dict(procname="bash", pid=1234, hostname="h" * 64)
    rec = {"s64": 1234}
    assert verdict("$ctx.pid == s64", INTS, rec, ctx)
    assert verdict('$ctx.procname == "bash"', INTS, rec, ctx)
    assert verdict('$ctx.procname == "ba*"', INTS, rec, ctx)
    assert verdict(f'$ctx.hostname == "{"h" * 64}"', INTS, rec, ctx)
    assert not verdict(f'$ctx.hostname == "{"h" * 63}"', INTS, rec, ctx)


# -- differential: the oracle ------------------------------------------------------------------


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_agrees_with_the_oracle(data):
    schema = data.draw(schemas())
    text = data.draw(expressions(schema, DEFAULT_CONTEXT))
    try:
        tree = check(parse(text), schema, DEFAULT_CONTEXT, unknown="false", text=text)
    except FilterError:
        assume(False)
    f = compile_llvm(tree)
    records = [EventRecord(schema, data.draw(events(schema))) for _ in range(4)]
    ctx = EventRecord(DEFAULT_CONTEXT, {"pid": 23, "procname": "lttng-sessiond"})
    for rec in records:
        assert f(rec, ctx) is reference.evaluate(tree, rec.address, ctx.address), text


# -- the benchmark shape ------------------------------------------------------------------------

BENCH = Schema.declare("tpfilt", [(f"var{k}", "string") for k in range(9)] + [("lyf", "s32")])
BENCH_TEXT = " && ".join(f'(var{i} == "str{i}")' for i in range(9)) + " && (lyf == {})"


def bench_tree(k: int = 42) -> ast.Node:
    return typed(BENCH_TEXT.format(k), BENCH, fold=True)


def bench_record(lyf: int = 42, **override) -> EventRecord:
    values = {f"var{i}": f"str{i}" for i in range(9)} | {"lyf": lyf} | override
    return EventRecord(BENCH, values)


def test_benchmark_chain():
    f = compile_llvm(bench_tree(), name="tpfilt", event_schema=BENCH)
    assert f(bench_record(), ZERO_CONTEXT)
    assert not f(bench_record(43), ZERO_CONTEXT)
    assert not f(bench_record(var4="str"), ZERO_CONTEXT)
    assert not f(bench_record(var8="str80"), ZERO_CONTEXT)
    assert not f(bench_record(var0=None), ZERO_CONTEXT)
    assert "call" not in f.asm()  # strings inline, no strcmp
    assert 0 < f.code_bytes <= f.memory_bytes < 4096
    assert '@"tpfilt"' in f.ir and "define" in f.optimized_ir


def test_double_literal_counts_as_constant_data():
    f = compile_llvm(typed("f64 == 2.75 || f32 < 0.3", INTS))
    assert f.memory_bytes > f.code_bytes > 0


def test_compile_errors_name_the_problem():
    one = typed("1", INTS)
    with pytest.raises(FilterError, match="C identifier"):
        compile_llvm(one, name="no-good")
    with pytest.raises(FilterError, match="optimisation level"):
        compile_llvm(one, opt=4)
    with pytest.raises(FilterError, match="string") as e:
        compile_llvm(ast.StrLit((b"x",), type="string", column=3))
    assert e.value.column == 3
    deep = typed("s64", INTS)
    for _ in range(5000):  # deeper than the parser allows: built by hand
        deep = ast.Unary("!", deep, type="s64")
    with pytest.raises(FilterError, match="nested too deeply"):
        compile_llvm(deep)


@pytest.mark.parametrize("opt", [0, 1, 2])
def test_lower_optimisation_levels_agree(opt):
    f = compile_llvm(bench_tree(), opt=opt)
    assert f(bench_record(), ZERO_CONTEXT) and not f(bench_record(41), ZERO_CONTEXT)


def test_many_filters_share_one_engine():
    filters = [compile_llvm(typed(f"s64 == {k}", INTS)) for k in range(20)]
    rec = EventRecord(INTS, {"s64": 7})
    assert [f(rec, ZERO_CONTEXT) for f in filters] == [k == 7 for k in range(20)]
    assert len({f.address for f in filters}) == 20


# -- the emitted object in C -------------------------------------------------------------------

C_MAIN = r"""
#include <stdio.h>
#include <string.h>
#include "filter.h"

static struct tpfilt_event ev;
static char s[9][16];

static void fill(int lyf, int broken) {
    for (int k = 0; k < 9; k++) {
        snprintf(s[k], sizeof s[k], "str%d", k);
        ev.var0 = 0;
    }
    ev.var0 = s[0]; ev.var1 = s[1]; ev.var2 = s[2]; ev.var3 = s[3]; ev.var4 = s[4];
    ev.var5 = s[5]; ev.var6 = s[6]; ev.var7 = s[7]; ev.var8 = s[8];
    ev.lyf = lyf;
    if (broken == 1) s[5][3] = 'x';
    if (broken == 2) ev.var2 = 0;
    if (broken == 3) strcat(s[8], "y");
}

int main(void) {
    int cases[][2] = {{42, 0}, {43, 0}, {42, 1}, {42, 2}, {42, 3}, {-42, 0}};
    for (unsigned k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        fill(cases[k][0], cases[k][1]);
        printf("%lld\n", (long long)tpfilt(&ev, 0));
    }
    return 0;
}
"""


def _python_verdicts(f) -> list[bool]:
    def rec(lyf, broken):
        over = {}
        if broken == 1:
            over["var5"] = "strx"
        if broken == 2:
            over["var2"] = None
        if broken == 3:
            over["var8"] = "str8y"
        return bench_record(lyf, **over)

    cases = [(42, 0), (43, 0), (42, 1), (42, 2), (42, 3), (-42, 0)]
    return [f(rec(*c), ZERO_CONTEXT) for c in cases]


@needs_gcc
@pytest.mark.parametrize("portable", [False, True])
def test_emit_object_links_into_c_and_agrees(tmp_path, portable):
    f = compile_llvm(bench_tree(), name="tpfilt", event_schema=BENCH)
    obj = f.emit_object(tmp_path / "tpfilt.o", portable=portable)
    assert obj.read_bytes()[:4] == b"\x7fELF"
    (tmp_path / "filter.h").write_text(f.c_header())
    (tmp_path / "main.c").write_text(C_MAIN)
    exe = tmp_path / "main"
    subprocess.run(
        [GCC, "-O2", "-Wall", "-Werror", "-o", exe, tmp_path / "main.c", obj],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
    expect = _python_verdicts(f)
    assert expect == [True, False, False, False, False, False]
    assert [bool(int(v)) for v in out] == expect


@needs_gcc
def test_emit_shared_loads_and_agrees(tmp_path):
    f = compile_llvm(bench_tree(), name="tpfilt_so")
    lib = ctypes.CDLL(str(f.emit_shared(tmp_path / "libtpfilt.so")))
    fn = lib.tpfilt_so
    fn.restype, fn.argtypes = ctypes.c_int64, [ctypes.c_void_p, ctypes.c_void_p]
    for r in (bench_record(), bench_record(1), bench_record(var3=None)):
        assert bool(fn(r.address, 0)) is f(r, ZERO_CONTEXT)


def test_emit_shared_without_a_compiler_says_so(tmp_path, monkeypatch):
    f = compile_llvm(typed("1", INTS))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(FilterError, match="no C compiler"):
        f.emit_shared(tmp_path / "x.so")


APP_CONTEXT = Schema.declare(
    "context",
    [("procname", "char[16]"), ("myprov:count", "s64"), ("myprov_count", "u16")],
    root=DEFAULT_CONTEXT.root,
)

C_NESTED = r"""
#include <stdio.h>
#include <string.h>
#include "nested.h"

static unsigned char buf[sizeof(struct nested_event) + 8];

int main(void) {
    struct nested_event *ev = (struct nested_event *)buf;
    struct nested_event_items items[2];
    struct nested_context ctx;
    uint16_t two = 2;
    memset(items, 0, sizeof items);
    memset(&ctx, 0, sizeof ctx);
    items[1].name = "x";
    ev->n = 2;
    ev->items = items;
    memcpy(buf + sizeof *ev, &two, 2);  /* the data_loc payload after the record */
    ev->dl = (uint32_t)sizeof *ev | 2u << 16;
    strcpy(ctx.procname, "yes");
    ctx.myprov_count = 3;
    printf("%lld\n", (long long)nested(ev, &ctx));
    ev->n = 1;  /* items[1] is past the length now */
    printf("%lld\n", (long long)nested(ev, &ctx));
    ev->n = 2;
    ctx.myprov_count = 4;
    printf("%lld\n", (long long)nested(ev, &ctx));
    ctx.myprov_count = 3;
    ev->dl = (uint32_t)sizeof *ev | 1u << 16;  /* one byte: no dl[0] */
    printf("%lld\n", (long long)nested(ev, &ctx));
    return 0;
}
"""


@needs_gcc
def test_c_header_describes_nested_layouts_the_filter_reads(tmp_path):
    text = 'items[1].name == "x" && dl[0] == 2 && $ctx.procname == "y*" && $app.myprov:count == 3'
    tree = check(parse(text), SEQS, APP_CONTEXT, text=text)
    f = compile_llvm(tree, name="nested", event_schema=SEQS, context_schema=APP_CONTEXT)
    header = f.c_header()
    assert "struct nested_event_items" in header and "__data_loc" in header
    assert "myprov_count_;" in header  # two members with one C name
    (tmp_path / "nested.h").write_text(header)
    (tmp_path / "main.c").write_text(C_NESTED)
    obj = f.emit_object(tmp_path / "nested.o")
    exe = tmp_path / "main"
    subprocess.run(
        [GCC, "-std=gnu11", "-O2", "-Wall", "-Werror", "-o", exe, tmp_path / "main.c", obj],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["1", "0", "0", "0"]
    # The same records built in Python give the same verdicts.
    item = dict(id=0, name="x", tag="")
    ctx = EventRecord(APP_CONTEXT, {"procname": "yes", "myprov:count": 3})
    assert f(seqs(items=[item, item], dl=[2]), ctx)
    assert not f(seqs(items=[item, item], n=1, dl=[2]), ctx)


# -- speed (report only) -----------------------------------------------------------------------

BENCH_C = textwrap.dedent(
    r"""
    #include <stdint.h>
    #include <string.h>
    #include <time.h>
    typedef int64_t (*filter_fn)(const void *, const void *);
    struct ev { const char *var[9]; int32_t lyf; };

    /* The predicate by hand, as Sharma and Dagenais's SIMPLE baseline (JCST 2016). */
    __attribute__((noinline)) int64_t by_hand(const void *e, const void *c) {
        const struct ev *ev = e;
        (void)c;
        return strcmp(ev->var[0], "str0") == 0 && strcmp(ev->var[1], "str1") == 0
            && strcmp(ev->var[2], "str2") == 0 && strcmp(ev->var[3], "str3") == 0
            && strcmp(ev->var[4], "str4") == 0 && strcmp(ev->var[5], "str5") == 0
            && strcmp(ev->var[6], "str6") == 0 && strcmp(ev->var[7], "str7") == 0
            && strcmp(ev->var[8], "str8") == 0 && ev->lyf == 42;
    }

    filter_fn by_hand_address(void) { return by_hand; }

    /* ns per call; *hits gets the number of true verdicts. */
    double time_calls(filter_fn f, const void *e, int64_t n, int64_t *hits) {
        struct timespec a, b;
        int64_t h = 0;
        clock_gettime(CLOCK_MONOTONIC, &a);
        for (int64_t i = 0; i < n; i++) {
            h += f(e, 0) != 0;
            __asm__ volatile("" ::: "memory");
        }
        clock_gettime(CLOCK_MONOTONIC, &b);
        *hits = h;
        return ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n;
    }
    """
)


@needs_gcc
def test_speed_against_hand_written_c(tmp_path):
    src = tmp_path / "bench.c"
    src.write_text(BENCH_C)
    so = tmp_path / "libbench.so"
    subprocess.run([GCC, "-O2", "-shared", "-fPIC", "-o", so, src], check=True)
    lib = ctypes.CDLL(str(so))
    lib.by_hand_address.restype = ctypes.c_void_p
    lib.time_calls.restype = ctypes.c_double
    lib.time_calls.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]
    f = compile_llvm(bench_tree())
    rec = bench_record()
    hits = ctypes.c_int64()
    n = 2_000_000
    results = {}
    for label, fn in (("llvm", f.address), ("gcc -O2 strcmp", lib.by_hand_address())):
        best = math.inf
        for _ in range(3):
            t = lib.time_calls(fn, rec.address, n, ctypes.byref(hits))
            assert hits.value == n
            best = min(best, t)
        results[label] = best
    t = time.strftime("%H:%M:%S")
    print(
        f"\n[{t}] 10-predicate TRUE chain, ns/call: "
        + ", ".join(f"{k} {v:.2f}" for k, v in results.items())
    )
    assert lib.time_calls(f.address, bench_record(43).address, 1000, ctypes.byref(hits)) > 0
    assert hits.value == 0
