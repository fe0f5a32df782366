"""The Intel PT time model: an estimated TSC for every packet.

TSC packets give the absolute time.  TMA aligns the crystal clock (CTC) and
the fast counter with the last TSC; MTC packets advance the CTC every
``2**mtc_freq`` crystal ticks (converted to TSC ticks with CPUID leaf 0x15);
CYC packets count core cycles, converted with the fast-counter:cycle ratio
(FCR).  The FCR comes from the nominal frequency and CBR, or is calibrated
from the cycles seen between MTCs (or between TSCs in PSB+).

This follows Intel's reference decoder (libipt's ``pt_time`` and
``pt_tcal``) operation for operation, so the times, and the diagnostics when
time cannot be estimated, are the ones its tools print.  The loop over
packets is compiled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import aot
from .config import PtConfig
from .errors import PtError
from .kinds import TNT8_AFTER_CYC, Kind
from .packets import ColumnBuffers, PacketTable

FCR_SHR = 8  # fixed-point shift of the FCR

E_INTERNAL = int(PtError.INTERNAL)
E_BAD_PACKET = int(PtError.BAD_PACKET)
E_BAD_CONTEXT = int(PtError.BAD_CONTEXT)
E_BAD_CONFIG = int(PtError.BAD_CONFIG)
E_NO_TIME = int(PtError.NO_TIME)

# Diagnostic kinds the model reports at a packet (with a PtError code).
DIAG_CALIBRATING = 1  # "error calibrating time"
DIAG_UPDATING = 2  # "error updating time"
DIAG_CALIBRATION = 3  # "calibration error"
DIAG_NO_CALIBRATION = 4  # "error updating time: no calibration"

DIAG_TEXT = {
    DIAG_CALIBRATING: "error calibrating time",
    DIAG_UPDATING: "error updating time",
    DIAG_CALIBRATION: "calibration error",
    DIAG_NO_CALIBRATION: "error updating time: no calibration",
}

OPT_NO_TCAL = 1
OPT_NO_CYC = 2
OPT_KEEP_TCAL_ON_OVF = 4
OPT_SKL168 = 8


@aot.njit(cache=True, _nrt=False)
def _ctc_delta(ctc, last_ctc, mtc_freq):
    """CTC distance, correcting one wrap-around.  (-1 if more.)"""
    if ctc < last_ctc:
        ctc += 1 << (mtc_freq + 8)
        if ctc < last_ctc:
            return -1
    return ctc - last_ctc


@aot.njit(cache=True, inline="always", _nrt=False)
def _tcal_init():
    """Fresh calibration state (pt_tcal_init): no FCR while min > max."""
    return 0, -1, 0, 0, 0, 0, 0, 0, False, False  # c_min -1: "UINT64_MAX", no FCR yet


@aot.njit(cache=True, inline="always", _nrt=False)
def _set_fcr(fcr, c_min, c_max):
    """A new fast-counter ratio and the range seen so far (pt_tcal_set_fcr)."""
    if c_min < 0 or fcr < c_min:
        c_min = fcr
    return fcr, c_min, max(c_max, fcr)


@aot.njit(cache=True, inline="always", _nrt=False)
def _diag(d_idx, d_kind, d_err, nd, i, kind, err):
    """Note diagnostic ``kind`` (error ``err``) at packet ``i``; returns the
    new count."""
    d_idx[nd] = i
    d_kind[nd] = kind
    d_err[nd] = err
    return nd + 1


# The model's state between calls (time_loop's ``state``/``saved``).
TIME_STATE_SIZE = 24
_TS_VALID = 23


def new_time_state() -> np.ndarray:
    """State for :func:`time_loop` before the first packet of a stream."""
    return np.zeros(TIME_STATE_SIZE, np.int64)


_NO_FCR = np.zeros(0, np.int64)
_NO_HAVE_FCR = np.zeros(0, np.bool_)


def uncalibrated_output(tsc: np.ndarray, have_tsc: np.ndarray, diagnostics: tuple) -> tuple:
    """:func:`time_loop`'s output with no calibration columns (the caller
    has no use for them): the times, whether each has one, and the
    diagnostics' columns."""
    return (tsc, have_tsc, _NO_FCR, _NO_HAVE_FCR, *diagnostics)


# The per-packet columns of time_loop's output, in order.
TIME_TYPES = (np.int64, np.bool_, np.int64, np.bool_)


def new_time_output(n: int, columns: tuple | None = None) -> tuple:
    """The arrays :func:`time_loop` fills for ``n`` packets: per packet
    ``(tsc, have_tsc, fcr, have_fcr)`` after it (``columns`` of
    :data:`TIME_TYPES` and at least ``n`` rows to use, else new ones), and
    room for the diagnostics ``(index, kind, error)``."""
    if columns is None:
        columns = tuple(np.zeros(n, t) for t in TIME_TYPES)
    return (
        *columns,
        np.empty(3 * n + 1, np.int64),
        np.empty(3 * n + 1, np.int8),
        np.empty(3 * n + 1, np.int8),
    )


# Packets the time model does not look at: their time is the last one's.
_TIMELESS = np.zeros(64, np.bool_)
for _k in (Kind.PAD, Kind.TNT8, Kind.TNT64, Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.FUP,
           Kind.MODE_EXEC, Kind.MODE_TSX, Kind.PIP, Kind.VMCS, Kind.PTW):  # fmt: skip
    _TIMELESS[_k] = True


@aot.njit(cache=True, inline="always", _nrt=False)
def _give_time(out, j, want_fcr, tsc, have_tsc, fcr, have_fcr):
    """Packet ``j``'s time (and calibration, when wanted) in ``out``."""
    out[0][j] = tsc
    out[1][j] = have_tsc
    if want_fcr:
        out[2][j] = fcr
        out[3][j] = have_fcr


# Eight packets' kinds (or segment starts) as one word, the first in the
# low byte (LLVM makes the eight loads one).
@aot.njit(cache=True, inline="always", _nrt=False)
def _word8(col, j):
    v = np.uint64(0)
    for q in range(8):
        v |= np.uint64(col[j + np.uint64(q)]) << np.uint64(8 * q)
    return v


# Eight kinds from TNT-8 to VMCS (4 to 13, all timeless): no byte below 4
# and none above 13 (bit tricks after Anderson's "Bit Twiddling Hacks":
# hasless and hasmore).
_SWAR_4, _SWAR_114, _SWAR_TOP = (
    np.uint64(0x0404040404040404), np.uint64(0x7272727272727272), np.uint64(0x8080808080808080)
)  # fmt: skip


@aot.njit(cache=True, _nrt=False)
def _timeless_run(kinds, seg_start, i, end, out, want_fcr, tsc, have_tsc, fcr, have_fcr):
    """Give the model's time to the packets from ``i`` (before ``end``)
    that leave the model as it is (``i`` one of them); returns where they
    end.  Most packets are such: the run's end is found eight packets at a
    time, then its columns filled (loops LLVM vectorises).
    (Unsigned indices: numba checks a signed one for a negative value, in
    the loop over most packets.)"""
    j, stop = np.uint64(i) + np.uint64(1), np.uint64(end)
    eight = np.uint64(8)
    while j + eight <= stop:
        k = _word8(kinds, j)
        if (
            _word8(seg_start, j) != 0
            or ((k - _SWAR_4) & ~k & _SWAR_TOP) != 0
            or (((k + _SWAR_114) | k) & _SWAR_TOP) != 0
        ):
            break
        j += eight
    while j < stop and not seg_start[j] and _TIMELESS[kinds[j]]:
        j += np.uint64(1)
    t_col, h_col = out[0], out[1]
    for q in range(np.uint64(i), j):
        t_col[q] = tsc
    for q in range(np.uint64(i), j):
        h_col[q] = have_tsc
    if want_fcr:
        f_col, hf_col = out[2], out[3]
        for q in range(np.uint64(i), j):
            f_col[q] = fcr
        for q in range(np.uint64(i), j):
            hf_col[q] = have_fcr
    return np.int64(j)


@aot.njit(cache=True, inline="always", _nrt=False)
def _cycles(k, col_a, col_b, j):
    """The cycle count of row ``j``: a CYC's, or that of the CYC a flow
    window folded into the TNT-8 after it (TNT8_AFTER_CYC)."""
    return np.int64(col_a[j]) if k == Kind.CYC else np.int64(col_b[j] >> np.uint32(8))


@aot.njit(cache=True, _nrt=False)
def _cyc_run(kinds, col_a, col_b, seg_start, i, end, out, want_fcr, tsc, have_tsc, fcr, base, fc,
             span, cyc_mtc, cyc_tsc):  # fmt: skip
    """Apply the CYCs from packet ``i`` (one) on that only add cycles
    (with calibration ``fcr``; none that spans MTCs, ``span``, before the
    fast counter has counted), giving the packets between them that
    leave the model as it is its time (as _timeless_run does): most
    packets of a trace with cycle-accurate timing (a flow window's CYC
    folded into the TNT-8 after it, TNT8_AFTER_CYC, is the CYC then the
    TNT).  Returns where they end, and the model's time, fast counter and
    cycle counts after them.  (A loop apart from _timeless_run's, which is
    the tighter without CYCs.)"""
    j, stop = np.uint64(i), np.uint64(end)
    while True:
        k = kinds[j]
        if k == Kind.CYC or k == TNT8_AFTER_CYC:
            if fc == 0 and span:
                break
            # pt_time_update_cyc, as time_loop's CYC does it.
            cyc = _cycles(k, col_a, col_b, j)
            cyc_mtc += cyc
            cyc_tsc += cyc
            fc += (cyc * fcr) >> FCR_SHR
            tsc = base + fc
        elif not _TIMELESS[k]:
            break
        _give_time(out, j, want_fcr, tsc, have_tsc, fcr, True)
        j += np.uint64(1)
        if j >= stop or seg_start[j]:
            break
    return np.int64(j), tsc, fc, cyc_mtc, cyc_tsc


@aot.njit(cache=True, nogil=True, _nrt=False)
def time_loop(
    kinds, col_a, col_b, n, seg_start, mtc_freq, nom_freq, eax, ebx, opts, state, save_at, saved,
    out,
):  # fmt: skip
    """Run the time model over the first ``n`` packets of a packet table's
    columns, into ``out`` (see :func:`new_time_output`); returns the number
    of diagnostics, in the order they arose.  The model starts from
    ``state`` (see :func:`new_time_state`) and leaves its state after the
    last packet there, so a stream can be timed table by table; ``saved``
    receives the state before packet ``save_at`` (-1: none), where a later
    table may start.  (The columns may be longer than ``n``: a decoder's
    buffers, passed whole, the same objects from window to window.)
    """
    out_fcr, d_idx, d_kind, d_err = out[2], out[4], out[5], out[6]
    want_fcr = out_fcr.shape[0] >= n  # (empty: the caller has no use for it)
    nd = 0

    no_tcal = (opts & OPT_NO_TCAL) != 0
    no_cyc = (opts & OPT_NO_CYC) != 0
    keep_ovf = (opts & OPT_KEEP_TCAL_ON_OVF) != 0
    skl168 = (opts & OPT_SKL168) != 0
    mtc_hi = mtc_freq + 8

    # pt_time
    t_tsc = t_base = t_fc = t_ctc = t_ctc_cyc = t_lost_mtc = t_lost_cyc = 0
    t_have_tsc = t_have_tma = t_have_mtc = False
    # pt_tcal
    (c_fcr, c_min, c_max, c_tsc, c_cyc_tsc, c_cyc_mtc, c_ctc, c_lost_mtc, c_have_mtc,
     c_check_skl168) = _tcal_init()  # fmt: skip
    in_header = False
    if state[_TS_VALID]:
        (
            t_tsc, t_base, t_fc, t_ctc, t_ctc_cyc, t_lost_mtc, t_lost_cyc, t_have_tsc,
            t_have_tma, t_have_mtc, c_fcr, c_min, c_max, c_tsc, c_cyc_tsc, c_cyc_mtc, c_ctc,
            c_lost_mtc, c_have_mtc, c_check_skl168, in_header,
        ) = (
            state[0], state[1], state[2], state[3], state[4], state[5], state[6],
            state[7] != 0, state[8] != 0, state[9] != 0, state[10], state[11], state[12],
            state[13], state[14], state[15], state[16], state[17], state[18] != 0,
            state[19] != 0, state[20] != 0,
        )  # fmt: skip

    i = 0
    while i <= n:
        # Most packets (branches, addresses, modes) leave the model as it
        # is: their time is the last one's; most CYCs only add cycles.
        if i < n and i != save_at and not seg_start[np.uint64(i)]:
            k = kinds[np.uint64(i)]
            run_end = n if save_at < i else min(n, save_at)
            if _TIMELESS[k]:
                i = _timeless_run(
                    kinds, seg_start, i, run_end, out, want_fcr, t_tsc, t_have_tsc, c_fcr,
                    c_min >= 0 and c_min <= c_max,
                )  # fmt: skip
                continue
            if (
                (k == Kind.CYC or k == TNT8_AFTER_CYC) and not no_cyc and not no_tcal
                and c_fcr != 0 and c_min >= 0 and c_min <= c_max
                and (t_fc != 0 or t_ctc == t_ctc_cyc)
            ):  # fmt: skip
                i, t_tsc, t_fc, c_cyc_mtc, c_cyc_tsc = _cyc_run(
                    kinds, col_a, col_b, seg_start, i, run_end, out, want_fcr, t_tsc, t_have_tsc, c_fcr,
                    t_base, t_fc, t_ctc != t_ctc_cyc, c_cyc_mtc, c_cyc_tsc,
                )  # fmt: skip
                continue
        if i == save_at or i == n:
            for w in range(2):
                if (w == 0 and i != save_at) or (w == 1 and i != n):
                    continue
                dst = saved if w == 0 else state
                dst[0] = t_tsc
                dst[1] = t_base
                dst[2] = t_fc
                dst[3] = t_ctc
                dst[4] = t_ctc_cyc
                dst[5] = t_lost_mtc
                dst[6] = t_lost_cyc
                dst[7] = t_have_tsc
                dst[8] = t_have_tma
                dst[9] = t_have_mtc
                dst[10] = c_fcr
                dst[11] = c_min
                dst[12] = c_max
                dst[13] = c_tsc
                dst[14] = c_cyc_tsc
                dst[15] = c_cyc_mtc
                dst[16] = c_ctc
                dst[17] = c_lost_mtc
                dst[18] = c_have_mtc
                dst[19] = c_check_skl168
                dst[20] = in_header
                dst[_TS_VALID] = 1
            if i == n:
                break
        u = np.uint64(i)  # (unsigned: numba checks a signed index for a negative value)
        if seg_start[u]:
            t_tsc = t_base = t_fc = t_ctc = t_ctc_cyc = t_lost_mtc = t_lost_cyc = 0
            t_have_tsc = t_have_tma = t_have_mtc = False
            in_header = False
        kind = kinds[u]
        # pt_tcal_init: calibration starts again where a segment starts, at an
        # overflow (unless kept) and at a CBR outside PSB+ (a new frequency).
        if (
            seg_start[u]
            or (kind == Kind.OVF and not keep_ovf)
            or (kind == Kind.CBR and not no_tcal and not in_header)
        ):
            (c_fcr, c_min, c_max, c_tsc, c_cyc_tsc, c_cyc_mtc, c_ctc, c_lost_mtc, c_have_mtc,
             c_check_skl168) = _tcal_init()  # fmt: skip
        if kind == Kind.PSB:
            if skl168:
                c_check_skl168 = True
            in_header = True
        elif kind == Kind.PSBEND:
            in_header = False
        elif kind == Kind.OVF:
            if keep_ovf:
                c_tsc = 0
                c_cyc_tsc = 0
                c_cyc_mtc = 0
                c_ctc = 0
                c_have_mtc = False
        elif kind == Kind.TSC:
            tsc = np.int64(col_a[u])
            if not no_tcal:
                if in_header:
                    last_tsc = c_tsc
                    cyc = c_cyc_tsc
                    c_tsc = tsc
                    c_cyc_tsc = 0
                    if last_tsc != 0 and cyc != 0 and not c_have_mtc:
                        t2 = tsc
                        err = 0
                        if t2 < last_tsc:
                            t2 += 1 << 56
                            if t2 < last_tsc:
                                err = E_BAD_PACKET
                        if err == 0:
                            delta = t2 - last_tsc
                            if delta >> (64 - FCR_SHR):
                                err = E_INTERNAL
                            else:
                                fcr = (delta << FCR_SHR) // cyc
                                c_fcr, c_min, c_max = _set_fcr(fcr, c_min, c_max)
                        if err:
                            nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_CALIBRATING, err)
                else:
                    c_tsc = tsc
                    c_cyc_tsc = 0
            t_have_tsc = True
            t_have_tma = False
            t_have_mtc = False
            t_tsc = tsc
            t_base = tsc
            t_ctc = 0
            t_fc = 0
            t_lost_mtc = 0
            t_lost_cyc = 0
        elif kind == Kind.CBR:
            cbr = np.int64(col_a[u])
            if not no_tcal:
                if nom_freq != 0:
                    if cbr == 0:
                        nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_CALIBRATING, E_BAD_PACKET)
                    else:
                        fcr = (np.int64(nom_freq) << FCR_SHR) // cbr
                        c_fcr, c_min, c_max = _set_fcr(fcr, c_min, c_max)
            if cbr == 0:
                nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_UPDATING, E_BAD_PACKET)
        elif kind == Kind.TMA:
            ctc = np.int64(col_a[u])
            fc = np.int64(col_b[u])
            err = 0
            if not t_have_tsc:
                err = E_BAD_CONTEXT
            elif t_have_tma:
                err = E_BAD_CONTEXT
            elif t_have_mtc:
                err = E_INTERNAL
            if err:
                nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_UPDATING, err)
            else:
                ctc_mask = (1 << mtc_hi) - 1
                t_have_tma = True
                t_base -= fc
                t_fc += fc
                if mtc_hi <= 16:
                    t_have_mtc = True
                t_ctc = ctc & ctc_mask
                t_ctc_cyc = t_ctc
        elif kind == Kind.MTC:
            payload = np.int64(col_a[u])
            # Calibration first (pt_tcal_update_mtc).
            if not no_tcal:
                last_ctc = c_ctc
                have_mtc = c_have_mtc
                cyc = c_cyc_mtc
                check = c_check_skl168
                c_check_skl168 = False
                ctc = payload << mtc_freq
                if not have_mtc:
                    c_cyc_mtc = 0
                    c_ctc = ctc
                    c_have_mtc = True
                elif cyc != 0:
                    c_have_mtc = True
                    c_cyc_mtc = 0
                    c_ctc = ctc
                    c_lost_mtc += 1
                    err = 0
                    delta = _ctc_delta(ctc, last_ctc, mtc_freq)
                    if delta < 0:
                        err = E_BAD_PACKET
                    elif eax == 0 or ebx == 0:
                        err = E_BAD_CONFIG
                    if err:
                        nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_CALIBRATING, err)
                    else:
                        fc = (delta * ebx) // eax
                        if fc >> (64 - FCR_SHR):
                            nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_CALIBRATING, E_INTERNAL)
                        else:
                            fcr = (fc << FCR_SHR) // cyc
                            skip = False
                            if check:
                                if (1 << mtc_freq) < delta:
                                    skip = True
                                elif mtc_freq < 10 and c_min >= 0 and c_min <= c_max:
                                    dfc = (c_fcr * (cyc + 0xF00)) >> FCR_SHR
                                    if dfc < fc:
                                        skip = True
                            if not skip:
                                c_fcr, c_min, c_max = _set_fcr(fcr, c_min, c_max)
                                c_lost_mtc = 0
            # Then time (pt_time_update_mtc).
            if not (t_have_tsc and not t_have_tma):
                have_tma = t_have_tma
                have_mtc = t_have_mtc
                base = t_base
                last_ctc = t_ctc
                ctc = payload << mtc_freq
                if t_fc != 0 or t_lost_cyc != 0 or not have_mtc:
                    t_ctc_cyc = ctc
                t_have_mtc = True
                t_fc = 0
                t_ctc = ctc
                t_lost_cyc = 0
                proceed = True
                if not have_mtc:
                    if not have_tma:
                        proceed = False
                    elif last_ctc & ~0xFFFF:
                        nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_UPDATING, E_INTERNAL)
                        proceed = False
                    else:
                        ctc_lo = ctc & 0xFFFF
                        ctc_hi = ctc & ~0xFFFF
                        if ctc_lo < last_ctc:
                            ctc_hi -= 1 << 16
                            ctc_hi &= 0xFF << mtc_freq
                        last_ctc |= ctc_hi
                if proceed:
                    delta = _ctc_delta(ctc, last_ctc, mtc_freq)
                    if delta < 0:
                        t_lost_mtc += 1
                        nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_UPDATING, E_BAD_PACKET)
                    elif eax == 0 or ebx == 0:
                        nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_UPDATING, E_BAD_CONFIG)
                    else:
                        base += (delta * ebx) // eax
                        t_tsc = base
                        t_base = base
        elif (kind == Kind.CYC or kind == TNT8_AFTER_CYC) and not no_cyc:
            cyc = _cycles(kind, col_a, col_b, u)
            fcr = 0
            if not no_tcal:
                if c_min >= 0 and c_min <= c_max:
                    fcr = c_fcr
                else:
                    nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_CALIBRATION, E_NO_TIME)
                c_cyc_mtc += cyc
                c_cyc_tsc += cyc
            if fcr == 0:
                t_lost_cyc += 1
                nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_NO_CALIBRATION, 0)
            else:
                fc = t_fc
                err = 0
                if fc == 0 and t_ctc != t_ctc_cyc:
                    # A CYC spanning MTCs: drop the share of earlier periods.
                    delta = _ctc_delta(t_ctc, t_ctc_cyc, mtc_freq)
                    if delta < 0:
                        err = E_BAD_PACKET
                    elif eax == 0 or ebx == 0:
                        err = E_BAD_CONFIG
                    else:
                        old_fc = (delta * ebx) // eax
                        old_cyc = (old_fc << FCR_SHR) // fcr
                        if cyc < old_cyc:
                            cyc = old_cyc
                        cyc -= old_cyc
                if err:
                    nd = _diag(d_idx, d_kind, d_err, nd, i, DIAG_UPDATING, err)
                else:
                    fc += (cyc * fcr) >> FCR_SHR
                    t_fc = fc
                    t_tsc = t_base + fc
        _give_time(out, u, want_fcr, t_tsc, t_have_tsc, c_fcr, c_min >= 0 and c_min <= c_max)
        i += 1
    return nd


@dataclass
class TimeColumns:
    """Per-packet time after each packet (TSC units) and the diagnostics."""

    tsc: np.ndarray  # uint64 estimated TSC
    have_tsc: np.ndarray  # bool: a TSC has been seen (wall-clock time)
    fcr: np.ndarray  # int64 fast-counter:cycle ratio, fixed point (FCR_SHR)
    have_fcr: np.ndarray  # bool
    diag_index: np.ndarray
    diag_kind: np.ndarray
    diag_error: np.ndarray


def segment_starts(table: PacketTable, out: np.ndarray | None = None) -> np.ndarray:
    """True at the first packet after each resynchronisation, where a
    decoder starts again with no state (into the first rows of ``out``, if
    given, which is returned whole)."""
    n = len(table)
    if out is None:
        starts = np.zeros(n, np.bool_)
    else:
        starts = out
        starts[:n] = False
    idx = table.err_index[table.err_index < n]
    starts[idx] = True
    return starts


class TimeBuffers(ColumnBuffers):
    """The time model's columns (:data:`TIME_TYPES`) with the segment
    starts and diagnostics columns :func:`estimate_time` also needs, kept
    from one call to the next (see :class:`~hwtrace.pt.packets.PacketBuffers`:
    the loop is handed the very arrays of its last call)."""

    def __init__(self) -> None:
        super().__init__(TIME_TYPES)
        self._starts = np.zeros(0, np.bool_)
        self._diag: tuple[np.ndarray, ...] = ()

    def starts(self, n: int) -> np.ndarray:
        """A segment-starts column of at least ``n`` rows."""
        if self._starts.shape[0] < n:
            self._starts = np.zeros(max(n, self._starts.shape[0] * 3 // 2), np.bool_)
        return self._starts

    def diagnostics(self, n: int) -> tuple[np.ndarray, ...]:
        """Room for the diagnostics of ``n`` packets (see
        :func:`new_time_output`)."""
        if not self._diag or self._diag[0].shape[0] < 3 * n + 1:
            cap = max(3 * n + 1, self._diag[0].shape[0] * 3 // 2 if self._diag else 0)
            self._diag = (np.empty(cap, np.int64), np.empty(cap, np.int8), np.empty(cap, np.int8))
        return self._diag


def time_options(
    config: PtConfig, *, calibrate: bool = True, use_cyc: bool = True,
    keep_tcal_on_ovf: bool = False,
) -> int:  # fmt: skip
    """The OPT_* bits :func:`time_loop` takes for these settings."""
    opts = 0
    if not calibrate:
        opts |= OPT_NO_TCAL
    if not use_cyc:
        opts |= OPT_NO_CYC
    if keep_tcal_on_ovf:
        opts |= OPT_KEEP_TCAL_ON_OVF
    if "skl168" in config.errata:
        opts |= OPT_SKL168
    return opts


def estimate_time(
    table: PacketTable,
    config: PtConfig | None = None,
    *,
    calibrate: bool = True,
    use_cyc: bool = True,
    keep_tcal_on_ovf: bool = False,
    state: np.ndarray | None = None,
    save_at: int = -1,
    saved: np.ndarray | None = None,
    buffers: ColumnBuffers | None = None,
    fcr: bool = True,
    columns: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
) -> TimeColumns:
    """Estimate the TSC at every packet of ``table``: from the start of a
    stream, or, given the ``state`` an earlier table left (updated in place),
    from where it ended.  ``saved`` receives the state before packet
    ``save_at``.  With ``buffers`` (of :data:`TIME_TYPES`) the columns are
    views of them, valid until their next use (:class:`TimeBuffers` also
    keep the model's other columns).  Without ``fcr`` the calibration
    columns are left empty.  ``columns``: the kind, ``a`` and ``b`` columns
    whose first rows ``table``'s are (a decoder's buffers, whole)."""
    config = config or PtConfig()
    opts = time_options(config, calibrate=calibrate, use_cyc=use_cyc,
                        keep_tcal_on_ovf=keep_tcal_on_ovf)  # fmt: skip
    n = len(table)
    kept = buffers if isinstance(buffers, TimeBuffers) else None
    if kept is not None:
        out = (*buffers.take(n), *kept.diagnostics(n))
        starts = segment_starts(table, kept.starts(n))
    else:
        out = new_time_output(n, None if buffers is None else buffers.take(n))
        starts = segment_starts(table)
    if not fcr:
        out = uncalibrated_output(out[0], out[1], out[4:])
    kinds, a, b = columns if columns is not None else (table.kind, table.a, table.b)
    nd = time_loop(
        kinds,
        a,
        b,
        n,
        starts,
        int(config.mtc_freq),
        int(config.nom_freq),
        int(config.cpuid_0x15_eax),
        int(config.cpuid_0x15_ebx),
        opts,
        state if state is not None else new_time_state(),
        save_at,
        saved if saved is not None else new_time_state(),
        out,
    )
    tsc, have_tsc, fcr, have_fcr, di, dk, de = out
    return TimeColumns(tsc[:n].view(np.uint64), have_tsc[:n], fcr[:n], have_fcr[:n], di[:nd],
                       dk[:nd], de[:nd])  # fmt: skip


def tsc_to_ns(tsc: np.ndarray, time_shift: int, time_mult: int, time_zero: int) -> np.ndarray:
    """Convert TSC values to perf clock nanoseconds (perf's TSC conversion)."""
    t = np.asarray(tsc, dtype=np.uint64)
    quot = t >> np.uint64(time_shift)
    rem = t & np.uint64((1 << time_shift) - 1)
    with np.errstate(over="ignore"):  # u64 arithmetic wraps, as perf's does
        return (
            np.uint64(time_zero % (1 << 64))
            + quot * np.uint64(time_mult)
            + ((rem * np.uint64(time_mult)) >> np.uint64(time_shift))
        )


@aot.njit(cache=True, nogil=True, _nrt=False)
def tsc_ns(t, shift, mult, zero):
    """One TSC value as perf time, as perf's ``tsc_to_perf_time`` (u64
    arithmetic that wraps; ``zero`` already taken modulo 2**64)."""
    u = np.uint64(t)
    s = np.uint64(shift)
    m = np.uint64(mult)
    low = (np.uint64(1) << s) - np.uint64(1) if shift < 64 else ~np.uint64(0)
    return np.int64(np.uint64(zero) + (u >> s) * m + (((u & low) * m) >> s))


@aot.njit(cache=True, nogil=True, _nrt=False)
def _stamps_to_ns(tsc, shift, mult, zero, out):
    for i in range(tsc.shape[0]):
        t = tsc[i]
        out[i] = -1 if t == 0 else tsc_ns(t, shift, mult, zero)


def stamps_to_ns(
    tsc: np.ndarray, time_shift: int, time_mult: int, time_zero: int, out: np.ndarray | None = None
) -> np.ndarray:
    """:func:`tsc_to_ns` of decoder time stamps as int64, -1 where a stamp
    is 0 (no time known), in one compiled pass (into ``out`` if given)."""
    t = np.ascontiguousarray(tsc, dtype=np.uint64)
    if out is None:
        out = np.empty(t.shape[0], np.int64)
    _stamps_to_ns(t, np.uint64(time_shift), np.uint64(time_mult),
                  np.uint64(time_zero % (1 << 64)), out)  # fmt: skip
    return out


@aot.njit(cache=True, nogil=True, _nrt=False)
def _durations(ns, stops, values, out):
    n = ns.shape[0]
    for i in range(n - 1):
        d = ns[i + 1] - ns[i]
        out[i] = d if d > 0 and ns[i] >= 0 else 0
    if n:
        out[n - 1] = 0
    for j in range(stops.shape[0]):
        i = stops[j]
        v = values[j]
        out[i] = v if v > 0 and ns[i] >= 0 else 0


def durations(ns: np.ndarray, stops: np.ndarray, values: np.ndarray) -> np.ndarray:
    """How long each of the blocks at times ``ns`` ran (int64; -1: no
    time): until the next block, or ``values[j]`` for block ``stops[j]``
    (tracing stopped after it), 0 where that is not positive or the block
    has no time.  One compiled pass."""
    t = np.ascontiguousarray(ns, dtype=np.int64)
    out = np.empty(t.shape[0], np.int64)
    _durations(t, np.ascontiguousarray(stops, dtype=np.int64),
               np.ascontiguousarray(values, dtype=np.int64), out)  # fmt: skip
    return out
