"""Compiled (numba, nopython) per-byte loops of the packet codec.

Everything here runs once per byte or per packet, so it is compiled; the
Python side in :mod:`hwtrace.pt.packets` only allocates and orchestrates.
Semantics follow Intel's SDM (Vol. 3C, ch. 33) and match Intel's reference
decoder, libipt, wherever the SDM leaves room (synchronisation, error kinds).
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ._state import (
    ERRATUM_SKD007,
    ERRATUM_SKZ84,
    LOOKAHEAD,
    PHASE_DECODE,
    PHASE_DONE,
    PHASE_SYNC,
    PSB_PLUS_SPAN,
    ROWS_FOLD_CYC,
    STOP_DONE,
    STOP_ERRORS,
    STOP_INPUT,
    STOP_ROWS,
)
from .kinds import IPC_PAYLOAD_BYTES, TNT8_AFTER_CYC, DecodeError, Kind

# Flag and payload bits of the columns (the table in kinds.py).
FLAG_IP = 1  # EXSTOP, BEP, PTW, CFE c: the packet binds to an IP (a FUP follows)
PIP_NR = 1  # PIP b: non-root
MODE_CSL = 1  # MODE.Exec a: CS.L
MODE_CSD = 2  # MODE.Exec a: CS.D
MODE_IF = 4  # MODE.Exec a: RFLAGS.IF
TSX_INTX = 1  # MODE.TSX a: in a transaction
TSX_ABRT = 2  # MODE.TSX a: aborted
PWRE_HW = 1  # PWRE c: hardware-initiated
PWRX_INT = 1  # PWRX c: woken by an interrupt
PWRX_ST = 2  # PWRX c: woken by a store to a monitored address
PWRX_HW = 4  # PWRX c: woken by a hardware event
BBP_SZ4 = 1  # BBP b: the block's BIPs carry 4 bytes
BIP_SZ4 = 1  # BIP c: a 4-byte payload
TRIG_IP = 1  # TRIG c: IP
TRIG_ICNT = 2  # TRIG c: the instruction count is valid
TRIG_MULT = 4  # TRIG c: MULT

# in_block: between BBP and BEP, and which size of BIP.
BLOCK_NONE = 0
BLOCK_SZ8 = 1
BLOCK_SZ4 = 2


PSB_SIZE = 16


def _tnt8_tables():
    bits = np.zeros(256, np.uint64)
    nbits = np.zeros(256, np.uint32)
    for byte in range(4, 256, 2):
        payload = byte >> 1
        n = payload.bit_length() - 1
        bits[byte] = payload & ~(1 << n)
        nbits[byte] = n
    return bits, nbits


TNT8_BITS, TNT8_NBITS = _tnt8_tables()
# The PSB payload read as a little-endian 64-bit word, in both byte phases.
PSB_WORD_LOHI = np.uint64(0x8202820282028202)
PSB_WORD_HILO = np.uint64(0x0282028202820282)
_0 = np.uint64(0)


@aot.njit(cache=True, inline="always")
def _read_le(buf, pos, n):
    # (An unsigned index: numba checks a signed one for a negative value,
    # on every byte of every payload.)
    v = np.uint64(0)
    for i in range(n):
        v |= np.uint64(buf[np.uint64(pos + i)]) << np.uint64(8 * i)
    return v


@aot.njit(cache=True, inline="always")
def _read_u64le(buf, pos):
    """The 8 bytes at ``pos`` as a little-endian word (one load: LLVM joins
    the bytes' loads).  (Unsigned: no check for a negative index.)"""
    u = np.uint64(pos)
    v = np.uint64(buf[u])
    for i in range(1, 8):
        v |= np.uint64(buf[u + np.uint64(i)]) << np.uint64(8 * i)
    return v


@aot.njit(cache=True, inline="always")
def _ip_bytes(ipc):
    if ipc == 0:
        return 0
    if ipc == 1:
        return 2
    if ipc == 2:
        return 4
    if ipc == 3 or ipc == 4:
        return 6
    if ipc == 6:
        return 8
    return -1


# _ip_bytes as tables by the 3-bit IPBytes field (-1: none such), and the
# mask of the payload's bytes in a little-endian word.
_IP_LEN = np.array([_ip_bytes.py_func(ipc) for ipc in range(8)], np.int64)
_IP_MASK = np.array([(1 << 8 * max(n, 0)) - 1 for n in _IP_LEN.tolist()], np.uint64)
# The packets with an IP payload by their opcode's low five bits (0: none).
_IP_KIND = np.zeros(32, np.uint8)
_IP_KIND[0x0D], _IP_KIND[0x1D], _IP_KIND[0x11], _IP_KIND[0x01] = (
    Kind.TIP, Kind.FUP, Kind.TIP_PGE, Kind.TIP_PGD
)  # fmt: skip


@aot.njit(cache=True, inline="always", _nrt=False)
def c_state(field):
    """The C-state number a PWRE or PWRX 4-bit state field encodes (C1 is
    0, C0 is 0xF: the field plus one, modulo 16), as Intel's tools print it."""
    return (np.uint64(field) + np.uint64(1)) & np.uint64(0xF)


@aot.njit(cache=True, inline="always", _nrt=False)
def block_after(kind, b, in_block):
    """Whether the next packet is in a BBP..BEP block, and of which item
    size (BLOCK_*), after packet ``kind`` (``b``: its second column): a BBP
    opens one; BEP, PSB and OVF close it."""
    if kind == Kind.BBP:
        return BLOCK_SZ4 if b == BBP_SZ4 else BLOCK_SZ8
    if kind == Kind.BEP or kind == Kind.PSB or kind == Kind.OVF:
        return BLOCK_NONE
    return in_block


@aot.njit(cache=True, inline="always", _nrt=False)
def decode_packet(buf, pos, end, in_block, errata):
    """Decode the packet at ``pos``.

    ``errata`` (ERRATUM_* bits) enables the workarounds for CPUs whose trace
    output is known to be corrupt in specific ways.

    Returns ``(size, kind, a, b, c)`` with the payload columns (uint64) on
    success, or ``(0, -error, 0, 0, 0)`` on failure.  ``pos == end`` is not a
    packet: callers check for it first.  No byte past ``pos + 16`` is read.
    """
    b0 = buf[pos]
    if b0 == 0x00:
        return 1, Kind.PAD, _0, _0, _0
    if b0 == 0x02:
        if pos + 1 >= end:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        ext = buf[pos + 1]
        if ext == 0x82:  # PSB
            if end < pos + PSB_SIZE:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            for i in range(2, PSB_SIZE, 2):
                if buf[pos + i] != 0x02 or buf[pos + i + 1] != 0x82:
                    return 0, -DecodeError.BAD_PACKET, _0, _0, _0
            return PSB_SIZE, Kind.PSB, _0, _0, _0
        if ext == 0x23:
            return 2, Kind.PSBEND, _0, _0, _0
        if ext == 0xA3:  # TNT-64
            if end < pos + 8:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            payload = _read_le(buf, pos + 2, 6)
            if payload == 0:
                return 0, -DecodeError.BAD_PACKET, _0, _0, _0
            nbits = 0
            p = payload >> np.uint64(1)
            while p != 0:
                nbits += 1
                p >>= np.uint64(1)
            bits = payload & ~(np.uint64(1) << np.uint64(nbits))
            return 8, Kind.TNT64, bits, np.uint64(nbits), _0
        if ext == 0x43:  # PIP
            if end < pos + 8:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            payload = _read_le(buf, pos + 2, 6)
            cr3 = (payload >> np.uint64(1)) << np.uint64(5)
            return 8, Kind.PIP, cr3, payload & np.uint64(PIP_NR), _0
        if ext == 0xF3:
            return 2, Kind.OVF, _0, _0, _0
        if ext == 0x03:  # CBR
            if end < pos + 4:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            return 4, Kind.CBR, np.uint64(buf[pos + 2]), _0, _0
        if ext == 0x73:  # TMA
            if end < pos + 7:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            ctc = np.uint64(buf[pos + 2]) | (np.uint64(buf[pos + 3]) << np.uint64(8))
            fc = np.uint64(buf[pos + 5]) | (np.uint64(buf[pos + 6]) << np.uint64(8))
            if (fc & ~np.uint64(0x1FF)) or buf[pos + 4] != 0:
                # SKZ84: TSC scaling/offsetting corrupts TMA; skip it as invalid.
                if errata & ERRATUM_SKZ84 and end >= pos + 8:
                    return 8, Kind.INVALID, _0, _0, _0
                return 0, -DecodeError.BAD_PACKET, _0, _0, _0
            return 7, Kind.TMA, ctc, fc, _0
        if ext == 0x83:
            return 2, Kind.STOP, _0, _0, _0
        if ext == 0xC8:  # VMCS
            if end < pos + 7:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            return 7, Kind.VMCS, _read_le(buf, pos + 2, 5) << np.uint64(12), _0, _0
        if ext == 0xC3:  # ext2
            if pos + 2 >= end:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            if buf[pos + 2] != 0x88:
                return 0, -DecodeError.BAD_OPCODE, _0, _0, _0
            if end < pos + 11:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            return 11, Kind.MNT, _read_le(buf, pos + 3, 8), _0, _0
        if ext == 0x62 or ext == 0xE2:
            return 2, Kind.EXSTOP, _0, _0, np.uint64(FLAG_IP if ext == 0xE2 else 0)
        if ext == 0xC2:  # MWAIT
            if end < pos + 10:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            return 10, Kind.MWAIT, _read_le(buf, pos + 2, 4), _read_le(buf, pos + 6, 4), _0
        if ext == 0x22:  # PWRE
            if end < pos + 4:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            payload = _read_le(buf, pos + 2, 2)
            state = (payload >> np.uint64(12)) & np.uint64(0xF)
            sub = (payload >> np.uint64(8)) & np.uint64(0xF)
            hw = np.uint64(PWRE_HW if payload & np.uint64(0x8) else 0)
            return 4, Kind.PWRE, state, sub, hw
        if ext == 0xA2:  # PWRX
            if end < pos + 7:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            payload = _read_le(buf, pos + 2, 5)
            last = (payload >> np.uint64(4)) & np.uint64(0xF)
            deepest = payload & np.uint64(0xF)
            wake = 0
            if payload & np.uint64(0x100):
                wake |= PWRX_INT
            if payload & np.uint64(0x400):
                wake |= PWRX_ST
            if payload & np.uint64(0x800):
                wake |= PWRX_HW
            return 7, Kind.PWRX, last, deepest, np.uint64(wake)
        if ext == 0x13:  # CFE
            if end < pos + 4:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            ip = np.uint64(FLAG_IP if buf[pos + 2] & 0x80 else 0)
            return 4, Kind.CFE, np.uint64(buf[pos + 2] & 0x1F), np.uint64(buf[pos + 3]), ip
        if ext == 0x53:  # EVD
            if end < pos + 11:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            return 11, Kind.EVD, _read_le(buf, pos + 3, 8), np.uint64(buf[pos + 2] & 0x1F), _0
        if ext == 0x63:  # BBP
            if end < pos + 3:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            sz = np.uint64(BBP_SZ4 if buf[pos + 2] & 0x80 else 0)
            return 3, Kind.BBP, np.uint64(buf[pos + 2] & 0x1F), sz, _0
        if ext == 0x33 or ext == 0xB3:  # BEP
            return 2, Kind.BEP, _0, _0, np.uint64(FLAG_IP if ext == 0xB3 else 0)
        if (ext & 0x1F) == 0x12:  # PTW
            plc = (ext >> 5) & 0x3
            if plc == 0:
                n = 4
            elif plc == 1:
                n = 8
            else:
                return 0, -DecodeError.BAD_PACKET, _0, _0, _0
            if end < pos + 2 + n:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            ip = np.uint64(FLAG_IP if ext & 0x80 else 0)
            return 2 + n, Kind.PTW, _read_le(buf, pos + 2, n), np.uint64(plc), ip
        return 0, -DecodeError.BAD_OPCODE, _0, _0, _0
    if in_block and (b0 & 0x07) == 0x04:  # BIP, only between BBP and BEP
        n = 4 if in_block == 2 else 8
        if end < pos + 1 + n:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        sz4 = np.uint64(BIP_SZ4 if n == 4 else 0)
        return 1 + n, Kind.BIP, _read_le(buf, pos + 1, n), np.uint64(b0 >> 3), sz4
    if (b0 & 0x01) == 0:  # TNT-8
        return 1, Kind.TNT8, TNT8_BITS[b0], np.uint64(TNT8_NBITS[b0]), _0
    if b0 == 0x99:  # MODE
        if end < pos + 2:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        m = buf[pos + 1]
        leaf = m & 0xE0
        if leaf == 0x00:
            return 2, Kind.MODE_EXEC, np.uint64(m & 0x1F), _0, _0
        if leaf == 0x20:
            return 2, Kind.MODE_TSX, np.uint64(m & 0x1F), _0, _0
        return 0, -DecodeError.BAD_PACKET, _0, _0, _0
    if b0 == 0x19:  # TSC
        if end < pos + 8:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        return 8, Kind.TSC, _read_le(buf, pos + 1, 7), _0, _0
    if b0 == 0x59:  # MTC
        if end < pos + 2:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        return 2, Kind.MTC, np.uint64(buf[pos + 1]), _0, _0
    if b0 == 0xD9:  # TRIG
        if end < pos + 3:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        f = buf[pos + 1]
        size = 3
        icnt = np.uint64(0)
        if f & 0x40:
            if end < pos + 5:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            icnt = _read_le(buf, pos + 3, 2)
            size = 5
        flags = 0
        if f & 0x80:
            flags |= TRIG_IP
        if f & 0x40:
            flags |= TRIG_ICNT
        if f & 0x20:
            flags |= TRIG_MULT
        return size, Kind.TRIG, np.uint64(buf[pos + 2]), icnt, np.uint64(flags)
    if (b0 & 0x03) == 0x03:  # CYC
        value = np.uint64(b0 >> 3)
        p = pos + 1
        ext = b0 & 0x04
        shl = 5
        while ext:
            if p >= end:
                return 0, -DecodeError.TRUNCATED, _0, _0, _0
            x = buf[p]
            p += 1
            ext = x & 0x01
            bits = np.uint64(x >> 1)
            if shl < 64:
                value |= bits << np.uint64(shl)
            shl += 7
            if shl > 64:
                return 0, -DecodeError.BAD_PACKET, _0, _0, _0
        # SKD007: an OVF may replace the rest of a multi-byte CYC.
        if (
            errata & ERRATUM_SKD007
            and p - pos == 2
            and (value & ~np.uint64(0x1F)) == np.uint64(0x20)
            and p < end
            and buf[p] == 0xF3
        ):
            return 3, Kind.OVF, _0, _0, _0
        return p - pos, Kind.CYC, value, _0, _0
    low = b0 & 0x1F
    kind = 0
    if low == 0x0D:
        kind = Kind.TIP
    elif low == 0x1D:
        kind = Kind.FUP
    elif low == 0x11:
        kind = Kind.TIP_PGE
    elif low == 0x01:
        kind = Kind.TIP_PGD
    if kind != 0:
        ipc = b0 >> 5
        n = _ip_bytes(ipc)
        if n < 0:
            return 0, -DecodeError.BAD_PACKET, _0, _0, _0
        if end < pos + 1 + n:
            return 0, -DecodeError.TRUNCATED, _0, _0, _0
        return 1 + n, kind, _read_le(buf, pos + 1, n), np.uint64(ipc), _0
    return 0, -DecodeError.BAD_OPCODE, _0, _0, _0


@aot.njit(cache=True)
def _find_psb_end(buf, pos, begin, end):
    """libipt's pt_find_psb: from a position inside a PSB payload, walk to its
    end and return the PSB's start, or -1."""
    if buf[pos] != 0x02:
        pos += 1
    while pos + 1 < end:
        if buf[pos] != 0x02 or buf[pos + 1] != 0x82:
            break
        pos += 2
    pos -= PSB_SIZE
    if pos < begin:
        return -1
    if buf[pos] != 0x02 or buf[pos + 1] != 0x82:
        return -1
    if end < pos + PSB_SIZE:
        return -1
    for i in range(2, PSB_SIZE, 2):
        if buf[pos + i] != 0x02 or buf[pos + i + 1] != 0x82:
            return -1
    return pos


@aot.njit(cache=True)
def sync_forward(buf, pos, begin, end):
    """Offset of the first PSB at or after ``pos`` (-1 if none).

    Scans aligned 64-bit words for the PSB payload pattern like libipt, so a
    stream synchronises at exactly the PSB Intel's decoder picks.
    """
    start = pos
    rel = pos - begin
    pos = begin + ((rel + 7) // 8) * 8
    while True:
        cur = pos
        pos += 8
        if end < pos:
            return -1
        w = _read_le(buf, cur, 8)
        if w != PSB_WORD_LOHI and w != PSB_WORD_HILO:
            continue
        found = _find_psb_end(buf, pos, begin, end)
        if found < 0:
            continue
        if found < start:
            continue
        return found


@aot.njit(cache=True)
def sync_backward(buf, pos, begin, end):
    """Offset of the last complete PSB that starts before ``pos`` (-1 if none)."""
    p = pos - 1
    while p >= begin:
        if buf[p] == 0x02 and p + PSB_SIZE <= end:
            ok = True
            for i in range(0, PSB_SIZE, 2):
                if buf[p + i] != 0x02 or buf[p + i + 1] != 0x82:
                    ok = False
                    break
            if ok:
                # Walk back over a longer run of the pattern to its first PSB
                # boundary, as a forward scan would have found it.
                q = p
                while q - 2 >= begin and buf[q - 2] == 0x02 and buf[q - 1] == 0x82:
                    q -= 2
                return q if q + PSB_SIZE <= pos else p
        p -= 1
    return -1


@aot.njit(cache=True, nogil=True)
def psb_plus_end(buf, psb, end):
    """The offset just after the first PSBEND from the PSB at ``psb`` on,
    reading no further than ``end``: -1 when none comes before ``end``, -2
    when a packet is bad or breaks off first.  As decoding ``buf[psb:stop]``
    for ``stop`` ``PSB_PLUS_SPAN`` bytes on, then four times as far at each
    try, would find it: a packet that does not fit before ``stop`` ends the
    search."""
    span = PSB_PLUS_SPAN
    stop = min(end, psb + span)
    pos = psb
    in_block = BLOCK_NONE
    while True:
        if pos >= stop:
            if stop >= end:
                return -1
            span *= 4
            stop = min(end, psb + span)
            continue
        size, kind, _, b, _ = decode_packet(buf, pos, stop, in_block, 0)
        if size <= 0:
            return -2
        if kind == Kind.PSBEND:
            return pos + size
        in_block = block_after(kind, b, in_block)
        pos += size


@aot.njit(cache=True, nogil=True, _nrt=False)
def psb_cuts(buf, chunk_bytes, starts, plus_ends):
    """Cut ``buf`` about every ``chunk_bytes`` at a PSB (the first at or
    after each cut): their offsets into ``starts`` and where their PSB+
    ends into ``plus_ends`` (the PSB's own offset where its PSB+ breaks
    off or is cut by the buffer's end); returns how many (no more than the
    arrays' room)."""
    size = buf.shape[0]
    first = sync_forward(buf, 0, 0, size) if size else -1
    if first < 0:
        return 0
    starts[0] = first
    n = 1
    target = first + chunk_bytes
    while target < size and n < starts.shape[0]:
        nxt = sync_forward(buf, target, 0, size)
        if nxt < 0:
            break
        if nxt > starts[n - 1]:
            starts[n] = nxt
            n += 1
        target = nxt + chunk_bytes
    for i in range(n):
        got = psb_plus_end(buf, starts[i], size)
        plus_ends[i] = got if got >= 0 else starts[i]
    return n


@aot.njit(cache=True, inline="always", _nrt=False)
def _resync_start(err_pos, sync_pos, begin):
    """Where libipt's pt_pkt_sync_forward starts looking after an error at
    ``err_pos``: a PSB's length early, so a PSB partly swallowed by a bogus
    packet is still found (past the PSB itself when the error is there)."""
    pos = err_pos
    if pos == sync_pos:
        pos += PSB_SIZE
    space = pos - begin
    if space >= PSB_SIZE:
        space = PSB_SIZE - 1
    return pos - space


@aot.njit(cache=True)
def resync_point(buf, err_pos, sync_pos, begin, end):
    """Where decoding resumes after an error at ``err_pos`` (libipt's
    pt_pkt_sync_forward): start a PSB's length early so a PSB partly swallowed
    by a bogus preceding packet is still found."""
    pos = _resync_start(err_pos, sync_pos, begin)
    if pos >= end:
        return -1
    return sync_forward(buf, pos, begin, end)


# The size of the packets that are known from their first byte alone and
# have nothing in their payload to check (PAD, TNT-8, TSC, MTC, and TIP,
# TIP.PGE, TIP.PGD and FUP with a valid IP compression), outside BBP..BEP;
# 0 for every other first byte.  A pass that only checks the stream
# (ptdump --quiet) steps over these without decoding them.
def _fixed_sizes() -> np.ndarray:
    sizes = np.zeros(256, np.int64)
    sizes[0x00] = 1  # PAD
    sizes[4::2] = 1  # TNT-8 (0x02 is the extended opcode)
    sizes[0x19] = 8  # TSC
    sizes[0x59] = 2  # MTC
    for low in (0x0D, 0x11, 0x01, 0x1D):  # TIP, TIP.PGE, TIP.PGD, FUP
        for ipc, n in IPC_PAYLOAD_BYTES.items():
            sizes[(ipc << 5) | low] = 1 + n
    return sizes


FIXED_SIZE = _fixed_sizes()


@aot.njit(cache=True, inline="always", _nrt=False)
def _psb_at(buf, pos, end):
    """A whole PSB starts at ``pos`` (the check at the end of libipt's
    pt_find_psb)."""
    if end < pos + PSB_SIZE:
        return False
    for i in range(0, PSB_SIZE, 2):
        if buf[pos + i] != 0x02 or buf[pos + i + 1] != 0x82:
            return False
    return True


@aot.njit(cache=True, _nrt=False)
def _plain_packets(buf, pos, lim, avail, base, n, cap, errata, rows):
    """TNT-8s, the packets with an IP (TIP, FUP, TIP.PGE, TIP.PGD), MODEs
    and the timing packets between them (CYC, MTC) from ``pos`` into rows
    from ``n``, until another packet (or ``lim``, or ``cap`` rows); returns
    ``(pos, n)`` after them, as decode_packet decodes them.  (A user-space
    trace turns tracing off and on at every system call and interrupt: a
    FUP, TIP.PGD, MODE.Exec and TIP.PGE among its TNTs and TIPs.)  (Unsigned indices:
    numba checks a signed one for a negative value, on every packet.  Not
    inlined into decode_stream: there the six columns' pointers were
    spilled to the stack and reloaded for every packet.)  With
    ROWS_FOLD_CYC among ``errata``, a CYC and the TNT-8 right after it are
    one row (see :data:`hwtrace.pt.kinds.TNT8_AFTER_CYC`)."""
    offsets, kinds, sizes, col_a, col_b, col_c = rows
    one = np.uint64(1)
    fold = (errata & ROWS_FOLD_CYC) != 0
    u, r = np.uint64(pos), np.uint64(n)
    u_lim, u_avail, u_cap = np.uint64(max(lim, 0)), np.uint64(avail), np.uint64(cap)
    while u < u_lim and r < u_cap:
        b0 = buf[u]
        if (b0 & 0x01) == 0 and b0 > 0x02:
            offsets[r] = np.int64(u) + base
            kinds[r] = Kind.TNT8
            sizes[r] = 1
            col_a[r] = TNT8_BITS[b0]
            col_b[r] = TNT8_NBITS[b0]
            col_c[r] = 0
            r += one
            u += one
            continue
        if (b0 & 0x03) == 0x03:
            # A CYC, as decode_packet reads it: of one byte, or of two (the
            # erratum that lets an OVF replace the second byte is
            # decode_packet's to check).
            if (b0 & 0x04) == 0:
                value = np.uint64(b0 >> 3)
                size = one
            elif u + one < u_avail and (buf[u + one] & 0x01) == 0 and not (errata & ERRATUM_SKD007):
                value = np.uint64(b0 >> 3) | (np.uint64(buf[u + one] >> 1) << np.uint64(5))
                size = np.uint64(2)
            else:
                break
            if fold and u + size < u_lim:
                t = buf[u + size]
                if (t & 0x01) == 0 and t > 0x02:
                    offsets[r] = np.int64(u) + base
                    kinds[r] = TNT8_AFTER_CYC
                    sizes[r] = size + one
                    col_a[r] = TNT8_BITS[t]
                    col_b[r] = np.uint32(TNT8_NBITS[t]) | (np.uint32(value) << np.uint32(8))
                    col_c[r] = 0
                    r += one
                    u += size + one
                    continue
            offsets[r] = np.int64(u) + base
            kinds[r] = Kind.CYC
            sizes[r] = size
            col_a[r] = value
            col_b[r] = 0
            col_c[r] = 0
            r += one
            u += size
            continue
        if b0 == 0x59 and u + one < u_avail:  # MTC
            offsets[r] = np.int64(u) + base
            kinds[r] = Kind.MTC
            sizes[r] = 2
            col_a[r] = buf[u + one]
            col_b[r] = 0
            col_c[r] = 0
            r += one
            u += np.uint64(2)
            continue
        low = b0 & 0x1F
        # (TIPs first: on plain flow, most of these packets.)
        ip_kind = np.uint8(Kind.TIP) if low == 0x0D else _IP_KIND[low]
        if ip_kind == 0:
            if b0 != 0x99 or u + one >= u_avail:
                break
            # MODE: its leaf (Exec or TSX) and bits.
            m = buf[u + one]
            leaf = m & 0xE0
            if leaf != 0x00 and leaf != 0x20:
                break
            offsets[r] = np.int64(u) + base
            kinds[r] = Kind.MODE_EXEC if leaf == 0x00 else Kind.MODE_TSX
            sizes[r] = 2
            col_a[r] = m & 0x1F
            col_b[r] = 0
            col_c[r] = 0
            r += one
            u += np.uint64(2)
            continue
        ipc = b0 >> 5
        ni = _IP_LEN[ipc]
        if ni < 0 or u + one + np.uint64(ni) > u_avail:
            break
        offsets[r] = np.int64(u) + base
        kinds[r] = ip_kind
        sizes[r] = 1 + ni
        # (A word and a mask, not a loop over the payload's bytes: the
        # compression varies from one TIP to the next.)
        if u + np.uint64(9) <= u_avail:
            col_a[r] = _read_u64le(buf, u + one) & _IP_MASK[ipc]
        else:
            col_a[r] = _read_le(buf, np.int64(u) + 1, ni)
        col_b[r] = ipc
        col_c[r] = 0
        r += one
        u += one + np.uint64(ni)
    return np.int64(u), np.int64(r)


@aot.njit(cache=True, _nrt=False)
def _fixed_packets(buf, pos, lim, avail):
    """Step over the packets of a fixed size from ``pos`` (counting, not
    decoding them) until another packet (or ``lim``); returns ``(pos,
    count)`` after them.  (A function of its own, as _plain_packets: its
    loop keeps its few values in registers.)"""
    u, u_lim, u_avail = np.uint64(pos), np.uint64(max(lim, 0)), np.uint64(avail)
    k = 0
    while u < u_lim:
        size = np.uint64(FIXED_SIZE[buf[u]])
        if size == 0 or u + size > u_avail:
            break
        u += size
        k += 1
    return np.int64(u), k


@aot.njit(cache=True, nogil=True, _nrt=False)
def decode_stream(buf, avail, state, rows, errs, store):
    """Decode a stream that arrives in pieces: the packets in ``buf[:avail]``.

    ``state`` (a record array of :data:`hwtrace.pt._state.DECODER_FIELDS`)
    carries everything from one call to the next: where decoding stands,
    libipt's search for a PSB (pt_sync_forward: aligned 8-byte words of the
    PSB pattern, then a walk to the end of the run), and the in-block mode.
    Its ``base`` says which stream offset ``buf[0]`` is, and ``final``
    whether ``buf[:avail]`` ends the stream.  Until it does, a packet is
    decoded only when :data:`LOOKAHEAD` bytes from its start are at hand and
    a search never concludes at the end of the buffer: the call returns
    ``STOP_INPUT`` and the caller moves the bytes from ``state.keep`` on to
    the front of its buffer and appends more.  So how the stream is cut into
    pieces never changes the packets, errors and offsets, which are libipt's
    (pt_pkt_next, with pt_pkt_sync_forward after an error).

    ``rows`` are the packet columns (offset, kind, size, a, b, c) and
    ``errs`` the error columns (offset, DecodeError, row index), filled from
    row 0 and from ``state.errors``.  With ``store`` false no rows are
    written (only counted, in ``state.packets``): checking a stream costs
    less than decoding it into columns.  Returns a ``STOP_*`` code.
    """
    offsets, kinds, sizes, col_a, col_b, col_c = rows
    err_offsets, err_codes, err_index = errs
    s = state[0]
    base = s.base
    final = s.final != 0
    resync = s.resync != 0
    errata = s.errata
    begin = -base  # the stream's first byte, as a buffer position
    pos = s.pos - base
    sync_pos = s.sync_pos - base
    in_block = s.in_block
    phase = s.phase
    scan = s.scan - base
    scan_start = s.scan_start - base
    walking = s.walk >= 0
    walk = s.walk - base
    walk_from = s.walk_from - base
    synced = s.synced
    packets = s.packets
    n = 0
    nerr = s.errors
    cap = offsets.shape[0] if store else 0
    ecap = err_offsets.shape[0]
    keep = pos - PSB_SIZE
    stop = STOP_DONE
    while True:
        if phase == PHASE_SYNC:
            found = -1
            need = False
            while True:
                if walking:
                    # Over the run of PSB pattern to its end (pt_find_psb).
                    q = walk
                    while q + 1 < avail and buf[q] == 0x02 and buf[q + 1] == 0x82:
                        q += 2
                    if q + 1 >= avail and not final:
                        walk = q
                        need = True
                        break
                    walking = False
                    f = q - PSB_SIZE
                    if f >= begin and f >= scan_start and _psb_at(buf, f, avail):
                        found = f
                        break
                    continue  # not a PSB after all: on with the next word
                if scan + 8 > avail:
                    need = not final
                    break
                w = _read_le(buf, scan, 8)
                scan += 8
                if w != PSB_WORD_LOHI and w != PSB_WORD_HILO:
                    continue
                q = scan
                if q >= avail:
                    if not final:
                        scan -= 8  # test this word again with the next byte at hand
                        need = True
                        break
                    q += 1  # nothing follows the stream: not the PSB's 0x02
                elif buf[q] != 0x02:
                    q += 1
                walking = True
                walk = q
                walk_from = q
            if need:
                # A PSB found later starts 16 bytes before the end of the run
                # being walked, or no earlier than 8 bytes before the next
                # word to test (see pt_find_psb).
                if walking and walk - walk_from >= PSB_SIZE:
                    keep = walk - PSB_SIZE
                else:
                    keep = scan - 2 * PSB_SIZE
                stop = STOP_INPUT
                break
            if found < 0:
                phase = PHASE_DONE
                break
            pos = found
            sync_pos = found
            in_block = BLOCK_NONE
            phase = PHASE_DECODE
            synced = 1
        if phase != PHASE_DECODE:
            break
        if pos >= avail or (pos + LOOKAHEAD > avail and not final):
            if final:
                phase = PHASE_DONE
                break
            keep = pos - PSB_SIZE  # a resynchronisation may start 15 bytes back
            stop = STOP_INPUT
            break
        if n >= cap and store:
            stop = STOP_ROWS
            break
        if in_block == BLOCK_NONE and store:
            # TNT-8s, packets with an IP, MODEs and the timing packets that
            # come between them (CYC, MTC), by far the most frequent
            # packets, in a loop of their own (no other opcode has their low
            # bits outside a BBP block); anything else goes the general way.
            lim = avail if final else avail - LOOKAHEAD + 1
            n0 = n
            pos, n = _plain_packets(buf, pos, lim, avail, base, n, cap, errata, rows)
            packets += n - n0
            if pos >= lim or n >= cap:
                continue  # the checks above say what now
        elif in_block == BLOCK_NONE:
            lim = avail if final else avail - LOOKAHEAD + 1
            pos, k = _fixed_packets(buf, pos, lim, avail)
            if k:
                packets += k
                continue  # the checks above say what now
        size, kind, a, b, c = decode_packet(buf, pos, avail, in_block, errata)
        if size > 0:
            if store:
                offsets[n] = pos + base
                kinds[n] = kind
                sizes[n] = size
                col_a[n] = a
                col_b[n] = np.uint32(b)
                col_c[n] = np.uint8(c)
                n += 1
            packets += 1
            in_block = block_after(kind, b, in_block)
            pos += size
            continue
        # An error: record it, then resynchronise at the next PSB.
        if nerr >= ecap:
            stop = STOP_ERRORS
            break
        err_offsets[nerr] = pos + base
        err_codes[nerr] = -kind
        err_index[nerr] = n
        nerr += 1
        if not resync or kind == -DecodeError.TRUNCATED:
            phase = PHASE_DONE
            break
        p = _resync_start(pos, sync_pos, begin)
        scan_start = p
        scan = begin + ((p - begin + 7) // 8) * 8
        walking = False
        phase = PHASE_SYNC
    s.pos = pos + base
    s.sync_pos = sync_pos + base
    s.in_block = in_block
    s.phase = phase
    s.scan = scan + base
    s.scan_start = scan_start + base
    s.walk = walk + base if walking else -1
    s.walk_from = walk_from + base
    s.synced = synced
    s.packets = packets
    s.rows = n
    s.errors = nerr
    s.keep = max(keep, 0) + base
    return stop


@aot.njit(cache=True, inline="always")
def _write_le(out, pos, v, n):
    for i in range(n):
        out[pos + i] = np.uint8((v >> np.uint64(8 * i)) & np.uint64(0xFF))
    return pos + n


@aot.njit(cache=True)
def encoded_size(kind, a, b, c):
    """Size in bytes of one packet's encoding (-1 if the fields are invalid)."""
    if kind == Kind.PAD or kind == Kind.TNT8:
        return 1
    if kind == Kind.PSB:
        return PSB_SIZE
    if (
        kind == Kind.PSBEND
        or kind == Kind.OVF
        or kind == Kind.STOP
        or kind == Kind.EXSTOP
        or kind == Kind.BEP
    ):
        return 2
    if kind == Kind.TNT64 or kind == Kind.PIP or kind == Kind.TSC:
        return 8
    if kind == Kind.TIP or kind == Kind.TIP_PGE or kind == Kind.TIP_PGD or kind == Kind.FUP:
        n = _ip_bytes(b)
        return -1 if n < 0 else 1 + n
    if kind == Kind.MODE_EXEC or kind == Kind.MODE_TSX or kind == Kind.MTC:
        return 2
    if kind == Kind.CBR or kind == Kind.PWRE or kind == Kind.CFE:
        return 4
    if kind == Kind.TMA or kind == Kind.VMCS or kind == Kind.PWRX:
        return 7
    if kind == Kind.MNT or kind == Kind.EVD:
        return 11
    if kind == Kind.MWAIT:
        return 10
    if kind == Kind.PTW:
        if b == 0:
            return 6
        if b == 1:
            return 10
        return -1
    if kind == Kind.BBP:
        return 3
    if kind == Kind.BIP:
        return 5 if c else 9
    if kind == Kind.TRIG:
        return 5 if c & 2 else 3
    if kind == Kind.CYC:
        n = 1
        v = a >> np.uint64(5)
        while v != 0:
            n += 1
            v >>= np.uint64(7)
        return n
    return -1


@aot.njit(cache=True)
def encode_rows(kinds, col_a, col_b, col_c, out):
    """Encode rows into ``out`` (sized by :func:`encoded_size`).

    Returns the number of bytes written, or ``-(row + 1)`` for the first row
    whose fields cannot be encoded.
    """
    pos = 0
    for i in range(kinds.shape[0]):
        kind = kinds[i]
        a = col_a[i]
        b = col_b[i]
        c = col_c[i]
        if kind == Kind.PAD:
            out[pos] = 0
            pos += 1
        elif kind == Kind.PSB:
            for j in range(0, PSB_SIZE, 2):
                out[pos + j] = 0x02
                out[pos + j + 1] = 0x82
            pos += PSB_SIZE
        elif kind == Kind.PSBEND:
            out[pos] = 0x02
            out[pos + 1] = 0x23
            pos += 2
        elif kind == Kind.TNT8:
            if b < 1 or b > 6 or (a >> np.uint64(b)) != 0:
                return -(i + 1)
            out[pos] = np.uint8(((a | (np.uint64(1) << np.uint64(b))) << np.uint64(1)) & 0xFF)
            pos += 1
        elif kind == Kind.TNT64:
            if b < 1 or b > 47 or (a >> np.uint64(b)) != 0:
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0xA3
            pos = _write_le(out, pos + 2, a | (np.uint64(1) << np.uint64(b)), 6)
        elif kind == Kind.TIP or kind == Kind.TIP_PGE or kind == Kind.TIP_PGD or kind == Kind.FUP:
            n = _ip_bytes(b)
            if n < 0:
                return -(i + 1)
            if kind == Kind.TIP:
                op = 0x0D
            elif kind == Kind.TIP_PGE:
                op = 0x11
            elif kind == Kind.TIP_PGD:
                op = 0x01
            else:
                op = 0x1D
            out[pos] = np.uint8(op | (b << 5))
            pos = _write_le(out, pos + 1, a, n)
        elif kind == Kind.MODE_EXEC or kind == Kind.MODE_TSX:
            out[pos] = 0x99
            leaf = 0x00 if kind == Kind.MODE_EXEC else 0x20
            out[pos + 1] = np.uint8(leaf | (a & np.uint64(0x1F)))
            pos += 2
        elif kind == Kind.PIP:
            if a & np.uint64(0x1F) or a >> np.uint64(52):
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0x43
            v = ((a >> np.uint64(5)) << np.uint64(1)) | (np.uint64(b) & np.uint64(1))
            pos = _write_le(out, pos + 2, v, 6)
        elif kind == Kind.VMCS:
            if a & np.uint64(0xFFF) or a >> np.uint64(52):
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0xC8
            pos = _write_le(out, pos + 2, a >> np.uint64(12), 5)
        elif kind == Kind.CBR:
            out[pos] = 0x02
            out[pos + 1] = 0x03
            out[pos + 2] = np.uint8(a & np.uint64(0xFF))
            out[pos + 3] = 0
            pos += 4
        elif kind == Kind.TSC:
            out[pos] = 0x19
            pos = _write_le(out, pos + 1, a, 7)
        elif kind == Kind.MTC:
            out[pos] = 0x59
            out[pos + 1] = np.uint8(a & np.uint64(0xFF))
            pos += 2
        elif kind == Kind.TMA:
            if b > 0x1FF:
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0x73
            pos = _write_le(out, pos + 2, a, 2)
            out[pos] = 0
            pos = _write_le(out, pos + 1, np.uint64(b), 2)
        elif kind == Kind.CYC:
            first = np.uint8(0x03 | ((a & np.uint64(0x1F)) << np.uint64(3)))
            rest = a >> np.uint64(5)
            if rest != 0:
                first |= 0x04
            out[pos] = first
            pos += 1
            while rest != 0:
                byte = np.uint8((rest & np.uint64(0x7F)) << np.uint64(1))
                rest >>= np.uint64(7)
                if rest != 0:
                    byte |= 0x01
                out[pos] = byte
                pos += 1
        elif kind == Kind.OVF:
            out[pos] = 0x02
            out[pos + 1] = 0xF3
            pos += 2
        elif kind == Kind.STOP:
            out[pos] = 0x02
            out[pos + 1] = 0x83
            pos += 2
        elif kind == Kind.MNT:
            out[pos] = 0x02
            out[pos + 1] = 0xC3
            out[pos + 2] = 0x88
            pos = _write_le(out, pos + 3, a, 8)
        elif kind == Kind.PTW:
            if b > 1:
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = np.uint8(0x12 | (b << 5) | (0x80 if c else 0))
            pos = _write_le(out, pos + 2, a, 4 if b == 0 else 8)
        elif kind == Kind.EXSTOP:
            out[pos] = 0x02
            out[pos + 1] = 0xE2 if c else 0x62
            pos += 2
        elif kind == Kind.MWAIT:
            out[pos] = 0x02
            out[pos + 1] = 0xC2
            pos = _write_le(out, pos + 2, a, 4)
            pos = _write_le(out, pos, np.uint64(b), 4)
        elif kind == Kind.PWRE:
            out[pos] = 0x02
            out[pos + 1] = 0x22
            v = ((a & np.uint64(0xF)) << np.uint64(12)) | (
                (np.uint64(b) & np.uint64(0xF)) << np.uint64(8)
            )
            if c:
                v |= np.uint64(0x8)
            pos = _write_le(out, pos + 2, v, 2)
        elif kind == Kind.PWRX:
            out[pos] = 0x02
            out[pos + 1] = 0xA2
            v = ((a & np.uint64(0xF)) << np.uint64(4)) | (np.uint64(b) & np.uint64(0xF))
            if c & 1:
                v |= np.uint64(0x100)
            if c & 2:
                v |= np.uint64(0x400)
            if c & 4:
                v |= np.uint64(0x800)
            pos = _write_le(out, pos + 2, v, 5)
        elif kind == Kind.BBP:
            out[pos] = 0x02
            out[pos + 1] = 0x63
            out[pos + 2] = np.uint8((a & np.uint64(0x1F)) | (0x80 if b else 0))
            pos += 3
        elif kind == Kind.BIP:
            out[pos] = np.uint8(((b & 0x1F) << 3) | 0x04)
            pos = _write_le(out, pos + 1, a, 4 if c else 8)
        elif kind == Kind.BEP:
            out[pos] = 0x02
            out[pos + 1] = 0xB3 if c else 0x33
            pos += 2
        elif kind == Kind.CFE:
            out[pos] = 0x02
            out[pos + 1] = 0x13
            out[pos + 2] = np.uint8((a & np.uint64(0x1F)) | (0x80 if c else 0))
            out[pos + 3] = np.uint8(b & 0xFF)
            pos += 4
        elif kind == Kind.EVD:
            out[pos] = 0x02
            out[pos + 1] = 0x53
            out[pos + 2] = np.uint8(b & 0x1F)
            pos = _write_le(out, pos + 3, a, 8)
        elif kind == Kind.TRIG:
            out[pos] = 0xD9
            out[pos + 1] = np.uint8(((c & 1) << 7) | (((c >> 1) & 1) << 6) | (((c >> 2) & 1) << 5))
            out[pos + 2] = np.uint8(a & np.uint64(0xFF))
            pos += 3
            if c & 2:
                pos = _write_le(out, pos, np.uint64(b), 2)
        else:
            return -(i + 1)
    return pos
