"""Hypothesis strategies for the filter tiers' differential tests.

* :func:`schemas` — small random event schemas: integers of every width
  and signedness, double, float, strings of each storage (ptr, inline,
  data_loc), static arrays, ptr sequences with their length field, data_loc
  sequences and a nested structure.
* :func:`events` — value dicts for :class:`hwtrace.filter.packing.EventRecord`
  with edge values (0, -1, the width's limits, NaN, infinities, empty
  strings, strings holding ``*`` or non-ASCII UTF-8, null pointers).
* :func:`expressions` — filter TEXT over a schema and a context schema:
  type-correct most of the time, sometimes a type error, an unknown field,
  an out-of-range static index or shift count; globs with wildcards at the
  start, middle and end and escaped stars; literals at the s64/u64 edges;
  nested parentheses; ``!``/``~``/``-`` chains; ``$ctx.`` fields.

Use: ``@given(st.data())`` then ``schema = data.draw(schemas())``,
``values = data.draw(events(schema))``,
``text = data.draw(expressions(schema, DEFAULT_CONTEXT))``.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from hwtrace.filter.schema import (
    DEFAULT_CONTEXT,
    ArrayType,
    FloatType,
    IntType,
    Schema,
    SequenceType,
    StringType,
    StructType,
    Type,
    layout,
)

__all__ = ["events", "expressions", "schemas"]

_INT_TYPES = [IntType(n, s) for n in (1, 2, 4, 8) for s in (True, False)]
_KINDS = ["int", "int", "double", "float", "str_ptr", "str_inline", "str_dl", "array", "seq"]
_KINDS += ["dl_seq", "struct"]

# -- schemas ----------------------------------------------------------------------------


@st.composite
def schemas(draw, max_extra: int = 6) -> Schema:
    """An event schema with at least one integer, one double and one string."""
    members: list[tuple[str, Type]] = [
        ("i0", draw(st.sampled_from(_INT_TYPES))),
        ("d1", FloatType(8)),
        ("s2", StringType("ptr")),
    ]
    kinds = draw(st.lists(st.sampled_from(_KINDS), max_size=max_extra))
    for k, kind in enumerate(kinds, start=3):
        if kind == "int":
            members.append((f"i{k}", draw(st.sampled_from(_INT_TYPES))))
        elif kind == "double":
            members.append((f"d{k}", FloatType(8)))
        elif kind == "float":
            members.append((f"f{k}", FloatType(4)))
        elif kind == "str_ptr":
            members.append((f"s{k}", StringType("ptr")))
        elif kind == "str_inline":
            members.append((f"c{k}", StringType("inline", draw(st.integers(1, 12)))))
        elif kind == "str_dl":
            members.append((f"l{k}", StringType("data_loc")))
        elif kind == "array":
            element = draw(st.sampled_from([*_INT_TYPES, FloatType(8), FloatType(4)]))
            members.append((f"a{k}", ArrayType(element, draw(st.integers(1, 4)))))
        elif kind == "seq":
            members.append((f"n{k}", draw(st.sampled_from(_INT_TYPES))))
            element = draw(st.sampled_from([*_INT_TYPES, FloatType(8)]))
            members.append((f"q{k}", SequenceType(element, "ptr", f"n{k}")))
        elif kind == "dl_seq":
            element = draw(st.sampled_from(_INT_TYPES))
            members.append((f"r{k}", SequenceType(element, "data_loc")))
        else:
            inner = layout(
                [
                    ("x", draw(st.sampled_from(_INT_TYPES))),
                    ("y", StringType("ptr")),
                    ("z", StringType("inline", draw(st.integers(1, 8)))),
                    ("w", ArrayType(IntType(2, True), 2)),
                ]
            )
            members.append((f"t{k}", inner))
    return Schema.declare("ev", members)


# -- events -----------------------------------------------------------------------------

_STRINGS = [
    "",
    "*",
    "a*b",
    "\\*",
    "lttng-sessiond",
    "lttng",
    "x.log",
    "/etc/passwd",
    "héllo",
    "日本語",
    "ab\x00cd",
    "a" * 20,
]
_TEXT = st.text(alphabet="ab*.\\-é日 ", max_size=10)


def _int_values(t: IntType) -> st.SearchStrategy[int]:
    bits = 8 * t.size
    lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if t.signed else (0, (1 << bits) - 1)
    edges = sorted({0, 1, -1 & hi if not t.signed else -1, lo, hi, lo + 1, hi - 1, hi >> 1})
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi))


def _float_values(t: FloatType) -> st.SearchStrategy[float]:
    edges = [0.0, -0.0, 1.0, -1.0, 0.5, 3.14159, math.nan, math.inf, -math.inf, 1e-40]
    if t.size == 8:
        edges += [1e300, -1e300, 9.223372036854775807e18]
    return st.one_of(st.sampled_from(edges), st.floats(width=32 if t.size == 4 else 64))


def _values(t: Type, length_fields: frozenset[str] = frozenset()) -> st.SearchStrategy:
    if isinstance(t, IntType):
        return _int_values(t)
    if isinstance(t, FloatType):
        return _float_values(t)
    if isinstance(t, StringType):
        s = st.one_of(st.sampled_from(_STRINGS), _TEXT)
        return st.one_of(st.none(), s) if t.storage == "ptr" else s
    if isinstance(t, ArrayType):
        return st.lists(_values(t.element), max_size=t.length)
    if isinstance(t, SequenceType):
        items = st.lists(_values(t.element), max_size=5)
        return st.one_of(st.none(), items) if t.storage == "ptr" else items
    if isinstance(t, StructType):
        counted = frozenset(
            f.type.length_field
            for f in t.fields
            if isinstance(f.type, SequenceType) and f.type.length_field
        )
        # Length fields are left to the record builder, which counts the
        # elements: a wrong count would read past the sequence's buffer.
        return st.fixed_dictionaries(
            {}, optional={f.name: _values(f.type) for f in t.fields if f.name not in counted}
        )
    raise TypeError(f"no values for {t!r}")


def events(schema: Schema) -> st.SearchStrategy[dict]:
    """Value dicts for records of ``schema`` (fields may be left out: zero)."""
    return _values(schema.struct)  # type: ignore[return-value]


# -- expressions ------------------------------------------------------------------------


def _leaves(t: StructType, prefix: str) -> list[tuple[str, str]]:
    """(text, kind) of every value reachable in ``t``: kind is "int",
    "double" or "string"; indices include one past a static array's end."""
    out: list[tuple[str, str]] = []

    def visit(tt: Type, text: str) -> None:
        if isinstance(tt, IntType):
            out.append((text, "int"))
        elif isinstance(tt, FloatType):
            out.append((text, "double"))
        elif isinstance(tt, StringType):
            out.append((text, "string"))
        elif isinstance(tt, ArrayType):
            for i in sorted({0, tt.length - 1, tt.length}):
                visit(tt.element, f"{text}[{i}]")
        elif isinstance(tt, SequenceType):
            for i in (0, 1, 4):
                visit(tt.element, f"{text}[{i}]")
        elif isinstance(tt, StructType):
            for f in tt.fields:
                visit(f.type, f"{text}.{f.name}" if text else f.name)

    visit(t, prefix)
    return out


_INT_LITERALS = [
    "0",
    "1",
    "2",
    "23",
    "-1",
    "0x10",
    "017",
    "0xff",
    "0x7FFFFFFFFFFFFFFF",
    "0x8000000000000000",
    "0xFFFFFFFFFFFFFFFF",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "2048",
]
_FLOAT_LITERALS = ["0.0", "1.5", "1.", ".5", "3.14159", "17.34e9", "-2.5e-3", "1e308", "1e19"]
_SHIFT_COUNTS = ["0", "1", "7", "63", "64", "65", "100", "-1"]


class _Gen:
    """Draws the text of typed expressions over a fixed set of leaves."""

    def __init__(self, draw, leaves: list[tuple[str, str]]) -> None:
        self.draw = draw
        self.by_kind = {k: [t for t, kk in leaves if kk == k] for k in ("int", "double", "string")}

    def pick(self, options: list[str]) -> str:
        return self.draw(st.sampled_from(options))

    def sp(self) -> str:
        return self.pick([" ", " ", ""])

    def field(self, kind: str) -> str | None:
        options = self.by_kind[kind]
        return self.pick(options) if options else None

    def int_literal(self) -> str:
        if self.draw(st.booleans()):
            return self.pick(_INT_LITERALS)
        v = self.draw(st.integers(0, (1 << 64) - 1))
        return self.pick([str(v), hex(v), f"0{v:o}" if v else "0"])

    def string_literal(self, glob: bool = True) -> str:
        pieces = st.sampled_from(
            ["a", "b", "lttng", ".log", "-", " ", "é", "日", '\\"', "\\\\", "\\*"]
        )
        parts = self.draw(st.lists(pieces, max_size=4))
        if glob and self.draw(st.integers(0, 2)) == 0:
            # Wildcards at the start, the middle or the end.
            for _ in range(self.draw(st.integers(1, 2))):
                parts.insert(self.draw(st.integers(0, len(parts))), "*")
        return '"' + "".join(parts) + '"'

    # Expressions by type.

    def integer(self, depth: int) -> str:
        # Low choices (hypothesis's favourites) are fields and literals.
        choice = self.draw(st.integers(0, 9 if depth > 0 else 2))
        f = self.field("int")
        if choice in (0, 1) and f is not None:
            return f
        if choice <= 2:
            return self.int_literal()
        if choice == 3:
            return self.pick(["-", "~", "+", "!", "- ", "~~"]) + self.integer(depth - 1)
        if choice == 4:
            op = self.pick(["&", "|", "^"])
            return f"{self.integer(depth - 1)}{self.sp()}{op}{self.sp()}{self.integer(depth - 1)}"
        if choice == 5:
            op = self.pick(["<<", ">>"])
            count = self.pick(_SHIFT_COUNTS) if self.draw(st.booleans()) else self.integer(0)
            return f"{self.integer(depth - 1)} {op} {count}"
        if choice == 6:
            return self.comparison(depth - 1)
        if choice == 7:
            return f"({self.integer(depth - 1)})"
        if choice == 8:
            op = self.pick(["&&", "||"])
            return f"({self.condition(depth - 1)}{self.sp()}{op}{self.sp()}{self.condition(depth - 1)})"
        return f"!({self.number(depth - 1)})"

    def number(self, depth: int) -> str:
        """An s64 or double expression."""
        choice = self.draw(st.integers(0, 4))
        if choice == 0 and self.field("double"):
            return self.field("double")  # type: ignore[return-value]
        if choice == 3:
            return self.pick(_FLOAT_LITERALS)
        if choice == 4 and depth > 0:
            return self.pick(["-", "+", "- "]) + self.number(depth - 1)
        return self.integer(depth)

    def string(self) -> str:
        f = self.field("string")
        if f is None or self.draw(st.integers(0, 3)) == 0:
            return self.string_literal(glob=False)
        return f

    def comparison(self, depth: int) -> str:
        if self.field("string") and self.draw(st.integers(0, 2)) == 0:
            op = self.pick(["==", "!="])
            f = self.field("string")
            other = self.string_literal() if self.draw(st.booleans()) else self.string()
            left, right = (f, other) if self.draw(st.booleans()) else (other, f)
            return f"{left}{self.sp()}{op}{self.sp()}{right}"
        op = self.pick(["==", "!=", "<", "<=", ">", ">="])
        return f"{self.number(depth)}{self.sp()}{op}{self.sp()}{self.number(depth)}"

    def condition(self, depth: int) -> str:
        choice = self.draw(st.integers(0, 6 if depth > 0 else 1))
        if choice <= 1:
            return self.comparison(max(depth - 1, 0))
        if choice == 2:
            op = self.pick(["&&", "||"])
            return (
                f"{self.condition(depth - 1)}{self.sp()}{op}{self.sp()}{self.condition(depth - 1)}"
            )
        if choice == 3:
            return f"({self.condition(depth - 1)})"
        if choice == 4:
            return "!" + self.pick(["", "!"]) + f"({self.condition(depth - 1)})"
        if choice == 5:
            return self.number(depth - 1)
        return f"(({self.condition(depth - 1)}) == {self.pick(['0', '1'])})"

    def mistake(self) -> str:
        """A type error, an unknown field or a bad index."""
        s = self.field("string") or '"x"'
        d = self.field("double") or "1.5"
        i = self.field("int") or "1"
        return self.pick(
            [
                f"{s} < {self.string_literal()}",
                f"{s} == 1",
                f"1 == {s}",
                f"~{d}",
                f"{d} & 1",
                f"{i} << {d}",
                f"{s} && 1",
                f"!{s}",
                f"-{s}",
                s,
                '"a*" == "*b"',
                "nosuch == 1",
                "$ctx.nosuch == 1",
                f"{i}.x == 1",
                f"{i}[0] == 1",
                f"{i} + 1 == 2",
                f"{i} == 18446744073709551616",
                f"({i} == 1",
                f"{i} == 1)",
                f"{i} &&",
            ]
        )


@st.composite
def expressions(
    draw, schema: Schema, context_schema: Schema = DEFAULT_CONTEXT, max_depth: int = 3
) -> str:
    """Filter text over ``schema`` (fields) and ``context_schema`` (``$ctx.``)."""
    leaves = _leaves(schema.struct, "")
    leaves += [(f"$ctx.{t}", k) for t, k in _leaves(context_schema.struct, "")]
    gen = _Gen(draw, leaves)
    # Hypothesis favours the ends of a range: a middle value picks the rare case.
    if draw(st.integers(0, 15)) == 7:
        text = gen.mistake()
        if draw(st.booleans()):
            text = f"{gen.condition(1)} && {text}"
        return text
    return gen.condition(draw(st.integers(0, max_depth)))


def balanced(n: int, op: str, predicate) -> str:
    """``predicate(0) op ... op predicate(n - 1)`` as a balanced tree of
    parentheses: long chains stay within the parser's nesting limit."""

    def part(lo: int, hi: int) -> str:
        if hi - lo == 1:
            return predicate(lo)
        mid = (lo + hi) // 2
        return f"({part(lo, mid)}) {op} ({part(mid, hi)})"

    return part(0, n)
