"""The filter semantics in plain Python: the oracle every tier is tested
against (docs/filter-design.md, "Semantics").

It reads the event and context records where they are in memory (through
ctypes) and walks each :class:`~.schema.FieldPath`'s steps itself, so it
shares no code with the native walker it checks.  It is slow on purpose:
one straightforward line per rule.  String patterns match as
:func:`hwtrace.filter.ast.glob_match` says (the front end folds constant
comparisons with it too).
"""

from __future__ import annotations

import ctypes

from hwtrace.filter import ast
from hwtrace.filter.ast import glob_match
from hwtrace.filter.schema import (
    P_ADD,
    P_COUNT,
    P_DATA_LOC,
    P_DEREF,
    P_ELEM,
    ROOT_CONTEXT,
    FieldPath,
)

_U64 = (1 << 64) - 1


class _Missing(Exception):
    """Evaluation reached missing data (or a shift count outside 0..63):
    the whole expression is false."""


def evaluate(tree: ast.Node, event_address: int, context_address: int) -> bool:
    """The verdict of the checked ``tree`` on the records at these addresses."""
    try:
        value = _Evaluator(event_address, context_address).value(tree)
    except _Missing:
        return False
    return value != 0


def to_s64(value: int) -> int:
    value &= _U64
    return value - (1 << 64) if value >> 63 else value


# -- memory ---------------------------------------------------------------------------


def _read(addr: int, size: int) -> bytes:
    return ctypes.string_at(addr, size)


def _read_int(addr: int, size: int, signed: bool) -> int:
    return int.from_bytes(_read(addr, size), "little", signed=signed)


def _read_c_string(addr: int, bound: int | None) -> bytes:
    """Bytes up to the first NUL, or ``bound`` bytes when there is none."""
    if bound is None:
        return ctypes.string_at(addr)
    data = _read(addr, bound) if bound > 0 else b""
    nul = data.find(b"\0")
    return data if nul < 0 else data[:nul]


def _walk(path: FieldPath, root: int) -> int:
    """The address of the leaf's slot, following ``path.steps`` one by one."""
    addr = root
    limit = -1  # bytes valid at a dynamic base; -1: none
    for op, a, b, c in path.steps:
        if op == P_ADD:
            addr += a
        elif op == P_DEREF:
            addr = _read_int(addr, 8, False)
            if addr == 0:
                raise _Missing
        elif op == P_DATA_LOC:
            v = _read_int(addr, 4, False)
            addr = root + (v & 0xFFFF)
            limit = v >> 16
        elif op == P_COUNT:
            n = _read_int(addr + a, abs(b), b < 0)
            limit = max(n, 0) * c
        elif op == P_ELEM:
            if a < 0 or (a + 1) * b > limit:
                raise _Missing
            addr += a * b
            limit = -1
        else:
            raise ValueError(f"{path.text}: unknown path step {op}")
    return addr


class _Evaluator:
    def __init__(self, event: int, context: int) -> None:
        self.event = event
        self.context = context

    def load(self, ref: ast.FieldRef) -> int | float | bytes:
        path = ref.path
        if path is None:  # a field the event lacks (lenient mode)
            raise _Missing
        root = self.context if path.root == ROOT_CONTEXT else self.event
        slot = _walk(path, root)
        if path.leaf == "int":
            return to_s64(_read_int(slot, path.size, path.signed))
        if path.leaf == "float":
            fmt = ctypes.c_float if path.size == 4 else ctypes.c_double
            return float(fmt.from_address(slot).value)
        if path.storage == "ptr":
            s = _read_int(slot, 8, False)
            if s == 0:
                raise _Missing
            return _read_c_string(s, None)
        if path.storage == "inline":
            return _read_c_string(slot, path.capacity)
        v = _read_int(slot, 4, False)  # data_loc
        return _read_c_string(root + (v & 0xFFFF), v >> 16)

    def value(self, n: ast.Node) -> int | float:
        """The value of a numeric node (s64 as int, double as float)."""
        if isinstance(n, (ast.IntLit, ast.FloatLit)):
            return n.value
        if isinstance(n, ast.FieldRef):
            v = self.load(n)
            if isinstance(v, bytes):
                raise TypeError(f"{n.text} is a string where a number is needed")
            return v
        if isinstance(n, ast.Unary):
            v = self.value(n.operand)
            if n.op == "!":
                return int(v == 0)
            if n.op == "~":
                return to_s64(~int(v))
            if n.op == "-":
                return -v if isinstance(v, float) else to_s64(-v)
            return v
        if isinstance(n, ast.Logical):
            left = self.value(n.left) != 0
            if n.op == "&&" and not left:
                return 0
            if n.op == "||" and left:
                return 1
            return int(self.value(n.right) != 0)
        if isinstance(n, ast.Binary):
            if n.op in ast.BITWISE_OPS:
                return self.bitwise(n)
            if n.left.type == "string":
                return self.strings(n)
            x, y = self.value(n.left), self.value(n.right)
            if isinstance(x, float) or isinstance(y, float):
                x, y = float(x), float(y)
            return int(_COMPARE[n.op](x, y))
        if isinstance(n, ast.StrLit):
            raise TypeError("a string literal where a number is needed")
        raise TypeError(f"unexpected node {type(n).__name__}")

    def bitwise(self, n: ast.Binary) -> int:
        x = int(self.value(n.left)) & _U64
        y = self.value(n.right)
        if n.op in ("<<", ">>"):
            if not 0 <= y <= 63:
                raise _Missing
            return to_s64(x << y if n.op == "<<" else x >> y)
        y = int(y) & _U64
        if n.op == "&":
            return to_s64(x & y)
        if n.op == "|":
            return to_s64(x | y)
        return to_s64(x ^ y)

    def strings(self, n: ast.Binary) -> int:
        a, b = n.left, n.right
        if isinstance(a, ast.StrLit) and not isinstance(b, ast.StrLit):
            a, b = b, a  # the literal (a pattern, perhaps) on the right
        if isinstance(b, ast.StrLit):
            if isinstance(a, ast.StrLit):  # two literals (the checker folds these)
                if a.is_glob:
                    a, b = b, a
                subject = a.parts[0]  # type: ignore[attr-defined]
            else:
                subject = self.load(a)  # type: ignore[arg-type]
            equal = glob_match(b.parts, subject)  # type: ignore[arg-type]
        else:
            equal = self.load(a) == self.load(b)  # type: ignore[arg-type]
        return int(equal == (n.op == "=="))


_COMPARE = {
    "==": lambda x, y: x == y,
    "!=": lambda x, y: x != y,
    "<": lambda x, y: x < y,
    "<=": lambda x, y: x <= y,
    ">": lambda x, y: x > y,
    ">=": lambda x, y: x >= y,
}
