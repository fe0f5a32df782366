"""The ptdump kernels as a native library, loaded without numba.

``import numba`` alone costs about 0.3 s, more than ``hwtrace ptdump`` needs
for a small trace.  So the two kernels ptdump runs, the streaming packet
decoder (:func:`hwtrace.pt._kernels.decode_stream`) and the text writer
(:func:`hwtrace.pt._ptdump_kernel.format_kernel`), are also compiled ahead
of time into a shared library (:mod:`hwtrace.pt._native_build`: numba's own
machine code for them, emitted through llvmlite and linked by the C
compiler), which this module loads with ctypes.  The library is built on
first use, or by ``python -m hwtrace.pt._native_build`` (``make venv``
does), into the cache directory (``$HWTRACE_CACHE_DIR``, else where
:mod:`hwtrace.kernels` keeps the other kernels' library), named by a hash of
the kernels' sources, numba's and llvmlite's versions, Python's version and
the CPU (it is built for this CPU's instruction set).

Without a C compiler, or when the build fails, the same kernels run through
numba (:class:`JitKernels`), and the reason is kept next to where the library
would be so later runs do not try again.  ``HWTRACE_KERNELS=numba`` always
uses numba; ``HWTRACE_KERNELS_AUTOBUILD=0`` uses a library only when one
was built before (as for :mod:`hwtrace.kernels`).

This module imports numpy and the standard library only.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import sys
from pathlib import Path
from typing import Protocol

import numpy as np

ENV = "HWTRACE_KERNELS"
CACHE_ENV = "HWTRACE_CACHE_DIR"
AUTOBUILD_ENV = "HWTRACE_KERNELS_AUTOBUILD"  # "0": use a library only if one is there

# The files whose code goes into the library: any change means a new one.
SOURCES = (
    "pt/_kernels.py",
    "pt/_ptdump_kernel.py",
    "pt/_native_build.py",
    "pt/_state.py",
    "pt/errors.py",
    "pt/kinds.py",
    "pt/timing.py",
    "textout.py",
    "kernels.py",
)

DECODE_SYMBOL = "hwtrace_ptdump_decode"
FORMAT_SYMBOL = "hwtrace_ptdump_format"


class Kernels(Protocol):
    """What the ptdump driver calls (see the kernels' docstrings)."""

    name: str

    def decode(self, buf, avail: int, state, rows, errs, store: bool) -> int: ...

    def format(self, rows, errs, times, raw, st, out) -> int: ...


class JitKernels:
    """The kernels through numba (compiled on first use, cached)."""

    name = "numba"

    def __init__(self) -> None:
        from . import _kernels, _ptdump_kernel

        self._decode = _kernels.decode_stream
        self._format = _ptdump_kernel.format_kernel

    def decode(self, buf, avail, state, rows, errs, store) -> int:
        return int(self._decode(buf, avail, state, rows, errs, store))

    def format(self, rows, errs, times, raw, st, out) -> int:
        return int(self._format(rows, errs, times, raw, st, out))


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


_P = ctypes.c_void_p
_N = ctypes.c_int64

# The library's C signatures (see _native_build): every array as its address
# and length.
DECODE_ARGS = (_P, _N, _N, _P) + (_P, _P, _P, _P, _P, _P, _N) + (_P, _P, _P, _N, _N)
FORMAT_ARGS = (
    (_P, _P, _P, _P, _P, _P, _N)  # packet rows
    + (_P, _P, _P, _N)  # errors
    + (_P, _P, _P, _P, _N, _P, _P, _P, _N)  # times, diagnostics
    + (_P, _N, _P, _P, _N)  # raw bytes, state, output
)


class NativeKernels:
    """The kernels from the ahead-of-time library, called through ctypes
    (which lets go of the GIL during the call)."""

    name = "native"

    def __init__(self, path: Path) -> None:
        self.path = path
        lib = ctypes.CDLL(str(path))
        self._decode = getattr(lib, DECODE_SYMBOL)
        self._decode.restype = _N
        self._decode.argtypes = DECODE_ARGS
        self._format = getattr(lib, FORMAT_SYMBOL)
        self._format.restype = _N
        self._format.argtypes = FORMAT_ARGS

    def decode(self, buf, avail, state, rows, errs, store) -> int:
        offs, kinds, sizes, a, b, c = rows
        eo, ec, ei = errs
        return self._decode(
            _addr(buf), buf.shape[0], avail, _addr(state),
            _addr(offs), _addr(kinds), _addr(sizes), _addr(a), _addr(b), _addr(c), offs.shape[0],
            _addr(eo), _addr(ec), _addr(ei), eo.shape[0], int(store),
        )  # fmt: skip

    def format(self, rows, errs, times, raw, st, out) -> int:
        offs, kinds, sizes, a, b, c = rows
        at, eo, ec = errs
        tsc, have_tsc, fcr, have_fcr, dat, dkind, derr = times
        return self._format(
            _addr(offs), _addr(kinds), _addr(sizes), _addr(a), _addr(b), _addr(c), offs.shape[0],
            _addr(at), _addr(eo), _addr(ec), at.shape[0],
            _addr(tsc), _addr(have_tsc), _addr(fcr), _addr(have_fcr), tsc.shape[0],
            _addr(dat), _addr(dkind), _addr(derr), dat.shape[0],
            _addr(raw), raw.shape[0], _addr(st), _addr(out), out.shape[0],
        )  # fmt: skip


def cache_dir() -> Path:
    """``$HWTRACE_CACHE_DIR``, else where :func:`hwtrace.kernels.library_dir`
    keeps the other kernels' library (the package's ``__pycache__`` when
    writable, else the user's cache), found here without importing that
    module (it costs ptdump's start-up a tenth of its time)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    here = Path(__file__).resolve().parent.parent / "__pycache__"
    if os.access(here if here.exists() else here.parent, os.W_OK):
        return here
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hwtrace"


def _cpu_id() -> bytes:
    """The first processor's description (model and instruction-set flags):
    the library is compiled for them."""
    try:
        with open("/proc/cpuinfo", "rb") as f:
            head = f.read(1 << 16).split(b"\n\n", 1)[0]
    except OSError:
        head = b""
    keep = (b"vendor_id", b"cpu family", b"model", b"flags", b"Features", b"CPU part")
    lines = [ln for ln in head.splitlines() if ln.split(b":", 1)[0].strip() in keep]
    return b"\n".join(lines) + os.uname().machine.encode()


def _package_version_file(name: str) -> bytes:
    """A package's version file, read without importing the package (and
    without importlib's finders: hwtrace.kernels watches for numba's
    import there)."""
    for entry in sys.path:
        try:
            return (Path(entry or ".") / name / "_version.py").read_bytes()
        except OSError:
            continue
    return name.encode()


def library_key() -> str:
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for rel in SOURCES:
        h.update(rel.encode())
        h.update((root / rel).read_bytes())
    h.update(_package_version_file("numba"))
    h.update(_package_version_file("llvmlite"))
    h.update(sys.version.encode())
    h.update(_cpu_id())
    return h.hexdigest()[:20]


def library_path(key: str | None = None) -> Path:
    return cache_dir() / f"ptdump-kernels-{key or library_key()}.so"


_chosen: Kernels | None = None


def kernels() -> Kernels:
    """The kernels for this process: the native library when it exists or
    can be built now, else numba's."""
    global _chosen
    if _chosen is None:
        _chosen = _choose()
    return _chosen


def _choose() -> Kernels:
    if os.environ.get(ENV, "") == "numba":
        return JitKernels()
    try:
        path = library_path()
    except OSError:
        return JitKernels()
    if not path.is_file():
        failed = path.with_suffix(".failed")
        if failed.is_file() or os.environ.get(AUTOBUILD_ENV) == "0":
            return JitKernels()
        try:
            from ._native_build import build_if_missing

            build_if_missing(path)
        except Exception as exc:  # no compiler, a read-only cache, ...: use numba
            _remember_failure(failed, exc)
            return JitKernels()
        if not path.is_file():  # another process is building it
            return JitKernels()
    try:
        return NativeKernels(path)
    except (OSError, AttributeError) as exc:
        _remember_failure(path.with_suffix(".failed"), exc)
        return JitKernels()


def _remember_failure(failed: Path, exc: BaseException) -> None:
    try:
        failed.parent.mkdir(parents=True, exist_ok=True)
        failed.write_text(f"{type(exc).__name__}: {exc}\n")
    except OSError:
        pass


def use(k: Kernels | None) -> None:
    """Make ``k`` the kernels of this process (None: choose again); for tests."""
    global _chosen
    _chosen = k


__all__ = ["JitKernels", "Kernels", "NativeKernels", "kernels", "library_key", "library_path"]
