"""Decoding only some kinds of packets: a scan of the stream that puts the
packets of the chosen kinds into columns and skips the others (TNT-8 and
PAD without a call), for analyses that read a few kinds (VM analysis:
PIP, VMCS and timing; software events: PTW, FUP and timing) faster than
a full decode.  Packets, offsets and errors are the packet decoder's."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from .. import aot
from . import _loops as PK
from .config import PtConfig
from .kinds import Kind
from .packets import ColumnBuffers, PacketTable, packet_errata, psb_chunks
from .timing import TimeBuffers, TimeColumns, estimate_time, new_time_state

__all__ = ["SELECTED_TYPES", "TIMING_KINDS", "decode_selected", "kind_mask", "timed_chunks"]

# What the time model needs.
TIMING_KINDS = (Kind.PSB, Kind.PSBEND, Kind.OVF, Kind.TSC, Kind.TMA, Kind.MTC, Kind.CYC, Kind.CBR)


# The columns decode_selected fills: offset, kind, a, b, c.
SELECTED_TYPES = (np.int64, np.uint8, np.uint64, np.uint32, np.uint8)


def kind_mask(kinds: Iterable[int]) -> np.ndarray:
    """A mask for :func:`decode_selected` (the timing kinds always in)."""
    keep = np.zeros(256, np.bool_)
    for k in (*TIMING_KINDS, *kinds):
        keep[int(k)] = True
    return keep


@aot.njit(cache=True)
def _scan(buf, start, end, errata, keep, off, kind, a, b, c, e_off, e_code, e_idx):
    """The packets of ``buf[start:end]`` whose kind ``keep`` marks, as
    columns, skipping the others (TNT and PAD without a call); a decode
    error is recorded and decoding goes on at the next PSB.  Returns (rows,
    errors), or (-1, 0) when the columns are too small."""
    decode_packet, sync_forward = PK.decode_packet, PK.sync_forward
    pos = start
    n = 0
    ne = 0
    in_block = PK.BLOCK_NONE
    while pos < end:
        b0 = buf[pos]
        if in_block == PK.BLOCK_NONE and (b0 == 0 or ((b0 & 1) == 0 and b0 > 2)):
            pos += 1  # PAD, TNT-8
            continue
        size, k, pa, pb, pc = decode_packet(buf, pos, end, in_block, errata)
        if size <= 0:
            if ne < e_off.shape[0]:
                e_off[ne] = pos
                e_code[ne] = -k
                e_idx[ne] = n
            ne += 1
            nxt = sync_forward(buf, pos + 1, start, end)
            if nxt < 0:
                break
            pos = nxt
            in_block = PK.BLOCK_NONE
            continue
        if keep[k]:
            if n >= off.shape[0]:
                return -1, 0
            off[n] = pos
            kind[n] = k
            a[n] = pa
            b[n] = np.uint32(pb)
            c[n] = np.uint8(pc)
            n += 1
        in_block = PK.block_after(k, pb, in_block)
        pos += size
    return n, ne


def decode_selected(
    buf: np.ndarray,
    start: int,
    end: int,
    keep: np.ndarray,
    errata: int = 0,
    buffers: ColumnBuffers | None = None,
) -> PacketTable:
    """The packets of ``buf[start:end]`` whose kinds ``keep`` marks
    (:func:`kind_mask`), as a table; decode errors recorded, decoding
    going on at the next PSB.  With ``buffers`` (of :data:`SELECTED_TYPES`)
    the table's columns are views of them, valid until their next use: a
    stream read chunk by chunk then writes every chunk into the memory of
    the last, not into fresh pages."""
    # A kept packet takes two bytes or more but for CYC (one): room for
    # every other byte at first, for every byte when that was not enough.
    # (Rows past those written are never read: the columns need no zeros,
    # which for a large array glibc may write all of.)
    cap = (end - start) // 2 + 64
    while True:
        if buffers is not None:
            cols = buffers.take(cap)
        else:
            cols = tuple(np.empty(cap, t) for t in SELECTED_TYPES)
        errs = (np.zeros(256, np.int64), np.zeros(256, np.int8), np.zeros(256, np.int64))
        n, ne = _scan(buf, start, end, errata, keep, *cols, *errs)
        if n >= 0 and ne <= 256:
            break
        cap = end - start + 64 if n < 0 else cap
        if ne > 256:
            errs = tuple(np.zeros(ne, e.dtype) for e in errs)
            n, ne = _scan(buf, start, end, errata, keep, *cols, *errs)
            if n >= 0:
                break
    off, kind, a, b, c = (x[:n] for x in cols)
    table = PacketTable(off, kind, np.zeros(n, np.uint8), a, b, c,
                        err_offset=errs[0][:ne], err_code=errs[1][:ne], err_index=errs[2][:ne])  # fmt: skip
    return table


def timed_chunks(
    buf: np.ndarray, keep: np.ndarray, config: PtConfig, chunk_bytes: int
) -> Iterator[tuple[int, int, PacketTable, TimeColumns]]:
    """Each PSB-aligned chunk of ``buf`` (``(start, end, table, times)``):
    its packets of the kinds ``keep`` marks and their times, the time
    model carrying over from chunk to chunk.  A chunk's columns are views
    of the memory of the last one's, valid until the next chunk: fresh
    memory costs more than decoding into it."""
    tstate = new_time_state()
    errata = packet_errata(config)
    packet_buffers, time_buffers = ColumnBuffers(SELECTED_TYPES), TimeBuffers()
    for start, end in psb_chunks(buf, chunk_bytes):
        table = decode_selected(buf, start, end, keep, errata, packet_buffers)
        times = estimate_time(table, config, state=tstate, buffers=time_buffers, fcr=False)
        yield start, end, table, times
