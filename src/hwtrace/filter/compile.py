"""``compile_filter``: one filter expression, any tier, one calling contract.

Tiers (docs/filter-design.md):

``lttng``     LTTng-style bytecode in a native interpreter (the baseline of
              Sharma and Dagenais, JCST 2016; docs/filter-design.md)
``ebpf``      eBPF in the native userspace interpreter (verified)
``ebpf-jit``  eBPF through the x86-64 template JIT (verified)
``llvm``      LLVM-optimised native code, strings compared inline

Every :class:`CompiledFilter` is callable from Python (``f(event,
context)``), runs batches in a native loop (:meth:`CompiledFilter.run_many`)
and gives C function pointers: ``address`` (``int64 f(const void *event,
const void *context)``) for native tiers, ``run_address`` with
``program_address`` (``int64 run(const void *program, const void *event,
const void *context)``) for interpreters.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir

from . import ast
from .check import compile_check
from .errors import FilterError
from .schema import DEFAULT_CONTEXT, Schema

Tier = Literal["lttng", "ebpf", "ebpf-jit", "llvm"]
TIERS: tuple[str, ...] = ("lttng", "ebpf", "ebpf-jit", "llvm")
# Where an expression too big for eBPF goes instead: the same kind of tier.
_FALLBACK = {"ebpf": "lttng", "ebpf-jit": "llvm"}


@dataclass
class CompiledFilter:
    """A filter compiled for one tier (see the module docstring)."""

    expression: str
    tier: str
    tree: ast.Node
    event: Schema
    context: Schema
    memory_bytes: int
    address: int | None = None
    run_address: int | None = None
    program_address: int | None = None
    note: str = ""  # e.g. why another tier than the one asked for was used
    impl: Any = field(default=None, repr=False)  # keeps code and tables alive

    @property
    def native(self) -> bool:
        return self.address is not None

    def __call__(self, event: Any, context: Any = 0) -> bool:
        return bool(self.impl(event, context))

    def run_many(self, events: np.ndarray, context: int = 0) -> np.ndarray:
        """Verdicts (bool) for records at ``events`` (uint64 addresses), all
        evaluated in one native loop."""
        events = np.ascontiguousarray(events, dtype=np.uint64)
        out = np.zeros(events.shape[0], np.uint8)
        if self.address is not None:
            _runner().run2(
                self.address, events.ctypes.data, events.shape[0], context, out.ctypes.data
            )
        else:
            _runner().run3(
                self.run_address,
                self.program_address,
                events.ctypes.data,
                events.shape[0],
                context,
                out.ctypes.data,
            )
        return out.view(np.bool_)


def compile_filter(
    expression: str,
    schema: Schema,
    tier: Tier = "ebpf-jit",
    *,
    context: Schema = DEFAULT_CONTEXT,
    unknown: Literal["error", "false"] = "error",
    fallback: bool = True,
) -> CompiledFilter:
    """Compile ``expression`` for events of ``schema`` to ``tier``.

    Raises :class:`FilterError` for syntax, type and field errors (with the
    column).  An expression beyond eBPF's instruction limit goes, with
    ``fallback``, to the matching tier (``ebpf`` to ``lttng``, ``ebpf-jit``
    to ``llvm``) and ``note`` says so; without it the limit is an error.
    """
    if tier not in TIERS:
        raise FilterError(f"unknown tier {tier!r}: choose one of {', '.join(TIERS)}")
    tree = compile_check(expression, schema, context, unknown=unknown)
    note = ""
    if tier in ("ebpf", "ebpf-jit"):
        from .ebpf.gen import generate

        try:
            program = generate(tree, schema, context, name="filter")
        except FilterError as e:
            if not fallback or "limit" not in e.message:
                if e.expression is None:
                    e.expression = expression
                raise
            note = f"{e.message}: compiled with the {_FALLBACK[tier]} tier instead"
            tier = _FALLBACK[tier]  # type: ignore[assignment]
        else:
            linked = program.link()
            if tier == "ebpf":
                from .ebpf import interp

                return CompiledFilter(
                    expression, tier, tree, schema, context, linked.memory_bytes,
                    run_address=interp.run_address, program_address=linked.descriptor_address,
                    impl=linked,
                )  # fmt: skip
            from .ebpf.jit import jit_compile

            code = jit_compile(linked)
            return CompiledFilter(
                expression, tier, tree, schema, context,
                code.memory_bytes + linked.memory_bytes, address=code.address, impl=code,
            )  # fmt: skip
    if tier == "lttng":
        from .lttng import generate as lttng_generate

        prog = lttng_generate(tree)
        return CompiledFilter(
            expression, tier, tree, schema, context, prog.memory_bytes,
            run_address=prog.run_address, program_address=prog.program_address,
            note=note, impl=prog,
        )  # fmt: skip
    from .llvm import compile_llvm

    fn = compile_llvm(tree, event_schema=schema, context_schema=context)
    return CompiledFilter(
        expression, "llvm", tree, schema, context, fn.memory_bytes,
        address=fn.address, note=note, impl=fn,
    )  # fmt: skip


# -- native batch loops -------------------------------------------------------------------


class _Runner:
    """``run2(fn, events, n, context, out)`` and ``run3(run, program, ...)``:
    loops calling a filter through its pointer, as machine code (one small
    LLVM module per process)."""

    def __init__(self) -> None:
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        mod = ir.Module("hwtrace_filter_runner")
        mod.triple = llvm.get_process_triple()
        self._define(mod, "run2", 2)
        self._define(mod, "run3", 3)
        target = llvm.Target.from_default_triple()
        machine = target.create_target_machine(opt=2)
        parsed = llvm.parse_assembly(str(mod))
        parsed.verify()
        self._engine = llvm.create_mcjit_compiler(parsed, machine)
        self._engine.finalize_object()
        proto2 = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 5)
        proto3 = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 6)
        self.run2 = proto2(self._engine.get_function_address("run2"))
        self.run3 = proto3(self._engine.get_function_address("run3"))

    @staticmethod
    def _define(mod: ir.Module, name: str, arity: int) -> None:
        i64, i8 = ir.IntType(64), ir.IntType(8)
        # run2(fn, events, n, ctx, out) / run3(fn, prog, events, n, ctx, out)
        nargs = 5 if arity == 2 else 6
        fn = ir.Function(mod, ir.FunctionType(ir.VoidType(), [i64] * nargs), name)
        args = list(fn.args)
        target, rest = args[0], args[1:]
        prog = None
        if arity == 3:
            prog, rest = rest[0], rest[1:]
        events, n, ctx, out = rest
        entry, loop, done = (
            fn.append_basic_block("entry"),
            fn.append_basic_block("loop"),
            fn.append_basic_block("done"),
        )
        b = ir.IRBuilder(entry)
        ftype = ir.FunctionType(i64, [i64] * arity)
        callee = b.inttoptr(target, ftype.as_pointer())
        ev_ptr = b.inttoptr(events, i64.as_pointer())
        out_ptr = b.inttoptr(out, i8.as_pointer())
        b.cbranch(b.icmp_signed(">", n, i64(0)), loop, done)
        b.position_at_end(loop)
        i = b.phi(i64)
        i.add_incoming(i64(0), entry)
        ev = b.load(b.gep(ev_ptr, [i]))
        r = b.call(callee, [prog, ev, ctx] if prog is not None else [ev, ctx])
        b.store(b.zext(b.icmp_signed("!=", r, i64(0)), i8), b.gep(out_ptr, [i]))
        nxt = b.add(i, i64(1))
        i.add_incoming(nxt, loop)
        b.cbranch(b.icmp_signed("<", nxt, n), loop, done)
        b.position_at_end(done)
        b.ret_void()


_runner_lock = threading.Lock()
_runner_instance: _Runner | None = None


def _runner() -> _Runner:
    global _runner_instance
    with _runner_lock:
        if _runner_instance is None:
            _runner_instance = _Runner()
        return _runner_instance
