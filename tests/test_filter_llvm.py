"""The LLVM tier (hwtrace.filter.llvm): every operator and type rule, each
string storage, field paths through pointers and data_loc with their
missing-data rule, globs against native.glob_match, and the emitted object
linked into a C program."""

from __future__ import annotations

import ctypes
import math
import shutil
import struct
import subprocess
import textwrap
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwtrace.filter import ast, native
from hwtrace.filter.errors import FilterError
from hwtrace.filter.llvm import compile_llvm
from hwtrace.filter.schema import (
    DEFAULT_CONTEXT,
    ArrayType,
    Field,
    FloatType,
    IntType,
    Schema,
    SequenceType,
    StringType,
    StructType,
    layout,
)

GCC = shutil.which("gcc")
needs_gcc = pytest.mark.skipif(GCC is None, reason="gcc not installed")

# -- records built with ctypes ----------------------------------------------------------


class Record:
    """A record laid out as ``schema`` holding ``values`` (a dict per
    struct; strings as bytes, None for a null pointer; sequences as lists).
    data_loc payloads follow the fixed part, offsets from the record start.
    ``raw`` overrides a field's slot with given bytes (to lie about lengths)."""

    def __init__(self, schema: Schema, values: dict, raw: dict[str, bytes] | None = None):
        self.keep: list[object] = []
        self.size = schema.size
        self.tail = bytearray()
        fixed = bytearray(schema.size)
        self._struct(fixed, 0, schema.struct, values)
        for name, data in (raw or {}).items():
            f = schema.field(name)
            fixed[f.offset : f.offset + len(data)] = data
        self.buf = ctypes.create_string_buffer(bytes(fixed) + bytes(self.tail) + bytes(8))
        self.address = ctypes.addressof(self.buf)

    def _struct(self, out: bytearray, at: int, st: StructType, values: dict) -> None:
        for f in st.fields:
            if f.name in values:
                self._value(out, at + f.offset, f.type, values[f.name])

    def _data_loc(self, data: bytes, length: int | None = None) -> int:
        off = self.size + len(self.tail)
        self.tail += data
        return off | (len(data) if length is None else length) << 16

    def _elements(self, t, items: list) -> bytes:
        size = t.fixed_size
        out = bytearray(size * len(items))
        for k, item in enumerate(items):
            self._value(out, k * size, t, item)
        return bytes(out)

    def _value(self, out: bytearray, at: int, t, v) -> None:
        if isinstance(t, IntType):
            raw = (v & ((1 << 8 * t.size) - 1)).to_bytes(t.size, "little")
        elif isinstance(t, FloatType):
            raw = struct.pack("<f" if t.size == 4 else "<d", v)
        elif isinstance(t, StringType):
            if t.storage == "ptr":
                raw = self._pointer(None if v is None else bytes(v) + b"\0")
            elif t.storage == "inline":
                raw = bytes(v)[: t.capacity].ljust(t.capacity, b"\0")
            else:
                raw = self._data_loc(bytes(v)).to_bytes(4, "little")
        elif isinstance(t, ArrayType):
            raw = self._elements(t.element, v)
        elif isinstance(t, SequenceType):
            data = None if v is None else self._elements(t.element, v)
            if t.storage == "ptr":
                raw = self._pointer(data)
            else:
                raw = self._data_loc(data).to_bytes(4, "little")
        else:
            self._struct(out, at, t, v)
            return
        out[at : at + len(raw)] = raw

    def _pointer(self, data: bytes | None) -> bytes:
        if data is None:
            return bytes(8)
        buf = ctypes.create_string_buffer(data, len(data) + 8)
        self.keep.append(buf)
        return ctypes.addressof(buf).to_bytes(8, "little")


# -- typed trees built by hand (what check.py produces) ------------------------------------

_LEAF = {"int": "s64", "float": "double", "string": "string"}


def fld(schema: Schema, *names: str | int, root: str = "event") -> ast.FieldRef:
    path = schema.resolve(tuple(names))
    typ = _LEAF[path.leaf] if path is not None else "s64"
    return ast.FieldRef(root, tuple(names), path=path, type=typ)


def missing(name: str = "nope", typ: str = "s64") -> ast.FieldRef:
    return ast.FieldRef("event", (name,), path=None, type=typ)


def lit(v) -> ast.Node:
    if isinstance(v, bytes):
        return ast.StrLit((v,), type="string")
    if isinstance(v, float):
        return ast.FloatLit(v, type="double")
    return ast.IntLit(v, type="s64")


def glob(*parts: bytes) -> ast.StrLit:
    return ast.StrLit(tuple(parts), type="string")


def op(o: str, left, right) -> ast.Node:
    left = left if isinstance(left, ast.Node) else lit(left)
    right = right if isinstance(right, ast.Node) else lit(right)
    if o in ast.LOGICAL_OPS:
        return ast.Logical(o, left, right, type="s64")
    return ast.Binary(o, left, right, type="s64")


def un(o: str, x) -> ast.Node:
    x = x if isinstance(x, ast.Node) else lit(x)
    typ = x.type if o in "+-" else "s64"
    return ast.Unary(o, x, type=typ)


def run(tree: ast.Node, event: Record | int = 0, context: Record | int = 0, **kw) -> bool:
    f = compile_llvm(tree, **kw)
    return f(event, context)


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
        ("pad", "u8"),
        ("odd", "s32"),  # placed by hand at an odd offset below
    ],
)


def test_integer_leaves_widen_by_width_and_signedness():
    ones = {n: -1 for n in ("s8", "u8", "s16", "u16", "s32", "u32", "s64", "u64")}
    rec = Record(INTS, ones)
    expect = {"s8": -1, "u8": 255, "s16": -1, "u16": 65535, "s32": -1, "u32": 2**32 - 1}
    expect |= {"s64": -1, "u64": -1}  # u64 wraps to s64
    for name, v in expect.items():
        assert run(op("==", fld(INTS, name), v), rec), name
        assert not run(op("==", fld(INTS, name), v - 1), rec), name
    # u64 max is s64 -1: less than zero in the signed comparison.
    assert run(op("<", fld(INTS, "u64"), 0), rec)
    assert not run(op("<", fld(INTS, "u32"), 0), rec)


def test_unaligned_static_field_is_one_load():
    sch = Schema("odd", StructType((Field("v", IntType(4, True), 3),), 8))
    rec = Record(sch, {"v": -123456})
    f = compile_llvm(op("==", fld(sch, "v"), -123456))
    assert f(rec, 0)
    body = f.asm().split(":\n", 1)[1]
    assert "3(%rdi)" in body  # the load at offset 3, no path walk


def test_floats_widen_and_compare_as_doubles():
    rec = Record(INTS, {"f32": 0.1, "f64": 2.5, "s64": 3})
    widened = struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert run(op("==", fld(INTS, "f32"), widened), rec)
    assert not run(op("==", fld(INTS, "f32"), 0.1), rec)
    assert run(op(">", fld(INTS, "f64"), fld(INTS, "s64")), rec) is False
    assert run(op("<", fld(INTS, "f64"), fld(INTS, "s64")), rec)
    assert run(op("==", lit(3.0), fld(INTS, "s64")), rec)
    # s64 against double: the integer converts to double (2^53 + 1 rounds).
    assert run(op("==", lit(2**53 + 1), lit(float(2**53))))
    assert not run(op("==", lit(2**53 + 1), lit(2**53)))


@pytest.mark.parametrize(
    ("o", "expect"),
    [("==", False), ("!=", True), ("<", False), ("<=", False), (">", False), (">=", False)],
)
def test_nan_compares_as_c(o, expect):
    rec = Record(INTS, {"f64": math.nan, "f32": math.nan})
    assert run(op(o, fld(INTS, "f64"), fld(INTS, "f64")), rec) is expect
    assert run(op(o, fld(INTS, "f32"), 1), rec) is expect
    assert run(op(o, 1.0, fld(INTS, "f64")), rec) is expect


def test_nan_truth_and_not():
    rec = Record(INTS, {"f64": math.nan})
    assert run(fld(INTS, "f64"), rec)  # nonzero: true, as C
    assert not run(un("!", fld(INTS, "f64")), rec)
    assert run(op("&&", fld(INTS, "f64"), 1), rec)
    assert not run(lit(0.0))
    assert not run(lit(-0.0))
    assert run(un("!", 0.0))
    assert run(un("!", -0.0))


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
    rec = Record(INTS, {"s64": a, "u64": b})
    assert run(op(o, fld(INTS, "s64"), fld(INTS, "u64")), rec) is expect
    assert run(op(o, a, b)) is expect


@pytest.mark.parametrize(
    ("tree", "value"),
    [
        (op("&", 0b1100, 0b1010), 0b1000),
        (op("|", 0b1100, 0b1010), 0b1110),
        (op("^", 0b1100, 0b1010), 0b0110),
        (un("~", 0), -1),
        (op("<<", 1, 63), -(2**63)),
        (op(">>", -1, 60), 15),  # logical: computed on u64
        (op(">>", -(2**63), 63), 1),
        (un("-", -(2**63)), -(2**63)),  # wrapping
        (un("-", 5), -5),
        (un("+", -5), -5),
        (un("!", 0), 1),
        (un("!", 9), 0),
        (op("&&", 2, 3), 1),
        (op("||", 0, -4), 1),
        (op("&&", 0, 1), 0),
        (op("||", 0, 0.0), 0),
        (op("==", op("==", 1, 1), 1), 1),
    ],
)
def test_integer_operators(tree, value):
    assert run(op("==", tree, value))
    assert not run(op("==", tree, value ^ 1))


def test_unary_minus_on_double_and_literals_from_fields():
    rec = Record(INTS, {"f64": 2.5, "s64": -(2**63)})
    assert run(op("==", un("-", fld(INTS, "f64")), -2.5), rec)
    assert run(op("==", un("-", fld(INTS, "s64")), fld(INTS, "s64")), rec)
    assert run(op("<", un("-", lit(0.0)), 1), rec)


def test_bitwise_binds_as_given_tree():
    # "2 & 2 == 2" parses as (2 & 2) == 2.
    assert run(op("==", op("&", 2, 2), 2))
    rec = Record(INTS, {"u32": 0xF0, "s8": -1})
    assert run(op("==", op("&", fld(INTS, "u32"), 0x30), 0x30), rec)
    assert run(op("==", op("|", fld(INTS, "s8"), 0), -1), rec)


@pytest.mark.parametrize("count", [64, 65, 1000, -1, -(2**63)])
def test_shift_count_out_of_range_makes_the_whole_expression_false(count):
    rec = Record(INTS, {"s64": count, "u8": 1})
    shifted = op("<<", fld(INTS, "u8"), fld(INTS, "s64"))
    assert not run(op("==", shifted, 0), rec)
    assert not run(un("!", op("==", shifted, 12345)), rec)  # not just the comparison
    assert not run(op("||", op("==", op(">>", 1, fld(INTS, "s64")), 7), 1), rec)
    # Short-circuit: never evaluated.
    assert run(op("||", 1, op("==", shifted, 0)), rec)
    assert not run(op("&&", 0, op("==", shifted, 0)), rec)


def test_shift_count_in_range_from_a_field():
    for count in (0, 1, 62, 63):
        rec = Record(INTS, {"s64": count})
        assert run(op("==", op("<<", 1, fld(INTS, "s64")), _s64(1 << count)), rec)


def _s64(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


def test_missing_fields_and_short_circuit():
    rec = Record(INTS, {"s64": 1})
    x = op("==", fld(INTS, "s64"), 1)
    gone = op("==", missing(), 1)
    assert run(op("||", x, gone), rec)
    assert not run(op("||", gone, x), rec)  # evaluated first: all false
    assert not run(op("&&", x, gone), rec)
    assert not run(un("!", gone), rec)
    assert not run(op("!=", missing(), 1), rec)
    assert not run(op("==", missing(typ="string"), b"x"), rec)
    assert not run(op("!=", missing(typ="string"), b"x"), rec)
    assert run(op("||", op("==", fld(INTS, "s64"), 2), un("!", op("==", fld(INTS, "s64"), 2))), rec)


def test_logical_results_are_0_or_1_and_right_side_runs_once():
    rec = Record(INTS, {"s64": 5, "f64": 0.5})
    assert run(op("==", op("&&", fld(INTS, "s64"), fld(INTS, "f64")), 1), rec)
    assert run(op("==", op("||", 0, fld(INTS, "s64")), 1), rec)
    assert run(op("==", op("||", fld(INTS, "s64"), missing()), 1), rec)


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


def strs(p=b"", q=b"", i=b"", j=b"", d=b"", e=b"", raw=None) -> Record:
    return Record(STRS, dict(p=p, q=q, i=i, j=j, d=d, e=e), raw)


STRING_CASES = [
    (b"abc", b"abc", True),
    (b"abc", b"abcd", False),
    (b"abcd", b"abc", False),
    (b"", b"", True),
    (b"", b"a", False),
    (b"a", b"", False),
    (b"str0", b"str1", False),
    (b"hello world", b"hello world", True),
]


@pytest.mark.parametrize(("value", "literal", "expect"), STRING_CASES)
@pytest.mark.parametrize("field", ["p", "i", "d"])
def test_string_equals_literal_each_storage(field, value, literal, expect):
    if field == "i" and len(value) > 8:
        value = value[:8]
        expect = value == literal
    rec = strs(**{field: value + (b"\0" if field == "d" else b"")})
    assert run(op("==", fld(STRS, field), literal), rec) is expect
    assert run(op("!=", fld(STRS, field), literal), rec) is (not expect)
    assert run(op("==", lit(literal), fld(STRS, field)), rec) is expect


def test_inline_string_full_capacity_has_no_nul():
    rec = strs(j=b"abcd", raw={"n": b"Z\0\0\0"})  # the byte after j is not a NUL
    assert run(op("==", fld(STRS, "j"), b"abcd"), rec)
    assert not run(op("==", fld(STRS, "j"), b"abcdZ"), rec)
    assert not run(op("==", fld(STRS, "j"), b"abc"), rec)
    assert run(op("==", fld(STRS, "j"), glob(b"ab", b"")), rec)
    assert run(op("==", fld(STRS, "j"), glob(b"", b"cd")), rec)
    assert not run(op("==", fld(STRS, "j"), glob(b"", b"dZ")), rec)


def test_data_loc_string_ends_at_its_length_or_nul():
    # Length 3 of "abcXYZ": the string is "abc".
    rec = strs(d=b"abcXYZ")
    d, e = STRS.field("d").offset, STRS.field("e").offset
    off = int.from_bytes(rec.buf.raw[d : d + 4], "little") & 0xFFFF
    rec.buf[e : e + 4] = (off | 3 << 16).to_bytes(4, "little")  # e: same bytes, length 3
    assert run(op("==", fld(STRS, "e"), b"abc"), rec)
    assert not run(op("==", fld(STRS, "e"), b"abcX"), rec)
    assert run(op("==", fld(STRS, "e"), glob(b"", b"bc")), rec)
    assert not run(op("==", fld(STRS, "e"), glob(b"", b"X")), rec)
    assert not run(op("==", fld(STRS, "d"), b"abc"), rec)
    assert run(op("==", fld(STRS, "d"), b"abcXYZ"), rec)
    # A NUL inside the length ends it earlier.
    rec = strs(d=b"ab\0cd")
    assert run(op("==", fld(STRS, "d"), b"ab"), rec)
    assert not run(op("==", fld(STRS, "d"), b"ab\0cd"), rec)


def test_literal_with_nul_never_equals():
    rec = strs(p=b"ab", i=b"ab")
    for f in ("p", "i"):
        assert not run(op("==", fld(STRS, f), b"ab\0"), rec)
        assert run(op("!=", fld(STRS, f), b"ab\0"), rec)


def test_null_string_pointer_makes_the_whole_expression_false():
    rec = strs(p=None, i=b"x")
    assert not run(op("==", fld(STRS, "p"), b"x"), rec)
    assert not run(op("!=", fld(STRS, "p"), b"x"), rec)
    assert not run(op("==", fld(STRS, "p"), glob(b"", b"")), rec)
    assert not run(op("!=", fld(STRS, "p"), fld(STRS, "i")), rec)
    assert run(op("||", op("==", fld(STRS, "i"), b"x"), op("==", fld(STRS, "p"), b"x")), rec)


@pytest.mark.parametrize(
    ("a", "b", "expect"),
    [
        (b"abc", b"abc", True),
        (b"abc", b"abd", False),
        (b"ab", b"abc", False),
        (b"abc", b"ab", False),
        (b"", b"", True),
        (b"abcdefgh", b"abcdefgh", True),  # inline at full capacity
    ],
)
def test_field_against_field_across_storages(a, b, expect):
    rec = strs(p=a, q=b, i=a, j=b[:4], d=a, e=b)
    assert run(op("==", fld(STRS, "p"), fld(STRS, "q")), rec) is expect
    assert run(op("==", fld(STRS, "i"), fld(STRS, "e")), rec) is expect
    assert run(op("==", fld(STRS, "d"), fld(STRS, "q")), rec) is expect
    assert run(op("!=", fld(STRS, "d"), fld(STRS, "e")), rec) is not expect
    if len(b) <= 4:
        assert run(op("==", fld(STRS, "j"), fld(STRS, "p")), rec) is (b == a)


GLOB_CASES = [
    ((b"ab", b""), b"abc", True),  # prefix
    ((b"ab", b""), b"ab", True),
    ((b"ab", b""), b"a", False),
    ((b"", b"bc"), b"abc", True),  # suffix
    ((b"", b"bc"), b"bcx", False),
    ((b"", b"bc"), b"c", False),
    ((b"a", b"c"), b"abc", True),  # middle star
    ((b"a", b"c"), b"ac", True),
    ((b"a", b"c"), b"a", False),
    ((b"ab", b"ba"), b"aba", False),  # prefix and suffix must not overlap
    ((b"ab", b"ba"), b"abba", True),
    ((b"", b"b", b""), b"abc", True),  # a part in the middle
    ((b"", b"b", b""), b"ac", False),
    ((b"a", b"b", b"c", b"d"), b"axbxcxd", True),  # several stars
    ((b"a", b"b", b"c", b"d"), b"axcxbxd", False),
    ((b"a", b"bc", b"bd", b""), b"abcbd", True),
    ((b"a", b"bc", b"bd", b""), b"abdbc", False),
    ((b"", b"aa", b"a"), b"aaa", True),
    ((b"", b"aa", b"a"), b"aa", False),
    ((b"", b""), b"", True),  # "*"
    ((b"", b""), b"anything", True),
    ((b"a", b"", b"b"), b"ab", True),  # "a**b": an empty middle part
    ((b"a*b", b""), b"a*bc", True),  # escaped star: a literal "*" in a part
    ((b"a*b", b""), b"axbc", False),
    ((b"", b"x*"), b"ax*", True),
    ((b"", b"x*"), b"axy", False),
]


@pytest.mark.parametrize(("parts", "value", "expect"), GLOB_CASES)
@pytest.mark.parametrize("field", ["p", "i", "d"])
def test_glob(field, parts, value, expect):
    rec = strs(**{field: value})
    assert run(op("==", fld(STRS, field), glob(*parts)), rec) is expect
    assert run(op("!=", glob(*parts), fld(STRS, field)), rec) is (not expect)


def _pattern(parts: tuple[bytes, ...]) -> bytes:
    """The raw pattern native.glob_match takes (``*`` wildcard, ``\\`` escapes)."""
    return b"*".join(p.replace(b"\\", b"\\\\").replace(b"*", b"\\*") for p in parts)


def _native_glob(value: bytes, bound: int, parts: tuple[bytes, ...]) -> bool:
    s = ctypes.create_string_buffer(value, len(value) + 1)
    pat = _pattern(parts)
    p = ctypes.create_string_buffer(pat, len(pat) + 1)
    return bool(native.glob_match(ctypes.addressof(s), bound, ctypes.addressof(p), len(pat)))


_alphabet = st.sampled_from(b"ab*\\").map(lambda c: bytes([c]))
_text = st.lists(_alphabet, max_size=7).map(b"".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(_text, min_size=1, max_size=4), value=_text)
def test_glob_and_equality_agree_with_native(parts, value):
    """Against native.glob_match / str_equal (the helpers the other tiers call)."""
    parts = tuple(parts) if len(parts) > 1 else (parts[0], b"")
    exact = b"".join(parts)  # the same text without wildcards
    rec = strs(p=value, i=value[:8], d=value)
    for field, bound in (("p", native.NO_LIMIT), ("i", 8), ("d", len(value))):
        v = value[:8] if field == "i" else value
        tree = op("==", fld(STRS, field), glob(*parts))
        assert run(tree, rec) is _native_glob(v, bound, parts), (field, parts, value)
        s = ctypes.create_string_buffer(v, len(v) + 1)
        lb = ctypes.create_string_buffer(exact, len(exact) + 1)
        want = bool(native.str_equal(ctypes.addressof(s), bound, ctypes.addressof(lb), len(exact)))
        assert run(op("==", fld(STRS, field), exact), rec) is want


def test_two_literals_fold():
    assert run(op("==", b"abc", b"abc"))
    assert not run(op("==", b"abc", b"abd"))
    assert run(op("==", glob(b"a", b""), b"abc"))
    assert run(op("!=", b"xbc", glob(b"a", b"")))


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


def seqs(**values) -> Record:
    base = dict(arr=[10, -20, 30], n=0, items=None, m=0, vals=None, dl=[], inner=dict(k=0, s=b""))
    return Record(SEQS, base | values)


def test_static_array_and_nested_struct():
    rec = seqs(inner=dict(k=0xFFFFFFFF, s=b"inner"))
    assert run(op("==", fld(SEQS, "arr", 1), -20), rec)
    assert run(op("==", fld(SEQS, "arr", 2), 30), rec)
    assert run(op("==", fld(SEQS, "inner", "k"), 2**32 - 1), rec)
    assert run(op("==", fld(SEQS, "inner", "s"), b"inner"), rec)
    # Index past a static array's length: missing, the whole expression false.
    assert fld(SEQS, "arr", 3).path.static_offset is None
    assert not run(op("!=", fld(SEQS, "arr", 3), 0), rec)
    assert run(op("||", op("==", fld(SEQS, "arr", 0), 10), op("==", fld(SEQS, "arr", 5), 0)), rec)


def test_pointer_sequence_of_structs_with_length_and_null():
    items = [dict(id=-1, name=b"zero", tag=b"t0"), dict(id=7, name=b"one", tag=b"t1t1")]
    rec = seqs(n=2, items=items)
    assert run(op("==", fld(SEQS, "items", 0, "id"), -1), rec)
    assert run(op("==", fld(SEQS, "items", 1, "name"), b"one"), rec)
    assert run(op("==", fld(SEQS, "items", 1, "tag"), b"t1t1"), rec)
    assert run(op("==", fld(SEQS, "items", 0, "name"), glob(b"z", b"o")), rec)
    assert not run(op("!=", fld(SEQS, "items", 2, "id"), 0), rec)  # past the length
    rec = seqs(n=1, items=items)
    assert not run(op("!=", fld(SEQS, "items", 1, "id"), 0), rec)
    assert run(op("==", fld(SEQS, "items", 0, "id"), -1), rec)
    rec = seqs(n=2, items=None)  # null pointer
    assert not run(op("!=", fld(SEQS, "items", 0, "id"), 0), rec)
    assert not run(op("!=", fld(SEQS, "items", 0, "name"), b""), rec)
    rec = seqs(n=2, items=[dict(id=1, name=None, tag=b"")] * 2)  # null string inside
    assert not run(op("!=", fld(SEQS, "items", 1, "name"), b""), rec)
    assert run(op("==", fld(SEQS, "items", 1, "id"), 1), rec)


def test_signed_length_negative_is_empty():
    rec = seqs(m=-1, vals=[5, 6])
    assert not run(op("!=", fld(SEQS, "vals", 0), 0), rec)
    rec = seqs(m=2, vals=[5, 6])
    assert run(op("==", fld(SEQS, "vals", 1), 6), rec)
    # The u8 length 255 is not negative.
    rec = seqs(n=255, items=[dict(id=3, name=b"", tag=b"")] * 255)
    assert run(op("==", fld(SEQS, "items", 254, "id"), 3), rec)


def test_data_loc_sequence_length_counts_bytes():
    rec = seqs(dl=[1, 65535, 3])
    assert run(op("==", fld(SEQS, "dl", 1), 65535), rec)
    assert run(op("==", fld(SEQS, "dl", 2), 3), rec)
    assert not run(op("!=", fld(SEQS, "dl", 3), 0), rec)
    rec = seqs(dl=[])
    assert not run(op("!=", fld(SEQS, "dl", 0), 0), rec)


def test_context_fields():
    ctx = Record(DEFAULT_CONTEXT, dict(procname=b"bash", pid=1234, hostname=b"h" * 64))
    pid = fld(DEFAULT_CONTEXT, "pid", root="ctx")
    name = fld(DEFAULT_CONTEXT, "procname", root="ctx")
    host = fld(DEFAULT_CONTEXT, "hostname", root="ctx")
    rec = Record(INTS, {"s64": 1234})
    assert run(op("==", pid, fld(INTS, "s64")), rec, ctx)
    assert run(op("==", name, b"bash"), rec, ctx)
    assert run(op("==", name, glob(b"ba", b"")), rec, ctx)
    assert run(op("==", host, b"h" * 64), rec, ctx)
    assert not run(op("==", host, b"h" * 63), rec, ctx)


# -- the benchmark shape ------------------------------------------------------------------------

BENCH = Schema.declare("tpfilt", [(f"var{k}", "string") for k in range(9)] + [("lyf", "s32")])


def bench_tree(k: int = 42) -> ast.Node:
    tree = None
    for i in range(9):
        p = op("==", fld(BENCH, f"var{i}"), f"str{i}".encode())
        tree = p if tree is None else op("&&", tree, p)
    return op("&&", tree, op("==", fld(BENCH, "lyf"), k))


def bench_record(lyf: int = 42, **override) -> Record:
    values = {f"var{i}": f"str{i}".encode() for i in range(9)} | {"lyf": lyf} | override
    return Record(BENCH, values)


def test_benchmark_chain():
    f = compile_llvm(bench_tree(), name="tpfilt", event_schema=BENCH)
    assert f(bench_record(), 0)
    assert not f(bench_record(43), 0)
    assert not f(bench_record(var4=b"str"), 0)
    assert not f(bench_record(var8=b"str80"), 0)
    assert not f(bench_record(var0=None), 0)
    assert "call" not in f.asm()  # strings inline, no strcmp
    assert 0 < f.code_bytes <= f.memory_bytes < 4096
    assert '@"tpfilt"' in f.ir and "define" in f.optimized_ir


def test_compile_errors_name_the_problem():
    with pytest.raises(FilterError, match="C identifier"):
        compile_llvm(lit(1), name="no-good")
    with pytest.raises(FilterError, match="optimisation level"):
        compile_llvm(lit(1), opt=4)
    with pytest.raises(FilterError, match="string") as e:
        compile_llvm(ast.StrLit((b"x",), type="string", column=3))
    assert e.value.column == 3


@pytest.mark.parametrize("opt", [0, 1, 2])
def test_lower_optimisation_levels_agree(opt):
    f = compile_llvm(bench_tree(), opt=opt)
    assert f(bench_record(), 0) and not f(bench_record(41), 0)


def test_many_filters_share_one_engine():
    filters = [compile_llvm(op("==", fld(INTS, "s64"), k)) for k in range(20)]
    rec = Record(INTS, {"s64": 7})
    assert [f(rec, 0) for f in filters] == [k == 7 for k in range(20)]
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
            over["var5"] = b"strx"
        if broken == 2:
            over["var2"] = None
        if broken == 3:
            over["var8"] = b"str8y"
        return bench_record(lyf, **over)

    cases = [(42, 0), (43, 0), (42, 1), (42, 2), (42, 3), (-42, 0)]
    return [f(rec(*c), 0) for c in cases]


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
        assert bool(fn(r.address, 0)) is f(r, 0)


def test_emit_shared_without_a_compiler_says_so(tmp_path, monkeypatch):
    f = compile_llvm(lit(1))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(FilterError, match="no C compiler"):
        f.emit_shared(tmp_path / "x.so")


@needs_gcc
def test_c_header_compiles_for_nested_layouts(tmp_path):
    tree = op("&&", op("==", fld(SEQS, "items", 1, "name"), b"x"), op("==", fld(STRS, "d"), b"y"))
    f = compile_llvm(tree, name="nested", event_schema=SEQS, context_schema=STRS)
    header = f.c_header()
    assert "struct nested_event_items" in header and "__data_loc" in header
    (tmp_path / "h.c").write_text('#include "h.h"\nint main(void) { return 0; }\n')
    (tmp_path / "h.h").write_text(header)
    subprocess.run(
        [GCC, "-std=c11", "-Wall", "-Werror", "-c", "-o", tmp_path / "h.o", tmp_path / "h.c"],
        check=True,
        capture_output=True,
    )


# -- speed (report only) -----------------------------------------------------------------------

BENCH_C = textwrap.dedent(
    r"""
    #include <stdint.h>
    #include <string.h>
    #include <time.h>
    typedef int64_t (*filter_fn)(const void *, const void *);
    struct ev { const char *var[9]; int32_t lyf; };

    /* The predicate by hand, as the paper's SIMPLE baseline. */
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
