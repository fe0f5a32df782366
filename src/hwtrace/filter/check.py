"""Type-check a filter's syntax tree against event and context schemas.

:func:`check` resolves every field reference (:meth:`Schema.resolve`), sets
``type`` on every node (``"s64"``, ``"double"``, ``"string"``) following
docs/filter-design.md, refuses what LTTng refuses (with the column of the
offending operator or field), and folds subtrees made only of literals.

Unknown fields: an error by default; with ``unknown="false"`` (LTTng's
lenient mode, for one filter over events of several types) the reference
keeps ``path=None``, meaning "missing": evaluating it makes the whole
expression false.  Such a reference has no type of its own; it takes
``"string"`` when compared with a string and ``"s64"`` otherwise, so the
rest of the tree still type-checks as it would for an event that has it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from . import ast
from .ast import glob_match
from .errors import FilterError
from .parse import parse, wrap_s64
from .schema import DEFAULT_CONTEXT, Schema

Unknown = Literal["error", "false"]


def check(
    tree: ast.Node,
    event: Schema,
    context: Schema = DEFAULT_CONTEXT,
    *,
    unknown: Unknown = "error",
    text: str | None = None,
    fold: bool = True,
) -> ast.Node:
    """The typed, folded tree of ``tree`` (nodes are updated in place;
    folded subtrees are replaced, so use the returned root).

    ``text``, when given, is the expression's source: errors then show it
    with a caret.  ``fold=False`` keeps literal-only subtrees as they are
    (tests check that folding never changes a verdict).
    """
    if unknown not in ("error", "false"):
        raise ValueError(f"unknown must be 'error' or 'false', not {unknown!r}")
    try:
        root = _Checker(event, context, unknown, fold).node(tree)
        _settle(root, "s64")
        if root.type == "string":
            raise FilterError(
                "the filter is a string, not a condition (compare it with == or !=)",
                column=root.column,
            )
        return root
    except FilterError as e:
        if e.expression is None and text is not None:
            e.expression = text
        raise


def compile_check(
    text: str,
    event: Schema,
    context: Schema = DEFAULT_CONTEXT,
    unknown: Unknown = "error",
) -> ast.Node:
    """:func:`~.parse.parse` then :func:`check`: the typed tree of ``text``."""
    return check(parse(text), event, context, unknown=unknown, text=text)


def _truth(value: int | float) -> bool:
    return value != 0


@dataclass
class _Checker:
    event: Schema
    context: Schema
    unknown: Unknown
    fold: bool

    def node(self, n: ast.Node) -> ast.Node:
        if isinstance(n, ast.IntLit):
            n.type = "s64"
        elif isinstance(n, ast.FloatLit):
            n.type = "double"
        elif isinstance(n, ast.StrLit):
            n.type = "string"
        elif isinstance(n, ast.FieldRef):
            self.field(n)
        elif isinstance(n, ast.Unary):
            return self.unary(n)
        elif isinstance(n, ast.Binary):
            return self.binary(n)
        elif isinstance(n, ast.Logical):
            return self.logical(n)
        else:
            raise FilterError(f"unexpected node {type(n).__name__}", column=n.column)
        return n

    # Fields.

    def field(self, ref: ast.FieldRef) -> None:
        schema = self.event if ref.root == "event" else self.context
        try:
            path = schema.resolve(ref.names, ref.text)
        except FilterError as e:
            raise FilterError(e.message, column=ref.column) from None
        if path is None:
            if self.unknown == "error":
                kind = "event" if ref.root == "event" else "context"
                raise FilterError(
                    f"unknown field '{ref.text}' in {kind} '{schema.name}'", column=ref.column
                )
            ref.path = None
            ref.type = None  # settled by the operator that uses it
            return
        ref.path = path
        ref.type = {"int": "s64", "float": "double", "string": "string"}[path.leaf]  # type: ignore[assignment]

    # Operators.

    def unary(self, n: ast.Unary) -> ast.Node:
        operand = self.node(n.operand)
        _settle(operand, "s64")
        n.operand = operand
        if operand.type == "string":
            raise FilterError(f"unary '{n.op}' cannot apply to a string", column=n.column)
        if n.op == "~" and operand.type == "double":
            raise FilterError("'~' needs an integer operand, not a double", column=n.column)
        n.type = "s64" if n.op in ("!", "~") else operand.type
        return _fold_unary(n) if self.fold else n

    def binary(self, n: ast.Binary) -> ast.Node:
        left = n.left = self.node(n.left)
        right = n.right = self.node(n.right)
        # A missing field takes the type of the other side when that is a string.
        if left.type is None:
            _settle(left, "string" if right.type == "string" else "s64")
        if right.type is None:
            _settle(right, "string" if left.type == "string" else "s64")
        op = n.op
        if op in ast.BITWISE_OPS:
            for side in (left, right):
                if side.type != "s64":
                    raise FilterError(
                        f"bitwise '{op}' needs integer operands, not a {side.type}",
                        column=n.column,
                    )
            n.type = "s64"
            return _fold_bitwise(n) if self.fold else n
        if op not in ast.COMPARISON_OPS:
            raise FilterError(f"unknown operator '{op}'", column=n.column)
        n.type = "s64"
        strings = (left.type == "string") + (right.type == "string")
        if strings == 1:
            raise FilterError("cannot compare a string with a number", column=n.column)
        if strings == 2:
            if op not in ast.EQUALITY_OPS:
                raise FilterError(
                    f"strings can only be compared with '==' or '!=', not '{op}'",
                    column=n.column,
                )
            if (
                isinstance(left, ast.StrLit)
                and isinstance(right, ast.StrLit)
                and left.is_glob
                and right.is_glob
            ):
                raise FilterError("cannot compare two glob patterns", column=n.column)
            return _fold_strings(n) if self.fold else n
        return _fold_compare(n) if self.fold else n

    def logical(self, n: ast.Logical) -> ast.Node:
        left = n.left = self.node(n.left)
        right = n.right = self.node(n.right)
        for side in (left, right):
            _settle(side, "s64")
            if side.type == "string":
                raise FilterError(
                    f"operand of '{n.op}' is a string (compare it with == or !=)",
                    column=n.column,
                )
        n.type = "s64"
        # The left operand alone may decide: the right one is never evaluated.
        if self.fold and isinstance(left, (ast.IntLit, ast.FloatLit)):
            if _truth(left.value) == (n.op == "||"):
                return ast.IntLit(int(n.op == "||"), column=n.column, type="s64")
            if isinstance(right, (ast.IntLit, ast.FloatLit)):
                return ast.IntLit(int(_truth(right.value)), column=n.column, type="s64")
        return n


def _settle(n: ast.Node, t: ast.ValueType) -> None:
    """Give a missing field (lenient mode) the type its use asks for."""
    if n.type is None:
        n.type = t


# -- constant folding ----------------------------------------------------------------
# Only subtrees made of literals: nothing in them can be missing, so folding
# cannot change which events the expression accepts.


def _fold_unary(n: ast.Unary) -> ast.Node:
    v = n.operand
    if not isinstance(v, (ast.IntLit, ast.FloatLit)):
        return n
    if n.op == "!":
        return ast.IntLit(int(v.value == 0), column=n.column, type="s64")
    if n.op == "~":
        return ast.IntLit(wrap_s64(~v.value), column=n.column, type="s64")
    value = v.value if n.op == "+" else -v.value
    if isinstance(v, ast.IntLit):
        return ast.IntLit(wrap_s64(value), column=n.column, type="s64")  # type: ignore[arg-type]
    return ast.FloatLit(value, column=n.column, type="double")


def _fold_bitwise(n: ast.Binary) -> ast.Node:
    a, b = n.left, n.right
    if not (isinstance(a, ast.IntLit) and isinstance(b, ast.IntLit)):
        return n
    x, y = a.value & (2**64 - 1), b.value & (2**64 - 1)
    if n.op in ("<<", ">>"):
        if not 0 <= b.value <= 63:
            return n  # false when evaluated, if it is: left for run time
        value = x << b.value if n.op == "<<" else x >> b.value
    elif n.op == "&":
        value = x & y
    elif n.op == "|":
        value = x | y
    else:
        value = x ^ y
    return ast.IntLit(wrap_s64(value), column=n.column, type="s64")


def _compare(op: str, x, y) -> bool:
    return {
        "==": x == y,
        "!=": x != y,
        "<": x < y,
        "<=": x <= y,
        ">": x > y,
        ">=": x >= y,
    }[op]


def _fold_compare(n: ast.Binary) -> ast.Node:
    a, b = n.left, n.right
    literal = (ast.IntLit, ast.FloatLit)
    if not (isinstance(a, literal) and isinstance(b, literal)):
        return n
    x, y = a.value, b.value
    if isinstance(a, ast.FloatLit) or isinstance(b, ast.FloatLit):
        x, y = float(x), float(y)
    return ast.IntLit(int(_compare(n.op, x, y)), column=n.column, type="s64")


def _fold_strings(n: ast.Binary) -> ast.Node:
    a, b = n.left, n.right
    if not (isinstance(a, ast.StrLit) and isinstance(b, ast.StrLit)):
        return n
    if a.is_glob:
        a, b = b, a
    if b.is_glob:
        equal = glob_match(b.parts, a.parts[0])
    else:
        equal = a.parts[0] == b.parts[0]
    return ast.IntLit(int(equal == (n.op == "==")), column=n.column, type="s64")
