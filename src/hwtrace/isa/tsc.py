"""The x86 time stamp counter, read from compiled code.

:func:`read_tsc` is a numba intrinsic (``llvm.readcyclecounter``, which is
``rdtsc`` on x86) for loops that time themselves, such as the software
recorder's stepping loop; :func:`rdtsc` calls it from Python, as the probe
rings' clock pairs do.  It lives here, below both of them, so that neither
imports the other for it.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

__all__ = ["rdtsc", "read_tsc"]


@intrinsic
def read_tsc(typingctx):
    """The time stamp counter (``llvm.readcyclecounter``, i.e. ``rdtsc``)."""
    sig = types.uint64()

    def codegen(context, builder, signature, args):
        fnty = ir.FunctionType(ir.IntType(64), [])
        fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
        return builder.call(fn, [])

    return sig, codegen


@njit(cache=True)
def rdtsc() -> np.uint64:
    """The time stamp counter, from Python."""
    return read_tsc()
