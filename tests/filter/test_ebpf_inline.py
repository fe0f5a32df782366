"""String helpers inlined into JIT code: the same verdicts, no helper calls
left for static fields, and never a byte read past a string's end."""

from __future__ import annotations

import ctypes
import mmap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles.filter import evaluate

from hwtrace.filter import abi
from hwtrace.filter.check import compile_check
from hwtrace.filter.ebpf import isa
from hwtrace.filter.ebpf.gen import generate
from hwtrace.filter.ebpf.inline import inline_string_helpers
from hwtrace.filter.ebpf.jit import jit_compile
from hwtrace.filter.packing import EventRecord
from hwtrace.filter.schema import Schema

SCHEMA = Schema.declare("ev", [("p", "string"), ("n", "char[4]"), ("x", "s64")])


def _calls(insns) -> list[int]:
    code, _, _, _, imm = isa.fields(insns)
    return [int(i) for c, i in zip(code, imm, strict=True) if c == isa.JMP | isa.CALL]


def _both(text: str, values: dict) -> tuple[bool, bool, bool]:
    tree = compile_check(text, SCHEMA)
    linked = generate(tree, SCHEMA).link()
    rec = EventRecord(SCHEMA, values)
    jit = bool(jit_compile(linked)(rec.address))
    plain = bool(jit_compile(linked, inline=False)(rec.address))
    return jit, plain, evaluate(tree, rec.address, 0)


def test_static_string_compares_leave_no_helper_calls():
    linked = generate(compile_check('p == "abc" && n == "xy" && x == 1', SCHEMA), SCHEMA).link()
    assert _calls(linked.insns).count(abi.HELPER_STR_EQ) == 2
    assert abi.HELPER_STR_EQ not in _calls(inline_string_helpers(linked))
    # Globs stay helper calls.
    linked = generate(compile_check('p == "a*c"', SCHEMA), SCHEMA).link()
    assert _calls(inline_string_helpers(linked)) == [abi.HELPER_STR_GLOB]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ('p == ""', {"p": b""}),
        ('p == ""', {"p": b"a"}),
        ('p == "abc"', {"p": b"abc"}),
        ('p == "abc"', {"p": b"abcd"}),
        ('p == "abc"', {"p": b"ab"}),
        ('p != "abc"', {"p": None}),  # null: missing, the whole thing false
        ('!(p == "abc") || 1', {"p": None}),
        ('n == "abcd"', {"n": b"abcd"}),  # full char[4], no NUL
        ('n == "abcde"', {"n": b"abcd"}),  # longer than the field
        ('n == "ab"', {"n": b"ab"}),
        ('n == "ab"', {"n": b"abc"}),
        ('p == "\u00e9t\u00e9"', {"p": "\u00e9t\u00e9".encode()}),
    ],
)
def test_inlined_verdicts(text, values):
    jit, plain, ref = _both(text, values)
    assert jit == plain == ref


@settings(max_examples=200, deadline=None)
@given(lit=st.binary(max_size=6).filter(lambda b: b"\0" not in b), s=st.binary(max_size=7))
def test_inlined_equals_helper(lit, s):
    s = s.split(b"\0")[0]
    text = (
        'p == "'
        + lit.decode("latin-1").replace("\\", "\\\\").replace('"', '\\"').replace("*", "\\*")
        + '"'
    )
    try:
        tree = compile_check(text, SCHEMA)
    except Exception:
        return
    linked = generate(tree, SCHEMA).link()
    rec = EventRecord(SCHEMA, {"p": s})
    assert bool(jit_compile(linked)(rec.address)) == evaluate(tree, rec.address, 0)


def test_no_read_past_the_string_end():
    """The string ends at a page's last byte, before an unmapped page: the
    inlined compare must stop at the NUL (a longer literal cannot match)."""
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, 2 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(area))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(base + page, page, 0) == 0  # the second page: no access
    area[page - 3 : page] = b"ab\0"
    rec = EventRecord(SCHEMA, {})
    ctypes.c_uint64.from_address(rec.address).value = base + page - 3
    linked = generate(compile_check('p == "abcdefgh"', SCHEMA), SCHEMA).link()
    assert jit_compile(linked)(rec.address) == 0
    linked = generate(compile_check('p == "ab"', SCHEMA), SCHEMA).link()
    assert jit_compile(linked)(rec.address) == 1
