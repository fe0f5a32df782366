"""CoreSight formatter frames listed as OpenCSD's ``trc_pkt_lister
-o_raw_packed -o_raw_unpacked`` lists them, written by one compiled loop
into a byte buffer (the lines of
:func:`hwtrace.hwevents.csframes.frame_dump_lines`).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .. import aot
from ..textout import digit_count, put_dec, put_hex, put_spaces, put_text
from .csframes import DSTREAM_BLOCK, DSTREAM_DATA, FRAME_BARRIER, FRAME_PARTIAL, frame_records

AOT_ENTRIES = ("_format_frames",)

# The most a line's head and one footer line take.
_HEAD_MAX = 48
_FOOTER_MAX = 16 + 5 * (DSTREAM_BLOCK - DSTREAM_DATA) + 1


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_index(out, p, index):
    """``Frame Data; Index%7d; ``."""
    p = put_text(out, p, "Frame Data; Index")
    p = put_spaces(out, p, 7 - digit_count(index, 10))
    p = put_dec(out, p, index)
    return put_text(out, p, "; ")


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_bytes(out, p, data, start, end):
    """The bytes as OpenCSD's data string: ``xx `` each, 16 a line."""
    for j in range(start, end):
        if j > start and (j - start) % 16 == 0:
            out[p] = 10
            p += 1
        p = put_hex(out, p, data[j], 2)
        out[p] = 32
        p += 1
    out[p] = 10
    return p + 1


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_head(out, p, kind, start):
    p = _put_index(out, p, start)
    if kind == FRAME_BARRIER:
        return put_text(out, p, "        FSYNC; ")
    return put_text(out, p, "   RAW_PACKED; ")


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_footer(out, p, raw, at):
    p = put_text(out, p, "DSTREAM footer [")
    for j in range(at, at + DSTREAM_BLOCK - DSTREAM_DATA):
        if j >= raw.shape[0]:
            break
        p = put_text(out, p, "0x")
        p = put_hex(out, p, raw[j], 0)
        out[p] = 32
        p += 1
    p = put_text(out, p, "]")
    out[p] = 10
    return p + 1


@aot.njit(cache=True, _nrt=False)
def _format_frames(
    arr, raw, frm, seg, seq_b, nseq, foot_at, foot_raw, packed, unpacked, state, out, cap
):  # fmt: skip
    """Frames from ``state[0]`` (the next footer ``state[1]``) into ``out``
    until ``cap`` bytes are written; the state is updated.  A frame's
    lines are written whole: the caller's room after ``cap`` holds the
    largest.  Returns the bytes written."""
    p = 0
    fi = state[0]
    nf = state[1]
    nfrm = frm.shape[0]
    nseg = seg.shape[0]
    nfoot = foot_at.shape[0]
    while fi < nfrm and p < cap:
        start, end, kind, seg_first = frm[fi, 0], frm[fi, 1], frm[fi, 4], frm[fi, 3]
        if packed or (kind == FRAME_BARRIER and unpacked):
            # The frame's bytes, split where a footer came between them.
            while nf < nfoot and foot_at[nf] < end:
                cut = foot_at[nf]
                if cut > start:
                    p = _put_head(out, p, kind, start)
                    p = _put_bytes(out, p, arr, start, cut)
                    start = cut
                p = _put_footer(out, p, raw, foot_raw[nf])
                nf += 1
            p = _put_head(out, p, kind, start)
            p = _put_bytes(out, p, arr, start, end)
        if kind != FRAME_BARRIER and unpacked and kind != FRAME_PARTIAL:
            seg_end = frm[fi + 1, 3] if fi + 1 < nfrm else nseg
            for si in range(seg_first, seg_end):
                pos, index, tid = seg[si, 0], seg[si, 1], seg[si, 2]
                npos = seg[si + 1, 0] if si + 1 < nseg else nseq
                p = _put_index(out, p, index)
                p = put_text(out, p, "  ID_DATA[")
                if tid < 0:
                    p = put_text(out, p, "????")
                else:
                    p = put_text(out, p, "0x")
                    p = put_hex(out, p, tid, 2)
                p = put_text(out, p, "]; ")
                p = _put_bytes(out, p, seq_b, pos, npos)
        fi += 1
    if fi >= nfrm:
        while nf < nfoot:
            p = _put_footer(out, p, raw, foot_raw[nf])
            nf += 1
    state[0] = fi
    state[1] = nf
    return p


def frame_listing(data, mode: str = "memory", *, packed: bool = True,
                  unpacked: bool = True) -> np.ndarray:  # fmt: skip
    """The listing of :func:`hwtrace.hwevents.csframes.frame_dump_lines` as
    one ``uint8`` text."""
    pieces = list(frame_listing_chunks(data, mode, packed=packed, unpacked=unpacked))
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)


def frame_listing_chunks(data, mode: str = "memory", *, packed: bool = True,
                         unpacked: bool = True) -> Iterator[np.ndarray]:  # fmt: skip
    """:func:`frame_listing`'s text in pieces of whole lines (about 1 MB
    each), each made when asked for."""
    raw, arr, seq_b, nseq, seg, frm = frame_records(data, mode)
    if mode == "dstream" and packed:
        # (index where a footer follows, where its bytes are): packed only
        foot_raw = np.arange(DSTREAM_DATA, raw.shape[0], DSTREAM_BLOCK, dtype=np.int64)
        foot_at = (foot_raw // DSTREAM_BLOCK + 1) * DSTREAM_DATA
    else:
        foot_raw = foot_at = np.zeros(0, np.int64)
    # Room for the largest frame's lines after the chunk: its bytes twice
    # (packed and unpacked) at 3 characters each, a head per 16 bytes and
    # per run of one ID, the footers inside it.
    longest = int((frm[:, 1] - frm[:, 0]).max()) if frm.shape[0] else 0
    runs = int(np.diff(frm[:, 3]).max(initial=0)) + 1 if frm.shape[0] else 1
    room = (
        6 * longest
        + _HEAD_MAX * (2 * (longest // 16 + 2) + runs)
        + _FOOTER_MAX * (longest // DSTREAM_DATA + 2)
    )
    cap = 1 << 20
    state = np.zeros(2, np.int64)
    while True:
        out = np.empty(cap + room, np.uint8)
        p = _format_frames(arr, raw, frm, seg, seq_b, nseq, foot_at, foot_raw, packed, unpacked,
                           state, out, cap)  # fmt: skip
        yield out[:p]
        if state[0] >= frm.shape[0]:
            break
