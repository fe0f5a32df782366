"""The filter front end: parser (hwtrace.filter.parse), checker
(hwtrace.filter.check), the oracle (oracles.filter) and in-memory
records (hwtrace.filter.packing)."""

from __future__ import annotations

import ctypes
import math
import re
import struct

import numpy as np
import pytest
from filter_strategies import events, expressions, schemas
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles.filter import _walk, evaluate

from hwtrace.filter import ast
from hwtrace.filter.ast import glob_match
from hwtrace.filter.check import check, compile_check
from hwtrace.filter.errors import FilterError
from hwtrace.filter.packing import EventRecord, pack_many
from hwtrace.filter.parse import MAX_DEPTH, parse
from hwtrace.filter.schema import (
    DEFAULT_CONTEXT,
    ROOT_CONTEXT,
    ArrayType,
    IntType,
    Schema,
    SequenceType,
    StringType,
    layout,
)

# -- helpers ------------------------------------------------------------------------------

EVENT = Schema.declare(
    "demo",
    [
        ("msg_id", "s32"),
        ("size", "u64"),
        ("flag", "u8"),
        ("poel", "s16"),
        ("filename", "string"),
        ("intfield", "s64"),
        ("doublefield", "double"),
        ("floatfield", "float"),
        ("stringfield", "string"),
        ("comm", "char[8]"),
        ("dl", StringType("data_loc")),
        ("n", "u32"),
        ("seqfield", SequenceType(IntType(4, True), "ptr", "n")),
        ("arr", "s16[3]"),
        ("big", "u64"),
        ("a", "s64"),
        ("b", SequenceType(IntType(1, False), "ptr", "n")),
        ("msg", layout([("user", ArrayType(layout([("data", "s32[4]")]), 2))])),
    ],
)


def run(text: str, values: dict, ctx: dict | None = None, schema: Schema = EVENT, **kw) -> bool:
    tree = compile_check(text, schema, **kw)
    record = EventRecord(schema, values)
    context = EventRecord(DEFAULT_CONTEXT, ctx or {})
    return evaluate(tree, record.address, context.address)


def error(text: str, schema: Schema | None = None, **kw) -> FilterError:
    with pytest.raises(FilterError) as info:
        if schema is None:
            parse(text)
        else:
            compile_check(text, schema, **kw)
    return info.value


def shape(n: ast.Node) -> str:
    """A node as fully parenthesised text, to check precedence."""
    if isinstance(n, ast.IntLit):
        return str(n.value)
    if isinstance(n, ast.FloatLit):
        return repr(n.value)
    if isinstance(n, ast.StrLit):
        return "*".join(p.decode() for p in n.parts).join('""')
    if isinstance(n, ast.FieldRef):
        return n.text
    if isinstance(n, ast.Unary):
        return f"{n.op}{shape(n.operand)}"
    return f"({shape(n.left)} {n.op} {shape(n.right)})"  # type: ignore[attr-defined]


# -- parser -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("2 & 2 == 2", "((2 & 2) == 2)"),
        ("1 | 2 ^ 3 & 4 << 1", "(1 | (2 ^ (3 & (4 << 1))))"),
        ("a << 1 >> 2", "((a << 1) >> 2)"),
        ("a & b | c ^ d", "((a & b) | (c ^ d))"),
        ("a | b < c", "((a | b) < c)"),
        ("a < b == c > d", "((a < b) == (c > d))"),
        ("a <= b != c >= d", "((a <= b) != (c >= d))"),
        ("a == b && c != d", "((a == b) && (c != d))"),
        ("a || b && c", "(a || (b && c))"),
        ("a && b || c && d", "((a && b) || (c && d))"),
        ("a || b || c", "((a || b) || c)"),
        ("(a || b) && c", "((a || b) && c)"),
        ("!a == 0", "(!a == 0)"),
        ("!~-+a", "!~-+a"),
        ("- -1", "--1"),
        ("~a & b", "(~a & b)"),
        ("((((a))))", "a"),
        ("(a == 1) == 0", "((a == 1) == 0)"),
    ],
)
def test_precedence(text, expected):
    assert shape(parse(text)) == expected


@pytest.mark.parametrize("op", ["<<", ">>", "&", "^", "|", "<", "<=", ">", ">=", "==", "!="])
def test_every_binary_operator(op):
    n = parse(f"x {op} 3")
    assert isinstance(n, ast.Binary) and n.op == op and n.column == 3
    assert isinstance(n.left, ast.FieldRef) and n.right.value == 3  # type: ignore[attr-defined]


@pytest.mark.parametrize("op", ["&&", "||"])
def test_logical_operators(op):
    n = parse(f"x {op} y")
    assert isinstance(n, ast.Logical) and n.op == op and n.column == 3


@pytest.mark.parametrize("op", ["!", "~", "-", "+"])
def test_unary_operators(op):
    n = parse(f"  {op}x")
    assert isinstance(n, ast.Unary) and n.op == op and n.column == 3
    assert n.operand.column == 4


def test_columns():
    n = parse("msg_id == 23 && size >= 2048")
    assert n.column == 14  # the '&&'
    assert (n.left.column, n.left.left.column, n.left.right.column) == (8, 1, 11)
    assert (n.right.column, n.right.left.column, n.right.right.column) == (22, 17, 25)
    s = parse('$ctx.procname == "lttng*"')
    assert s.left.column == 1 and s.right.column == 18


@pytest.mark.parametrize(
    "text, value",
    [
        ("0", 0),
        ("42", 42),
        ("0x2A", 42),
        ("0X2a", 42),
        ("052", 42),
        ("00", 0),
        ("9223372036854775807", 2**63 - 1),
        ("9223372036854775808", -(2**63)),
        ("0x8000000000000000", -(2**63)),
        ("0xFFFFFFFFFFFFFFFF", -1),
        ("18446744073709551615", -1),
        ("01777777777777777777777", -1),
        ("10u", 10),  # C's suffixes, as LTTng's lexer takes them
        ("0xffUL", 255),
        ("017ll", 15),
        ("0xfull", 15),
    ],
)
def test_integer_literals(text, value):
    n = parse(text)
    assert isinstance(n, ast.IntLit) and n.value == value


@pytest.mark.parametrize(
    "text, value",
    [
        ("17.34e9", 17.34e9),
        ("1.", 1.0),
        (".5", 0.5),
        ("1e3", 1000.0),
        ("2.5E-3", 2.5e-3),
        ("1.5f", 1.5),
        ("2.L", 2.0),
    ],
)
def test_float_literals(text, value):
    n = parse(text)
    assert isinstance(n, ast.FloatLit) and n.value == value


def test_integer_out_of_range_is_reported_at_the_literal():
    e = error("x == 18446744073709551616")
    assert e.column == 6 and "out of range" in e.message
    assert error("x == 0x10000000000000000").column == 6


def test_strings_and_globs():
    assert parse('"abc"').parts == (b"abc",)
    assert parse('""').parts == (b"",)
    assert parse('"ab*c*"').parts == (b"ab", b"c", b"")
    assert parse('"*.log"').parts == (b"", b".log")
    assert parse('"a\\*b"').parts == (b"a*b",)  # an escaped star is a star
    assert not parse('"a\\*b"').is_glob
    assert parse('"a\\\\*"').parts == (b"a\\", b"")  # \\ then a wildcard
    assert parse('"q\\"q\\n\\t\\r"').parts == (b'q"q\n\t\r',)
    assert parse('"héllo"').parts == ("héllo".encode(),)
    assert parse('"a\nb"').parts == (b"ab",)  # a raw line break is dropped, as LTTng does


def test_nested_field_resolves():
    tree = compile_check("msg.user[1].data[2] == 3", EVENT)
    path = tree.left.path
    assert path.static_offset == EVENT.field("msg").offset + 16 + 8
    rec = EventRecord(EVENT, {"msg": {"user": [{}, {"data": [0, 0, 3]}]}})
    ctx = EventRecord(DEFAULT_CONTEXT, {})
    assert evaluate(tree, rec.address, ctx.address)


def test_fields():
    n = parse("msg.user[1].data[2]")
    assert n.root == "event" and n.names == ("msg", "user", 1, "data", 2)
    assert n.text == "msg.user[1].data[2]"
    assert parse("seq[7]").names == ("seq", 7)
    assert parse("seq[0x10]").names == ("seq", 16)
    c = parse("$ctx.procname")
    assert c.root == "ctx" and c.names == ("procname",) and c.text == "$ctx.procname"
    a = parse("$app.myprovider:myctx")
    assert a.root == "app" and a.names == ("myprovider:myctx",)


@pytest.mark.parametrize(
    "text, message, column",
    [
        ("a == 1)", "unexpected ')'", 7),
        ("(a == 1", "unclosed '('", 1),
        ('a == "abc', "unterminated string", 6),
        ("a &&", "expected an operand after '&&'", 5),
        ("a && || b", "expected an operand after '&&'", 6),
        ("a + b == 1", "arithmetic operator '+' is not supported", 3),
        ("a - 1 == 1", "arithmetic operator '-' is not supported", 3),
        ("a * 2 == 1", "arithmetic operator '*' is not supported", 3),
        ("a == 4 / 2", "arithmetic operator '/' is not supported", 8),
        ("a % 2", "arithmetic operator '%' is not supported", 3),
        ("", "empty filter expression", 1),
        ("   ", "empty filter expression", 1),
        ("a = 1", "did you mean '=='", 3),
        ("a == 08", "invalid octal literal", 6),
        ("a == 1.2.3", "invalid number", 6),
        ("a == 12abc", "invalid number", 6),
        ("a == 10uu", "invalid number '10uu'", 6),
        ('a == "x\\q"', "unknown escape", 8),
        ("$foo.bar == 1", "unknown '$foo'", 1),
        ("$ctx == 1", "expected '.' after '$ctx'", 6),
        ("$app.nocolon == 1", "$app.PROVIDER:NAME", 6),
        ("a.", "expected a field name after '.'", 3),
        ("a[b] == 1", "constant non-negative integer", 3),
        ("a[-1] == 1", "constant non-negative integer", 3),
        ("a->b == 1", "'->' is not supported", 2),
        ("a b", "expected an operator", 3),
        ("a == 1 #", "unexpected character '#'", 8),
        ("a == 'x'", "double quotes", 6),
        ("()", "expected an operand after '('", 2),
    ],
)
def test_syntax_errors(text, message, column):
    e = error(text)
    assert message in e.message
    assert e.column == column
    assert e.expression == text


def test_caret_output():
    assert str(error("a == 1)")) == "column 7: unexpected ')'\n  a == 1)\n        ^"
    assert str(error("x + 1 > 2")) == (
        "column 3: arithmetic operator '+' is not supported\n  x + 1 > 2\n    ^"
    )
    assert (
        str(error('name == "abc')) == 'column 9: unterminated string\n  name == "abc\n          ^'
    )
    assert str(error("a &&\nb ||")) == (
        "column 10: expected an operand after '||', not end of expression\n  a && b ||\n           ^"
    )


def test_nesting_limit():
    deep = "(" * (MAX_DEPTH + 5) + "a" + ")" * (MAX_DEPTH + 5)
    assert "nested too deeply" in error(deep).message
    assert "nested too deeply" in error("!" * 5000 + "a").message
    # Sharma and Dagenais's (JCST 2016) longest chain is 50.
    chain = " && ".join(f"f{i} == {i}" for i in range(60))
    assert isinstance(parse(chain), ast.Logical)


def _depth(n: ast.Node) -> int:
    kids = [k for k in (getattr(n, "left", None), getattr(n, "right", None),
                        getattr(n, "operand", None)) if isinstance(k, ast.Node)]  # fmt: skip
    return 1 + max((_depth(k) for k in kids), default=0)


@pytest.mark.parametrize("op", ["&&", "||"])
def test_a_flat_chain_is_not_deep(op):
    """A chain of one operator is flat, however long: it parses (balanced,
    its terms in order, each operator node at one of the chain's
    operators) and every tier evaluates it as the oracle does."""
    n = 5000
    text = f" {op} ".join(
        f"intfield != {i}" if op == "&&" else f"intfield == {i}" for i in range(n)
    )
    tree = parse(text)
    assert _depth(tree) <= 16
    leaves = [x for x in ast.walk(tree) if isinstance(x, ast.Binary)]
    assert [x.right.value for x in leaves] == list(range(n))
    ops = {m.start() + 1 for m in re.finditer(re.escape(op), text)}
    logical = [x for x in ast.walk(tree) if isinstance(x, ast.Logical)]
    assert len(logical) == n - 1 and {x.column for x in logical} == ops
    # Mixed: || of && chains, as C groups them.
    mixed = " || ".join(f"intfield > {i} && intfield < {i + 2}" for i in range(0, 3000, 10))
    checked = compile_check(mixed, EVENT)
    for v, want in ((0, False), (1, True), (2, False), (2991, True), (2999, False)):
        rec = EventRecord(EVENT, {"intfield": v})
        assert evaluate(checked, rec.address, 0) is want, v
    from hwtrace.filter.compile import compile_filter

    for tier in ("lttng", "llvm"):
        f = compile_filter(mixed, EVENT, tier)
        for v, want in ((1, True), (2, False), (2991, True)):
            assert bool(f(EventRecord(EVENT, {"intfield": v}).address)) is want, (tier, v)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='ab01x.*"\\$[]()!~-+<>=&|^ :\n', max_size=30) | st.text(max_size=20))
def test_parse_and_check_never_raise_anything_but_filter_error(text):
    try:
        tree = parse(text)
    except FilterError as e:
        assert e.expression == text and e.column is not None and 1 <= e.column <= len(text) + 1
        str(e)
        return
    try:
        check(tree, EVENT, unknown="false", text=text)
    except FilterError as e:
        assert e.column is not None
        str(e)


# -- checker ------------------------------------------------------------------------------


def test_types_are_set_on_every_node():
    tree = compile_check(
        '$ctx.procname == "lttng*" && (!flag || poel < 34) && doublefield > 1 && ~intfield',
        EVENT,
    )
    for n in ast.walk(tree):
        assert n.type in ("s64", "double", "string")
    refs = [n for n in ast.walk(tree) if isinstance(n, ast.FieldRef)]
    assert all(r.path is not None for r in refs)
    assert {r.text: r.type for r in refs} == {
        "$ctx.procname": "string",
        "flag": "s64",
        "poel": "s64",
        "doublefield": "double",
        "intfield": "s64",
    }
    ctx_ref = refs[0]
    assert ctx_ref.path.root == ROOT_CONTEXT and ctx_ref.path.storage == "inline"


@pytest.mark.parametrize(
    "text, type_",
    [
        ("-doublefield", "double"),
        ("+doublefield", "double"),
        ("-intfield", "s64"),
        ("!doublefield", "s64"),
        ("~intfield", "s64"),
        ("intfield & 3", "s64"),
        ("doublefield < intfield", "s64"),
        ("doublefield && intfield", "s64"),
    ],
)
def test_result_types(text, type_):
    assert compile_check(text, EVENT).type == type_


@pytest.mark.parametrize(
    "text, message, column",
    [
        ("stringfield == 1", "cannot compare a string with a number", 13),
        ("1.5 != stringfield", "cannot compare a string with a number", 5),
        ('stringfield < "a"', "only be compared with '==' or '!='", 13),
        ('stringfield >= "a"', "only be compared with '==' or '!='", 13),
        ("doublefield & 1", "bitwise '&' needs integer operands, not a double", 13),
        ("1 << doublefield", "bitwise '<<' needs integer operands", 3),
        ("stringfield | 1", "not a string", 13),
        ("~doublefield", "'~' needs an integer operand, not a double", 1),
        ("~stringfield", "unary '~' cannot apply to a string", 1),
        ("-stringfield", "unary '-' cannot apply to a string", 1),
        ("!stringfield", "unary '!' cannot apply to a string", 1),
        ("intfield == 1 && stringfield", "operand of '&&' is a string", 15),
        ("stringfield || 1", "operand of '||' is a string", 13),
        ("stringfield", "the filter is a string", 1),
        ('"abc"', "the filter is a string", 1),
        ('"a*" == "*b"', "cannot compare two glob patterns", 6),
        ("nosuch == 1", "unknown field 'nosuch' in event 'demo'", 1),
        ("msg_id == 1 && $ctx.nosuch == 1", "unknown field '$ctx.nosuch' in context 'context'", 16),
        ("$app.prov:x == 1", "unknown field '$app.prov:x'", 1),
        ("size.x == 1", "not a member of a structure", 1),
        ("size[0] == 1", "only arrays and sequences can be indexed", 1),
        ("arr == 1", "a structure, array or sequence is not a value", 1),
    ],
)
def test_type_errors(text, message, column):
    e = error(text, EVENT)
    assert message in e.message
    assert e.column == column
    assert e.expression == text
    str(e)


def test_lenient_mode_makes_unknown_fields_false():
    tree = compile_check("nosuch == 1 || msg_id == 23", EVENT, unknown="false")
    ref = tree.left.left
    assert isinstance(ref, ast.FieldRef) and ref.path is None
    # The first operand is missing, so the whole expression is false.
    assert not run("nosuch == 1 || msg_id == 23", {"msg_id": 23}, unknown="false")
    # Never evaluated: short-circuit.
    assert run("msg_id == 23 || nosuch == 1", {"msg_id": 23}, unknown="false")
    # A missing field compared with a string is typed as a string.
    assert compile_check('nosuch == "x*"', EVENT, unknown="false").left.type == "string"
    assert not run('msg_id == 23 && nosuch == "x*"', {"msg_id": 23}, unknown="false")
    assert not run("!nosuch", {}, unknown="false")
    assert not run("$ctx.nosuch == 1 || 1", {}, unknown="false")
    with pytest.raises(ValueError):
        compile_check("a", EVENT, unknown="maybe")  # type: ignore[arg-type]


def test_app_context_fields():
    context = Schema.declare(
        "ctx+app", [("procname", "char[16]"), ("myprov:myctx", "s64")], root=ROOT_CONTEXT
    )
    tree = compile_check("$app.myprov:myctx == 5", EVENT, context)
    assert tree.left.path.root == ROOT_CONTEXT
    rec = EventRecord(EVENT, {})
    ctx = EventRecord(context, {"myprov:myctx": 5})
    assert evaluate(tree, rec.address, ctx.address)


@pytest.mark.parametrize(
    "text, value",
    [
        ("1 == 1", 1),
        ("1 != 1", 0),
        ("2 & 2 == 2", 1),
        ("1 | 2 ^ 3 & 4 << 1", 3),
        ("-9223372036854775808 == 0x8000000000000000", 1),
        ("-(-9223372036854775808) == -9223372036854775808", 1),
        ("~0 == -1", 1),
        ("-1 >> 60", 15),
        ("1 << 63 == -9223372036854775808", 1),
        ("1.5 > 1", 1),
        ("-.5", None),
        ("!2.5", 0),
        ('"a" == "a"', 1),
        ('"a" != "a"', 0),
        ('"abc" == "a*"', 1),
        ('"a*" == "abc"', 1),
        ('"abc" == "*d"', 0),
        ('"a\\*" == "a*"', 1),
        ("0 && nosuch", 0),
        ("1 || nosuch", 1),
        ("1 && 2.5", 1),
    ],
)
def test_constant_folding(text, value):
    tree = compile_check(text, EVENT, unknown="false")
    if value is None:
        assert isinstance(tree, ast.FloatLit) and tree.value == -0.5
    else:
        assert isinstance(tree, ast.IntLit) and tree.value == value and tree.type == "s64"


@pytest.mark.parametrize("text", ["1 << 64", "1 >> -1", "x && 0", "a == 1 || 0", "1 && a"])
def test_not_folded(text):
    tree = compile_check(text, EVENT, unknown="false")
    assert not isinstance(tree, ast.IntLit)


def test_shift_out_of_range_is_false_only_when_evaluated():
    assert not run("1 << 64 || 1", {})
    assert not run("(1 << 64) == 0", {})
    assert run("1 || 1 << 64", {})
    assert not run("1 >> -1 == 0 || 1", {})
    assert run("a << 63 == -9223372036854775808", {"a": 1})
    assert not run("1 << a", {"a": 64})
    assert not run("1 << a", {"a": -1})
    assert run("1 << a == 2", {"a": 1})


# -- the oracle on records ----------------------------------------------------------------


def test_lttng_documentation_examples():
    ev = {"msg_id": 23, "size": 4096, "flag": 0, "poel": 40, "filename": "x.log"}
    ctx = {"procname": "lttng-sessiond", "cpu_id": 2}
    assert run("msg_id == 23 && size >= 2048", ev)
    assert not run("msg_id == 23 && size >= 2048", {**ev, "size": 2047})
    assert not run("msg_id == 23 && size >= 2048", {**ev, "msg_id": 24})
    text = '$ctx.procname == "lttng*" && (!flag || poel < 34)'
    assert run(text, ev, ctx)
    assert not run(text, {**ev, "flag": 1}, ctx)
    assert run(text, {**ev, "flag": 1, "poel": 33}, ctx)
    assert not run(text, ev, {**ctx, "procname": "bash"})
    text = '$ctx.cpu_id == 2 && filename != "*.log"'
    assert not run(text, ev, ctx)
    assert run(text, {**ev, "filename": "x.txt"}, ctx)
    assert not run(text, {**ev, "filename": "x.txt"}, {**ctx, "cpu_id": 3})
    for v, verdict in ((500, False), (501, True), (502, True), (503, False)):
        assert run("intfield > 500 && intfield < 503", {"intfield": v}) is verdict
    assert run("doublefield > 3.14159", {"doublefield": 3.1416})
    assert not run("doublefield > 3.14159", {"doublefield": 3.14159})
    assert run('stringfield == "abc*"', {"stringfield": "abcdef"})
    assert run('stringfield == "abc*"', {"stringfield": "abc"})
    assert not run('stringfield == "abc*"', {"stringfield": "ab"})


def test_index_out_of_range_makes_the_whole_expression_false():
    seq = {"seqfield": [0, 1, 2]}
    assert run("seqfield[2] == 2", seq)
    assert not run("seqfield[3] == 1", seq)
    assert not run("!(seqfield[3] == 1)", seq)  # not just the comparison: the whole
    assert not run("seqfield[3] == 1 || 1", seq)
    assert not run("seqfield[0] == 0", {"seqfield": None})  # null pointer
    assert not run("seqfield[0] == 0", {"seqfield": []})
    assert run("arr[2] == 7", {"arr": [0, 0, 7]})
    assert not run("arr[3] == 0 || 1", {"arr": [0, 0, 7]})  # past a static array


def test_short_circuit_skips_missing_data():
    assert run("a || b[9] == 1", {"a": 1, "b": [1, 2]})
    assert not run("a || b[9] == 1", {"a": 0, "b": [1, 2]})
    assert not run("a && b[9] == 1", {"a": 0, "b": [1, 2]})
    assert not run("a && b[9] == 1", {"a": 1, "b": [1, 2]})
    assert run("a || b[1] == 2", {"a": 0, "b": [1, 2]})
    assert run('!a || stringfield == "x"', {"a": 0, "stringfield": None})
    assert not run('a || stringfield == "x"', {"a": 0, "stringfield": None})


def test_integer_semantics():
    assert run("big == -1", {"big": 2**64 - 1})  # u64 wraps to s64
    assert run("big == 0xFFFFFFFFFFFFFFFF", {"big": 2**64 - 1})
    assert run("big < 0", {"big": 2**63})
    assert run("flag == 255", {"flag": -1})  # u8
    assert run("poel == -1", {"poel": 0xFFFF})  # s16
    assert run("-intfield == -9223372036854775808", {"intfield": -(2**63)})
    assert run("~intfield == 0", {"intfield": -1})
    assert run("intfield >> 63 == 1", {"intfield": -1})  # logical shift on u64
    assert run("(intfield ^ -1) == 0", {"intfield": -1})
    assert run("(intfield | 1) == -1", {"intfield": -2})
    assert run("(intfield & 0xF0) == 0x30", {"intfield": 0x1234})
    assert run("!intfield", {"intfield": 0})
    assert run("intfield", {"intfield": 5})
    assert not run("intfield", {"intfield": 0})


def test_double_semantics():
    nan = math.nan
    assert not run("doublefield == doublefield", {"doublefield": nan})
    assert run("doublefield != doublefield", {"doublefield": nan})
    assert not run("doublefield < 1 || doublefield >= 1", {"doublefield": nan})
    assert run("doublefield", {"doublefield": nan})  # nonzero is true
    assert not run("!doublefield", {"doublefield": nan})
    assert run("doublefield > 1e308", {"doublefield": math.inf})
    assert run("doublefield == intfield", {"doublefield": 3.0, "intfield": 3})
    assert run("intfield < doublefield", {"doublefield": 3.5, "intfield": 3})
    assert run("floatfield == 0.1", {"floatfield": 0.1}) is False  # widened from float
    assert run("floatfield > 0.0999 && floatfield < 0.1001", {"floatfield": 0.1})
    assert run("floatfield > 1e308", {"floatfield": 1e300})  # inf as a float
    assert run("-doublefield == -2.5", {"doublefield": 2.5})
    # A u64 is read as s64 first, then converted (rounded) to double.
    assert run("doublefield == big", {"doublefield": -(2.0**63), "big": 2**63})
    assert run("doublefield == intfield", {"doublefield": 2.0**53, "intfield": 2**53 + 1})


def test_string_semantics():
    assert run('comm == "abcdefgh"', {"comm": "abcdefghij"})  # full inline, no NUL
    assert run('comm == "abc"', {"comm": "abc"})
    assert not run('comm == "abcdefghi"', {"comm": "abcdefghij"})
    assert run('dl == "hello"', {"dl": "hello"})
    assert run('dl == "h*o"', {"dl": "hello"})
    assert run('dl == ""', {})
    assert run('stringfield == "a\\*b"', {"stringfield": "a*b"})
    assert not run('stringfield == "a\\*b"', {"stringfield": "axb"})
    assert run('stringfield == "a\\\\b"', {"stringfield": "a\\b"})
    assert run('stringfield == "*mid*"', {"stringfield": "xxmidyy"})
    assert run('stringfield == "*"', {"stringfield": ""})
    assert run('stringfield == "日*"', {"stringfield": "日本"})
    assert run('stringfield == "ab"', {"stringfield": b"ab\0cd"})  # ends at the NUL
    assert run("stringfield == filename", {"stringfield": "x*", "filename": "x*"})
    assert not run("stringfield == filename", {"stringfield": "xy", "filename": "x*"})
    assert run("comm == stringfield", {"comm": "abc", "stringfield": "abc"})
    assert not run("comm == stringfield", {"comm": "abc", "stringfield": None})
    assert run('$ctx.hostname == "box"', {}, {"hostname": "box"})


@pytest.mark.parametrize(
    "pattern, s, expected",
    [
        ("abc", "abc", True),
        ("abc", "abcd", False),
        ("a*", "a", True),
        ("*a", "ba", True),
        ("*a", "ab", False),
        ("a*b*c", "aXbYc", True),
        ("a*b*c", "acb", False),
        ("*ab*ab*", "abab", True),
        ("*ab*ab*", "aba", False),
        ("aa*aa", "aaa", False),
        ("aa*aa", "aaaa", True),
        ("**", "", True),
    ],
)
def test_glob_match(pattern, s, expected):
    parts = tuple(p.encode() for p in pattern.split("*"))
    assert glob_match(parts, s.encode()) is expected


@given(
    st.lists(st.text(alphabet="ab", max_size=3), min_size=1, max_size=4), st.text("ab", max_size=8)
)
def test_glob_match_agrees_with_regular_expressions(parts, s):
    regex = ".*".join(re.escape(p) for p in parts)
    expected = re.fullmatch(regex, s, re.S) is not None
    assert glob_match(tuple(p.encode() for p in parts), s.encode()) is expected


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_generated_expressions_check_and_folding_keeps_verdicts(data):
    schema = data.draw(schemas())
    values = data.draw(events(schema))
    text = data.draw(expressions(schema, DEFAULT_CONTEXT))
    record = EventRecord(schema, values)
    ctx = EventRecord(DEFAULT_CONTEXT, {"procname": "lttng", "cpu_id": 2, "pid": -1})
    try:
        folded = compile_check(text, schema)
    except FilterError as e:
        assert e.column is not None and e.expression == text
        return
    for n in ast.walk(folded):
        assert n.type in ("s64", "double", "string")
    plain = check(parse(text), schema, fold=False)
    verdict = evaluate(folded, record.address, ctx.address)
    assert verdict == evaluate(plain, record.address, ctx.address)


# -- the oracle's path walk agrees with the native one ------------------------------------


def _leaf_refs(schema: Schema) -> list[tuple]:
    from filter_strategies import _leaves

    return [parse(t).names for t, _ in _leaves(schema.struct, "")]


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_path_walk_matches_native_walker(data):
    from hwtrace.filter.native import walk_path

    schema = data.draw(schemas())
    record = EventRecord(schema, data.draw(events(schema)))
    for names in _leaf_refs(schema):
        path = schema.resolve(names)
        try:
            ours = _walk(path, record.address)
        except Exception:  # the oracle's "missing"
            ours = 0
        assert walk_path(path.code.ctypes.data, record.address, 0) == ours, path.text
        if path.static_offset is not None:
            assert ours == record.address + path.static_offset


# -- records ------------------------------------------------------------------------------


def test_record_layout():
    schema = Schema.declare(
        "r",
        [
            ("u8", "u8"),
            ("s16", "s16"),
            ("u32", "u32"),
            ("s64", "s64"),
            ("f", "float"),
            ("d", "double"),
            ("p", "string"),
            ("c", "char[4]"),
            ("dl", StringType("data_loc")),
            ("arr", "u16[3]"),
        ],
    )
    r = EventRecord(
        schema,
        {
            "u8": -1,
            "s16": 0x18000,
            "u32": -2,
            "s64": 2**64 - 1,
            "f": 1.5,
            "d": -2.25,
            "p": "héllo",
            "c": "abcdef",
            "dl": "xyz",
            "arr": [1, 2],
        },
    )
    raw = bytes(r)
    off = {f.name: f.offset for f in schema.fields}
    assert raw[off["u8"]] == 0xFF
    assert struct.unpack_from("<h", raw, off["s16"])[0] == -0x8000
    assert struct.unpack_from("<I", raw, off["u32"])[0] == 2**32 - 2
    assert struct.unpack_from("<q", raw, off["s64"])[0] == -1
    assert struct.unpack_from("<f", raw, off["f"])[0] == 1.5
    assert struct.unpack_from("<d", raw, off["d"])[0] == -2.25
    ptr = struct.unpack_from("<Q", raw, off["p"])[0]
    assert ctypes.string_at(ptr) == "héllo".encode()
    assert raw[off["c"] : off["c"] + 4] == b"abcd"  # truncated to capacity, no NUL
    loc = struct.unpack_from("<I", raw, off["dl"])[0]
    assert loc & 0xFFFF == schema.size and loc >> 16 == 4  # tracefs: length counts the NUL
    assert raw[schema.size : schema.size + 4] == b"xyz\0"
    assert r.size == schema.size + 4
    assert struct.unpack_from("<3H", raw, off["arr"]) == (1, 2, 0)


def test_record_missing_values_are_zero_and_null():
    schema = Schema.declare("r", [("a", "s32"), ("p", "string"), ("dl", StringType("data_loc"))])
    raw = bytes(EventRecord(schema, {}))
    assert raw == bytes(schema.size)


def test_record_sequences_and_nesting():
    inner = layout([("x", "s8"), ("name", "string")])
    schema = Schema.declare(
        "r",
        [
            ("n", "u16"),
            ("seq", SequenceType(IntType(4, True), "ptr", "n")),
            ("dseq", SequenceType(IntType(2, False), "data_loc")),
            ("items", SequenceType(inner, "ptr", "n")),
            ("nest", inner),
        ],
    )
    r = EventRecord(
        schema, {"seq": [5, -6, 7], "dseq": [1, 0xFFFF], "nest": {"x": -3, "name": "q"}}
    )
    raw = bytes(r)
    off = {f.name: f.offset for f in schema.fields}
    assert struct.unpack_from("<H", raw, off["n"])[0] == 3  # set from the sequence
    ptr = struct.unpack_from("<Q", raw, off["seq"])[0]
    assert struct.unpack("<3i", ctypes.string_at(ptr, 12)) == (5, -6, 7)
    loc = struct.unpack_from("<I", raw, off["dseq"])[0]
    start = loc & 0xFFFF
    assert loc >> 16 == 4 and struct.unpack_from("<2H", raw, start) == (1, 0xFFFF)
    assert struct.unpack_from("<Q", raw, off["items"])[0] == 0  # not given: null
    assert struct.unpack_from("<b", raw, off["nest"])[0] == -3
    # The evaluator reads the same thing.
    ctx = EventRecord(DEFAULT_CONTEXT, {})
    for text in ["seq[1] == -6", "dseq[1] == 65535", 'nest.name == "q"', "nest.x == -3"]:
        assert evaluate(compile_check(text, schema), r.address, ctx.address), text
    assert not evaluate(compile_check("dseq[2] == 0", schema), r.address, ctx.address)
    # An explicit length wins (a shorter count hides elements).
    r2 = EventRecord(schema, {"n": 1, "seq": [5, 6]})
    assert not evaluate(compile_check("seq[1] == 6", schema), r2.address, ctx.address)
    # Nested ptr sequences of structures.
    r3 = EventRecord(schema, {"items": [{"x": 1, "name": "a"}, {"x": 2, "name": "b"}]})
    assert evaluate(compile_check('items[1].name == "b"', schema), r3.address, ctx.address)


def test_record_bad_values_name_the_field():
    schema = Schema.declare("r", [("a", "s32"), ("s", "string"), ("arr", "s8[2]")])
    with pytest.raises(FilterError, match=r"r\.a .*expected an integer"):
        EventRecord(schema, {"a": "x"})
    with pytest.raises(FilterError, match=r"no field 'zz'"):
        EventRecord(schema, {"zz": 1})
    with pytest.raises(FilterError, match=r"r\.s .*expected a string"):
        EventRecord(schema, {"s": 5})
    with pytest.raises(FilterError, match=r"3 values for an array of 2"):
        EventRecord(schema, {"arr": [1, 2, 3]})


def test_pack_many():
    schema = Schema.declare(
        "r", [("id", "s32"), ("name", "string"), ("dl", StringType("data_loc")), ("d", "double")]
    )
    rows = [{"id": i, "name": f"n{i % 3}", "dl": "x" * i, "d": i / 2} for i in range(10)]
    batch = pack_many(schema, rows)
    assert len(batch) == 10 and batch.addresses.dtype == np.uint64
    assert batch.stride % 8 == 0 and batch.stride >= schema.size + 10
    assert np.all(np.diff(batch.addresses.astype(np.int64)) == batch.stride)
    ctx = EventRecord(DEFAULT_CONTEXT, {})
    tree = compile_check('id > 4 && name == "n1" && dl == "xxxx*"', schema)
    verdicts = [evaluate(tree, batch.address(i), ctx.address) for i in range(10)]
    assert verdicts == [i > 4 and i % 3 == 1 for i in range(10)]
    name_at = schema.field("name").offset
    for i in range(10):
        ours, single = batch.record_bytes(i), bytes(EventRecord(schema, rows[i]))
        # The same record but for the name pointer (another buffer).
        assert ours[:name_at] + ours[name_at + 8 :] == single[:name_at] + single[name_at + 8 :]
    # Columns, numpy arrays welcome.
    cols = pack_many(schema, {"id": np.arange(5, dtype=np.int64), "name": ["a"] * 5})
    assert evaluate(compile_check('id == 3 && name == "a"', schema), cols.address(3), ctx.address)
    assert len(pack_many(schema, [])) == 0


def test_pack_many_int_and_float_columns_convert_exactly():
    schema = Schema.declare("r", [("u", "u64"), ("s", "s8"), ("f", "float"), ("d", "double")])
    us = [-1, 2**64 - 1, 2**63, 5]  # numpy alone would make floats of this mix
    rows = [
        {"u": u, "s": s, "f": f, "d": d}
        for u, s, f, d in zip(
            us, [127, 128, -129, 0], [1e40, 0.1, -0.0, 3], [1, 2.5, -1e300, 0], strict=True
        )
    ]
    batch = pack_many(schema, rows)
    got = [struct.unpack_from("<Qb3xfd", batch.record_bytes(i)) for i in range(4)]
    assert [g[0] for g in got] == [2**64 - 1, 2**64 - 1, 2**63, 5]
    assert [g[1] for g in got] == [127, -128, 127, 0]
    assert got[0][2] == math.inf and got[1][2] == struct.unpack("<f", struct.pack("<f", 0.1))[0]
    assert [g[3] for g in got] == [1.0, 2.5, -1e300, 0.0]
