"""MIPI STPv2 packets as ARM CoreSight STM emits them, and the software
events they carry.

A store into an STM stimulus port becomes a packet on a nibble stream
(ARM CoreSight STM-500 TRM; MIPI Alliance Specification for System Trace
Protocol v2.x).  Each byte carries two nibbles, the low nibble first; a
multi-nibble field is sent most significant nibble first.  Headers
(hexadecimal nibbles, in stream order)::

    0        NULL                   F00 v    VERSION (3: natural-binary
    1 mm     M8  set master                  timestamps, 4: Gray-coded)
    2 ee     MERR master error       F01 ts   NULL + timestamp
    3 cc     C8  set channel[7:0]    F06 tt   TRIG        F07 tt ts  TRIG + ts
    4..7     D8 D16 D32 D64          F08 ffffffff  FREQ (Hz)
    8..B     D8..D64 + marker + ts   F1, F02..F05, F09..F0F  reserved
    C / D    D4 / D4 + marker + ts   F2 ee    GERR global error
    E ts     FLAG + timestamp        F3 cccc  C16 set channel
    F4..F7   D8..D64 + ts            F8..FB   D8..D64 + marker
    FC / FD  D4 + ts / D4 + marker   FE       FLAG
    F*21 0   ASYNC (21 F nibbles, a 0)

Data follow the header (2, 4, 8 or 16 nibbles; 1 for D4).  A timestamp is
a size nibble ``n`` (0..12 nibbles; D means 14, E means 16, F is invalid)
and ``n`` nibbles that replace the low ``4n`` bits of the running
timestamp -- in natural binary after VERSION 3, in Gray code after
VERSION 4 (the new value is Gray-decoded from the Gray code of the old
one with its low bits replaced).  M8 and VERSION set the channel to 0,
C8 replaces only the low byte of the channel, MERR sets the channel to
0 and GERR the master and channel to 0 (as OpenCSD's STM packet
processor, trc_pkt_proc_stm.cpp, does).

Offsets follow OpenCSD's ``Idx``: the number of bytes consumed when the
packet's first nibble was read, so a packet starting in a byte's high
nibble has the next byte's index (``nibble`` holds the exact position).
An ASYNC found while searching for synchronisation is placed at the byte
holding the first F of its run, as OpenCSD places it.

:func:`encode_stp` writes packets as the STM would (shortest timestamp
update, Gray or binary per the last VERSION) and, when the stream has an
odd number of nibbles, pads the last byte's high nibble with 0 -- a NULL
packet, the STM's idle filler -- so decoding an encoded stream gives
the packets back plus, at most, one trailing NULL.

:func:`decode_stp` is compiled (numba).  It never raises on damaged data
unless asked to: errors are kept as (byte offset, message); everything
before the first ASYNC is skipped and reported once; after a bad header
or a bad timestamp size the decoder skips to the next ASYNC (or, with
``resync=False``, carries on at the next nibble as OpenCSD does, so its
dump matches OpenCSD's on damaged streams too).

:func:`stp_events` assembles software events per (master, channel).  The
Linux STM framework (drivers/hwtracing/stm/core.c ``stm_data_write``,
p_basic.c, p_sys-t.c: "the first packet of the SyS-T frame is
timestamped; the last packet is a FLAG") writes a message as data
packets of at most 8 bytes, the FIRST one timestamped and none marked
(coresight-stm.c clears the timestamp bit of the stimulus port offset:
D*TS), and ends it with a FLAG packet on the same channel.  So by
default an event starts at a data packet with a timestamp (or a marker,
for producers that mark the first write) and ends at a FLAG
(``convention="flag"``).  For producers that mark the LAST write of a
message instead, ``convention="marker"`` ends an event at a marked
packet.

:func:`stp_dump_lines` prints packets as OpenCSD's ``trc_pkt_lister``
does (``Idx:13; ID:0;\\tM8:Set current master; Master=0x01``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from ..aot import njit

# The loops Python calls that the native library holds (hwtrace.aot; the
# others are built into them).  The encoder returns the array it makes,
# which it cannot hold: numba runs it.
AOT_ENTRIES = ("_decode", "_assemble", "_payloads")

__all__ = [
    "StpError",
    "StpEvents",
    "StpKind",
    "StpPacket",
    "StpPackets",
    "decode_stp",
    "encode_stp",
    "encode_stp_columns",
    "stp_dump_lines",
    "stp_event_windows",
    "stp_events",
    "stp_windows",
]


class StpKind(IntEnum):
    """Packet kinds.  Timestamp and marker are flags of a packet, not kinds
    (D32MTS is D32 with ``marker`` and ``ts``; FLAG_TS is FLAG with ``ts``)."""

    NULL = 0
    M8 = 1
    MERR = 2
    C8 = 3
    C16 = 4
    D4 = 5
    D8 = 6
    D16 = 7
    D32 = 8
    D64 = 9
    FLAG = 10
    TRIG = 11
    VERSION = 12
    FREQ = 13
    ASYNC = 14
    GERR = 15


# Pseudo kinds that only name damaged packets in error rows (OpenCSD's names).
_NOTSYNC, _BAD_SEQUENCE, _RESERVED = 16, 17, 18

_DATA_BITS = {StpKind.D4: 4, StpKind.D8: 8, StpKind.D16: 16, StpKind.D32: 32, StpKind.D64: 64}
_DATA_KINDS = frozenset(_DATA_BITS)
_TS_KINDS = _DATA_KINDS | {StpKind.NULL, StpKind.FLAG, StpKind.TRIG}
_VALUE_BITS = {
    **_DATA_BITS,
    StpKind.M8: 8,
    StpKind.MERR: 8,
    StpKind.C8: 8,
    StpKind.C16: 16,
    StpKind.GERR: 8,
    StpKind.TRIG: 8,
    StpKind.VERSION: 4,
    StpKind.FREQ: 32,
}

# Error codes of the decoder's error rows.
E_NOTSYNC, E_RESERVED, E_VERSION, E_TS_SIZE, E_ASYNC, E_TRUNCATED, E_TS_CODING, E_NO_ASYNC = range(
    1, 9
)
# A listing row, not an error: OpenCSD's NOTSYNC for one block of data in
# which it searched for an ASYNC (the stretch's error is E_NOTSYNC or
# E_NO_ASYNC, which are not listed).
E_NOTSYNC_BLOCK = 9


class StpError(ValueError):
    """Damaged STP data, with the byte offset."""

    def __init__(self, offset: int, message: str) -> None:
        super().__init__(f"offset {offset:#x}: {message}")
        self.offset = offset


@dataclass
class StpPacket:
    """One packet.  ``value``: the payload of a data packet, the master of
    M8, the channel (byte) of C8/C16, the version, the frequency, the
    error or trigger byte.  ``ts``: the full timestamp (None: no
    timestamp in the packet)."""

    kind: StpKind
    value: int = 0
    marker: bool = False
    ts: int | None = None


# ---------------------------------------------------------------------------
# Encoder


@njit(cache=True, _nrt=False)
def _gray(x):
    return x ^ (x >> np.uint64(1))


@njit(cache=True, _nrt=False)
def _ungray(g):
    g ^= g >> np.uint64(1)
    g ^= g >> np.uint64(2)
    g ^= g >> np.uint64(4)
    g ^= g >> np.uint64(8)
    g ^= g >> np.uint64(16)
    g ^= g >> np.uint64(32)
    return g


@njit(cache=True, inline="always", _nrt=False)
def _with_low_bits(x, upd, bits):
    """``x`` with its low ``bits`` bits replaced by those of ``upd``."""
    if bits == 64:
        return upd
    msk = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    return (x & ~msk) | (upd & msk)


@njit(cache=True)
def _put(out, q, v, n):
    """Write the low ``n`` nibbles of ``v``, most significant first."""
    for i in range(n - 1, -1, -1):
        out[q] = np.uint8((v >> np.uint64(4 * i)) & np.uint64(15))
        q += 1
    return q


@njit(cache=True)
def _encode(kind, value, marker, has_ts, ts):
    n = kind.shape[0]
    out = np.empty(36 * n + 2, np.uint8)
    q = 0
    cur = np.uint64(0)
    gray = False
    for i in range(n):
        k = kind[i]
        v = np.uint64(value[i])
        t = has_ts[i]
        m = marker[i]
        if k == 0:  # NULL
            if t:
                out[q] = 15
                out[q + 1] = 0
                out[q + 2] = 1
                q += 3
            else:
                out[q] = 0
                q += 1
        elif k == 1 or k == 2 or k == 3:  # M8 MERR C8
            out[q] = k
            q = _put(out, q + 1, v, 2)
        elif k == 4:  # C16
            out[q] = 15
            out[q + 1] = 3
            q = _put(out, q + 2, v, 4)
        elif k >= 5 and k <= 9:  # D4..D64
            nd = 1 if k == 5 else 1 << (k - 5)
            if k == 5:
                if m and t:
                    out[q] = 13
                    q += 1
                elif t:
                    out[q] = 15
                    out[q + 1] = 12
                    q += 2
                elif m:
                    out[q] = 15
                    out[q + 1] = 13
                    q += 2
                else:
                    out[q] = 12
                    q += 1
            else:
                b = k - 6  # 0..3 for D8..D64
                if m and t:
                    out[q] = 8 + b
                    q += 1
                elif t:
                    out[q] = 15
                    out[q + 1] = 4 + b
                    q += 2
                elif m:
                    out[q] = 15
                    out[q + 1] = 8 + b
                    q += 2
                else:
                    out[q] = 4 + b
                    q += 1
            q = _put(out, q, v, nd)
        elif k == 10:  # FLAG
            if t:
                out[q] = 14
                q += 1
            else:
                out[q] = 15
                out[q + 1] = 14
                q += 2
        elif k == 11:  # TRIG
            out[q] = 15
            out[q + 1] = 0
            out[q + 2] = 7 if t else 6
            q = _put(out, q + 3, v, 2)
        elif k == 12:  # VERSION
            out[q] = 15
            out[q + 1] = 0
            out[q + 2] = 0
            out[q + 3] = np.uint8(v)
            q += 4
            if v == 3:
                gray = False
            elif v == 4:
                gray = True
        elif k == 13:  # FREQ
            out[q] = 15
            out[q + 1] = 0
            out[q + 2] = 8
            q = _put(out, q + 3, v, 8)
        elif k == 14:  # ASYNC
            for j in range(21):
                out[q + j] = 15
            out[q + 21] = 0
            q += 22
        elif k == 15:  # GERR
            out[q] = 15
            out[q + 1] = 2
            q = _put(out, q + 2, v, 2)
        if t:
            new = np.uint64(ts[i])
            if gray:
                a = _gray(cur)
                b2 = _gray(new)
            else:
                a = cur
                b2 = new
            nn = 16
            for c in range(13):
                if (a >> np.uint64(4 * c)) == (b2 >> np.uint64(4 * c)):
                    nn = c
                    break
            if nn == 16 and (a >> np.uint64(56)) == (b2 >> np.uint64(56)):
                nn = 14
            out[q] = nn if nn <= 12 else (13 if nn == 14 else 14)
            q = _put(out, q + 1, b2, nn)
            cur = new
    if q & 1:
        out[q] = 0  # pad: a NULL
        q += 1
    pairs = out[:q].reshape(-1, 2)
    return (pairs[:, 0] | (pairs[:, 1] << np.uint8(4))).astype(np.uint8)


def _columns(packets: Iterable[StpPacket]):
    pk = list(packets)
    n = len(pk)
    kind = np.empty(n, np.uint8)
    value = np.empty(n, np.uint64)
    marker = np.zeros(n, np.bool_)
    has_ts = np.zeros(n, np.bool_)
    ts = np.zeros(n, np.uint64)
    for i, p in enumerate(pk):
        k = StpKind(p.kind)
        bits = _VALUE_BITS.get(k, 0)
        if not 0 <= p.value < 1 << bits:
            raise ValueError(f"packet {i}: {k.name} value {p.value:#x} does not fit {bits} bits")
        if k == StpKind.VERSION and p.value not in (3, 4):
            raise ValueError(f"packet {i}: VERSION {p.value}, CoreSight STM has 3 or 4")
        if p.marker and k not in _DATA_KINDS:
            raise ValueError(f"packet {i}: {k.name} has no marked form")
        if p.ts is not None:
            if k not in _TS_KINDS:
                raise ValueError(f"packet {i}: {k.name} has no timestamped form")
            if not 0 <= p.ts < 1 << 64:
                raise ValueError(f"packet {i}: timestamp {p.ts:#x} is not 64-bit")
            has_ts[i] = True
            ts[i] = p.ts
        kind[i], value[i], marker[i] = k, p.value, p.marker
    return kind, value, marker, has_ts, ts


def encode_stp(packets: Iterable[StpPacket]) -> bytes:
    """The bytes an STM emits for ``packets`` (a trailing odd nibble is
    padded with a NULL).  Timestamps are written as the shortest update of
    the previous one, Gray-coded after a VERSION 4 packet."""
    return _encode(*_columns(packets)).tobytes()


def encode_stp_columns(kind, value, marker, has_ts, ts) -> bytes:
    """:func:`encode_stp` for packets given as columns (no checking of
    the values' ranges): for generating long streams."""
    return _encode(
        np.asarray(kind, np.uint8),
        np.asarray(value, np.uint64),
        np.asarray(marker, np.bool_),
        np.asarray(has_ts, np.bool_),
        np.asarray(ts, np.uint64),
    ).tobytes()


# ---------------------------------------------------------------------------
# Decoder

# Headers by their nibbles in stream order (the module docstring's table):
# the packet kind, +M if marked, +TS if timestamped.  F and F0 lead on to
# one more nibble, FF to ASYNC's run of F; a header not here is reserved.
_HEADERS = """
    0 NULL  1 M8  2 MERR  3 C8  4 D8  5 D16  6 D32  7 D64
    8 D8+MTS  9 D16+MTS  A D32+MTS  B D64+MTS  C D4  D D4+MTS  E FLAG+TS
    F00 VERSION  F01 NULL+TS  F06 TRIG  F07 TRIG+TS  F08 FREQ  F2 GERR  F3 C16
    F4 D8+TS  F5 D16+TS  F6 D32+TS  F7 D64+TS  F8 D8+M  F9 D16+M  FA D32+M  FB D64+M
    FC D4+TS  FD D4+M  FE FLAG
"""


def _header_columns() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:data:`_HEADERS` for the compiled decoder, by row: 0-15 the first
    nibble, 16-31 F and the second, 32-47 F0 and the third.  Columns: the
    kind (-1: reserved), the data nibbles (the kind's value width), marked,
    timestamped."""
    kind = np.full(48, -1, np.int64)
    nibbles = np.zeros(48, np.int64)
    marked = np.zeros(48, np.bool_)
    timestamped = np.zeros(48, np.bool_)
    words = _HEADERS.split()
    for hdr, name in zip(words[::2], words[1::2], strict=True):
        row = 16 * (len(hdr) - 1) + int(hdr[-1], 16)
        k, _, flags = name.partition("+")
        kind[row] = StpKind[k]
        nibbles[row] = _VALUE_BITS.get(StpKind[k], 0) // 4
        marked[row] = "M" in flags
        timestamped[row] = "TS" in flags
    return kind, nibbles, marked, timestamped


_HEADER_KIND, _HEADER_NIBBLES, _HEADER_MARKED, _HEADER_TS = _header_columns()

# Sync tracking (OpenCSD's checkSyncNibble), on every nibble read: the run
# of F nibbles, whether one started, whether a sync was seen, the byte
# offset and nibble of the run's first F, relative to the nibble ``ctx``
# where the current packet (or search for sync) began.


@njit(cache=True, inline="always", _nrt=False)
def _rd(data, p, run, start, sync, soff, fnib, ctx):
    n = (data[p >> 1] >> ((p & 1) << 2)) & 15
    if n != 15:
        if start:
            if n == 0 and run >= 21:
                sync = True
                run = 21
            else:
                run = 0
                start = False
                sync = False
    else:
        run += 1
        if not start:
            start = True
            soff = (ctx + 1) // 2 + (p - ctx) // 2
            fnib = p
    return n, run, start, sync, soff, fnib


# The decoder's columns, allocated by the caller: one row a packet (as
# :class:`StpPackets` names them) and one row an error (``error_values``:
# what its message quotes; ``error_rows``: how many packets precede it).
_PACKET_COLUMNS = {
    "nibble": np.int64,
    "offset": np.int64,
    "kind": np.uint8,
    "master": np.uint8,
    "channel": np.uint16,
    "value": np.uint64,
    "marker": np.bool_,
    "has_ts": np.bool_,
    "ts": np.uint64,
    "ts_bits": np.uint8,
}
_ERROR_COLUMNS = {
    "error_nibbles": np.int64,
    "error_codes": np.uint8,
    "error_kinds": np.uint8,
    "error_markers": np.bool_,
    "error_values": np.int64,
    "error_rows": np.int64,
}


@njit(cache=True, inline="always", _nrt=False)
def _packet_row(cols, n, nib, off, kind, master, channel, value, marker, has_ts, ts, bits):
    """Write packet row ``n`` of the _PACKET_COLUMNS ``cols``; the row count."""
    c_nib, c_off, c_kind, c_master, c_channel, c_value, c_marker, c_has_ts, c_ts, c_bits = cols
    c_nib[n], c_off[n], c_kind[n], c_master[n], c_channel[n] = nib, off, kind, master, channel
    c_value[n], c_marker[n], c_has_ts[n], c_ts[n], c_bits[n] = value, marker, has_ts, ts, bits
    return n + 1


@njit(cache=True, _nrt=False)
def _error_row(cols, ne, nib, code, kind, marker, value, n):
    """Write error row ``ne`` of the _ERROR_COLUMNS ``cols``: ``code`` for
    the packet (or the search for sync) that began at nibble ``nib``, after
    ``n`` packets (its byte offset is that nibble's, OpenCSD's Idx); the
    error count."""
    c_nib, c_code, c_kind, c_marker, c_value, c_row = cols
    c_nib[ne], c_code[ne], c_kind[ne] = nib, code, kind
    c_marker[ne], c_value[ne], c_row[ne] = marker, value, n
    return ne + 1


@njit(cache=True, _nrt=False)
def _decode(data, resync, cols, ecols, blocks, st):
    """Packets into ``cols`` and errors into ``ecols``, from the decoder's
    state ``st`` (:func:`_new_state`; left where it stopped): their counts
    and whether the columns filled up before the stream ended."""
    N = data.shape[0] * 2
    cap = cols[0].shape[0]
    ecap = ecols[0].shape[0]
    run = st[0]
    sst = st[1] != 0
    syn = st[2] != 0
    soff = st[3]
    fnib = st[4]
    ctx = st[5]
    n = 0
    ne = 0
    p = st[6]
    synced = st[7] != 0
    cur_m = st[8]
    cur_c = st[9]
    cur_ts = np.uint64(st[10])
    coding = st[11]  # 0 unknown, 1 natural binary, 2 Gray
    coding_reported = st[12] != 0
    last = st[13]  # OpenCSD keeps the last packet type until the next is known
    overflow = False
    bi = st[14]  # the next block start (stream byte offsets, ascending)
    u0 = st[15]  # where the unsynchronised stretch began (nibble)
    while p < N or not synced:
        if n + 2 > cap or ne + 3 > ecap:
            overflow = True
            break
        if not synced:
            e = p
            ctx = e
            if u0 < 0:
                u0 = e
            # OpenCSD searches each block it is handed on its own, counting
            # on from the F nibbles the last one ended with
            cnt = run + (1 if syn else 0)
            while bi < blocks.shape[0] and 2 * blocks[bi] <= p:
                bi += 1
            lim = 2 * blocks[bi] if bi < blocks.shape[0] and 2 * blocks[bi] < N else N
            while p < lim and not syn:
                _, run, sst, syn, soff, fnib = _rd(data, p, run, sst, syn, soff, fnib, ctx)
                p += 1
                cnt += 1
            if not syn:
                if cnt > 0:
                    ne = _error_row(ecols, ne, e, E_NOTSYNC_BLOCK, _NOTSYNC, False, 0, n)
                if p < N:
                    continue
                if N > u0 or cnt > 0:
                    skipped = (N - u0) // 2
                    ne = _error_row(ecols, ne, u0, E_NO_ASYNC, _NOTSYNC, False, skipped, n)
                break
            if cnt > 22:
                ne = _error_row(ecols, ne, e, E_NOTSYNC_BLOCK, _NOTSYNC, False, 0, n)
            if p - 22 > u0:
                skipped = (p - 22 - u0) // 2
                ne = _error_row(ecols, ne, u0, E_NOTSYNC, _NOTSYNC, False, skipped, n)
            u0 = -1
            # placed at the first F of its run, as OpenCSD places it
            n = _packet_row(cols, n, fnib, soff, 14, cur_m, cur_c, 0, False, False, cur_ts, 0)
            run = 0
            sst = False
            syn = False
            synced = True
            last = 14
            continue
        # one packet from nibble p
        s = p
        ctx = s
        off = (s + 1) // 2
        k = -1
        mk = False
        wants_ts = False
        nd = 0
        err = 0
        errv = 0
        ptype = last  # what OpenCSD would call the packet if cut short
        h, run, sst, syn, soff, fnib = _rd(data, p, run, sst, syn, soff, fnib, ctx)
        p += 1
        row = h  # of the _HEADER_* columns
        while row == 15 or row == 16:  # F and F0 lead on to one more nibble
            if p >= N:
                err = E_TRUNCATED
                break
            x, run, sst, syn, soff, fnib = _rd(data, p, run, sst, syn, soff, fnib, ctx)
            p += 1
            row = (16 if row == 15 else 32) + x
        if row == 31:  # FF: ASYNC, or a bad one
            while True:
                if p >= N:
                    err = E_TRUNCATED
                    break
                x, run, sst, syn, soff, fnib = _rd(data, p, run, sst, syn, soff, fnib, ctx)
                p += 1
                if syn:
                    k = 14
                    run = 0
                    sst = False
                    syn = False
                    break
                if not sst:
                    err = E_ASYNC
                    errv = x
                    break
        if err == 0 and k < 0:
            k = _HEADER_KIND[row]
            if k < 0:
                err = E_RESERVED  # errv: its nibbles, the first lowest
                errv = 0x01F if row == 17 else 0x00F | ((row - 32) << 8)
            else:
                nd = _HEADER_NIBBLES[row]
                mk = _HEADER_MARKED[row]
                wants_ts = _HEADER_TS[row]
        if k >= 0:
            ptype = k
        v = np.uint64(0)
        ts_n = -1
        upd = np.uint64(0)
        if err == 0 and k != 14:
            if p + nd > N:
                err = E_TRUNCATED
            else:
                for _ in range(nd):
                    x, run, sst, syn, soff, fnib = _rd(data, p, run, sst, syn, soff, fnib, ctx)
                    v = (v << np.uint64(4)) | np.uint64(x)
                    p += 1
                if k == 12 and v != 3 and v != 4:
                    err = E_VERSION
                    errv = np.int64(v)
                elif wants_ts:
                    if p >= N:
                        err = E_TRUNCATED
                    else:
                        ln, run, sst, syn, soff, fnib = _rd(data, p, run, sst, syn, soff, fnib, ctx)
                        p += 1
                        if ln == 15:
                            err = E_TS_SIZE
                        else:
                            ts_n = 14 if ln == 13 else (16 if ln == 14 else ln)
                            if p + ts_n > N:
                                err = E_TRUNCATED
                            else:
                                for _ in range(ts_n):
                                    x, run, sst, syn, soff, fnib = _rd(
                                        data, p, run, sst, syn, soff, fnib, ctx
                                    )
                                    upd = (upd << np.uint64(4)) | np.uint64(x)
                                    p += 1
        if err != 0:
            ptype = _RESERVED if err == E_RESERVED else ptype
            ne = _error_row(ecols, ne, s, err, ptype, mk, errv, n)
            if err == E_TRUNCATED:
                break
            last = _RESERVED if err == E_RESERVED else _BAD_SEQUENCE
            if resync:
                synced = False
                run = 0
                sst = False
                syn = False
            continue
        bits = 0
        if ts_n >= 0:
            bits = 4 * ts_n
            if coding == 0 and not coding_reported:
                ne = _error_row(ecols, ne, s, E_TS_CODING, k, mk, 0, n)
                coding_reported = True
            if coding == 2:
                cur_ts = _ungray(_with_low_bits(_gray(cur_ts), upd, bits))
            else:
                cur_ts = _with_low_bits(cur_ts, upd, bits)
        if k == 1:
            cur_m = np.int64(v)
            cur_c = 0
        elif k == 2:
            cur_c = 0
        elif k == 3:
            cur_c = (cur_c & 0xFF00) | np.int64(v)
        elif k == 4:
            cur_c = np.int64(v)
        elif k == 15:
            cur_m = 0
            cur_c = 0
        elif k == 12:
            coding = 1 if v == 3 else 2
            cur_m = 0
            cur_c = 0
        n = _packet_row(cols, n, s, off, k, cur_m, cur_c, v, mk, ts_n >= 0, cur_ts, bits)
        last = k
    st[0], st[1], st[2], st[3], st[4], st[5] = run, sst, syn, soff, fnib, ctx
    st[6], st[7], st[8], st[9], st[10] = p if overflow else N, synced, cur_m, cur_c, cur_ts
    st[11], st[12], st[13], st[14], st[15] = coding, coding_reported, last, bi, u0
    return n, ne, overflow


def _new_state() -> np.ndarray:
    """:func:`_decode`'s state before the stream's first nibble."""
    st = np.zeros(16, np.int64)
    st[13] = _NOTSYNC
    st[15] = -1
    return st


_SIZE = np.array([0, 0, 0, 0, 0, 4, 8, 16, 32, 64, 0, 0, 0, 0, 0, 0], np.uint8)


def _name(kind: int, marker: bool = False, ts: bool = False) -> str:
    if kind == _NOTSYNC:
        return "NOTSYNC"
    if kind == _BAD_SEQUENCE:
        return "BAD_SEQUENCE"
    if kind == _RESERVED:
        return "RESERVED"
    k = StpKind(kind)
    name = k.name
    if k in _DATA_KINDS or k in (StpKind.FLAG, StpKind.TRIG):
        name += ("M" if marker else "") + ("TS" if ts else "")
    return name


# Error messages by code: ``value`` is the error row's value, ``name``
# the damaged packet's and ``header`` a reserved header's nibbles.
_MESSAGES = {
    E_NOTSYNC: "not synchronised: {value} bytes skipped up to the next ASYNC",
    E_NO_ASYNC: "not synchronised: no ASYNC in the last {value} bytes",
    E_RESERVED: "reserved STPv2 header {header}",
    E_VERSION: "VERSION {value}: not a CoreSight STM version (3 or 4)",
    E_TS_SIZE: "{name}: timestamp size nibble 0xF",
    E_ASYNC: "bad ASYNC sequence: nibble {value:#x} in the run of F",
    E_TRUNCATED: "stream ends inside a {name} packet",
    E_TS_CODING: "timestamp before any VERSION packet: coding unknown, read as natural binary",
}


def _message(code: int, kind: int, marker: bool, value: int) -> str:
    header = "F1" if value == 0x01F else f"F0{value >> 8:X}"
    return _MESSAGES[code].format(value=value, name=_name(kind, marker), header=header)


@dataclass
class StpPackets:
    """Decoded packets as columns.  ``offset``: OpenCSD's Idx of the
    packet; ``nibble``: its first nibble's position; ``size``: data bits
    (0 for non-data packets); ``ts``: the full timestamp after the packet
    (meaningful where ``has_ts``); ``ts_bits``: the bits it updated.
    ``errors``: (byte offset, message)."""

    offset: np.ndarray
    nibble: np.ndarray
    kind: np.ndarray
    master: np.ndarray
    channel: np.ndarray
    value: np.ndarray
    size: np.ndarray
    marker: np.ndarray
    has_ts: np.ndarray
    ts: np.ndarray
    ts_bits: np.ndarray
    errors: list[tuple[int, str]] = field(default_factory=list)
    # error rows, for the dump and for event assembly
    error_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    error_codes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    error_kinds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint8))
    error_markers: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    error_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: the nibble each error's offset was taken from (as ``nibble``)
    error_nibbles: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))

    def __len__(self) -> int:
        return int(self.kind.shape[0])

    def __getitem__(self, i: int) -> StpPacket:
        k = StpKind(int(self.kind[i]))
        return StpPacket(
            k, int(self.value[i]), bool(self.marker[i]), int(self.ts[i]) if self.has_ts[i] else None
        )

    def __iter__(self) -> Iterator[StpPacket]:
        for i in range(len(self)):
            yield self[i]


def _stream(data, blocks: Iterable[int] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The stream as bytes and its block starts after its first byte
    (sorted and unique; without np.unique, which imports numpy.ma)."""
    starts = np.sort(
        np.asarray(blocks if isinstance(blocks, np.ndarray) else list(blocks), np.int64)
    )
    starts = starts[np.concatenate((starts[:1] == starts[:1], starts[1:] != starts[:-1]))]
    buf = (
        np.frombuffer(data, np.uint8)
        if not isinstance(data, np.ndarray)
        else data.view(np.uint8).ravel()
    )
    return buf, starts[starts > 0]


def _packets(cols: tuple, n: int, ecols: tuple, ne: int) -> StpPackets:
    """The first ``n`` packet rows and ``ne`` error rows as packets."""
    # (views: the columns' rows past ``n`` were never written, so their
    # pages were never touched and cost no memory)
    rows = {name: c[:n] for name, c in zip(_PACKET_COLUMNS, cols, strict=True)}
    erows = {name: c[:ne].copy() for name, c in zip(_ERROR_COLUMNS, ecols, strict=True)}
    values = erows.pop("error_values")
    erows["error_offsets"] = (erows["error_nibbles"] + 1) // 2
    errors = [
        (off, _message(code, kind, marker, value))
        for off, code, kind, marker, value in zip(
            erows["error_offsets"].tolist(),
            erows["error_codes"].tolist(),
            erows["error_kinds"].tolist(),
            erows["error_markers"].tolist(),
            values.tolist(),
            strict=True,
        )
        if code != E_NOTSYNC_BLOCK
    ]
    return StpPackets(**rows, size=_SIZE[rows["kind"]], errors=errors, **erows)


def decode_stp(
    data,
    *,
    resync: bool = True,
    strict: bool = False,
    blocks: Iterable[int] | np.ndarray = (),
) -> StpPackets:
    """Decode an STP byte stream (bytes or a uint8 buffer).  Damage never
    raises unless ``strict`` (then :class:`StpError` at the first error).
    ``blocks``: stream offsets where the blocks OpenCSD is handed the data
    in begin (runs of one ID in formatter frames, or the reads of a raw
    file): while unsynchronised, OpenCSD lists a NOTSYNC for each block,
    and so does the dump (the error is reported once)."""
    buf, starts = _stream(data, blocks)
    cap = buf.shape[0] + 64
    ecap = 64
    while True:
        cols = tuple(np.empty(cap, dt) for dt in _PACKET_COLUMNS.values())
        ecols = tuple(np.empty(ecap, dt) for dt in _ERROR_COLUMNS.values())
        n, ne, full = _decode(buf, bool(resync), cols, ecols, starts, _new_state())
        if not full:
            break
        cap = 2 * buf.shape[0] + 64
        ecap = max(ecap * 4, buf.shape[0] // 4 + 64)
    out = _packets(cols, n, ecols, ne)
    if strict and out.errors:
        raise StpError(*out.errors[0])
    return out


def stp_windows(
    data,
    *,
    resync: bool = True,
    blocks: Iterable[int] | np.ndarray = (),
    rows: int = 1 << 16,
) -> Iterator[StpPackets]:
    """:func:`decode_stp`'s packets, fewer than ``rows`` at a time (the
    decoder carries on from one window to the next; each window's damage
    with it, its ``error_rows`` counted in the window): a stream of any
    length is decoded in the memory of one window."""
    buf, starts = _stream(data, blocks)
    st = _new_state()
    rows = max(rows, 8)
    while True:
        cols = tuple(np.empty(rows, dt) for dt in _PACKET_COLUMNS.values())
        ecols = tuple(np.empty(rows, dt) for dt in _ERROR_COLUMNS.values())
        n, ne, full = _decode(buf, bool(resync), cols, ecols, starts, st)
        yield _packets(cols, n, ecols, ne)
        if not full:
            return


# ---------------------------------------------------------------------------
# Dump


# The dump's text for a packet kind (OpenCSD's); ``{flags}``: where it
# says the packet's marker and timestamp.


_ERROR_TEXT = {
    E_NOTSYNC_BLOCK: "NOTSYNC:STM not synchronised",
    E_RESERVED: "RESERVED:Reserved Packet Header",
    E_TRUNCATED: "INCOMPLETE_EOT:Incomplete packet flushed at end of trace",
}


def error_lines(packets: StpPackets, trace_id: int = 0) -> list[tuple[int, int, str]]:
    """The lines trc_pkt_lister prints for the damage in ``packets``: the
    packet row each comes before, its index and its text."""
    out = []
    for j, (row, code) in enumerate(zip(packets.error_rows.tolist(),
                                        packets.error_codes.tolist(), strict=True)):  # fmt: skip
        if code in (E_TS_CODING, E_NOTSYNC, E_NO_ASYNC):  # said by a block row
            continue
        text = _ERROR_TEXT.get(code, "BAD_SEQUENCE:Invalid sequence in packet")
        if code in (E_TRUNCATED, E_VERSION, E_TS_SIZE, E_ASYNC):
            text += f"[{_name(int(packets.error_kinds[j]), bool(packets.error_markers[j]))}]"
        at = int(packets.error_offsets[j])
        out.append((int(row), at, f"Idx:{at}; ID:{trace_id:x};\t{text}"))
    return out


def stp_dump_lines(data, packets: StpPackets | None = None, trace_id: int = 0) -> Iterator[str]:
    """Lines as OpenCSD's trc_pkt_lister prints an STM source's packets,
    damaged ones included (decodes ``data`` unless ``packets`` is given;
    decode with ``resync=False`` to follow OpenCSD through damage).  The
    text is written by a compiled loop
    (:func:`hwtrace.hwevents.stptext.stp_listing`)."""
    from .stptext import stp_listing

    if packets is None:
        packets = decode_stp(data)
    text, _, _ = stp_listing(packets, trace_id)
    yield from bytes(text).decode().split("\n")[:-1]


# ---------------------------------------------------------------------------
# Events


@dataclass
class StpEvents:
    """Software events: ``master``, ``channel``, ``ts`` (of the event's
    first timestamped packet, else the running timestamp), ``has_ts``,
    ``first`` (packet row where it starts), ``offset``/``length`` of its
    bytes in ``payload``, ``complete`` (False: cut by damage, a master or
    global error, or the end of the stream).  ``partial``: incomplete
    events; ``lost``: MERR and GERR packets (trace the STM dropped)."""

    master: np.ndarray
    channel: np.ndarray
    ts: np.ndarray
    has_ts: np.ndarray
    first: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    complete: np.ndarray
    payload: bytes
    partial: int = 0
    lost: int = 0

    def __len__(self) -> int:
        return int(self.master.shape[0])

    def data(self, i: int) -> bytes:
        o = int(self.offset[i])
        return self.payload[o : o + int(self.length[i])]


@njit(cache=True, _nrt=False)
def _assemble(kind, master, channel, marker, has_ts, ts, err_rows, by_marker, last_ts, table,
              room, ev):  # fmt: skip
    """Packets into events: ``ev`` (master, channel, time, has time, first
    packet, bytes, complete, still open at the end; ``n + 1`` rows) and
    each packet's event in ``room``'s last column (-1: none).
    ``last_ts``: the timestamp before the first packet.  ``table``: the
    (master, channel) hash's keys and values; ``room``: per dense channel
    its key, open event and the master's and the global error epoch then,
    and the packets' events.  Returns (events, MERR/GERR packets), or (-1,
    0) when the hash table is too small: the caller gives a larger one.
    (Allocates nothing: the native library holds it.)"""
    n = kind.shape[0]
    hkey, hval = table
    size = hkey.shape[0]
    for j in range(size):
        hkey[j] = -1
    dkey, open_ev, open_me, open_ge, m_epoch, pkt_ev = room
    for j in range(256):
        m_epoch[j] = 0  # MERR: the master's open events end
    for j in range(n):
        pkt_ev[j] = -1
    ev_m, ev_c, ev_ts, ev_has, ev_first, ev_len, ev_done, ev_open = ev
    for j in range(n + 1):
        ev_has[j] = False
        ev_len[j] = 0
        ev_done[j] = False
        ev_open[j] = False
    nk = 0
    last_key, last_d = np.int64(-1), 0  # the channel of the last data packet
    g_epoch = 0  # GERR, damage: every open event ends
    ne = 0
    lost = 0
    ei = 0
    for i in range(n):
        while ei < err_rows.shape[0] and err_rows[ei] <= i:
            g_epoch += 1
            ei += 1
        k = kind[i]
        if has_ts[i]:
            last_ts = ts[i]
        if k == 2:  # MERR: this master lost trace
            lost += 1
            m_epoch[master[i]] += 1
            continue
        if k == 15:  # GERR
            lost += 1
            g_epoch += 1
            continue
        is_data = k >= 5 and k <= 9
        if not is_data and k != 10:
            continue
        m = master[i]
        key = (np.int64(m) << 16) | np.int64(channel[i])
        if key == last_key:
            d = last_d  # (a message's packets come one after another)
        else:
            h = ((key * 0x9E3779B1) >> 7) & (size - 1)
            while hkey[h] != key and hkey[h] != -1:
                h = (h + 1) & (size - 1)
            if hkey[h] == -1:
                hkey[h] = key
                hval[h] = nk
                dkey[nk] = key
                open_ev[nk] = -1
                nk += 1
                d = nk - 1
                if 2 * nk > size:
                    return -1, 0  # kept half empty: a larger table
            else:
                d = hval[h]
            last_key, last_d = key, d
        e = open_ev[d]
        if e >= 0 and (open_me[d] != m_epoch[m] or open_ge[d] != g_epoch):
            e = -1  # cut by an error since it opened
        if is_data:
            if e < 0 or ((has_ts[i] or marker[i]) and not by_marker):
                e = ne
                ne += 1
                open_ev[d], open_me[d], open_ge[d] = e, m_epoch[m], g_epoch
                ev_m[e] = m
                ev_c[e] = channel[i]
                ev_first[e] = i
                ev_ts[e] = last_ts
            if has_ts[i] and not ev_has[e]:
                ev_has[e] = True
                ev_ts[e] = ts[i]
            pkt_ev[i] = e
            ev_len[e] += 1 if k == 5 else 1 << (k - 6)
            if by_marker and marker[i]:
                ev_done[e] = True
                open_ev[d] = -1
        elif not by_marker and e >= 0:  # FLAG ends the message
            ev_done[e] = True
            open_ev[d] = -1
    while ei < err_rows.shape[0]:
        g_epoch += 1
        ei += 1
    for d in range(nk):
        e = open_ev[d]
        if e >= 0 and open_me[d] == m_epoch[dkey[d] >> 16] and open_ge[d] == g_epoch:
            ev_open[e] = True
    return ne, lost


@njit(cache=True, _nrt=False)
def _payloads(kind, value, pkt_ev, fill, blob):
    """The events' bytes into ``blob``: each event's from ``fill[e]`` on,
    little-endian (the bytes the program stored)."""
    for i in range(kind.shape[0]):
        e = pkt_ev[i]
        if e < 0:
            continue
        k = kind[i]
        v = value[i]
        nb = 1 if k == 5 else 1 << (k - 6)
        q = fill[e]
        for b in range(nb):
            blob[q + b] = np.uint8((v >> np.uint64(8 * b)) & np.uint64(0xFF))
        fill[e] = q + nb


def stp_events(packets: StpPackets, convention: str = "flag") -> StpEvents:
    """Software events from decoded packets, per (master, channel).

    ``convention="flag"`` (the Linux STM framework's p_basic and p_sys-t
    framing): a data packet with a timestamp or a marker starts an event,
    a FLAG ends it.
    ``convention="marker"``: a marked data packet ends an event.  A data
    packet with no open event on its channel opens one (its start was
    lost, or never timestamped: ``has_ts`` tells).  An event still open at
    the end, or when a MERR (its master), a GERR or damaged data comes,
    is incomplete.  D4 payloads count as one byte (the nibble); wider
    ones as their bytes, little-endian (the bytes the program stored)."""
    return _events(packets, convention, 0)[0]


def _events(packets: StpPackets, convention: str,
            last_ts: int) -> tuple[StpEvents, int, np.ndarray]:  # fmt: skip
    """:func:`stp_events` after the timestamp ``last_ts``, the first of the
    events still open at the end (``len``: none) and each packet's event
    (-1: none)."""
    if convention not in ("flag", "marker"):
        raise ValueError(f"convention {convention!r}: 'flag' or 'marker'")
    gaps = np.sort(
        packets.error_rows[
            (packets.error_codes != E_TS_CODING) & (packets.error_codes != E_NOTSYNC_BLOCK)
        ].astype(np.int64)
    )
    n = len(packets)
    room = (np.empty(n + 1, np.int64), np.empty(n + 1, np.int64), np.empty(n + 1, np.int64),
            np.empty(n + 1, np.int64), np.empty(256, np.int64), np.empty(n, np.int64))  # fmt: skip
    ev = (np.empty(n + 1, np.uint8), np.empty(n + 1, np.uint16), np.empty(n + 1, np.uint64),
          np.empty(n + 1, np.bool_), np.empty(n + 1, np.int64), np.empty(n + 1, np.int64),
          np.empty(n + 1, np.bool_), np.empty(n + 1, np.bool_))  # fmt: skip
    size = 1024
    while True:
        table = (np.empty(size, np.int64), np.empty(size, np.int64))
        ne, lost = _assemble(packets.kind, packets.master, packets.channel, packets.marker,
                             packets.has_ts, packets.ts, gaps, convention == "marker",
                             np.uint64(last_ts), table, room, ev)  # fmt: skip
        if ne >= 0:
            break
        size *= 2
    m, c, ts, has, first, length, done, still_open = (col[:ne] for col in ev)
    off = np.zeros(ne + 1, np.int64)
    np.cumsum(length, out=off[1:])
    blob = np.empty(int(off[-1]), np.uint8)
    _payloads(packets.kind, packets.value, room[5], off[:-1].copy(), blob)
    off = off[:-1]
    events = StpEvents(
        master=m.copy(),
        channel=c.copy(),
        ts=ts.copy(),
        has_ts=has.copy(),
        first=first.copy(),
        offset=off,
        length=length.copy(),
        complete=done.copy(),
        payload=blob.tobytes(),
        partial=int(len(done) - done.sum()),
        lost=int(lost),
    )
    opened = np.flatnonzero(still_open)
    return events, int(opened[0]) if opened.shape[0] else ne, room[5]


#: Packets of open events :func:`stp_event_windows` carries from one window
#: to the next at most.
CARRIED_MOST = 1 << 18

# StpPackets' columns a row a packet, and a row a piece of damage.
_ROW_FIELDS = (*_PACKET_COLUMNS, "size")
_DAMAGE_FIELDS = ("error_rows", "error_codes", "error_kinds", "error_markers", "error_offsets",
                  "error_nibbles")  # fmt: skip


def _first_events(ev: StpEvents, k: int, lost: int) -> StpEvents:
    """The first ``k`` of ``ev``, with ``lost`` MERR and GERR packets."""
    end = int(ev.offset[k]) if k < len(ev) else len(ev.payload)
    done = ev.complete[:k]
    return StpEvents(ev.master[:k], ev.channel[:k], ev.ts[:k], ev.has_ts[:k], ev.first[:k],
                     ev.offset[:k], ev.length[:k], done, ev.payload[:end],
                     int(k - done.sum()), lost)  # fmt: skip


def _rows_from(packets: StpPackets, start: int, inert: np.ndarray) -> StpPackets:
    """The packets from row ``start`` on, with the damage among them
    (not its messages: those went out with the packets' window); those
    of them ``inert`` says as NULL packets (their time kept)."""
    keep = packets.error_rows >= start
    rows = {name: getattr(packets, name)[start:] for name in _ROW_FIELDS}
    rows["kind"] = np.where(inert, np.uint8(StpKind.NULL), rows["kind"])
    damage = {name: getattr(packets, name)[keep] for name in _DAMAGE_FIELDS}
    damage["error_rows"] = damage["error_rows"] - start
    return StpPackets(**rows, **damage)


def _joined_packets(parts: list[StpPackets]) -> StpPackets:
    """The packets of ``parts`` one after another (with the last one's
    messages)."""
    rows = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _ROW_FIELDS}
    damage = {name: np.concatenate([getattr(p, name) for p in parts]) for name in _DAMAGE_FIELDS}
    lengths = np.array([len(p) for p in parts], np.int64)
    errors = np.array([len(p.error_rows) for p in parts], np.int64)
    damage["error_rows"] += np.repeat(np.cumsum(lengths) - lengths, errors)
    return StpPackets(**rows, **damage, errors=parts[-1].errors)


def stp_event_windows(
    windows: Iterable[StpPackets], convention: str = "flag"
) -> Iterator[tuple[StpPackets, StpEvents]]:
    """:func:`stp_events` of the windows of packets :func:`stp_windows`
    gives, a piece at a time, in order: each piece's packets and the
    events that start among them (``first`` counts in those packets; a
    packet of an event an earlier piece gave is NULL there).  An
    event still open at a window's end waits, with the packets from its
    start on, for the next window: the events are those of the whole
    stream, in the memory of a window and the open events' packets.
    ``lost`` counts each MERR and GERR packet once.  (When more than
    :data:`CARRIED_MOST` packets wait, a channel that never ends its
    event, the rest of the stream is one piece: assembled once, not again
    at each window.)"""
    carried: StpPackets | None = None
    backlog: list[StpPackets] = []
    last_ts = 0
    for pk in windows:
        if backlog:
            backlog.append(pk)
            continue
        work = pk if carried is None else _joined_packets([carried, pk])
        ev, first_open, packet_event = _events(work, convention, last_ts)
        cut = int(ev.first[first_open]) if first_open < len(ev) else len(work)
        stamped = np.flatnonzero(work.has_ts[:cut])
        if stamped.shape[0]:
            last_ts = int(work.ts[stamped[-1]])  # (the time the next piece starts at)
        if first_open == len(ev):
            carried = None
            yield work, ev
            continue
        # (the packets after the cut that belong to events ending before the
        # window's end, which go out now, are no one's when assembled again)
        after = packet_event[cut:]
        carried = _rows_from(work, cut, (after >= 0) & (after < first_open))
        if len(carried) > CARRIED_MOST:
            backlog = [carried]
        later = int(
            np.count_nonzero((carried.kind == StpKind.MERR) | (carried.kind == StpKind.GERR))
        )
        yield work, _first_events(ev, first_open, ev.lost - later)
    if backlog:
        carried = _joined_packets(backlog)
    if carried is not None:
        yield carried, _events(carried, convention, last_ts)[0]
