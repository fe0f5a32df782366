"""The interpreted-eBPF tier: a numba nopython interpreter of linked programs.

:func:`run` executes a :class:`~.program.LinkedProgram`'s instructions
(``run(linked.address, linked.count, event, context)``) with eleven 64-bit
registers and a 512-byte stack, both on the native stack (no allocation per
run), and returns R0.  Memory is reached by address through
:mod:`~hwtrace.filter.native`'s load/store intrinsics: the verifier proved
every access in bounds, so the interpreter checks nothing at run time.  The
semantics are those listed in :mod:`.verifier` (32-bit ALU results
zero-extended, ``x / 0 = 0``, ``x % 0 = x``, shift counts masked).

:data:`run_address` is a C entry point, ``int64 run(const int64
*descriptor, const void *event, const void *context)``, where the
descriptor is ``[insns_address, count]``
(:attr:`~.program.LinkedProgram.descriptor_address`), so a C harness calls
the interpreter through a function pointer like every other tier (made
on first use: hwtrace's native library's, else numba's).

Only linked, verified programs may run: anything else can crash the
process.
"""

from __future__ import annotations

import ctypes

import numpy as np

from ... import aot
from .. import native
from ..native import (
    call_helper,
    load_i64,
    load_u8,
    load_u16,
    load_u32,
    store_u8,
    store_u16,
    store_u32,
    store_u64,
)

_REGS = 11
_STACK = 512


# Python stand-ins of the intrinsics _numba_extensions defines.
def _unlikely(cond: bool) -> bool:
    return cond


_PY_FRAME = (ctypes.c_int64 * (_REGS + _STACK // 8))()


def _frame() -> int:
    return ctypes.addressof(_PY_FRAME)


def _numba_extensions() -> None:
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    @intrinsic
    def unlikely(typingctx, cond):
        """``llvm.expect(cond, false)``: keeps a conditional jump a real
        branch.  Without it LLVM computes the next pc with a cmov, so
        fetching the next instruction waits on the compared data (about
        2 ns more per jump)."""

        def codegen(context, builder, signature, args):
            i1 = ir.IntType(1)
            fn = builder.module.declare_intrinsic(
                "llvm.expect", [i1], ir.FunctionType(i1, [i1, i1])
            )
            return builder.call(fn, [args[0], ir.Constant(i1, 0)])

        return types.boolean(types.boolean), codegen

    @intrinsic
    def frame(typingctx):
        """The address of 11 register words and the 512-byte stack after
        them, allocated in the caller's native frame (entry block)."""

        def codegen(context, builder, signature, args):
            ty = ir.ArrayType(ir.IntType(64), _REGS + _STACK // 8)
            # Not cgutils.alloca_once: it zero-fills (640 bytes per run); the
            # verifier proved no register or stack byte is read before written.
            with builder.goto_entry_block():
                ptr = builder.alloca(ty)
            return builder.ptrtoint(ptr, ir.IntType(64))

        return types.int64(), codegen

    globals()["_unlikely"], globals()["_frame"] = unlikely, frame
    native.use_intrinsics(globals())


aot.on_numba(_numba_extensions)


_M32 = np.int64(0xFFFFFFFF)


@aot.njit(cache=True, inline="always", _nrt=False)
def _reg(regs: int, r: int) -> int:
    return load_i64(regs + 8 * r)


@aot.njit(cache=True, inline="always", _nrt=False)
def _set(regs: int, r: int, v: int) -> None:
    store_u64(regs + 8 * r, v)


@aot.njit(cache=True, inline="always", _nrt=False)
def _udiv(a: int, b: int) -> int:
    return np.int64(np.uint64(a) // np.uint64(b)) if b != 0 else np.int64(0)


@aot.njit(cache=True, inline="always", _nrt=False)
def _umod(a: int, b: int) -> int:
    return np.int64(np.uint64(a) % np.uint64(b)) if b != 0 else a


@aot.njit(cache=True, inline="always", _nrt=False)
def _lshr(a: int, n: int) -> int:
    return np.int64(np.uint64(a) >> np.uint64(n))


@aot.njit(cache=True, inline="always", _nrt=False)
def _s32(a: int) -> int:
    return np.int64(np.int32(a))


@aot.njit(cache=True, inline="always", _nrt=False)
def _ugt(a: int, b: int) -> bool:
    return np.uint64(a) > np.uint64(b)


@aot.njit(cache=True, inline="always", _nrt=False)
def _uge(a: int, b: int) -> bool:
    return np.uint64(a) >= np.uint64(b)


@aot.njit(cache=True, inline="always", _nrt=False)
def _bswap(v: int, width: int) -> int:
    r = np.int64(0)
    for i in range(width // 8):
        r = (r << 8) | ((v >> (8 * i)) & 0xFF)
    return r


@aot.njit(cache=True, error_model="numpy", _nrt=False)
def run(insns: int, count: int, event: int, context: int) -> int:
    """Run the linked program at ``insns`` (``count`` slots) on one event;
    returns R0."""
    regs = _frame()
    _set(regs, 1, event)
    _set(regs, 2, context)
    _set(regs, 10, regs + 8 * _REGS + _STACK)
    pc = np.int64(0)
    while pc < count:
        # One 8-byte load per instruction; a flat switch on the opcode byte
        # (LLVM turns the chain into one jump table).
        w = load_i64(insns + 8 * pc)
        code = w & 0xFF
        dst = (w >> 8) & 0xF
        src = (w >> 12) & 0xF
        off = (w << 32) >> 48
        imm = w >> 32
        a = _reg(regs, dst)
        x = _reg(regs, src)
        pc += 1
        if code == 0x79:  # ldx u64
            _set(regs, dst, load_i64(x + off))
        elif code == 0x61:  # ldx u32
            _set(regs, dst, np.int64(load_u32(x + off)))
        elif code == 0x69:  # ldx u16
            _set(regs, dst, np.int64(load_u16(x + off)))
        elif code == 0x71:  # ldx u8
            _set(regs, dst, np.int64(load_u8(x + off)))
        # Stores: class 3 (stx, odd opcodes) stores src, class 2 (st) imm.
        elif code == 0x7B or code == 0x7A:  # stx/st u64
            store_u64(a + off, x if code & 1 else imm)
        elif code == 0x63 or code == 0x62:  # stx/st u32
            store_u32(a + off, x if code & 1 else imm)
        elif code == 0x6B or code == 0x6A:  # stx/st u16
            store_u16(a + off, x if code & 1 else imm)
        elif code == 0x73 or code == 0x72:  # stx/st u8
            store_u8(a + off, x if code & 1 else imm)
        elif code == 0x18:  # ld_imm64 (linked: a plain 64-bit immediate)
            high = load_i64(insns + 8 * pc) >> 32
            _set(regs, dst, (imm & _M32) | (high << 32))
            pc += 1
        elif code == 0x05:  # goto
            pc += off
        elif code == 0x85:  # call
            _set(
                regs,
                0,
                call_helper(
                    imm, _reg(regs, 1), _reg(regs, 2), _reg(regs, 3), _reg(regs, 4), _reg(regs, 5)
                ),
            )
        elif code == 0x95:  # exit
            return _reg(regs, 0)
        elif code == 0xD4:  # le16/le32/le64
            if imm == 16:
                _set(regs, dst, a & 0xFFFF)
            elif imm == 32:
                _set(regs, dst, a & _M32)
        elif code == 0xDC:  # be16/be32/be64
            _set(regs, dst, _bswap(a, imm))
        elif code == 0x07:  # add K
            _set(regs, dst, a + imm)
        elif code == 0x0F:  # add X
            _set(regs, dst, a + x)
        elif code == 0x17:  # sub K
            _set(regs, dst, a - imm)
        elif code == 0x1F:  # sub X
            _set(regs, dst, a - x)
        elif code == 0x27:  # mul K
            _set(regs, dst, a * imm)
        elif code == 0x2F:  # mul X
            _set(regs, dst, a * x)
        elif code == 0x37:  # div K
            _set(regs, dst, _udiv(a, imm))
        elif code == 0x3F:  # div X
            _set(regs, dst, _udiv(a, x))
        elif code == 0x47:  # or K
            _set(regs, dst, a | imm)
        elif code == 0x4F:  # or X
            _set(regs, dst, a | x)
        elif code == 0x57:  # and K
            _set(regs, dst, a & imm)
        elif code == 0x5F:  # and X
            _set(regs, dst, a & x)
        elif code == 0x67:  # lsh K
            _set(regs, dst, a << (imm & 63))
        elif code == 0x6F:  # lsh X
            _set(regs, dst, a << (x & 63))
        elif code == 0x77:  # rsh K
            _set(regs, dst, _lshr(a, imm & 63))
        elif code == 0x7F:  # rsh X
            _set(regs, dst, _lshr(a, x & 63))
        elif code == 0x87:  # neg K
            _set(regs, dst, -a)
        elif code == 0x97:  # mod K
            _set(regs, dst, _umod(a, imm))
        elif code == 0x9F:  # mod X
            _set(regs, dst, _umod(a, x))
        elif code == 0xA7:  # xor K
            _set(regs, dst, a ^ imm)
        elif code == 0xAF:  # xor X
            _set(regs, dst, a ^ x)
        elif code == 0xB7:  # mov K
            _set(regs, dst, imm)
        elif code == 0xBF:  # mov X
            _set(regs, dst, x)
        elif code == 0xC7:  # arsh K
            _set(regs, dst, a >> (imm & 63))
        elif code == 0xCF:  # arsh X
            _set(regs, dst, a >> (x & 63))
        elif code == 0x04:  # add32 K
            _set(regs, dst, (a + imm) & _M32)
        elif code == 0x0C:  # add32 X
            _set(regs, dst, (a + x) & _M32)
        elif code == 0x14:  # sub32 K
            _set(regs, dst, (a - imm) & _M32)
        elif code == 0x1C:  # sub32 X
            _set(regs, dst, (a - x) & _M32)
        elif code == 0x24:  # mul32 K
            _set(regs, dst, (a * imm) & _M32)
        elif code == 0x2C:  # mul32 X
            _set(regs, dst, (a * x) & _M32)
        elif code == 0x34:  # div32 K
            _set(regs, dst, (_udiv(a & _M32, imm & _M32)) & _M32)
        elif code == 0x3C:  # div32 X
            _set(regs, dst, (_udiv(a & _M32, x & _M32)) & _M32)
        elif code == 0x44:  # or32 K
            _set(regs, dst, (a | imm) & _M32)
        elif code == 0x4C:  # or32 X
            _set(regs, dst, (a | x) & _M32)
        elif code == 0x54:  # and32 K
            _set(regs, dst, (a & imm) & _M32)
        elif code == 0x5C:  # and32 X
            _set(regs, dst, (a & x) & _M32)
        elif code == 0x64:  # lsh32 K
            _set(regs, dst, (a << (imm & 31)) & _M32)
        elif code == 0x6C:  # lsh32 X
            _set(regs, dst, (a << (x & 31)) & _M32)
        elif code == 0x74:  # rsh32 K
            _set(regs, dst, (_lshr(a & _M32, imm & 31)) & _M32)
        elif code == 0x7C:  # rsh32 X
            _set(regs, dst, (_lshr(a & _M32, x & 31)) & _M32)
        elif code == 0x84:  # neg32 K
            _set(regs, dst, (-a) & _M32)
        elif code == 0x94:  # mod32 K
            _set(regs, dst, (_umod(a & _M32, imm & _M32)) & _M32)
        elif code == 0x9C:  # mod32 X
            _set(regs, dst, (_umod(a & _M32, x & _M32)) & _M32)
        elif code == 0xA4:  # xor32 K
            _set(regs, dst, (a ^ imm) & _M32)
        elif code == 0xAC:  # xor32 X
            _set(regs, dst, (a ^ x) & _M32)
        elif code == 0xB4:  # mov32 K
            _set(regs, dst, (imm) & _M32)
        elif code == 0xBC:  # mov32 X
            _set(regs, dst, (x) & _M32)
        elif code == 0xC4:  # arsh32 K
            _set(regs, dst, (_s32(a) >> (imm & 31)) & _M32)
        elif code == 0xCC:  # arsh32 X
            _set(regs, dst, (_s32(a) >> (x & 31)) & _M32)
        elif code == 0x15:  # if == K
            if _unlikely(a == imm):
                pc += off
        elif code == 0x1D:  # if == X
            if _unlikely(a == x):
                pc += off
        elif code == 0x55:  # if != K
            if _unlikely(a != imm):
                pc += off
        elif code == 0x5D:  # if != X
            if _unlikely(a != x):
                pc += off
        elif code == 0x25:  # if > K
            if _unlikely(_ugt(a, imm)):
                pc += off
        elif code == 0x2D:  # if > X
            if _unlikely(_ugt(a, x)):
                pc += off
        elif code == 0x35:  # if >= K
            if _unlikely(_uge(a, imm)):
                pc += off
        elif code == 0x3D:  # if >= X
            if _unlikely(_uge(a, x)):
                pc += off
        elif code == 0xA5:  # if < K
            if _unlikely(_ugt(imm, a)):
                pc += off
        elif code == 0xAD:  # if < X
            if _unlikely(_ugt(x, a)):
                pc += off
        elif code == 0xB5:  # if <= K
            if _unlikely(_uge(imm, a)):
                pc += off
        elif code == 0xBD:  # if <= X
            if _unlikely(_uge(x, a)):
                pc += off
        elif code == 0x65:  # if s> K
            if _unlikely(a > imm):
                pc += off
        elif code == 0x6D:  # if s> X
            if _unlikely(a > x):
                pc += off
        elif code == 0x75:  # if s>= K
            if _unlikely(a >= imm):
                pc += off
        elif code == 0x7D:  # if s>= X
            if _unlikely(a >= x):
                pc += off
        elif code == 0xC5:  # if s< K
            if _unlikely(a < imm):
                pc += off
        elif code == 0xCD:  # if s< X
            if _unlikely(a < x):
                pc += off
        elif code == 0xD5:  # if s<= K
            if _unlikely(a <= imm):
                pc += off
        elif code == 0xDD:  # if s<= X
            if _unlikely(a <= x):
                pc += off
        elif code == 0x45:  # if & K
            if _unlikely(a & imm != 0):
                pc += off
        elif code == 0x4D:  # if & X
            if _unlikely(a & x != 0):
                pc += off
        elif code == 0x16:  # if32 == K
            if _unlikely((a & _M32) == (imm & _M32)):
                pc += off
        elif code == 0x1E:  # if32 == X
            if _unlikely((a & _M32) == (x & _M32)):
                pc += off
        elif code == 0x56:  # if32 != K
            if _unlikely((a & _M32) != (imm & _M32)):
                pc += off
        elif code == 0x5E:  # if32 != X
            if _unlikely((a & _M32) != (x & _M32)):
                pc += off
        elif code == 0x26:  # if32 > K
            if _unlikely((a & _M32) > (imm & _M32)):
                pc += off
        elif code == 0x2E:  # if32 > X
            if _unlikely((a & _M32) > (x & _M32)):
                pc += off
        elif code == 0x36:  # if32 >= K
            if _unlikely((a & _M32) >= (imm & _M32)):
                pc += off
        elif code == 0x3E:  # if32 >= X
            if _unlikely((a & _M32) >= (x & _M32)):
                pc += off
        elif code == 0xA6:  # if32 < K
            if _unlikely((a & _M32) < (imm & _M32)):
                pc += off
        elif code == 0xAE:  # if32 < X
            if _unlikely((a & _M32) < (x & _M32)):
                pc += off
        elif code == 0xB6:  # if32 <= K
            if _unlikely((a & _M32) <= (imm & _M32)):
                pc += off
        elif code == 0xBE:  # if32 <= X
            if _unlikely((a & _M32) <= (x & _M32)):
                pc += off
        elif code == 0x66:  # if32 s> K
            if _unlikely(_s32(a) > _s32(imm)):
                pc += off
        elif code == 0x6E:  # if32 s> X
            if _unlikely(_s32(a) > _s32(x)):
                pc += off
        elif code == 0x76:  # if32 s>= K
            if _unlikely(_s32(a) >= _s32(imm)):
                pc += off
        elif code == 0x7E:  # if32 s>= X
            if _unlikely(_s32(a) >= _s32(x)):
                pc += off
        elif code == 0xC6:  # if32 s< K
            if _unlikely(_s32(a) < _s32(imm)):
                pc += off
        elif code == 0xCE:  # if32 s< X
            if _unlikely(_s32(a) < _s32(x)):
                pc += off
        elif code == 0xD6:  # if32 s<= K
            if _unlikely(_s32(a) <= _s32(imm)):
                pc += off
        elif code == 0xDE:  # if32 s<= X
            if _unlikely(_s32(a) <= _s32(x)):
                pc += off
        elif code == 0x46:  # if32 & K
            if _unlikely(a & imm & _M32 != 0):
                pc += off
        elif code == 0x4E:  # if32 & X
            if _unlikely(a & x & _M32 != 0):
                pc += off
    return 0


@aot.njit(cache=True, error_model="numpy", _nrt=False, c_args=3, native_inline=True)
def _run_c(descriptor: int, event: int, context: int) -> int:
    return run(load_i64(descriptor), load_i64(descriptor + 8), event, context)


_run_address: list[int] = []


def __getattr__(name: str) -> int:
    # run_address: ``int64 run(const int64 *descriptor, const void *event,
    # const void *context)``, made on first use.
    if name != "run_address":
        raise AttributeError(name)
    if not _run_address:
        _run_address.append(native.c_entry(_run_c, "int64(int64, int64, int64)"))
    return _run_address[0]


@aot.njit(cache=True, _nrt=False)
def run_many(insns: int, count: int, events: np.ndarray, context: int, out: np.ndarray) -> None:
    """Run the program on each event address of ``events`` (a native loop,
    for benchmarks and bulk filtering); verdicts into ``out``."""
    for i in range(events.shape[0]):
        out[i] = run(insns, count, events[i], context)
