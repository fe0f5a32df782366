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


# run2(fn, events, n, ctx, out): out[i] = fn(events[i], ctx) != 0 for i < n;
# run3(fn, prog, events, n, ctx, out): out[i] = fn(prog, events[i], ctx) != 0.
# x86-64 System V, assembled by GNU as from (Intel syntax; run3 at RUN3_AT):
#   run2: push rbx; push rbp; push r12; push r13; push r14; push r15; sub rsp, 8
#         mov rbx, rdi; mov rbp, rsi; mov r12, rdx; mov r13, rcx; mov r14, r8
#         xor r15d, r15d; test r12, r12; jle 2f
#     1:  mov rdi, [rbp + r15*8]; mov rsi, r13; call rbx
#         test rax, rax; setne byte ptr [r14 + r15]; inc r15; cmp r15, r12; jl 1b
#     2:  add rsp, 8; pop r15; pop r14; pop r13; pop r12; pop rbp; pop rbx; ret
#   run3: the same, prog kept at [rsp] (mov [rsp], rsi after the sub; events
#         in rbp from rdx, n r12 from rcx, ctx r13 from r8, out r14 from r9),
#         the call's arguments rdi = [rsp], rsi = [rbp + r15*8], rdx = r13.
_RUNNER_CODE = bytes.fromhex(
    "535541544155415641574883ec084889fb4889f54989d44989cd4d89c64531ff4d85e47e1a"
    "4a8b7cfd004c89eeffd34885c0430f95043e49ffc74d39e77ce64883c408415f415e415d41"
    "5c5d5bc3"
    "535541544155415641574883ec08488934244889fb4889d54989cc4d89c54d89ce4531ff4d"
    "85e47e1e488b3c244a8b74fd004c89eaffd34885c0430f95043e49ffc74d39e77ce24883c4"
    "08415f415e415d415c5d5bc3"
)
RUN3_AT = 0x4E


class _Runner:
    """``run2(fn, events, n, context, out)`` and ``run3(run, program, ...)``:
    loops calling a filter through its pointer, as machine code (a few
    dozen bytes, mapped once per process)."""

    def __init__(self) -> None:
        from .execmem import ExecBuffer

        self._code = ExecBuffer(_RUNNER_CODE)
        at = self._code.address
        self.run2 = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 5)(at)
        self.run3 = ctypes.CFUNCTYPE(None, *[ctypes.c_int64] * 6)(at + RUN3_AT)


_runner_lock = threading.Lock()
_runner_instance: _Runner | None = None


def _runner() -> _Runner:
    global _runner_instance
    with _runner_lock:
        if _runner_instance is None:
            _runner_instance = _Runner()
        return _runner_instance
