"""Executable memory for generated machine code (the eBPF JIT, and any other
native tier that emits its own bytes).

:class:`ExecBuffer` follows the kernel's ``bpf_jit_binary_alloc``: an
anonymous page-granular mapping filled with ``int3`` (0xCC), the code copied
at a random 16-byte-aligned offset inside the slack (so a stray jump into
the mapping traps, and the code's address is not predictable from the
mapping's), then made read+execute.  W^X: the mapping is writable while the
code is copied and executable afterwards, never both at once.

mmap/mprotect/munmap are called through ctypes (libc), so nothing depends on
Python's :mod:`mmap` module allowing ``PROT_EXEC``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import secrets
import weakref
from typing import Any

PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
CODE_ALIGN = 16
#: Bytes of int3 slack at least, as the kernel's 128 (room for the random offset).
MIN_SLACK = 128

_PROT_READ, _PROT_WRITE, _PROT_EXEC = 1, 2, 4
_MAP_PRIVATE, _MAP_ANONYMOUS = 0x02, 0x20
_MAP_FAILED = ctypes.c_void_p(-1).value

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_mmap = _libc.mmap
_mmap.restype = ctypes.c_void_p
_mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_mprotect = _libc.mprotect
_mprotect.restype = ctypes.c_int
_mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_munmap = _libc.munmap
_munmap.restype = ctypes.c_int
_munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


def _os_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"executable memory: {what} failed: {os.strerror(err)}")


def _unmap(base: int, size: int) -> None:
    _munmap(base, size)


class ExecBuffer:
    """``code`` in a fresh read+execute mapping.

    ``address`` is where the code starts, ``size`` its length,
    ``memory_bytes`` the whole mapping.  ``randomize=False`` puts the code at
    the mapping's start (reproducible addresses for debugging).  The mapping
    is released by :meth:`close`, on leaving a ``with`` block, or when the
    object is collected; functions from :meth:`as_cfunc` keep it alive.
    """

    def __init__(self, code: bytes, *, randomize: bool = True) -> None:
        code = bytes(code)
        if not code:
            raise ValueError("executable memory: no code to map")
        size = -(-(len(code) + MIN_SLACK) // PAGE_SIZE) * PAGE_SIZE
        base = _mmap(None, size, _PROT_READ | _PROT_WRITE, _MAP_PRIVATE | _MAP_ANONYMOUS, -1, 0)
        if base is None or base == _MAP_FAILED:
            raise _os_error(f"mmap of {size} bytes")
        # Registered at once, so a failure below still unmaps.
        self._finalizer = weakref.finalize(self, _unmap, base, size)
        hole = size - len(code)
        offset = (secrets.randbelow(hole + 1) & ~(CODE_ALIGN - 1)) if randomize else 0
        ctypes.memset(base, 0xCC, size)
        ctypes.memmove(base + offset, code, len(code))
        if _mprotect(base, size, _PROT_READ | _PROT_EXEC) != 0:
            err = _os_error("mprotect to read+execute")
            self._finalizer()
            raise err
        self._base = base
        self._offset = offset
        self.size = len(code)
        self.memory_bytes = size

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    @property
    def address(self) -> int:
        if self.closed:
            raise ValueError("executable memory: buffer is closed")
        return self._base + self._offset

    @property
    def base(self) -> int:
        """Start of the whole mapping (int3 padding around the code)."""
        if self.closed:
            raise ValueError("executable memory: buffer is closed")
        return self._base

    @property
    def offset(self) -> int:
        """Where the code starts inside the mapping."""
        return self._offset

    def read(self) -> bytes:
        """The code as mapped (for disassembly and checks)."""
        return ctypes.string_at(self.address, self.size)

    def mapping(self) -> bytes:
        """The whole mapping, padding included."""
        return ctypes.string_at(self.base, self.memory_bytes)

    def as_cfunc(self, restype: Any, *argtypes: Any) -> Any:
        """The code as a ctypes function ``restype(*argtypes)``; it holds a
        reference to this buffer so the code stays mapped while it lives."""
        fn = ctypes.CFUNCTYPE(restype, *argtypes)(self.address)
        fn._exec_buffer = self  # type: ignore[attr-defined]
        return fn

    def close(self) -> None:
        """Unmap (idempotent).  Calling the code afterwards is a crash."""
        self._finalizer()

    def __enter__(self) -> ExecBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return "<ExecBuffer closed>"
        return f"<ExecBuffer {self.size} bytes at {self.address:#x} in {self.memory_bytes}>"
