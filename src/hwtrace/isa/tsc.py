"""The x86 time stamp counter, read from compiled code and from Python.

:func:`read_tsc` is a numba intrinsic (``llvm.readcyclecounter``, which is
``rdtsc`` on x86) for loops that time themselves, such as the software
recorder's stepping loop; it is made when first imported, so that
:func:`rdtsc`, which reads the counter from Python (the recorders' and
probe rings' clock pairs) through four instructions of machine code
called with ctypes, does not import numba.  Both live here, below their
users, so that neither imports the other for them.
"""

from __future__ import annotations

import ctypes
import mmap
from typing import Any

__all__ = ["rdtsc", "read_tsc"]  # noqa: F822 (read_tsc: made on first import)

_RDTSC_CODE = bytes.fromhex("0f31 48c1e220 4809d0 c3")  # rdtsc; shl rdx, 32; or rax, rdx; ret
_reader: Any = None
_page: mmap.mmap | None = None


def rdtsc() -> int:
    """The time stamp counter, from Python."""
    global _reader, _page
    if _reader is None:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        page.write(_RDTSC_CODE)
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        if libc.mprotect(address, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            raise OSError(ctypes.get_errno(), "mprotect of the rdtsc reader")
        _page = page  # kept mapped while the reader lives
        _reader = ctypes.CFUNCTYPE(ctypes.c_uint64)(address)
    return int(_reader())


def __getattr__(name: str) -> Any:
    if name != "read_tsc":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def read_tsc(typingctx):
        """The time stamp counter (``llvm.readcyclecounter``, i.e. ``rdtsc``)."""
        sig = types.uint64()

        def codegen(context, builder, signature, args):
            fnty = ir.FunctionType(ir.IntType(64), [])
            fn = builder.module.declare_intrinsic("llvm.readcyclecounter", fnty=fnty)
            return builder.call(fn, [])

        return sig, codegen

    globals()["read_tsc"] = read_tsc
    return read_tsc
