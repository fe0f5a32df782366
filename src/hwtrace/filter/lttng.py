"""The LTTng tier: a checked filter tree compiled to LTTng-2.x-style bytecode,
run by the interpreter in :mod:`.lttng_vm` (the baseline of Sharma and
Dagenais, "Enhanced Userspace and In-Kernel Trace Filtering for Production
Systems", JCST 2016).

Code generation is a post-order walk, as LTTng's: operands first, then the
typed op (LTTng's client emits generic ops and a specialisation pass in the
tracer makes them typed; here the checker has already typed the tree, so
the ops are typed from the start).  Field references are linked as they are
emitted: a field at a constant offset in the event (or context) record
gets an inline-offset load (``LOAD_FIELD_REF_*``, ``GET_CONTEXT_REF_*``);
any other path (pointers, data_loc, sequences) goes into the program's
linked field table and is loaded by index (``LOAD_FIELD_*``), walking the
path at run time.  ``&&``/``||`` carry a 16-bit absolute skip offset.

Opcodes and operand layouts are defined in :mod:`.lttng_vm`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import ast
from . import lttng_vm as vm
from .errors import FilterError
from .schema import DEFAULT_CONTEXT, ROOT_CONTEXT, ROOT_EVENT, Schema

MAX_BYTECODE = 0xFFFF  # skip offsets are 16-bit and absolute

_CMP_INDEX = {"==": 0, "!=": 1, ">": 2, "<": 3, ">=": 4, "<=": 5}
_CMP_BASE = {
    ("s64", "s64"): vm.EQ_S64,
    ("double", "double"): vm.EQ_DOUBLE,
    ("double", "s64"): vm.EQ_DOUBLE_S64,
    ("s64", "double"): vm.EQ_S64_DOUBLE,
}
_BITWISE = {
    "&": vm.BIT_AND,
    "|": vm.BIT_OR,
    "^": vm.BIT_XOR,
    "<<": vm.BIT_LSHIFT,
    ">>": vm.BIT_RSHIFT,
}
_STORAGE = {"ptr": vm.STORE_PTR, "inline": vm.STORE_INLINE, "data_loc": vm.STORE_DATA_LOC}
_STORAGE_NAME = {v: k for k, v in _STORAGE.items()}
_VALUE_TYPE = {"s64": 0, "double": 1, "string": 2}
_PUSHES = (
    vm.LOAD_S64, vm.LOAD_DOUBLE, vm.LOAD_STRING, vm.LOAD_STAR_GLOB_STRING,
    vm.LOAD_FIELD_REF_S64, vm.LOAD_FIELD_REF_DOUBLE, vm.LOAD_FIELD_REF_STRING,
    vm.GET_CONTEXT_REF_S64, vm.GET_CONTEXT_REF_DOUBLE, vm.GET_CONTEXT_REF_STRING,
    vm.LOAD_FIELD_S64, vm.LOAD_FIELD_DOUBLE, vm.LOAD_FIELD_STRING, vm.LOAD_FIELD_UNLINKED,
)  # fmt: skip
_POPS = (vm.AND, vm.OR, vm.EQ_STRING, vm.NE_STRING, vm.EQ_STAR_GLOB_STRING,
         vm.NE_STAR_GLOB_STRING, *_BITWISE.values(), *range(vm.EQ_S64, vm.LE_S64_DOUBLE + 1))  # fmt: skip
_CONTEXT_LOADS = {vm.GET_CONTEXT_REF_S64, vm.GET_CONTEXT_REF_DOUBLE, vm.GET_CONTEXT_REF_STRING}
_EVENT_LOADS = {vm.LOAD_FIELD_REF_S64, vm.LOAD_FIELD_REF_DOUBLE, vm.LOAD_FIELD_REF_STRING}
# Fall-through stack effect of each op (AND/OR pop their left operand).
_DEPTH_CHANGE = {**{op: 1 for op in _PUSHES}, **{op: -1 for op in _POPS}}


class LttngProgram:
    """Validated, linked LTTng-style bytecode and the tables it uses.

    ``bytecode``: the instructions; ``literals``: the literal pool (exact
    strings as they are, glob patterns with ``*`` wildcards and ``\\*``,
    ``\\\\`` escapes), indexed by ``LOAD_STRING``/``LOAD_STAR_GLOB_STRING``;
    ``fields``: the linked field table indexed by ``LOAD_FIELD_*`` (None for
    a reference linking could not resolve).  Construction validates the
    bytecode as the interpreter will run it (:class:`FilterError` naming
    the instruction otherwise).
    """

    def __init__(
        self,
        bytecode: bytes,
        literals: Sequence[bytes] = (),
        fields: Sequence[Any] = (),
        *,
        notes: dict[int, str] | None = None,
    ) -> None:
        self.bytecode = bytes(bytecode)
        self.literals = tuple(bytes(s) for s in literals)
        self.fields = tuple(fields)
        self._notes = dict(notes or {})  # pc -> field text, for the disassembly
        if len(self.bytecode) > MAX_BYTECODE:
            raise FilterError(
                f"bytecode of {len(self.bytecode)} bytes exceeds the LTTng tier's "
                f"{MAX_BYTECODE} (16-bit skip offsets)"
            )
        if len(self.literals) > 0xFFFF or len(self.fields) > 0xFFFF:
            raise FilterError("more than 65535 literals or fields (16-bit indices)")

        self._code = np.frombuffer(self.bytecode, np.uint8).copy()
        # Literal pool: each literal NUL-terminated; the table holds
        # (address, length) pairs.
        pool = b"".join(s + b"\0" for s in self.literals)
        self._pool = np.frombuffer(pool or b"\0", np.uint8).copy()
        table = []
        at = 0
        for s in self.literals:
            table += [self._pool.ctypes.data + at, len(s)]
            at += len(s) + 1
        self._literal_table = np.array(table or [0, 0], np.int64)
        # Linked field table: addresses of the path codes (0: unlinked).
        codes = [f.code for f in self.fields if f is not None]
        self._path_codes = np.concatenate(codes) if codes else np.zeros(1, np.int64)
        entries, kinds, at = [], [], 0
        for f in self.fields:
            if f is None:
                entries.append(0)
                kinds.append(vm.KIND_UNLINKED)
                continue
            entries.append(self._path_codes.ctypes.data + 8 * at)
            kinds.append(int(f.code[1]))
            at += len(f.code)
        self._field_table = np.array(entries or [0], np.int64)
        self._field_kinds = np.array(kinds, np.int64)

        result = vm.validate(self._code, len(self.literals), self._field_kinds)
        error, index, pc, detail, depth = (int(x) for x in result)
        if error:
            text = vm.ERROR_TEXT[error].format(detail=detail)
            raise FilterError(f"at byte {pc}: {text}", where=f"insn {index}")
        self.stack_depth = depth
        # Which records the program reads (a Python call refuses a null one).
        ops = {op for _, op, _ in self.instructions()}
        roots = {int(f.code[0]) for f in self.fields if f is not None}
        self.reads_context = bool(ops & _CONTEXT_LOADS) or ROOT_CONTEXT in roots
        self.reads_event = bool(ops & _EVENT_LOADS) or ROOT_EVENT in roots

        self._descriptor = np.zeros(vm.DESC_WORDS, np.int64)
        self._descriptor[vm.DESC_CODE] = self._code.ctypes.data
        self._descriptor[vm.DESC_CODE_LEN] = len(self._code)
        self._descriptor[vm.DESC_LITERALS] = self._literal_table.ctypes.data
        self._descriptor[vm.DESC_N_LITERALS] = len(self.literals)
        self._descriptor[vm.DESC_FIELDS] = self._field_table.ctypes.data
        self._descriptor[vm.DESC_N_FIELDS] = len(self.fields)

    # -- running -------------------------------------------------------------------

    @property
    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(bytecode, literal table, field table)`` for :func:`.lttng_vm.run`
        in numba code."""
        return self._code, self._literal_table, self._field_table

    def __call__(self, event: Any, context: Any = 0) -> bool:
        """The verdict on the records at ``event`` and ``context`` (addresses,
        numpy arrays, or objects with an ``address``)."""
        return bool(vm.run(*self.arrays, *self._records(event, context)))

    def trace(self, event: Any, context: Any = 0) -> tuple[bool, list[int]]:
        """The verdict and the pcs of the instructions executed (debugging:
        shows where short-circuits and missing data stopped evaluation)."""
        buf = np.zeros(1 + len(self._code), np.int64)  # no insn runs twice
        verdict = vm.run_traced(*self.arrays, *self._records(event, context), buf)
        return bool(verdict), [int(x) for x in buf[1 : 1 + buf[0]]]

    def _records(self, event: Any, context: Any) -> tuple[int, int]:
        ev, ctx = _address(event), _address(context)
        for name, address, used in (("an event", ev, self.reads_event),
                                    ("a context", ctx, self.reads_context)):  # fmt: skip
            if used and address == 0:
                raise ValueError(f"this filter reads {name} record: its address is 0")
        return ev, ctx

    @property
    def program_address(self) -> int:
        """The descriptor :data:`run_address` takes as its first argument
        (valid while this object lives)."""
        return int(self._descriptor.ctypes.data)

    @property
    def run_address(self) -> int:
        """``int64 run(const void *program, const void *event, const void *context)``."""
        return vm.run_address()

    @property
    def memory_bytes(self) -> int:
        """Bytes the program occupies: bytecode, literal pool and table,
        field table and path codes, descriptor."""
        used = [self._code, self._pool, self._literal_table, self._descriptor]
        if self.fields:
            used += [self._field_table, self._path_codes]
        return sum(a.nbytes for a in used)

    # -- reading ---------------------------------------------------------------------

    def instructions(self) -> list[tuple[int, int, bytes]]:
        """``(pc, opcode, operand bytes)`` of each instruction."""
        out, pc = [], 0
        while pc < len(self.bytecode):
            op = self.bytecode[pc]
            size = int(vm.INSN_SIZE[op])
            out.append((pc, op, self.bytecode[pc + 1 : pc + size]))
            pc += size
        return out

    def disassemble(self) -> list[str]:
        """One line per instruction: byte offset, LTTng's op name, operands."""
        lines = []
        for pc, op, raw in self.instructions():
            name = vm.OP_NAMES[op]
            arg = ""
            if op in (vm.AND, vm.OR):
                arg = f"skip {_u16(raw)}"
            elif op in (vm.LOAD_S64,):
                arg = str(struct.unpack("<q", raw)[0])
            elif op in (vm.LOAD_DOUBLE,):
                arg = repr(struct.unpack("<d", raw)[0])
            elif op in (vm.LOAD_STRING, vm.LOAD_STAR_GLOB_STRING):
                k = _u16(raw)
                arg = f"literal {k} {self.literals[k].decode('latin-1')!r}"
            elif op in (vm.LOAD_FIELD_REF_S64, vm.GET_CONTEXT_REF_S64):
                sign = "s" if raw[2] & vm.SIGNED_FLAG else "u"
                arg = f"offset {_u16(raw)} {sign}{8 * (raw[2] & 0x7F)}"
            elif op in (vm.LOAD_FIELD_REF_DOUBLE, vm.GET_CONTEXT_REF_DOUBLE):
                arg = f"offset {_u16(raw)} f{8 * raw[2]}"
            elif op in (vm.LOAD_FIELD_REF_STRING, vm.GET_CONTEXT_REF_STRING):
                storage = _STORAGE_NAME[raw[2]]
                cap = f"[{_u16(raw[3:])}]" if raw[2] == vm.STORE_INLINE else ""
                arg = f"offset {_u16(raw)} {storage}{cap}"
            elif op in (vm.LOAD_FIELD_S64, vm.LOAD_FIELD_DOUBLE, vm.LOAD_FIELD_STRING):
                k = _u16(raw)
                arg = f"field {k} {self.fields[k].text}"
            elif op == vm.LOAD_FIELD_UNLINKED:
                arg = f"field {_u16(raw)}"
            note = self._notes.get(pc)
            text = f"{pc:5d}  {name:<24}{arg}"
            lines.append(f"{text:<60}; {note}" if note else text.rstrip())
        return lines

    def __repr__(self) -> str:
        return (
            f"LttngProgram({len(self.bytecode)} bytes, {len(self.literals)} literals, "
            f"{len(self.fields)} fields)"
        )


def _u16(raw: bytes) -> int:
    return raw[0] | (raw[1] << 8)


def _address(x: Any) -> int:
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, np.ndarray):
        return int(x.ctypes.data)
    address = getattr(x, "address", None)
    if address is not None:
        return int(address)
    raise TypeError(f"expected a record address, got {type(x).__name__}")


# -- code generation -------------------------------------------------------------------


class _Generator:
    def __init__(self) -> None:
        self.code = bytearray()
        self.literals: list[bytes] = []
        self.literal_index: dict[tuple[str, bytes], int] = {}
        self.fields: list[Any] = []
        self.field_index: dict[Any, int] = {}
        self.notes: dict[int, str] = {}
        self.skips: list[int] = []  # where the AND/OR instructions are
        self.depth = 0
        self.column = 0

    def op(self, opcode: int, operands: bytes = b"") -> int:
        at = len(self.code)
        # Track the stack depth the interpreter will need, to refuse a tree
        # too deep for it at the node that overflows (not at an insn index).
        self.depth += _DEPTH_CHANGE.get(opcode, 0)
        if self.depth > vm.STACK_SLOTS:
            raise FilterError(
                f"expression needs more than the LTTng interpreter's {vm.STACK_SLOTS} "
                "stack entries (too many pending operands)",
                column=self.column,
            )
        self.code.append(opcode)
        self.code += operands
        return at

    def literal(self, kind: str, data: bytes) -> int:
        key = (kind, data)
        if key not in self.literal_index:
            self.literal_index[key] = len(self.literals)
            self.literals.append(data)
        return self.literal_index[key]

    def field(self, key: Any, path: Any) -> int:
        if key not in self.field_index:
            self.field_index[key] = len(self.fields)
            self.fields.append(path)
        return self.field_index[key]

    # Returns the kind of value left on the stack: "s64", "double", "string",
    # "literal" (an exact string literal) or "glob" (a pattern literal).
    def emit(self, node: ast.Node) -> str:
        self.column = node.column
        if isinstance(node, ast.IntLit):
            if not -(1 << 63) <= node.value < 1 << 63:
                raise FilterError("integer literal outside s64", column=node.column)
            self.op(vm.LOAD_S64, struct.pack("<q", node.value))
            return "s64"
        if isinstance(node, ast.FloatLit):
            self.op(vm.LOAD_DOUBLE, struct.pack("<d", node.value))
            return "double"
        if isinstance(node, ast.StrLit):
            if node.is_glob:
                pattern = b"*".join(
                    p.replace(b"\\", b"\\\\").replace(b"*", b"\\*") for p in node.parts
                )
                self.op(vm.LOAD_STAR_GLOB_STRING, struct.pack("<H", self.literal("glob", pattern)))
                return "glob"
            self.op(vm.LOAD_STRING, struct.pack("<H", self.literal("exact", node.parts[0])))
            return "literal"
        if isinstance(node, ast.FieldRef):
            return self.field_ref(node)
        if isinstance(node, ast.Unary):
            return self.unary(node)
        if isinstance(node, ast.Logical):
            return self.logical(node)
        if isinstance(node, ast.Binary):
            return self.binary(node)
        raise FilterError(f"cannot compile a {type(node).__name__} node", column=node.column)

    def field_ref(self, node: ast.FieldRef) -> str:
        path = node.path
        vtype = _type_of(node)
        if path is None:
            # LTTng's lenient mode: the field is missing from this schema;
            # evaluating the reference makes the whole filter false.
            k = self.field(("unlinked", node.text), None)
            self.notes[len(self.code)] = node.text
            self.op(vm.LOAD_FIELD_UNLINKED, struct.pack("<HB", k, _VALUE_TYPE[vtype]))
            return vtype
        ctx = path.root == ROOT_CONTEXT
        off = path.static_offset
        leaf = path.leaf
        at = len(self.code)
        if off is not None and off <= 0xFFFF and path.capacity <= 0xFFFF:
            if leaf == "int":
                sz = path.size | (vm.SIGNED_FLAG if path.signed else 0)
                opcode = vm.GET_CONTEXT_REF_S64 if ctx else vm.LOAD_FIELD_REF_S64
                self.op(opcode, struct.pack("<HB", off, sz))
            elif leaf == "float":
                opcode = vm.GET_CONTEXT_REF_DOUBLE if ctx else vm.LOAD_FIELD_REF_DOUBLE
                self.op(opcode, struct.pack("<HB", off, path.size))
            else:
                opcode = vm.GET_CONTEXT_REF_STRING if ctx else vm.LOAD_FIELD_REF_STRING
                self.op(opcode, struct.pack("<HBH", off, _STORAGE[path.storage], path.capacity))
        else:
            k = self.field(path, path)
            opcode = {
                "int": vm.LOAD_FIELD_S64,
                "float": vm.LOAD_FIELD_DOUBLE,
                "string": vm.LOAD_FIELD_STRING,
            }[leaf]
            self.op(opcode, struct.pack("<H", k))
        self.notes[at] = node.text
        return {"int": "s64", "float": "double", "string": "string"}[leaf]

    def unary(self, node: ast.Unary) -> str:
        kind = self.emit(node.operand)
        if kind not in ("s64", "double") or (node.op == "~" and kind != "s64"):
            raise FilterError(f"'{node.op}' needs a number", column=node.column)
        if node.op == "~":
            self.op(vm.UNARY_BIT_NOT)
            return "s64"
        table = {
            ("!", "s64"): vm.UNARY_NOT_S64,
            ("!", "double"): vm.UNARY_NOT_DOUBLE,
            ("-", "s64"): vm.UNARY_MINUS_S64,
            ("-", "double"): vm.UNARY_MINUS_DOUBLE,
            ("+", "s64"): vm.UNARY_PLUS_S64,
            ("+", "double"): vm.UNARY_PLUS_DOUBLE,
        }
        self.op(table[node.op, kind])
        return "s64" if node.op == "!" else kind

    def binary(self, node: ast.Binary) -> str:
        left = self.emit(node.left)
        right = self.emit(node.right)
        if node.op in _BITWISE:
            if left != "s64" or right != "s64":
                raise FilterError(f"'{node.op}' needs integers", column=node.column)
            self.op(_BITWISE[node.op])
            return "s64"
        strings = ("string", "literal", "glob")
        if left in strings or right in strings:
            if left not in strings or right not in strings or node.op not in ("==", "!="):
                raise FilterError(f"'{node.op}' cannot compare these operands", column=node.column)
            if "glob" in (left, right):
                if left == right:
                    raise FilterError("two glob patterns cannot be compared", column=node.column)
                eq = node.op == "=="
                self.op(vm.EQ_STAR_GLOB_STRING if eq else vm.NE_STAR_GLOB_STRING)
            else:
                self.op(vm.EQ_STRING if node.op == "==" else vm.NE_STRING)
            return "s64"
        self.op(_CMP_BASE[left, right] + _CMP_INDEX[node.op])
        return "s64"

    def truth(self, kind: str, node: ast.Node, *, normalise: bool) -> None:
        """Make the value a logical operand: doubles become s64 0/1 (``!!x``);
        with ``normalise``, s64 values that may be other than 0/1 too."""
        if kind == "double":
            self.op(vm.UNARY_NOT_DOUBLE)
            self.op(vm.UNARY_NOT_S64)
        elif kind != "s64":
            raise FilterError("a string is not a truth value", column=node.column)
        elif normalise and not _is_boolean(node):
            self.op(vm.UNARY_NOT_S64)
            self.op(vm.UNARY_NOT_S64)

    def logical(self, node: ast.Logical) -> str:
        # AND: ax == 0 jumps to the skip offset leaving 0; OR: ax != 0 jumps
        # leaving 1; otherwise the left value is popped and the right one,
        # made 0/1, is the result.
        self.truth(self.emit(node.left), node.left, normalise=False)
        at = self.op(vm.AND if node.op == "&&" else vm.OR, b"\0\0")
        self.skips.append(at)
        self.truth(self.emit(node.right), node.right, normalise=True)
        target = len(self.code)
        if target > MAX_BYTECODE:
            raise FilterError(
                "filter too large for the LTTng tier (skip offset past 65535)",
                column=node.column,
            )
        self.code[at + 1 : at + 3] = struct.pack("<H", target)
        return "s64"


def _type_of(node: ast.Node) -> str:
    if node.type is None:
        raise FilterError("the filter was not type-checked", column=node.column)
    return node.type


def _is_boolean(node: ast.Node) -> bool:
    """Values that are always 0 or 1."""
    if isinstance(node, ast.Logical):
        return True
    if isinstance(node, ast.Binary):
        return node.op in ast.COMPARISON_OPS
    if isinstance(node, ast.Unary):
        return node.op == "!"
    if isinstance(node, ast.IntLit):
        return node.value in (0, 1)
    return False


def generate(tree: ast.Node) -> LttngProgram:
    """Bytecode for a checked tree (every node typed, references linked)."""
    for node in ast.walk(tree):
        _type_of(node)
    g = _Generator()
    kind = g.emit(tree)
    if kind not in ("s64", "double"):
        raise FilterError("a filter must be a number or a condition", column=tree.column)
    g.truth(kind, tree, normalise=False)
    g.op(vm.RETURN)
    _thread_skips(g.code, g.skips)
    return LttngProgram(bytes(g.code), g.literals, g.fields, notes=g.notes)


def _thread_skips(code: bytearray, skips: list[int]) -> None:
    """Point each AND (OR) whose skip lands on another AND (OR) at that
    one's target: the value it leaves (0, or 1) makes the second jump
    too.  A false left operand of a chain of ``&&`` then jumps once to
    the end instead of through every later AND."""
    for at in reversed(skips):  # later skips are final before earlier ones use them
        target = code[at + 1] | code[at + 2] << 8
        if code[target] == code[at]:
            code[at + 1 : at + 3] = code[target + 1 : target + 3]


def compile_lttng(
    text: str,
    event_schema: Schema,
    context_schema: Schema = DEFAULT_CONTEXT,
    **options: Any,
) -> LttngProgram:
    """Parse, check and compile filter ``text`` for events of
    ``event_schema`` (``options`` go to the checker, e.g. ``unknown="false"``)."""
    from .check import compile_check

    tree = compile_check(text, event_schema, context_schema, **options)
    try:
        return generate(tree)
    except FilterError as e:
        if e.column is not None and e.expression is None:
            e.expression = text
        raise


__all__ = ["LttngProgram", "compile_lttng", "generate"]
