"""The filter language's syntax tree, shared by the checker and every tier.

The parser (:mod:`.parse`) builds these nodes with the 1-based ``column``
of their first character; the checker (:mod:`.check`) fills ``type`` on
every node (``"s64"``, ``"double"`` or ``"string"``) and ``path`` on field
references (the :class:`~.schema.FieldPath` they resolve to, or None when
the schema lacks the field: evaluating it then makes the whole expression
false, LTTng's rule).  Back ends compile the checked tree; nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .schema import FieldPath

ValueType = Literal["s64", "double", "string"]

UNARY_OPS = ("!", "~", "-", "+")
BITWISE_OPS = ("<<", ">>", "&", "^", "|")
ORDER_OPS = ("<", "<=", ">", ">=")
EQUALITY_OPS = ("==", "!=")
COMPARISON_OPS = ORDER_OPS + EQUALITY_OPS
LOGICAL_OPS = ("&&", "||")


@dataclass(eq=False)
class Node:
    column: int = field(default=0, kw_only=True)
    type: ValueType | None = field(default=None, kw_only=True)


@dataclass(eq=False)
class IntLit(Node):
    value: int  # already wrapped to s64


@dataclass(eq=False)
class FloatLit(Node):
    value: float


@dataclass(eq=False)
class StrLit(Node):
    """A string literal, escapes resolved.  ``parts`` is the text between
    unescaped ``*`` wildcards: one part means an exact string, more mean a
    glob (``"ab*c*"`` is ``(b"ab", b"c", b"")``)."""

    parts: tuple[bytes, ...]

    @property
    def is_glob(self) -> bool:
        return len(self.parts) > 1


def glob_match(parts: tuple[bytes, ...], s: bytes) -> bool:
    """``s`` matches the pattern whose text between ``*`` wildcards is
    ``parts`` (see :class:`~.ast.StrLit`): it starts with the first part,
    ends with the last and holds the others in order between them."""
    if len(parts) == 1:
        return s == parts[0]
    first, *middle, last = parts
    if len(s) < len(first) + len(last) or not s.startswith(first) or not s.endswith(last):
        return False
    pos, end = len(first), len(s) - len(last)
    for part in middle:
        # The earliest place each part fits leaves the most room for the rest.
        found = s.find(part, pos, end)
        if found < 0:
            return False
        pos = found + len(part)
    return True


@dataclass(eq=False)
class FieldRef(Node):
    """``a.b[2].c`` (root ``"event"``), ``$ctx.NAME`` (root ``"ctx"``) or
    ``$app.PROVIDER:NAME`` (root ``"app"``, path ``("PROVIDER:NAME",)``).
    ``path`` holds names and constant indices in order."""

    root: Literal["event", "ctx", "app"]
    names: tuple[str | int, ...]
    path: FieldPath | None = field(default=None, kw_only=True)

    @property
    def text(self) -> str:
        out = {"event": "", "ctx": "$ctx.", "app": "$app."}[self.root]
        for k, n in enumerate(self.names):
            out += f"[{n}]" if isinstance(n, int) else (f".{n}" if k else n)
        return out


@dataclass(eq=False)
class Unary(Node):
    op: str  # one of UNARY_OPS
    operand: Node


@dataclass(eq=False)
class Binary(Node):
    """Bitwise and comparison operators."""

    op: str  # one of BITWISE_OPS + COMPARISON_OPS
    left: Node
    right: Node


@dataclass(eq=False)
class Logical(Node):
    op: str  # "&&" or "||"
    left: Node
    right: Node


def walk(node: Node):
    """Every node of a tree, parents before children, left to right."""
    yield node
    if isinstance(node, Unary):
        yield from walk(node.operand)
    elif isinstance(node, (Binary, Logical)):
        yield from walk(node.left)
        yield from walk(node.right)


def field_refs(tree: Node, root: str | None = None) -> list[FieldRef]:
    """The field references of a tree in :func:`walk`'s order (only those
    of ``root``, e.g. ``"event"``, when given)."""
    return [n for n in walk(tree) if isinstance(n, FieldRef) and (root is None or n.root == root)]
