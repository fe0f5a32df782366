"""The compiled writer of Intel's ptdump text (numba, nopython).

:func:`format_loop` writes the lines of many packets per call into a byte
buffer: what Intel's ptdump (libipt's ``tools/ptdump``) prints for each
packet, its ``--lastip``, ``--exec-mode``, ``--time`` and ``--tcal``
tracking, the time model's diagnostics and the decode errors, in stream
order.  :mod:`hwtrace.pt.ptdump` drives it, through the native library
of :mod:`hwtrace.aot` or numba.
"""

from __future__ import annotations

import numpy as np

from ..aot import njit
from ..textout import pad_to, put_dec, put_hex, put_row, put_text, string_table
from . import _loops as K
from ._state import (
    F_DELTA,
    F_EXEC,
    F_LASTIP,
    F_NO_CYC,
    F_NO_PAD,
    F_NO_TIMING,
    F_NO_WALL,
    F_OFFSET,
    F_QUIET,
    F_RAW,
    F_TCAL,
    F_TIME,
    F_TRACK,
    LINE_MAX,
)
from .errors import PtError, errstr
from .kinds import (
    CFE_DECIMAL_VECTOR,
    CFE_HEX_VECTOR,
    CFE_TYPE_NAMES,
    EVD_TYPE_NAMES,
    KIND_NAMES,
    DecodeError,
    Kind,
)
from .timing import DIAG_TEXT

# Names, as string tables (textout.string_table), frozen into the loop.
_KIND_TAB, _KIND_LEN = string_table(KIND_NAMES, 64)
_CFE_TAB, _CFE_LEN = string_table({**{i: "unknown" for i in range(32)}, **CFE_TYPE_NAMES}, 32)
_EVD_TAB, _EVD_LEN = string_table({**{i: "unknown" for i in range(32)}, **EVD_TYPE_NAMES}, 32)
_ERR_TAB, _ERR_LEN = string_table({int(e): errstr(e) for e in PtError}, 32)
_DIAG_TAB, _DIAG_LEN = string_table(DIAG_TEXT, 8)

# A decode error as the libipt error ptdump prints for it; 0: not printed
# (Intel's ptdump ends silently at a truncated packet).
_DECODE_ERROR = np.zeros(8, np.int64)
_DECODE_ERROR[int(DecodeError.BAD_OPCODE)] = int(PtError.BAD_OPC)
_DECODE_ERROR[int(DecodeError.BAD_PACKET)] = int(PtError.BAD_PACKET)

# How ptdump prints a CFE's vector, by CFE type.
_VECTOR_NONE, _VECTOR_DEC, _VECTOR_HEX = 0, 1, 2
_CFE_VECTOR = np.zeros(32, np.int64)
for _t in CFE_DECIMAL_VECTOR:
    _CFE_VECTOR[_t] = _VECTOR_DEC
for _t in CFE_HEX_VECTOR:
    _CFE_VECTOR[_t] = _VECTOR_HEX

_E_NOIP = int(PtError.NOIP)
_E_NO_TIME = int(PtError.NO_TIME)
_SPACE = ord(" ")
_ZERO = ord("0")
_TAKEN = np.uint64(ord("!"))
_NOT_TAKEN = np.uint64(ord("."))
_NEWLINE = ord("\n")

# IP compression (kinds.IPC) and the mask of the last IP it replaces.
_IPC_SUPPRESSED, _IPC_16, _IPC_32, _IPC_SEXT_48, _IPC_48 = 0, 1, 2, 3, 4
_SIGN_48 = np.uint64(1 << 47)
_HIGH_16 = np.uint64(0xFFFF000000000000)

# Column widths of Intel's ptdump.
_W_RAW, _W_KIND, _W_PAYLOAD = 33, 10, 25


# What the tracking columns after the payload show (--lastip, --exec-mode,
# --time, --tcal, and the CR3, VMCS, CFE and EVD types ptdump always shows).
T_NONE, T_IP, T_EM, T_CR3, T_VMCS, T_CFE, T_EVD, T_FCR, T_TSC = range(9)
# How a tracked value shows.
V_VALUE, V_PLUS, V_MINUS, V_UNAVAILABLE, V_SUPPRESSED = range(5)

# Kind names padded to the name column (written as one block).
_NAME_TAB = np.full((64, 16), _SPACE, np.uint8)
_NAME_TAB[:, : _KIND_TAB.shape[1]] = np.where(_KIND_TAB == 0, _SPACE, _KIND_TAB)


@njit(cache=True, _nrt=False)
def _fixed3(out, p, v, sign):
    """Print v/256 with three decimals, rounding ties to even like printf."""
    neg = v < 0
    if neg:
        v = -v
    num = v * 1000
    q = num // 256
    r = num - q * 256
    if 2 * r > 256 or (2 * r == 256 and (q & 1)):
        q += 1
    if neg:
        p = put_text(out, p, "-")
    elif sign:
        p = put_text(out, p, "+")
    p = put_dec(out, p, q // 1000)
    p = put_text(out, p, ".")
    frac = q % 1000
    out[p] = _ZERO + frac // 100
    out[p + 1] = _ZERO + (frac // 10) % 10
    out[p + 2] = _ZERO + frac % 10
    return p + 3


@njit(cache=True, _nrt=False)
def _diag(out, p, offset, what, err):
    """``[offset: what: libipt error]``: ``what`` a time-model diagnostic
    (a row of its string table), or one of ptdump's own (_DIAG_*)."""
    p = put_text(out, p, "[")
    p = put_hex(out, p, offset, 0)
    p = put_text(out, p, ": ")
    if what == _DIAG_DECODE:
        p = put_text(out, p, "error decoding packet")
    elif what == _DIAG_LASTIP:
        p = put_text(out, p, "error tracking last-ip")
    elif what == _DIAG_TIME:
        p = put_text(out, p, "error printing time")
    else:
        p = put_row(out, p, _DIAG_TAB, _DIAG_LEN, what)
    if err != 0:
        p = put_text(out, p, ": ")
        p = put_row(out, p, _ERR_TAB, _ERR_LEN, err)
    return put_text(out, p, "]\n")


# ptdump's own diagnostics (the time model's are 1 and up).
_DIAG_DECODE, _DIAG_LASTIP, _DIAG_TIME = -1, -2, -3


@njit(cache=True, inline="always", _nrt=False)
def _ip_payload(out, p, a, ipc):
    """The IP as ptdump shows it: ``ipc: ????????????xxxx`` (the bytes the
    packet does not carry as ``?``)."""
    p = put_hex(out, p, ipc, 0)
    p = put_text(out, p, ": ")
    if ipc == _IPC_16:
        p = put_text(out, p, "????????????")
        return put_hex(out, p, a, 4)
    if ipc == _IPC_32:
        p = put_text(out, p, "????????")
        return put_hex(out, p, a, 8)
    if ipc == _IPC_SUPPRESSED:
        return put_text(out, p, "????????????????")
    if ipc == _IPC_48:
        p = put_text(out, p, "????")
        return put_hex(out, p, a, 12)
    if ipc == _IPC_SEXT_48 and a & _SIGN_48:
        return put_hex(out, p, a | _HIGH_16, 16)
    return put_hex(out, p, a, 16)


@njit(cache=True, _nrt=False)
def _update_last_ip(last, a, ipc):
    """libipt's pt_last_ip_update_ip: the last IP after an IP packet."""
    if ipc == _IPC_16:
        m = np.uint64(0xFFFF)
    elif ipc == _IPC_32:
        m = np.uint64(0xFFFFFFFF)
    elif ipc == _IPC_48:
        m = np.uint64(0xFFFFFFFFFFFF)
    else:
        m = np.uint64(0xFFFFFFFFFFFFFFFF)
    v = a
    if ipc == _IPC_SEXT_48 and v & _SIGN_48:
        v |= _HIGH_16
    return np.int64((np.uint64(last) & ~m) | (v & m))


@njit(cache=True, inline="always", _nrt=False)
def _comma(out, p, start):
    """``", "`` between the names of a list begun at ``start``."""
    if p > start:
        p = put_text(out, p, ", ")
    return p


@njit(cache=True, inline="always", _nrt=False)
def _payload(out, p, kind, a, b, c):
    """The packet's payload as ptdump prints it (nothing for most packets
    without one)."""
    if kind == Kind.TNT8 or kind == Kind.TNT64:
        # '!' taken, '.' not taken, the oldest first.
        for j in range(b):
            taken = (a >> np.uint64(b - 1 - j)) & np.uint64(1)
            out[p + j] = _NOT_TAKEN - (_NOT_TAKEN - _TAKEN) * taken
        return p + b
    if kind == Kind.TIP or kind == Kind.TIP_PGE or kind == Kind.TIP_PGD or kind == Kind.FUP:
        return _ip_payload(out, p, a, b)
    if kind == Kind.CYC or kind == Kind.MTC or kind == Kind.TSC or kind == Kind.CBR:
        return put_hex(out, p, a, 0)
    if kind == Kind.MODE_EXEC:
        start = p
        if a & np.uint64(K.MODE_CSD):
            p = put_text(out, p, "cs.d")
        if a & np.uint64(K.MODE_CSL):
            p = put_text(out, _comma(out, p, start), "cs.l")
        if a & np.uint64(K.MODE_IF):
            p = put_text(out, _comma(out, p, start), "if")
        return p
    if kind == Kind.TMA:
        p = put_hex(out, p, a, 0)
        p = put_text(out, p, ", ")
        return put_hex(out, p, b, 0)
    if kind == Kind.MODE_TSX:
        start = p
        if a & np.uint64(K.TSX_INTX):
            p = put_text(out, p, "intx")
        if a & np.uint64(K.TSX_ABRT):
            p = put_text(out, _comma(out, p, start), "abrt")
        return p
    if kind == Kind.PIP:
        p = put_hex(out, p, a, 0)
        if b == K.PIP_NR:
            p = put_text(out, p, ", nr")
        return p
    if kind == Kind.VMCS or kind == Kind.MNT or kind == Kind.BIP:
        return put_hex(out, p, a, 0)
    if kind == Kind.EXSTOP or kind == Kind.BEP:
        if c & K.FLAG_IP:
            p = put_text(out, p, "ip")
        return p
    if kind == Kind.MWAIT:
        p = put_hex(out, p, a, 8)
        p = put_text(out, p, ", ")
        return put_hex(out, p, b, 8)
    if kind == Kind.PWRE:
        p = put_text(out, p, "c")
        p = put_dec(out, p, K.c_state(a))
        p = put_text(out, p, ".")
        p = put_dec(out, p, K.c_state(b))
        if c & K.PWRE_HW:
            p = put_text(out, p, ", hw")
        return p
    if kind == Kind.PWRX:
        if c == K.PWRX_INT:
            p = put_text(out, p, "int")
        elif c == K.PWRX_ST:
            p = put_text(out, p, " st")
        elif c == K.PWRX_HW:
            p = put_text(out, p, " hw")
        else:
            p = put_text(out, p, "bad")
        p = put_text(out, p, ": c")
        p = put_dec(out, p, K.c_state(a))
        p = put_text(out, p, ", c")
        return put_dec(out, p, K.c_state(b))
    if kind == Kind.PTW:
        p = put_hex(out, p, b, 0)
        p = put_text(out, p, ": ")
        p = put_hex(out, p, a, 0)
        if c & K.FLAG_IP:
            p = put_text(out, p, ", ip")
        return p
    if kind == Kind.CFE:
        t = np.int64(a)
        p = put_dec(out, p, t)
        if _CFE_VECTOR[t] == _VECTOR_DEC:
            p = put_text(out, p, ": ")
            p = put_dec(out, p, b)
        elif _CFE_VECTOR[t] == _VECTOR_HEX:
            p = put_text(out, p, ": ")
            p = put_hex(out, p, b, 0)
        if c & K.FLAG_IP:
            p = put_text(out, p, ", ip")
        return p
    if kind == Kind.EVD:
        p = put_dec(out, p, b)
        p = put_text(out, p, ": ")
        return put_hex(out, p, a, 0)
    if kind == Kind.TRIG:
        p = put_hex(out, p, a, 2)
        if c & K.TRIG_IP:
            p = put_text(out, p, ", ip")
        if c & K.TRIG_MULT:
            p = put_text(out, p, ", mult")
        if c & K.TRIG_ICNT:
            p = put_text(out, p, ", icnt: ")
            p = put_dec(out, p, b)
        return p
    if kind == Kind.BBP:
        p = put_hex(out, p, a, 0)
        if b == K.BBP_SZ4:
            p = put_text(out, p, ", sz4")
        return p
    return p


@njit(cache=True, _nrt=False)
def _tracking(out, p, track, shown, value):
    """The tracking columns' name and value."""
    if track == T_IP:
        p = put_text(out, p, "ip   ")
    elif track == T_EM:
        p = put_text(out, p, "em   ")
        if value == _EM_64:
            return put_text(out, p, "64-bit")
        if value == _EM_32:
            return put_text(out, p, "32-bit")
        if value == _EM_16:
            return put_text(out, p, "16-bit")
        return put_text(out, p, "unknown")
    elif track == T_CR3:
        p = put_text(out, p, "cr3  ")
    elif track == T_VMCS:
        p = put_text(out, p, "vmcs ")
    elif track == T_CFE:
        p = put_text(out, p, "type ")
        return put_row(out, p, _CFE_TAB, _CFE_LEN, value)
    elif track == T_EVD:
        p = put_text(out, p, "type ")
        return put_row(out, p, _EVD_TAB, _EVD_LEN, value)
    elif track == T_FCR:
        p = put_text(out, p, "fcr  ")
        if shown == V_UNAVAILABLE:
            return put_text(out, p, "<unavailable>")
        return _fixed3(out, p, value, shown == V_PLUS)
    else:
        p = put_text(out, p, "tsc  ")
    if shown == V_UNAVAILABLE:
        return put_text(out, p, "<unavailable>")
    if shown == V_SUPPRESSED:
        return put_text(out, p, "<suppressed>")
    if shown == V_PLUS:
        p = put_text(out, p, "+")
        return put_hex(out, p, value, 0)
    if shown == V_MINUS:
        p = put_text(out, p, "-")
        return put_hex(out, p, value, 0)
    return put_hex(out, p, value, 16)


_EM_16, _EM_32, _EM_64, _EM_UNKNOWN = 0, 1, 2, 3


@njit(cache=True, nogil=True, _nrt=False)
def format_loop(rows, errs, times, raw, st, out):
    """Write ptdump's lines for packet rows ``st.next`` to ``st.stop`` into
    ``out``, each after the decode errors met before it.

    ``rows`` are the packet columns (offset, kind, size, a, b, c) and
    ``errs`` the decode errors (row index, offset, DecodeError); a packet
    after an error starts afresh (no last IP, no previous time).  ``times``
    (tsc, have_tsc, fcr, have_fcr, and the time model's diagnostics: row,
    kind, error) is read with ``--time``/``--tcal`` only.  ``raw`` holds
    the stream's bytes from offset ``st.base`` (for ``--raw``).  ``st`` (a
    record array of :data:`hwtrace.pt._state.FORMAT_FIELDS`) carries the options
    and the tracking from call to call.  The loop stops early when less
    than :data:`LINE_MAX` bytes of ``out`` are left, and returns how many
    bytes it wrote.
    """
    offsets, kinds, sizes, col_a, col_b, col_c = rows
    err_at, err_off, err_code = errs
    tsc, have_tsc, fcr, have_fcr, diag_at, diag_kind, diag_err = times
    s = st[0]
    flags = s.flags
    show_offset = (flags & F_OFFSET) != 0
    show_raw = (flags & F_RAW) != 0
    lastip = (flags & F_LASTIP) != 0
    exec_mode = (flags & F_EXEC) != 0
    show_time = (flags & F_TIME) != 0
    show_tcal = (flags & F_TCAL) != 0
    delta = (flags & F_DELTA) != 0
    quiet = (flags & F_QUIET) != 0
    no_pad = (flags & F_NO_PAD) != 0
    no_timing = (flags & F_NO_TIMING) != 0
    no_cyc = (flags & F_NO_CYC) != 0
    no_wall = (flags & F_NO_WALL) != 0
    # Intel's ptdump tracks time (and prints the time model's diagnostics)
    # with --time, --tcal, and whenever sideband is loaded.
    track_time = show_time or show_tcal or (flags & F_TRACK) != 0
    mark = s.mark
    base = s.base
    last_ip = s.last_ip
    have_ip = s.have_ip != 0
    ip_suppressed = s.ip_suppressed != 0
    last_tsc = s.last_tsc
    last_fcr = s.last_fcr
    e = s.error
    d = s.diag
    i = s.next
    stop = s.stop
    last = s.last != 0
    ne = err_at.shape[0]
    nd = diag_at.shape[0]
    limit = out.shape[0] - LINE_MAX
    p = 0
    while True:
        # The errors before packet i (or, at the end of the stream, the rest).
        while e < ne and ((err_at[e] == i and i < stop) or (i >= stop and last)):
            if p > limit:
                break
            code = _DECODE_ERROR[err_code[e]]
            if code != 0:
                p = _diag(out, p, err_off[e], _DIAG_DECODE, code)
            if err_at[e] == i:
                # libipt starts afresh after a resynchronisation.
                last_ip = 0
                have_ip = False
                ip_suppressed = False
                last_tsc = 0
                last_fcr = 0
            e += 1
        if i >= stop or p > limit:
            break
        off = offsets[i]
        kind = kinds[i]
        a = col_a[i]
        b = col_b[i]
        c = col_c[i]
        at = i
        i += 1

        # What ptdump tracks, and its diagnostics (printed before the line).
        track = T_NONE
        shown = V_VALUE
        value = np.int64(0)
        skip = False
        if kind == Kind.TNT8 or kind == Kind.TNT64 or kind == Kind.TRIG:
            pass
        elif kind == Kind.TIP or kind == Kind.TIP_PGE or kind == Kind.TIP_PGD or kind == Kind.FUP:
            if lastip:
                track = T_IP
                if b == _IPC_SUPPRESSED:
                    ip_suppressed = True
                else:
                    last_ip = _update_last_ip(last_ip, a, b)
                    have_ip = True
                    ip_suppressed = False
                value = last_ip
                if not have_ip:
                    shown = V_UNAVAILABLE
                    p = _diag(out, p, off, _DIAG_LASTIP, _E_NOIP)
                elif ip_suppressed:
                    shown = V_SUPPRESSED
        elif (
            kind == Kind.CYC
            or kind == Kind.MTC
            or kind == Kind.TSC
            or kind == Kind.CBR
            or kind == Kind.TMA
        ):
            is_cyc = kind == Kind.CYC
            skip = no_timing or (is_cyc and no_cyc)
            if track_time and not (is_cyc and no_cyc):
                while d < nd and diag_at[d] == at:
                    p = _diag(out, p, off, diag_kind[d], diag_err[d])
                    d += 1
                if show_tcal and not (is_cyc or kind == Kind.TMA):
                    track = T_FCR
                    if not have_fcr[at]:
                        shown = V_UNAVAILABLE
                        p = _diag(out, p, off, _DIAG_TIME, _E_NO_TIME)
                    elif delta:
                        value = fcr[at] - last_fcr
                        shown = V_PLUS
                        last_fcr = fcr[at]
                    else:
                        value = fcr[at]
                if show_time and kind != Kind.CBR:
                    track = T_TSC
                    shown = V_VALUE
                    if have_tsc[at] or no_wall:
                        t = tsc[at]
                        if delta:
                            if np.uint64(last_tsc) <= np.uint64(t):
                                shown = V_PLUS
                                value = np.int64(np.uint64(t) - np.uint64(last_tsc))
                            else:
                                shown = V_MINUS
                                value = np.int64(np.uint64(last_tsc) - np.uint64(t))
                            last_tsc = t
                        else:
                            value = t
                    else:
                        shown = V_UNAVAILABLE
                        p = _diag(out, p, off, _DIAG_TIME, _E_NO_TIME)
        elif kind == Kind.PAD:
            skip = no_pad
        elif kind == Kind.MODE_EXEC:
            if exec_mode:
                track = T_EM
                csl = (a & np.uint64(K.MODE_CSL)) != 0
                csd = (a & np.uint64(K.MODE_CSD)) != 0
                if csl:
                    value = _EM_UNKNOWN if csd else _EM_64
                else:
                    value = _EM_32 if csd else _EM_16
        elif kind == Kind.PIP:
            track = T_CR3
            value = np.int64(a)
        elif kind == Kind.VMCS:
            track = T_VMCS
            value = np.int64(a)
        elif kind == Kind.CFE:
            track = T_CFE
            value = np.int64(a)
        elif kind == Kind.EVD:
            track = T_EVD
            value = np.int64(b)
        if at == mark:
            s.split = p
        if skip or quiet:
            continue

        # The line: offset, raw bytes, name, payload, tracking.
        start = p
        if show_offset:
            p = put_hex(out, p, off, 16)
            p = put_text(out, p, " ")
            if show_raw:
                p = put_text(out, p, " ")
        if show_raw:
            rs = p
            for j in range(sizes[at]):
                p = put_hex(out, p, raw[off - base + j], 2)
            p = pad_to(out, p, rs, _W_RAW)
        if show_offset or show_raw:
            p = put_text(out, p, " ")
        name = p
        for j in range(_W_KIND):
            out[p + j] = _NAME_TAB[kind, j]
        p += _W_KIND
        p = put_text(out, p, " ")
        ps = p
        p = _payload(out, p, kind, a, b, c)
        if p == ps:
            # No payload: the name is not padded.
            ps = name + _KIND_LEN[kind] + 1
            out[ps - 1] = _SPACE
            p = ps
        if track != T_NONE:
            p = pad_to(out, p, ps, _W_PAYLOAD)
            p = put_text(out, p, " ")
            p = _tracking(out, p, track, shown, value)
        # drop the blanks the padding may have left at the end
        while p > start and out[p - 1] == _SPACE:
            p -= 1
        out[p] = _NEWLINE
        p += 1
    s.last_ip = last_ip
    s.have_ip = have_ip
    s.ip_suppressed = ip_suppressed
    s.last_tsc = last_tsc
    s.last_fcr = last_fcr
    s.error = e
    s.diag = d
    s.next = i
    s.written = p
    return p
