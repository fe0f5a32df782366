"""Compiled (numba, nopython) per-byte loops of the packet codec.

Everything here runs once per byte or per packet, so it is compiled; the
Python side in :mod:`hwtrace.pt.packets` only allocates and orchestrates.
Semantics follow Intel's SDM (Vol. 3C, ch. 33) and match Intel's reference
decoder, libipt, wherever the SDM leaves room (synchronisation, error kinds).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .kinds import DecodeError, Kind

# Kind constants as plain ints so numba folds them.
PAD = int(Kind.PAD)
PSB = int(Kind.PSB)
PSBEND = int(Kind.PSBEND)
TNT8 = int(Kind.TNT8)
TNT64 = int(Kind.TNT64)
TIP = int(Kind.TIP)
TIP_PGE = int(Kind.TIP_PGE)
TIP_PGD = int(Kind.TIP_PGD)
FUP = int(Kind.FUP)
MODE_EXEC = int(Kind.MODE_EXEC)
MODE_TSX = int(Kind.MODE_TSX)
PIP = int(Kind.PIP)
VMCS = int(Kind.VMCS)
CBR = int(Kind.CBR)
TSC = int(Kind.TSC)
MTC = int(Kind.MTC)
TMA = int(Kind.TMA)
CYC = int(Kind.CYC)
OVF = int(Kind.OVF)
STOP = int(Kind.STOP)
MNT = int(Kind.MNT)
PTW = int(Kind.PTW)
EXSTOP = int(Kind.EXSTOP)
MWAIT = int(Kind.MWAIT)
PWRE = int(Kind.PWRE)
PWRX = int(Kind.PWRX)
BBP = int(Kind.BBP)
BIP = int(Kind.BIP)
BEP = int(Kind.BEP)
CFE = int(Kind.CFE)
EVD = int(Kind.EVD)
TRIG = int(Kind.TRIG)
INVALID = int(Kind.INVALID)

ERRATUM_SKD007 = 1
ERRATUM_SKZ84 = 2

E_BAD_OPC = int(DecodeError.BAD_OPCODE)
E_BAD_PACKET = int(DecodeError.BAD_PACKET)
E_TRUNCATED = int(DecodeError.TRUNCATED)

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


@njit(cache=True, inline="always")
def _read_le(buf, pos, n):
    v = np.uint64(0)
    for i in range(n):
        v |= np.uint64(buf[pos + i]) << np.uint64(8 * i)
    return v


@njit(cache=True, inline="always")
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


@njit(cache=True, inline="always")
def decode_one(buf, pos, end, in_block, errata, out):
    """Decode the packet at ``pos``.

    ``errata`` (ERRATUM_* bits) enables the workarounds for CPUs whose trace
    output is known to be corrupt in specific ways.

    Returns ``(size, kind)`` on success with the payload in ``out[0..2]``
    (``a``, ``b``, ``c``), or ``(0, -error)`` on failure.  ``pos == end`` is
    not a packet: callers check for it first.
    """
    b0 = buf[pos]
    if b0 == 0x00:
        return 1, PAD
    if b0 == 0x02:
        if pos + 1 >= end:
            return 0, -E_TRUNCATED
        ext = buf[pos + 1]
        if ext == 0x82:  # PSB
            if end < pos + PSB_SIZE:
                return 0, -E_TRUNCATED
            for i in range(2, PSB_SIZE, 2):
                if buf[pos + i] != 0x02 or buf[pos + i + 1] != 0x82:
                    return 0, -E_BAD_PACKET
            return PSB_SIZE, PSB
        if ext == 0x23:
            return 2, PSBEND
        if ext == 0xA3:  # TNT-64
            if end < pos + 8:
                return 0, -E_TRUNCATED
            payload = _read_le(buf, pos + 2, 6)
            if payload == 0:
                return 0, -E_BAD_PACKET
            nbits = 0
            p = payload >> np.uint64(1)
            while p != 0:
                nbits += 1
                p >>= np.uint64(1)
            out[0] = payload & ~(np.uint64(1) << np.uint64(nbits))
            out[1] = nbits
            return 8, TNT64
        if ext == 0x43:  # PIP
            if end < pos + 8:
                return 0, -E_TRUNCATED
            payload = _read_le(buf, pos + 2, 6)
            out[1] = payload & np.uint64(1)
            out[0] = (payload >> np.uint64(1)) << np.uint64(5)
            return 8, PIP
        if ext == 0xF3:
            return 2, OVF
        if ext == 0x03:  # CBR
            if end < pos + 4:
                return 0, -E_TRUNCATED
            out[0] = buf[pos + 2]
            return 4, CBR
        if ext == 0x73:  # TMA
            if end < pos + 7:
                return 0, -E_TRUNCATED
            ctc = np.uint64(buf[pos + 2]) | (np.uint64(buf[pos + 3]) << np.uint64(8))
            fc = np.uint64(buf[pos + 5]) | (np.uint64(buf[pos + 6]) << np.uint64(8))
            if (fc & ~np.uint64(0x1FF)) or buf[pos + 4] != 0:
                # SKZ84: TSC scaling/offsetting corrupts TMA; skip it as invalid.
                if errata & ERRATUM_SKZ84 and end >= pos + 8:
                    return 8, INVALID
                return 0, -E_BAD_PACKET
            out[0] = ctc
            out[1] = fc
            return 7, TMA
        if ext == 0x83:
            return 2, STOP
        if ext == 0xC8:  # VMCS
            if end < pos + 7:
                return 0, -E_TRUNCATED
            out[0] = _read_le(buf, pos + 2, 5) << np.uint64(12)
            return 7, VMCS
        if ext == 0xC3:  # ext2
            if pos + 2 >= end:
                return 0, -E_TRUNCATED
            if buf[pos + 2] != 0x88:
                return 0, -E_BAD_OPC
            if end < pos + 11:
                return 0, -E_TRUNCATED
            out[0] = _read_le(buf, pos + 3, 8)
            return 11, MNT
        if ext == 0x62 or ext == 0xE2:
            out[2] = 1 if ext == 0xE2 else 0
            return 2, EXSTOP
        if ext == 0xC2:  # MWAIT
            if end < pos + 10:
                return 0, -E_TRUNCATED
            out[0] = _read_le(buf, pos + 2, 4)
            out[1] = _read_le(buf, pos + 6, 4)
            return 10, MWAIT
        if ext == 0x22:  # PWRE
            if end < pos + 4:
                return 0, -E_TRUNCATED
            payload = _read_le(buf, pos + 2, 2)
            out[0] = (payload >> np.uint64(12)) & np.uint64(0xF)
            out[1] = (payload >> np.uint64(8)) & np.uint64(0xF)
            out[2] = 1 if payload & np.uint64(0x8) else 0
            return 4, PWRE
        if ext == 0xA2:  # PWRX
            if end < pos + 7:
                return 0, -E_TRUNCATED
            payload = _read_le(buf, pos + 2, 5)
            out[0] = (payload >> np.uint64(4)) & np.uint64(0xF)
            out[1] = payload & np.uint64(0xF)
            fl = 0
            if payload & np.uint64(0x100):
                fl |= 1
            if payload & np.uint64(0x400):
                fl |= 2
            if payload & np.uint64(0x800):
                fl |= 4
            out[2] = fl
            return 7, PWRX
        if ext == 0x13:  # CFE
            if end < pos + 4:
                return 0, -E_TRUNCATED
            out[0] = buf[pos + 2] & 0x1F
            out[1] = buf[pos + 3]
            out[2] = 1 if buf[pos + 2] & 0x80 else 0
            return 4, CFE
        if ext == 0x53:  # EVD
            if end < pos + 11:
                return 0, -E_TRUNCATED
            out[1] = buf[pos + 2] & 0x1F
            out[0] = _read_le(buf, pos + 3, 8)
            return 11, EVD
        if ext == 0x63:  # BBP
            if end < pos + 3:
                return 0, -E_TRUNCATED
            out[0] = buf[pos + 2] & 0x1F
            out[1] = 1 if buf[pos + 2] & 0x80 else 0
            return 3, BBP
        if ext == 0x33 or ext == 0xB3:  # BEP
            out[2] = 1 if ext == 0xB3 else 0
            return 2, BEP
        if (ext & 0x1F) == 0x12:  # PTW
            plc = (ext >> 5) & 0x3
            if plc == 0:
                n = 4
            elif plc == 1:
                n = 8
            else:
                return 0, -E_BAD_PACKET
            if end < pos + 2 + n:
                return 0, -E_TRUNCATED
            out[0] = _read_le(buf, pos + 2, n)
            out[1] = plc
            out[2] = 1 if ext & 0x80 else 0
            return 2 + n, PTW
        return 0, -E_BAD_OPC
    if in_block and (b0 & 0x07) == 0x04:  # BIP, only between BBP and BEP
        n = 4 if in_block == 2 else 8
        if end < pos + 1 + n:
            return 0, -E_TRUNCATED
        out[0] = _read_le(buf, pos + 1, n)
        out[1] = b0 >> 3
        out[2] = 1 if n == 4 else 0
        return 1 + n, BIP
    if (b0 & 0x01) == 0:  # TNT-8
        out[0] = TNT8_BITS[b0]
        out[1] = TNT8_NBITS[b0]
        return 1, TNT8
    if b0 == 0x99:  # MODE
        if end < pos + 2:
            return 0, -E_TRUNCATED
        m = buf[pos + 1]
        leaf = m & 0xE0
        if leaf == 0x00:
            out[0] = m & 0x1F
            return 2, MODE_EXEC
        if leaf == 0x20:
            out[0] = m & 0x1F
            return 2, MODE_TSX
        return 0, -E_BAD_PACKET
    if b0 == 0x19:  # TSC
        if end < pos + 8:
            return 0, -E_TRUNCATED
        out[0] = _read_le(buf, pos + 1, 7)
        return 8, TSC
    if b0 == 0x59:  # MTC
        if end < pos + 2:
            return 0, -E_TRUNCATED
        out[0] = buf[pos + 1]
        return 2, MTC
    if b0 == 0xD9:  # TRIG
        if end < pos + 3:
            return 0, -E_TRUNCATED
        f = buf[pos + 1]
        size = 3
        icnt = np.uint64(0)
        if f & 0x40:
            if end < pos + 5:
                return 0, -E_TRUNCATED
            icnt = _read_le(buf, pos + 3, 2)
            size = 5
        out[0] = buf[pos + 2]
        out[1] = icnt
        out[2] = ((f >> 7) & 1) | (((f >> 6) & 1) << 1) | (((f >> 5) & 1) << 2)
        return size, TRIG
    if (b0 & 0x03) == 0x03:  # CYC
        value = np.uint64(b0 >> 3)
        p = pos + 1
        ext = b0 & 0x04
        shl = 5
        while ext:
            if p >= end:
                return 0, -E_TRUNCATED
            x = buf[p]
            p += 1
            ext = x & 0x01
            bits = np.uint64(x >> 1)
            if shl < 64:
                value |= bits << np.uint64(shl)
            shl += 7
            if shl > 64:
                return 0, -E_BAD_PACKET
        # SKD007: an OVF may replace the rest of a multi-byte CYC.
        if (
            errata & ERRATUM_SKD007
            and p - pos == 2
            and (value & ~np.uint64(0x1F)) == np.uint64(0x20)
            and p < end
            and buf[p] == 0xF3
        ):
            return 3, OVF
        out[0] = value
        return p - pos, CYC
    low = b0 & 0x1F
    kind = 0
    if low == 0x0D:
        kind = TIP
    elif low == 0x1D:
        kind = FUP
    elif low == 0x11:
        kind = TIP_PGE
    elif low == 0x01:
        kind = TIP_PGD
    if kind != 0:
        ipc = b0 >> 5
        n = _ip_bytes(ipc)
        if n < 0:
            return 0, -E_BAD_PACKET
        if end < pos + 1 + n:
            return 0, -E_TRUNCATED
        out[0] = _read_le(buf, pos + 1, n)
        out[1] = ipc
        return 1 + n, kind
    return 0, -E_BAD_OPC


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def resync_point(buf, err_pos, sync_pos, begin, end):
    """Where decoding resumes after an error at ``err_pos`` (libipt's
    pt_pkt_sync_forward): start a PSB's length early so a PSB partly swallowed
    by a bogus preceding packet is still found."""
    pos = err_pos
    if pos == sync_pos:
        pos += PSB_SIZE
    space = pos - begin
    if space >= PSB_SIZE:
        space = PSB_SIZE - 1
    pos -= space
    if pos >= end:
        return -1
    return sync_forward(buf, pos, begin, end)


@njit(cache=True, nogil=True)
def decode_range(
    buf,
    pos,
    end,
    sync_pos,
    resync,
    in_block,
    errata,
    offsets,
    kinds,
    sizes,
    col_a,
    col_b,
    col_c,
    n,
    err_offsets,
    err_codes,
    err_index,
    nerr,
):
    """Decode packets from ``pos`` until ``end``, the output is full, or an
    error when ``resync`` is false.

    Appends rows at ``n`` and errors at ``nerr``.  Returns
    ``(pos, sync_pos, in_block, n, nerr, done)``; ``done`` is False only when
    the output arrays filled up and the caller must continue from ``pos``.
    """
    out = np.zeros(3, dtype=np.uint64)
    cap = offsets.shape[0]
    ecap = err_offsets.shape[0]
    begin = 0
    while pos < end:
        if n >= cap:
            return pos, sync_pos, in_block, n, nerr, False
        b0 = buf[pos]
        if (b0 & 0x01) == 0 and b0 > 0x02 and in_block == 0:
            # TNT-8, by far the most frequent packet: no call, no temporaries.
            offsets[n] = pos
            kinds[n] = TNT8
            sizes[n] = 1
            col_a[n] = TNT8_BITS[b0]
            col_b[n] = TNT8_NBITS[b0]
            col_c[n] = 0
            n += 1
            pos += 1
            continue
        out[0] = 0
        out[1] = 0
        out[2] = 0
        size, kind = decode_one(buf, pos, end, in_block, errata, out)
        if size > 0:
            offsets[n] = pos
            kinds[n] = kind
            sizes[n] = size
            col_a[n] = out[0]
            col_b[n] = np.uint32(out[1])
            col_c[n] = np.uint8(out[2])
            n += 1
            if kind == BBP:
                in_block = 2 if out[1] else 1
            elif kind == BEP or kind == PSB or kind == OVF:
                in_block = 0
            pos += size
            continue
        # An error: record it, then resynchronise at the next PSB.
        if nerr < ecap:
            err_offsets[nerr] = pos
            err_codes[nerr] = -kind
            err_index[nerr] = n
            nerr += 1
        if not resync or kind == -E_TRUNCATED:
            return end, sync_pos, in_block, n, nerr, True
        nxt = resync_point(buf, pos, sync_pos, begin, end)
        if nxt < 0:
            return end, sync_pos, in_block, n, nerr, True
        pos = nxt
        sync_pos = nxt
        in_block = 0
    return pos, sync_pos, in_block, n, nerr, True


@njit(cache=True, inline="always")
def _write_le(out, pos, v, n):
    for i in range(n):
        out[pos + i] = np.uint8((v >> np.uint64(8 * i)) & np.uint64(0xFF))
    return pos + n


@njit(cache=True)
def encoded_size(kind, a, b, c):
    """Size in bytes of one packet's encoding (-1 if the fields are invalid)."""
    if kind == PAD or kind == TNT8:
        return 1
    if kind == PSB:
        return PSB_SIZE
    if kind == PSBEND or kind == OVF or kind == STOP or kind == EXSTOP or kind == BEP:
        return 2
    if kind == TNT64 or kind == PIP or kind == TSC:
        return 8
    if kind == TIP or kind == TIP_PGE or kind == TIP_PGD or kind == FUP:
        n = _ip_bytes(b)
        return -1 if n < 0 else 1 + n
    if kind == MODE_EXEC or kind == MODE_TSX or kind == MTC:
        return 2
    if kind == CBR or kind == PWRE or kind == CFE:
        return 4
    if kind == TMA or kind == VMCS or kind == PWRX:
        return 7
    if kind == MNT or kind == EVD:
        return 11
    if kind == MWAIT:
        return 10
    if kind == PTW:
        if b == 0:
            return 6
        if b == 1:
            return 10
        return -1
    if kind == BBP:
        return 3
    if kind == BIP:
        return 5 if c else 9
    if kind == TRIG:
        return 5 if c & 2 else 3
    if kind == CYC:
        n = 1
        v = a >> np.uint64(5)
        while v != 0:
            n += 1
            v >>= np.uint64(7)
        return n
    return -1


@njit(cache=True)
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
        if kind == PAD:
            out[pos] = 0
            pos += 1
        elif kind == PSB:
            for j in range(0, PSB_SIZE, 2):
                out[pos + j] = 0x02
                out[pos + j + 1] = 0x82
            pos += PSB_SIZE
        elif kind == PSBEND:
            out[pos] = 0x02
            out[pos + 1] = 0x23
            pos += 2
        elif kind == TNT8:
            if b < 1 or b > 6 or (a >> np.uint64(b)) != 0:
                return -(i + 1)
            out[pos] = np.uint8(((a | (np.uint64(1) << np.uint64(b))) << np.uint64(1)) & 0xFF)
            pos += 1
        elif kind == TNT64:
            if b < 1 or b > 47 or (a >> np.uint64(b)) != 0:
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0xA3
            pos = _write_le(out, pos + 2, a | (np.uint64(1) << np.uint64(b)), 6)
        elif kind == TIP or kind == TIP_PGE or kind == TIP_PGD or kind == FUP:
            n = _ip_bytes(b)
            if n < 0:
                return -(i + 1)
            if kind == TIP:
                op = 0x0D
            elif kind == TIP_PGE:
                op = 0x11
            elif kind == TIP_PGD:
                op = 0x01
            else:
                op = 0x1D
            out[pos] = np.uint8(op | (b << 5))
            pos = _write_le(out, pos + 1, a, n)
        elif kind == MODE_EXEC or kind == MODE_TSX:
            out[pos] = 0x99
            leaf = 0x00 if kind == MODE_EXEC else 0x20
            out[pos + 1] = np.uint8(leaf | (a & np.uint64(0x1F)))
            pos += 2
        elif kind == PIP:
            if a & np.uint64(0x1F) or a >> np.uint64(52):
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0x43
            v = ((a >> np.uint64(5)) << np.uint64(1)) | (np.uint64(b) & np.uint64(1))
            pos = _write_le(out, pos + 2, v, 6)
        elif kind == VMCS:
            if a & np.uint64(0xFFF) or a >> np.uint64(52):
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0xC8
            pos = _write_le(out, pos + 2, a >> np.uint64(12), 5)
        elif kind == CBR:
            out[pos] = 0x02
            out[pos + 1] = 0x03
            out[pos + 2] = np.uint8(a & np.uint64(0xFF))
            out[pos + 3] = 0
            pos += 4
        elif kind == TSC:
            out[pos] = 0x19
            pos = _write_le(out, pos + 1, a, 7)
        elif kind == MTC:
            out[pos] = 0x59
            out[pos + 1] = np.uint8(a & np.uint64(0xFF))
            pos += 2
        elif kind == TMA:
            if b > 0x1FF:
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = 0x73
            pos = _write_le(out, pos + 2, a, 2)
            out[pos] = 0
            pos = _write_le(out, pos + 1, np.uint64(b), 2)
        elif kind == CYC:
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
        elif kind == OVF:
            out[pos] = 0x02
            out[pos + 1] = 0xF3
            pos += 2
        elif kind == STOP:
            out[pos] = 0x02
            out[pos + 1] = 0x83
            pos += 2
        elif kind == MNT:
            out[pos] = 0x02
            out[pos + 1] = 0xC3
            out[pos + 2] = 0x88
            pos = _write_le(out, pos + 3, a, 8)
        elif kind == PTW:
            if b > 1:
                return -(i + 1)
            out[pos] = 0x02
            out[pos + 1] = np.uint8(0x12 | (b << 5) | (0x80 if c else 0))
            pos = _write_le(out, pos + 2, a, 4 if b == 0 else 8)
        elif kind == EXSTOP:
            out[pos] = 0x02
            out[pos + 1] = 0xE2 if c else 0x62
            pos += 2
        elif kind == MWAIT:
            out[pos] = 0x02
            out[pos + 1] = 0xC2
            pos = _write_le(out, pos + 2, a, 4)
            pos = _write_le(out, pos, np.uint64(b), 4)
        elif kind == PWRE:
            out[pos] = 0x02
            out[pos + 1] = 0x22
            v = ((a & np.uint64(0xF)) << np.uint64(12)) | (
                (np.uint64(b) & np.uint64(0xF)) << np.uint64(8)
            )
            if c:
                v |= np.uint64(0x8)
            pos = _write_le(out, pos + 2, v, 2)
        elif kind == PWRX:
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
        elif kind == BBP:
            out[pos] = 0x02
            out[pos + 1] = 0x63
            out[pos + 2] = np.uint8((a & np.uint64(0x1F)) | (0x80 if b else 0))
            pos += 3
        elif kind == BIP:
            out[pos] = np.uint8(((b & 0x1F) << 3) | 0x04)
            pos = _write_le(out, pos + 1, a, 4 if c else 8)
        elif kind == BEP:
            out[pos] = 0x02
            out[pos + 1] = 0xB3 if c else 0x33
            pos += 2
        elif kind == CFE:
            out[pos] = 0x02
            out[pos + 1] = 0x13
            out[pos + 2] = np.uint8((a & np.uint64(0x1F)) | (0x80 if c else 0))
            out[pos + 3] = np.uint8(b & 0xFF)
            pos += 4
        elif kind == EVD:
            out[pos] = 0x02
            out[pos + 1] = 0x53
            out[pos + 2] = np.uint8(b & 0x1F)
            pos = _write_le(out, pos + 3, a, 8)
        elif kind == TRIG:
            out[pos] = 0xD9
            out[pos + 1] = np.uint8(((c & 1) << 7) | (((c >> 1) & 1) << 6) | (((c >> 2) & 1) << 5))
            out[pos + 2] = np.uint8(a & np.uint64(0xFF))
            pos += 3
            if c & 2:
                pos = _write_le(out, pos, np.uint64(b), 2)
        else:
            return -(i + 1)
    return pos
