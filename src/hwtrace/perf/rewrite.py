"""Writing a filtered copy of a perf.data.

:func:`write_subset` writes a perf.data that is its input without some
records: the header, the event ids and attrs as they are, the data section
without the dropped records, then the feature sections, in file mode with
the data size and the feature table updated and the AUXTRACE feature's
record offsets moved by the bytes dropped before each record (perf finds
the AUXTRACE records through that index).  Pipe mode has no index: its
16-byte header and the records kept.

Records are copied straight from the memory-mapped input (a compiled gather
into one bounded buffer; larger records written from the mapping itself),
so memory does not grow with the file.  ``hwtrace filter -o out.data`` uses
it to keep the samples a filter accepts and every other record.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

import numpy as np
from numba import njit

from ..pt.packets import release
from .data import PerfData, PerfDataError
from .features import Feature, pack_feature, parse_feature

__all__ = ["write_subset"]

# Bytes gathered per write: records are copied into one buffer this large.
CHUNK_BYTES = 1 << 23
# Records indexed per step (the keep mask and the offsets of one step).
CHUNK_ROWS = 1 << 16


@njit(cache=True)
def _gather(buf, starts, lengths, first, out):
    """Copy records ``first..`` of ``starts``/``lengths`` from ``buf`` into
    ``out`` while they fit; returns (records copied, bytes)."""
    p = 0
    k = first
    while k < starts.shape[0]:
        n = lengths[k]
        if p + n > out.shape[0]:
            break
        s = starts[k]
        out[p : p + n] = buf[s : s + n]
        p += n
        k += 1
    return k - first, p


def _write_records(
    data: PerfData, keep: np.ndarray, f: BinaryIO, chunk_bytes: int, chunk_rows: int
) -> tuple[int, int]:
    """Append the records whose ``keep`` is set to ``f``, in file order;
    returns (records, bytes) written."""
    r = data.records
    buf = data.buf
    out = np.empty(chunk_bytes, np.uint8)
    n_records = n_bytes = 0
    for lo in range(0, keep.shape[0], chunk_rows):
        rows = lo + np.flatnonzero(keep[lo : lo + chunk_rows])
        starts = r["offset"][rows].astype(np.int64)
        lengths = r["size"][rows].astype(np.int64) + r["payload"][rows]
        k = 0
        while k < rows.shape[0]:
            done, used = _gather(buf, starts, lengths, k, out)
            if done:
                f.write(out[:used].data)
            else:  # one record larger than the buffer: from the mapping
                s, n = int(starts[k]), int(lengths[k])
                f.write(buf[s : s + n].data)
                used, done = n, 1
            n_bytes += used
            k += done
        n_records += rows.shape[0]
        if rows.shape[0]:
            # The input pages copied are not needed again.
            release(buf, int(r["offset"][lo]), int(starts[-1] + lengths[-1]))
    return n_records, n_bytes


def _moved_auxtrace(data: PerfData, drop: np.ndarray, raw: bytes) -> bytes:
    """The AUXTRACE feature with each record offset moved back by the bytes
    of the dropped records before it."""
    r = data.records
    drop = np.sort(drop)
    dropped_at = r["offset"][drop].astype(np.int64)
    dropped_len = np.cumsum(r["size"][drop].astype(np.int64) + r["payload"][drop])
    moved = []
    for offset, size in parse_feature(Feature.AUXTRACE, raw):
        k = int(np.searchsorted(dropped_at, offset))
        moved.append((offset - (int(dropped_len[k - 1]) if k else 0), size))
    return pack_feature(Feature.AUXTRACE, moved)


def write_subset(
    data: PerfData,
    out: str | os.PathLike[str],
    drop: np.ndarray,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[int, int]:
    """Write ``out``: ``data`` without the records at rows ``drop`` (of
    ``data.records``), everything else as it is (see the module doc).
    Returns (records, bytes) written to the data section.

    Raises :class:`~hwtrace.perf.data.PerfDataError` for a file layout this
    cannot rewrite (attrs after the data section).
    """
    n = data.records["offset"].shape[0]
    keep = np.ones(n, np.bool_)
    keep[drop] = False
    if data.pipe:
        with open(out, "wb") as f:
            f.write(data.buf[:16].data)
            return _write_records(data, keep, f, chunk_bytes, chunk_rows)
    h = data.header
    if h.attrs_offset + h.attrs_size > h.data_offset:
        raise PerfDataError(data.path, 24, "attrs after the data section: layout not supported")
    buf = data.buf
    features = sorted(data.feature_sections)
    sections: list[bytes] = []
    for feat in features:
        off, size = data.feature_sections[feat]
        raw = bytes(buf[off : off + size])
        if feat == Feature.AUXTRACE:
            raw = _moved_auxtrace(data, np.flatnonzero(~keep), raw)
        sections.append(raw)
    with open(out, "wb") as f:
        f.write(bytes(h.size))  # the header, once the data size is known
        f.write(buf[h.size : h.data_offset].data)
        records, size = _write_records(data, keep, f, chunk_bytes, chunk_rows)
        pos = h.data_offset + size + 16 * len(features)
        table = b""
        for s in sections:
            table += struct.pack("<QQ", pos, len(s))
            pos += len(s)
        f.write(table)
        for s in sections:
            f.write(s)
        header = bytearray(bytes(buf[: h.size]))
        struct.pack_into("<Q", header, 48, size)  # data.size
        f.seek(0)
        f.write(header)
    return records, size
