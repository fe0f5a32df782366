"""Native building blocks every filter tier shares: raw memory loads, the
field-path walk, string comparison and globbing, and the eBPF helpers.

All of it is compiled loops (:mod:`hwtrace.aot`, ``cache=True``).  Memory
is reached by address (a filter reads the host's records where they are),
through the ``load_*``/``store_*`` intrinsics (defined once numba is
imported, see :func:`_numba_extensions`; the Python functions of the same
names stand in for them outside compiled code).  :func:`helper_address`
gives each helper as a C function ``int64 (int64, int64, int64, int64,
int64)`` for machine code that calls it (the eBPF JIT), from hwtrace's
native library when it holds it (no numba in the process then);
interpreters call the same functions directly (:func:`call_helper`).

The shared threshold table (``set_threshold``/``get_threshold``) is reached
through a pointer the process sets up once (:func:`threshold_table`), so a
later tier can point it at memory shared with the kernel.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable

import numpy as np

from .. import aot
from . import abi
from .schema import (
    LEAF_STRING,
    P_ADD,
    P_COUNT,
    P_DATA_LOC,
    P_DEREF,
    P_ELEM,
    ROOT_CONTEXT,
    STRING_DATA_LOC,
    STRING_INLINE,
    STRING_PTR,
)

# -- raw memory --------------------------------------------------------------------
# Python stand-ins; compiled code gets numba intrinsics of the same names
# (one unaligned load or store at an address, see _numba_extensions).


def _py_loader(ctype) -> Callable[[int], int | float]:
    def load(addr: int) -> int | float:
        return ctype.from_address(addr).value

    return load


def _py_storer(ctype) -> Callable[[int, int], None]:
    def store(addr: int, value: int) -> None:
        ctype.from_address(addr).value = value

    return store


_C_TYPES = {
    "u8": ctypes.c_uint8, "u16": ctypes.c_uint16, "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64, "i8": ctypes.c_int8, "i16": ctypes.c_int16,
    "i32": ctypes.c_int32, "i64": ctypes.c_int64, "f32": ctypes.c_float,
    "f64": ctypes.c_double,
}  # fmt: skip
load_u8, load_u16, load_u32, load_u64 = (
    _py_loader(_C_TYPES[t]) for t in ("u8", "u16", "u32", "u64")
)
load_i8, load_i16, load_i32, load_i64 = (
    _py_loader(_C_TYPES[t]) for t in ("i8", "i16", "i32", "i64")
)
load_f32, load_f64 = _py_loader(_C_TYPES["f32"]), _py_loader(_C_TYPES["f64"])
store_u8, store_u16, store_u32, store_u64 = (
    _py_storer(_C_TYPES[t]) for t in ("u8", "u16", "u32", "u64")
)


@aot.njit(cache=True, inline="always", _nrt=False)
def load_int(addr: int, size: int, signed: bool) -> int:
    """An integer of ``size`` bytes at ``addr`` as s64 (LTTng casts all
    integers to signed 64-bit)."""
    if size == 8:
        return load_i64(addr)
    if size == 4:
        return np.int64(load_i32(addr)) if signed else np.int64(load_u32(addr))
    if size == 2:
        return np.int64(load_i16(addr)) if signed else np.int64(load_u16(addr))
    return np.int64(load_i8(addr)) if signed else np.int64(load_u8(addr))


# -- field paths ---------------------------------------------------------------------

_HEADER = 6
NO_LIMIT = np.int64(1) << 62  # a C string's length bound: none


@aot.njit(cache=True, inline="always", _nrt=False)
def walk_path(path: int, event: int, context: int) -> int:
    """The address of a path's leaf slot (see :mod:`.schema`), or 0 when it
    is missing.  ``path`` is the address of the path's int64 code."""
    root = context if load_i64(path) == ROOT_CONTEXT else event
    addr = root
    limit = np.int64(-1)
    nsteps = load_i64(path + 8 * 5)
    p = path + 8 * _HEADER
    for _ in range(nsteps):
        op = load_i64(p)
        a = load_i64(p + 8)
        b = load_i64(p + 16)
        c = load_i64(p + 24)
        p += 32
        if op == P_ADD:
            addr += a
        elif op == P_DEREF:
            addr = load_i64(addr)
            if addr == 0:
                return 0
        elif op == P_DATA_LOC:
            v = np.int64(load_u32(addr))
            addr = root + (v & 0xFFFF)
            limit = v >> 16
        elif op == P_COUNT:
            n = load_int(addr + a, -b if b < 0 else b, b < 0)
            limit = (n if n > 0 else 0) * c
        elif op == P_ELEM:
            if a < 0 or (a + 1) * b > limit:
                return 0
            addr += a * b
            limit = -1
        else:
            return 0
    return addr


@aot.njit(cache=True, inline="always", _nrt=False)
def string_at(path: int, event: int, context: int) -> tuple[int, int]:
    """``(address, bound)`` of a string leaf (it ends at its first NUL or at
    ``bound`` bytes), or ``(0, 0)`` when missing."""
    slot = walk_path(path, event, context)
    if slot == 0 or load_i64(path + 8) != LEAF_STRING:
        return 0, 0
    storage = load_i64(path + 24)
    if storage == STRING_PTR:
        s = load_i64(slot)
        if s == 0:
            return 0, 0
        return s, NO_LIMIT
    if storage == STRING_INLINE:
        return slot, load_i64(path + 32)
    if storage == STRING_DATA_LOC:
        root = context if load_i64(path) == ROOT_CONTEXT else event
        v = np.int64(load_u32(slot))
        return root + (v & 0xFFFF), v >> 16
    return 0, 0


@aot.njit(cache=True, _nrt=False, native_inline=True)
def str_equal(s: int, bound: int, lit: int, n: int) -> bool:
    """The string at ``s`` (ends at NUL or ``bound``) equals the ``n`` bytes
    at ``lit``.  libc's vectorised strnlen and memcmp: the length first (it
    never reads past the string's end), then the bytes."""
    if n > bound:
        return False
    if _strnlen(s, n + 1 if n < bound else n) != n:
        return False
    return _memcmp(s, lit, n) == 0


@aot.njit(cache=True, _nrt=False, native_inline=True)
def strings_equal(a: int, abound: int, b: int, bbound: int) -> bool:
    i = 0
    while True:
        ca = load_u8(a + i) if i < abound else np.uint8(0)
        cb = load_u8(b + i) if i < bbound else np.uint8(0)
        if ca != cb:
            return False
        if ca == 0:
            return True
        i += 1


@aot.njit(cache=True, _nrt=False, native_inline=True)
def glob_match(s: int, bound: int, pat: int, n: int) -> bool:
    """LTTng's star globbing: ``*`` matches any run of bytes, ``\\*`` a star,
    ``\\\\`` a backslash.  Greedy with one backtrack point: linear for one
    star, at worst O(len(s) * n)."""
    i = 0  # in s
    p = 0  # in pat
    star_p = -1
    star_i = 0
    while True:
        c = load_u8(s + i) if i < bound else np.uint8(0)
        if p < n:
            pc = load_u8(pat + p)
            if pc == 42:  # '*'
                star_p = p + 1
                star_i = i
                p += 1
                continue
            width = 1
            if pc == 92 and p + 1 < n:  # '\' escapes the next byte
                pc = load_u8(pat + p + 1)
                width = 2
            if c != 0 and c == pc:
                i += 1
                p += width
                continue
        elif c == 0:
            return True
        if star_p < 0:
            return False
        # Let the last star take one more byte and retry from after it.
        if (load_u8(s + star_i) if star_i < bound else np.uint8(0)) == 0:
            return False
        star_i += 1
        i = star_i
        p = star_p


# -- doubles as bits (Python stand-ins of intrinsics: one bitcast) ----------------------


def as_double(bits: int) -> float:
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def as_float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & 0xFFFFFFFF))[0]


def double_bits(v: float) -> int:
    return struct.unpack("<q", struct.pack("<d", v))[0]


@aot.njit(cache=True, _nrt=False, native_inline=True)
def double_compare(a: float, b: float, op: int) -> bool:
    """``a OP b`` as C compares doubles (NaN: only ``!=`` holds)."""
    if op == abi.DOUBLE_EQ:
        return a == b
    if op == abi.DOUBLE_NE:
        return a != b
    if op == abi.DOUBLE_LT:
        return a < b
    if op == abi.DOUBLE_LE:
        return a <= b
    if op == abi.DOUBLE_GT:
        return a > b
    return a >= b


# -- helpers ---------------------------------------------------------------------------

_THRESHOLD_SYMBOL = "hwtrace_filter_threshold_table"
_THRESHOLD_SLOTS_SYMBOL = "hwtrace_filter_threshold_slots"
_threshold_storage = (ctypes.c_int64 * abi.THRESHOLD_SLOTS)()
# The compiled helpers read the table's address and length from these
# slots, resolved by name when numba loads them (also from its cache, in a
# new process).
_threshold_pointer = ctypes.c_int64(ctypes.addressof(_threshold_storage))
_threshold_slots = ctypes.c_int64(abi.THRESHOLD_SLOTS)
# (hwtrace's native library has its own copies of the two, see aot.LIBRARY_GLOBALS.)
assert (_THRESHOLD_SYMBOL, _THRESHOLD_SLOTS_SYMBOL) == aot.LIBRARY_GLOBALS


def threshold_table() -> np.ndarray:
    """The shared threshold table as an int64 array (writable)."""
    return np.ctypeslib.as_array(
        (ctypes.c_int64 * _threshold_slots.value).from_address(_threshold_pointer.value)
    )


def threshold_table_address() -> int:
    return _threshold_pointer.value


def set_threshold_table(address: int, slots: int = abi.THRESHOLD_SLOTS) -> None:
    """Point the helpers at another table of ``slots`` int64 (e.g. memory
    shared with the kernel); address 0 restores the process's own."""
    if not address:
        address, slots = ctypes.addressof(_threshold_storage), abi.THRESHOLD_SLOTS
    _threshold_slots.value = slots
    _threshold_pointer.value = address
    _share_table()


def _share_table() -> None:
    """Give the native library's copies of the table's address and length
    the values of the process's (now, and when the library is loaded)."""
    aot.set_library_global(_THRESHOLD_SYMBOL, _threshold_pointer.value)
    aot.set_library_global(_THRESHOLD_SLOTS_SYMBOL, _threshold_slots.value)


_share_table()


# Python stand-ins of the intrinsics _numba_extensions defines.
def _threshold_base() -> int:
    return _threshold_pointer.value


def _threshold_count() -> int:
    return _threshold_slots.value


def _syscall0(number: int) -> int:
    return ctypes.CDLL(None).syscall(number)


def _sched_getcpu() -> int:
    return ctypes.CDLL(None).sched_getcpu()


def _clock_ns(clock: int) -> int:
    import time

    return time.clock_gettime_ns(clock)


def _strnlen(s: int, n: int) -> int:
    i = 0
    while i < n and load_u8(s + i) != 0:
        i += 1
    return i


def _memcmp(a: int, b: int, n: int) -> int:
    x, y = ctypes.string_at(a, n), ctypes.string_at(b, n)
    return (x > y) - (x < y)


_SYS_GETPID, _SYS_GETTID = 39, 186
_CLOCK_MONOTONIC = 1


@aot.njit(cache=True, _nrt=False, native_inline=True)
def _ktime_ns() -> int:
    return _clock_ns(_CLOCK_MONOTONIC)


@aot.njit(cache=True, _nrt=False, native_inline=True)
def call_helper(helper: int, r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    """Run helper number ``helper`` (see :mod:`.abi`); unknown numbers give -1
    (the verifier never lets a program call one)."""
    if helper == abi.HELPER_FIELD_ADDR:
        return walk_path(r3, r1, r2)
    if helper == abi.HELPER_STR_EQ or helper == abi.HELPER_STR_GLOB:
        s, bound = string_at(r3, r1, r2)
        if s == 0:
            return -1
        if helper == abi.HELPER_STR_EQ:
            return 1 if str_equal(s, bound, r4, r5) else 0
        return 1 if glob_match(s, bound, r4, r5) else 0
    if helper == abi.HELPER_STR_FIELDS_EQ:
        a, abound = string_at(r3, r1, r2)
        b, bbound = string_at(r4, r1, r2)
        if a == 0 or b == 0:
            return -1
        return 1 if strings_equal(a, abound, b, bbound) else 0
    if helper == abi.HELPER_GET_THRESHOLD:
        if r1 < 0 or r1 >= _threshold_count():
            return 0
        return load_i64(_threshold_base() + 8 * r1)
    if helper == abi.HELPER_SET_THRESHOLD:
        if r1 < 0 or r1 >= _threshold_count():
            return -1
        store_u64(_threshold_base() + 8 * r1, r2)
        return 0
    if helper == abi.HELPER_GET_PID:
        return _syscall0(_SYS_GETPID)
    if helper == abi.HELPER_GET_TID:
        return _syscall0(_SYS_GETTID)
    if helper == abi.HELPER_GET_CPU:
        return _sched_getcpu()
    if helper == abi.HELPER_KTIME_NS:
        return _ktime_ns()
    if helper == abi.HELPER_DOUBLE_CMP:
        return 1 if double_compare(as_double(r1), as_double(r2), r3) else 0
    if helper == abi.HELPER_S64_TO_DOUBLE:
        return double_bits(np.float64(r1))
    if helper == abi.HELPER_F32_TO_DOUBLE:
        return double_bits(np.float64(as_float(r1)))
    return -1


_C_SIG = "int64(int64, int64, int64, int64, int64)"


# One C entry point per helper, each going straight to its work (no
# dispatch on the helper number at run time): machine code calls these.
# (native_inline: the library inlines them into their C trampolines, and
# the string and helper functions into them, as numba's own cfuncs have
# them; a call more per predicate made the JIT's helper calls 9% slower.)
@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_field_addr(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return walk_path(r3, r1, r2)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_str_eq(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    s, bound = string_at(r3, r1, r2)
    if s == 0:
        return -1
    return 1 if str_equal(s, bound, r4, r5) else 0


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_str_glob(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    s, bound = string_at(r3, r1, r2)
    if s == 0:
        return -1
    return 1 if glob_match(s, bound, r4, r5) else 0


# The rarer helpers: call_helper with the helper's number (a constant of
# the compiled code).


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_str_fields_eq(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_STR_FIELDS_EQ, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_get_threshold(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_GET_THRESHOLD, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_set_threshold(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_SET_THRESHOLD, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_get_pid(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_GET_PID, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_get_tid(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_GET_TID, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_get_cpu(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_GET_CPU, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_ktime_ns(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_KTIME_NS, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_double_cmp(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_DOUBLE_CMP, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_s64_to_double(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_S64_TO_DOUBLE, r1, r2, r3, r4, r5)


@aot.njit(cache=True, _nrt=False, c_args=5, native_inline=True)
def _c_f32_to_double(r1: int, r2: int, r3: int, r4: int, r5: int) -> int:
    return call_helper(abi.HELPER_F32_TO_DOUBLE, r1, r2, r3, r4, r5)


_C_LOOPS: dict[int, aot.CompiledLoop] = {
    abi.HELPER_FIELD_ADDR: _c_field_addr,
    abi.HELPER_STR_EQ: _c_str_eq,
    abi.HELPER_STR_GLOB: _c_str_glob,
    abi.HELPER_STR_FIELDS_EQ: _c_str_fields_eq,
    abi.HELPER_GET_THRESHOLD: _c_get_threshold,
    abi.HELPER_SET_THRESHOLD: _c_set_threshold,
    abi.HELPER_GET_PID: _c_get_pid,
    abi.HELPER_GET_TID: _c_get_tid,
    abi.HELPER_GET_CPU: _c_get_cpu,
    abi.HELPER_KTIME_NS: _c_ktime_ns,
    abi.HELPER_DOUBLE_CMP: _c_double_cmp,
    abi.HELPER_S64_TO_DOUBLE: _c_s64_to_double,
    abi.HELPER_F32_TO_DOUBLE: _c_f32_to_double,
}
assert set(_C_LOOPS) == set(abi.HELPERS)
_addresses: dict[int, int] = {}
_cfuncs: list = []  # numba's C functions made here (kept alive)


def c_entry(loop: aot.CompiledLoop, signature: str) -> int:
    """The address of ``loop`` as a C function (declared with
    ``c_args``): hwtrace's native library's, else one numba makes (numba is
    imported then; the library is built with it for next time)."""
    address = aot.c_address(loop)
    if address is not None:
        return address
    from numba import cfunc

    fn = cfunc(signature, cache=True)(loop.py_func)
    _cfuncs.append(fn)
    return fn.address


def helper_address(helper: int) -> int:
    """The address of helper ``helper`` as a C function of five int64
    arguments returning int64 (for generated machine code)."""
    if helper not in abi.HELPERS:
        raise KeyError(f"no eBPF helper number {helper}")
    address = _addresses.get(helper)
    if address is None:
        address = _addresses[helper] = c_entry(_C_LOOPS[helper], _C_SIG)
    return address


# The names _numba_extensions gives intrinsics, and their stand-ins.
_INTRINSICS = (
    *(f"load_{t}" for t in _C_TYPES), "store_u8", "store_u16", "store_u32", "store_u64",
    "as_double", "as_float", "double_bits", "_threshold_base", "_threshold_count",
    "_syscall0", "_sched_getcpu", "_strnlen", "_memcmp", "_clock_ns",
)  # fmt: skip
# (by id, the stand-ins held so that no other object takes their ids)
_STAND_INS = {id(globals()[name]): (name, globals()[name]) for name in _INTRINSICS}


def use_intrinsics(namespace: dict) -> None:
    """Give a module that imported stand-ins from here (under any name) the
    intrinsics in their place: its on_numba hook calls this (native's own
    hook has run by then, the module having imported this one first)."""
    for key, value in list(namespace.items()):
        known = _STAND_INS.get(id(value))
        if known is not None and known[1] is value:
            namespace[key] = globals()[known[0]]


def _numba_extensions() -> None:
    """The intrinsics compiled code uses in place of the Python stand-ins
    above (numba is imported by now)."""
    from llvmlite import binding as llvm
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    def loader(nbtype):
        def load(typingctx, addr):
            def codegen(context, builder, signature, args):
                lty = context.get_value_type(nbtype)
                ptr = builder.inttoptr(args[0], lty.as_pointer())
                return builder.load(ptr, align=1)

            return nbtype(types.int64), codegen

        return intrinsic(load)

    def storer(nbtype):
        def store(typingctx, addr, value):
            def codegen(context, builder, signature, args):
                lty = context.get_value_type(nbtype)
                ptr = builder.inttoptr(args[0], lty.as_pointer())
                val = context.cast(builder, args[1], signature.args[1], nbtype)
                builder.store(val, ptr, align=1)
                return context.get_dummy_value()

            return types.void(types.int64, value), codegen

        return intrinsic(store)

    def bitcast(name, src, dst, lty, *, low32=False):
        def cast(typingctx, value):
            def codegen(context, builder, signature, args):
                v = args[0]
                if low32:
                    v = builder.trunc(v, ir.IntType(32))
                return builder.bitcast(v, lty)

            return dst(src), codegen

        cast.__name__ = name
        return intrinsic(cast)

    def global_i64(symbol: str):
        def read(typingctx):
            def codegen(context, builder, signature, args):
                mod = builder.module
                gv = mod.globals.get(symbol)
                if gv is None:
                    gv = ir.GlobalVariable(mod, ir.IntType(64), symbol)
                    gv.linkage = "external"
                return builder.load(gv)

            return types.int64(), codegen

        return intrinsic(read)

    i64, i32 = ir.IntType(64), ir.IntType(32)

    def declare(builder, name: str, restype, argtypes):
        fn = builder.module.globals.get(name)
        if fn is None:
            fn = ir.Function(builder.module, ir.FunctionType(restype, argtypes), name)
        return fn

    def libc_call(name, restype, argtypes):
        """libc ``name`` on int64 arguments (narrowed as declared), its
        result widened to int64."""

        def codegen(context, builder, signature, values):
            fn = declare(builder, name, restype, argtypes)
            conv = [
                builder.trunc(v, t) if t.width < 64 else v
                for v, t in zip(values, argtypes, strict=True)
            ]
            r = builder.call(fn, conv)
            return builder.sext(r, i64) if restype.width < 64 else r

        sig = types.int64(*([types.int64] * len(argtypes)))
        # (numba types an intrinsic by its parameters: one per argument)
        typers = {
            0: lambda typingctx: (sig, codegen),
            1: lambda typingctx, a: (sig, codegen),
            2: lambda typingctx, a, b: (sig, codegen),
            3: lambda typingctx, a, b, c: (sig, codegen),
        }
        typer = typers[len(argtypes)]
        typer.__name__ = typer.__qualname__ = name
        return intrinsic(typer)

    def clock_ns(typingctx, clock):
        """libc ``clock_gettime(clock, &ts)``, as nanoseconds."""

        def codegen(context, builder, signature, args):
            with builder.goto_entry_block():  # (once, where it is inlined into a loop)
                ts = builder.alloca(ir.ArrayType(i64, 2))
            fn = declare(builder, "clock_gettime", i32, [i32, i64])
            builder.call(fn, [builder.trunc(args[0], i32), builder.ptrtoint(ts, i64)])
            sec = builder.load(builder.gep(ts, [ir.Constant(i32, 0), ir.Constant(i32, 0)]))
            nsec = builder.load(builder.gep(ts, [ir.Constant(i32, 0), ir.Constant(i32, 1)]))
            return builder.add(builder.mul(sec, ir.Constant(i64, 1_000_000_000)), nsec)

        return types.int64(types.int64), codegen

    loads = {t: loader(getattr(types, n)) for t, n in (
        ("u8", "uint8"), ("u16", "uint16"), ("u32", "uint32"), ("u64", "uint64"),
        ("i8", "int8"), ("i16", "int16"), ("i32", "int32"), ("i64", "int64"),
        ("f32", "float32"), ("f64", "float64"),
    )}  # fmt: skip
    g = globals()
    for t, fn in loads.items():
        g["load_" + t] = fn
    for t in ("u8", "u16", "u32", "u64"):
        g["store_" + t] = storer(getattr(types, "uint" + t[1:]))
    g["as_double"] = bitcast("as_double", types.int64, types.float64, ir.DoubleType())
    g["as_float"] = bitcast("as_float", types.int64, types.float32, ir.FloatType(), low32=True)
    g["double_bits"] = bitcast("double_bits", types.float64, types.int64, i64)
    g["_threshold_base"] = global_i64(_THRESHOLD_SYMBOL)
    g["_threshold_count"] = global_i64(_THRESHOLD_SLOTS_SYMBOL)
    g["_syscall0"] = libc_call("syscall", i64, [i64])
    g["_sched_getcpu"] = libc_call("sched_getcpu", i32, [])
    g["_strnlen"] = libc_call("strnlen", i64, [i64, i64])
    g["_memcmp"] = libc_call("memcmp", i32, [i64, i64, i64])
    g["_clock_ns"] = intrinsic(clock_ns)
    # numba's JIT finds the table's address and length here.
    llvm.add_symbol(_THRESHOLD_SYMBOL, ctypes.addressof(_threshold_pointer))
    llvm.add_symbol(_THRESHOLD_SLOTS_SYMBOL, ctypes.addressof(_threshold_slots))


aot.on_numba(_numba_extensions)
