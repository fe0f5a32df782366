"""CoreSight trace formatter frames: formatting and deformatting.

When several trace sources (ETM/ETE, PTM, STM...) share one sink through a
funnel, the sink's formatter wraps their byte streams into 16-byte frames
tagged with 7-bit trace IDs (ARM CoreSight Architecture Specification,
"Trace Formatter"; ARM CoreSight Components TRM, "Formatter data
processing").  ETB, ETF and ETR buffers hold such frames back to back,
16-byte aligned; a TPIU in continuous mode adds synchronisation packets.

A frame::

    byte  0  2  4 ... 12 14   even bytes: an ID byte (bit 0 = 1, new
                              trace ID in bits 7:1) or a data byte
                              whose own bit 0 is kept in byte 15
    byte  1  3  5 ... 13      odd bytes: always data
    byte 15                   auxiliary bits: bit k belongs to byte 2k

For a data byte at 2k, aux bit k is its real bit 0.  For an ID byte at 2k
(k < 7), aux bit k says when the new ID applies: 0 = from the next byte on,
1 = after the next byte (byte 2k+1 still belongs to the previous ID; a
formatter uses this when the old source has one byte left at an even
position).  An ID in byte 14 applies from the next frame.  A formatter
repeats the current ID (an "ID change" to the same ID) when it has not
written one for a while.

Trace IDs: 0x00 is the null ID (padding when a buffer is flushed),
0x01-0x6F belong to trace sources, 0x70-0x7C are reserved (0x7B: flush
response), 0x7D marks a trigger, 0x7E and 0x7F are reserved (0x7F can
never appear, as its ID byte 0xFF is the sync pattern).  Because an even
byte is 0xFF only as that impossible ID byte, two 0xFF bytes never follow
each other inside frames.

TPIU continuous mode: ``FSYNC`` = ``FF FF FF 7F`` between frames
(periodic frame synchronisation; a decoder finds frame boundaries only
through it), ``HSYNC`` = ``FF 7F`` on a 16-bit boundary inside a frame
when the port has nothing to send.  Linux's ETR driver also writes
"barrier" frames (four FSYNCs, 16 aligned bytes) into memory buffers to
mark discontinuities; OpenCSD resets its ID state on them
(``OCSD_DFRMTR_RESET_ON_4X_FSYNC``), and so does :func:`deformat`.

The behaviour follows OpenCSD's frame deformatter
(``trc_frame_deformatter.cpp``): the same ID-change rules, and
:func:`frame_dump_lines` prints frames the way ``trc_pkt_lister
-o_raw_packed -o_raw_unpacked`` does.  Unlike OpenCSD, damaged input never
stops the decode: truncated frames, data with no ID, reserved or unknown
IDs, bytes before the first FSYNC and FSYNCs inside frames are recorded as
``(byte offset, message)`` and decoding goes on (after an FSYNC inside a
frame, at the FSYNC).

Decoding runs in numba: one pass counts each trace ID's bytes, a second
writes them into one array grouped by ID, with the byte offset in the input
of every output byte as ramps (where a run of offsets rising by one
begins: a few numbers a frame).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ..aot import njit
from ..columns import Ramps

# The loops Python calls that the native library holds (hwtrace.aot; the
# others are built into them).  The encoder returns the array it makes,
# which it cannot hold: numba runs it.
AOT_ENTRIES = ("_deformat_kernel",)

__all__ = [
    "FSYNC",
    "HSYNC",
    "MODES",
    "Deformatted",
    "FrameError",
    "block_maps",
    "deformat",
    "format_frames",
    "frame_dump_lines",
    "snapshot_streams",
    "trace_ids",
]

FRAME = 16
FSYNC = b"\xff\xff\xff\x7f"
HSYNC = b"\xff\x7f"
NULL_ID = 0x00
TRIGGER_ID = 0x7D
FIRST_RESERVED_ID = 0x70

MODES = {"memory": 0, "fsync": 1, "hsync": 2, "dstream": 3}

#: An ARM DSTREAM probe stores its TPIU capture in 512-byte blocks of 504
#: trace bytes and an 8-byte footer (OpenCSD: ``trc_pkt_lister
#: -dstream_format`` feeds 504 bytes, skips 8); the trace bytes are an
#: FSYNC-synchronised stream, and OpenCSD's indices count only them.
DSTREAM_BLOCK = 512
DSTREAM_DATA = 504

# event codes written by the kernel: (offset, code, argument)
_E_TRUNCATED = 1  # arg: bytes in the incomplete frame
_E_NO_ID = 2  # data before any trace ID
_E_RESERVED = 3  # arg: the ID
_E_UNKNOWN = 4  # arg: the ID
_E_NO_SYNC = 5  # arg: bytes skipped
_E_FSYNC_IN_FRAME = 6  # arg: frame bytes dropped
_E_HSYNC = 7  # HSYNC outside hsync mode
_EV_TRIGGER = 8  # not an error: a change to the trigger ID

# statistics slots
_S_FRAMES = 0
_S_FSYNCS = 1
_S_HSYNCS = 2
_S_BARRIERS = 3
_S_ID_BYTES = 4
_S_DATA = 5
_S_NULL = 6
_S_RESERVED = 7
_S_TRIGGER = 8
_S_UNKNOWN = 9
_S_NO_ID = 10
_S_DROPPED = 11
_NSTATS = 12
_STAT_NAMES = (
    "frames",
    "fsyncs",
    "hsyncs",
    "barriers",
    "id_bytes",
    "data_bytes",
    "null_bytes",
    "reserved_bytes",
    "trigger_bytes",
    "unknown_id_bytes",
    "no_id_bytes",
    "dropped_bytes",
)

# The kinds of the frame records (frame_records: start, end, start-of-frame
# index, first segment, kind)
FRAME_NORMAL = 0
FRAME_BARRIER = 1
FRAME_PARTIAL = 2


class FrameError(ValueError):
    """Formatted trace that cannot be used, with the byte offset."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"offset {offset:#x}: {message}")
        self.offset = offset
        self.message = message


# --------------------------------------------------------------------------
# numba kernels


@njit(cache=True, _nrt=False)
def _push(arr, n, a, b, c, d, e):
    """Row n of a fixed-size table, if it has room; the new row count
    (counting rows that did not fit, so the caller can retry bigger)."""
    if n < arr.shape[0]:
        arr[n, 0] = a
        arr[n, 1] = b
        arr[n, 2] = c
        if arr.shape[1] > 3:
            arr[n, 3] = d
            arr[n, 4] = e
    return n + 1


@njit(cache=True, _nrt=False)
def _is_fsync(data, p):
    return data[p] == 0xFF and data[p + 1] == 0xFF and data[p + 2] == 0xFF and data[p + 3] == 0x7F


@njit(cache=True, _nrt=False)
def _flush(cur, keep, run, w, counts, fill, stats):
    """Account a run of ``run`` data bytes of trace ID ``cur``."""
    if cur < 0:
        stats[_S_NO_ID] += run
    elif keep:
        counts[0, cur] += run
        stats[_S_DATA] += run
        fill[cur] = w
    elif cur == NULL_ID:
        stats[_S_NULL] += run
    elif cur == TRIGGER_ID:
        stats[_S_TRIGGER] += run
    elif cur >= FIRST_RESERVED_ID:
        stats[_S_RESERVED] += run
    else:
        stats[_S_UNKNOWN] += run


@njit(cache=True, _nrt=False)
def _ramp(kind, cur, pos, off, ramps, counts, rfill, last):
    """Byte ``pos`` of trace ID ``cur``'s stream came from input offset
    ``off``: where it is not one past the ID's last byte, a ramp starts
    (kind 0: counted; 1: written at the ID's next ramp; 2: neither)."""
    if off != last[cur] + 1:
        if kind == 0:
            counts[1, cur] += 1
        elif kind == 1:
            r = rfill[cur]
            ramps[r, 0] = pos
            ramps[r, 1] = off
            rfill[cur] = r + 1
    last[cur] = off


@njit(cache=True, inline="always", _nrt=False)
def _plain_frame(kind, src, s, fo, contiguous, cur, w, starts, out_b, ramps, counts, rfill, last):
    """A kept frame of fifteen data bytes of the current ID (no ID byte):
    ``src[s:s + 16]``, its bytes from input offsets ``fo`` (or from
    ``fo[0]`` on, ``contiguous``).  Returns the ID's fill position after
    them."""
    aux = np.int64(src[s + 15])
    pos = w - starts[0, cur]
    if contiguous:
        _ramp(kind, cur, pos, fo[0], ramps, counts, rfill, last)
        last[cur] = fo[0] + 14
    else:
        for i in range(15):
            _ramp(kind, cur, pos + i, fo[i], ramps, counts, rfill, last)
    if kind == 1:
        for i in range(15):
            if i & 1:
                out_b[w] = src[s + i]
            else:
                out_b[w] = src[s + i] | ((aux >> (i >> 1)) & 1)
            w += 1
    return w


@njit(cache=True, _nrt=False)
def _end_id(cur, keep, run, w, counts, fill, stats):
    """A frame sync ends the current ID's run: account it; then no ID is
    current.  The new (run, cur, keep, noid_reported)."""
    _flush(cur, keep, run, w, counts, fill, stats)
    return 0, -1, False, False


@njit(cache=True, _nrt=False)
def _deformat_kernel(
    data, mode, allowed, kind, starts, out_b, ramps, ev, seg, frm, counts, stats, work
):
    """kind 0: count kept bytes per ID (``counts[0]``) and the ramps of
    their input offsets (``counts[1]``: runs of offsets rising by one);
    1: write the bytes grouped by ID at ``starts[0]``, and their offsets'
    ramps (stream position, offset) at ``starts[1]`` in ``ramps``; 2:
    write every data byte in stream order (none when ``out_b`` is empty)
    and record frames and segments for dumps.  ``stats`` receives the byte
    counts by kind; ``work`` is room the kernel uses
    (:func:`_kernel_room`: it allocates nothing, so the native library
    can hold it).  Returns how many events, segments, frames and sequence
    bytes there were."""
    n = data.shape[0]
    fill, seen, f, fo, rfill, last = work
    for j in range(128):
        counts[0, j] = 0
        counts[1, j] = 0
        fill[j] = starts[0, j]
        rfill[j] = starts[1, j]
        last[j] = -2
        seen[j] = False
    for j in range(stats.shape[0]):
        stats[j] = 0
    nev = 0
    nseg = 0
    nfrm = 0
    nseq = 0
    seg_len = 0
    cur = -1
    keep = False
    run = 0
    w = 0
    n_id = 0
    noid_reported = False
    p = 0
    if mode != 0:
        q = -1
        for j in range(n - 3):
            if _is_fsync(data, j):
                q = j
                break
        if q < 0:
            if n > 0:
                nev = _push(ev, nev, 0, _E_NO_SYNC, n, 0, 0)
                stats[_S_DROPPED] += n
            p = n
        elif q > 0:
            nev = _push(ev, nev, 0, _E_NO_SYNC, q, 0, 0)
            stats[_S_DROPPED] += q
            p = q
    while p < n:
        blk = p
        sof = p
        fkind = FRAME_NORMAL
        if mode == 0:
            if p + FRAME > n:
                nev = _push(ev, nev, p, _E_TRUNCATED, n - p, 0, 0)
                stats[_S_DROPPED] += n - p
                if kind == 2:
                    nfrm = _push(frm, nfrm, p, n, p, nseg, FRAME_PARTIAL)
                break
            barrier = True
            for j in range(0, FRAME, 4):
                if not _is_fsync(data, p + j):
                    barrier = False
                    break
            if barrier:
                stats[_S_BARRIERS] += 1
                stats[_S_FSYNCS] += 4
                run, cur, keep, noid_reported = _end_id(cur, keep, run, w, counts, fill, stats)
                if kind == 2:
                    nfrm = _push(frm, nfrm, p, p + FRAME, p, nseg, FRAME_BARRIER)
                p += FRAME
                continue
            fo[0] = p
            if kind != 2 and cur >= 0:
                idbits = (data[p] | data[p + 2] | data[p + 4] | data[p + 6] | data[p + 8]
                          | data[p + 10] | data[p + 12] | data[p + 14])  # fmt: skip
                if (idbits & 1) == 0:
                    # Most frames of a buffer: the current ID's fifteen
                    # bytes, read where they are (not copied out first).
                    stats[_S_FRAMES] += 1
                    run += 15
                    if keep:
                        w = _plain_frame(kind, data, p, fo, True, cur, w, starts, out_b, ramps,
                                         counts, rfill, last)  # fmt: skip
                    p += FRAME
                    continue
            for j in range(FRAME):
                f[j] = data[p + j]
                fo[j] = p + j
            p += FRAME
        else:
            k = 0
            fs = 0
            hs_seen = False
            while k < FRAME and p < n:
                if p + 4 <= n and _is_fsync(data, p):
                    stats[_S_FSYNCS] += 1
                    if k > 0:
                        nev = _push(ev, nev, fo[0], _E_FSYNC_IN_FRAME, k, 0, 0)
                        stats[_S_DROPPED] += k
                        k = 0
                        run, cur, keep, noid_reported = _end_id(
                            cur, keep, run, w, counts, fill, stats
                        )
                        blk = p
                        fs = 0
                        hs_seen = False
                    if not hs_seen:
                        fs += 4
                    p += 4
                    continue
                if p + 5 <= n and _is_fsync(data, p + 1):
                    # one stray byte: the FSYNC is off the 16-bit grid
                    start = fo[0] if k > 0 else p
                    nev = _push(ev, nev, start, _E_FSYNC_IN_FRAME, k + 1, 0, 0)
                    stats[_S_DROPPED] += k + 1
                    k = 0
                    run, cur, keep, noid_reported = _end_id(cur, keep, run, w, counts, fill, stats)
                    p += 1
                    blk = p
                    fs = 0
                    hs_seen = False
                    continue
                if p + 2 > n:
                    break
                if data[p] == 0xFF and data[p + 1] == 0x7F:
                    stats[_S_HSYNCS] += 1
                    if mode != 2:
                        nev = _push(ev, nev, p, _E_HSYNC, 0, 0, 0)
                    hs_seen = True
                    p += 2
                    continue
                f[k] = data[p]
                f[k + 1] = data[p + 1]
                fo[k] = p
                fo[k + 1] = p + 1
                k += 2
                p += 2
            if k < FRAME:
                left = n - p
                if k + left > 0:
                    start = fo[0] if k > 0 else p
                    nev = _push(ev, nev, start, _E_TRUNCATED, k + left, 0, 0)
                    stats[_S_DROPPED] += k + left
                if kind == 2 and n > blk:
                    nfrm = _push(frm, nfrm, blk, n, blk + fs, nseg, FRAME_PARTIAL)
                break
            sof = blk + fs
        # ---- unpack one frame
        stats[_S_FRAMES] += 1
        if kind == 2:
            nfrm = _push(frm, nfrm, blk, p, sof, nseg, fkind)
            nseg = _push(seg, nseg, nseq, sof, cur, 0, 0)
            seg_len = 0
        aux = np.int64(f[15])
        if kind != 2 and cur >= 0:
            idbits = f[0] | f[2] | f[4] | f[6] | f[8] | f[10] | f[12] | f[14]
            if (idbits & 1) == 0:
                # no ID byte: fifteen data bytes of the current ID (at
                # fifteen offsets in a row but where an HSYNC came between)
                run += 15
                if keep:
                    w = _plain_frame(kind, f, 0, fo, fo[14] - fo[0] == 14, cur, w, starts, out_b,
                                     ramps, counts, rfill, last)  # fmt: skip
                continue
        defer = -1
        defer_i = 0
        for i in range(15):
            b = np.int64(f[i])
            chg = -1
            chg_i = 0
            has_val = False
            val = 0
            if (i & 1) == 0:
                abit = (aux >> (i >> 1)) & 1
                if b & 1:
                    n_id += 1
                    nid = b >> 1
                    if nid != cur:
                        if i < 14 and abit:
                            defer = nid
                            defer_i = i
                        else:
                            chg = nid
                            chg_i = i
                else:
                    val = b | abit
                    has_val = True
            else:
                val = b
                has_val = True
            if has_val:
                off = fo[i]
                run += 1
                if keep:
                    _ramp(kind, cur, w - starts[0, cur], off, ramps, counts, rfill, last)
                    if kind == 1:
                        out_b[w] = val
                        w += 1
                elif cur < 0 and not noid_reported:
                    nev = _push(ev, nev, off, _E_NO_ID, 0, 0, 0)
                    noid_reported = True
                if kind == 2:
                    if out_b.shape[0] > nseq:  # (empty: the runs alone)
                        out_b[nseq] = val
                    nseq += 1
                    seg_len += 1
                if defer >= 0:
                    chg = defer
                    chg_i = defer_i
                    defer = -1
            if chg >= 0:
                _flush(cur, keep, run, w, counts, fill, stats)
                run = 0
                cur = chg
                keep = cur > NULL_ID and cur < FIRST_RESERVED_ID and allowed[cur]
                if keep:
                    w = fill[cur]
                if chg == TRIGGER_ID:
                    nev = _push(ev, nev, fo[chg_i], _EV_TRIGGER, chg, 0, 0)
                elif chg >= FIRST_RESERVED_ID:
                    nev = _push(ev, nev, fo[chg_i], _E_RESERVED, chg, 0, 0)
                elif chg != NULL_ID and not allowed[chg] and not seen[chg]:
                    seen[chg] = True
                    nev = _push(ev, nev, fo[chg_i], _E_UNKNOWN, chg, 0, 0)
                if kind == 2 and chg_i < 14:
                    if seg_len > 0:
                        nseg = _push(seg, nseg, nseq, sof + chg_i, chg, 0, 0)
                        seg_len = 0
                    elif nseg <= seg.shape[0]:
                        seg[nseg - 1, 2] = chg
    _flush(cur, keep, run, w, counts, fill, stats)
    stats[_S_ID_BYTES] = n_id
    return nev, nseg, nfrm, nseq


def _kernel_room() -> tuple[np.ndarray, ...]:
    """The room :func:`_deformat_kernel` works in: a fill position and a
    seen flag per trace ID, one frame's bytes and their offsets, and per
    trace ID the fill position of its ramps and its last byte's offset."""
    return (np.empty(128, np.int64), np.empty(128, np.bool_), np.empty(16, np.uint8),
            np.empty(16, np.int64), np.empty(128, np.int64), np.empty(128, np.int64))  # fmt: skip


@njit(cache=True)
def _format_kernel(ids, vals, chunk_start, pad_id, fsync_every, hsync, repeat_id):
    n = vals.shape[0]
    out = np.empty(max(256, n + n // 6 + 256), np.uint8)
    m = 0
    pos = 0
    cur = -1
    frame_no = 0
    frames_no_id = 0
    while pos < n:
        if m + 64 > out.shape[0]:
            bigger = np.empty(out.shape[0] * 2, np.uint8)
            bigger[:m] = out[:m]
            out = bigger
        if fsync_every > 0 and frame_no % fsync_every == 0:
            out[m] = 0xFF
            out[m + 1] = 0xFF
            out[m + 2] = 0xFF
            out[m + 3] = 0x7F
            m += 4
        aux = 0
        had_id = False
        force = repeat_id > 0 and frames_no_id >= repeat_id and cur >= 0
        for slot in range(0, 15, 2):
            iid = ids[pos] if pos < n else pad_id
            ival = vals[pos] if pos < n else 0
            if hsync and slot > 0 and pos < n and chunk_start[pos]:
                out[m] = 0xFF
                out[m + 1] = 0x7F
                m += 2
            if slot == 14:
                if iid == cur:
                    out[m] = ival & 0xFE
                    aux |= (ival & 1) << 7
                    pos += 1
                else:
                    out[m] = (iid << 1) | 1
                    cur = iid
                    had_id = True
                m += 1
                break
            if iid != cur or (slot == 0 and force):
                out[m] = (iid << 1) | 1
                out[m + 1] = ival
                cur = iid
                had_id = True
                pos += 1
            else:
                nid = ids[pos + 1] if pos + 1 < n else pad_id
                if nid != cur:
                    # the old ID has one byte left at an even position:
                    # ID change that applies after the next byte
                    out[m] = (nid << 1) | 1
                    aux |= 1 << (slot >> 1)
                    out[m + 1] = ival
                    cur = nid
                    had_id = True
                    pos += 1
                else:
                    out[m] = ival & 0xFE
                    aux |= (ival & 1) << (slot >> 1)
                    out[m + 1] = vals[pos + 1] if pos + 1 < n else 0
                    pos += 2
            m += 2
        out[m] = aux
        m += 1
        frames_no_id = 0 if had_id else frames_no_id + 1
        frame_no += 1
    return out[:m]


# --------------------------------------------------------------------------
# formatting


def format_frames(
    chunks: Iterable[tuple[int, bytes]],
    *,
    fsync_every: int = 0,
    hsync: bool = False,
    pad_id: int = NULL_ID,
    repeat_id: int = 8,
) -> bytes:
    """Interleave ``(trace_id, bytes)`` chunks into formatter frames.

    Chunks are written in order, each ID change where a formatter makes it:
    an ID byte at an even position, or, when the previous source has one
    byte left for an even position, an ID byte whose aux bit defers the
    change past that byte.  The last frame is padded with ``pad_id`` data
    (zeros).  ``fsync_every=N`` writes an FSYNC before frames 0, N, 2N...
    (TPIU continuous mode); ``hsync`` writes an HSYNC inside a frame where
    a chunk begins (the port had nothing to send).  A frame starts with a
    repeated ID byte once ``repeat_id`` frames went by without one (0: never).
    """
    ids_list: list[int] = []
    lens: list[int] = []
    parts: list[bytes] = []
    if not 0 <= pad_id < 0x7F:
        raise ValueError(f"pad_id {pad_id:#x} is not a trace ID (0..0x7e)")
    for tid, payload in chunks:
        if not 0 <= tid < 0x7F:
            raise ValueError(f"trace ID {tid:#x} out of range 0..0x7e")
        payload = bytes(payload)
        if payload:
            ids_list.append(tid)
            lens.append(len(payload))
            parts.append(payload)
    if not parts:
        return b""
    vals = np.frombuffer(b"".join(parts), np.uint8)
    lengths = np.asarray(lens, np.int64)
    ids = np.repeat(np.asarray(ids_list, np.int64), lengths)
    chunk_start = np.zeros(vals.shape[0], np.bool_)
    chunk_start[np.cumsum(lengths) - lengths] = True
    out = _format_kernel(ids, vals, chunk_start, pad_id, fsync_every, bool(hsync), repeat_id)
    return out.tobytes()


# --------------------------------------------------------------------------
# deformatting


@dataclass
class Deformatted:
    """Per-trace-ID byte streams recovered from formatted trace.

    ``offsets[id][k]`` is the byte offset in the input of ``streams[id][k]``,
    so an error a protocol decoder reports at position k of a stream maps
    back to the file.  ``errors``: ``(offset, message)`` in input order.
    ``triggers``: offsets of ID bytes switching to the trigger ID 0x7D.
    ``counts``: frames, fsyncs, hsyncs, barriers, id_bytes, data_bytes (kept),
    null_bytes, reserved_bytes, trigger_bytes, unknown_id_bytes,
    no_id_bytes, dropped_bytes (not in any frame: before sync, truncated).
    """

    streams: dict[int, bytes]
    offsets: dict[int, np.ndarray]
    errors: list[tuple[int, str]] = field(default_factory=list)
    triggers: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def frames(self) -> int:
        return self.counts.get("frames", 0)

    def file_offset(self, trace_id: int, position: int) -> int:
        """Input offset of byte ``position`` of ``trace_id``'s stream."""
        return int(self.offsets[trace_id][position])


# What each error says ({}: its arg).
_MESSAGES = {
    _E_TRUNCATED: "truncated frame: {} bytes of an incomplete frame at the end",
    _E_NO_ID: "data before any trace ID",
    _E_RESERVED: "reserved trace ID {:#04x}",
    _E_UNKNOWN: "unknown trace ID {:#04x}",
    _E_NO_SYNC: "no FSYNC: {} bytes before frame synchronisation skipped",
    _E_FSYNC_IN_FRAME: "FSYNC inside a frame: {} bytes of the partial frame dropped",
    _E_HSYNC: "HSYNC in a stream without HSYNCs, skipped",
}


def _message(code: int, arg: int) -> str:
    return _MESSAGES[code].format(arg) if code in _MESSAGES else f"event {code}"


def _as_array(data) -> np.ndarray:
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
    return np.frombuffer(memoryview(data).cast("B"), np.uint8)


def _mode(mode: str) -> int:
    try:
        return MODES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}") from None


def _unwrap(arr: np.ndarray, mode: str) -> tuple[np.ndarray, int, np.ndarray | None]:
    """The bytes the frame decoder reads (read-only, whatever the input
    was: one specialisation of the kernel), its kernel mode, and (DSTREAM)
    the input offset of each of those bytes (None: the same offsets)."""
    m = _mode(mode)
    pos = None
    if m == MODES["dstream"]:
        pos = np.flatnonzero(np.arange(arr.shape[0], dtype=np.int64) % DSTREAM_BLOCK < DSTREAM_DATA)
        arr, m = arr[pos], MODES["fsync"]
    arr = arr.view()
    arr.flags.writeable = False
    return arr, m, pos


def _input_ramps(pos: np.ndarray | None, ramps: Ramps) -> Ramps:
    """Ramps of offsets in the unwrapped bytes as ramps of offsets in the
    input: a ramp that runs over a place where the input skips bytes (a
    DSTREAM footer) is cut there."""
    if pos is None or ramps.n == 0:
        return ramps
    lengths = ramps.lengths()
    cuts = np.flatnonzero(np.diff(pos) != 1) + 1  # (unwrapped offsets after a skip)
    lo = np.searchsorted(cuts, ramps.values, side="right")
    inside = np.searchsorted(cuts, ramps.values + lengths, side="left") - lo
    owner = np.repeat(np.arange(lengths.shape[0]), inside)
    first = np.cumsum(inside) - inside
    at = cuts[np.arange(owner.shape[0]) - first[owner] + lo[owner]]
    starts = np.concatenate([ramps.starts, ramps.starts[owner] + at - ramps.values[owner]])
    values = np.concatenate([ramps.values, at])
    order = np.argsort(starts, kind="stable")
    return Ramps(starts[order], pos[values[order]], ramps.n)


def _input_offsets(pos: np.ndarray | None, offsets: np.ndarray) -> np.ndarray:
    """Offsets in the unwrapped bytes as offsets in the input."""
    if pos is None or pos.shape[0] == 0:
        return offsets
    inside = np.minimum(offsets, pos.shape[0] - 1)
    return np.where(offsets < pos.shape[0], pos[inside], pos[-1] + 1 + offsets - pos.shape[0])


def _allowed(ids: Iterable[int] | None) -> np.ndarray:
    allowed = np.zeros(128, np.bool_)
    if ids is None:
        allowed[:] = True
    else:
        for i in ids:
            if 0 <= int(i) < 128:
                allowed[int(i)] = True
    return allowed


def deformat(
    data,
    *,
    mode: str = "memory",
    ids: Iterable[int] | None = None,
    strict: bool = False,
    as_ramps: bool = False,
) -> Deformatted:
    """Split formatted trace into per-trace-ID streams.

    ``mode``: ``"memory"`` for ETB/ETF/ETR buffers (16-byte aligned frames),
    ``"fsync"`` for a TPIU capture synchronised by FSYNCs, ``"hsync"`` for
    one with FSYNCs and HSYNCs, ``"dstream"`` for a DSTREAM capture (FSYNC
    synchronised, with an 8-byte footer after every 504 bytes).  ``ids``: the trace IDs expected; data of
    other source IDs is dropped and reported once per ID as unknown (by
    default every source ID 0x01-0x6F is kept).  Damaged input is reported
    in ``errors`` and never raises, unless ``strict``: then the first error
    raises :class:`FrameError` with its offset.  ``as_ramps``: the offsets
    as :class:`~hwtrace.columns.Ramps` (about a byte per trace byte; as
    arrays, eight).
    """
    arr, m, pos = _unwrap(_as_array(data), mode)
    allowed = _allowed(ids)
    none3 = np.empty((0, 3), np.int64)
    none5 = np.empty((0, 5), np.int64)
    counts = np.zeros((2, 128), np.int64)
    stats = np.zeros(_NSTATS, np.int64)
    work = _kernel_room()
    _deformat_kernel(
        arr, m, allowed, 0, np.zeros((2, 128), np.int64), np.empty(0, np.uint8),
        np.empty((0, 2), np.int64), none3, none3, none5, counts, stats, work,
    )  # fmt: skip
    # (each ID's bytes, and the ramps of their offsets: a few a frame, not
    # eight bytes a byte)
    starts = np.zeros((2, 128), np.int64)
    starts[:, 1:] = np.cumsum(counts, axis=1)[:, :-1]
    out_b = np.empty(int(counts[0].sum()), np.uint8)
    ramps = np.empty((int(counts[1].sum()), 2), np.int64)
    ev = np.empty((1024, 3), np.int64)
    while True:
        nev, _, _, _ = _deformat_kernel(
            arr, m, allowed, 1, starts, out_b, ramps, ev, none3, none5,
            np.zeros((2, 128), np.int64), stats, work,
        )  # fmt: skip
        if nev <= ev.shape[0]:
            break
        ev = np.empty((nev, 3), np.int64)
    ev = ev[:nev]
    streams: dict[int, bytes] = {}
    offsets: dict[int, np.ndarray | Ramps] = {}
    for tid in np.flatnonzero(counts[0]):
        s, e = int(starts[0, tid]), int(starts[0, tid] + counts[0, tid])
        streams[int(tid)] = out_b[s:e].tobytes()
        r0, r1 = int(starts[1, tid]), int(starts[1, tid] + counts[1, tid])
        ramp = _input_ramps(pos, Ramps(ramps[r0:r1, 0].copy(), ramps[r0:r1, 1].copy(), e - s))
        offsets[int(tid)] = ramp if as_ramps else np.asarray(ramp)
    del out_b
    errors: list[tuple[int, str]] = []
    triggers: list[int] = []
    if pos is not None and ev.shape[0]:
        ev[:, 0] = _input_offsets(pos, ev[:, 0])
    for off, code, arg in ev.tolist():
        if code == _EV_TRIGGER:
            triggers.append(off)
        else:
            errors.append((off, _message(code, arg)))
    if strict and errors:
        raise FrameError(*errors[0])
    return Deformatted(
        streams=streams,
        offsets=offsets,
        errors=errors,
        triggers=np.asarray(triggers, np.int64),
        counts={name: int(v) for name, v in zip(_STAT_NAMES, stats.tolist(), strict=True)},
    )


# --------------------------------------------------------------------------
# listings in OpenCSD's raw frame printer format


def _sequence(arr: np.ndarray, m: int, per_byte: bool = True):
    """Every data byte in input order, how many, the runs of one ID within
    a frame (sequence position, OpenCSD's index, ID) and the frames
    (start, end, start of frame, first run, kind), all in the bytes the
    frame decoder reads (``arr``, unwrapped: OpenCSD's indices); ``m`` is
    the kernel's mode.  ``per_byte=False``: the bytes are left out (the
    runs alone)."""
    n = arr.shape[0]
    seq_b = np.empty(n if per_byte else 0, np.uint8)
    frames = n // FRAME + 4
    ev = np.empty((1024, 3), np.int64)
    # (a frame holds up to 8 runs, mostly one or two: room for two a frame,
    # and the walk again with room for them all when there are more)
    seg = np.empty((frames * 2 + 64, 3), np.int64)
    frm = np.empty((frames, 5), np.int64)
    while True:
        nev, nseg, nfrm, nseq = _deformat_kernel(
            arr, m, _allowed(None), 2, np.zeros((2, 128), np.int64), seq_b,
            np.empty((0, 2), np.int64), ev, seg, frm, np.zeros((2, 128), np.int64),
            np.zeros(_NSTATS, np.int64), _kernel_room(),
        )  # fmt: skip
        if nev <= ev.shape[0] and nseg <= seg.shape[0]:
            break
        if nev > ev.shape[0]:
            ev = np.empty((nev, 3), np.int64)
        if nseg > seg.shape[0]:
            seg = np.empty((nseg, 3), np.int64)
    return seq_b, nseq, seg[:nseg], frm[:nfrm]


def block_indices(data, mode: str = "memory") -> dict[int, np.ndarray]:
    """Per trace ID, for every byte of its stream (as :func:`deformat` gives
    it with every ID kept), the index OpenCSD's packet lists (``Idx``) give
    a packet starting there: OpenCSD hands each run of one ID's bytes in a
    frame to the decoder at the frame's start, or at the ID byte that began
    the run, and counts on from there."""
    return {t: np.asarray(index) for t, index in block_maps(data, mode)[0].items()}


def block_starts(data, mode: str = "memory") -> dict[int, np.ndarray]:
    """Per trace ID, the offsets in its stream (as :func:`deformat` gives
    it) where the blocks OpenCSD hands its decoder begin: each run of the
    ID's bytes in a frame is one."""
    return block_maps(data, mode)[1]


def block_maps(data, mode: str = "memory") -> tuple[dict[int, Ramps], dict[int, np.ndarray]]:
    """:func:`block_indices` (as :class:`~hwtrace.columns.Ramps`: a run of
    one ID in a frame counts on from its index) and :func:`block_starts`,
    from one pass over the frames and without a number per byte."""
    seg, lengths = _runs(data, mode)
    indices: dict[int, Ramps] = {}
    starts: dict[int, np.ndarray] = {}
    for t in _ids_in(seg[:, 2]):
        mine = seg[:, 2] == t
        n = lengths[mine]
        at = np.cumsum(n) - n
        if n.sum():
            indices[t] = Ramps(at, seg[mine, 1], int(n.sum()))
        starts[t] = at
    return indices, starts


def _ids_in(ids: np.ndarray) -> list[int]:
    """The trace IDs (0-127; -1: none) that occur in ``ids``, in order
    (counted, not ``np.unique``: that imports numpy.ma, a command's
    start-up cost)."""
    return np.flatnonzero(np.bincount(ids[ids >= 0], minlength=128)).tolist()


def _runs(data, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """The runs of one ID within a frame (see :func:`_sequence`) and each
    run's length, without a number per byte."""
    arr, m, _ = _unwrap(_as_array(data), mode)
    _, nseq, seg, _ = _sequence(arr, m, per_byte=False)
    return seg, np.diff(np.append(seg[:, 0], nseq))


def frame_records(data, mode: str = "memory"):
    """What a frame listing is made of: the input bytes (read-only), the
    bytes the frame decoder reads (DSTREAM: without the footers), every
    data byte in input order and how many, the runs of one ID within a
    frame (sequence position, OpenCSD's index, ID) and the frames (start,
    end, start of frame, first run, kind)."""
    raw = _as_array(data).view()
    raw.flags.writeable = False
    arr, m, _ = _unwrap(raw, mode)
    seq_b, nseq, seg, frm = _sequence(arr, m)
    return raw, arr, seq_b, nseq, seg, frm


def frame_dump_lines(
    data, mode: str = "memory", *, packed: bool = True, unpacked: bool = True
) -> Iterator[str]:
    """Frames as ``trc_pkt_lister -o_raw_packed`` (each frame's input bytes,
    syncs included) and ``-o_raw_unpacked`` (each run of one ID's bytes in a
    frame, at OpenCSD's index: the frame start, or the ID byte that began
    the run) print them, one text line per item.  A DSTREAM capture's
    footers are listed as ``-dstream_format`` lists them, each after its
    block's trace bytes (which end a packed frame's line there).  The text
    is written by a compiled loop
    (:func:`hwtrace.hwevents.frametext.frame_listing`)."""
    from .frametext import frame_listing

    text = frame_listing(data, mode, packed=packed, unpacked=unpacked)
    yield from bytes(text).decode().split("\n")[:-1]


# --------------------------------------------------------------------------
# snapshots


def _reg(regs: dict[str, int], name: str) -> int | None:
    for key, value in regs.items():
        if key.lower() == name.lower():
            return int(value)
    return None


def trace_ids(snapshot) -> dict[str, int]:
    """Trace ID of each trace source in a :class:`~hwtrace.hwevents.cssnapshot.Snapshot`,
    from its registers: TRCTRACEIDR (ETMv4, ETE), STMTCSR bits 22:16 (STM),
    ETMTRACEIDR (ETMv3, PTM).  Devices with none of them are left out."""
    out: dict[str, int] = {}
    for dev in snapshot.devices:
        v = _reg(dev.regs, "TRCTRACEIDR")
        if v is not None:
            out[dev.name] = v & 0x7F
            continue
        v = _reg(dev.regs, "STMTCSR")
        if v is not None:
            out[dev.name] = (v >> 16) & 0x7F
            continue
        v = _reg(dev.regs, "ETMTRACEIDR")
        if v is not None:
            out[dev.name] = v & 0x7F
    return out


_BUFFER_MODES = {"coresight": "memory", "dstream_coresight": "dstream"}


def snapshot_streams(snapshot) -> dict[str, bytes]:
    """Each trace source's bytes: deformatted from its buffer's frames
    (``format=coresight``: memory frames; ``dstream_coresight``: a DSTREAM
    capture, FSYNC synchronised with block footers), or the buffer itself (``source_data``).  Raises
    :class:`FrameError` (offset 0) for a missing buffer, an unknown buffer
    format or a source in a formatted buffer without a trace ID."""
    ids = trace_ids(snapshot)
    done: dict[str, Deformatted] = {}
    out: dict[str, bytes] = {}
    for source, bufname in snapshot.source_buffers.items():
        try:
            buf = snapshot.buffer(bufname)
        except KeyError:
            raise FrameError(0, f"source {source}: no buffer named {bufname!r}") from None
        if buf.format == "source_data":
            out[source] = bytes(buf.data)
            continue
        mode = _BUFFER_MODES.get(buf.format)
        if mode is None:
            raise FrameError(0, f"buffer {bufname}: unknown format {buf.format!r}")
        if source not in ids:
            raise FrameError(0, f"source {source}: no trace ID register")
        if bufname not in done:
            mine = [ids[s] for s, b in snapshot.source_buffers.items() if b == bufname and s in ids]
            done[bufname] = deformat(buf.data, mode=mode, ids=mine)
        out[source] = done[bufname].streams.get(ids[source], b"")
    return out
