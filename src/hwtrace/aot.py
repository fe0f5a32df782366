"""Compiled loops: numba functions with an ahead-of-time native library.

hwtrace's per-byte and per-instruction work is written for numba.  Numba
compiles on first use and caches the machine code, but a process still pays
for loading it: about 0.3 s for ``import numba`` and 0.3 s more to load the
cached code of the first few loops it calls (numba sets up its typing and
code generation for that).  A command-line tool that decodes a small trace
in 0.1 s spends most of its time there.

:func:`njit` is numba's ``njit`` for the loops Python calls.  Each call
first looks for the loop, specialised for the arguments' types, in a
native library (``libhwtrace-aot-*.so``) built ahead of time from
numba's own code (:func:`build`): the loop's LLVM IR and everything it
calls, linked into one module, emitted as position-independent machine code
and linked into a shared object.  It is called through ctypes (which
releases the GIL, as ``nogil`` loops do), with the arguments laid out as
numba's native calling convention lays them out.  When the library is
missing, out of date or lacks that specialisation, the call goes to numba.

The library is built by ``python -m hwtrace.aot build``, and after any
``hwtrace`` command that had to call numba (see :func:`note_fallback`), for
every specialisation in numba's cache; ``hwtrace aot warm``
(``make venv``) first compiles what ptdump, ptxed and the library decoder
call (:mod:`hwtrace.cli.warmup`).  ``HWTRACE_CACHE_DIR`` says where the
library is kept.  Its manifest records the size and
modification time of every loop source file: a library older than the
sources is ignored.  ``HWTRACE_AOT=numba`` turns the library off.

A loop declared ``njit(..., c_args=N)`` is also a C function of ``N``
``int64`` arguments returning ``int64``, for machine code that calls it
(:func:`c_address`): the library holds it with a C trampoline.

A module naming the loops Python calls in ``AOT_ENTRIES`` makes its other
loops internal: the library builds them only into their callers, and numba
compiles them to bitcode alone, making their machine code only if Python
ever asks for it (:func:`_linking_only_compiler`): their callers link and
emit their own copy in any case.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import marshal
import operator
import os
import struct
import sys
import threading
import weakref
from collections.abc import Callable
from types import FunctionType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import numpy as np

# The modules whose loops go into the library.
LOOP_MODULES = (
    "hwtrace.pt._loops",
    "hwtrace.pt.timing",
    "hwtrace.isa.quick",
    "hwtrace.pt.codetable",
    "hwtrace.pt.flowrows",
    "hwtrace.pt._flowloop",
    "hwtrace.pt._window",
    "hwtrace.pt.blocks",
    "hwtrace.pt.decode",
    "hwtrace.pt.ptxed",
    "hwtrace.pt.ptdump",
    "hwtrace.pt._ptdump_loop",
    "hwtrace.textout",
    "hwtrace.analysis.latency",
    "hwtrace.image._lookup",
    "hwtrace.image._perftree",
    "hwtrace.perf._loops",
    "hwtrace.perf.rewrite",
    "hwtrace.pt.codeindex",
    "hwtrace.pt.render",
    "hwtrace.pt.select",
    "hwtrace.textout.perfscript",
    "hwtrace.session.callcut",
    "hwtrace.session.perftime",
    "hwtrace.session._attribution",
    "hwtrace.session.listing",
    "hwtrace.analysis.callpath",
    "hwtrace.analysis.profile",
    "hwtrace.analysis.vm",
    "hwtrace.hwevents.ptw",
    "hwtrace.pt.encode",
    "hwtrace.pt.bcache",
    "hwtrace.analysis.timeline",
    "hwtrace.export.timeline",
    "hwtrace.record._native",
    "hwtrace.filter.native",
    "hwtrace.filter.lttng_vm",
    "hwtrace.filter.ebpf.interp",
    "hwtrace.filter.inputs.base",
    "hwtrace.filter.listing",
    "hwtrace.filter.ftrace_raw",
    "hwtrace.kernel.ringbuf",
    "hwtrace.ktrace.output",
    "hwtrace.export._parquet_pages",
    "hwtrace.hwevents.csframes",
    "hwtrace.hwevents.etm4",
    "hwtrace.hwevents.etm4text",
    "hwtrace.hwevents.frametext",
    "hwtrace.hwevents.stp",
    "hwtrace.hwevents.stptext",
)

_LIB_NAME = "libhwtrace-aot"
_ENV = "HWTRACE_AOT"
_registry: dict[str, CompiledLoop] = {}
_lock = threading.Lock()
_library: _Library | bool | None = False  # False: not looked for yet
_fallbacks: set[str] = set()
_built = False  # note_fallback built the library in this process


def _enabled() -> bool:
    return os.environ.get(_ENV, "") != "numba"


# -- where the library lives ---------------------------------------------------


# (Paths as strings where a command's start goes: pathlib and what it
# imports take a few milliseconds.)


def user_cache_path() -> str:
    """hwtrace's directory in the user's cache: ``$HWTRACE_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/hwtrace`` (``~/.cache/hwtrace``)."""
    explicit = os.environ.get("HWTRACE_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hwtrace")


def user_cache_dir() -> Path:
    """:func:`user_cache_path` as a :class:`~pathlib.Path`."""
    from pathlib import Path

    return Path(user_cache_path())


def _library_path() -> str:
    if os.environ.get("HWTRACE_CACHE_DIR"):
        return user_cache_path()
    package = os.path.dirname(os.path.realpath(__file__))
    here = os.path.join(package, "__pycache__")
    if os.access(here if os.path.exists(here) else package, os.W_OK):
        return here
    return user_cache_path()


def library_dir() -> Path:
    """``$HWTRACE_CACHE_DIR``; else next to the package's numba cache when
    writable, else the user's cache directory."""
    from pathlib import Path

    return Path(_library_path())


def _platform_tag() -> str:
    return f"py{sys.version_info[0]}{sys.version_info[1]}-{os.uname().machine}"


def _manifest_path() -> str:
    return os.path.join(_library_path(), f"{_LIB_NAME}-{_platform_tag()}.json")


def _stamps(paths) -> dict[str, list[int]]:
    out = {}
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        out[str(path)] = [st.st_mtime_ns, st.st_size]
    return out


def _source_files(modules: tuple = ()) -> list[str]:
    """The files a library's code can come from: ``modules`` and every
    hwtrace module their globals come from, transitively (loops inline
    functions and fold constants from their imports)."""
    seen: set[str] = set()
    todo = list(modules)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        mod = sys.modules.get(name)
        if mod is None:
            continue
        seen.add(name)
        for value in list(vars(mod).values()):
            dep = (
                value.__name__
                if isinstance(value, type(sys))
                else getattr(value, "__module__", None)
            )
            if isinstance(dep, str) and (dep == "hwtrace" or dep.startswith("hwtrace.")):
                todo.append(dep)
    files = {os.path.abspath(sys.modules[n].__file__) for n in seen if sys.modules[n].__file__}
    return sorted(files)


# -- argument types and layout -------------------------------------------------
#
# A specialisation is keyed by the arguments' types as numba sees them
# (numba.typeof): arrays by dtype, dimensions, layout, read-only and
# alignment; Python ints as int64 (uint64 past its range), floats as
# float64; tuples item by item.


def _dtype_key(dt: np.dtype) -> str:
    # Records by their fields: two record types may share a size.
    return dt.str if dt.fields is None else repr(dt.descr)


# Arrays' keys, each one object.
_array_keys: dict[tuple, tuple] = {}

# Per dtype object (held, so that its id stays its own): its key and
# whether numba takes its arrays as aligned (all but records of a packed
# struct dtype).  A dtype's string costs more than the lookup.
_dtype_keys: dict[int, tuple] = {}


def _array_key(a: np.ndarray, f=None) -> tuple:
    if f is None:
        f = a.flags
    layout = "C" if f.c_contiguous else ("F" if f.f_contiguous else "A")
    dt = a.dtype
    known = _dtype_keys.get(id(dt))
    if known is None or known[0] is not dt:
        known = (dt, _dtype_key(dt), dt.fields is None or dt.isalignedstruct)
        if len(_dtype_keys) > 4096:
            _dtype_keys.clear()
        _dtype_keys[id(dt)] = known
    key = ("a", known[1], a.ndim, layout, not f.writeable, known[2])
    # (one object per key: a loop's key is found again by identity, see
    # CompiledLoop._layout, not hashed anew)
    return _array_keys.setdefault(key, key)


# Python scalars' keys, one object each: a loop's key is looked up again
# only when an argument's key is not the very object of the last call's.
_KEY_BOOL, _KEY_I8, _KEY_U8, _KEY_NONE = ("s", "|b1"), ("s", "<i8"), ("s", "<u8"), ("n",)
_scalar_keys: dict[str, tuple] = {"|b1": _KEY_BOOL, "<i8": _KEY_I8, "<u8": _KEY_U8}


def _value_key(v) -> Any:
    if isinstance(v, tuple):
        return tuple(_value_key(x) for x in v)
    if isinstance(v, bool):
        return _KEY_BOOL
    if isinstance(v, int):
        return _KEY_I8 if -(1 << 63) <= v < (1 << 63) else _KEY_U8
    if v is None:
        return _KEY_NONE
    # numpy is loaded if v is one of its objects (a command without numpy
    # passes Buffers and Python scalars only).
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(v, np.ndarray):
            return _array_key(v)
        if isinstance(v, np.bool_):
            return _KEY_BOOL
        if isinstance(v, np.generic):
            code = v.dtype.str
            key = _scalar_keys.get(code)
            if key is None:
                key = _scalar_keys[code] = ("s", code)
            return key
    if isinstance(v, float):
        return ("s", "<f8")
    return ("?", type(v).__name__)


_char_at = ctypes.c_char.from_buffer
_address_of = ctypes.addressof


def _flat_array(a: np.ndarray, f=None) -> list[int]:
    # numba's array model: meminfo, parent, nitems, itemsize, data, shape,
    # strides (the native calling convention flattens it to scalars).
    if f is None:
        f = a.flags
    if f.writeable and f.c_contiguous and a.size and a.dtype.fields is None:
        # (a writable contiguous buffer's address, without numpy's ctypes
        # object: a fifth of the time; not for records, whose buffer
        # format numpy spells out field by field, 50 us for the decoder's
        # state, nor where the buffer protocol would refuse: an exception
        # costs more than numpy's object)
        data = _address_of(_char_at(a))
    else:
        data = a.ctypes.data
    return [0, 0, a.size, a.itemsize, data, *a.shape, *a.strides]


class _ArrayRef(weakref.ref):
    """The weak reference an array's laid-out part holds, which forgets
    the part when the array goes (its memo key kept: no closure per
    array)."""

    __slots__ = ("ident",)


# Arrays' parts (held, key, words) by identity (an array's buffer and shape
# never change).  Loops are mostly given arrays made for the call (a
# batch's columns): a part costs one reference and one pass over the
# array's attributes.
_array_parts: dict[int, tuple] = {}


def _forget_array(ref: _ArrayRef, _pop=_array_parts.pop) -> None:
    # (the dict's method bound here: an array a script keeps in a global
    # goes while the interpreter exits, after this module's globals)
    _pop(ref.ident, None)


def _array_part(a: np.ndarray) -> tuple:
    ident = id(a)
    hit = _array_parts.get(ident)
    if hit is not None and hit[0]() is a:
        return hit
    f = a.flags
    ref = _ArrayRef(a, _forget_array)
    ref.ident = ident
    part = (ref, _array_key(a, f), _flat_array(a, f))
    _array_parts[ident] = part
    return part


_REFS = (weakref.ref, _ArrayRef)


def _same(held, v) -> bool:
    """Is ``v`` the very argument ``held`` was made of?  (Called for every
    argument of every loop call: the leaves of a tuple, mostly arrays, are
    compared here without a call each.)"""
    kind = type(held)
    if kind in _REFS:
        return held() is v
    if kind is tuple:
        if type(v) is not tuple or len(v) != len(held):
            return False
        for h, x in zip(held, v, strict=False):  # lengths checked above
            if type(h) in _REFS:
                if h() is not x:
                    return False
            elif not _same(h, x):
                return False
        return True
    return held is v


def _part(v) -> tuple:
    """An argument laid out: ``(what is held of it, its type key, its
    words in numba's native layout)``; arrays (and the arrays in tuples)
    are held weakly, so that a buffer the caller lets go (a ring buffer's
    mapping of a kernel map) goes with it."""
    if _is_ndarray(v):
        return _array_part(v)
    if isinstance(v, tuple):
        held, keys, flat = [], [], []
        for x in v:
            h, k, f = _part(x)
            held.append(h)
            keys.append(k)
            flat += f
        return tuple(held), tuple(keys), flat
    if isinstance(v, Buffer):
        return weakref.ref(v), v.key, v.flat
    k = _value_key(v)
    if k[0] == "s" and k[1][1] == "f":
        return v, k, [float(v)]
    return v, k, [] if v is None else [int(v)]


def _flatten(v, keys: list, flat: list) -> None:
    _, k, f = _part(v)
    keys.append(k)
    flat += f


_ndarray: type | None = None  # numpy's, once numpy is loaded


def _is_ndarray(v) -> bool:
    global _ndarray
    if _ndarray is None:
        np = sys.modules.get("numpy")
        if np is None:
            return False
        _ndarray = np.ndarray
    return isinstance(v, _ndarray)


class Buffer:
    """A one-dimensional C array for a loop, without numpy: ``length``
    items of the ctypes type ``ctype`` (numpy's type string ``dtype``, or
    ``repr(dtype.descr)`` of a ``record`` type), zeroed; or a view of
    ``base``'s items from ``start`` on.  For commands that call the
    native library before (or without) importing numpy."""

    def __init__(self, ctype, length: int, dtype: str, *, record: bool = False,
                 base: Buffer | None = None, start: int = 0) -> None:  # fmt: skip
        self.ctype, self.length, self.dtype = ctype, length, dtype
        self.itemsize = ctypes.sizeof(ctype)
        if base is None:
            # (an empty array still has an address, as numpy's do)
            self.storage: Any = (ctype * max(length, 1))()
            self.address = ctypes.addressof(self.storage)
        else:
            self.storage = base.storage
            self.address = base.address + start * self.itemsize
        self.record = record
        # (numba's arrays are "aligned" but for records of a packed struct)
        self.key = ("a", dtype, 1, "C", False, not record)
        self.flat = [0, 0, length, self.itemsize, self.address, length, self.itemsize]

    def __len__(self) -> int:
        return self.length

    def view(self, start: int, stop: int) -> Buffer:
        """Items ``start`` to ``stop``, sharing this buffer's memory."""
        return Buffer(self.ctype, stop - start, self.dtype, record=self.record, base=self,
                      start=start)  # fmt: skip

    def memory(self) -> memoryview:
        """The items as a writable memoryview of bytes."""
        size = self.length * self.itemsize
        return memoryview((ctypes.c_char * max(size, 1)).from_address(self.address)).cast("B")[
            :size
        ]


class NativeLoop:
    """A loop of the native library called by name (``module:function``)
    without importing its module (nor numpy): arguments are
    :class:`Buffer`, Python scalars and tuples of them."""

    def __init__(self, name: str) -> None:
        self.name = name
        lib = _load_library()
        self.entries = lib.entries(name) if lib is not None else {}

    def entry(self, *args) -> Callable[..., Any] | None:
        """The library's code for these arguments' types, if it has it: a
        function of the same arguments."""
        keys: list = []
        for a in args:
            _flatten(a, keys, [])
        entry = self.entries.get(tuple(keys))
        if entry is None:
            return None

        def call(*values):
            flat: list = []
            for a in values:
                _flatten(a, [], flat)
            return entry(flat)

        return call


# -- the library ---------------------------------------------------------------

_CTYPES = {
    "ptr": ctypes.c_void_p,
    "i1": ctypes.c_bool,
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}
_RET_CTYPES = {
    "|b1": ctypes.c_uint8, "|i1": ctypes.c_int8, "|u1": ctypes.c_uint8,
    "<i2": ctypes.c_int16, "<u2": ctypes.c_uint16, "<i4": ctypes.c_int32,
    "<u4": ctypes.c_uint32, "<i8": ctypes.c_int64, "<u8": ctypes.c_uint64,
    "<f4": ctypes.c_float, "<f8": ctypes.c_double,
}  # fmt: skip


def _from_json(k):
    return tuple(_from_json(x) for x in k) if isinstance(k, list) else k


class _Entry:
    """One specialisation's native code: a C function with numba's native
    calling convention, ``status f(ret *, excinfo **, args...)``, whose
    arguments are the LLVM types ``args`` and whose result has the layout
    ``ret`` (None, a scalar dtype, or a list of them)."""

    def __init__(self, fn, name: str, args: list[str], ret) -> None:
        self.name = name
        self.fn = fn
        self.args = args
        # (set by use_packed: the library's trampoline, the float
        # arguments' positions, each thread's words)
        self.packed = None
        self.reals: dict[int, str] = {}
        self._local: threading.local | None = None
        if ret is None:
            self.ret_type = ctypes.c_int64
            self.unpack: Callable = lambda r: None
        elif isinstance(ret, str):
            self.ret_type = _RET_CTYPES[ret]
            conv = bool if ret == "|b1" else (lambda x: x)
            self.unpack = lambda r: conv(r.value)
        else:
            fields = [(f"f{i}", _RET_CTYPES[t]) for i, t in enumerate(ret)]
            self.ret_type = type("Ret", (ctypes.Structure,), {"_fields_": fields})
            names = [f for f, _ in fields]
            bools = [t == "|b1" for t in ret]
            if any(bools):
                self.unpack = lambda r: tuple(
                    bool(getattr(r, n)) if b else getattr(r, n)
                    for n, b in zip(names, bools, strict=True)
                )
            else:
                # (the fields in one call: a loop's answer, a few numbers)
                get = operator.attrgetter(*names)
                self.unpack = get if len(names) > 1 else lambda r: (get(r),)

    @classmethod
    def from_library(cls, lib: ctypes.CDLL, name: str, spec: dict) -> _Entry:
        fn = getattr(lib, spec["symbol"])
        fn.restype = ctypes.c_int32
        entry = cls(fn, name, spec["args"], spec["ret"])
        if spec.get("packed"):
            packed = getattr(lib, spec["packed"])
            packed.restype = ctypes.c_int32
            packed.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            entry.use_packed(packed)
        return entry

    def use_packed(self, packed) -> None:
        """Call through ``packed``, the library's ``status f(ret *,
        excinfo **, uint64_t *words)`` that passes the words on as the
        arguments (see :func:`_packed_trampoline`): ctypes converts one
        pointer instead of every argument (a loop taking tuples of arrays
        has hundreds: 100 us a call), and of the words only those of
        arguments that changed since the thread's last call are written."""
        self.packed = packed
        args = self.args
        if "double" in args or "float" in args:
            self.reals = {j: t for j, t in enumerate(args) if t in ("double", "float")}
        self._local = threading.local()

    def call_parts(self, parts: list):
        """Call with the arguments as :meth:`CompiledLoop._layout` lays them
        out: ``(argument, key, words)`` each, the very tuple of the last
        call for an argument that did not change."""
        if self.packed is None:
            return self(_words_of(parts))
        local = self._local
        words = getattr(local, "words", None)
        if words is None:
            words = local.words = (ctypes.c_uint64 * max(len(self.args), 1))()
            local.parts = []
        written = local.parts
        if len(written) != len(parts):
            written[:] = [None] * len(parts)
        at = 0
        for i, p in enumerate(parts):
            values = p[2]
            k = len(values)
            if written[i] is not p:
                if self.reals and any(at <= j < at + k for j in self.reals):
                    values = [self._word(at + n, v) for n, v in enumerate(values)]
                words[at : at + k] = values
                written[i] = p
            at += k
        ret = self.ret_type()
        exc = ctypes.c_void_p()
        status = self.packed(ctypes.byref(ret), ctypes.byref(exc), words)
        if status == 0:
            return self.unpack(ret)
        if status == -2:
            return None
        raise _exception(self.name, status, exc)

    def _word(self, j: int, v) -> int:
        t = self.reals.get(j)
        if t == "double":
            return struct.unpack("<Q", struct.pack("<d", v))[0]
        if t == "float":
            return struct.unpack("<I", struct.pack("<f", v))[0]
        return v

    @classmethod
    def from_address(cls, address: int, name: str, args: list[str], ret) -> _Entry:
        proto = ctypes.CFUNCTYPE(
            ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, *[_CTYPES[t] for t in args]
        )
        return cls(proto(address), name, args, ret)

    def __call__(self, flat: list):
        fn = self.fn
        if fn.argtypes is None:
            # (Set at the first call of this kind: a call through the
            # trampoline never converts the arguments one by one, and a
            # loop's hundreds of types cost a command's start.)
            fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p] + [_CTYPES[t] for t in self.args]
        ret = self.ret_type()
        exc = ctypes.c_void_p()
        status = fn(ctypes.byref(ret), ctypes.byref(exc), *flat)
        if status == 0:
            return self.unpack(ret)
        if status == -2:
            return None
        raise _exception(self.name, status, exc)


def _words_of(parts: list) -> list:
    """The arguments' values laid out by :meth:`CompiledLoop._layout`, in
    one list."""
    flat: list = []
    for p in parts:
        flat += p[2]
    return flat


class _ExcInfo(ctypes.Structure):
    _fields_ = (("data", ctypes.c_void_p), ("size", ctypes.c_int32))


def _exception(name: str, status: int, exc: ctypes.c_void_p) -> BaseException:
    """The exception a loop raised (numba keeps it pickled in static
    data; see numba.core.callconv)."""
    if status > 0 and exc.value:
        info = _ExcInfo.from_address(exc.value)
        try:
            import pickle

            cls, args, *_ = pickle.loads(ctypes.string_at(info.data, info.size))
            if isinstance(cls, type) and issubclass(cls, BaseException):
                return cls(*(args or ()))
        except Exception:
            pass
    return RuntimeError(f"compiled loop {name} failed (status {status})")


class _Library:
    """The native libraries a manifest lists (one per build since the
    sources last changed; each build adds only what the others lack)."""

    def __init__(self, libraries: list[str], skipped: list[str],
                 by_loop: dict[str, list[dict] | bytes], directory: str) -> None:  # fmt: skip
        self.dlls = {name: ctypes.CDLL(os.path.join(directory, name)) for name in libraries}
        self.path = os.path.join(directory, libraries[-1])
        for name, value in _global_values.items():
            self.set_global(name, value)
        # Loops some specialisation of which numba keeps (they allocate,
        # or return arrays): calling numba for those is no reason to build.
        self.numba_only = {s.split("(", 1)[0] for s in skipped}
        # By loop (marshalled until the loop is first called: a command
        # calls a few of the loops); a spec's key from the manifest (nested
        # lists, as JSON has them) becomes a tuple then too.
        self.raw = by_loop

    def set_global(self, name: str, value: int) -> None:
        """Set each of the libraries' copies of the global ``name``."""
        for dll in self.dlls.values():
            try:
                ctypes.c_int64.in_dll(dll, name).value = value
            except ValueError:  # (a library none of whose loops read it)
                continue

    def _specs(self, name: str) -> dict:
        raw = self.raw.get(name, [])
        if not isinstance(raw, list):  # (marshalled: from the index)
            try:
                raw = marshal.loads(raw)
            except (EOFError, ValueError, TypeError):
                raw = []  # (a damaged index: the loop goes through numba)
            self.raw[name] = raw
        # (The index keeps the keys as tuples; the manifest as JSON lists.)
        return {k if isinstance(k := spec["key"], tuple) else _from_json(k): spec for spec in raw}

    def entries(self, name: str) -> dict:
        out = {}
        for key, spec in self._specs(name).items():
            try:
                out[key] = _Entry.from_library(self.dlls[spec["library"]], name, spec)
            except (AttributeError, KeyError):
                continue
        return out


def _libraries(manifest: dict) -> list[str]:
    return list(manifest.get("libraries") or [manifest["library"]])


def _entries(manifest: dict) -> list[dict]:
    """The manifest's entries, each naming its library."""
    default = _libraries(manifest)[0]
    return [{"library": default, **spec} for spec in manifest["entries"]]


def _by_loop(manifest: dict) -> dict[str, list[dict]]:
    """The manifest's entries by loop."""
    out: dict[str, list[dict]] = {}
    for spec in _entries(manifest):
        out.setdefault(spec["loop"], []).append(spec)
    return out


# The form of the index _write_index writes (another is not read).
_INDEX_FORMAT = 2


def _index_path(manifest_path: str | os.PathLike[str]) -> str:
    return os.path.splitext(os.fspath(manifest_path))[0] + ".index"


def _write_index(manifest_path: str | os.PathLike[str], manifest: dict) -> None:
    """A copy of the manifest that a command loads in a fraction of the
    time (parsing the whole JSON text, ~0.5 MB, takes milliseconds, and
    importing json some more): a marshalled header (its length first, as
    8 little-endian bytes), then each loop's entries marshalled on their
    own, read (from a mapping of the file) when the loop is first called;
    with the manifest's size and time, so that a copy of another manifest
    is told.  Best effort: a command without it reads the manifest."""
    path = _index_path(manifest_path)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        st = os.stat(manifest_path)
        blobs, where, at = [], {}, 0
        for k, v in _by_loop(manifest).items():
            blob = marshal.dumps([{**spec, "key": _from_json(spec["key"])} for spec in v])
            blobs.append(blob)
            where[k] = (at, len(blob))
            at += len(blob)
        header = marshal.dumps({
            "format": _INDEX_FORMAT,
            "manifest": (st.st_mtime_ns, st.st_size),
            "libraries": _libraries(manifest),
            "stamps": manifest["stamps"],
            "skipped": list(manifest.get("skipped", [])),
            "by_loop": where,
        })  # fmt: skip
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header + b"".join(blobs))
        os.replace(tmp, path)
    except (OSError, KeyError, ValueError):
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _read_index(manifest_path: str | os.PathLike[str]) -> dict | None:
    """The index :func:`_write_index` wrote for the manifest as it is now,
    or None; its loops' entries as views of the mapped file."""
    import mmap

    try:
        st = os.stat(manifest_path)
        with open(_index_path(manifest_path), "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > os.fstat(f.fileno()).st_size:
                return None  # (an index of another form)
            data = marshal.loads(f.read(size))
            if not isinstance(data, dict) or data.get("format") != _INDEX_FORMAT:
                return None
            if data.get("manifest") != (st.st_mtime_ns, st.st_size):
                return None
            # (A mapping keeps the file read even if a build replaces it.)
            view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))[8 + size :]
        data["by_loop"] = {k: view[at : at + n] for k, (at, n) in data["by_loop"].items()}
    except (OSError, EOFError, ValueError, TypeError, KeyError, struct.error):
        return None
    return data


def _open_library(manifest_path: str | os.PathLike[str]) -> _Library | None:
    """The library a manifest describes, if it is there and no source file
    changed since it was built."""
    try:
        index = _read_index(manifest_path)
        if index is None:
            import json

            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.loads(f.read())
            _write_index(manifest_path, manifest)
            by_loop: dict = _by_loop(manifest)
            libraries, stamps = _libraries(manifest), manifest["stamps"]
            skipped = manifest.get("skipped", [])
        else:
            libraries, stamps = index["libraries"], index["stamps"]
            skipped, by_loop = index["skipped"], index["by_loop"]
        if _stamps(stamps) != stamps:
            return None
        return _Library(libraries, skipped, by_loop, os.path.dirname(os.fspath(manifest_path)))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load_library() -> _Library | None:
    global _library
    with _lock:
        if _library is False:
            _library = _open_library(_manifest_path()) if _enabled() else None
        return _library  # type: ignore[return-value]


def use_library(manifest_path: Path | None) -> bool:
    """Call loops through the library ``manifest_path`` describes (None:
    through numba only); returns whether it could be used."""
    global _library
    with _lock:
        _library = _open_library(manifest_path) if manifest_path is not None else None
        for loop in _registry.values():
            loop._native = None
        return _library is not None


def loaded_library() -> Path | None:
    """The native library in use, if any."""
    from pathlib import Path

    lib = _load_library()
    return Path(lib.path) if lib is not None else None


# -- loops -------------------------------------------------------------------


class CompiledLoop:
    """A numba loop called from Python (see the module docstring)."""

    def __init__(self, py_func: Callable, options: dict) -> None:
        self.py_func = py_func
        self.options = options
        self.name = f"{py_func.__module__}:{py_func.__qualname__}"
        self.__doc__ = py_func.__doc__
        self.__name__ = py_func.__name__
        self.__module__ = py_func.__module__
        self.__qualname__ = py_func.__qualname__
        self._dispatcher = None
        self._wrapped = None  # a dispatcher Python can call (see _python_call)
        self._jit: dict = {}  # argument key -> _Entry of numba's code (None: not callable so)
        self._native: dict | None = None
        # The last call's (argument, key, values) each, and its argument
        # key: one tuple, which threads read and replace whole.
        self._last: tuple = ([], ())
        # The last call's argument key and the library entry found for it
        # (one tuple: threads read and replace it whole).
        self._hit: tuple = ((), None)
        _registry[self.name] = self

    @property
    def dispatcher(self):
        """The numba dispatcher (created on first need).  Its code has no
        CPython wrapper: calls from other loops need none, the library is
        built from the native functions, and Python calls those through
        ctypes (:meth:`_python_call`).  A wrapper, its boxing and unboxing
        of every argument, is as much code again for a loop taking tuples
        of arrays, compiled for every loop a caller reaches."""
        if self._dispatcher is None:
            self._dispatcher = self._make_dispatcher(wrapper=False)
        return self._dispatcher

    @property
    def inlined_natively(self) -> bool:
        """Whether the library inlines this loop where other loops call it
        (``njit(..., native_inline=True)``)."""
        return bool(self.options.get("native_inline"))

    def _make_dispatcher(self, *, wrapper: bool):
        _numba_ready()
        options = dict(self.options)
        options.pop("native_inline", None)
        options.pop("c_args", None)
        cache = options.pop("cache", False)
        local_types = options.pop("locals", {})
        options["nopython"] = True
        options.setdefault("boundscheck", None)
        if not wrapper:
            options["no_cpython_wrapper"] = True
            options["no_cfunc_wrapper"] = True
        py_func = self.py_func
        if wrapper:
            # numba's cache index is keyed by signature, not by these
            # options, and its files are named after the function: the
            # wrapped code is compiled from a copy under another name, so
            # that neither dispatcher loads what the other compiled.
            py_func = FunctionType(
                py_func.__code__, py_func.__globals__, py_func.__name__,
                py_func.__defaults__, py_func.__closure__,
            )  # fmt: skip
            py_func.__qualname__ = self.py_func.__qualname__ + "_python"
            py_func.__module__ = self.py_func.__module__
        kwargs = {}
        if not wrapper and not _is_entry(self):
            kwargs["pipeline_class"] = _linking_only_compiler()
        disp = _dispatcher_class()(
            py_func=py_func, locals=local_types, targetoptions=options, **kwargs
        )
        if cache:
            disp.enable_caching()
        return disp

    def _python_call(self, args: tuple, keys: tuple, flat: list):
        """A call from Python that the library cannot take: numba's native
        code for these argument types through ctypes, as the library's;
        a loop whose result or arguments have no such layout (arrays
        returned, objects passed) goes through a wrapped dispatcher."""
        entry = self._jit.get(keys, False)
        if entry is False:
            entry = self._jit[keys] = _numba_entry(self, args)
        if entry is not None:
            return entry(flat)
        return self._wrapped_call(args)

    def _wrapped_call(self, args: tuple):
        if self._wrapped is None:
            self._wrapped = self._make_dispatcher(wrapper=True)
        return self._wrapped(*args)

    def _natives(self) -> dict:
        if self._native is None:
            lib = _load_library()
            self._native = lib.entries(self.name) if lib is not None else {}
        return self._native

    def prepare(self, *args) -> PreparedCall:
        """This loop's call with these very arguments, laid out once: for
        a caller that calls it again and again with the same objects (a
        decoder's state, code table and buffers), where checking them at
        every call costs ~0.2 us an array.  The call holds the arguments."""
        native = self._native if self._native is not None else self._natives()
        entry = None
        if native:
            try:
                keys, parts = self._layout(args)
            except (TypeError, ValueError, OverflowError):
                self._last = ([], ())
            else:
                entry = native.get(keys)
                if entry is not None:
                    return PreparedCall(self, args, entry, parts)
        return PreparedCall(self, args, None, None)

    def __call__(self, *args):
        native = self._native if self._native is not None else self._natives()
        try:
            keys, parts = self._layout(args)
        except (TypeError, ValueError, OverflowError):  # an argument with no native layout
            self._last = ([], ())
            return self._wrapped_call(args)
        if native:
            hit = self._hit
            if hit[0] is keys:
                entry = hit[1]
            else:
                # (a key of nested tuples is hashed anew at every lookup)
                entry = native.get(keys)
                self._hit = (keys, entry)
            if entry is not None:
                return entry.call_parts(parts)
        if self.name not in _fallbacks:
            _fallbacks.add(self.name)
        return self._python_call(args, keys, _words_of(parts))

    def _layout(self, args: tuple) -> tuple[tuple, list]:
        """The arguments' type key and, per argument, ``(what is held of
        it, its key, its values in numba's native layout)``.  Loops are
        called again and again with mostly the same objects (state, code
        table, output buffers): an argument that is the very object of the
        previous call (arrays never change address or shape; tuples never
        change) is not looked at again, and keeps the very tuple."""
        last, last_keys = self._last
        parts = []
        n_last = len(last)
        same = n_last == len(args)
        for i, a in enumerate(args):
            if i < n_last and _same(last[i][0], a):
                parts.append(last[i])
                continue
            p = _part(a)
            if i < n_last and p[1] is not last[i][1] and p[1] == last[i][1]:
                # (a new argument of the last one's type, a tuple of arrays:
                # its key the very object, compared by identity next time;
                # arrays' keys are one object each)
                p = (p[0], last[i][1], p[2])
            parts.append(p)
            if same and p[1] is not last[i][1]:
                same = False
        # (the very key object of the last call when every argument's key is
        # the last call's: the library entry found for it is kept with it,
        # see __call__)
        keys = last_keys if same else tuple(p[1] for p in parts)
        self._last = (parts, keys)
        return keys, parts

    def __getattr__(self, name: str):
        # signatures, overloads, py_func's attributes...: numba's.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dispatcher, name)

    def __repr__(self) -> str:
        return f"<loop {self.name}>"


class PreparedCall:
    """A loop's call with fixed arguments (:meth:`CompiledLoop.prepare`);
    calling it calls the loop."""

    __slots__ = ("_entry", "_parts", "args", "loop")

    def __init__(self, loop: CompiledLoop, args: tuple, entry, parts) -> None:
        self.loop, self.args, self._entry, self._parts = loop, args, entry, parts

    def holds(self, *args) -> bool:
        """Whether this call's arguments are these very objects."""
        mine = self.args
        if len(mine) != len(args):
            return False
        for x, y in zip(mine, args, strict=True):
            if x is not y:
                return False
        return True

    def __call__(self):
        if self._entry is not None:
            return self._entry.call_parts(self._parts)
        return self.loop(*self.args)


def _numba_entry(loop: CompiledLoop, args: tuple) -> _Entry | None:
    """numba's native code of ``loop`` for ``args`` (compiled or loaded
    from numba's cache), callable through ctypes; None when its arguments
    or result have no ctypes layout."""
    from numba import typeof

    disp = loop.dispatcher
    try:
        sig = tuple(typeof(a) for a in args)
        disp.compile(sig)
        overload = disp.overloads[sig]
        ret = _ret_layout(overload.signature.return_type)
        # The native function's arguments as numba's calling convention
        # lays them out (from the types: code loaded from numba's cache
        # has no LLVM module to read them from); pointers are all "ptr".
        fnty = disp.targetctx.call_conv.get_function_type(
            overload.signature.return_type, overload.signature.args
        )
        types = ["ptr" if str(t).endswith("*") else str(t) for t in fnty.args][2:]
        if any(t not in _CTYPES for t in types):
            return None
        address = overload.library.get_pointer_to_function(overload.fndesc.mangled_name)
    except Exception:
        return None  # the wrapped dispatcher says what is wrong, if anything
    if not address:
        return None
    return _Entry.from_address(address, loop.name, types, ret)


_dispatcher_type = None
_compiler_type = None
# The serialisation kind of a library whose machine code was never made.
_LINKING_ONLY = "hwtrace-bitcode"


def _linking_only_compiler():
    """numba's compiler, for a loop only other loops call (not one of its
    module's ``AOT_ENTRIES``): its code library is optimised as numba's
    are, but not emitted as machine code unless something asks for the
    address of one of its functions.  Its callers link its bitcode and
    emit their own copy (and so does :func:`build`); making machine code
    for it too, and again each time numba's cache loads it, was about a
    fifth of compiling the flow decoder.  numba's cache keeps such a
    library as bitcode, of a kind :func:`_numba_ready` teaches the code
    generator to load without emitting it."""
    global _compiler_type
    if _compiler_type is None:
        from numba.core.compiler import Compiler

        library_class = _linking_only_library()

        class LinkingOnlyCompiler(Compiler):
            def compile_extra(self, func):
                if self.state.library is None:
                    codegen = self.state.targetctx.codegen()
                    library = library_class(codegen, func.__qualname__)
                    library.enable_object_caching()  # (as numba's lowering does)
                    self.state.library = library
                return super().compile_extra(func)

        _compiler_type = LinkingOnlyCompiler
    return _compiler_type


_library_type = None


class _DeferredEnvironments:
    """A linking-only library's code generator, as numba's lowering and
    cache see it: environments are set when the library is emitted."""

    def __init__(self, library) -> None:
        self._library = library

    def set_env(self, name: str, env) -> None:
        library = self._library
        if library._emitted:
            library._codegen.set_env(name, env)
        else:
            library._envs.append((name, env))

    def __getattr__(self, name: str):
        return getattr(self._library._codegen, name)


def _linking_only_library():
    """numba's JIT code library, emitting machine code only on demand."""
    global _library_type
    if _library_type is None:
        from numba.core.codegen import JITCodeLibrary

        class LinkingOnlyLibrary(JITCodeLibrary):
            _emitted = False

            def __init__(self, codegen, name):
                super().__init__(codegen, name)
                self._envs: list = []  # (name, environment) to set once emitted

            @property
            def codegen(self):
                # numba sets a function's environment in the JIT engine's
                # copy of the module through this (a lowering's last step,
                # a cache load's): kept until there is a copy.
                return _DeferredEnvironments(self)

            def _finalize_final_module(self):
                # numba's, but the module is not handed to the JIT engine:
                # its next emission would emit every module it holds.
                self._finalize_dynamic_globals()
                self._verify_declare_only_symbols()
                self._final_module._CPUCodeLibrary__library = weakref.proxy(self)
                self._finalized = True

            def _emit(self):
                self._emitted = True
                cleanup = self._codegen._add_module(self._final_module)
                if cleanup:
                    weakref.finalize(self, cleanup)
                self._finalize_specific()
                for name, env in self._envs:
                    self._codegen.set_env(name, env)
                self._envs.clear()

            def get_pointer_to_function(self, name):
                self._ensure_finalized()
                if not self._emitted:
                    fn = next((f for f in self._final_module.functions if f.name == name), None)
                    if fn is None or fn.is_declaration:
                        return 0
                    self._emit()
                return super().get_pointer_to_function(name)

            def serialize_using_object_code(self):
                if self._emitted:
                    return super().serialize_using_object_code()
                self._ensure_finalized()
                return (self.name, _LINKING_ONLY, self._final_module.as_bitcode())

            @classmethod
            def unserialize(cls, codegen, state):
                from llvmlite import binding as ll

                self = cls(codegen, state[0])
                self._final_module = ll.parse_bitcode(state[2])
                self._finalize_final_module()
                return self

        _library_type = LinkingOnlyLibrary
    return _library_type


def _dispatcher_class():
    """numba's CPU dispatcher, typing calls from other loops with plain
    argument types.  numba types a constant argument by its value
    (``Literal[int](8)``) and compiles the callee, with everything it
    calls, once per distinct constant: the flow decoder's queue helpers
    were compiled eight times over.  A call is typed with the constants'
    plain types first; the literal types only when that does not type
    (a constant index into a heterogeneous tuple needs its value)."""
    global _dispatcher_type
    if _dispatcher_type is None:
        from numba.core import errors, types
        from numba.core.registry import CPUDispatcher

        class PlainTypedDispatcher(CPUDispatcher):
            def get_call_template(self, args, kws):
                plain = tuple(types.unliteral(a) for a in args)
                plain_kws = {k: types.unliteral(v) for k, v in kws.items()}
                if plain != tuple(args) or plain_kws != kws:
                    try:
                        return super().get_call_template(plain, plain_kws)
                    except errors.TypingError:
                        pass
                return super().get_call_template(args, kws)

        _dispatcher_type = PlainTypedDispatcher
    return _dispatcher_type


def njit(*args, **options):
    """``numba.njit`` for a loop Python calls: ``@njit`` or
    ``@njit(cache=True, nogil=True, ...)``."""
    if args and callable(args[0]):
        return CompiledLoop(args[0], {})
    return lambda fn: CompiledLoop(fn, options)


_numba_hooks: list[Callable[[], None]] = []
_numba_is_ready = False


def on_numba(hook: Callable[[], None]) -> None:
    """Run ``hook`` once numba is imported (now, if it is): numba
    extensions (overloads, intrinsics) a module's loops need, defined
    without importing numba before something compiles."""
    if _numba_is_ready:
        hook()
    else:
        _numba_hooks.append(hook)


_module_stamps: dict[str, tuple] = {}
_imports_of: dict[str, list[str]] = {}


def _module_file(module: str) -> str | None:
    """The source file of ``module`` (of a package imported), if any."""
    root = sys.modules.get(module.partition(".")[0])
    if root is None or not getattr(root, "__file__", None):
        return None
    path = os.path.join(os.path.dirname(root.__file__), *module.split(".")[1:])
    for name in (path + ".py", os.path.join(path, "__init__.py")):
        if os.path.isfile(name):
            return name
    return None


def _imported_modules(module: str, path: str) -> list[str]:
    """The modules of ``module``'s package its source imports (its import
    statements outside functions, read from the file: the same answer in
    every process, whatever it has imported)."""
    import ast

    got = _imports_of.get(path)
    if got is not None:
        return got
    root = module.partition(".")[0]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    out: list[str] = []
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        tree = None
    todo = list(tree.body) if tree is not None else []
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            out.append(base)
            out += [f"{base}.{a.name}" for a in node.names]  # (submodules, if they are)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo += [c for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt)]
    got = _imports_of[path] = [m for m in out if m == root or m.startswith(root + ".")]
    return got


def _module_stamp(module: str) -> tuple:
    """The files of ``module``'s package its source imports, transitively,
    as they are now."""
    stamp = _module_stamps.get(module)
    if stamp is None:
        files: set[str] = set()
        todo = [module]
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            path = _module_file(name)
            if path is not None and path not in files:
                files.add(path)
                todo += _imported_modules(name, path)
        stamp = _module_stamps[module] = tuple(sorted(_stamps(sorted(files)).items()))
    return stamp


def _stamp_numba_caches() -> None:
    """Make numba's cache of a loop stale when a module its code draws on
    changes, not only its own file.  numba stamps a cached function with
    its source file alone, yet its code holds the loops it calls from
    other modules, inlined or linked in: after an edit to one module, a
    caller's cache (and a library built from it) kept running the old
    code of its callees."""
    from numba.core import caching

    def stamped(base: type) -> type:
        class Locator(base):  # type: ignore[misc, valid-type]
            def __init__(self, py_func, py_file) -> None:
                super().__init__(py_func, py_file)
                self._stamp_module = py_func.__module__

            @classmethod
            def from_function(cls, py_func, py_file):
                # (The registry of the module the package imports: run as
                # ``python -m hwtrace.aot`` this file is also __main__.)
                registry = getattr(sys.modules.get("hwtrace.aot"), "_registry", _registry)
                if f"{py_func.__module__}:{py_func.__qualname__}" not in registry:
                    return None  # (not a loop of aot's making)
                return super().from_function(py_func, py_file)

            def get_source_stamp(self):
                return super().get_source_stamp(), _module_stamp(self._stamp_module)

        Locator.__name__ = Locator.__qualname__ = f"Stamped{base.__name__}"
        return Locator

    classes = caching.CacheImpl._locator_classes
    if any(getattr(c, "_stamps_imports", False) for c in classes):
        return
    bases = (caching.UserProvidedCacheLocator, caching.InTreeCacheLocator,
             caching.UserWideCacheLocator)  # fmt: skip
    for i, base in enumerate(bases):
        cls = stamped(base)
        cls._stamps_imports = True  # type: ignore[attr-defined]
        classes.insert(i, cls)


def _numba_ready() -> None:
    """Numba has been imported: numba sees a CompiledLoop used inside another
    loop as its dispatcher, and the modules' extensions are defined."""
    global _numba_is_ready
    if _numba_is_ready:
        return
    _numba_is_ready = True
    from numba.core.typing.typeof import typeof_impl

    @typeof_impl.register(CompiledLoop)
    def _typeof_loop(val, c):
        return typeof_impl(val.dispatcher, c)

    # numba's cache loads a library through the CPU code generator, which
    # knows its own kinds only (see _linking_only_compiler).
    from numba.core.registry import cpu_target

    codegen = cpu_target.target_context.codegen()
    unserialize = codegen.unserialize_library

    def unserialize_library(state):
        if state[1] == _LINKING_ONLY:
            return _linking_only_library().unserialize(codegen, state)
        return unserialize(state)

    codegen.unserialize_library = unserialize_library
    _stamp_numba_caches()

    while _numba_hooks:
        _numba_hooks.pop(0)()


class _NumbaImportHook:  # (an importlib.abc.MetaPathFinder; that module costs an import)
    """Calls :func:`_numba_ready` as soon as anything imports numba, so
    plain numba functions elsewhere can call loops too.  A look-up that
    imports nothing (``importlib.util.find_spec``) leaves it in place."""

    def find_spec(self, name, path, target=None):
        if name != "numba":
            return None
        i = sys.meta_path.index(self)
        del sys.meta_path[i]
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(i, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module
        hook = self

        def exec_then_ready(module) -> None:
            exec_module(module)
            if hook in sys.meta_path:
                sys.meta_path.remove(hook)
            _numba_ready()

        spec.loader.exec_module = exec_then_ready  # type: ignore[method-assign]
        return spec


if "numba" in sys.modules:
    _numba_ready()
else:
    sys.meta_path.insert(0, _NumbaImportHook())


def c_address(loop: CompiledLoop) -> int | None:
    """The address of the library's C function of ``loop`` (declared
    ``njit(..., c_args=N)``: ``int64_t f(int64_t, ...)``), None when the
    library does not hold it (the caller makes one with numba, and the
    library is built for next time, see :func:`note_fallback`)."""
    n = loop.options.get("c_args")
    lib = _load_library() if n else None
    spec = lib._specs(loop.name).get((("s", "<i8"),) * n) if lib is not None else None
    fn = getattr(lib.dlls.get(spec["library"]), spec["c"], None) if spec and spec.get("c") else None
    if fn is None:
        _fallbacks.add(loop.name)
        return None
    return ctypes.cast(fn, ctypes.c_void_p).value


def set_library_global(name: str, value: int) -> None:
    """Give each library's copy of the global ``name`` (one of
    :data:`LIBRARY_GLOBALS`) ``value``: those loaded, and those loaded
    later (a library's loops may read it before anything asked for a C
    function of it)."""
    with _lock:
        _global_values[name] = value
        lib = _library if isinstance(_library, _Library) else None
    if lib is not None:
        lib.set_global(name, value)


def fallbacks() -> set[str]:
    """The loops this process called through numba."""
    return set(_fallbacks)


# -- building ------------------------------------------------------------------


def _cached_signatures(disp) -> list:
    """The signatures numba has compiled and cached for ``disp``."""
    cache = getattr(disp, "_cache", None)
    impl = getattr(cache, "_cache_file", None)
    if impl is None:
        return []
    try:
        index = impl._load_index()
    except Exception:
        return []
    magic = disp.targetctx.codegen().magic_tuple()
    # (an entry of another arity is of the loop before its arguments
    # changed: nothing calls it, nothing compiles it)
    arity = disp.py_func.__code__.co_argcount
    return [key[0] for key in index
            if key[1] == magic and isinstance(key[0], tuple) and len(key[0]) == arity]  # fmt: skip


def _numba_key(ty) -> Any:
    from numba.core import types
    from numba.np.numpy_support import as_dtype

    if isinstance(ty, types.Literal):
        # Compiled for one constant value: only a call from numba uses it.
        raise TypeError(f"no native layout for {ty}")
    if isinstance(ty, types.Array):
        dt = _dtype_key(as_dtype(ty.dtype))
        return ("a", dt, ty.ndim, ty.layout, not ty.mutable, ty.aligned)
    if isinstance(ty, types.BaseTuple):
        return tuple(_numba_key(t) for t in ty.types)
    if isinstance(ty, types.Boolean):
        return ("s", "|b1")
    if isinstance(ty, types.Integer | types.Float):
        return ("s", as_dtype(ty).str)
    if isinstance(ty, types.NoneType):
        return ("n",)
    raise TypeError(f"no native layout for {ty}")


def _ret_layout(ty) -> Any:
    from numba.core import types

    if isinstance(ty, types.NoneType):
        return None
    if isinstance(ty, types.BaseTuple):
        items = [_numba_key(t) for t in ty.types]
        if all(isinstance(k, tuple) and k[0] == "s" for k in items):
            return [k[1] for k in items]
        raise TypeError(f"no native layout for {ty}")
    key = _numba_key(ty)
    if key[0] != "s":
        raise TypeError(f"no native layout for {ty}")
    return key[1]


_ALLOWED_EXTERNAL = {
    "memcpy", "memmove", "memset", "memcmp",
    # (the C library's, for the filter tiers' helpers)
    "strnlen", "syscall", "sched_getcpu", "clock_gettime",
}  # fmt: skip
# Global variables loops read by name (numba finds them through
# llvmlite.binding.add_symbol): the library defines its own, weak (one
# per library), which :func:`set_library_global` sets.
LIBRARY_GLOBALS = ("hwtrace_filter_threshold_table", "hwtrace_filter_threshold_slots")
_global_values: dict[str, int] = {}  # what set_library_global gave them
_TRAP_STUBS = ("NRT_MemInfo_call_dtor",)


def _to_json(k):
    return [_to_json(x) for x in k] if isinstance(k, tuple) else k


def build(
    directory: Path | None = None, *, modules: tuple[str, ...] = LOOP_MODULES, quiet: bool = True
) -> Path | None:
    """Build the native library of the loops in ``modules`` from every
    specialisation numba has cached or compiled in this process; returns
    the manifest's path (None when there was nothing to build or no
    linker)."""
    import json
    import shutil
    import subprocess
    import tempfile
    from pathlib import Path

    import llvmlite.binding as ll
    import numba

    for m in modules:
        importlib.import_module(m)
    stamps = _stamps(_source_files(modules))
    directory = Path(directory) if directory is not None else library_dir()
    directory.mkdir(parents=True, exist_ok=True)
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None
    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    ll.initialize_native_asmparser()  # (loops with inline assembly)

    path = directory / f"{_LIB_NAME}-{_platform_tag()}.json"
    previous = _previous_build(path, stamps)
    have = {(e["loop"], json.dumps(e["key"])) for e in previous["entries"]}
    specs: list[dict] = []
    irs = []
    skipped: list[str] = []
    declaring: set[int] = set()  # the specialisations whose modules declare others' functions
    for name, loop in sorted(_registry.items()):
        if loop.py_func.__module__ not in modules or not _is_entry(loop):
            continue
        disp = loop.dispatcher
        sigs = list(dict.fromkeys(list(disp.signatures) + _cached_signatures(disp)))
        n_c = loop.options.get("c_args")
        if n_c and (numba.int64,) * n_c not in sigs:
            sigs.append((numba.int64,) * n_c)  # (its C function, called or not)
        for sig in sigs:
            if not isinstance(sig, tuple):
                continue  # (a C function numba made of the loop: it has its own cache entry)
            if any(isinstance(t, numba.types.Literal) for t in sig):
                continue  # compiled for a constant: only numba code calls it
            try:
                key = [_numba_key(t) for t in sig]
                if (name, json.dumps(_to_json(tuple(key)))) in have:
                    continue  # in a library this one adds to
                disp.compile(sig)
                overload = disp.overloads[tuple(sig)]
                ret = _ret_layout(overload.signature.return_type)
                mod = ll.parse_bitcode(overload.library._get_module_for_linking().as_bitcode())
            except Exception as e:
                skipped.append(f"{name}{tuple(sig)}: {e}")
                continue
            symbol = overload.fndesc.mangled_name
            fn = mod.get_function(symbol)
            args = _argument_types(fn)[2:]
            if any(t not in _CTYPES for t in args):
                skipped.append(f"{name}{tuple(sig)}: argument types {args}")
                continue
            fn.linkage = "external"  # linkonce_odr would be linked only where used
            packed = symbol + "__packed"
            tramp = ll.parse_assembly(_packed_trampoline(symbol, packed, args))
            tramp.triple, tramp.data_layout = mod.triple, mod.data_layout
            mod.link_in(tramp)
            c_name = None
            if n_c and args == ["i64"] * n_c and ret in ("<i8", "<u8"):
                c_name = symbol + "__c"
                tramp = ll.parse_assembly(_c_trampoline(symbol, c_name, n_c))
                tramp.triple, tramp.data_layout = mod.triple, mod.data_layout
                mod.link_in(tramp)
            if _outside(mod):
                # (it declares a function from outside, which the passes of
                # linking may yet remove: looked at again before linking)
                declaring.add(len(specs))
            specs.append({"loop": name, "key": _to_json(tuple(key)), "symbol": symbol,
                          "packed": packed, "args": args, "ret": ret,
                          **({"c": c_name} if c_name else {})})  # fmt: skip
            irs.append(mod.as_bitcode())
    if declaring:
        specs, irs = _self_contained(specs, irs, declaring, skipped, ll)
    linked = _link_parts(specs, irs, ll)
    if not quiet:
        for s in skipped:
            print(f"  left to numba: {s[:200]}")
    if not specs:
        return path if previous["entries"] else None
    tag = _platform_tag()
    with tempfile.TemporaryDirectory(dir=directory) as tmp:
        objects = _emit_objects(linked or [], Path(tmp), ll)
        so_name = f"{_LIB_NAME}-{tag}-{os.getpid()}-{len(previous['libraries'])}.so"
        so_tmp = Path(tmp) / so_name
        subprocess.run([cc, "-shared", "-o", str(so_tmp), *map(str, objects)], check=True,
                       capture_output=True)  # fmt: skip
        os.replace(so_tmp, directory / so_name)
    for spec in specs:
        spec["library"] = so_name
    manifest = {
        "libraries": previous["libraries"] + [so_name],
        "stamps": stamps,
        "entries": previous["entries"] + specs,
        "skipped": sorted(set(previous["skipped"]) | set(skipped)),
    }
    tmp_manifest = path.with_suffix(f".{os.getpid()}.tmp")
    tmp_manifest.write_text(json.dumps(manifest, indent=0))
    os.replace(tmp_manifest, path)
    _write_index(path, manifest)
    for old in previous["stale"]:
        # A process that loaded an old library keeps its mapping.
        (directory / old).unlink(missing_ok=True)
    if not quiet:
        print(f"{len(specs)} loop specialisations in {directory / so_name}")
    return path


# How a trampoline makes an argument of each type from its 64-bit word.
_FROM_WORD = {
    "i64": None,
    "ptr": "inttoptr i64 {w} to ptr",
    "i1": "trunc i64 {w} to i1",
    "i8": "trunc i64 {w} to i8",
    "i16": "trunc i64 {w} to i16",
    "i32": "trunc i64 {w} to i32",
    "double": "bitcast i64 {w} to double",
}


def _packed_trampoline(symbol: str, packed: str, args: list[str]) -> str:
    """LLVM IR of ``status packed(ret *, excinfo **, uint64_t *words)``,
    which calls ``symbol`` (numba's native calling convention) with its
    arguments read from ``words``, one word each (a float's bits in the
    low half).  Python then passes one pointer, not hundreds of scalars."""
    lines = [f'define i32 @"{packed}"(ptr %ret, ptr %exc, ptr %words) {{']
    values = []
    for j, t in enumerate(args):
        lines.append(f"  %p{j} = getelementptr i64, ptr %words, i64 {j}")
        lines.append(f"  %w{j} = load i64, ptr %p{j}")
        if t == "float":
            lines.append(f"  %h{j} = trunc i64 %w{j} to i32")
            lines.append(f"  %a{j} = bitcast i32 %h{j} to float")
        elif _FROM_WORD[t] is None:
            lines.append(f"  %a{j} = add i64 %w{j}, 0")
        else:
            lines.append(f"  %a{j} = " + _FROM_WORD[t].format(w=f"%w{j}"))
        values.append(f"{t} %a{j}")
    call_args = ", ".join(["ptr %ret", "ptr %exc", *values])
    lines.append(f'  %r = call i32 @"{symbol}"({call_args}) #0')
    lines.append("  ret i32 %r")
    lines.append("}")
    lines.append(f'declare i32 @"{symbol}"({", ".join(["ptr", "ptr", *args])})')
    lines.append("attributes #0 = { noinline }")
    return "\n".join(lines) + "\n"


def _c_trampoline(symbol: str, name: str, n: int) -> str:
    """LLVM IR of ``int64_t name(int64_t, ...)`` (``n`` arguments), a C
    function calling ``symbol`` (numba's native calling convention) and
    returning its result (a raised exception's status is not looked at:
    loops given C entries do not raise)."""
    params = ", ".join(f"i64 %a{j}" for j in range(n))
    call_args = ", ".join(["ptr %ret", "ptr %exc", *(f"i64 %a{j}" for j in range(n))])
    return (
        f'define i64 @"{name}"({params}) {{\n'
        "  %ret = alloca i64\n"
        "  %exc = alloca ptr\n"
        "  store i64 0, ptr %ret\n"
        f'  %s = call i32 @"{symbol}"({call_args})\n'
        "  %v = load i64, ptr %ret\n"
        "  ret i64 %v\n"
        "}\n"
        f'declare i32 @"{symbol}"({", ".join(["ptr", "ptr", *(["i64"] * n)])})\n'
    )


def _argument_types(fn) -> list[str]:
    """The LLVM types of function ``fn``'s arguments, as ``str(a.type)``
    gives each, from one print of the function's type (a loop taking
    tuples of arrays has hundreds of arguments, ~25 us a print)."""
    text = str(fn.global_value_type)
    inner = text[text.index("(") + 1 : text.rindex(")")]
    out: list[str] = []
    depth = start = 0
    for i, ch in enumerate(inner):
        if ch in "({[<":
            depth += 1
        elif ch in ")}]>":
            depth -= 1
        elif ch == "," and depth == 0:
            out.append(inner[start:i].strip())
            start = i + 1
    if inner.strip():
        out.append(inner[start:].strip())
    return out


def _previous_build(path: Path, stamps: dict) -> dict:
    """What the library at ``path`` already holds, when it was built from
    the same sources (a build then only adds to it), and the libraries of
    an out-of-date one (``stale``), to remove."""
    import json

    out: dict = {"libraries": [], "entries": [], "skipped": [], "stale": []}
    try:
        manifest = json.loads(path.read_text())
        names = _libraries(manifest)
    except (OSError, ValueError, KeyError):
        return out
    if manifest.get("stamps") != stamps or not all((path.parent / n).exists() for n in names):
        out["stale"] = names
        return out
    out.update(libraries=names, entries=_entries(manifest),
               skipped=list(manifest.get("skipped", [])))  # fmt: skip
    return out


def _declared(mod, name: str) -> bool:
    try:
        return mod.get_function(name).is_declaration
    except NameError:
        return False


def _outside(mod) -> set[str]:
    """The functions ``mod`` declares and does not define, but for LLVM's
    intrinsics and those a library may need (:data:`_ALLOWED_EXTERNAL`,
    :data:`_TRAP_STUBS`)."""
    return {
        f.name
        for f in mod.functions
        if f.is_declaration
        and not f.name.startswith("llvm.")
        and f.name not in _ALLOWED_EXTERNAL
        and f.name not in _TRAP_STUBS
    }


def _is_entry(loop: CompiledLoop) -> bool:
    """Whether the library exports ``loop`` for Python to call: every loop
    but those its module leaves out by naming the loops Python calls in
    ``AOT_ENTRIES``.  The others are built only into their callers,
    internal: there a call passes only the words of its arguments the
    callee reads (a loop taking the flow decoder's state as tuples of
    arrays gets ~450 words a call otherwise)."""
    named = getattr(sys.modules.get(loop.__module__), "AOT_ENTRIES", None)
    return named is None or loop.__name__ in named


def _native_inline_prefixes() -> tuple[str, ...]:
    """The symbol prefixes of the loops the library inlines into their
    callers (numba's mangling: each name part after its length)."""
    out = []
    for loop in _registry.values():
        if loop.inlined_natively:
            parts = [*loop.__module__.split("."), *loop.__qualname__.split(".")]
            out.append("_ZN" + "".join(f"{len(p)}{p}" for p in parts) + "B")
    return tuple(out)


def _linked(bitcodes: list[bytes], entries: set[str], ll):
    """One module of the modules in ``bitcodes``, with the stubs of
    :data:`_TRAP_STUBS` it declares, all but ``entries`` internal, the
    loops marked ``native_inline`` inlined and dead code removed."""
    linked = ll.parse_bitcode(bitcodes[0])
    for code in bitcodes[1:]:
        linked.link_in(ll.parse_bitcode(code))
    stubs = "".join(
        f"define void @{s}(ptr %p) {{\n  call void @llvm.trap()\n  unreachable\n}}\n"
        for s in _TRAP_STUBS
        if _declared(linked, s)
    )
    if stubs:
        stub = ll.parse_assembly(stubs + "declare void @llvm.trap()\n")
        stub.triple, stub.data_layout = linked.triple, linked.data_layout
        linked.link_in(stub)
    defined = "".join(
        f'@"{g.name}" = weak global i64 0, align 8\n'
        for g in linked.global_variables
        if g.is_declaration and g.name in LIBRARY_GLOBALS
    )
    if defined:
        gv = ll.parse_assembly(defined)
        gv.triple, gv.data_layout = linked.triple, linked.data_layout
        linked.link_in(gv)
    return _internalize(linked, entries, ll)


# A definition's line in LLVM's text: its head, name and attribute group.
_DEFINE = r"^(define internal [^\n]*?@(\S+?)\(.*\)[^\n{]*?)( #\d+)? \{$"


def _inline_marked(mod, ll):
    """``mod`` with the internal functions of :func:`_native_inline_prefixes`
    inlined where they are called: the filter tiers' small helpers, whose
    C trampolines would otherwise be most of the cost of a call."""
    prefixes = _native_inline_prefixes()
    if not prefixes or not any(
        f.name.startswith(prefixes) and not f.is_declaration for f in mod.functions
    ):
        return mod

    import re

    def mark(m: re.Match) -> str:
        if not m.group(2).strip('"').startswith(prefixes):
            return m.group(0)
        return f"{m.group(1)} alwaysinline{m.group(3) or ''} {{"

    marked = ll.parse_assembly(re.sub(_DEFINE, mark, str(mod), flags=re.M))
    marked.triple, marked.data_layout = mod.triple, mod.data_layout
    tm = _target_machine(ll)
    pb = ll.create_pass_builder(tm, ll.create_pipeline_tuning_options(speed_level=0))
    mpm = ll.create_new_module_pass_manager()
    mpm.add_always_inliner_pass()
    mpm.add_global_dead_code_eliminate_pass()
    mpm.run(marked, pb)
    # (the inlined code is simplified where it landed)
    fpb = ll.create_pass_builder(tm, ll.create_pipeline_tuning_options(speed_level=2))
    fpm = ll.create_new_function_pass_manager()
    fpm.add_sroa_pass()
    fpm.add_instruction_combine_pass()
    fpm.add_simplify_cfg_pass()
    for f in marked.functions:
        if not f.is_declaration:
            fpm.run(f, fpb)
    return marked


def _self_contained(specs: list[dict], irs: list[bytes], declaring: set[int],
                    skipped: list[str], ll):  # fmt: skip
    """The specialisations (and their modules' bitcode) that need nothing
    from outside the library but C's memory functions, of those whose
    modules declare such (the indices ``declaring``: linked alone to see
    whether they still do; the passes of linking only remove what is
    declared); the others are added to ``skipped``."""
    kept: tuple[list[dict], list[bytes]] = ([], [])
    for k, (spec, code) in enumerate(zip(specs, irs, strict=True)):
        bad = _outside(_linked([code], {spec["symbol"]}, ll)) if k in declaring else set()
        if bad:
            skipped.append(f"{spec['loop']}{tuple(spec['key'])}: needs {', '.join(sorted(bad))}")
        else:
            kept[0].append(spec)
            kept[1].append(code)
    return kept


#: Processes that emit the library's machine code at once (LLVM's code
#: generation is most of a build; llvmlite serialises its calls in one
#: process, so the other parts are emitted by child processes).
EMIT_PROCESSES = 2


def _link_parts(specs: list[dict], irs: list[bytes], ll) -> list | None:
    """The specialisations' modules linked in up to :data:`EMIT_PROCESSES`
    parts, each with only its entries external; None when one needs a
    function from outside."""
    parts = min(EMIT_PROCESSES, len(specs)) if len(os.sched_getaffinity(0)) > 1 else 1
    # Whole Python modules to a part: one module's loops share callees,
    # which a part holds once.  The largest first, each to the part with
    # the least bitcode so far.
    by_module: dict[str, list[int]] = {}
    for k, spec in enumerate(specs):
        by_module.setdefault(spec["loop"].partition(":")[0], []).append(k)
    groups: list[list[int]] = [[] for _ in range(parts)]
    sizes = [0] * parts
    for members in sorted(by_module.values(), key=lambda m: -sum(len(irs[k]) for k in m)):
        lightest = sizes.index(min(sizes))
        groups[lightest] += members
        sizes[lightest] += sum(len(irs[k]) for k in members)
    linked = []
    for group in filter(None, groups):
        entries = {specs[k][e] for k in group for e in ("symbol", "packed", "c") if specs[k].get(e)}
        mod = _linked([irs[k] for k in group], entries, ll)
        if _outside(mod):
            return None
        linked.append(mod)
    return linked


def _emit_objects(linked: list, tmp: Path, ll) -> list[Path]:
    """The object files of the ``linked`` modules: the last emitted here,
    the others by child processes at the same time."""
    import subprocess

    children = []
    objects = []
    for n, mod in enumerate(linked):
        o_path = tmp / f"aot{n}.o"
        objects.append(o_path)
        if n == len(linked) - 1:
            o_path.write_bytes(_target_machine(ll).emit_object(mod))
            break
        bc_path = tmp / f"aot{n}.bc"
        bc_path.write_bytes(mod.as_bitcode())
        code = (
            "import sys; from hwtrace.aot import _emit_main; _emit_main(sys.argv[1], sys.argv[2])"
        )
        command = [sys.executable, "-c", code, str(bc_path), str(o_path)]
        children.append(subprocess.Popen(command, stderr=subprocess.PIPE))
    for child in children:
        _, err = child.communicate()
        if child.returncode != 0:
            raise RuntimeError(f"emitting the library's code failed: {err.decode()[-500:]}")
    return objects


def _emit_main(bitcode: str, obj: str) -> None:
    """Emit the machine code of the module in file ``bitcode`` into ``obj``
    (a child process of :func:`_emit_objects`)."""
    from pathlib import Path

    import llvmlite.binding as ll

    ll.initialize_native_target()
    ll.initialize_native_asmprinter()
    ll.initialize_native_asmparser()  # (loops with inline assembly)
    module = ll.parse_bitcode(Path(bitcode).read_bytes())
    Path(obj).write_bytes(_target_machine(ll).emit_object(module))


def _internalize(mod, keep: set[str], ll):
    for f in mod.functions:
        if f.is_declaration:
            continue
        f.linkage = "external" if f.name in keep else "internal"
    for g in mod.global_variables:
        if not g.is_declaration and g.name not in LIBRARY_GLOBALS:
            g.linkage = "internal"
    mod = _inline_marked(mod, ll)
    tm = _target_machine(ll)
    pb = ll.create_pass_builder(tm, ll.create_pipeline_tuning_options(speed_level=0))
    mpm = ll.create_new_module_pass_manager()
    mpm.add_global_dead_code_eliminate_pass()
    # Loops take the decoder's state as tuples of arrays, which numba
    # passes as several words an array (a step function of the flow
    # decoder ~450 arguments): internal now, callees drop those they
    # never read (~20-120 left), and every call copies that much less.
    mpm.add_dead_arg_elimination_pass()
    mpm.add_strip_dead_prototype_pass()
    mpm.run(mod, pb)
    return mod


def _target_machine(ll):
    target = ll.Target.from_default_triple()
    return target.create_target_machine(
        cpu=ll.get_host_cpu_name(),
        features=ll.get_host_cpu_features().flatten(),
        opt=3,
        reloc="pic",
        codemodel="default",
    )


def note_fallback() -> None:
    """After a command: when loops had to go through numba, build the
    library for next time (once, unless another process is at it)."""
    global _built
    if _built or not _fallbacks or not _enabled():
        return
    if os.environ.get("HWTRACE_AOT_AUTOBUILD") == "0":
        return
    lib = _load_library()
    if lib is not None and _fallbacks <= lib.numba_only:
        return
    _built = True
    try:
        locked_build(wait=False)
    except Exception as e:
        sys.stderr.write(f"hwtrace: note: compiled-loop library not built: {e}\n")


def locked_build(*, wait: bool = True, quiet: bool = True) -> Path | None:
    """:func:`build` under the library directory's lock, so that builders
    take turns (each build holds every specialisation numba has cached, so
    the last one loses nothing).  ``wait=False``: give up (None) when
    another process is building."""
    import fcntl

    directory = library_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / f"{_LIB_NAME}.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError:
            return None
        return build(directory, quiet=quiet)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["build"]:
        path = locked_build(quiet=False)
        return 0 if path is not None else 1
    if argv[:1] == ["status"]:
        lib = loaded_library()
        print(lib if lib is not None else "no library (numba only)")
        return 0
    if argv[:1] == ["warm"]:
        # Warming runs the commands, which sit above this module: it is a
        # sub-command of the command line now.
        sys.stderr.write("python -m hwtrace.aot: 'warm' is now 'hwtrace aot warm'\n")
        return 2
    sys.stderr.write("usage: python -m hwtrace.aot build|status (hwtrace aot warm|build|status)\n")
    return 2


if __name__ == "__main__":
    # Run as a script this file is __main__, a second copy of the module:
    # the loops register with the one the package imports.
    from hwtrace.aot import main as _main

    sys.exit(_main())
