"""Packet dumps: Intel's ``ptdump`` text format, a human format and JSON lines.

The ptdump format is produced by a compiled kernel that writes the text of
many packets at once into a byte buffer, so dumping a large trace costs no
Python work per packet.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..textout import pad_to, put_dec, put_hex, put_row, put_text, string_table
from . import _kernels as K
from .config import PtConfig
from .errors import errstr
from .kinds import (
    CFE_DECIMAL_VECTOR,
    CFE_HEX_VECTOR,
    CFE_TYPE_NAMES,
    EVD_TYPE_NAMES,
    KIND_NAMES,
    DecodeError,
)
from .packets import PacketTable
from .timing import DIAG_TEXT, TimeColumns, estimate_time, segment_starts


@dataclass
class DumpOptions:
    """ptdump's options (same names, same defaults)."""

    show_offset: bool = True
    raw: bool = False
    lastip: bool = False
    exec_mode: bool = False
    time: bool = False
    tcal: bool = False
    time_delta: bool = False
    quiet: bool = False
    no_pad: bool = False
    no_timing: bool = False
    no_cyc: bool = False
    no_tcal: bool = False
    no_wall_clock: bool = False
    keep_tcal_on_ovf: bool = False

    @property
    def track_time(self) -> bool:
        return self.time or self.tcal

    def estimate_time(self, table: PacketTable, config: PtConfig | None) -> TimeColumns:
        """The time model as these options ask for it."""
        return estimate_time(
            table,
            config,
            calibrate=not self.no_tcal,
            use_cyc=not self.no_cyc,
            keep_tcal_on_ovf=self.keep_tcal_on_ovf,
        )

    def flags(self) -> int:
        bits = [
            self.show_offset,
            self.raw,
            self.lastip,
            self.exec_mode,
            self.time,
            self.tcal,
            self.time_delta,
            self.quiet,
            self.no_pad,
            self.no_timing,
            self.no_cyc,
            self.no_wall_clock,
        ]
        return sum(1 << i for i, on in enumerate(bits) if on)


F_OFFSET, F_RAW, F_LASTIP, F_EXEC, F_TIME, F_TCAL, F_DELTA, F_QUIET = (1 << i for i in range(8))
F_NO_PAD, F_NO_TIMING, F_NO_CYC, F_NO_WALL = (1 << i for i in range(8, 12))


_KIND_TAB, _KIND_LEN = string_table(KIND_NAMES, 64)
_CFE_TAB, _CFE_LEN = string_table({**{i: "unknown" for i in range(32)}, **CFE_TYPE_NAMES}, 32)
_EVD_TAB, _EVD_LEN = string_table({**{i: "unknown" for i in range(32)}, **EVD_TYPE_NAMES}, 32)
_ERR_TAB, _ERR_LEN = string_table({i: errstr(i) for i in range(28)}, 32)
_DIAG_TAB, _DIAG_LEN = string_table(DIAG_TEXT, 8)
_DEC_ERR = np.zeros(8, np.int64)  # decode error -> libipt error code
_DEC_ERR[int(DecodeError.BAD_OPCODE)] = 4
_DEC_ERR[int(DecodeError.BAD_PACKET)] = 5
_CFE_VEC = np.zeros(32, np.int64)  # 1: decimal vector, 2: hex vector
for _t in CFE_DECIMAL_VECTOR:
    _CFE_VEC[_t] = 1
for _t in CFE_HEX_VECTOR:
    _CFE_VEC[_t] = 2


@njit(cache=True)
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
        out[p] = 45
        p += 1
    elif sign:
        out[p] = 43
        p += 1
    p = put_dec(out, p, q // 1000)
    out[p] = 46
    p += 1
    frac = q % 1000
    out[p] = 48 + frac // 100
    out[p + 1] = 48 + (frac // 10) % 10
    out[p + 2] = 48 + frac % 10
    return p + 3


@njit(cache=True)
def _diag_head(out, p, offset):
    out[p] = 91  # [
    p = put_hex(out, p + 1, offset, 0)
    return put_text(out, p, ": ")


@njit(cache=True)
def _diag_err(out, p, err, err_tab, err_len):
    if err != 0:
        p = put_text(out, p, ": ")
        p = put_row(out, p, err_tab, err_len, err)
    return put_text(out, p, "]\n")


@njit(cache=True)
def _decode_error(out, p, offset, err, err_tab, err_len):
    p = _diag_head(out, p, offset)
    p = put_text(out, p, "error decoding packet")
    return _diag_err(out, p, err, err_tab, err_len)


@njit(cache=True)
def format_kernel(
    buf,
    offsets,
    kinds,
    sizes,
    col_a,
    col_b,
    col_c,
    lo,
    hi,
    seg_start,
    err_at,
    err_off,
    err_code,
    last,
    tsc,
    have_tsc,
    fcr,
    have_fcr,
    diag_idx,
    diag_kind,
    diag_err,
    d_lo,
    flags,
    state,
    tabs,
    out,
):
    """Write ptdump lines for packets ``lo..hi`` into ``out``.

    ``err_at``/``err_code`` are decode errors by packet index (printed before
    that packet); ``state`` carries last-IP and time-delta state between calls.
    Returns ``(bytes written, next diagnostic index)``.
    """
    (
        kind_tab,
        kind_len,
        cfe_tab,
        cfe_len,
        evd_tab,
        evd_len,
        err_tab,
        err_len,
        dg_tab,
        dg_len,
        cfe_vec,
        dec_err,
    ) = tabs
    show_off = (flags & 1) != 0
    raw = (flags & 2) != 0
    lastip = (flags & 4) != 0
    exec_mode = (flags & 8) != 0
    show_time = (flags & 16) != 0
    show_tcal = (flags & 32) != 0
    delta = (flags & 64) != 0
    quiet = (flags & 128) != 0
    no_pad = (flags & 256) != 0
    no_timing = (flags & 512) != 0
    no_cyc = (flags & 1024) != 0
    no_wall = (flags & 2048) != 0
    track = show_time or show_tcal

    pl = np.zeros(80, np.uint8)
    tid = np.zeros(8, np.uint8)
    tp = np.zeros(32, np.uint8)
    p = 0
    d = d_lo
    e = 0
    ne = err_at.shape[0]
    while e < ne and err_at[e] < lo:
        e += 1

    for i in range(lo, hi):
        while e < ne and err_at[e] == i:
            p = _decode_error(out, p, err_off[e], dec_err[err_code[e]], err_tab, err_len)
            e += 1
        if seg_start[i]:
            state[0] = 0
            state[1] = 0
            state[2] = 0
            state[3] = 0
            state[4] = 0
        off = offsets[i]
        kind = kinds[i]
        a = col_a[i]
        b = col_b[i]
        c = col_c[i]
        npl = 0
        ntid = 0
        ntp = 0
        skip = False
        skip_time = False
        skip_tcal = False
        timing = False
        ext = False
        if kind == K.PAD:
            skip = no_pad
        elif kind == K.TNT8 or kind == K.TNT64:
            ext = True
            for j in range(b):
                pl[npl] = 33 if (a >> np.uint64(b - 1 - j)) & np.uint64(1) else 46
                npl += 1
        elif kind == K.TIP or kind == K.TIP_PGE or kind == K.TIP_PGD or kind == K.FUP:
            npl = put_hex(pl, npl, b, 0)
            npl = put_text(pl, npl, ": ")
            if b == 0:
                npl = put_text(pl, npl, "????????????????")
            elif b == 1:
                npl = put_text(pl, npl, "????????????")
                npl = put_hex(pl, npl, a, 4)
            elif b == 2:
                npl = put_text(pl, npl, "????????")
                npl = put_hex(pl, npl, a, 8)
            elif b == 4:
                npl = put_text(pl, npl, "????")
                npl = put_hex(pl, npl, a, 12)
            elif b == 3:
                v = a
                if v & np.uint64(1 << 47):
                    v |= np.uint64(0xFFFF000000000000)
                npl = put_hex(pl, npl, v, 16)
            else:
                npl = put_hex(pl, npl, a, 16)
            if lastip:
                ntid = put_text(tid, 0, "ip")
                if b == 0:
                    state[2] = 1
                else:
                    if b == 1:
                        m = np.uint64(0xFFFF)
                    elif b == 2:
                        m = np.uint64(0xFFFFFFFF)
                    elif b == 4:
                        m = np.uint64(0xFFFFFFFFFFFF)
                    else:
                        m = np.uint64(0xFFFFFFFFFFFFFFFF)
                    v = a
                    if b == 3 and v & np.uint64(1 << 47):
                        v |= np.uint64(0xFFFF000000000000)
                    state[0] = np.int64((np.uint64(state[0]) & ~m) | (v & m))
                    state[1] = 1
                    state[2] = 0
                if state[1] == 0:
                    ntp = put_text(tp, 0, "<unavailable>")
                    p = _diag_head(out, p, off)
                    p = put_text(out, p, "error tracking last-ip")
                    p = _diag_err(out, p, 11, err_tab, err_len)
                elif state[2] != 0:
                    ntp = put_text(tp, 0, "<suppressed>")
                else:
                    ntp = put_hex(tp, 0, state[0], 16)
        elif kind == K.MODE_EXEC:
            csl = (a & np.uint64(1)) != 0
            csd = (a & np.uint64(2)) != 0
            iflag = (a & np.uint64(4)) != 0
            if csd:
                npl = put_text(pl, npl, "cs.d")
            if csd and csl:
                npl = put_text(pl, npl, ", ")
            if csl:
                npl = put_text(pl, npl, "cs.l")
            if iflag and (csd or csl):
                npl = put_text(pl, npl, ", ")
            if iflag:
                npl = put_text(pl, npl, "if")
            if exec_mode:
                ntid = put_text(tid, 0, "em")
                if csl:
                    ntp = put_text(tp, 0, "unknown") if csd else put_text(tp, 0, "64-bit")
                else:
                    ntp = put_text(tp, 0, "32-bit") if csd else put_text(tp, 0, "16-bit")
        elif kind == K.MODE_TSX:
            intx = (a & np.uint64(1)) != 0
            abrt = (a & np.uint64(2)) != 0
            if intx:
                npl = put_text(pl, npl, "intx")
            if intx and abrt:
                npl = put_text(pl, npl, ", ")
            if abrt:
                npl = put_text(pl, npl, "abrt")
        elif kind == K.PIP:
            npl = put_hex(pl, npl, a, 0)
            if b:
                npl = put_text(pl, npl, ", nr")
            ntid = put_text(tid, 0, "cr3")
            ntp = put_hex(tp, 0, a, 16)
        elif kind == K.VMCS:
            npl = put_hex(pl, npl, a, 0)
            ntid = put_text(tid, 0, "vmcs")
            ntp = put_hex(tp, 0, a, 16)
        elif kind == K.TSC or kind == K.CBR or kind == K.MTC or kind == K.CYC:
            npl = put_hex(pl, npl, a, 0)
            timing = True
            skip = no_timing or (kind == K.CYC and no_cyc)
            skip_time = kind == K.CBR
            skip_tcal = kind == K.CYC
            if kind == K.CYC and no_cyc:
                timing = False
        elif kind == K.TMA:
            npl = put_hex(pl, npl, a, 0)
            npl = put_text(pl, npl, ", ")
            npl = put_hex(pl, npl, b, 0)
            timing = True
            skip = no_timing
            skip_tcal = True
        elif kind == K.MNT or kind == K.BIP:
            npl = put_hex(pl, npl, a, 0)
        elif kind == K.EXSTOP or kind == K.BEP:
            if c:
                npl = put_text(pl, npl, "ip")
        elif kind == K.MWAIT:
            npl = put_hex(pl, npl, a, 8)
            npl = put_text(pl, npl, ", ")
            npl = put_hex(pl, npl, b, 8)
        elif kind == K.PWRE:
            npl = put_text(pl, npl, "c")
            npl = put_dec(pl, npl, (a + np.uint64(1)) & np.uint64(0xF))
            npl = put_text(pl, npl, ".")
            npl = put_dec(pl, npl, (b + 1) & 0xF)
            if c:
                npl = put_text(pl, npl, ", hw")
        elif kind == K.PWRX:
            if c == 1:
                npl = put_text(pl, npl, "int")
            elif c == 2:
                npl = put_text(pl, npl, " st")
            elif c == 4:
                npl = put_text(pl, npl, " hw")
            else:
                npl = put_text(pl, npl, "bad")
            npl = put_text(pl, npl, ": c")
            npl = put_dec(pl, npl, (a + np.uint64(1)) & np.uint64(0xF))
            npl = put_text(pl, npl, ", c")
            npl = put_dec(pl, npl, (b + 1) & 0xF)
        elif kind == K.PTW:
            npl = put_hex(pl, npl, b, 0)
            npl = put_text(pl, npl, ": ")
            npl = put_hex(pl, npl, a, 0)
            if c:
                npl = put_text(pl, npl, ", ip")
        elif kind == K.CFE:
            t = np.int64(a)
            npl = put_dec(pl, npl, t)
            if cfe_vec[t] == 1:
                npl = put_text(pl, npl, ": ")
                npl = put_dec(pl, npl, b)
            elif cfe_vec[t] == 2:
                npl = put_text(pl, npl, ": ")
                npl = put_hex(pl, npl, b, 0)
            if c:
                npl = put_text(pl, npl, ", ip")
            ntid = put_text(tid, 0, "type")
            ntp = put_row(tp, 0, cfe_tab, cfe_len, t)
        elif kind == K.EVD:
            npl = put_dec(pl, npl, b)
            npl = put_text(pl, npl, ": ")
            npl = put_hex(pl, npl, a, 0)
            ntid = put_text(tid, 0, "type")
            ntp = put_row(tp, 0, evd_tab, evd_len, b)
        elif kind == K.TRIG:
            ext = True
            npl = put_hex(pl, npl, a, 2)
            if c & 1:
                npl = put_text(pl, npl, ", ip")
            if c & 4:
                npl = put_text(pl, npl, ", mult")
            if c & 2:
                npl = put_text(pl, npl, ", icnt: ")
                npl = put_dec(pl, npl, b)
        elif kind == K.BBP:
            npl = put_hex(pl, npl, a, 0)
            if b:
                npl = put_text(pl, npl, ", sz4")

        if timing and track:
            while d < diag_idx.shape[0] and diag_idx[d] == i:
                p = _diag_head(out, p, off)
                p = put_row(out, p, dg_tab, dg_len, diag_kind[d])
                p = _diag_err(out, p, diag_err[d], err_tab, err_len)
                d += 1
            if show_tcal and not skip_tcal:
                ntid = put_text(tid, 0, "fcr")
                if have_fcr[i]:
                    if delta:
                        ntp = _fixed3(tp, 0, fcr[i] - state[4], True)
                        state[4] = fcr[i]
                    else:
                        ntp = _fixed3(tp, 0, fcr[i], False)
                else:
                    ntp = put_text(tp, 0, "<unavailable>")
                    p = _diag_head(out, p, off)
                    p = put_text(out, p, "error printing time")
                    p = _diag_err(out, p, 15, err_tab, err_len)
            if show_time and not skip_time:
                ntid = put_text(tid, 0, "tsc")
                if have_tsc[i] or no_wall:
                    t = tsc[i]
                    if delta:
                        old = state[3]
                        if np.uint64(old) <= np.uint64(t):
                            ntp = put_text(tp, 0, "+")
                            ntp = put_hex(tp, ntp, np.uint64(t) - np.uint64(old), 0)
                        else:
                            ntp = put_text(tp, 0, "-")
                            ntp = put_hex(tp, ntp, np.uint64(old) - np.uint64(t), 0)
                        state[3] = t
                    else:
                        ntp = put_hex(tp, 0, t, 16)
                else:
                    ntp = put_text(tp, 0, "<unavailable>")
                    p = _diag_head(out, p, off)
                    p = put_text(out, p, "error printing time")
                    p = _diag_err(out, p, 15, err_tab, err_len)

        if skip or quiet:
            continue
        start = p
        sep = False
        if show_off:
            p = put_hex(out, p, off, 16)
            p = pad_to(out, p, start, 17)
            sep = True
        if raw:
            if sep:
                out[p] = 32
                p += 1
            rs = p
            for j in range(sizes[i]):
                p = put_hex(out, p, buf[off + j], 2)
            p = pad_to(out, p, rs, 33)
            sep = True
        if sep:
            out[p] = 32
            p += 1
        os_ = p
        p = put_row(out, p, kind_tab, kind_len, kind)
        if npl > 0:
            p = pad_to(out, p, os_, 10)
        if ext:
            out[p] = 32
            p += 1
            for j in range(npl):
                out[p] = pl[j]
                p += 1
        elif ntid > 0:
            out[p] = 32
            p += 1
            ps = p
            for j in range(npl):
                out[p] = pl[j]
                p += 1
            p = pad_to(out, p, ps, 25)
            out[p] = 32
            p += 1
            ps = p
            for j in range(ntid):
                out[p] = tid[j]
                p += 1
            p = pad_to(out, p, ps, 5)
            for j in range(ntp):
                out[p] = tp[j]
                p += 1
        elif npl > 0:
            out[p] = 32
            p += 1
            for j in range(npl):
                out[p] = pl[j]
                p += 1
        # drop trailing blanks the padding may have left
        while p > start and out[p - 1] == 32:
            p -= 1
        out[p] = 10
        p += 1
    if last:
        while e < ne:
            p = _decode_error(out, p, err_off[e], dec_err[err_code[e]], err_tab, err_len)
            e += 1
    return p, d


_TABS = (
    _KIND_TAB,
    _KIND_LEN,
    _CFE_TAB,
    _CFE_LEN,
    _EVD_TAB,
    _EVD_LEN,
    _ERR_TAB,
    _ERR_LEN,
    _DIAG_TAB,
    _DIAG_LEN,
    _CFE_VEC,
    _DEC_ERR,
)

# Packets formatted per kernel call: bounds the output buffer.
_BATCH = 1 << 16
_LINE_MAX = 512


def ptdump_lines(
    table: PacketTable,
    buf: np.ndarray,
    options: DumpOptions,
    config: PtConfig | None = None,
    times: TimeColumns | None = None,
    inserts: dict[int, bytes] | None = None,
) -> Iterator[bytes]:
    """Yield Intel ptdump text for ``table`` in blocks of bytes.

    ``buf`` is the stream the table was decoded from (for ``--raw``).
    Truncated-packet errors are not printed: Intel's ptdump ends silently
    there; callers report them separately.  ``inserts`` maps packet indices
    to text printed just before that packet's line (sideband records).
    """
    n = len(table)
    if options.track_time and times is None:
        times = options.estimate_time(table, config)
    if times is None:
        z64 = np.zeros(n, np.int64)
        zb = np.zeros(n, np.bool_)
        e64 = np.zeros(0, np.int64)
        e8 = np.zeros(0, np.int8)
        tsc, have_tsc, fcr, have_fcr, di, dk, de = z64, zb, z64, zb, e64, e8, e8
    else:
        tsc = times.tsc.view(np.int64)
        have_tsc, fcr, have_fcr = times.have_tsc, times.fcr, times.have_fcr
        di, dk, de = times.diag_index, times.diag_kind, times.diag_error
    keep = table.err_code != int(DecodeError.TRUNCATED)
    err_at = np.ascontiguousarray(table.err_index[keep])
    err_off = np.ascontiguousarray(table.err_offset[keep])
    err_code = np.ascontiguousarray(table.err_code[keep].astype(np.int64))
    seg = segment_starts(table)
    flags = options.flags()
    state = np.zeros(8, np.int64)
    d = 0
    lo = 0
    cuts = sorted(inserts) if inserts else []
    c = 0
    while True:
        hi = min(n, lo + _BATCH)
        while c < len(cuts) and cuts[c] <= lo:
            if cuts[c] == lo:
                yield inserts[lo]
            c += 1
        if c < len(cuts):
            hi = min(hi, cuts[c])
        count = hi - lo
        out = np.empty(_LINE_MAX * (count + 4) + 96 * len(err_at), np.uint8)
        size, d = format_kernel(
            buf, table.offset, table.kind, table.size, table.a, table.b, table.c,
            lo, hi, seg, err_at, err_off, err_code, hi == n,
            tsc, have_tsc, fcr, have_fcr, di, dk, de, d,
            flags, state, _TABS, out,
        )  # fmt: skip
        yield out[:size].tobytes()
        if hi >= n:
            break
        lo = hi
