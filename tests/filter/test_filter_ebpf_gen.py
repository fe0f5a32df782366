"""Filter expressions compiled to eBPF: verified, run in the interpreter,
and agreeing with the reference semantics."""

from __future__ import annotations

import pytest
from filter_strategies import balanced, events, expressions, schemas
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles.filter import evaluate

from hwtrace.filter import abi
from hwtrace.filter.check import compile_check
from hwtrace.filter.ebpf.gen import generate
from hwtrace.filter.errors import FilterError
from hwtrace.filter.packing import EventRecord
from hwtrace.filter.schema import DEFAULT_CONTEXT, Schema

EVENT = Schema.declare(
    "ev",
    [
        ("msg_id", "s32"),
        ("size", "u64"),
        ("flag", "u8"),
        ("poel", "s16"),
        ("ratio", "double"),
        ("small", "float"),
        ("filename", "string"),
        ("name", "char[16]"),
        ("vals", "s32[4]"),
    ],
)
CTX = {"procname": b"lttng-sessiond", "cpu_id": 2, "pid": 42, "tid": 43}


def _run(text: str, values: dict, context: dict | None = None) -> tuple[bool, bool]:
    tree = compile_check(text, EVENT)
    prog = generate(tree, EVENT).link()
    ev = EventRecord(EVENT, values)
    cx = EventRecord(DEFAULT_CONTEXT, context or CTX)
    return bool(prog(ev.address, cx.address)), evaluate(tree, ev.address, cx.address)


@pytest.mark.parametrize(
    ("text", "values", "want"),
    [
        ("msg_id == 23 && size >= 2048", {"msg_id": 23, "size": 4096}, True),
        ("msg_id == 23 && size >= 2048", {"msg_id": 23, "size": 1}, False),
        ('$ctx.procname == "lttng*" && (!flag || poel < 34)', {"flag": 1, "poel": 3}, True),
        ('$ctx.cpu_id == 2 && filename != "*.log"', {"filename": b"x.txt"}, True),
        ('$ctx.cpu_id == 2 && filename != "*.log"', {"filename": b"x.log"}, False),
        ("ratio > 3.14159", {"ratio": 3.5}, True),
        ("ratio > 3.14159", {"ratio": float("nan")}, False),
        ("ratio != ratio", {"ratio": float("nan")}, True),
        ("small < 0.5 && small > 0.24", {"small": 0.25}, True),
        ("msg_id < 1.5", {"msg_id": 1}, True),
        ("vals[3] == -7", {"vals": [0, 0, 0, -7]}, True),
        ("vals[4] == 0 || 1", {}, False),  # out of range: the whole thing is false
        ("!(vals[9] == 1)", {}, False),
        ("1 << 64 == 0 || 1", {}, False),
        ("(poel << 2) == -8", {"poel": -2}, True),
        ("~msg_id == -24", {"msg_id": 23}, True),
        ("-poel == 5", {"poel": -5}, True),
        ('name == "abc" && filename == name', {"name": b"abc", "filename": b"abc"}, True),
        ('filename == "a\\*b"', {"filename": b"a*b"}, True),
        ('filename == "a\\*b"', {"filename": b"axb"}, False),
        ("size == 0xFFFFFFFFFFFFFFFF", {"size": 2**64 - 1}, True),
        ("(msg_id == 1) + 0 == 1" if False else "(msg_id == 1) == 1", {"msg_id": 1}, True),
        ("2 & 2 == 2", {}, True),
        ("flag & 1 | poel ^ 3 << 1", {"flag": 1}, True),
        ('filename == "x"', {"filename": None}, False),  # null pointer: missing
    ],
)
def test_examples(text, values, want):
    got, ref = _run(text, values)
    assert ref == want
    assert got == want


def test_deep_nesting_spills_to_the_stack():
    text = (
        "((((msg_id & 1) | (poel & 2)) ^ ((flag | 4) & (msg_id ^ 8))) | ((poel << 1) & 255)) == 7"
    )
    got, ref = _run(text, {"msg_id": 5, "poel": 3, "flag": 9})
    assert got == ref


def test_over_the_instruction_limit_is_said():
    text = balanced(500, "&&", lambda i: f'filename == "s{i}"')
    with pytest.raises(FilterError, match="limit of 4096"):
        generate(compile_check(text, EVENT), EVENT)


def test_paper_chain_shape():
    """N string predicates + one integer: a handful of instructions each."""
    fields = [(f"var{i}", "string") for i in range(50)] + [("lyf", "s64")]
    schema = Schema.declare("tp", fields)
    text = " && ".join(f'(var{i} == "str{i}")' for i in range(50)) + " && (lyf == 42)"
    prog = generate(compile_check(text, schema), schema)
    assert len(prog.insns) < 12 * 51
    linked = prog.link()
    vals = {f"var{i}": f"str{i}".encode() for i in range(50)} | {"lyf": 42}
    ev = EventRecord(schema, vals)
    assert linked(ev.address, 0) == 1
    ev = EventRecord(schema, vals | {"lyf": 43})
    assert linked(ev.address, 0) == 0
    assert linked.memory_bytes < 32 * 1024


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_agrees_with_the_reference(data):
    schema = data.draw(schemas())
    values = data.draw(events(schema))
    text = data.draw(expressions(schema, DEFAULT_CONTEXT))
    try:
        tree = compile_check(text, schema)
    except FilterError:
        return
    prog = generate(tree, schema)
    assert len(prog.insns) <= abi.MAX_INSNS
    linked = prog.link()
    ev = EventRecord(schema, values)
    cx = EventRecord(DEFAULT_CONTEXT, CTX)
    assert bool(linked(ev.address, cx.address)) == evaluate(tree, ev.address, cx.address), text
