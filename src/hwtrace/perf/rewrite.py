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

import numpy as np

from .. import aot
from ..pt.packets import release
from .data import PerfData, PerfDataError
from .features import Feature, pack_feature, parse_feature
from .records import RecordType
from .writer import write_feature_sections

__all__ = ["SubsetWriter", "insert_records", "write_subset"]

# Bytes gathered per write: records are copied into one buffer this large.
CHUNK_BYTES = 1 << 23
# Records indexed per step (the keep mask and the offsets of one step).
CHUNK_ROWS = 1 << 16


@aot.njit(cache=True, _nrt=False)
def _gather(buf, starts, lengths, first, out):
    """Copy records ``first..`` of ``starts``/``lengths`` from ``buf`` into
    ``out`` while they fit; returns (records copied, bytes).  (A loop, not
    a slice assignment: numba's may allocate, which the native library
    cannot.)"""
    p = 0
    k = first
    while k < starts.shape[0]:
        n = lengths[k]
        if p + n > out.shape[0]:
            break
        s = starts[k]
        for q in range(n):
            out[p + q] = buf[s + q]
        p += n
        k += 1
    return k - first, p


class SubsetWriter:
    """Writes ``out``: ``data`` without some records, given a range of
    records at a time, in order (:meth:`add`), so the caller need not know
    every record to drop before writing starts; :meth:`close` (or leaving a
    ``with`` block) writes the rest and the header.  Raises
    :class:`~hwtrace.perf.data.PerfDataError` for a layout this cannot
    rewrite (attrs after the data section)."""

    def __init__(
        self,
        data: PerfData,
        out: str | os.PathLike[str],
        *,
        chunk_bytes: int = CHUNK_BYTES,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        h = data.header
        if not data.pipe and h.attrs_offset + h.attrs_size > h.data_offset:
            raise PerfDataError(data.path, 24, "attrs after the data section: layout not supported")
        self.data, self.chunk_bytes, self.chunk_rows = data, chunk_bytes, chunk_rows
        self.n = data.records["offset"].shape[0]
        self.next = 0  # the first record not given yet
        self.records = 0  # records written
        self.size = 0  # bytes written to the data section
        self.dropped = 0  # bytes of the records dropped so far
        self._buf = np.empty(chunk_bytes, np.uint8)
        # The AUXTRACE index: each entry's record offset, and how far it moves.
        self.aux: list[tuple[int, int]] = []
        raw = data.raw_features.get(int(Feature.AUXTRACE)) if not data.pipe else None
        if raw is not None and int(Feature.AUXTRACE) in data.feature_sections:
            self.aux = parse_feature(Feature.AUXTRACE, raw)
        self._aux_at = np.array([o for o, _ in self.aux], np.int64)
        self._aux_shift = np.zeros(len(self.aux), np.int64)
        self._aux_known = np.zeros(len(self.aux), np.bool_)
        if self.n:  # entries before the first record do not move
            self._aux_known[self._aux_at < int(data.records["offset"][0])] = True
        # Each entry's AUXTRACE record (its row; -1: none there).
        r = data.records
        aux_rows = np.flatnonzero(r["type"] == RecordType.AUXTRACE)
        row_of = dict(zip(r["offset"][aux_rows].tolist(), aux_rows.tolist(), strict=True))
        self._aux_row = np.array([row_of.get(o, -1) for o, _ in self.aux], np.int64)
        # The records decompressed from COMPRESSED ones are written as
        # they are, the COMPRESSED records not (the output is not compressed).
        side = data.decompressed_at
        self._inserted = (
            r["offset"] >= side if side is not None else np.zeros(self.n, np.bool_)
        )  # fmt: skip
        self._packed = r["type"] == RecordType.COMPRESSED
        self.f = open(out, "wb")
        if data.pipe:
            self.f.write(data.buf[:16].data)
        else:
            self.f.write(bytes(h.size))  # the header, once the data size is known
            self.f.write(data.buf[h.size : h.data_offset].data)
        self.closed = False

    def add(self, stop: int, drop: np.ndarray) -> None:
        """Records up to row ``stop`` (from where the last call ended),
        without those at rows ``drop``."""
        r = self.data.records
        start, self.next = self.next, stop
        keep = ~self._packed[start:stop]
        keep[np.asarray(drop, np.int64) - start] = False
        length = r["size"][start:stop].astype(np.int64) + r["payload"][start:stop]
        # Bytes each record takes out of the file's data (dropped) or adds
        # to it (decompressed, written); the index entries after it move
        # by their sum.
        inserted = self._inserted[start:stop]
        moved = np.where(inserted, np.where(keep, -length, 0), np.where(keep, 0, length))
        before = np.concatenate([[0], np.cumsum(moved)])
        if self.aux and start < stop:
            inside = np.flatnonzero((self._aux_row >= start) & (self._aux_row < stop))
            self._aux_shift[inside] = self.dropped + before[self._aux_row[inside] - start]
            self._aux_known[inside] = True
        self.dropped += int(before[-1])
        self._write(start, keep)

    def insert(self, records: bytes) -> None:
        """Write ready-made ``records`` (whole records, sample_id trailers
        included) here, between the records given so far and the next ones;
        index entries after them move by their size."""
        self.f.write(records)
        self.size += len(records)
        self.dropped -= len(records)  # a negative drop: later offsets move up

    def _write(self, start: int, keep: np.ndarray) -> None:
        """Append the records ``start + i`` whose ``keep[i]`` is set."""
        r = self.data.records
        buf, out, f = self.data.buf, self._buf, self.f
        for lo in range(0, keep.shape[0], self.chunk_rows):
            rows = start + lo + np.flatnonzero(keep[lo : lo + self.chunk_rows])
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
                self.size += used
                k += done
            self.records += rows.shape[0]
            if rows.shape[0]:
                # The input pages copied are not needed again.
                release(buf, int(r["offset"][start + lo]), int(starts[-1] + lengths[-1]))

    def close(self) -> tuple[int, int]:
        """Write the records not given yet (kept), the feature sections and
        the header; returns (records, bytes) written to the data section."""
        if self.closed:
            return self.records, self.size
        if self.next < self.n:
            self.add(self.n, np.zeros(0, np.int64))
        data, f = self.data, self.f
        if not data.pipe:
            h = data.header
            features = sorted(data.feature_sections)
            sections: list[bytes] = []
            for feat in features:
                off, size = data.feature_sections[feat]
                raw = bytes(data.buf[off : off + size])
                if feat == Feature.AUXTRACE:
                    # Entries after every record move by all the bytes dropped.
                    shift = np.where(self._aux_known, self._aux_shift, self.dropped)
                    moved = [(o - int(d), sz) for (o, sz), d in zip(self.aux, shift, strict=True)]
                    raw = pack_feature(Feature.AUXTRACE, moved)
                sections.append(raw)
            write_feature_sections(f, h.data_offset + self.size, sections)
            header = bytearray(bytes(data.buf[: h.size]))
            struct.pack_into("<Q", header, 48, self.size)  # data.size
            f.seek(0)
            f.write(header)
        f.close()
        self.closed = True
        return self.records, self.size

    def __enter__(self) -> SubsetWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.close()


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
    w = SubsetWriter(data, out, chunk_bytes=chunk_bytes, chunk_rows=chunk_rows)
    with w:
        w.add(w.n, np.sort(np.asarray(drop, np.int64)))
    return w.records, w.size


def insert_records(
    data: PerfData,
    out: str | os.PathLike[str],
    records: list[tuple[int, bytes]],
) -> tuple[int, int]:
    """Write ``out``: ``data`` with ``records`` ((perf time, record bytes))
    added to its data section in time order, each before the first record
    after the latest time seen up to there (records without a time follow
    the one before them), so perf's ordered-event rounds take them in
    order.  Returns (records, bytes) written to the data section."""
    times = np.asarray(data.records["time"], np.int64)
    seen = np.maximum.accumulate(np.where(times > 0, times, 0)) if times.size else times
    w = SubsetWriter(data, out)
    with w:
        for t, raw in sorted(records, key=lambda r: r[0]):
            w.add(max(int(np.searchsorted(seen, t, side="right")), w.next), np.zeros(0, np.int64))
            w.insert(raw)
            w.records += 1
    return w.records, w.size
