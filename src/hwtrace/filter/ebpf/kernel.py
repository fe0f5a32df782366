"""Filters as kernel eBPF: ``BPF_PROG_TYPE_TRACEPOINT`` programs.

The same code shape as the userspace eBPF tiers (:mod:`.gen`: a compare
and a jump per predicate, one shared false exit), lowered for what the
kernel gives a tracepoint program and what its verifier accepts:

* the context (R1) is the tracepoint's raw record, laid out as its tracefs
  ``format`` file says.  Fields at offset 8 or more, aligned to their size,
  are loaded from it directly; the ``common_*`` fields before them, and
  ``__data_loc`` strings, are read from a copy made with
  ``bpf_probe_read_kernel`` into a per-CPU scratch map (the verifier allows
  neither direct reads below offset 8 nor reads at variable offsets from
  the context);
* ``$ctx`` fields come from helpers: ``procname`` (``bpf_get_current_comm``),
  ``pid``/``tid`` (``bpf_get_current_pid_tgid``), ``uid``/``gid``,
  ``cpu_id`` (``bpf_get_smp_processor_id``);
* strings are compared byte by byte, unrolled (no loops): equality, and
  the glob forms ftrace's filters take, ``"abc*"``, ``"*abc"``,
  ``"*abc*"``, plus ``"ab*c"``, on ``char[N]`` fields (``__data_loc``
  strings and strings read through a pointer: equality and ``"abc*"``).
  A ``char *`` field (a system call's ``filename``) is read with
  ``bpf_probe_read_user_str`` (``bpf_probe_read_kernel_str`` outside the
  ``syscalls`` events) into the scratch value; an unreadable one is
  missing.  These strings are compared within ``max_string`` bytes, and a
  literal longer than that is refused;
* no floating point (the kernel has none for BPF).

An event that passes (or, with ``emit="all"``, every event with its
verdict) goes into a BPF ring buffer as an :data:`HEADER` (time, CPU, ids,
comm, verdict) followed by the raw record.  Per-CPU counters of events
seen, passed and lost (ring buffer full) sit at the start of the scratch
value.  Every instruction remembers the expression column it was
generated for (:attr:`KernelProgram.columns`), so a verifier message
points into the filter text.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...kernel import bpf as kbpf
from .. import ast
from ..errors import FilterError
from ..parse import wrap_s64
from ..schema import DEFAULT_CONTEXT, ROOT_CONTEXT, Schema, SequenceType, StringType
from . import isa
from .gen import _INVERT, _SIGNED_JUMP, _SWAP, _Gen, _is_jump, _Label
from .isa import R0, R1, R2, R3, R4, R5, R6, R7, R8, R10

__all__ = ["HEADER", "KernelProgram", "Layout", "generate_kernel"]

#: What precedes each raw record in the ring buffer.
HEADER = np.dtype(
    [
        ("time", "<u8"), ("cpu", "<u4"), ("event", "<u2"), ("verdict", "u1"), ("pad0", "u1"),
        ("pid", "<u4"), ("tid", "<u4"), ("uid", "<u4"), ("gid", "<u4"),
        ("comm", "S16"), ("size", "<u4"), ("pad1", "<u4"),
    ]
)  # fmt: skip
assert HEADER.itemsize == 56

REC_MAX = 8192  # PERF_MAX_TRACE_SIZE: no tracepoint record is larger
#: Bytes of the scratch value a string read through a pointer goes to (its
#: bound, ``max_string``, at most one less: the terminating NUL).
STRING_ROOM = 4096
COUNTERS = ("seen", "passed", "lost")
# The context fields a kernel program can know, and the helper giving each.
KERNEL_CONTEXT = ("procname", "pid", "tid", "uid", "gid", "cpu_id")
_UNSIGNED_JUMP = {"<": isa.JLT, "<=": isa.JLE, ">": isa.JGT, ">=": isa.JGE,
                  "==": isa.JEQ, "!=": isa.JNE}  # fmt: skip
# Record fields a tracepoint program cannot know (see _emit_copy).
_LOST_FIELDS = ("common_flags", "common_preempt_count")


@dataclass(frozen=True)
class Layout:
    """Offsets in the per-CPU scratch value: counters, then the ring
    buffer record (header, raw record copy), then the ``$ctx`` record."""

    counters: int = 0
    header: int = 32
    record: int = 32 + HEADER.itemsize
    context: int = 32 + HEADER.itemsize + REC_MAX

    @property
    def string(self) -> int:
        """Where a string read through a pointer goes: after the context."""
        return self.context + (DEFAULT_CONTEXT.size + 7) // 8 * 8

    @property
    def size(self) -> int:
        return self.string + STRING_ROOM


LAYOUT = Layout()


@dataclass
class KernelProgram:
    """A generated tracepoint program before loading: its instructions,
    the expression column each came from (0: none), the map file
    descriptors it refers to, and what it copies."""

    insns: np.ndarray
    columns: list[int]
    expression: str
    event_name: str
    schema: Schema
    copies_record: bool
    context_fields: tuple[str, ...]
    notes: list[str] = field(default_factory=list)


def _direct(offset: int, size: int) -> bool:
    """Can the verifier let the program load ``size`` bytes at ``offset``
    of a tracepoint's context (kernel/trace/bpf_trace.c,
    tp_prog_is_valid_access)?"""
    return offset >= 8 and offset % size == 0 and offset + size <= REC_MAX


class _KernelGen(_Gen):
    def __init__(self, max_string: int, copied: bool, tracepoint_id: int = 0,
                 user_strings: bool = False) -> None:  # fmt: skip
        super().__init__()
        self.tracepoint_id = tracepoint_id
        self.user_strings = user_strings  # char * fields point into user space
        self.columns: list[int] = []
        self.column = 0
        self.max_string = max_string
        self.copied = copied  # the record copy exists before the filter runs
        self.exits: set[int] = set()  # ids of the labels that end the filter (see lower)

    # -- columns follow the code ------------------------------------------------------

    def emit(self, *insns) -> None:
        before = len(self.code)
        super().emit(*insns)
        self.columns += [self.column] * (len(self.code) - before)

    def jump(self, label, op=isa.JA, dst=0, src_or_imm=0, *, reg=False) -> None:
        super().jump(label, op, dst, src_or_imm, reg=reg)
        self.columns.append(self.column)

    def _compact(self, keep: list[bool]) -> None:
        self.columns = [c for c, k in zip(self.columns, keep, strict=True) if k]
        super()._compact(keep)

    def _splice(self, inserts: dict[int, list]) -> None:
        super()._splice(inserts)
        self.columns = [self.columns[k] for k in self._spliced_from]

    def lower(self) -> None:
        """A conditional jump to one of the program's exits becomes the
        opposite jump over a ``ja`` to it.  The kernel verifier follows a
        branch's fall-through first and keeps its target pending (at most
        8,192 at once: BPF_COMPLEXITY_LIMIT_JMP_SEQ); with the exit as the
        fall-through, each term's exit path is verified to its end (and
        later ones pruned there) before the filter's next term, instead
        of every term leaving one more branch pending."""
        inserts: dict[int, list] = {}
        for k, item in enumerate(self.code):
            if _is_jump(item) and item[1] in _INVERT and id(item[0]) in self.exits:
                skip = self.label("skip")
                self.code[k] = (skip, _INVERT[item[1]], *item[2:])
                inserts[k + 1] = [((item[0], isa.JA, 0, 0, False), k), ((skip, "place"), k)]
        if inserts:
            self._splice(inserts)

    def cond(self, n, t, f, abort, depth=0) -> None:
        saved, self.column = self.column, n.column or self.column
        try:
            super().cond(n, t, f, abort, depth)
        finally:
            self.column = saved

    def value(self, n, abort, depth, *, double=False) -> None:
        if double or n.type == "double":
            raise FilterError(
                "kernel BPF programs have no floating point: compare integers", column=n.column
            )
        saved, self.column = self.column, n.column or self.column
        try:
            super().value(n, abort, depth)
        finally:
            self.column = saved

    # -- loads ---------------------------------------------------------------------------

    def load(self, ref: ast.FieldRef, abort: _Label) -> None:
        path = ref.path
        if path is None:
            self.jump(abort)
            self.emit(isa.mov_imm(R0, 0))
            return
        size = {1: isa.B, 2: isa.H, 4: isa.W, 8: isa.DW}[path.size]
        common = ref.names[0] if ref.root == "event" and len(ref.names) == 1 else None
        if common == "common_type":
            self.emit(isa.mov_imm(R0, self.tracepoint_id))
            return
        if common == "common_pid":  # what the record held: the current thread
            self.emit(isa.call(kbpf.FN_GET_CURRENT_PID_TGID), isa.mov32(R0, R0))
        elif path.root == ROOT_CONTEXT:
            self.emit(isa.ldx(size, R0, R7, LAYOUT.context + path.static_offset))
        elif path.static_offset is not None:
            off = path.static_offset
            if _direct(off, path.size):
                self.emit(isa.ldx(size, R0, R6, off))
            else:
                self.emit(isa.ldx(size, R0, R7, LAYOUT.record + off))
        else:
            self.dynamic_load(ref, size, abort)
        if path.signed and path.size < 8:
            shift = 64 - 8 * path.size
            self.emit(
                isa.alu64(isa.LSH, R0, shift, reg=False), isa.alu64(isa.ARSH, R0, shift, reg=False)
            )

    def field_constant(self, n: ast.Binary, t, f, abort, depth) -> bool:
        """An event's integer field against a constant, as ftrace's event
        filter compares them (kernel/trace/trace_events_filter.c): the
        constant converted to the field's C type (truncated to its size,
        sign-extended when signed), compared at the field's signedness.
        So ``offset < 0`` holds for no unsigned ``offset``, where LTTng's
        signed 64-bit compare passes values of 2^63 and more.  False when
        ``n`` is not of that form (the generic code then compares)."""
        a, b, op = n.left, n.right, n.op
        if isinstance(a, ast.IntLit):
            a, b, op = b, a, _SWAP[op]
        if not (isinstance(a, ast.FieldRef) and isinstance(b, ast.IntLit)):
            return False
        path = a.path
        if a.root != "event" or path is None or path.leaf != "int":
            return False
        bits = 8 * path.size
        v = b.value & ((1 << bits) - 1)
        if path.signed and v >> (bits - 1):
            v -= 1 << bits
        v = wrap_s64(v)  # the 64-bit pattern R0 holds the field's value as
        jump = (_SIGNED_JUMP if path.signed else _UNSIGNED_JUMP)[op]
        self.value(a, abort, depth)
        self.jump_if(t, jump, v)
        self.jump(f)
        return True

    def dynamic_load(self, ref: ast.FieldRef, size: int, abort: _Label) -> None:
        """An element of a ``__data_loc`` array: ``name[K]``."""
        from ..schema import P_ADD, P_DATA_LOC, P_ELEM

        steps = list(ref.path.steps)
        base = 0
        if steps and steps[0][0] == P_ADD:
            base = steps.pop(0)[1]
        if len(steps) != 2 or steps[0][0] != P_DATA_LOC or steps[1][0] != P_ELEM:
            raise FilterError(
                f"{ref.text}: the kernel back end reads fields at fixed offsets and elements "
                "of __data_loc arrays only",
                column=ref.column,
            )
        index, stride = steps[1][1], steps[1][2]
        lo = index * stride
        self.emit(isa.ldx(isa.W, R1, R7, LAYOUT.record + base))  # the data_loc word
        self.emit(isa.mov(R2, R1), isa.alu64(isa.RSH, R2, 16, reg=False))  # length
        self.emit(isa.alu64(isa.AND, R1, 0xFFFF, reg=False))  # offset
        self.jump(abort, isa.JLE, R2, lo + stride - 1)  # index past the length
        self.jump(abort, isa.JGT, R1, REC_MAX - lo - stride)  # beyond the copy
        self.emit(isa.alu64(isa.ADD, R1, R7, reg=True))
        self.emit(isa.ldx(size, R0, R1, LAYOUT.record + lo))

    # -- strings -------------------------------------------------------------------------

    def strings_equal(self, a, b, abort) -> None:
        raise AssertionError("the kernel generator compares strings in compare()")

    def compare(self, n, t, f, abort, depth) -> None:
        if n.left.type != "string":
            if not self.field_constant(n, t, f, abort, depth):
                super().compare(n, t, f, abort, depth)
            return
        a, b = n.left, n.right
        if isinstance(a, ast.StrLit):
            a, b = b, a
        yes, no = (t, f) if n.op == "==" else (f, t)
        if a.path is None or (isinstance(b, ast.FieldRef) and b.path is None):
            self.jump(abort)  # a field the event lacks
            return
        if isinstance(b, ast.StrLit):
            self.string_literal(a, b, yes, no, abort)
        else:
            self.string_fields(a, b, yes, no, n.column)

    def string_source(self, ref: ast.FieldRef, need: int, abort: _Label):
        """Registers and offsets to read ``ref``'s bytes: (base register,
        offset of byte 0, capacity or None).  For a ``__data_loc`` string R2
        points at it and R3 holds its length; a string read through a
        pointer is copied to the scratch value, R3 its length."""
        path = ref.path
        if path.storage == "inline":
            if path.root == ROOT_CONTEXT:
                return R7, LAYOUT.context + path.static_offset, path.capacity
            if path.static_offset is None:
                raise FilterError(
                    f"{ref.text}: the kernel back end reads strings at fixed offsets only",
                    column=ref.column,
                )
            off = path.static_offset
            if off >= 8:
                return R6, off, path.capacity
            return R7, LAYOUT.record + off, path.capacity
        if path.storage == "data_loc" and path.static_offset is not None:
            self.emit(isa.ldx(isa.W, R2, R7, LAYOUT.record + path.static_offset))
            self.emit(isa.mov(R3, R2), isa.alu64(isa.RSH, R3, 16, reg=False))
            self.emit(isa.alu64(isa.AND, R2, 0xFFFF, reg=False))
            # Bytes 0..need must lie in the copy (the verifier checks it, too).
            self.jump(abort, isa.JGT, R2, REC_MAX - need - 1)
            self.emit(isa.alu64(isa.ADD, R2, R7, reg=True))
            return R2, LAYOUT.record, None
        if path.storage == "ptr" and path.static_offset is not None and path.root != ROOT_CONTEXT:
            if self.max_string + 1 > STRING_ROOM:
                raise FilterError(
                    f"{ref.text}: a string read through a pointer is compared within "
                    f"{STRING_ROOM - 1} bytes at most, not {self.max_string} (--max-string)",
                    column=ref.column,
                )
            off = path.static_offset
            if _direct(off, 8):
                self.emit(isa.ldx(isa.DW, R3, R6, off))
            else:
                self.emit(isa.ldx(isa.DW, R3, R7, LAYOUT.record + off))
            # max_string + 1 bytes: a longer string is cut there, and so
            # differs from every literal the bound allows.
            read = (
                kbpf.FN_PROBE_READ_USER_STR if self.user_strings else kbpf.FN_PROBE_READ_KERNEL_STR
            )
            self.emit(isa.mov(R1, R7), isa.alu64(isa.ADD, R1, LAYOUT.string, reg=False))
            self.emit(isa.mov_imm(R2, self.max_string + 1), isa.call(read))
            self.jump(abort, isa.JSLT, R0, 1)  # a NULL or unreadable pointer: no string
            self.emit(isa.mov(R3, R0), isa.alu64(isa.ADD, R3, -1, reg=False))
            return R7, LAYOUT.string, None
        raise FilterError(
            f"{ref.text}: the kernel back end compares inline, __data_loc and char * strings only",
            column=ref.column,
        )

    def string_literal(self, a, lit: ast.StrLit, yes, no, abort) -> None:
        parts = lit.parts
        inline = a.path.storage == "inline"
        simple = len(parts) == 1 or (len(parts) == 2 and not parts[1])
        if not simple and not (inline and _glob_shape(parts)):
            raise FilterError(
                "the kernel back end matches a __data_loc or char * string with a pattern that "
                "has one '*', at its end (\"abc*\")"
                if not inline
                else 'the kernel back end matches patterns of the forms "abc*", "*abc", '
                '"*abc*" and "ab*c"',
                column=lit.column,
            )
        longest = max(len(p) for p in parts)
        if not inline and longest + 1 > self.max_string:
            raise FilterError(
                f"a {longest}-byte literal is beyond the kernel string bound of "
                f"{self.max_string} bytes for {a.text} (raise it with --max-string)",
                column=lit.column,
            )
        base, off, cap = self.string_source(a, longest, abort)
        if not simple:
            self.inline_glob(base, off, cap, parts, yes, no)
            return
        text, prefix = parts[0], len(parts) == 2
        n = len(text)
        if cap is not None and n > cap:
            self.jump(no)  # longer than the field can hold
            return
        if cap is None:
            self.jump(no, isa.JLT, R3, n)  # the record holds fewer bytes
        self.bytes_equal(base, off, text, no)
        if prefix:
            self.jump(yes)
            return
        if cap is not None:
            if n < cap:
                self.emit(isa.ldx(isa.B, R0, base, off + n))
                self.jump(no, isa.JNE, R0, 0)
            self.jump(yes)
            return
        self.jump(yes, isa.JEQ, R3, n)
        self.emit(isa.ldx(isa.B, R0, base, off + n))
        self.jump(no, isa.JNE, R0, 0)
        self.jump(yes)

    def bytes_equal(self, base: int, off: int, text: bytes, no: _Label) -> None:
        for i, ch in enumerate(text):
            self.emit(isa.ldx(isa.B, R0, base, off + i))
            self.jump(no, isa.JNE, R0, ch)

    def inline_glob(self, base: int, off: int, cap: int, parts, yes, no) -> None:
        """``*b``, ``a*b``, ``*b*`` on a char[cap] string: its length into
        R4 (unrolled), then the parts at each place that length allows, all
        at constant offsets (the verifier allows no other in the record)."""
        if len(parts) == 3:
            self.inline_contains(base, off, cap, parts[1], yes, no)
            return
        first, last = parts[0], parts[-1]
        have = self.label("len")
        for i in range(cap):
            self.emit(isa.ldx(isa.B, R0, base, off + i), isa.mov_imm(R4, i))
            self.jump(have, isa.JEQ, R0, 0)
        self.emit(isa.mov_imm(R4, cap))
        self.place(have)
        self.jump(no, isa.JLT, R4, len(first) + len(last))
        self.bytes_equal(base, off, first, no)
        k = len(last)
        for m in range(max(k, len(first) + k), cap + 1):
            nxt = self.label("end")
            self.jump(nxt, isa.JNE, R4, m)
            self.bytes_equal(base, off + m - k, last, no)
            self.jump(yes)
            self.place(nxt)
        self.jump(no)

    def inline_contains(self, base: int, off: int, cap: int, mid: bytes, yes, no) -> None:
        """``*mid*`` on a char[cap] string: at each place p, one branch on
        the first byte (most places fail there), the rest compared without
        branches, and the match taken only if no NUL comes before p (R5,
        kept without branches).  Each place leaves the verifier one branch
        pending, not one a byte and one a possible length, so an ``||``
        of such terms stays within its 8,192."""
        k = len(mid)
        self.emit(isa.mov_imm(R5, 1))  # every byte before p is not NUL
        for p in range(cap - k + 1):
            nxt = self.label("at")
            self.emit(isa.ldx(isa.B, R0, base, off + p))
            self.jump(nxt, isa.JNE, R0, mid[0])
            self.emit(isa.mov(R1, R5), isa.alu64(isa.XOR, R1, 1, reg=False))  # 0: no NUL before
            for i in range(1, k):
                self.emit(isa.ldx(isa.B, R0, base, off + p + i))
                self.emit(
                    isa.alu64(isa.XOR, R0, mid[i], reg=False), isa.alu64(isa.OR, R1, R0, reg=True)
                )
            self.jump(yes, isa.JEQ, R1, 0)
            self.place(nxt)
            if p < cap - k:  # R5 &= (byte p != 0): -byte has bit 63 set iff byte != 0
                self.emit(isa.ldx(isa.B, R0, base, off + p), isa.insn(isa.ALU64 | isa.NEG, R0))
                self.emit(
                    isa.alu64(isa.RSH, R0, 63, reg=False), isa.alu64(isa.AND, R5, R0, reg=True)
                )
        self.jump(no)

    def string_fields(self, a, b, yes, no, column: int) -> None:
        srcs = []
        for ref in (a, b):
            if ref.path.storage != "inline":
                raise FilterError(
                    f"{ref.text}: the kernel back end compares two fields when both are "
                    "fixed-size (char[N]) strings",
                    column=ref.column,
                )
            srcs.append(self.string_source(ref, 0, no))
        (ba, oa, ca), (bb, ob, cb) = srcs
        for i in range(min(ca, cb)):
            self.emit(isa.ldx(isa.B, R0, ba, oa + i), isa.ldx(isa.B, R1, bb, ob + i))
            self.jump(no, isa.JNE, R0, R1, reg=True)
            self.jump(yes, isa.JEQ, R0, 0)
        if ca == cb:
            self.jump(yes)
            return
        # The shorter field is full: equal when the longer one ends there.
        base, off = (bb, ob) if ca < cb else (ba, oa)
        self.emit(isa.ldx(isa.B, R0, base, off + min(ca, cb)))
        self.jump(no, isa.JNE, R0, 0)
        self.jump(yes)


def _glob_shape(parts: tuple[bytes, ...]) -> bool:
    """``*b``, ``a*b`` (two parts) or ``*b*`` (three, the outer empty)."""
    if len(parts) == 2:
        return True
    return len(parts) == 3 and not parts[0] and not parts[2] and bool(parts[1])


def _needs_copy(refs: list[ast.FieldRef]) -> bool:
    for r in refs:
        p = r.path
        if p is None or p.root == ROOT_CONTEXT:
            continue
        if r.names in (("common_pid",), ("common_type",)):
            continue  # known without the record (see _KernelGen.load)
        if p.static_offset is None or p.storage == "data_loc":
            return True
        if p.leaf == "string":
            if p.static_offset < 8 or (p.storage == "ptr" and not _direct(p.static_offset, 8)):
                return True
        elif not _direct(p.static_offset, p.size):
            return True
    return False


def _data_locs(schema: Schema) -> list[int]:
    return [
        f.offset
        for f in schema.fields
        if isinstance(f.type, (StringType, SequenceType)) and f.type.storage == "data_loc"
    ]


def _emit_copy(g: _KernelGen, schema: Schema, tracepoint_id: int) -> None:
    """Copy the raw record into the scratch value: its fixed part and the
    ``__data_loc`` data after it (up to the furthest end any of them
    gives, at most REC_MAX bytes).  Leaves the size in the header.

    The kernel has put a ``struct pt_regs *`` over the record's first 8
    bytes before the program runs (perf_trace_run_bpf_submit), so the copy
    gets its ``common_type`` (the tracepoint's id) and ``common_pid`` (the
    current thread) back; ``common_flags`` and ``common_preempt_count`` are
    lost and read as 0."""
    fixed = min(schema.size, REC_MAX)
    g.emit(isa.mov_imm(R8, fixed))
    for off in _data_locs(schema):
        skip = g.label("loc")
        if _direct(off, 4):
            g.emit(isa.ldx(isa.W, R1, R6, off))
        else:
            g.emit(
                isa.mov(R1, R7), isa.alu64(isa.ADD, R1, LAYOUT.context - 8, reg=False),
                isa.mov_imm(R2, 4), isa.mov(R3, R6), isa.alu64(isa.ADD, R3, off, reg=False),
                isa.call(kbpf.FN_PROBE_READ_KERNEL), isa.ldx(isa.W, R1, R7, LAYOUT.context - 8),
            )  # fmt: skip
        g.emit(isa.mov(R2, R1), isa.alu64(isa.RSH, R2, 16, reg=False))
        g.emit(isa.alu64(isa.AND, R1, 0xFFFF, reg=False), isa.alu64(isa.ADD, R1, R2, reg=True))
        g.jump(skip, isa.JLE, R1, R8, reg=True)
        g.emit(isa.mov(R8, R1))
        g.place(skip)
    ok = g.label("len")
    g.jump(ok, isa.JLE, R8, REC_MAX)
    g.emit(isa.mov_imm(R8, REC_MAX))
    g.place(ok)
    g.emit(isa.stx(isa.W, R7, R8, LAYOUT.header + HEADER.fields["size"][1]))
    g.emit(isa.mov(R1, R7), isa.alu64(isa.ADD, R1, LAYOUT.record, reg=False))
    g.emit(isa.mov(R2, R8), isa.mov(R3, R6), isa.call(kbpf.FN_PROBE_READ_KERNEL))
    g.emit(isa.st(isa.H, R7, LAYOUT.record, tracepoint_id), isa.st(isa.H, R7, LAYOUT.record + 2, 0))
    g.emit(isa.call(kbpf.FN_GET_CURRENT_PID_TGID), isa.stx(isa.W, R7, R0, LAYOUT.record + 4))


def _emit_context(g: _KernelGen, names: set[str]) -> None:
    """Fill the ``$ctx`` fields the filter reads, in DEFAULT_CONTEXT's layout."""
    at = {f.name: LAYOUT.context + f.offset for f in DEFAULT_CONTEXT.fields}
    if "procname" in names:
        g.emit(isa.mov(R1, R7), isa.alu64(isa.ADD, R1, at["procname"], reg=False))
        g.emit(isa.mov_imm(R2, 16), isa.call(kbpf.FN_GET_CURRENT_COMM))
    if names & {"pid", "tid"}:
        g.emit(isa.call(kbpf.FN_GET_CURRENT_PID_TGID), isa.mov(R1, R0))
        g.emit(isa.alu64(isa.RSH, R1, 32, reg=False), isa.stx(isa.DW, R7, R1, at["pid"]))
        g.emit(isa.mov32(R0, R0), isa.stx(isa.DW, R7, R0, at["tid"]))
    if names & {"uid", "gid"}:
        g.emit(isa.call(kbpf.FN_GET_CURRENT_UID_GID), isa.mov(R1, R0))
        g.emit(isa.alu64(isa.RSH, R1, 32, reg=False), isa.stx(isa.DW, R7, R1, at["gid"]))
        g.emit(isa.mov32(R0, R0), isa.stx(isa.DW, R7, R0, at["uid"]))
    if "cpu_id" in names:
        g.emit(isa.call(kbpf.FN_GET_SMP_PROCESSOR_ID), isa.stx(isa.DW, R7, R0, at["cpu_id"]))


def _counter(g: _KernelGen, name: str) -> None:
    off = LAYOUT.counters + 8 * COUNTERS.index(name)
    g.emit(isa.ldx(isa.DW, R1, R7, off), isa.alu64(isa.ADD, R1, 1, reg=False))
    g.emit(isa.stx(isa.DW, R7, R1, off))


def _drop_unreachable(insns: np.ndarray, columns: list[int]) -> tuple[np.ndarray, list[int]]:
    """Remove instructions no path reaches (a constant-folded expression
    leaves one outcome's code unused): the kernel verifier refuses them."""
    code, _, _, off, _ = isa.fields(insns)
    n = len(insns)
    width = [2 if (int(code[i]) == (isa.LD | isa.DW | isa.IMM)) else 1 for i in range(n)]
    seen = np.zeros(n, np.bool_)
    todo = [0]
    while todo:
        pc = todo.pop()
        if pc >= n or seen[pc]:
            continue
        seen[pc] = True
        if width[pc] == 2:
            seen[pc + 1] = True
            todo.append(pc + 2)
            continue
        c = int(code[pc])
        cls, op = c & 7, c & 0xF0
        if cls in (isa.JMP, isa.JMP32) and op not in (isa.CALL, isa.EXIT):
            todo.append(pc + 1 + int(off[pc]))
            if op != isa.JA:
                todo.append(pc + 1)
        elif not (cls == isa.JMP and op == isa.EXIT):
            todo.append(pc + 1)
    if seen.all():
        return insns, columns
    new = np.cumsum(seen) - 1
    out = insns.copy()
    for pc in np.flatnonzero(seen).tolist():
        c = int(code[pc])
        cls, op = c & 7, c & 0xF0
        if width[pc] == 1 and cls in (isa.JMP, isa.JMP32) and op not in (isa.CALL, isa.EXIT):
            target = pc + 1 + int(off[pc])
            out["off"][pc] = int(new[target]) - (int(new[pc]) + 1)
    return out[seen], [c for c, k in zip(columns, seen.tolist(), strict=True) if k]


def generate_kernel(
    tree: ast.Node | None,
    schema: Schema,
    *,
    expression: str = "",
    event_name: str = "",
    event_index: int = 0,
    tracepoint_id: int = 0,
    scratch_fd: int,
    ringbuf_fd: int,
    emit: str = "passed",
    max_string: int = 256,
    pids_fd: int | None = None,
    user_strings: bool = False,
) -> KernelProgram:
    """The tracepoint program for the checked ``tree`` (None: every event
    passes) over events of ``schema``.  ``emit``: ``"passed"`` writes the
    events that pass to the ring buffer, ``"all"`` every event with its
    verdict, ``"none"`` only counts.  ``user_strings``: the schema's
    ``char *`` strings are in user space (a system call's arguments)."""
    refs = ast.field_refs(tree) if tree is not None else []
    ctx_names = set()
    for r in refs:
        if r.root == "event" and r.names[0] in _LOST_FIELDS:
            raise FilterError(
                f"{r.text} is not available to kernel filters: the kernel overwrites it "
                "before BPF programs run",
                column=r.column,
            )
        if r.root == "app":
            raise FilterError(f"{r.text}: application context is not available in the kernel",
                              column=r.column)  # fmt: skip
        if r.root == "ctx":
            name = str(r.names[0])
            if name not in KERNEL_CONTEXT:
                raise FilterError(
                    f"$ctx.{name} is not available to kernel filters (they know "
                    + ", ".join(f"$ctx.{k}" for k in KERNEL_CONTEXT) + ")",
                    column=r.column,
                )  # fmt: skip
            ctx_names.add(name)
    copy_first = _needs_copy(refs)
    g = _KernelGen(max_string, copy_first, tracepoint_id, user_strings)
    done = g.label("done")
    t, f = g.label("true"), g.label("false")
    out = g.label("output")
    g.exits = {id(t), id(f), id(done)}
    # R6 = the tracepoint's record; R7 = this CPU's scratch value.
    g.emit(isa.mov(R6, R1))
    if pids_fd is not None:
        g.emit(isa.call(kbpf.FN_GET_CURRENT_PID_TGID), isa.alu64(isa.RSH, R0, 32, reg=False))
        g.emit(isa.stx(isa.W, R10, R0, -8), isa.mov(R2, R10), isa.alu64(isa.ADD, R2, -8, reg=False))
        g.emit(isa.ld_pseudo(R1, kbpf.PSEUDO_MAP_FD, pids_fd), isa.call(kbpf.FN_MAP_LOOKUP_ELEM))
        g.jump(done, isa.JEQ, R0, 0)
    g.emit(isa.st(isa.W, R10, -4, 0))
    g.emit(isa.mov(R2, R10), isa.alu64(isa.ADD, R2, -4, reg=False))
    g.emit(isa.ld_pseudo(R1, kbpf.PSEUDO_MAP_FD, scratch_fd), isa.call(kbpf.FN_MAP_LOOKUP_ELEM))
    g.jump(done, isa.JEQ, R0, 0)
    g.emit(isa.mov(R7, R0))
    _counter(g, "seen")
    if copy_first:
        _emit_copy(g, schema, tracepoint_id)
    _emit_context(g, ctx_names)
    if tree is None:
        g.jump(t)
    else:
        g.cond(tree, t, f, f)
    verdict = LAYOUT.header + HEADER.fields["verdict"][1]
    g.place(t)
    _counter(g, "passed")
    if emit == "none":
        g.jump(done)
    else:
        g.emit(isa.st(isa.B, R7, verdict, 1))
        g.jump(out)
    g.place(f)
    if emit == "all":
        g.emit(isa.st(isa.B, R7, verdict, 0))
        g.jump(out)
    else:
        g.jump(done)
    g.place(out)
    if emit != "none":
        if not copy_first:
            _emit_copy(g, schema, tracepoint_id)
        h = LAYOUT.header
        at = {name: h + HEADER.fields[name][1] for name in HEADER.names}
        g.emit(isa.call(kbpf.FN_KTIME_GET_NS), isa.stx(isa.DW, R7, R0, at["time"]))
        g.emit(isa.call(kbpf.FN_GET_SMP_PROCESSOR_ID), isa.stx(isa.W, R7, R0, at["cpu"]))
        g.emit(isa.st(isa.H, R7, at["event"], event_index))
        g.emit(isa.call(kbpf.FN_GET_CURRENT_PID_TGID), isa.stx(isa.W, R7, R0, at["tid"]))
        g.emit(isa.alu64(isa.RSH, R0, 32, reg=False), isa.stx(isa.W, R7, R0, at["pid"]))
        g.emit(isa.call(kbpf.FN_GET_CURRENT_UID_GID), isa.stx(isa.W, R7, R0, at["uid"]))
        g.emit(isa.alu64(isa.RSH, R0, 32, reg=False), isa.stx(isa.W, R7, R0, at["gid"]))
        g.emit(isa.mov(R1, R7), isa.alu64(isa.ADD, R1, at["comm"], reg=False))
        g.emit(isa.mov_imm(R2, 16), isa.call(kbpf.FN_GET_CURRENT_COMM))
        g.emit(isa.ldx(isa.W, R3, R7, at["size"]))
        g.jump(done, isa.JGT, R3, REC_MAX)
        g.emit(isa.alu64(isa.ADD, R3, HEADER.itemsize, reg=False))
        g.emit(isa.ld_pseudo(R1, kbpf.PSEUDO_MAP_FD, ringbuf_fd))
        g.emit(isa.mov(R2, R7), isa.alu64(isa.ADD, R2, h, reg=False), isa.mov_imm(R4, 0))
        g.emit(isa.call(kbpf.FN_RINGBUF_OUTPUT))
        g.jump(done, isa.JEQ, R0, 0)
        _counter(g, "lost")
    g.place(done)
    g.emit(isa.mov_imm(R0, 0), isa.exit_())
    slots = g.finish()
    columns: list[int] = []
    for item, col in zip(slots, g.columns, strict=True):
        columns += [col] * (2 if isinstance(item, list) else 1)
    insns, columns = _drop_unreachable(isa.program(slots), columns)
    return KernelProgram(
        insns, columns, expression, event_name, schema, copy_first or emit != "none",
        tuple(sorted(ctx_names)),
    )  # fmt: skip
