"""Event schemas: field names, types and where each field's value lives.

A filter runs on two records in memory: the event (its payload, laid out as
the tracer lays it out: a tracefs raw record, an LTTng-UST probe's argument
struct, a C struct the host fills) and the context (``$ctx.*`` and
``$app.*`` values the caller supplies).  A :class:`Schema` describes one
such record: fields at byte offsets, with types

* :class:`IntType` (1, 2, 4, 8 bytes, signed or not; enums are integers),
* :class:`FloatType` (4 or 8 bytes),
* :class:`StringType`: ``ptr`` (a ``char *`` to a NUL-terminated string),
  ``inline`` (``char[N]``, NUL-terminated or full) or ``data_loc`` (tracefs
  ``__data_loc char[]``: a u32 whose low 16 bits are the offset from the
  record's start and high 16 bits the length in bytes),
* :class:`ArrayType` (inline, fixed length), :class:`SequenceType`
  (``ptr`` with a sibling length field, or ``data_loc``), :class:`StructType`.

:meth:`Schema.resolve` turns a reference like ``msg.user[1].data[2]`` into
a :class:`FieldPath`: the leaf's type and the steps that find its address
from the record's start.  Every tier walks the same steps (encoded as an
int64 array, :attr:`FieldPath.code`), so all agree on what is missing: a
null pointer or an index past a dynamic length makes the whole expression
false at run time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Union

import numpy as np

from .errors import FilterError

# -- types -------------------------------------------------------------------------


class _Sized:
    """A type whose fixed part is its ``size`` field."""

    size: int

    @property
    def fixed_size(self) -> int:
        return self.size


class _Scalar(_Sized):
    """A number type: ``size`` bytes, aligned to its size."""

    @property
    def align(self) -> int:
        return self.size


@dataclass(frozen=True)
class IntType(_Scalar):
    size: int = 8  # bytes: 1, 2, 4, 8
    signed: bool = True


@dataclass(frozen=True)
class FloatType(_Scalar):
    size: int = 8  # 4 or 8


@dataclass(frozen=True)
class StringType:
    storage: Literal["ptr", "inline", "data_loc"] = "ptr"
    capacity: int = 0  # inline: bytes reserved (char[N])

    @property
    def fixed_size(self) -> int:
        return {"ptr": 8, "inline": self.capacity, "data_loc": 4}[self.storage]

    @property
    def align(self) -> int:
        return {"ptr": 8, "inline": 1, "data_loc": 4}[self.storage]


@dataclass(frozen=True)
class ArrayType:
    element: Type
    length: int

    @property
    def fixed_size(self) -> int:
        return self.element.fixed_size * self.length

    @property
    def align(self) -> int:
        return self.element.align


@dataclass(frozen=True)
class SequenceType:
    """A variable-length array: ``ptr`` (a pointer to the elements; their
    count in the sibling integer field ``length_field``) or ``data_loc``
    (tracefs ``__data_loc T[]``; the length half counts bytes)."""

    element: Type
    storage: Literal["ptr", "data_loc"] = "ptr"
    length_field: str | None = None

    @property
    def fixed_size(self) -> int:
        return 8 if self.storage == "ptr" else 4

    @property
    def align(self) -> int:
        return self.fixed_size


@dataclass(frozen=True)
class Field:
    name: str
    type: Type
    offset: int


@dataclass(frozen=True)
class StructType(_Sized):
    fields: tuple[Field, ...]
    size: int

    @property
    def align(self) -> int:
        return max((f.type.align for f in self.fields), default=1)

    def member(self, name: str) -> Field | None:
        return next((f for f in self.fields if f.name == name), None)


Type = Union[IntType, FloatType, StringType, ArrayType, SequenceType, StructType]  # noqa: UP007

# Type names for declarations (:meth:`Schema.declare`).
_NAMED: dict[str, Type] = {
    **{f"s{8 * n}": IntType(n, True) for n in (1, 2, 4, 8)},
    **{f"u{8 * n}": IntType(n, False) for n in (1, 2, 4, 8)},
    **{f"int{8 * n}": IntType(n, True) for n in (1, 2, 4, 8)},
    **{f"uint{8 * n}": IntType(n, False) for n in (1, 2, 4, 8)},
    "char": IntType(1, True),
    "short": IntType(2, True),
    "int": IntType(4, True),
    "long": IntType(8, True),
    "float": FloatType(4),
    "double": FloatType(8),
    "string": StringType("ptr"),
}


def type_named(name: str) -> Type:
    """``s64``, ``u32``, ``double``, ``string`` (a ``char *``), ``char[16]``
    (an inline string), ``s32[4]`` (an inline array)."""
    name = name.strip()
    if name.endswith("]") and "[" in name:
        base, _, count = name[:-1].rpartition("[")
        n = int(count, 0)
        if base.strip() == "char":
            return StringType("inline", n)
        return ArrayType(type_named(base), n)
    try:
        return _NAMED[name]
    except KeyError:
        raise FilterError(f"unknown type {name!r}") from None


def layout(members: list[tuple[str, Type | str]]) -> StructType:
    """Fields at C's natural alignment, in order."""
    offset = 0
    fields = []
    for name, t in members:
        t = type_named(t) if isinstance(t, str) else t
        offset = -(-offset // t.align) * t.align
        fields.append(Field(name, t, offset))
        offset += t.fixed_size
    align = max((f.type.align for f in fields), default=1)
    return StructType(tuple(fields), -(-offset // align) * align)


# -- paths ---------------------------------------------------------------------------

ROOT_EVENT, ROOT_CONTEXT = 0, 1
LEAF_INT, LEAF_FLOAT, LEAF_STRING = 0, 1, 2
STRING_PTR, STRING_INLINE, STRING_DATA_LOC = 0, 1, 2

# Path steps (each 4 int64 words: op, a, b, c).  The walk keeps ``addr``
# (starts at the root record's address) and ``limit`` (bytes valid at a
# dynamic base, -1: none).
P_ADD = 1  # addr += a
P_DEREF = 2  # addr = *(u64 *)addr; missing if 0
P_DATA_LOC = 3  # v = *(u32 *)addr; addr = root + (v & 0xffff); limit = v >> 16
P_COUNT = 4  # limit = max(n, 0) * c, n the int of |b| bytes (b < 0: signed) at addr + a
P_ELEM = 5  # missing unless (a + 1) * b <= limit; addr += a * b; limit = -1

_STEP_WORDS = 4
# Header: root, leaf kind, leaf size, leaf signed / string storage, string capacity, steps.
_HEADER_WORDS = 6


@dataclass(frozen=True)
class FieldPath:
    """Where one leaf value is: ``steps`` from the root record's address.

    ``static_offset`` is set when the leaf is at a constant offset from the
    root (no pointer, no data_loc, no dynamic bound): tiers load it
    directly.  ``code`` is the int64 encoding every native walker reads.
    """

    text: str
    root: int
    leaf: Literal["int", "float", "string"]
    size: int  # leaf bytes (a string's slot: 8 ptr, 4 data_loc, N inline)
    signed: bool = True
    storage: Literal["ptr", "inline", "data_loc"] | None = None  # strings
    capacity: int = 0  # inline strings
    steps: tuple[tuple[int, int, int, int], ...] = ()
    static_offset: int | None = None
    code: np.ndarray = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        kind = {"int": LEAF_INT, "float": LEAF_FLOAT, "string": LEAF_STRING}[self.leaf]
        storage = {None: 0, "ptr": STRING_PTR, "inline": STRING_INLINE, "data_loc": STRING_DATA_LOC}
        sub = storage[self.storage] if self.leaf == "string" else int(self.signed)
        words = [self.root, kind, self.size, sub, self.capacity, len(self.steps)]
        for s in self.steps:
            words += list(s)
        object.__setattr__(self, "code", np.array(words, dtype=np.int64))


@dataclass
class Schema:
    """One record's layout (an event's payload, or the context)."""

    name: str
    struct: StructType
    root: int = ROOT_EVENT

    @classmethod
    def declare(
        cls, name: str, members: list[tuple[str, Type | str]], *, root: int = ROOT_EVENT
    ) -> Schema:
        """A schema from ``(name, type)`` pairs laid out as a C struct."""
        return cls(name, layout(members), root)

    @property
    def size(self) -> int:
        """Bytes of the fixed part (what a record must at least hold)."""
        return self.struct.size

    @property
    def fields(self) -> tuple[Field, ...]:
        return self.struct.fields

    def field(self, name: str) -> Field | None:
        return self.struct.member(name)

    def resolve(self, names: tuple[str | int, ...], text: str = "") -> FieldPath | None:
        """The path of ``names`` (member names and constant indices), or
        None when the schema has no such field.  Misuse (indexing a number,
        a member of a non-struct) raises :class:`FilterError`."""
        text = text or ".".join(str(n) for n in names)
        t: Type = self.struct
        offset = 0  # pending constant offset
        steps: list[tuple[int, int, int, int]] = []
        static = True
        parent: StructType | None = None
        parent_at = 0  # offset of the parent struct relative to the current base
        for n in names:
            if isinstance(n, str):
                if not isinstance(t, StructType):
                    raise FilterError(f"{text}: {n!r} is not a member of a structure")
                f = t.member(n)
                if f is None:
                    return None
                parent, parent_at = t, offset
                offset += f.offset
                t = f.type
                continue
            if n < 0:
                raise FilterError(f"{text}: negative index {n}")
            if isinstance(t, ArrayType):
                if n >= t.length:
                    # Out of range, known now: the path is always missing.
                    steps.append((P_ELEM, n, t.element.fixed_size, 0))
                    static = False
                offset += n * t.element.fixed_size
                t = t.element
            elif isinstance(t, SequenceType):
                stride = t.element.fixed_size
                if t.storage == "data_loc":
                    if offset:
                        steps.append((P_ADD, offset, 0, 0))
                    steps.append((P_DATA_LOC, 0, 0, 0))
                else:
                    if t.length_field is None or parent is None:
                        raise FilterError(f"{text}: sequence without a length field")
                    lf = parent.member(t.length_field)
                    if lf is None or not isinstance(lf.type, IntType):
                        raise FilterError(
                            f"{text}: length field {t.length_field!r} is not an integer"
                        )
                    if offset:
                        steps.append((P_ADD, offset, 0, 0))
                    rel = parent_at + lf.offset - offset
                    size = -lf.type.size if lf.type.signed else lf.type.size
                    steps.append((P_COUNT, rel, size, stride))
                    steps.append((P_DEREF, 0, 0, 0))
                steps.append((P_ELEM, n, stride, 0))
                offset = 0
                static = False
                t = t.element
            else:
                raise FilterError(f"{text}: only arrays and sequences can be indexed")
        if offset:
            steps.append((P_ADD, offset, 0, 0))
        if isinstance(t, IntType):
            leaf = dict(leaf="int", size=t.size, signed=t.signed)
        elif isinstance(t, FloatType):
            leaf = dict(leaf="float", size=t.size)
        elif isinstance(t, StringType):
            leaf = dict(leaf="string", size=t.fixed_size, storage=t.storage, capacity=t.capacity)
        else:
            raise FilterError(f"{text}: a structure, array or sequence is not a value")
        return FieldPath(
            text,
            self.root,
            steps=tuple(steps),
            static_offset=(offset if static else None),
            **leaf,  # type: ignore[arg-type]
        )


#: The context fields LTTng offers as ``$ctx.NAME`` (the caller supplies the
#: values in a record of this layout).
DEFAULT_CONTEXT = Schema.declare(
    "context",
    [
        ("procname", "char[16]"),
        ("pid", "s64"),
        ("tid", "s64"),
        ("vpid", "s64"),
        ("vtid", "s64"),
        ("ppid", "s64"),
        ("vppid", "s64"),
        ("uid", "s64"),
        ("gid", "s64"),
        ("cpu_id", "s64"),
        ("prio", "s64"),
        ("nice", "s64"),
        ("preemptible", "s64"),
        ("need_reschedule", "s64"),
        ("hostname", "char[64]"),
    ],
    root=ROOT_CONTEXT,
)
