"""The LLVM tier: a checked filter tree lowered straight to LLVM IR and
compiled to host machine code through llvmlite (no eBPF in between).

The filter becomes ``i64 @name(i8* event, i8* context)``, the C function
``int64_t name(const void *event, const void *context)`` of
:mod:`.abi`, returning 1 (record) or 0.  Everything is inline:

* field paths are unrolled at compile time: a static leaf is one unaligned
  load; pointer, data_loc and sequence steps become loads, null checks and
  bound checks that branch to one shared ``return 0`` block (LTTng's rule:
  missing data makes the whole expression false; so does a shift count
  outside 0..63);
* string equality against a literal is unrolled: byte by byte with a
  branch per byte for ``char *`` strings (a byte past the NUL may not be
  readable), wide loads compared with constants for inline and data_loc
  strings once the bound is checked (their bytes are in the record);
* field-vs-field equality is a small loop; globs are matched by code
  specialised for the pattern (prefix, suffix, leftmost search of the middle
  parts), which accepts exactly what :func:`.native.glob_match` accepts;
* ``&&``/``||`` are branches, comparisons and bitwise operators follow
  docs/filter-design.md ("Semantics").

Modules are optimised with LLVM's new pass manager at ``-O<opt>`` for the
host CPU and loaded into one MCJIT engine per process; the same optimised
module can be written as a relocatable PIC object (:meth:`LlvmFilter.emit_object`)
or a shared library (:meth:`LlvmFilter.emit_shared`) with a C header
(:meth:`LlvmFilter.c_header`) describing the records it reads.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import os
import re
import shutil
import subprocess
import tempfile
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

from llvmlite import binding as llvm
from llvmlite import ir

from . import ast
from . import schema as S
from .ast import glob_match
from .errors import FilterError

__all__ = ["LlvmFilter", "compile_llvm"]

_I1, _I8, _I32, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(32), ir.IntType(64)
_F32, _F64 = ir.FloatType(), ir.DoubleType()
_I8P = _I8.as_pointer()
_TRUE, _FALSE = ir.Constant(_I1, 1), ir.Constant(_I1, 0)
_INT_TYPES = {1: _I8, 2: ir.IntType(16), 4: _I32, 8: _I64}

# A string's bound: None (a C string: ends at its NUL), an int known at
# compile time (inline capacity) or an i64 value (data_loc length).
Bound = int | ir.Value | None


def _s64(v: int) -> int:
    """``v`` wrapped to a signed 64-bit value (int64 arithmetic as native.py)."""
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >> 63 else v


# -- one compiler per process ---------------------------------------------------------

_lock = threading.RLock()
_targets: dict[tuple[str, int], llvm.TargetMachine] = {}
_engines: dict[int, llvm.ExecutionEngine] = {}
_serial = itertools.count()


def _target_machine(kind: str, opt: int) -> llvm.TargetMachine:
    """``kind``: "jit" (host CPU, JIT code model), "object" (host CPU, PIC,
    small code model) or "portable" (generic x86-64, PIC)."""
    key = (kind, opt)
    tm = _targets.get(key)
    if tm is None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        target = llvm.Target.from_default_triple()
        if kind == "portable":
            cpu, features = "x86-64", ""
        else:
            cpu, features = llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()
        if kind == "jit":
            tm = target.create_target_machine(cpu=cpu, features=features, opt=opt, jit=True)
        else:
            tm = target.create_target_machine(
                cpu=cpu, features=features, opt=opt, reloc="pic", codemodel="small"
            )
        if not str(tm.target_data).startswith("e"):
            raise FilterError("the LLVM tier needs a little-endian target")
        tm = _targets.setdefault(key, tm)
    return tm


def _engine(opt: int) -> llvm.ExecutionEngine:
    eng = _engines.get(opt)
    if eng is None:
        empty = llvm.parse_assembly("")
        eng = _engines[opt] = llvm.create_mcjit_compiler(empty, _target_machine("jit", opt))
    return eng


def _optimise(module: llvm.ModuleRef, opt: int) -> None:
    tm = _target_machine("jit", opt)
    pto = llvm.create_pipeline_tuning_options(speed_level=opt)
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(module, pb)


def _release(engine: llvm.ExecutionEngine, module: llvm.ModuleRef) -> None:
    with _lock:
        engine.remove_module(module)


def _sections(obj: bytes) -> tuple[int, int]:
    """(code, constant data) bytes of an ELF object's sections."""
    code = data = 0
    for s in llvm.ObjectFileRef.from_data(obj).sections():
        name = s.name().decode() if isinstance(s.name(), bytes) else str(s.name())
        if s.is_text():
            code += s.size()
        elif re.match(r"\.l?(rodata|data)", name):
            data += s.size()
    return code, data


# -- IR generation -------------------------------------------------------------------


class _Gen:
    """Lowers one checked tree into one function."""

    def __init__(self, module: ir.Module, name: str) -> None:
        fnty = ir.FunctionType(_I64, [_I8P, _I8P])
        self.fn = ir.Function(module, fnty, name)
        self.fn.attributes.add("nounwind")
        self.event, self.context = self.fn.args
        self.event.name, self.context.name = "event", "context"
        self.b = ir.IRBuilder(self.fn.append_basic_block("entry"))
        missing = self.fn.append_basic_block("missing")
        ir.IRBuilder(missing).ret(ir.Constant(_I64, 0))
        self.missing = missing

    # control flow helpers

    def block(self, label: str) -> ir.Block:
        return self.fn.append_basic_block(label)

    def branch_if(self, cond: ir.Value, target: ir.Block, label: str = "cont") -> None:
        """Leave for ``target`` when ``cond``, else go on in a new block."""
        cont = self.block(label)
        self.b.cbranch(cond, target, cont)
        self.b.position_at_end(cont)

    def abort_if(self, cond: ir.Value) -> None:
        """The whole expression is false when ``cond`` (missing data, bad shift)."""
        self.branch_if(cond, self.missing)

    def abort(self) -> None:
        self.b.branch(self.missing)
        self.b.position_at_end(self.block("dead"))

    def decide(self, label: str, body: Callable[[ir.Block, ir.Block], ir.Value | None]) -> ir.Value:
        """An i1 computed with early exits: ``body(yes, no)`` branches to
        ``yes``/``no`` and returns the i1 for falling off its end (None: yes)."""
        yes, no = self.block(label + ".yes"), self.block(label + ".no")
        last = body(yes, no)
        if last is None:
            self.b.branch(yes)
        elif isinstance(last, ir.Constant):
            self.b.branch(yes if last.constant else no)
        else:
            self.b.cbranch(last, yes, no)
        done = self.block(label + ".done")
        ir.IRBuilder(yes).branch(done)
        ir.IRBuilder(no).branch(done)
        self.b.position_at_end(done)
        phi = self.b.phi(_I1, label)
        phi.add_incoming(_TRUE, yes)
        phi.add_incoming(_FALSE, no)
        return phi

    # memory

    def at(self, ptr: ir.Value, offset: int | ir.Value) -> ir.Value:
        if isinstance(offset, int):
            if offset == 0:
                return ptr
            offset = ir.Constant(_I64, offset)
        return self.b.gep(ptr, [offset])

    def load(self, ptr: ir.Value, ty: ir.Type) -> ir.Value:
        # align 1: records are the tracer's, fields need not be aligned.
        if ty != _I8:
            ptr = self.b.bitcast(ptr, ty.as_pointer())
        return self.b.load(ptr, align=1)

    def load_int(self, ptr: ir.Value, size: int, signed: bool) -> ir.Value:
        v = self.load(ptr, _INT_TYPES[size])
        if size == 8:
            return v
        return self.b.sext(v, _I64) if signed else self.b.zext(v, _I64)

    def leaf(self, path: S.FieldPath) -> tuple[ir.Value, ir.Value]:
        """Address of the path's leaf slot (aborting when missing) and its root."""
        root = self.context if path.root == S.ROOT_CONTEXT else self.event
        addr = root
        limit: int | ir.Value = -1  # bytes valid at a dynamic base
        for op, a, b_, c in path.steps:
            if op == S.P_ADD:
                addr = self.at(addr, _s64(a))
            elif op == S.P_DEREF:
                addr = self.load(addr, _I8P)
                self.abort_if(self.b.icmp_unsigned("==", addr, ir.Constant(_I8P, None)))
            elif op == S.P_DATA_LOC:
                v = self.b.zext(self.load(addr, _I32), _I64)
                addr = self.at(root, self.b.and_(v, ir.Constant(_I64, 0xFFFF)))
                limit = self.b.lshr(v, ir.Constant(_I64, 16))
            elif op == S.P_COUNT:
                n = self.load_int(self.at(addr, _s64(a)), abs(b_), b_ < 0)
                pos = self.b.icmp_signed(">", n, ir.Constant(_I64, 0))
                n = self.b.select(pos, n, ir.Constant(_I64, 0))
                limit = self.b.mul(n, ir.Constant(_I64, _s64(c)))
            elif op == S.P_ELEM:
                need = _s64((a + 1) * b_)
                if a < 0 or (isinstance(limit, int) and need > limit):
                    self.abort()
                elif not isinstance(limit, int):
                    self.abort_if(self.b.icmp_signed(">", ir.Constant(_I64, need), limit))
                addr = self.at(addr, _s64(a * b_))
                limit = -1
            else:
                raise FilterError(f"{path.text}: unknown path step {op}")
        return addr, root

    def string(self, node: ast.Node) -> tuple[ir.Value, Bound]:
        """A string field's first byte and bound (aborting when missing)."""
        path = node.path if isinstance(node, ast.FieldRef) else None
        if path is None:
            self.abort()
            return ir.Constant(_I8P, None), 0
        if path.leaf != "string":
            raise FilterError(f"{path.text} is not a string", column=node.column)
        slot, root = self.leaf(path)
        if path.storage == "ptr":
            s = self.load(slot, _I8P)
            self.abort_if(self.b.icmp_unsigned("==", s, ir.Constant(_I8P, None)))
            return s, None
        if path.storage == "inline":
            return slot, path.capacity
        v = self.b.zext(self.load(slot, _I32), _I64)
        s = self.at(root, self.b.and_(v, ir.Constant(_I64, 0xFFFF)))
        return s, self.b.lshr(v, ir.Constant(_I64, 16))

    # strings

    def bytes_equal(self, ptr: ir.Value, lit: bytes) -> ir.Value:
        """i1: the ``len(lit)`` bytes at ``ptr`` (all readable) equal ``lit``;
        wide little-endian loads, no branches."""
        acc: ir.Value = _TRUE
        k = 0
        while k < len(lit):
            w = next(w for w in (8, 4, 2, 1) if k + w <= len(lit))
            v = self.load(self.at(ptr, k), _INT_TYPES[w])
            want = ir.Constant(_INT_TYPES[w], int.from_bytes(lit[k : k + w], "little"))
            eq = self.b.icmp_unsigned("==", v, want)
            acc = eq if acc is _TRUE else self.b.and_(acc, eq)
            k += w
        return acc

    def byte_at(self, s: ir.Value, bound: Bound, i: ir.Value) -> ir.Value:
        """The byte at ``s[i]`` as i64, 0 at or past ``bound``."""
        if bound is None:
            return self.b.zext(self.load(self.at(s, i), _I8), _I64)
        inside = self.b.icmp_signed("<", i, self._bound(bound))
        before = self.b.block
        load_bb, join = self.block("byte"), self.block("byte.join")
        self.b.cbranch(inside, load_bb, join)
        self.b.position_at_end(load_bb)
        c = self.b.zext(self.load(self.at(s, i), _I8), _I64)
        self.b.branch(join)
        self.b.position_at_end(join)
        phi = self.b.phi(_I64)
        phi.add_incoming(c, load_bb)
        phi.add_incoming(ir.Constant(_I64, 0), before)
        return phi

    @staticmethod
    def _bound(bound: Bound) -> ir.Value:
        return ir.Constant(_I64, bound) if isinstance(bound, int) else bound

    def prefix(self, s: ir.Value, bound: Bound, lit: bytes, no: ir.Block) -> None:
        """Go to ``no`` unless the string starts with ``lit`` (no NUL in it)."""
        if not lit:
            return
        if bound is None:
            # A C string: a byte past its NUL may be unmapped, so one branch
            # per byte (a mismatch includes meeting the NUL early).
            for i, ch in enumerate(lit):
                c = self.load(self.at(s, i), _I8)
                self.branch_if(self.b.icmp_unsigned("!=", c, ir.Constant(_I8, ch)), no)
            return
        if isinstance(bound, int):
            if len(lit) > bound:
                self.b.branch(no)
                self.b.position_at_end(self.block("dead"))
                return
        else:
            short = self.b.icmp_signed("<", bound, ir.Constant(_I64, len(lit)))
            self.branch_if(short, no)
        # Inside the bound every byte is readable; a NUL in the string
        # differs from the literal's (nonzero) byte anyway.
        self.branch_if(self.b.not_(self.bytes_equal(s, lit)), no)

    def str_eq_lit(self, s: ir.Value, bound: Bound, lit: bytes) -> ir.Value:
        """native.str_equal: the string is exactly ``lit``."""
        if b"\0" in lit:
            return _FALSE  # a string ends at its NUL: it never holds one
        n = len(lit)
        if isinstance(bound, int) and n > bound:
            return _FALSE

        def body(yes: ir.Block, no: ir.Block) -> ir.Value | None:
            self.prefix(s, bound, lit, no)
            if isinstance(bound, int) and n == bound:
                return None
            if bound is not None and not isinstance(bound, int):
                self.branch_if(self.b.icmp_signed("==", bound, ir.Constant(_I64, n)), yes)
            c = self.load(self.at(s, n), _I8)
            return self.b.icmp_unsigned("==", c, ir.Constant(_I8, 0))

        return self.decide("streq", body)

    def strnlen(self, s: ir.Value, bound: Bound, start: int) -> ir.Value:
        """Length of the string (bytes before ``start`` known non-NUL)."""
        pre = self.b.block
        loop, out = self.block("len.loop"), self.block("len.out")
        self.b.branch(loop)
        self.b.position_at_end(loop)
        i = self.b.phi(_I64, "i")
        i.add_incoming(ir.Constant(_I64, start), pre)
        if bound is not None:
            self.branch_if(self.b.icmp_signed(">=", i, self._bound(bound)), out, "len.body")
        c = self.load(self.at(s, i), _I8)
        self.branch_if(self.b.icmp_unsigned("==", c, ir.Constant(_I8, 0)), out, "len.next")
        nxt = self.b.add(i, ir.Constant(_I64, 1))
        i.add_incoming(nxt, self.b.block)
        self.b.branch(loop)
        self.b.position_at_end(out)
        return i

    def glob(self, s: ir.Value, bound: Bound, parts: tuple[bytes, ...]) -> ir.Value:
        """native.glob_match for the pattern ``parts[0]*parts[1]*...``:
        the string starts with the first part, ends with the last, and holds
        the middle ones in order between them (leftmost search is enough
        when ``*`` is the only wildcard)."""
        if any(b"\0" in p for p in parts):
            return _FALSE
        first, last = parts[0], parts[-1]
        mids = [m for m in parts[1:-1] if m]

        def body(yes: ir.Block, no: ir.Block) -> ir.Value | None:
            self.prefix(s, bound, first, no)
            if not last and not mids:
                return None
            length = self.strnlen(s, bound, len(first))
            need = len(first) + len(last) + sum(map(len, mids))
            self.branch_if(self.b.icmp_signed("<", length, ir.Constant(_I64, need)), no)
            end = self.b.sub(length, ir.Constant(_I64, len(last)))
            if last:
                self.branch_if(self.b.not_(self.bytes_equal(self.at(s, end), last)), no)
            pos: ir.Value = ir.Constant(_I64, len(first))
            for m in mids:
                # Leftmost j in [pos, end - len(m)] with s[j:j+len(m)] == m.
                pre = self.b.block
                loop, found = self.block("glob.find"), self.block("glob.found")
                self.b.branch(loop)
                self.b.position_at_end(loop)
                j = self.b.phi(_I64, "j")
                j.add_incoming(pos, pre)
                past = self.b.icmp_signed(">", self.b.add(j, ir.Constant(_I64, len(m))), end)
                self.branch_if(past, no, "glob.try")
                self.branch_if(self.bytes_equal(self.at(s, j), m), found, "glob.next")
                j.add_incoming(self.b.add(j, ir.Constant(_I64, 1)), self.b.block)
                self.b.branch(loop)
                self.b.position_at_end(found)
                pos = self.b.add(j, ir.Constant(_I64, len(m)))
            return None

        return self.decide("glob", body)

    def strings_equal(self, a: ir.Value, abound: Bound, b: ir.Value, bbound: Bound) -> ir.Value:
        """native.strings_equal: two fields hold the same string."""

        def body(yes: ir.Block, no: ir.Block) -> ir.Value | None:
            pre = self.b.block
            loop = self.block("streq2.loop")
            self.b.branch(loop)
            self.b.position_at_end(loop)
            i = self.b.phi(_I64, "i")
            i.add_incoming(ir.Constant(_I64, 0), pre)
            ca = self.byte_at(a, abound, i)
            cb = self.byte_at(b, bbound, i)
            self.branch_if(self.b.icmp_unsigned("!=", ca, cb), no)
            self.branch_if(self.b.icmp_unsigned("==", ca, ir.Constant(_I64, 0)), yes)
            i.add_incoming(self.b.add(i, ir.Constant(_I64, 1)), self.b.block)
            self.b.branch(loop)
            self.b.position_at_end(self.block("dead"))
            return _FALSE

        return self.decide("streq2", body)

    def string_compare(self, node: ast.Binary) -> ir.Value:
        """i1 for ``==``/``!=`` between strings."""
        if node.op not in ast.EQUALITY_OPS:
            raise FilterError(f"{node.op!r} on strings", column=node.column)
        left, right = node.left, node.right
        if isinstance(left, ast.StrLit) and isinstance(right, ast.StrLit):
            eq = self._fold(left, right, node)
        else:
            if isinstance(left, ast.StrLit):
                left, right = right, left
            s, bound = self.string(left)
            if isinstance(right, ast.StrLit):
                if right.is_glob:
                    eq = self.glob(s, bound, right.parts)
                else:
                    eq = self.str_eq_lit(s, bound, right.parts[0])
            else:
                t, tbound = self.string(right)
                eq = self.strings_equal(s, bound, t, tbound)
        if node.op == "!=":
            return (
                self.b.not_(eq)
                if not isinstance(eq, ir.Constant)
                else ir.Constant(_I1, not eq.constant)
            )
        return eq

    @staticmethod
    def _fold(left: ast.StrLit, right: ast.StrLit, node: ast.Binary) -> ir.Value:
        # Two literals: check.py folds them; unfolded (fold=False), the
        # exact one is matched against the other, a pattern or exact text.
        if left.is_glob and right.is_glob:
            raise FilterError("cannot compare two glob patterns", column=node.column)
        if left.is_glob:
            left, right = right, left
        eq = glob_match(right.parts, left.parts[0]) if right.is_glob else left.parts == right.parts
        return ir.Constant(_I1, int(eq))

    # values

    def truth(self, node: ast.Node) -> ir.Value:
        """i1: the operand is nonzero (NaN is nonzero, as in C)."""
        v = self.value(node)
        if v.type == _F64:
            return self.b.fcmp_unordered("!=", v, ir.Constant(_F64, 0.0))
        return self.b.icmp_signed("!=", v, ir.Constant(_I64, 0))

    def value(self, node: ast.Node) -> ir.Value:
        """An s64 (i64) or double value."""
        b = self.b
        if isinstance(node, ast.IntLit):
            return ir.Constant(_I64, _s64(node.value))
        if isinstance(node, ast.FloatLit):
            return ir.Constant(_F64, float(node.value))
        if isinstance(node, ast.FieldRef):
            return self.field_value(node)
        if isinstance(node, ast.StrLit) or node.type == "string":
            raise FilterError("a string is not a value here", column=node.column)
        if isinstance(node, ast.Unary):
            v = self.value(node.operand)
            dbl = v.type == _F64
            if node.op == "+":
                return v
            if node.op == "-":
                return b.fneg(v) if dbl else b.sub(ir.Constant(_I64, 0), v)
            if node.op == "!":
                if dbl:
                    return b.zext(b.fcmp_ordered("==", v, ir.Constant(_F64, 0.0)), _I64)
                return b.zext(b.icmp_signed("==", v, ir.Constant(_I64, 0)), _I64)
            if node.op == "~":
                if dbl:
                    raise FilterError("'~' on a double", column=node.column)
                return b.not_(v)
            raise FilterError(f"unknown operator {node.op!r}", column=node.column)
        if isinstance(node, ast.Logical):
            return b.zext(self.logical(node), _I64)
        if isinstance(node, ast.Binary):
            if node.op in ast.COMPARISON_OPS:
                return b.zext(self.compare(node), _I64)
            return self.bitwise(node)
        raise FilterError(f"cannot compile {type(node).__name__}", column=node.column)

    def field_value(self, node: ast.FieldRef) -> ir.Value:
        path = node.path
        if path is None:
            self.abort()
            return ir.Constant(_F64 if node.type == "double" else _I64, 0)
        slot, _ = self.leaf(path)
        if path.leaf == "int":
            return self.load_int(slot, path.size, path.signed)
        if path.leaf == "float":
            if path.size == 4:
                return self.b.fpext(self.load(slot, _F32), _F64)
            return self.load(slot, _F64)
        raise FilterError(f"{path.text}: a string is not a value here", column=node.column)

    def logical(self, node: ast.Logical) -> ir.Value:
        """i1 of ``&&``/``||``: the right operand runs only when needed."""
        left = self.truth(node.left)
        before = self.b.block
        right_bb, join = self.block("rhs"), self.block("join")
        if node.op == "&&":
            self.b.cbranch(left, right_bb, join)
        else:
            self.b.cbranch(left, join, right_bb)
        self.b.position_at_end(right_bb)
        right = self.truth(node.right)
        after = self.b.block
        self.b.branch(join)
        self.b.position_at_end(join)
        phi = self.b.phi(_I1)
        phi.add_incoming(ir.Constant(_I1, int(node.op == "||")), before)
        phi.add_incoming(right, after)
        return phi

    def is_string(self, node: ast.Node) -> bool:
        if isinstance(node, ast.StrLit) or node.type == "string":
            return True
        return (
            isinstance(node, ast.FieldRef) and node.path is not None and node.path.leaf == "string"
        )

    def compare(self, node: ast.Binary) -> ir.Value:
        b = self.b
        if self.is_string(node.left) or self.is_string(node.right):
            if not (self.is_string(node.left) and self.is_string(node.right)):
                # A missing field (no path) against a string literal.
                if not any(
                    isinstance(n, ast.FieldRef) and n.path is None for n in (node.left, node.right)
                ):
                    raise FilterError("string compared with a number", column=node.column)
                self.abort()
                return _FALSE
            return self.string_compare(node)
        left, right = self.value(node.left), self.value(node.right)
        if left.type == _I64 and right.type == _I64:
            return b.icmp_signed(node.op, left, right)
        if left.type == _I64:
            left = b.sitofp(left, _F64)
        if right.type == _I64:
            right = b.sitofp(right, _F64)
        # Ordered compares (false with a NaN) except != (true with a NaN), as C.
        if node.op == "!=":
            return b.fcmp_unordered("!=", left, right)
        return b.fcmp_ordered(node.op, left, right)

    def bitwise(self, node: ast.Binary) -> ir.Value:
        b = self.b
        left, right = self.value(node.left), self.value(node.right)
        if left.type != _I64 or right.type != _I64:
            raise FilterError(f"{node.op!r} on a double", column=node.column)
        if node.op in ("<<", ">>"):
            # Unsigned: a negative count is out of range too.
            self.abort_if(b.icmp_unsigned(">", right, ir.Constant(_I64, 63)))
            return b.shl(left, right) if node.op == "<<" else b.lshr(left, right)
        if node.op == "&":
            return b.and_(left, right)
        if node.op == "|":
            return b.or_(left, right)
        if node.op == "^":
            return b.xor(left, right)
        raise FilterError(f"unknown operator {node.op!r}", column=node.column)

    def finish(self, tree: ast.Node) -> None:
        if self.is_string(tree):
            raise FilterError("a string is not a verdict", column=tree.column)
        self.b.ret(self.b.zext(self.truth(tree), _I64))


# -- the compiled filter ---------------------------------------------------------------

_C_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_C_KEYWORDS = frozenset(
    "auto break case char const continue default do double else enum extern float for goto "
    "if inline int long register restrict return short signed sizeof static struct switch "
    "typedef union unsigned void volatile while".split()
)


class LlvmFilter:
    """A filter compiled to host machine code.

    ``address`` is ``int64_t (*)(const void *event, const void *context)``;
    ``code_bytes`` is the machine code's size (the ``.text`` sections of the
    module emitted as an object by the JIT's own target machine: the
    function alone, no alignment padding) and ``memory_bytes`` that plus the
    constant data sections (``.rodata*``: e.g. a double literal's constant
    pool).  The JIT's allocation granularity (pages) is not counted.
    """

    def __init__(
        self,
        name: str,
        ir_text: str,
        module: llvm.ModuleRef,
        opt: int,
        paths: list[S.FieldPath],
        event_schema: S.Schema | None,
        context_schema: S.Schema | None,
    ) -> None:
        self.name = name
        self.opt = opt
        self.ir = ir_text
        self.optimized_ir = str(module)
        self._paths = paths
        self._schemas = (event_schema, context_schema)
        self._module = module
        jit_name = f"{name}.{next(_serial)}"  # one engine: symbols must differ
        jitted = module.clone()
        jitted.get_function(name).name = jit_name
        with _lock:
            eng = _engine(opt)
            eng.add_module(jitted)
            eng.finalize_object()
            self.address: int = eng.get_function_address(jit_name)
        # When the filter goes, the engine gives the IR module back (freed);
        # MCJIT never unmaps code, so a copied address stays callable.
        fin = weakref.finalize(self, _release, eng, jitted)
        fin.atexit = False
        proto = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p)
        self._cfunc = proto(self.address)

    @functools.cached_property
    def _sizes(self) -> tuple[int, int]:
        with _lock:
            tm = _target_machine("jit", self.opt)
        return _sections(tm.emit_object(self._module))

    @property
    def code_bytes(self) -> int:
        return self._sizes[0]

    @property
    def memory_bytes(self) -> int:
        return self._sizes[0] + self._sizes[1]

    def __call__(self, event: int, context: int) -> bool:
        """The verdict for records at addresses ``event`` and ``context``
        (objects with an ``address`` attribute are accepted too)."""
        event = getattr(event, "address", event)
        context = getattr(context, "address", context)
        return bool(self._cfunc(event, context))

    def __repr__(self) -> str:
        return f"<LlvmFilter {self.name} {self.code_bytes} bytes of code at {self.address:#x}>"

    def asm(self) -> str:
        """Host assembly of the function, as the JIT runs it."""
        with _lock:
            return _target_machine("jit", self.opt).emit_assembly(self._module)

    def object_bytes(self, *, portable: bool = False) -> bytes:
        """The module as a relocatable PIC ELF object (host CPU, or generic
        x86-64 when ``portable``)."""
        with _lock:
            tm = _target_machine("portable" if portable else "object", self.opt)
        mod = self._module.clone()
        mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
        return tm.emit_object(mod)

    def emit_object(self, path: str | os.PathLike, *, portable: bool = False) -> Path:
        """Write the object to ``path``; the symbol is ``self.name``."""
        path = Path(path)
        path.write_bytes(self.object_bytes(portable=portable))
        return path

    def emit_shared(self, path: str | os.PathLike, *, portable: bool = False) -> Path:
        """Link the object into a shared library with ``cc -shared``."""
        cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
        if not cc or not shutil.which(cc.split()[0]):
            raise FilterError("emit_shared: no C compiler found (cc, gcc; or set CC)")
        path = Path(path)
        with tempfile.TemporaryDirectory() as tmp:
            obj = self.emit_object(Path(tmp) / f"{self.name}.o", portable=portable)
            done = subprocess.run(
                [*cc.split(), "-shared", "-o", str(path), str(obj)],
                capture_output=True,
                text=True,
            )
        if done.returncode != 0:
            raise FilterError(f"emit_shared: {cc} -shared failed: {done.stderr.strip()}")
        return path

    def c_header(self) -> str:
        """C declarations for a tracer linking the filter: the prototype, the
        fields it reads (path, offset) and, when the schemas were given,
        packed structs with the exact record layouts."""
        guard = f"HWTRACE_FILTER_{self.name.upper()}_H"
        out = [
            f"/* Filter {self.name}: generated by hwtrace (LLVM tier). */",
            f"#ifndef {guard}",
            f"#define {guard}",
            "#include <stddef.h>",
            "#include <stdint.h>",
            "",
            "/* Fields the filter reads (missing data: the verdict is 0):",
        ]
        for p in self._paths:
            where = (
                f"offset {p.static_offset}" if p.static_offset is not None else f"steps {p.steps}"
            )
            root = "context" if p.root == S.ROOT_CONTEXT else "event"
            kind = p.storage + " string" if p.leaf == "string" else f"{p.leaf}{8 * p.size}"
            out.append(f" *   {root}: {_comment(p.text)}: {kind}, {where}")
        out.append(" */")
        for schema, role in zip(self._schemas, ("event", "context"), strict=True):
            if schema is not None:
                out += _c_structs(schema, f"{self.name}_{role}")
        out += [
            "",
            "/* Nonzero: record the event.  event points at a record laid out as",
            " * the event struct above, context at one laid out as the context struct. */",
            f"int64_t {self.name}(const void *event, const void *context);",
            "",
            f"#endif /* {guard} */",
            "",
        ]
        return "\n".join(out)


def _c_ident(name: str) -> str:
    ident = re.sub(r"\W", "_", name, flags=re.ASCII)
    if not ident or ident[0].isdigit() or ident in _C_KEYWORDS:
        ident = "_" + ident
    return ident


def _comment(text: str) -> str:
    return text.replace("*/", "* /")


def _c_structs(schema: S.Schema, tag: str) -> list[str]:
    """Packed C structs reproducing ``schema``'s layout byte for byte."""
    decls: list[list[str]] = []

    def declare(st: S.StructType, tag: str) -> None:
        lines = ["", f"struct {tag} {{"]
        at = pad = 0
        asserts = []
        used: set[str] = set()
        for f in st.fields:
            if f.offset < at:  # overlaps the previous member: C cannot say it
                lines.append(f"\t/* {_comment(f.name)} overlaps here: offset {f.offset} */")
                continue
            if f.offset > at:
                lines.append(f"\tuint8_t _hwtrace_pad{pad}[{f.offset - at}];")
                pad += 1
            ident = _c_ident(f.name)
            while ident in used:  # "a:b" and "a_b" both become a_b
                ident += "_"
            used.add(ident)
            decl, note = member(f.type, ident, f"{tag}_{ident}")
            comment = f"  /* {_comment(f.name)}: {note} */" if note else ""
            if ident != f.name and not note:
                comment = f"  /* {_comment(f.name)} */"
            lines.append(f"\t{decl};{comment}")
            asserts.append(
                f'_Static_assert(offsetof(struct {tag}, {ident}) == {f.offset}, "{tag}.{ident}");'
            )
            at = f.offset + f.type.fixed_size
        if st.size > at:
            lines.append(f"\tuint8_t _hwtrace_pad{pad}[{st.size - at}];")
        lines.append("} __attribute__((packed));")
        lines += asserts
        lines.append(f'_Static_assert(sizeof(struct {tag}) == {st.size}, "{tag} size");')
        decls.append(lines)

    def ctype(t: S.Type, sub_tag: str) -> tuple[str, str]:
        """(C type before the name, array suffix) of an element type."""
        if isinstance(t, S.IntType):
            return f"{'' if t.signed else 'u'}int{8 * t.size}_t", ""
        if isinstance(t, S.FloatType):
            return ("float" if t.size == 4 else "double"), ""
        if isinstance(t, S.StringType):
            if t.storage == "ptr":
                return "const char *", ""
            if t.storage == "inline":
                return "char", f"[{t.capacity}]"
            return "uint32_t", ""
        if isinstance(t, S.ArrayType):
            base, suffix = ctype(t.element, sub_tag)
            return base, f"[{t.length}]{suffix}"
        if isinstance(t, S.SequenceType):
            if t.storage == "data_loc":
                return "uint32_t", ""
            base, suffix = ctype(t.element, sub_tag)
            if suffix:
                return f"const {base} (*", f"){suffix}"
            return f"const {base} *", ""
        declare(t, sub_tag)
        return f"struct {sub_tag}", ""

    def member(t: S.Type, ident: str, sub_tag: str) -> tuple[str, str]:
        base, suffix = ctype(t, sub_tag)
        sep = "" if base.endswith(("*", "(*")) else " "
        note = ""
        if isinstance(t, S.StringType) and t.storage == "data_loc":
            note = "__data_loc char[]: offset from the record start (low 16 bits), length (high 16)"
        elif isinstance(t, S.SequenceType):
            note = (
                "__data_loc sequence: offset (low 16 bits), length in bytes (high 16)"
                if t.storage == "data_loc"
                else f"sequence, element count in {t.length_field}"
            )
        return f"{base}{sep}{ident}{suffix}", note

    declare(schema.struct, tag)
    return [line for d in decls for line in d]


def compile_llvm(
    tree: ast.Node,
    *,
    name: str = "hwtrace_filter",
    opt: int = 3,
    event_schema: S.Schema | None = None,
    context_schema: S.Schema | None = None,
) -> LlvmFilter:
    """Compile a checked tree (types and paths set) to native code.

    ``name`` is the function's symbol (a C identifier); ``opt`` the LLVM
    optimisation level 0-3.  The schemas, when given, only serve
    :meth:`LlvmFilter.c_header`.
    """
    if not _C_NAME.match(name):
        raise FilterError(f"filter name {name!r} is not a C identifier")
    if opt not in (0, 1, 2, 3):
        raise FilterError(f"optimisation level {opt} is not 0-3")
    module = ir.Module(name=name)
    with _lock:
        tm = _target_machine("jit", opt)
    module.triple = tm.triple
    module.data_layout = str(tm.target_data)
    gen = _Gen(module, name)
    try:
        gen.finish(tree)
    except RecursionError:
        raise FilterError("expression nested too deeply for the LLVM tier", column=1) from None
    # Self-contained code: no libc calls (LLVM would turn the length loop
    # into strlen), so the object links into any tracer.  llvmlite.ir knows
    # no string attributes: add it to the text.
    head = f'define i64 @"{name}"(i8* %"event", i8* %"context") nounwind'
    ir_text = str(module)
    if head not in ir_text:
        raise FilterError(f"unexpected IR header for {name}")
    ir_text = ir_text.replace(head, head + ' "no-builtins"', 1)
    paths: list[S.FieldPath] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FieldRef) and node.path is not None and node.path not in paths:
            paths.append(node.path)
    try:
        mod = llvm.parse_assembly(ir_text)
        mod.verify()
    except RuntimeError as e:  # a generator bug, not the user's: say where
        raise FilterError(f"LLVM rejected the generated IR for {name}: {e}") from None
    with _lock:
        _optimise(mod, opt)
    return LlvmFilter(name, ir_text, mod, opt, paths, event_schema, context_schema)
