"""STM (MIPI STPv2) packets listed as OpenCSD's ``trc_pkt_lister`` lists
them, written by one compiled loop into a byte buffer.

The lines are :func:`hwtrace.hwevents.stp.stp_dump_lines`'s; a damaged
packet's line (rare: one per damage) is made in Python and put before the
packet it came before by the same merge that joins several sources'
listings (:func:`hwtrace.textout.reorder_lines`).
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ..textout import (
    lines_in_chunks,
    put_dec,
    put_hex,
    put_row,
    put_text,
    put_updated_bits,
    put_upper_hex,
    reorder_lines,
    string_table,
)
from .stp import _DATA_BITS, StpKind

AOT_ENTRIES = ("_format_lines",)

_ASYNC, _VERSION, _FREQ = int(StpKind.ASYNC), int(StpKind.VERSION), int(StpKind.FREQ)
_NULL = int(StpKind.NULL)
_TRIG, _GERR, _MERR, _M8 = int(StpKind.TRIG), int(StpKind.GERR), int(StpKind.MERR), int(StpKind.M8)
_C8, _C16, _FLAG = int(StpKind.C8), int(StpKind.C16), int(StpKind.FLAG)
# Per kind: the data bits (0: not a data packet); whether the name takes
# the marker and timestamp suffixes.
_BITS = np.zeros(16, np.int64)
_SUFFIXED = np.zeros(16, np.bool_)
for _k, _n in _DATA_BITS.items():
    _BITS[int(_k)] = _n
    _SUFFIXED[int(_k)] = True
_SUFFIXED[_FLAG] = _SUFFIXED[_TRIG] = True
_LINE_MAX = 256


@aot.njit(cache=True, _nrt=False)
def _format_lines(
    offset, kind, marker, has_ts, value, master, channel, ts, ts_bits, names, name_lens, bits,
    suffixed, head, head_len, lo, hi, out, cap, starts,
):  # fmt: skip
    """The ETMv4 listing's loop (:mod:`hwtrace.hwevents.etm4text`) for
    STM packets: lines from ``lo`` until ``cap`` bytes."""
    p = 0
    i = lo
    while i < hi and p < cap:
        starts[i - lo] = p
        k = np.int64(kind[i])
        m = marker[i]
        t = has_ts[i]
        v = value[i]
        p = put_text(out, p, "Idx:")
        p = put_dec(out, p, offset[i])
        p = put_row(out, p, head, head_len, 0)
        p = put_row(out, p, names, name_lens, k)
        if suffixed[k]:
            if m:
                p = put_text(out, p, "M")
            if t:
                p = put_text(out, p, "TS")
        p = put_text(out, p, ":")
        n = bits[k]
        if n:
            p = put_dec(out, p, n)
            p = put_text(out, p, " bit data")
        elif k == _ASYNC:
            p = put_text(out, p, "Alignment synchronisation packet")
        elif k == _VERSION:
            p = put_text(out, p, "Version packet; Ver=")
            p = put_dec(out, p, v)
        elif k == _FREQ:
            p = put_text(out, p, "Frequency packet; Freq=")
            p = put_dec(out, p, v)
            p = put_text(out, p, "Hz")
        elif k == _NULL:
            p = put_text(out, p, "Null packet")
        elif k == _TRIG:
            p = put_text(out, p, "Trigger packet")
        elif k == _GERR:
            p = put_text(out, p, "Global Error")
        elif k == _MERR:
            p = put_text(out, p, "Master Error")
        elif k == _M8:
            p = put_text(out, p, "Set current master; Master=0x")
            p = put_hex(out, p, master[i], 2)
        elif k == _C8 or k == _C16:
            p = put_text(out, p, "Set current channel; Chan=0x")
            p = put_hex(out, p, channel[i], 4)
        elif k == _FLAG:
            p = put_text(out, p, "Flag packet")
        if n or k == _TRIG or k == _FLAG:
            if m:
                p = put_text(out, p, " + marker")
            if t:
                p = put_text(out, p, " + timestamp")
        if n:
            p = put_text(out, p, "; Data=0x")
            p = put_hex(out, p, v, n // 4)
        elif k == _TRIG:
            p = put_text(out, p, "; TrigData=0x")
            p = put_hex(out, p, v, 2)
        if t:
            p = put_text(out, p, "; TS=0x")
            p = put_upper_hex(out, p, ts[i], 16)
            if ts_bits[i]:
                p = put_updated_bits(out, p, ts[i], ts_bits[i])
        out[p] = 10
        p += 1
        i += 1
    starts[i - lo] = p
    return p, i


_NAMES: tuple[np.ndarray, np.ndarray] | None = None


def stp_listing(packets, trace_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every packet's ``trc_pkt_lister`` line, damaged ones included (see
    :func:`hwtrace.hwevents.stp.stp_dump_lines`), as one ``uint8`` text,
    where each line starts (one more than there are lines, the last the
    text's end) and each line's index."""
    from .stp import error_lines

    global _NAMES
    if _NAMES is None:
        _NAMES = string_table({int(k): k.name for k in StpKind}, 16)
    names, name_lens = _NAMES
    head, head_len = string_table({0: f"; ID:{trace_id:x};\t"}, 1)
    n = len(packets)
    cols = (
        np.ascontiguousarray(packets.offset, np.int64), packets.kind, packets.marker,
        packets.has_ts, packets.value, packets.master, packets.channel, packets.ts,
        packets.ts_bits,
    )  # fmt: skip
    text, starts = lines_in_chunks(
        lambda i, out, cap, starts: _format_lines(
            *cols, names, name_lens, _BITS, _SUFFIXED, head, head_len, i, n, out, cap, starts
        ),
        n, _LINE_MAX,
    )  # fmt: skip
    index = cols[0]
    errors = error_lines(packets, trace_id)
    if not errors:
        return text, starts, index
    # The damage's lines, each before the packet it came before.
    extra = [line.encode() + b"\n" for _, _, line in errors]
    e_starts = np.zeros(len(extra) + 1, np.int64)
    np.cumsum([len(x) for x in extra], out=e_starts[1:])
    joined = np.concatenate([text, np.frombuffer(b"".join(extra), np.uint8)])
    line_starts = np.concatenate([starts[:-1], e_starts[:-1] + len(text)])
    line_ends = np.concatenate([starts[1:], e_starts[1:] + len(text)])
    before = np.array([row for row, _, _ in errors], np.int64)
    order = np.argsort(np.concatenate([2 * np.arange(n) + 1, 2 * before]), kind="stable")
    merged, out_starts = reorder_lines(joined, line_starts, line_ends, order)
    all_index = np.concatenate([index, np.array([at for _, at, _ in errors], np.int64)])
    return merged, out_starts, all_index[order]
