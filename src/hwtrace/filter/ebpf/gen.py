"""eBPF from a checked filter expression.

The shape is Fig. 6 of Sharma and Dagenais ("Enhanced Userspace and In-Kernel
Trace Filtering for Production Systems", JCST 2016): each predicate a load, a compare and a
conditional jump; ``&&`` and ``||`` are jumps past what they skip.  Code is
generated for control flow first (:meth:`_Gen.cond` jumps to a true or a
false label), values only where a number is needed (operands of bitwise
operators and of comparisons), so an AND chain of N predicates is N
compare-and-jumps to one shared false exit.

Registers: R6 and R7 keep the event and context pointers across helper
calls (which clobber R1-R5); R0 carries values; a binary operation's left
value waits in R8, R9, then stack slots, by nesting depth.  Strings never
sit in registers: the string helpers take the field's path and the
literal's place in rodata.  Missing data and out-of-range shift counts jump
to ``abort``, which returns 0 for the whole expression (LTTng's rule), so
no enclosing ``!`` or ``||`` can turn it true.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from .. import abi, ast
from ..errors import FilterError
from ..schema import DEFAULT_CONTEXT, ROOT_CONTEXT, FieldPath, Schema
from . import isa
from .isa import R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, R10
from .program import Program

_SIGNED_JUMP = {
    "<": isa.JSLT,
    "<=": isa.JSLE,
    ">": isa.JSGT,
    ">=": isa.JSGE,
    "==": isa.JEQ,
    "!=": isa.JNE,
}
_INVERSE = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_SWAP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_DOUBLE_OP = {
    "==": abi.DOUBLE_EQ, "!=": abi.DOUBLE_NE, "<": abi.DOUBLE_LT,
    "<=": abi.DOUBLE_LE, ">": abi.DOUBLE_GT, ">=": abi.DOUBLE_GE,
}  # fmt: skip
_BITWISE = {"&": isa.AND, "|": isa.OR, "^": isa.XOR, "<<": isa.LSH, ">>": isa.RSH}
_SIZE = {1: isa.B, 2: isa.H, 4: isa.W, 8: isa.DW}
_TEMPS = (R8, R9)
_OFF_MIN, _OFF_MAX = -(1 << 15), (1 << 15) - 1  # a jump's signed 16-bit ``off``
# Slots between hop islands: half the reach, so the nearest island is
# always reachable, with room for the islands themselves.
_ISLAND_STRIDE = 1 << 14


_INVERT = {
    isa.JEQ: isa.JNE, isa.JNE: isa.JEQ, isa.JGT: isa.JLE, isa.JLE: isa.JGT,
    isa.JGE: isa.JLT, isa.JLT: isa.JGE, isa.JSGT: isa.JSLE, isa.JSLE: isa.JSGT,
    isa.JSGE: isa.JSLT, isa.JSLT: isa.JSGE,
}  # fmt: skip


def _is_jump(item) -> bool:
    return isinstance(item, tuple) and len(item) == 5 and isinstance(item[0], _Label)


def _fits_imm32(v: int) -> bool:
    return -(1 << 31) <= v < (1 << 31)


@dataclass
class _Label:
    name: str
    at: int | None = None


@dataclass
class _Gen:
    paths: list[FieldPath] = field(default_factory=list)
    rodata: bytearray = field(default_factory=bytearray)
    code: list = field(default_factory=list)  # insns, or (label, jump insn builder)
    strings: dict[bytes, int] = field(default_factory=dict)
    stack_slots: int = 0
    _labels: list = field(default_factory=list)

    # -- emission --------------------------------------------------------------------

    def emit(self, *insns) -> None:
        for i in insns:
            if isinstance(i, list):
                self.code.extend(i)
            else:
                self.code.append(i)

    def jump(
        self,
        label: _Label,
        op: int = isa.JA,
        dst: int = 0,
        src_or_imm: int = 0,
        *,
        reg: bool = False,
    ) -> None:
        self.code.append((label, op, dst, src_or_imm, reg))

    def place(self, label: _Label) -> None:
        label.at = len(self.code)

    def label(self, name: str) -> _Label:
        lab = _Label(name)
        self._labels.append(lab)
        return lab

    def path_index(self, path: FieldPath) -> int:
        for k, p in enumerate(self.paths):
            if p is path or (p.code.shape == path.code.shape and (p.code == path.code).all()):
                return k
        self.paths.append(path)
        return len(self.paths) - 1

    def literal(self, data: bytes) -> int:
        at = self.strings.get(data)
        if at is None:
            at = self.strings[data] = len(self.rodata)
            self.rodata += data + b"\0"
        return at

    def peephole(self) -> None:
        """``jCC L1; ja L2; L1:`` becomes ``jNCC L2; L1:``, and a ``ja`` to
        the next instruction goes: fewer dispatches for the interpreter.
        Each pass rewrites every match (positions move only when the pass
        compacts), so a program of N terms takes a few passes, not N."""
        while True:
            targeted = {lab.at for lab in self._labels}
            n = len(self.code)
            keep: list[bool] = [True] * n
            changed = False
            k = 0
            while k < n:
                item = self.code[k]
                if _is_jump(item):
                    label, op = item[0], item[1]
                    if op == isa.JA and label.at == k + 1:
                        keep[k] = False
                        changed = True
                    elif (
                        op in _INVERT
                        and k + 1 < n
                        and _is_jump(self.code[k + 1])
                        and self.code[k + 1][1] == isa.JA
                        and label.at == k + 2
                        and k + 1 not in targeted
                    ):
                        other = self.code[k + 1][0]
                        self.code[k] = (other, _INVERT[op], item[2], item[3], item[4])
                        keep[k + 1] = False
                        changed = True
                        k += 2
                        continue
                k += 1
            if not changed:
                return
            self._compact(keep)

    def _compact(self, keep: list[bool]) -> None:
        new_pos = []
        n = 0
        for k in range(len(self.code)):
            new_pos.append(n)
            n += keep[k]
        new_pos.append(n)
        for lab in self._labels:
            lab.at = new_pos[lab.at]
        self.code = [c for c, k in zip(self.code, keep, strict=True) if k]

    def _slots(self) -> list[int]:
        """Each code position's slot index (ld_imm64 takes two), and the end."""
        index = [0] * (len(self.code) + 1)
        n = 0
        for k, item in enumerate(self.code):
            index[k] = n
            n += 2 if isinstance(item, list) else 1
        index[-1] = n
        return index

    def _far_jumps(self, index: list[int]) -> list[int]:
        out = []
        for k, item in enumerate(self.code):
            if _is_jump(item):
                off = index[item[0].at] - (index[k] + 1)
                if not _OFF_MIN <= off <= _OFF_MAX:
                    out.append(k)
        return out

    def lower(self) -> None:
        """A back end's last change before jumps are resolved (none here)."""

    def relax(self) -> None:
        """Keep every jump within eBPF's signed 16-bit ``off``: a jump
        farther than that goes to a hop (``ja`` to its target) in an island
        at the next multiple of :data:`_ISLAND_STRIDE` slots, which control
        flow steps over (``ja`` past the island); a hop still too far from
        its target goes through the next island, and so on.  Portable to
        every kernel (``gotol`` needs v4 of the instruction set).  The
        generated code only jumps forward."""
        hops: dict[tuple[int, int], _Label] = {}  # (island's grid slot, target) -> hop
        while True:
            index = self._slots()
            far = self._far_jumps(index)
            if not far:
                return
            wanted: dict[int, list[tuple[int, _Label]]] = {}
            for k in far:
                label = self.code[k][0]
                if index[label.at] <= index[k]:
                    raise AssertionError("a backward jump beyond eBPF's 16-bit reach")
                # The island sits at the first slot at or after the grid, so
                # a hop in it looks for the next island, one stride on.
                grid = (index[k] // _ISLAND_STRIDE + 1) * _ISLAND_STRIDE
                key = (grid, id(label))
                hop = hops.get(key)
                if hop is None:
                    hop = hops[key] = self.label(f"hop-{label.name}")
                    wanted.setdefault(grid, []).append((k, label))
                self.code[k] = (hop, *self.code[k][1:])
            inserts: dict[int, list] = {}
            for grid, users in wanted.items():
                over = self.label("island-end")
                items: list = [((over, isa.JA, 0, 0, False), users[0][0])]
                for k, label in users:
                    items.append(((hops[(grid, id(label))], "place"), k))
                    items.append(((label, isa.JA, 0, 0, False), k))
                items.append(((over, "place"), users[0][0]))
                inserts.setdefault(bisect.bisect_left(index, grid), []).extend(items)
            self._splice(inserts)

    def _splice(self, inserts: dict[int, list]) -> None:
        """Insert, before code position p, ``inserts[p]``: (item, source
        position) pairs, where an item is an instruction or jump, or
        (label, "place") to place a label there.  ``_spliced_from`` then
        gives each new position's source position."""
        code: list = []
        new_pos = [0] * (len(self.code) + 1)
        placed: list[tuple[_Label, int]] = []
        self._spliced_from: list[int] = []
        for k in range(len(self.code) + 1):
            for item, src in inserts.get(k, ()):
                if len(item) == 2 and item[1] == "place":
                    placed.append((item[0], len(code)))
                    continue
                code.append(item)
                self._spliced_from.append(src)
            new_pos[k] = len(code)
            if k < len(self.code):
                code.append(self.code[k])
                self._spliced_from.append(k)
        placing = {id(lab) for lab, _ in placed}
        for lab in self._labels:
            if id(lab) not in placing and lab.at is not None:
                lab.at = new_pos[lab.at]
        for lab, at in placed:
            lab.at = at
        self.code = code

    def finish(self) -> list:
        """Resolve labels: every slot gets its final index (ld_imm64 is two)."""
        self.peephole()
        self.lower()
        self.relax()
        out: list = []
        index: list[int] = []  # code position -> slot index
        for item in self.code:
            index.append(len(out))
            out.append(item)
        index.append(len(out))
        slots = []
        for pos, item in enumerate(out):
            if isinstance(item, tuple) and len(item) == 5 and isinstance(item[0], _Label):
                label, op, dst, x, reg = item
                assert label.at is not None, label.name
                off = index[label.at] - (index[pos] + 1)
                if op == isa.JA:
                    slots.append(isa.ja(off))
                else:
                    slots.append(isa.jmp(op, dst, x, off, reg=reg))
            else:
                slots.append(item)
        return slots

    # -- conditions ------------------------------------------------------------------

    def cond(self, n: ast.Node, t: _Label, f: _Label, abort: _Label, depth: int = 0) -> None:
        """Jump to ``t`` when ``n`` is true (nonzero), else to ``f``."""
        if isinstance(n, ast.Logical):
            mid = self.label("mid")
            if n.op == "&&":
                self.cond(n.left, mid, f, abort, depth)
            else:
                self.cond(n.left, t, mid, abort, depth)
            self.place(mid)
            self.cond(n.right, t, f, abort, depth)
            return
        if isinstance(n, ast.Unary) and n.op == "!":
            self.cond(n.operand, f, t, abort, depth)
            return
        if isinstance(n, ast.Binary) and n.op in ast.COMPARISON_OPS:
            self.compare(n, t, f, abort, depth)
            return
        if isinstance(n, ast.IntLit):
            self.jump(t if n.value else f)
            return
        if isinstance(n, ast.FloatLit):
            self.jump(t if n.value != 0 else f)
            return
        self.value(n, abort, depth)
        if n.type == "double":
            # Nonzero, NaN included: any bit but the sign's.
            self.emit(isa.alu64(isa.LSH, R0, 1, reg=False))
        self.jump(t, isa.JNE, R0, 0)
        self.jump(f)

    def compare(self, n: ast.Binary, t: _Label, f: _Label, abort: _Label, depth: int) -> None:
        a, b, op = n.left, n.right, n.op
        if a.type == "string":
            # R0 is 1 (equal), 0 (not) or -1 (missing: abort).  Where one
            # outcome's label is the abort exit itself, missing joins it.
            yes, no = (t, f) if op == "==" else (f, t)
            if no is abort:
                self.strings_equal(a, b, None)
                self.jump(yes, isa.JEQ, R0, 1)
                self.jump(no)
            elif yes is abort:
                self.strings_equal(a, b, None)
                self.jump(no, isa.JEQ, R0, 0)
                self.jump(yes)
            else:
                self.strings_equal(a, b, abort)
                self.jump(yes, isa.JEQ, R0, 1)
                self.jump(no)
            return
        if a.type == "double" or b.type == "double":
            self.value(a, abort, depth, double=True)
            self.hold(depth)
            self.value(b, abort, depth + 1, double=True)
            self.emit(isa.mov(R2, R0), self.fetch(depth, R1), isa.mov_imm(R3, _DOUBLE_OP[op]))
            self.emit(isa.call(abi.HELPER_DOUBLE_CMP))
            self.jump(t, isa.JNE, R0, 0)
            self.jump(f)
            return
        if isinstance(a, ast.IntLit) and not isinstance(b, ast.IntLit):
            a, b, op = b, a, _SWAP[op]
        if isinstance(b, ast.IntLit):
            self.value(a, abort, depth)
            self.jump_if(t, _SIGNED_JUMP[op], b.value)
            self.jump(f)
            return
        self.value(a, abort, depth)
        self.hold(depth)
        self.value(b, abort, depth + 1)
        self.emit(self.fetch(depth, R1))
        self.jump(t, _SIGNED_JUMP[op], R1, R0, reg=True)
        self.jump(f)

    def jump_if(self, label: _Label, op: int, value: int) -> None:
        """Jump to ``label`` when R0 ``op`` the 64-bit ``value`` (an s64)."""
        if _fits_imm32(value):
            self.jump(label, op, R0, value)
        else:
            self.emit(isa.ld_imm64(R1, value))
            self.jump(label, op, R0, R1, reg=True)

    def strings_equal(self, a: ast.Node, b: ast.Node, abort: _Label | None) -> None:
        """R0 = 1 when the two strings are equal (or the pattern matches), 0
        when not, -1 when one is missing (then a jump to ``abort`` unless the
        caller handles it: ``abort`` None)."""
        if isinstance(a, ast.StrLit):
            a, b = b, a
        if isinstance(a, ast.StrLit):  # two literals: the checker folds these
            raise FilterError(
                "internal: unfolded comparison of two string literals", column=a.column
            )
        assert isinstance(a, ast.FieldRef)
        if a.path is None or (isinstance(b, ast.FieldRef) and b.path is None):
            # A field the schema lacks: evaluating it aborts.
            self.emit(isa.mov_imm(R0, -1))
            if abort is not None:
                self.jump(abort)
            return
        self.setup_call(a)
        if isinstance(b, ast.StrLit):
            if b.is_glob:
                text = b"*".join(p.replace(b"\\", b"\\\\").replace(b"*", b"\\*") for p in b.parts)
                helper = abi.HELPER_STR_GLOB
            else:
                text = b.parts[0]
                helper = abi.HELPER_STR_EQ
            self.emit(isa.ld_pseudo(R4, abi.PSEUDO_RODATA, 0, self.literal(text)))
            self.emit(isa.mov_imm(R5, len(text)), isa.call(helper))
        else:
            assert isinstance(b, ast.FieldRef)
            self.emit(self.path_reg(R4, b), isa.call(abi.HELPER_STR_FIELDS_EQ))
        if abort is not None:
            self.jump(abort, isa.JSLT, R0, 0)

    # -- values ------------------------------------------------------------------------

    def value(self, n: ast.Node, abort: _Label, depth: int, *, double: bool = False) -> None:
        """R0 = the value of ``n`` (an s64, or a double's bits when ``n`` is a
        double or ``double`` asks for one)."""
        if double and n.type != "double":
            self.value(n, abort, depth)
            self.emit(isa.mov(R1, R0), isa.call(abi.HELPER_S64_TO_DOUBLE))
            return
        if isinstance(n, ast.IntLit):
            v = n.value
            self.emit(isa.mov_imm(R0, v) if _fits_imm32(v) else isa.ld_imm64(R0, v))
            return
        if isinstance(n, ast.FloatLit):
            import struct

            bits = struct.unpack("<q", struct.pack("<d", n.value))[0]
            self.emit(isa.ld_imm64(R0, bits))
            return
        if isinstance(n, ast.FieldRef):
            self.load(n, abort)
            return
        if isinstance(n, ast.Unary):
            self.value(n.operand, abort, depth)
            if n.op == "-":
                if n.type == "double":
                    self.emit(isa.ld_imm64(R1, 1 << 63), isa.alu64(isa.XOR, R0, R1, reg=True))
                else:
                    self.emit(isa.insn(isa.ALU64 | isa.NEG, R0))
            elif n.op == "~":
                self.emit(isa.alu64(isa.XOR, R0, -1, reg=False))
            elif n.op == "!":
                if n.operand.type == "double":
                    self.emit(isa.alu64(isa.LSH, R0, 1, reg=False))
                self.materialize_zero_test(R0)
            return
        if isinstance(n, ast.Binary) and n.op in _BITWISE:
            self.value(n.left, abort, depth)
            self.hold(depth)
            self.value(n.right, abort, depth + 1)
            if n.op in ("<<", ">>"):
                self.jump(abort, isa.JGT, R0, 63)  # unsigned: negatives too
            self.emit(self.fetch(depth, R1))
            self.emit(isa.alu64(_BITWISE[n.op], R1, R0, reg=True), isa.mov(R0, R1))
            return
        # Comparisons and logic as values: 0 or 1.
        t, f = self.label("t"), self.label("f")
        self.cond(n, t, f, abort, depth)
        self.place(t)
        self.materialize(R0, f)

    def materialize_zero_test(self, reg: int) -> None:
        """reg = (reg == 0)."""
        nonzero = self.label("nz")
        self.jump(nonzero, isa.JNE, reg, 0)
        self.materialize(reg, nonzero)

    def materialize(self, reg: int, false: _Label) -> None:
        """reg = 1 on the path reaching here, 0 on the jumps to ``false``."""
        done = self.label("done")
        self.emit(isa.mov_imm(reg, 1))
        self.jump(done)
        self.place(false)
        self.emit(isa.mov_imm(reg, 0))
        self.place(done)

    def hold(self, depth: int) -> None:
        """Keep R0 while the other operand is computed (R8, R9, then stack)."""
        if depth < len(_TEMPS):
            self.emit(isa.mov(_TEMPS[depth], R0))
        else:
            slot = depth - len(_TEMPS) + 1
            self.stack_slots = max(self.stack_slots, slot)
            self.emit(isa.stx(isa.DW, R10, R0, -8 * slot))

    def fetch(self, depth: int, reg: int):
        if depth < len(_TEMPS):
            return isa.mov(reg, _TEMPS[depth])
        return isa.ldx(isa.DW, reg, R10, -8 * (depth - len(_TEMPS) + 1))

    def path_reg(self, reg: int, ref: ast.FieldRef) -> list:
        return isa.ld_pseudo(reg, abi.PSEUDO_FIELD_PATH, self.path_index(ref.path), 0)

    def setup_call(self, ref: ast.FieldRef) -> None:
        """R1 = event, R2 = context, R3 = the field's path."""
        if ref.path is None:
            raise AssertionError("missing paths are handled by the caller")
        self.emit(isa.mov(R1, R6), isa.mov(R2, R7), self.path_reg(R3, ref))

    def load(self, ref: ast.FieldRef, abort: _Label) -> None:
        """R0 = a numeric field (s64, or a double's bits)."""
        path = ref.path
        if path is None:  # the schema lacks it: evaluating it aborts
            self.jump(abort)
            self.emit(isa.mov_imm(R0, 0))  # unreachable; keeps R0 typed for the verifier
            return
        if path.static_offset is not None:
            base = R7 if path.root == ROOT_CONTEXT else R6
            self.emit(isa.ldx(_SIZE[path.size], R0, base, path.static_offset))
        else:
            self.setup_call(ref)
            self.emit(isa.call(abi.HELPER_FIELD_ADDR))
            self.jump(abort, isa.JEQ, R0, 0)
            self.emit(isa.ldx(_SIZE[path.size], R0, R0, 0))
        if path.leaf == "float":
            if path.size == 4:
                self.emit(isa.mov(R1, R0), isa.call(abi.HELPER_F32_TO_DOUBLE))
            return
        if path.signed and path.size < 8:
            shift = 64 - 8 * path.size
            self.emit(
                isa.alu64(isa.LSH, R0, shift, reg=False), isa.alu64(isa.ARSH, R0, shift, reg=False)
            )


def generate(
    tree: ast.Node,
    event: Schema,
    context: Schema = DEFAULT_CONTEXT,
    *,
    name: str = "filter",
) -> Program:
    """The eBPF program of a checked tree (see :func:`~..check.check`).

    Raises :class:`FilterError` when the program exceeds eBPF's
    :data:`~..abi.MAX_INSNS` instructions.
    """
    g = _Gen()
    # Missing data makes the whole expression false: the abort exit is the
    # false exit, so an outcome that goes there needs no test of its own.
    t = g.label("true")
    f = abort = g.label("false")
    g.emit(isa.mov(R6, R1), isa.mov(R7, R2))
    g.cond(tree, t, f, abort)
    g.place(t)
    g.emit(isa.mov_imm(R0, 1), isa.exit_())
    g.place(f)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    insns = isa.program(g.finish())
    if len(insns) > abi.MAX_INSNS:
        raise FilterError(
            f"the eBPF program would have {len(insns)} instructions, over eBPF's limit of "
            f"{abi.MAX_INSNS}",
            column=tree.column,
        )
    return Program(
        insns,
        bytes(g.rodata),
        g.paths,
        event_size=event.size,
        context_size=context.size,
        name=name,
    )
