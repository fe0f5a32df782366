"""LTTng-style filter bytecode: the instruction format, its validator and
its interpreter (the baseline tier of Sharma and Dagenais, "Enhanced
Userspace and In-Kernel Trace Filtering for Production Systems", JCST 2016).

The format follows LTTng 2.x (``filter-bytecode.h``): variable-length
packed instructions with a 1-byte opcode (LTTng's numbers where an op has
an LTTng counterpart), little-endian operands, ``AND``/``OR`` carrying a
16-bit skip offset absolute from the start of the bytecode.  Ops are typed
(the code generator in :mod:`.lttng` specialises them, as LTTng's
specialisation pass does), so the interpreter never decides a type at run
time except which side of a string comparison is the literal.

The interpreter is LTTng's hybrid stack/register machine: the top two
stack entries live in registers ``ax`` and ``bx`` (here: SSA values of the
dispatch loop), the rest in a small stack in the native frame.  Each entry
holds a type tag, an s64, a double and a string (address, bound).  A push
spills ``bx`` to the stack and moves ``ax`` to ``bx``; a binary op computes
from ``bx`` and ``ax``, refills ``bx`` from the stack and leaves its result
in ``ax``.  Dispatch is a switch on the opcode.

The opcodes live here, beside the code that executes them, because numba's
cache only notices edits to the file that holds a compiled function.
"""

from __future__ import annotations

import ctypes

import numpy as np

from .. import aot
from . import native
from .native import (
    NO_LIMIT,
    as_double,
    double_bits,
    glob_match,
    load_f32,
    load_f64,
    load_i64,
    load_int,
    load_u8,
    load_u16,
    load_u32,
    store_u64,
    str_equal,
    string_at,
    strings_equal,
    walk_path,
)

# -- opcodes (LTTng's numbering) ----------------------------------------------------

RETURN = 1
BIT_RSHIFT, BIT_LSHIFT, BIT_AND, BIT_OR, BIT_XOR = 7, 8, 9, 10, 11
EQ_STRING, NE_STRING = 18, 19
EQ_S64, NE_S64, GT_S64, LT_S64, GE_S64, LE_S64 = 24, 25, 26, 27, 28, 29
EQ_DOUBLE, NE_DOUBLE, GT_DOUBLE, LT_DOUBLE, GE_DOUBLE, LE_DOUBLE = 30, 31, 32, 33, 34, 35
# Mixed: EQ_DOUBLE_S64 compares a double (left, bx) with an s64 (right, ax).
EQ_DOUBLE_S64, NE_DOUBLE_S64, GT_DOUBLE_S64, LT_DOUBLE_S64, GE_DOUBLE_S64, LE_DOUBLE_S64 = (
    36, 37, 38, 39, 40, 41,
)  # fmt: skip
EQ_S64_DOUBLE, NE_S64_DOUBLE, GT_S64_DOUBLE, LT_S64_DOUBLE, GE_S64_DOUBLE, LE_S64_DOUBLE = (
    42, 43, 44, 45, 46, 47,
)  # fmt: skip
UNARY_PLUS_S64, UNARY_MINUS_S64, UNARY_NOT_S64 = 51, 52, 53
UNARY_PLUS_DOUBLE, UNARY_MINUS_DOUBLE, UNARY_NOT_DOUBLE = 54, 55, 56
AND, OR = 57, 58
# Static-offset loads: [op][u16 offset][u8 size | 0x80 signed]  (S64, DOUBLE)
#                      [op][u16 offset][u8 storage][u16 capacity]  (STRING)
LOAD_FIELD_REF_STRING, LOAD_FIELD_REF_S64, LOAD_FIELD_REF_DOUBLE = 60, 62, 63
LOAD_STRING, LOAD_S64, LOAD_DOUBLE = 64, 65, 66  # [u16 literal] / [i64] / [f64]
GET_CONTEXT_REF_STRING, GET_CONTEXT_REF_S64, GET_CONTEXT_REF_DOUBLE = 71, 72, 73
LOAD_STAR_GLOB_STRING = 76  # [u16 literal]: a pattern (* wildcard, \* \\ escapes)
EQ_STAR_GLOB_STRING, NE_STAR_GLOB_STRING = 77, 78
# Loads through the linked field table (a path walk): [op][u16 field index].
LOAD_FIELD_S64, LOAD_FIELD_STRING, LOAD_FIELD_DOUBLE = 90, 95, 97
UNARY_BIT_NOT = 98
# A reference linking could not resolve (the schema lacks the field; LTTng's
# lenient mode): evaluating it makes the whole filter false.
# [op][u16 field index][u8 type it stands for: 0 s64, 1 double, 2 string]
LOAD_FIELD_UNLINKED = 99

_OPCODES = (
    "RETURN BIT_RSHIFT BIT_LSHIFT BIT_AND BIT_OR BIT_XOR EQ_STRING NE_STRING "
    "EQ_S64 NE_S64 GT_S64 LT_S64 GE_S64 LE_S64 "
    "EQ_DOUBLE NE_DOUBLE GT_DOUBLE LT_DOUBLE GE_DOUBLE LE_DOUBLE "
    "EQ_DOUBLE_S64 NE_DOUBLE_S64 GT_DOUBLE_S64 LT_DOUBLE_S64 GE_DOUBLE_S64 LE_DOUBLE_S64 "
    "EQ_S64_DOUBLE NE_S64_DOUBLE GT_S64_DOUBLE LT_S64_DOUBLE GE_S64_DOUBLE LE_S64_DOUBLE "
    "UNARY_PLUS_S64 UNARY_MINUS_S64 UNARY_NOT_S64 "
    "UNARY_PLUS_DOUBLE UNARY_MINUS_DOUBLE UNARY_NOT_DOUBLE AND OR "
    "LOAD_FIELD_REF_STRING LOAD_FIELD_REF_S64 LOAD_FIELD_REF_DOUBLE "
    "LOAD_STRING LOAD_S64 LOAD_DOUBLE "
    "GET_CONTEXT_REF_STRING GET_CONTEXT_REF_S64 GET_CONTEXT_REF_DOUBLE "
    "LOAD_STAR_GLOB_STRING EQ_STAR_GLOB_STRING NE_STAR_GLOB_STRING "
    "LOAD_FIELD_S64 LOAD_FIELD_STRING LOAD_FIELD_DOUBLE UNARY_BIT_NOT LOAD_FIELD_UNLINKED"
).split()
#: Opcode -> LTTng's name (without the FILTER_OP_ prefix).
OP_NAMES: dict[int, str] = {globals()[name]: name for name in _OPCODES}

_SIZES = {
    **{op: 1 for op in OP_NAMES},
    AND: 3,
    OR: 3,
    LOAD_FIELD_REF_S64: 4,
    LOAD_FIELD_REF_DOUBLE: 4,
    GET_CONTEXT_REF_S64: 4,
    GET_CONTEXT_REF_DOUBLE: 4,
    LOAD_FIELD_REF_STRING: 6,
    GET_CONTEXT_REF_STRING: 6,
    LOAD_STRING: 3,
    LOAD_STAR_GLOB_STRING: 3,
    LOAD_S64: 9,
    LOAD_DOUBLE: 9,
    LOAD_FIELD_S64: 3,
    LOAD_FIELD_DOUBLE: 3,
    LOAD_FIELD_STRING: 3,
    LOAD_FIELD_UNLINKED: 4,
}
#: Bytes of each instruction by opcode (0: no such opcode).
INSN_SIZE = np.zeros(256, np.int64)
for _op, _n in _SIZES.items():
    INSN_SIZE[_op] = _n

# String storage byte of LOAD_FIELD_REF_STRING / GET_CONTEXT_REF_STRING
# (schema.STRING_* values).
STORE_PTR, STORE_INLINE, STORE_DATA_LOC = 0, 1, 2
SIGNED_FLAG = 0x80

# Stack entry type tags.
T_S64, T_DOUBLE, T_STRING, T_STRING_LIT, T_STAR_GLOB = 0, 1, 2, 3, 4

#: Stack entries below ax/bx in the native frame (LTTng has 10).
STACK_SLOTS = 128
_SLOT_WORDS = 3  # tag, value (s64, double bits or string address), string bound

# -- the native frame's stack -------------------------------------------------------


# Python stand-ins of the intrinsics _numba_extensions defines.
_PY_STACK = (ctypes.c_int64 * (STACK_SLOTS * _SLOT_WORDS))()


def _frame_stack() -> int:
    return ctypes.addressof(_PY_STACK)


def _numba_extensions() -> None:
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def frame_stack(typingctx):
        """Address of STACK_SLOTS entries in the caller's frame (an alloca
        in the entry block, so inlining the interpreter into a loop reuses
        it)."""

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            size = ir.Constant(i64, STACK_SLOTS * _SLOT_WORDS)
            ptr = cgutils.alloca_once(builder, i64, size=size, name="lttng_stack")
            return builder.ptrtoint(ptr, i64)

        return types.int64(), codegen

    globals()["_frame_stack"] = frame_stack
    native.use_intrinsics(globals())


aot.on_numba(_numba_extensions)


@aot.njit(cache=True, inline="always", _nrt=False)
def _spill(mem, top, t, v, n):
    p = mem + top * (8 * _SLOT_WORDS)
    store_u64(p, t)
    store_u64(p + 8, v)
    store_u64(p + 16, n)


@aot.njit(cache=True, inline="always", _nrt=False)
def _fill(mem, top):
    p = mem + top * (8 * _SLOT_WORDS)
    return load_i64(p), load_i64(p + 8), load_i64(p + 16)


@aot.njit(cache=True, inline="always", _nrt=False)
def _static_string(root, code, pc):
    """(address, bound) of a string slot at a constant offset; address 0
    when its pointer is null."""
    slot = root + np.int64(load_u16(code + pc + 1))
    storage = load_u8(code + pc + 3)
    if storage == STORE_PTR:
        return load_i64(slot), NO_LIMIT
    if storage == STORE_INLINE:
        return slot, np.int64(load_u16(code + pc + 4))
    v = np.int64(load_u32(slot))
    return root + (v & 0xFFFF), v >> 16


@aot.njit(cache=True, inline="always", _nrt=False)
def _static_int(root, code, pc):
    b = load_u8(code + pc + 3)
    return load_int(root + np.int64(load_u16(code + pc + 1)), np.int64(b & 0x7F), (b & 0x80) != 0)


@aot.njit(cache=True, inline="always", _nrt=False)
def _static_double(root, code, pc):
    addr = root + np.int64(load_u16(code + pc + 1))
    if load_u8(code + pc + 3) == 4:
        return np.float64(load_f32(addr))
    return load_f64(addr)


@aot.njit(cache=True, inline="always", _nrt=False)
def _compare(op, a, b):
    # op - EQ_xxx: 0 ==, 1 !=, 2 >, 3 <, 4 >=, 5 <=
    if op == 0:
        return a == b
    if op == 1:
        return a != b
    if op == 2:
        return a > b
    if op == 3:
        return a < b
    if op == 4:
        return a >= b
    return a <= b


# -- the interpreter ----------------------------------------------------------------


@aot.njit(cache=True, inline="always", _nrt=False)
def _interpret(code, lits, fields, event, context, trace, trace_cap, tracing):
    """Run validated bytecode at ``code``; ``lits`` is the address of the
    literal table (int64 pairs: address, length), ``fields`` of the linked
    field table (int64 addresses of path codes).  With ``tracing`` (a
    compile-time constant) the pc of every executed instruction is written
    to ``trace`` (int64 words: count, then pcs, at most ``trace_cap``).

    Registers: ``ax``/``bx`` = (type tag, value, string bound); the value is
    the s64, the double's bits or the string's address.
    """
    mem = _frame_stack()
    top = np.int64(0)
    ax_t = np.int64(0)
    ax_v = np.int64(0)
    ax_n = np.int64(0)
    bx_t = np.int64(0)
    bx_v = np.int64(0)
    bx_n = np.int64(0)
    pc = np.int64(0)
    steps = np.int64(0)
    while True:
        op = load_u8(code + pc)
        if tracing:
            if steps < trace_cap:
                store_u64(trace + 8 * (steps + 1), pc)
            steps += 1
            store_u64(trace, steps)

        # -- pushes: compute the new entry (t, v, n), pushed after the chain ----
        if op == LOAD_FIELD_REF_STRING or op == GET_CONTEXT_REF_STRING:
            v, n = _static_string(event if op == LOAD_FIELD_REF_STRING else context, code, pc)
            if v == 0:
                return 0
            t = T_STRING
            pc += 6
        elif op == LOAD_STRING or op == LOAD_STAR_GLOB_STRING:
            k = np.int64(load_u16(code + pc + 1))
            t = T_STRING_LIT if op == LOAD_STRING else T_STAR_GLOB
            v = load_i64(lits + 16 * k)
            n = load_i64(lits + 16 * k + 8)
            pc += 3
        elif op == LOAD_FIELD_REF_S64 or op == GET_CONTEXT_REF_S64:
            t, n = T_S64, np.int64(0)
            v = _static_int(event if op == LOAD_FIELD_REF_S64 else context, code, pc)
            pc += 4
        elif op == LOAD_FIELD_REF_DOUBLE or op == GET_CONTEXT_REF_DOUBLE:
            t, n = T_DOUBLE, np.int64(0)
            v = double_bits(
                _static_double(event if op == LOAD_FIELD_REF_DOUBLE else context, code, pc)
            )
            pc += 4
        elif op == LOAD_S64 or op == LOAD_DOUBLE:
            t, n = (T_S64 if op == LOAD_S64 else T_DOUBLE), np.int64(0)
            v = load_i64(code + pc + 1)
            pc += 9
        elif op == LOAD_FIELD_STRING:
            path = load_i64(fields + 8 * np.int64(load_u16(code + pc + 1)))
            v, n = string_at(path, event, context)
            if v == 0:
                return 0
            t = T_STRING
            pc += 3
        elif op == LOAD_FIELD_S64 or op == LOAD_FIELD_DOUBLE:
            path = load_i64(fields + 8 * np.int64(load_u16(code + pc + 1)))
            slot = walk_path(path, event, context)
            if slot == 0:
                return 0
            size = load_i64(path + 16)
            n = np.int64(0)
            if op == LOAD_FIELD_S64:
                t = T_S64
                v = load_int(slot, size, load_i64(path + 24) != 0)
            elif size == 4:
                t = T_DOUBLE
                v = double_bits(np.float64(load_f32(slot)))
            else:
                t = T_DOUBLE
                v = load_i64(slot)
            pc += 3
        elif op == LOAD_FIELD_UNLINKED:
            return 0
        else:
            # -- logical: short-circuit to the skip offset, else pop the left ----
            if op == AND or op == OR:
                if (ax_v == 0) == (op == AND):
                    if op == OR:
                        ax_v = 1
                    pc = np.int64(load_u16(code + pc + 1))
                    continue
                top -= 1
                ax_t, ax_v, ax_n = bx_t, bx_v, bx_n
                bx_t, bx_v, bx_n = _fill(mem, top)
                pc += 3

            elif op == RETURN:
                return 1 if ax_v != 0 else 0

            # -- unary: ax in place ------------------------------------------------
            elif op == UNARY_NOT_S64:
                ax_v = 1 if ax_v == 0 else 0
                pc += 1
            elif op == UNARY_NOT_DOUBLE:
                ax_t, ax_v = T_S64, (1 if as_double(ax_v) == 0.0 else 0)
                pc += 1
            elif op == UNARY_MINUS_S64:
                ax_v = -ax_v
                pc += 1
            elif op == UNARY_MINUS_DOUBLE:
                ax_v = double_bits(-as_double(ax_v))
                pc += 1
            elif op == UNARY_BIT_NOT:
                ax_v = ~ax_v
                pc += 1
            elif op == UNARY_PLUS_S64 or op == UNARY_PLUS_DOUBLE:
                pc += 1

            # -- binary: result from bx and ax, then pop ---------------------------
            else:
                if op == EQ_STRING or op == NE_STRING:
                    if ax_t == T_STRING_LIT:
                        eq = str_equal(bx_v, bx_n, ax_v, ax_n)
                    elif bx_t == T_STRING_LIT:
                        eq = str_equal(ax_v, ax_n, bx_v, bx_n)
                    else:
                        eq = strings_equal(bx_v, bx_n, ax_v, ax_n)
                    r = np.int64(eq == (op == EQ_STRING))
                elif op == EQ_STAR_GLOB_STRING or op == NE_STAR_GLOB_STRING:
                    # The pattern is whichever side was loaded as one (LTTng's rule).
                    if ax_t == T_STAR_GLOB:
                        m = glob_match(bx_v, bx_n, ax_v, ax_n)
                    else:
                        m = glob_match(ax_v, ax_n, bx_v, bx_n)
                    r = np.int64(m == (op == EQ_STAR_GLOB_STRING))
                elif op >= EQ_S64 and op <= LE_S64:
                    r = np.int64(_compare(op - EQ_S64, bx_v, ax_v))
                elif op >= EQ_DOUBLE and op <= LE_DOUBLE:
                    r = np.int64(_compare(op - EQ_DOUBLE, as_double(bx_v), as_double(ax_v)))
                elif op >= EQ_DOUBLE_S64 and op <= LE_DOUBLE_S64:
                    r = np.int64(_compare(op - EQ_DOUBLE_S64, as_double(bx_v), np.float64(ax_v)))
                elif op >= EQ_S64_DOUBLE and op <= LE_S64_DOUBLE:
                    r = np.int64(_compare(op - EQ_S64_DOUBLE, np.float64(bx_v), as_double(ax_v)))
                elif op == BIT_AND:
                    r = bx_v & ax_v
                elif op == BIT_OR:
                    r = bx_v | ax_v
                elif op == BIT_XOR:
                    r = bx_v ^ ax_v
                elif op == BIT_LSHIFT or op == BIT_RSHIFT:
                    # A count outside 0..63 makes the whole filter false.
                    if ax_v < 0 or ax_v > 63:
                        return 0
                    if op == BIT_LSHIFT:
                        r = np.int64(np.uint64(bx_v) << np.uint64(ax_v))
                    else:
                        r = np.int64(np.uint64(bx_v) >> np.uint64(ax_v))
                else:
                    return 0  # unreachable for validated code
                top -= 1
                bx_t, bx_v, bx_n = _fill(mem, top)
                ax_t, ax_v = T_S64, r
                pc += 1
            continue
        # The push: spill bx, move ax to bx, the new entry to ax.
        _spill(mem, top, bx_t, bx_v, bx_n)
        top += 1
        bx_t, bx_v, bx_n = ax_t, ax_v, ax_n
        ax_t, ax_v, ax_n = t, v, n


@aot.njit(cache=True, _nrt=False)
def run(bytecode, literals, fields, event, context):
    """Verdict (0/1) of validated ``bytecode`` (uint8 array) on the records
    at ``event`` and ``context``; ``literals`` and ``fields`` are the
    program's linked literal table (int64: address, length per literal)
    and field table (int64 addresses of path codes).  For numba callers."""
    return _interpret(
        bytecode.ctypes.data, literals.ctypes.data, fields.ctypes.data, event, context, 0, 0, False
    )


@aot.njit(cache=True, _nrt=False)
def run_traced(bytecode, literals, fields, event, context, trace):
    """As :func:`run`, recording executed pcs: ``trace[0]`` counts them,
    ``trace[1:]`` holds the first ``len(trace) - 1``."""
    return _interpret(
        bytecode.ctypes.data,
        literals.ctypes.data,
        fields.ctypes.data,
        event,
        context,
        trace.ctypes.data,
        len(trace) - 1,
        True,
    )


# Program descriptor (int64 words) the C entry point reads.
DESC_CODE, DESC_CODE_LEN, DESC_LITERALS, DESC_N_LITERALS, DESC_FIELDS, DESC_N_FIELDS = range(6)
DESC_WORDS = 6


@aot.njit(cache=True, _nrt=False, c_args=3, native_inline=True)
def _run_c(program: int, event: int, context: int) -> int:
    return _interpret(
        load_i64(program + 8 * DESC_CODE),
        load_i64(program + 8 * DESC_LITERALS),
        load_i64(program + 8 * DESC_FIELDS),
        event,
        context,
        0,
        0,
        False,
    )


_c_entry = []


def run_address() -> int:
    """The address of ``int64 run(const int64 *program, const void *event,
    const void *context)`` for C callers; ``program`` is a program's
    descriptor (:attr:`.lttng.LttngProgram.program_address`).  Compiled on
    first use (hwtrace's native library's, else numba's)."""
    if not _c_entry:
        _c_entry.append(native.c_entry(_run_c, "int64(int64, int64, int64)"))
    return _c_entry[0]


@aot.njit(cache=True, _nrt=False)
def run_many(bytecode, literals, fields, events, context):
    """How many of the records at ``events`` (int64 addresses) pass."""
    n = 0
    for e in events:
        n += run(bytecode, literals, fields, e, context)
    return n


# -- the validator (LTTng validates bytecode before running it) ----------------------

E_OK = 0
E_EMPTY = 1
E_OPCODE = 2
E_TRUNCATED = 3
E_LITERAL = 4
E_FIELD = 5
E_FIELD_KIND = 6
E_UNDERFLOW = 7
E_TYPE = 8
E_OVERFLOW = 9
E_JUMP_BACK = 10
E_JUMP_MIDDLE = 11
E_JUMP_STATE = 12
E_JUMP_FLOOR = 13
E_RETURN_LAST = 14
E_RETURN_STATE = 15
E_OPERAND = 16

ERROR_TEXT = {
    E_EMPTY: "empty program",
    E_OPCODE: "unknown opcode {detail:#04x}",
    E_TRUNCATED: "instruction runs past the end of the bytecode",
    E_LITERAL: "literal index {detail} out of range",
    E_FIELD: "field index {detail} out of range",
    E_FIELD_KIND: "field {detail} does not have the type this load expects",
    E_UNDERFLOW: "stack underflow",
    E_TYPE: "operand types do not match the instruction",
    E_OVERFLOW: "stack deeper than the interpreter's {detail} entries",
    E_JUMP_BACK: "skip offset {detail} does not jump forward inside the program",
    E_JUMP_MIDDLE: "skip offset {detail} lands inside an instruction",
    E_JUMP_STATE: "stack at skip target {detail} differs between the two paths",
    E_JUMP_FLOOR: "right operand pops below its logical operator",
    E_RETURN_LAST: "the program must end with its only RETURN",
    E_RETURN_STATE: "RETURN needs exactly one s64 on the stack",
    E_OPERAND: "bad operand {detail}",
}

# Field kinds for the validator: schema.LEAF_* of a linked path, -1 unlinked.
KIND_UNLINKED = -1


def validate(code: np.ndarray, n_literals: int, field_kinds: np.ndarray) -> np.ndarray:
    """Check ``code`` as the interpreter will run it.  Returns int64
    ``(error, insn index, pc, detail, max depth)``; error 0 means valid."""
    n = len(code)
    out = np.zeros(5, np.int64)
    # (room for the type stack and the pending skips: target pc, depth
    # there, lowest depth allowed before it)
    _validate(
        code, n_literals, field_kinds, out, np.zeros(n + 2, np.int8), np.zeros(n, np.int64),
        np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.bool_),
    )  # fmt: skip
    return out


@aot.njit(cache=True, _nrt=False)
def _validate(code, n_literals, field_kinds, out, tstack, p_target, p_depth, p_floor, p_live):
    n = len(code)
    if n == 0:
        out[0] = E_EMPTY
        return
    npend = 0
    depth = 0
    maxdepth = 0
    pc = 0
    k = -1
    returned = False
    while pc < n:
        k += 1
        out[1] = k
        out[2] = pc
        # Skips landing here: both paths must agree.
        for j in range(npend):
            if not p_live[j]:
                continue
            if p_target[j] == pc:
                if depth != p_depth[j] or tstack[depth - 1] != T_S64:
                    out[0] = E_JUMP_STATE
                    out[3] = pc
                    return
                p_live[j] = False
            elif p_target[j] < pc:
                out[0] = E_JUMP_MIDDLE
                out[3] = p_target[j]
                return
        op = code[pc]
        size = INSN_SIZE[op]
        if size == 0:
            out[0] = E_OPCODE
            out[3] = op
            return
        if pc + size > n:
            out[0] = E_TRUNCATED
            return
        u16 = np.int64(code[pc + 1]) | (np.int64(code[pc + 2]) << 8) if size >= 3 else 0
        push = np.int8(-1)
        pops = 0
        need_a = np.int8(-1)  # required type of bx (binary) / ax (unary)
        need_b = np.int8(-1)  # required type of ax (binary)
        if op == RETURN:
            if pc + size != n:
                out[0] = E_RETURN_LAST
                return
            if depth != 1 or tstack[0] != T_S64:
                out[0] = E_RETURN_STATE
                return
            returned = True
            break
        elif op == LOAD_FIELD_REF_S64 or op == GET_CONTEXT_REF_S64:
            sz = code[pc + 3] & 0x7F
            if sz != 1 and sz != 2 and sz != 4 and sz != 8:
                out[0] = E_OPERAND
                out[3] = code[pc + 3]
                return
            push = T_S64
        elif op == LOAD_FIELD_REF_DOUBLE or op == GET_CONTEXT_REF_DOUBLE:
            if code[pc + 3] != 4 and code[pc + 3] != 8:
                out[0] = E_OPERAND
                out[3] = code[pc + 3]
                return
            push = T_DOUBLE
        elif op == LOAD_FIELD_REF_STRING or op == GET_CONTEXT_REF_STRING:
            if code[pc + 3] > STORE_DATA_LOC:
                out[0] = E_OPERAND
                out[3] = code[pc + 3]
                return
            push = T_STRING
        elif op == LOAD_S64:
            push = T_S64
        elif op == LOAD_DOUBLE:
            push = T_DOUBLE
        elif op == LOAD_STRING or op == LOAD_STAR_GLOB_STRING:
            if u16 >= n_literals:
                out[0] = E_LITERAL
                out[3] = u16
                return
            push = T_STRING_LIT if op == LOAD_STRING else T_STAR_GLOB
        elif (
            op == LOAD_FIELD_S64
            or op == LOAD_FIELD_DOUBLE
            or op == LOAD_FIELD_STRING
            or op == LOAD_FIELD_UNLINKED
        ):
            if u16 >= len(field_kinds):
                out[0] = E_FIELD
                out[3] = u16
                return
            kind = field_kinds[u16]
            if op == LOAD_FIELD_UNLINKED:
                want = KIND_UNLINKED
                if code[pc + 3] > 2:
                    out[0] = E_OPERAND
                    out[3] = code[pc + 3]
                    return
                push = np.int8(code[pc + 3])
            else:
                want = 0 if op == LOAD_FIELD_S64 else (1 if op == LOAD_FIELD_DOUBLE else 2)
                push = np.int8(want)  # T_S64, T_DOUBLE, T_STRING match LEAF_*
            if kind != want:
                out[0] = E_FIELD_KIND
                out[3] = u16
                return
        elif op == AND or op == OR:
            if u16 <= pc or u16 >= n:
                out[0] = E_JUMP_BACK
                out[3] = u16
                return
            if depth < 1 or tstack[depth - 1] != T_S64:
                out[0] = E_TYPE if depth >= 1 else E_UNDERFLOW
                return
            p_target[npend] = u16
            p_depth[npend] = depth
            p_floor[npend] = depth - 1
            p_live[npend] = True
            npend += 1
            pops = 1
        elif op == UNARY_NOT_S64 or op == UNARY_MINUS_S64 or op == UNARY_PLUS_S64:
            need_a = T_S64
            pops = 1
            push = T_S64
        elif op == UNARY_BIT_NOT:
            need_a = T_S64
            pops = 1
            push = T_S64
        elif op == UNARY_NOT_DOUBLE:
            need_a = T_DOUBLE
            pops = 1
            push = T_S64
        elif op == UNARY_MINUS_DOUBLE or op == UNARY_PLUS_DOUBLE:
            need_a = T_DOUBLE
            pops = 1
            push = T_DOUBLE
        else:
            pops = 2
            push = T_S64
            if op == EQ_STRING or op == NE_STRING:
                need_a = T_STRING  # or T_STRING_LIT: checked below
                need_b = T_STRING
            elif op == EQ_STAR_GLOB_STRING or op == NE_STAR_GLOB_STRING:
                need_a = T_STAR_GLOB
                need_b = T_STAR_GLOB
            elif (op >= EQ_S64 and op <= LE_S64) or (op >= BIT_RSHIFT and op <= BIT_XOR):
                need_a, need_b = T_S64, T_S64
            elif op >= EQ_DOUBLE and op <= LE_DOUBLE:
                need_a, need_b = T_DOUBLE, T_DOUBLE
            elif op >= EQ_DOUBLE_S64 and op <= LE_DOUBLE_S64:
                need_a, need_b = T_DOUBLE, T_S64
            elif op >= EQ_S64_DOUBLE and op <= LE_S64_DOUBLE:
                need_a, need_b = T_S64, T_DOUBLE
            else:
                out[0] = E_OPCODE
                out[3] = op
                return
        if depth < pops:
            out[0] = E_UNDERFLOW
            return
        if pops == 1 and need_a >= 0 and tstack[depth - 1] != need_a:
            out[0] = E_TYPE
            return
        if pops == 2:
            a = tstack[depth - 2]
            b = tstack[depth - 1]
            if need_a == T_STRING:
                ok = (a == T_STRING or a == T_STRING_LIT) and (b == T_STRING or b == T_STRING_LIT)
            elif need_a == T_STAR_GLOB:
                sa = a == T_STRING or a == T_STRING_LIT
                sb = b == T_STRING or b == T_STRING_LIT
                ok = (a == T_STAR_GLOB and sb) or (b == T_STAR_GLOB and sa)
            else:
                ok = a == need_a and b == need_b
            if not ok:
                out[0] = E_TYPE
                return
        depth -= pops
        for j in range(npend):
            # The right operand of a pending skip may not touch what lies
            # below its left operand.
            if p_live[j] and depth < p_floor[j]:
                out[0] = E_JUMP_FLOOR
                return
        if push >= 0:
            tstack[depth] = push
            depth += 1
            if depth > maxdepth:
                maxdepth = depth
                if maxdepth > STACK_SLOTS:
                    out[0] = E_OVERFLOW
                    out[3] = STACK_SLOTS
                    return
        pc += size
    if not returned:
        out[1] = k + 1
        out[2] = pc
        out[0] = E_RETURN_LAST
        return
    out[4] = maxdepth
    return
