"""Native building blocks every filter tier shares: raw memory loads, the
field-path walk, string comparison and globbing, and the eBPF helpers.

All of it is numba nopython code (``cache=True``).  Memory is reached by
address (a filter reads the host's records where they are), through the
:func:`load`/:func:`store` intrinsics.  :func:`helper_address` gives each
helper as a C function ``int64 (int64, int64, int64, int64, int64)`` for
machine code that calls it (the eBPF JIT); interpreters call the same
functions directly (:func:`call_helper`).

The shared threshold table (``set_threshold``/``get_threshold``) is reached
through a pointer the process sets up once (:func:`threshold_table`), so a
later tier can point it at memory shared with the kernel.
"""

from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import binding as llvm
from llvmlite import ir
from numba import cfunc, njit, types
from numba.extending import intrinsic

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


def _loader(nbtype):
    @intrinsic
    def load(typingctx, addr):
        def codegen(context, builder, signature, args):
            lty = context.get_value_type(nbtype)
            ptr = builder.inttoptr(args[0], lty.as_pointer())
            return builder.load(ptr, align=1)

        return nbtype(types.int64), codegen

    return load


def _storer(nbtype):
    @intrinsic
    def store(typingctx, addr, value):
        def codegen(context, builder, signature, args):
            lty = context.get_value_type(nbtype)
            ptr = builder.inttoptr(args[0], lty.as_pointer())
            val = context.cast(builder, args[1], signature.args[1], nbtype)
            builder.store(val, ptr, align=1)
            return context.get_dummy_value()

        return types.void(types.int64, value), codegen

    return store


load_u8, load_u16, load_u32, load_u64 = (
    _loader(t) for t in (types.uint8, types.uint16, types.uint32, types.uint64)
)
load_i8, load_i16, load_i32, load_i64 = (
    _loader(t) for t in (types.int8, types.int16, types.int32, types.int64)
)
load_f32, load_f64 = _loader(types.float32), _loader(types.float64)
store_u8, store_u16, store_u32, store_u64 = (
    _storer(t) for t in (types.uint8, types.uint16, types.uint32, types.uint64)
)


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
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


@njit(cache=True)
def str_equal(s: int, bound: int, lit: int, n: int) -> bool:
    """The string at ``s`` (ends at NUL or ``bound``) equals the ``n`` bytes
    at ``lit``.  libc's vectorised strnlen and memcmp: the length first (it
    never reads past the string's end), then the bytes."""
    if n > bound:
        return False
    if _strnlen(s, n + 1 if n < bound else n) != n:
        return False
    return _memcmp(s, lit, n) == 0


@njit(cache=True)
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


@njit(cache=True)
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


# -- doubles as bits ------------------------------------------------------------------


@njit(cache=True, inline="always")
def _as_double(bits: int) -> float:
    return np.array([bits], np.int64).view(np.float64)[0]


@njit(cache=True, inline="always")
def _as_float(bits: int) -> float:
    return np.array([bits & 0xFFFFFFFF], np.uint32).view(np.float32)[0]


@njit(cache=True, inline="always")
def _double_bits(v: float) -> int:
    return np.array([v], np.float64).view(np.int64)[0]


@njit(cache=True)
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
llvm.add_symbol(_THRESHOLD_SYMBOL, ctypes.addressof(_threshold_pointer))
llvm.add_symbol(_THRESHOLD_SLOTS_SYMBOL, ctypes.addressof(_threshold_slots))


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


def _global_i64(symbol: str):
    @intrinsic
    def read(typingctx):
        def codegen(context, builder, signature, args):
            mod = builder.module
            gv = mod.globals.get(symbol)
            if gv is None:
                gv = ir.GlobalVariable(mod, ir.IntType(64), symbol)
                gv.linkage = "external"
            return builder.load(gv)

        return types.int64(), codegen

    return read


_threshold_base = _global_i64(_THRESHOLD_SYMBOL)
_threshold_count = _global_i64(_THRESHOLD_SLOTS_SYMBOL)


def _declare(builder, name: str, restype, argtypes):
    fn = builder.module.globals.get(name)
    if fn is None:
        fn = ir.Function(builder.module, ir.FunctionType(restype, argtypes), name)
    return fn


_i64, _i32 = ir.IntType(64), ir.IntType(32)


@intrinsic
def _syscall0(typingctx, number):
    """libc ``syscall(number)``."""

    def codegen(context, builder, signature, args):
        return builder.call(_declare(builder, "syscall", _i64, [_i64]), [args[0]])

    return types.int64(types.int64), codegen


@intrinsic
def _sched_getcpu(typingctx):
    def codegen(context, builder, signature, args):
        r = builder.call(_declare(builder, "sched_getcpu", _i32, []), [])
        return builder.sext(r, _i64)

    return types.int64(), codegen


@intrinsic
def _clock_gettime(typingctx, clock, timespec):
    """libc ``clock_gettime(clock, (struct timespec *)timespec)``."""

    def codegen(context, builder, signature, args):
        fn = _declare(builder, "clock_gettime", _i32, [_i32, _i64])
        r = builder.call(fn, [builder.trunc(args[0], _i32), args[1]])
        return builder.sext(r, _i64)

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def _strnlen(typingctx, s, n):
    """libc ``strnlen((const char *)s, n)``."""

    def codegen(context, builder, signature, args):
        fn = _declare(builder, "strnlen", _i64, [_i64, _i64])
        return builder.call(fn, [args[0], args[1]])

    return types.int64(types.int64, types.int64), codegen


@intrinsic
def _memcmp(typingctx, a, b, n):
    """libc ``memcmp((const void *)a, (const void *)b, n)``."""

    def codegen(context, builder, signature, args):
        fn = _declare(builder, "memcmp", _i32, [_i64, _i64, _i64])
        return builder.sext(builder.call(fn, [args[0], args[1], args[2]]), _i64)

    return types.int64(types.int64, types.int64, types.int64), codegen


_SYS_GETPID, _SYS_GETTID = 39, 186
_CLOCK_MONOTONIC = 1


@njit(cache=True)
def _ktime_ns() -> int:
    ts = np.zeros(2, np.int64)
    _clock_gettime(_CLOCK_MONOTONIC, ts.ctypes.data)
    return ts[0] * 1_000_000_000 + ts[1]


@njit(cache=True)
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
        return 1 if double_compare(_as_double(r1), _as_double(r2), r3) else 0
    if helper == abi.HELPER_S64_TO_DOUBLE:
        return _double_bits(np.float64(r1))
    if helper == abi.HELPER_F32_TO_DOUBLE:
        return _double_bits(np.float64(_as_float(r1)))
    return -1


_C_SIG = "int64(int64, int64, int64, int64, int64)"
_cfuncs: dict[int, object] = {}


# One C entry point per helper, each going straight to its work (no
# dispatch on the helper number): machine code calls these.  They are
# module-level functions so numba can cache their compiled code.
def _c_field_addr(r1, r2, r3, r4, r5):
    return walk_path(r3, r1, r2)


def _c_str_eq(r1, r2, r3, r4, r5):
    s, bound = string_at(r3, r1, r2)
    if s == 0:
        return -1
    return 1 if str_equal(s, bound, r4, r5) else 0


def _c_str_glob(r1, r2, r3, r4, r5):
    s, bound = string_at(r3, r1, r2)
    if s == 0:
        return -1
    return 1 if glob_match(s, bound, r4, r5) else 0


_C_ENTRIES = {
    abi.HELPER_FIELD_ADDR: _c_field_addr,
    abi.HELPER_STR_EQ: _c_str_eq,
    abi.HELPER_STR_GLOB: _c_str_glob,
}


def _make_cfunc(helper: int):
    entry = _C_ENTRIES.get(helper)
    if entry is not None:
        return cfunc(_C_SIG, cache=True)(entry)

    # The rarer helpers share the dispatching path.
    def dispatch(r1, r2, r3, r4, r5):
        return call_helper(helper, r1, r2, r3, r4, r5)

    return cfunc(_C_SIG, cache=False)(dispatch)


def helper_address(helper: int) -> int:
    """The address of helper ``helper`` as a C function of five int64
    arguments returning int64 (for generated machine code)."""
    if helper not in abi.HELPERS:
        raise KeyError(f"no eBPF helper number {helper}")
    fn = _cfuncs.get(helper)
    if fn is None:
        fn = _cfuncs[helper] = _make_cfunc(helper)
    return fn.address  # type: ignore[attr-defined]
