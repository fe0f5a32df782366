"""Compiled decoding of the common x86-64 instructions.

The flow decoders need an instruction's length, how control leaves it and a
direct branch's target (see :mod:`hwtrace.isa.x86`).  iced-x86 answers for
every instruction but from Python, microseconds an instruction; this answers
in compiled code for the instructions that make up nearly all user-space
code (integer and SSE instructions of the one-byte and ``0F`` maps, near
branches, ``syscall``) and says *don't know* for anything else: VEX and
EVEX, x87, the three-byte maps, LOCK, system instructions, any encoding whose
validity depends on more than this module checks.  The caller asks iced-x86
then, so what is answered here is exactly what iced-x86 says (the tests
compare the two at every byte offset of real binaries).

Only 64-bit mode: other modes are rare enough to leave to iced-x86.
"""

from __future__ import annotations

import numpy as np

from .. import aot
from .x86 import IClass, Special

# What decode_quick() returns in its class slot for "don't know".
QUICK_UNKNOWN = 255

_OTHER = int(IClass.OTHER)
_CALL = int(IClass.CALL)
_RETURN = int(IClass.RETURN)
_JUMP = int(IClass.JUMP)
_COND = int(IClass.COND_JUMP)
_FAR_CALL = int(IClass.FAR_CALL)
_FAR_RETURN = int(IClass.FAR_RETURN)
_CPL = int(Special.CPL)

# Immediate kinds.
_IB, _IW, _IZ, _IV, _MOFFS, _ENTER = 1, 2, 3, 4, 5, 6

# One-byte map: 1 an instruction without ModRM, 2 one with ModRM, both
# valid whatever the ModRM byte says; 3 handled by code below; 0 unknown.
_ONE = np.zeros(256, np.uint8)
_ONE_IMM = np.zeros(256, np.uint8)
# Prefixes that may stand before a one-byte instruction: bit 0 REP (F3),
# bit 1 REPNE (F2).
_ONE_REP = np.zeros(256, np.uint8)


def _set(table, codes, value) -> None:
    for c in codes:
        table[c] = value


for _base in range(0x00, 0x40, 0x08):  # ADD OR ADC SBB AND SUB XOR CMP
    _set(_ONE, range(_base, _base + 4), 2)
    _ONE[_base + 4] = 1
    _ONE_IMM[_base + 4] = _IB
    _ONE[_base + 5] = 1
    _ONE_IMM[_base + 5] = _IZ
_set(_ONE, range(0x50, 0x60), 1)  # PUSH, POP
_ONE[0x63] = 2  # MOVSXD
_ONE[0x68], _ONE_IMM[0x68] = 1, _IZ
_ONE[0x69], _ONE_IMM[0x69] = 2, _IZ
_ONE[0x6A], _ONE_IMM[0x6A] = 1, _IB
_ONE[0x6B], _ONE_IMM[0x6B] = 2, _IB
_set(_ONE, range(0x6C, 0x70), 1)  # INS, OUTS
_set(_ONE_REP, range(0x6C, 0x70), 3)
_ONE[0x80], _ONE_IMM[0x80] = 2, _IB
_ONE[0x81], _ONE_IMM[0x81] = 2, _IZ
_ONE[0x83], _ONE_IMM[0x83] = 2, _IB
_set(_ONE, range(0x84, 0x8C), 2)  # TEST, XCHG, MOV
_set(_ONE, (0x8C, 0x8D, 0x8F), 3)  # MOV from Sreg, LEA, POP r/m
_set(_ONE, range(0x90, 0x9A), 1)  # NOP, XCHG, CBW, CWD
_ONE_REP[0x90] = 1  # PAUSE
_set(_ONE, range(0x9B, 0xA0), 1)  # FWAIT PUSHF POPF SAHF LAHF
_set(_ONE, range(0xA0, 0xA4), 1)
_set(_ONE_IMM, range(0xA0, 0xA4), _MOFFS)
_set(_ONE, range(0xA4, 0xB0), 1)  # string instructions, TEST
_set(_ONE_REP, (0xA4, 0xA5, 0xA6, 0xA7, 0xAA, 0xAB, 0xAC, 0xAD, 0xAE, 0xAF), 3)
_ONE_IMM[0xA8] = _IB
_ONE_IMM[0xA9] = _IZ
_set(_ONE, range(0xB0, 0xC0), 1)
_set(_ONE_IMM, range(0xB0, 0xB8), _IB)
_set(_ONE_IMM, range(0xB8, 0xC0), _IV)
_set(_ONE, (0xC0, 0xC1, 0xD0, 0xD1, 0xD2, 0xD3), 3)  # shifts
_ONE_IMM[0xC0] = _ONE_IMM[0xC1] = _IB
_set(_ONE, (0xC6, 0xC7), 3)  # MOV r/m, imm
_ONE_IMM[0xC6], _ONE_IMM[0xC7] = _IB, _IZ
_ONE[0xC8], _ONE_IMM[0xC8] = 1, _ENTER
_ONE[0xC9] = 1  # LEAVE
_ONE[0xD7] = 1  # XLAT
_set(_ONE, range(0xE4, 0xE8), 1)
_set(_ONE_IMM, range(0xE4, 0xE8), _IB)
_set(_ONE, range(0xEC, 0xF0), 1)  # IN, OUT
_set(_ONE, (0xF4, 0xF5, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD), 1)
_set(_ONE, (0xF6, 0xF7, 0xFE, 0xFF), 3)  # groups 3, 4, 5
# Near branches and interrupts: handled by code.
_set(_ONE, range(0x70, 0x80), 3)
_set(_ONE, (0xC2, 0xC3, 0xCA, 0xCB, 0xCC, 0xCD, 0xE0, 0xE1, 0xE2, 0xE3, 0xE8, 0xE9, 0xEB, 0xF1), 3)

# Two-byte map (0F xx), instructions with ModRM valid for any ModRM byte:
# which mandatory prefixes they take (bit 0 none, 1 66, 2 F3, 3 F2); and
# which have an imm8.
_NONE, _P66, _PF3, _PF2 = 1, 2, 4, 8
_ALL = _NONE | _P66 | _PF3 | _PF2
_TWO = np.zeros(256, np.uint8)
_TWO_IB = np.zeros(256, np.uint8)
_set(_TWO, (0x10, 0x11, 0x2A, 0x2C, 0x2D, 0x51, 0x58, 0x59, 0x5A, 0x5C, 0x5D, 0x5E, 0x5F), _ALL)
_TWO[0x12] = _NONE | _PF3 | _PF2  # MOVLPS/MOVHLPS, MOVSLDUP, MOVDDUP
_TWO[0x16] = _NONE | _PF3  # MOVHPS/MOVLHPS, MOVSHDUP
_set(_TWO, (0x14, 0x15, 0x28, 0x29, 0x2E, 0x2F, 0x54, 0x55, 0x56, 0x57), _NONE | _P66)
_TWO[0x5B] = _NONE | _P66 | _PF3
_set(_TWO, range(0x40, 0x50), _NONE | _P66)  # CMOVcc
_set(_TWO, range(0x60, 0x6C), _NONE | _P66)  # PUNPCK, PACK, PCMPGT
_set(_TWO, (0x6C, 0x6D), _P66)
_TWO[0x6E] = _NONE | _P66
_set(_TWO, (0x6F, 0x7E, 0x7F), _NONE | _P66 | _PF3)
_set(_TWO, (0x74, 0x75, 0x76), _NONE | _P66)
_TWO[0x70], _TWO_IB[0x70] = _ALL, 1  # PSHUFW/D/HW/LW
_set(_TWO, (0xA3, 0xA5, 0xAB, 0xAD, 0xAF, 0xB0, 0xB1, 0xB3, 0xBB, 0xC0, 0xC1), _NONE | _P66)
_set(_TWO, (0xB6, 0xB7, 0xBE, 0xBF), _NONE | _P66)  # MOVZX, MOVSX
_set(_TWO, (0xBC, 0xBD), _NONE | _P66 | _PF3)  # BSF/TZCNT, BSR/LZCNT
_TWO[0xB8] = _PF3  # POPCNT
_set(_TWO, (0xA4, 0xAC), _NONE | _P66)  # SHLD, SHRD imm8
_TWO_IB[0xA4] = _TWO_IB[0xAC] = 1
_TWO[0xC2], _TWO_IB[0xC2] = _ALL, 1  # CMPPS and kin
_TWO[0xC6], _TWO_IB[0xC6] = _NONE | _P66, 1  # SHUFPS/PD
_set(
    _TWO,
    (0xD1, 0xD2, 0xD3, 0xD4, 0xD5, 0xD8, 0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF),
    _NONE | _P66,
)
_TWO[0xD6] = _P66  # MOVQ
_set(
    _TWO,
    (0xE0, 0xE1, 0xE2, 0xE3, 0xE4, 0xE5, 0xE8, 0xE9, 0xEA, 0xEB, 0xEC, 0xED, 0xEE, 0xEF),
    _NONE | _P66,
)
_set(
    _TWO,
    (0xF1, 0xF2, 0xF3, 0xF4, 0xF5, 0xF6, 0xF8, 0xF9, 0xFA, 0xFB, 0xFC, 0xFD, 0xFE),
    _NONE | _P66,
)
# Two-byte instructions without ModRM (no mandatory prefix): UD2, RDTSC,
# CPUID, BSWAP.
_TWO_BARE = np.zeros(256, np.uint8)
_set(_TWO_BARE, (0x0B, 0x31, 0xA2), 1)
_set(_TWO_BARE, range(0xC8, 0xD0), 1)

_U8 = np.uint8(0)
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


@aot.njit(cache=True, inline="always", _nrt=False)
def _modrm_length(data, p, end, modrm):
    """Bytes of ModRM, SIB and displacement from ``p`` (the ModRM byte) in
    64-bit mode (32- and 64-bit addressing have the same layout), or -1 when
    ``data`` ends first."""
    mod = modrm >> 6
    rm = modrm & 7
    n = 1
    if mod != 3 and rm == 4:
        if p + 1 >= end:
            return -1
        n = 2
        if mod == 0 and (data[p + 1] & 7) == 5:
            n += 4
    if mod == 0 and rm == 5:
        n += 4
    elif mod == 1:
        n += 1
    elif mod == 2:
        n += 4
    return n


@aot.njit(cache=True, inline="always", _nrt=False)
def _imm_length(kind, opsize16, rex_w, addr32):
    if kind == _IB:
        return 1
    if kind == _IW:
        return 2
    if kind == _IZ:
        return 2 if opsize16 and not rex_w else 4
    if kind == _IV:
        return 8 if rex_w else (2 if opsize16 else 4)
    if kind == _MOFFS:
        return 4 if addr32 else 8
    if kind == _ENTER:
        return 3
    return 0


@aot.njit(cache=True, inline="always", _nrt=False)
def _sext(v, bits):
    sign = np.int64(1) << np.int64(bits - 1)
    v = np.int64(v)
    return (v ^ sign) - sign


@aot.njit(cache=True, inline="always", _nrt=False)
def _rel32_target(data, p, ip, size):
    """A branch's target: its rel32 at ``data[p]`` from the end of the
    instruction (``size`` bytes at ``ip``)."""
    rel = np.uint32(data[p]) | (np.uint32(data[p + 1]) << 8)
    rel |= (np.uint32(data[p + 2]) << 16) | (np.uint32(data[p + 3]) << 24)
    return (np.uint64(ip) + np.uint64(size) + np.uint64(_sext(rel, 32))) & _MASK64


@aot.njit(cache=True, _nrt=False)
def decode_quick(data, off, end, ip):
    """The instruction at ``data[off]`` (the bytes end at ``end``) decoded at
    address ``ip`` in 64-bit mode: ``(size, class, special, direct, target)``
    as :func:`hwtrace.isa.x86.decode` and :func:`~hwtrace.isa.x86.classify`
    would give them, or a class of :data:`QUICK_UNKNOWN` (and size 0) where
    this decoder does not know the instruction or the bytes end inside it."""
    unknown = (0, QUICK_UNKNOWN, 0, False, np.uint64(0))
    p = off
    limit = min(end, off + 15)
    opsize16 = False
    addr32 = False
    rep = 0  # 1: F3, 2: F2 (the last one)
    nrep = 0
    # Legacy prefixes.
    while p < limit:
        b = data[p]
        if b == 0x66:
            opsize16 = True
        elif b == 0x67:
            addr32 = True
        elif b == 0xF3:
            rep = 1
            nrep += 1
        elif b == 0xF2:
            rep = 2
            nrep += 1
        elif b == 0x26 or b == 0x2E or b == 0x36 or b == 0x3E or b == 0x64 or b == 0x65:
            pass
        elif b == 0xF0:
            return unknown
        else:
            break
        p += 1
    rex_w = False
    if p < limit and (data[p] & 0xF0) == 0x40:
        rex_w = (data[p] & 8) != 0
        p += 1
    if p >= limit:
        return unknown
    op = data[p]
    p += 1
    if op == 0x0F:
        return _decode_0f(data, p, limit, ip, off, opsize16, rex_w, rep, nrep)
    kind = _ONE[op]
    if kind == 0:
        return unknown
    if kind == 1 or kind == 2:
        if rep != 0 and (nrep > 1 or (_ONE_REP[op] & rep) == 0):
            return unknown
        n = 0
        if kind == 2:
            if p >= limit:
                return unknown
            n = _modrm_length(data, p, limit, data[p])
            if n < 0:
                return unknown
        size = p - off + n + _imm_length(_ONE_IMM[op], opsize16, rex_w, addr32)
        if off + size > limit:
            return unknown
        return (size, _OTHER, 0, False, np.uint64(0))
    # Kind 3: branches, groups and instructions valid only for some ModRM bytes.
    if 0x70 <= op <= 0x7F or 0xE0 <= op <= 0xE3 or op == 0xEB:
        if rep != 0 or opsize16:
            return unknown
        size = p - off + 1
        if off + size > limit:
            return unknown
        target = (np.uint64(ip) + np.uint64(size) + np.uint64(_sext(data[p], 8))) & _MASK64
        cls = _JUMP if op == 0xEB else _COND
        return (size, cls, 0, True, target)
    if op == 0xE8 or op == 0xE9:
        if rep != 0 or opsize16:
            return unknown
        size = p - off + 4
        if off + size > limit:
            return unknown
        return (size, _CALL if op == 0xE8 else _JUMP, 0, True, _rel32_target(data, p, ip, size))
    if op == 0xC3 or op == 0xC2:
        if rep == 2 or nrep > 1 or opsize16:
            return unknown
        size = p - off + (2 if op == 0xC2 else 0)
        if off + size > limit:
            return unknown
        return (size, _RETURN, 0, False, np.uint64(0))
    if rep != 0:
        return unknown
    if op == 0xCB or op == 0xCA:
        size = p - off + (2 if op == 0xCA else 0)
        if off + size > limit:
            return unknown
        return (size, _FAR_RETURN, 0, False, np.uint64(0))
    if op == 0xCC or op == 0xF1 or op == 0xCD:
        size = p - off + (1 if op == 0xCD else 0)
        if off + size > limit:
            return unknown
        return (size, _FAR_CALL, _CPL, False, np.uint64(0))
    # The rest have a ModRM byte whose reg field picks the instruction.
    if p >= limit:
        return unknown
    modrm = data[p]
    reg = (modrm >> 3) & 7
    mod = modrm >> 6
    cls = _OTHER
    imm = 0
    if op == 0x8C:
        if reg > 5:
            return unknown
    elif op == 0x8D:
        if mod == 3:
            return unknown
    elif op == 0x8F or op == 0xC6 or op == 0xC7:
        if reg != 0:
            return unknown
        imm = _ONE_IMM[op]
    elif op == 0xC0 or op == 0xC1 or (0xD0 <= op <= 0xD3):
        if reg == 6:
            return unknown
        imm = _ONE_IMM[op]
    elif op == 0xF6 or op == 0xF7:
        if reg == 1:
            return unknown
        if reg == 0:
            imm = _IB if op == 0xF6 else _IZ
    elif op == 0xFE:
        if reg > 1:
            return unknown
    else:  # 0xFF
        if reg == 3 or reg == 5 or reg == 7:
            return unknown
        if reg == 2 or reg == 4:
            if opsize16:
                return unknown
            cls = _CALL if reg == 2 else _JUMP
    n = _modrm_length(data, p, limit, modrm)
    if n < 0:
        return unknown
    size = p - off + n + _imm_length(imm, opsize16, rex_w, addr32)
    if off + size > limit:
        return unknown
    return (size, cls, 0, False, np.uint64(0))


@aot.njit(cache=True, inline="always", _nrt=False)
def _decode_0f(data, p, limit, ip, off, opsize16, rex_w, rep, nrep):
    unknown = (0, QUICK_UNKNOWN, 0, False, np.uint64(0))
    if p >= limit:
        return unknown
    op = data[p]
    p += 1
    if nrep > 1 or (opsize16 and rep != 0):
        return unknown
    prefix = _P66 if opsize16 else (_PF3 if rep == 1 else (_PF2 if rep == 2 else _NONE))
    if 0x80 <= op <= 0x8F:  # Jcc rel32
        if prefix != _NONE:
            return unknown
        size = p - off + 4
        if off + size > limit:
            return unknown
        return (size, _COND, 0, True, _rel32_target(data, p, ip, size))
    if op == 0x05:  # SYSCALL
        if prefix != _NONE:
            return unknown
        return (p - off, _FAR_CALL, _CPL, False, np.uint64(0))
    if _TWO_BARE[op]:
        if prefix != _NONE:
            return unknown
        return (p - off, _OTHER, 0, False, np.uint64(0))
    if p >= limit:
        return unknown
    modrm = data[p]
    reg = (modrm >> 3) & 7
    mod = modrm >> 6
    imm = 0
    allowed = _TWO[op]
    if allowed != 0:
        if (allowed & prefix) == 0:
            return unknown
        imm = _TWO_IB[op]
    elif op == 0x1E:  # ENDBR64, ENDBR32
        if prefix != _PF3 or (modrm != 0xFA and modrm != 0xFB):
            return unknown
    elif op == 0x1F:  # NOP r/m
        if reg != 0 or (prefix != _NONE and prefix != _P66):
            return unknown
    elif op == 0x18:  # PREFETCHh
        if reg > 3 or mod == 3 or prefix != _NONE:
            return unknown
    elif 0x90 <= op <= 0x9F:  # SETcc
        if reg != 0 or prefix != _NONE:
            return unknown
    elif op == 0xD7:  # PMOVMSKB
        if mod != 3 or (prefix != _NONE and prefix != _P66):
            return unknown
    elif op == 0xBA:  # BT/BTS/BTR/BTC imm8
        if reg < 4 or (prefix != _NONE and prefix != _P66):
            return unknown
        imm = 1
    elif op == 0xAE:  # FXSAVE .. CLFLUSH; LFENCE, MFENCE, SFENCE
        if prefix != _NONE:
            return unknown
        if mod == 3 and modrm != 0xE8 and modrm != 0xF0 and modrm != 0xF8:
            return unknown
    elif op == 0x01:  # XGETBV, RDTSCP
        if prefix != _NONE or (modrm != 0xD0 and modrm != 0xF9):
            return unknown
    else:
        return unknown
    n = _modrm_length(data, p, limit, modrm)
    if n < 0:
        return unknown
    size = p - off + n + imm
    if off + size > limit:
        return unknown
    return (size, _OTHER, 0, False, np.uint64(0))
