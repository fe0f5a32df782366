"""A Parquet file writer for flat tables of integers and booleans whose
pages are encoded by compiled loops (:mod:`._parquet_pages`), for the
flow's largest tables: Arrow's writer spends about 100 ns a row on the
block rows (hashing every value of every dictionary column); these
encoders know each column's encoding in advance and spend a few.

The file is what Apache Parquet's format specification ("parquet.thrift",
"Encodings") describes, read back by Arrow and DuckDB as the Arrow schema
it was made for: data pages of version 1 with definition levels (every
column optional, as Arrow's fields are nullable), one column chunk per
column and row group, a dictionary page first in a dictionary-encoded
chunk, statistics (minimum, maximum, nulls) per chunk, each page compressed
(zstd, LZ4 or Snappy) or not, the Arrow schema and the caller's key-value
metadata in the footer.  The footer is Thrift's compact protocol.
"""

from __future__ import annotations

import base64
import os
import struct
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..columns import Keyed, OffsetPoints, Runs, SequencedKeys, joined, pow2_at_least
from ..pt.blocks import gather
from . import _parquet_pages as pp

__all__ = [
    "COMPRESSIONS",
    "ColumnSpec",
    "Keyed",
    "ParquetFileWriter",
    "RowNumbers",
    "Runs",
    "column_specs",
]

# Thrift compact protocol types (Apache Thrift, "Thrift Compact protocol").
_T_TRUE, _T_FALSE, _T_I8, _T_I16, _T_I32, _T_I64 = 1, 2, 3, 4, 5, 6
_T_BINARY, _T_LIST, _T_STRUCT = 8, 9, 12

# parquet.thrift enums.
_INT32, _INT64, _BOOLEAN = 1, 2, 0
_PLAIN, _RLE, _RLE_DICTIONARY, _DELTA_BINARY_PACKED = 0, 3, 8, 5
_UNCOMPRESSED, _SNAPPY, _ZSTD, _LZ4_RAW = 0, 1, 6, 7

#: The compressions the writer offers, by the name pyarrow and DuckDB give
#: them: parquet.thrift's codec, Arrow's codec and its options.  zstd at
#: level 1 makes the smallest files; LZ4 (the raw block format, Parquet's
#: LZ4_RAW) and Snappy compress in about half zstd's time into files about
#: twice as large, and read back faster.
COMPRESSIONS: dict[str, tuple[int, str | None, dict[str, int]]] = {
    "zstd": (_ZSTD, "zstd", {"compression_level": 1}),
    "lz4": (_LZ4_RAW, "lz4_raw", {}),
    "snappy": (_SNAPPY, "snappy", {}),
    "none": (_UNCOMPRESSED, None, {}),
}
_DATA_PAGE, _DICTIONARY_PAGE = 0, 2
_OPTIONAL = 1
_UINT_8, _UINT_64 = 11, 14


def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _zz(v: int) -> bytes:
    return _varint((v << 1) ^ (v >> 63) if v < 0 else v << 1)


class _Struct:
    """A Thrift struct in the compact protocol, field by field (ascending
    ids; nested structs and lists of structs as :class:`_Struct`)."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.last = 0

    def _head(self, fid: int, kind: int) -> None:
        delta = fid - self.last
        if 0 < delta <= 15:
            self.out.append((delta << 4) | kind)
        else:
            self.out.append(kind)
            self.out += _zz(fid)
        self.last = fid

    def i32(self, fid: int, v: int) -> _Struct:
        self._head(fid, _T_I32)
        self.out += _zz(int(v))
        return self

    def i64(self, fid: int, v: int) -> _Struct:
        self._head(fid, _T_I64)
        self.out += _zz(int(v))
        return self

    def i8(self, fid: int, v: int) -> _Struct:
        self._head(fid, _T_I8)
        self.out.append(v & 0xFF)
        return self

    def boolean(self, fid: int, v: bool) -> _Struct:
        self._head(fid, _T_TRUE if v else _T_FALSE)
        return self

    def binary(self, fid: int, v: bytes | str) -> _Struct:
        b = v.encode() if isinstance(v, str) else v
        self._head(fid, _T_BINARY)
        self.out += _varint(len(b)) + b
        return self

    def struct(self, fid: int, s: _Struct) -> _Struct:
        self._head(fid, _T_STRUCT)
        self.out += s.done()
        return self

    def _list_head(self, fid: int, kind: int, n: int) -> None:
        self._head(fid, _T_LIST)
        if n < 15:
            self.out.append((n << 4) | kind)
        else:
            self.out.append(0xF0 | kind)
            self.out += _varint(n)

    def i32s(self, fid: int, values: Sequence[int]) -> _Struct:
        self._list_head(fid, _T_I32, len(values))
        for v in values:
            self.out += _zz(int(v))
        return self

    def strings(self, fid: int, values: Sequence[str]) -> _Struct:
        self._list_head(fid, _T_BINARY, len(values))
        for v in values:
            b = v.encode()
            self.out += _varint(len(b)) + b
        return self

    def structs(self, fid: int, values: Sequence[_Struct]) -> _Struct:
        self._list_head(fid, _T_STRUCT, len(values))
        for v in values:
            self.out += v.done()
        return self

    def done(self) -> bytes:
        return bytes(self.out) + b"\x00"


def _page_header(kind: int, size: int, stored: int, n: int, encoding: int) -> bytes:
    """A PageHeader (type, sizes uncompressed and stored, then a data
    page's header, its levels RLE, or a dictionary page's) in the compact
    protocol, as :class:`_Struct` writes it, laid out at once: a row group
    writes dozens."""
    head = (b"\x15" + _varint(kind << 1) + b"\x15" + _varint(size << 1) + b"\x15"
            + _varint(stored << 1))  # fmt: skip
    inner = b"\x15" + _varint(n << 1) + b"\x15" + _varint(encoding << 1)
    if kind == _DATA_PAGE:
        return head + b"\x2c" + inner + b"\x15\x06\x15\x06\x00\x00"
    return head + b"\x4c" + inner + b"\x00\x00"


class _Encoded:
    """A Thrift struct laid out already (a :class:`_Struct`'s nested value)."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def done(self) -> bytes:
        return self.raw


def _column_chunk(physical: int, encodings: Sequence[int], name: bytes, codec: int,
                  values: int, uncompressed: int, compressed: int, data_offset: int,
                  dict_offset: int | None, nulls: int,
                  bounds: tuple[bytes, bytes] | None) -> _Encoded:  # fmt: skip
    """A ColumnChunk (file offset 0, then its ColumnMetaData: type,
    encodings, path, codec, values, sizes, data and dictionary page
    offsets, statistics with ``bounds``: maximum and minimum, or none) in
    the compact protocol, as :class:`_Struct` writes it, laid out at once:
    a row group has one a column."""
    out = bytearray(b"\x26\x00\x1c\x15")  # (file_offset 0; meta_data: type)
    out += _zz(physical)
    out.append(0x19)  # encodings: a list of i32
    if len(encodings) < 15:
        out.append((len(encodings) << 4) | _T_I32)
    else:
        out.append(0xF0 | _T_I32)
        out += _varint(len(encodings))
    for e in encodings:
        out += _zz(e)
    out += b"\x19\x18"  # path_in_schema: a list of one string
    out += _varint(len(name)) + name
    out.append(0x15)
    out += _zz(codec)
    for v in (values, uncompressed, compressed):
        out.append(0x16)
        out += _zz(v)
    out.append(0x26)  # data_page_offset (field 9)
    out += _zz(data_offset)
    if dict_offset is not None:
        out.append(0x26)  # dictionary_page_offset (field 11)
        out += _zz(dict_offset)
        out.append(0x1C)  # statistics (field 12)
    else:
        out.append(0x3C)
    out.append(0x36)  # null_count (field 3)
    out += _zz(nulls)
    if bounds is not None:
        mx, mn = bounds
        out += b"\x28" + _varint(len(mx)) + mx + b"\x18" + _varint(len(mn)) + mn
    out += b"\x00\x00\x00"  # (the ends of statistics, meta_data and the chunk)
    return _Encoded(bytes(out))


@dataclass
class ColumnSpec:
    """How one column is stored: its Arrow field, its encoding
    (``"dictionary"``, ``"delta"`` or ``"plain"``), the encoding of a
    dictionary column's pages once its chunk's dictionary is full
    (``fallback``: ``"plain"`` or ``"delta"``) and which values stand for
    null (:data:`~._parquet_pages.NULL_IF_NEGATIVE`, ...)."""

    name: str
    kind: pa.DataType
    encoding: str = "plain"
    null: int = pp.NOT_NULL
    fallback: str = "plain"

    @property
    def physical(self) -> int:
        if pa.types.is_boolean(self.kind):
            return _BOOLEAN
        return _INT64 if self.kind.bit_width == 64 else _INT32

    @property
    def width(self) -> int:
        return 8 if self.physical == _INT64 else 4

    @property
    def unsigned(self) -> bool:
        return pa.types.is_unsigned_integer(self.kind)


_SUPPORTED = (pa.int32(), pa.int64(), pa.uint8(), pa.uint64(), pa.bool_())


def column_specs(
    schema: pa.Schema, encoding: Mapping[str, Sequence[str]], nulls: Mapping[str, int]
) -> list[ColumnSpec] | None:
    """The specs of ``schema``'s columns (``encoding``: column names by
    ``"dictionary"``/``"delta"``, a column named by both a dictionary
    whose pages go delta when it is full; ``nulls``: the null rule by
    column name), or None when a column's type is not one this writer
    stores."""
    dictionary = set(encoding.get("dictionary", ()))
    delta = set(encoding.get("delta", ()))
    specs = []
    for f in schema:
        if f.type not in _SUPPORTED:
            return None
        enc = ("dictionary" if f.name in dictionary else "delta" if f.name in delta
               else "plain")  # fmt: skip
        fallback = "delta" if enc == "dictionary" and f.name in delta else "plain"
        if pa.types.is_boolean(f.type):
            enc = "plain"
        if f.type != pa.int64():
            enc = "plain" if enc == "delta" else enc
            fallback = "plain"
        null = nulls.get(f.name, pp.NOT_NULL)
        if null != pp.NOT_NULL and not pa.types.is_signed_integer(f.type):
            raise ValueError(f"column {f.name}: null rules are for signed integers")
        specs.append(ColumnSpec(f.name, f.type, enc, null, fallback))
    return specs


#: Pages at least this large are compressed ahead, on a thread of their
#: own (a smaller one costs less to compress than to hand over).
_COMPRESS_AHEAD = 1 << 16
#: Row groups the writers that write ahead may have waiting to be written
#: (all of them together: their pages wait in memory).
WRITES_AHEAD = 4
#: A column chunk whose pages are all shorter than this is not compressed
#: (a codec makes pages this short longer: zstd's frame and block headers).
_TINY_PAGE = 256
_compressing: tuple[int, ThreadPoolExecutor] | None = None
_writing: tuple[int, deque[Future]] | None = None


def _writes_waiting() -> deque[Future]:
    """The row groups given to the compressing thread to write and not
    yet known to be written, of every writer of this process."""
    global _writing
    if _writing is None or _writing[0] != os.getpid():
        _writing = (os.getpid(), deque())
    return _writing[1]


def _compressor() -> ThreadPoolExecutor:
    """The thread that compresses pages ahead (and, for a writer that
    writes ahead, writes its row groups), for every writer of this process
    (one: what it is given runs in order; a forked child, a worker, makes
    its own)."""
    global _compressing
    if _compressing is None or _compressing[0] != os.getpid():
        _compressing = (os.getpid(), ThreadPoolExecutor(1, thread_name_prefix="hwtrace-compress"))
    return _compressing[1]


class _EncodedChunk(NamedTuple):
    """A column chunk encoded, not yet written: its memo key when it is of
    one value throughout, its data pages (encoding, values, body), its
    dictionary page's body and entries, its statistics; or ``before``, the
    memo of the same chunk written earlier (its bytes, to write again)."""

    key: tuple | None
    pages: list | None = None
    dictionary: bytes | None = None
    dict_count: int = 0
    state: np.ndarray | None = None
    before: tuple | None = None


class _KeyedRows:
    """A row group's keyed pieces as :meth:`_Scratch.keyed` made them: per
    piece its keys (:class:`~hwtrace.columns.SequencedKeys`, or an array
    of a key per row), where its source's keys start in the chunk's
    numbering of its tables' keys and how many it has, and how many keys
    the pieces up to it name; the keys in dictionary order (the order the
    rows first name them), each key's index there (``local``, -1: none);
    and the index pages of those indices, once a column asks (None
    before)."""

    __slots__ = ("counts", "entries", "keys", "local", "pages", "spans")

    def __init__(self, keys: list, spans: list[tuple[int, int]], entries: np.ndarray,
                 counts: list[int], local: np.ndarray) -> None:  # fmt: skip
        self.keys, self.spans, self.entries, self.counts = keys, spans, entries, counts
        self.local = local
        self.pages: list[bytes] | None = None


#: Keys given a row each, as entries with no sequences (every key below).
_NO_SEQUENCE = 1 << 62
_NO_STARTS = np.zeros(0, np.int64)


def _piece_keys(keys: object, n: int) -> SequencedKeys | np.ndarray:
    """A keyed piece's ``n`` rows' keys: kept in sequences as they came, or
    laid out a key per row."""
    if isinstance(keys, SequencedKeys) and keys.n == n:
        return keys
    return np.ascontiguousarray(np.asarray(keys)[:n])


def _index_kind(count: int) -> type:
    """The integer type of indices into a dictionary of ``count`` entries."""
    return np.uint8 if count <= 256 else np.uint16 if count <= 1 << 16 else np.int32


class _Scratch:
    """Buffers the encoders share: a writer encodes one column chunk at a
    time, and writers sharing one encode one after the other."""

    def __init__(self) -> None:
        self.all_keys = np.zeros(pp.DICT_SLOTS, np.int64)
        self.all_slots = np.full(pp.DICT_SLOTS, -1, np.int64)
        self.entries = np.zeros(pp.DICT_LIMIT, np.int64)
        self._table(pp.DICT_SLOTS_MIN)
        self.rows = 0
        self.grow(1 << 15)
        # Chunks of one value, by (column, value, page sizes): their bytes
        # as written, the dictionary and data pages' places in them, sizes
        # and encodings, and the chunk's statistics (ParquetFileWriter).
        self.constant_chunks: dict[tuple, tuple] = {}
        # Keyed chunks (see Keyed): a key's index in the chunk's dictionary
        # (-1: none), the chunk's keys in order, the values of a column's
        # keys, which sequences of keys a piece's pass has looked into
        # (see index_entries), and per row group what was made of each run
        # of pieces' keys (see keyed), and their compressions.
        self.key_local = np.full(1 << 12, -1, np.int32)
        self.key_entries = np.zeros(1 << 12, np.int64)
        self.key_values = np.zeros(1 << 12, np.int64)
        self.met = np.zeros(1 << 12, np.int32)  # (see first_met)
        self.seq_seen = np.zeros(0, np.int64)
        self.stamp = 0
        # (a block's changes of trace offset, its values laid out: see
        # encode_points_delta)
        self.run_rows = np.zeros(130, np.int64)
        self.run_values = np.zeros(130, np.int64)
        self.block_values = np.zeros(130, np.int64)
        self.keyed_rows: dict[tuple, _KeyedRows] = {}
        self.compressed: dict[int, tuple[bytes, bytes | Future]] = {}

    def _table(self, size: int) -> None:
        # (the first ``size`` slots: a table of few entries stays in cache)
        self.keys, self.slots = self.all_keys[:size], self.all_slots[:size]

    def encode_dictionary(self, spec: ColumnSpec, values: np.ndarray, n: int,
                          state: np.ndarray) -> int:  # fmt: skip
        """:func:`~._parquet_pages.encode_dictionary`, the table grown as it asks."""
        return self._grown(lambda: pp.encode_dictionary(
            values, n, spec.null, spec.unsigned, state, self.keys, self.slots, self.entries,
            self.indices, self.levels, self.out), state)  # fmt: skip

    def encode_runs_dictionary(self, spec: ColumnSpec, runs: Runs, state: np.ndarray) -> int:
        """:func:`~._parquet_pages.encode_runs_dictionary`, the table grown
        as it asks."""
        return self._grown(lambda: pp.encode_runs_dictionary(
            runs.starts, runs.values, runs.starts.shape[0], runs.n, spec.unsigned, state,
            self.keys, self.slots, self.entries, self.indices, self.wide, self.out),
            state)  # fmt: skip

    def _grown(self, encode: Callable[[], int], state: np.ndarray) -> int:
        """``encode()``'s answer, asked again with a larger table (the
        entries of the chunk's dictionary so far, ``state``'s count, placed
        in it) for as long as it answers :data:`~._parquet_pages.GROW`."""
        while True:
            size = encode()
            if size != pp.GROW:
                return size
            self._grow_table(int(state[pp.ST_DICT]))

    def _grow_table(self, count: int) -> None:
        """A table four times as large (at most DICT_SLOTS), holding the
        dictionary's ``count`` entries so far."""
        self.slots.fill(-1)
        self._table(min(self.slots.shape[0] * 4, pp.DICT_SLOTS))
        pp.place_entries(self.keys, self.slots, self.entries, count)

    def reset_dictionary(self, count: int) -> None:
        """Empty the table for the next column chunk."""
        pp.reset_dictionary(self.slots, self.entries, count)
        self._table(pp.DICT_SLOTS_MIN)

    def first_met(self, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``values``' index among its distinct values in the order
        first met (int32), and those values: a hash table's pass (the
        table emptied after), not a sort; numpy's sort when they are more
        than a dictionary holds."""
        n = values.shape[0]
        if n > self.met.shape[0]:
            self.met = np.zeros(2 * n, np.int32)
        out = self.met[:n]
        count = 0
        while True:
            got = pp.index_values(values, self.keys, self.slots, self.entries, count, out)
            if got >= 0:
                break
            count = -2 - got
            if self.slots.shape[0] >= pp.DICT_SLOTS:
                self.reset_dictionary(count)
                distinct, first, inverse = np.unique(values, return_index=True,
                                                     return_inverse=True)  # fmt: skip
                order = np.argsort(first)
                rank = np.empty(order.shape[0], np.int32)
                rank[order] = np.arange(order.shape[0], dtype=np.int32)
                return rank[inverse.reshape(-1)], distinct[order]
            self._grow_table(count)
        dictionary = self.entries[:got].copy()
        self.reset_dictionary(got)
        return out, dictionary

    def keyed(self, pieces: Sequence[tuple[Keyed, int]]) -> _KeyedRows:
        """The chunk's dictionary of the keyed pieces' keys
        (:class:`_KeyedRows`); made once per row group for the pieces' keys
        (the columns keyed by them share it).  Keys of several sources (a
        chunk of several queues' blocks) are numbered after one another."""
        memo_key = tuple((_address(k.keys) if isinstance(k.keys, np.ndarray) else id(k.keys), n,
                          k.source) for k, n in pieces)  # fmt: skip
        got = self.keyed_rows.get(memo_key)
        if got is not None:
            return got
        bases, size = _sources(pieces)
        if size > self.key_local.shape[0]:
            self.key_local = np.full(2 * size, -1, np.int32)
            self.key_entries = np.zeros(2 * size, np.int64)
            self.key_values = np.zeros(2 * size, np.int64)
        state = np.zeros(pp.ST_SIZE, np.int64)
        keys_of, spans, counts = [], [], []
        for k, n in pieces:
            keys = _piece_keys(k.keys, n)
            base = bases[k.source][0]
            if isinstance(keys, SequencedKeys) and keys.order is None:
                if keys.seq_start.shape[0] > self.seq_seen.shape[0]:
                    self.seq_seen = np.zeros(2 * keys.seq_start.shape[0], np.int64)
                self.stamp += 1
                pp.index_entries(keys.entries, keys.floor, keys.top, keys.seq_start, keys.seq_len,
                                 keys.seq_keys, base, state, self.key_local, self.key_entries,
                                 self.seq_seen, self.stamp)  # fmt: skip
            else:
                # (a key a row, or the keys in the order the rows first name
                # them, as counted)
                plain = keys.order if isinstance(keys, SequencedKeys) else keys
                pp.index_entries(plain, _NO_SEQUENCE, 0, _NO_STARTS, _NO_STARTS, plain[:0], base,
                                 state, self.key_local, self.key_entries, _NO_STARTS, 0)  # fmt: skip
            keys_of.append(keys)
            spans.append(bases[k.source])
            counts.append(int(state[pp.ST_DICT]))
        count = int(state[pp.ST_DICT])
        entries = self.key_entries[:count].copy()
        local = self.key_local[:size].copy()
        pp.forget_keys(self.key_local, entries, count)
        got = self.keyed_rows[memo_key] = _KeyedRows(keys_of, spans, entries, counts, local)
        return got

    def remapped(self, keys: SequencedKeys | np.ndarray, remap: np.ndarray) -> np.ndarray:
        """Each of the rows' ``remap[key]`` (an array of ``remap``'s type,
        valid until the next call)."""
        n = len(keys)
        size = n * remap.itemsize
        if size + 64 > self.index_raw.shape[0]:
            self.index_raw = np.empty(2 * size + 64, np.uint8)
        out = self.index_raw
        if isinstance(keys, SequencedKeys):
            pool = remap[keys.seq_keys]
            pp.remap_entries(keys.entries, keys.floor, keys.top, keys.seq_start, keys.seq_len,
                             pool.view(np.uint8), remap, out)  # fmt: skip
        else:
            gather(remap, keys, out[:size].view(remap.dtype))
        return out[:size].view(remap.dtype)

    def keyed_pages_of(self, rows: _KeyedRows) -> list[bytes]:
        """The index pages of :meth:`keyed`'s rows' keys' own indices (a
        column with a value per key), one per piece; made once, the same
        bytes for every such column (compressed once)."""
        if rows.pages is None:
            rows.pages = []
            by_key = rows.local.astype(_index_kind(rows.entries.shape[0]))
            for keys, (base, n_keys), count in zip(rows.keys, rows.spans, rows.counts,
                                                   strict=True):  # fmt: skip
                idx = self.remapped(keys, by_key[base : base + n_keys])
                size = pp.index_page(idx, idx.shape[0], pp.index_width(count), self.out)
                rows.pages.append(self.out[:size].tobytes())
        return rows.pages

    def new_row_group(self) -> None:
        """Forget the pages made for the last row group (their compressions
        go with them, to be written: a new memo for this one)."""
        self.keyed_rows.clear()
        self.compressed = {}

    def grow(self, rows: int) -> None:
        if rows <= self.rows:
            return
        # (a power of two: batches of about one size, one row more or less
        # as a stream's first is, share the buffers; memory fresh from the
        # system costs a fault a page, and a stall when the kernel makes a
        # huge page of it.  Not zeroed, the encoders writing what they
        # read: a process that writes again (a cluster worker's next piece,
        # a library's next dataset) gets its freed heap back, which calloc
        # clears, 5-40 ms a writer.)
        self.rows = max(pow2_at_least(rows), 2 * self.rows)
        self.levels = np.empty(self.rows, np.uint8)
        self.indices = np.empty(self.rows, np.int32)
        # (a keyed column's rows' indices, of the type its dictionary's
        # size asks, with room for remap_entries' words past the last: two
        # bytes a row, more when a column has nulls or 65,536 values)
        self.index_raw = np.empty(self.rows * 2 + 64, np.uint8)
        # (a delta page's non-null values; a block of its deltas)
        self.wide = np.empty(self.rows, np.int64)
        self.deltas = np.zeros(128, np.int64)
        # Worst cases: PLAIN int64 values with their levels, a delta page's
        # 64-bit miniblocks with their headers, a full dictionary page.
        self.out = np.empty(max(self.rows * 10, pp.DICT_LIMIT * 8) + 4096, np.uint8)


class RowNumbers:
    """The column ``first``, ``first + 1``, ... of ``n`` rows, not held in
    memory (rows numbered along a queue): a DELTA_BINARY_PACKED page of it
    is a few header bytes and a zero-width block per 128 rows, written
    without looking at a row.  Slices as a numpy array does;
    ``numpy.asarray`` gives its values."""

    __slots__ = ("first", "n")
    ndim = 1
    dtype = np.dtype(np.int64)

    def __init__(self, first: int, n: int) -> None:
        self.first, self.n = int(first), int(n)

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, rows: slice) -> RowNumbers:
        lo, hi, step = rows.indices(self.n)
        if step != 1:
            raise IndexError("row numbers slice with a step of 1 only")
        return RowNumbers(self.first + lo, max(hi - lo, 0))

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return np.arange(self.first, self.first + self.n, dtype=dtype or np.int64)


def _runs_page(col: Runs, null: int, state: np.ndarray, s: _Scratch) -> bytes:
    """:func:`~._parquet_pages.encode_delta`'s page of ``col``, byte for
    byte, made a run at a time (and its statistics into ``state``)."""
    starts, vals, n = col.starts, col.values, col.n
    none = np.zeros(0, np.int64)
    if not _any_null(vals, null):
        level_starts, level_vals, nulls = none, none, 0
    else:
        missing = _null_mask(vals, null)
        # The definition levels' runs, and the non-null values' (numbered
        # among them, equal neighbours joined).
        lengths = np.diff(starts, append=n)
        nulls = int(lengths[missing].sum())
        level_starts, level_vals = joined(starts, (~missing).astype(np.int64))
        vals, kept = vals[~missing], lengths[~missing]
        starts = np.zeros(vals.shape[0], np.int64)
        np.cumsum(kept[:-1], out=starts[1:])
        starts, vals = joined(starts, vals)
    size = pp.encode_runs_delta(starts, vals, starts.shape[0], n - nulls, level_starts,
                                level_vals, level_starts.shape[0], n, nulls, state, s.deltas,
                                s.wide, s.out)  # fmt: skip
    return s.out[:size].tobytes()


def _points_page(col: OffsetPoints, n: int, spec: ColumnSpec, state: np.ndarray,
                 s: _Scratch) -> bytes | None:  # fmt: skip
    """:func:`~._parquet_pages.encode_delta`'s page, byte for byte, of the
    ``n`` rows of ``col``, made from its offset points (and its statistics
    into ``state``); None: not so (not all its rows, a null among them).
    """
    pts, far_row, far_val = col.points
    if (col.n != n or "delta" not in (spec.encoding, spec.fallback)
            or (col.first is not None and col.first < 0)
            or (spec.null != pp.NOT_NULL and far_val.shape[0] and far_val.min() < 0)):  # fmt: skip
        return None
    size = pp.encode_points_delta(col.first is not None, col.first or 0, pts, far_row, far_val,
                                  col.at, n, state, s.deltas, s.run_rows, s.run_values,
                                  s.block_values, s.out)  # fmt: skip
    return s.out[:size].tobytes() if size >= 0 else None


def _sources(pieces: Sequence[tuple[Keyed, int]]) -> tuple[dict[int, tuple[int, int]], int]:
    """Per source of the pieces' keys, in the order first met: the number
    its keys start at in the chunk, and how many it has (its largest
    table's); and their total."""
    sizes: dict[int, int] = {}
    for k, _ in pieces:
        sizes[k.source] = max(sizes.get(k.source, 0), k.table.shape[0])
    bases, at = {}, 0
    for src, size in sizes.items():
        bases[src] = (at, size)
        at += size
    return bases, at


def _address(a: np.ndarray) -> tuple[int, int]:
    """Where an array's values are (views of the same rows are equal)."""
    return a.__array_interface__["data"][0], a.strides[0]


def _row_numbers_page(rows: RowNumbers, state: np.ndarray) -> bytes:
    """:func:`~._parquet_pages.encode_delta`'s page of ``rows`` (no nulls),
    byte for byte, and its statistics into ``state``."""
    n, first = rows.n, rows.first
    # Definition levels: one RLE run of n ones, after its four-byte length.
    levels = _varint(n << 1) + b"\x01"
    head = struct.pack("<I", len(levels)) + levels
    head += _varint(128) + _varint(4) + _varint(n) + _zz(first)
    # Each block of (up to) 128 deltas of 1: its minimum (zigzag 1) and four
    # miniblock widths of 0.
    body = b"\x02\x00\x00\x00\x00" * ((n - 1 + 127) // 128)
    state[pp.ST_VALUES] += n
    if n:
        # (the range as _parquet_pages._merge adds it)
        lo, hi = first, first + n - 1
        if state[pp.ST_SEEN] == 0 or lo < state[pp.ST_MIN]:
            state[pp.ST_MIN] = lo
        if state[pp.ST_SEEN] == 0 or hi > state[pp.ST_MAX]:
            state[pp.ST_MAX] = hi
        state[pp.ST_SEEN] += n
    return head + body


#: A piece of rows: its columns (numpy arrays, RowNumbers, Keyed or Runs,
#: by name) and its row count.
Piece = tuple[Mapping[str, "np.ndarray | RowNumbers | Keyed | Runs"], int]


class ParquetFileWriter:
    """Writes rows of ``specs``' columns into a Parquet file at ``path``:
    :meth:`write_row_group` writes pieces of rows (numpy columns) as one
    row group, a data page per piece and column; :meth:`close` writes the
    footer.  ``compression``: one of :data:`COMPRESSIONS`; ``scratch``: the
    encoders' buffers, shared by writers used from one thread.

    ``ahead``: a row group's pages, once encoded, are compressed and
    written on the compressing thread, in order, while the next row group
    is encoded (at most :data:`WRITES_AHEAD` row groups of all such
    writers behind; a failed write is raised by a later call): the
    encoding thread neither waits for the codec nor writes.  The file is
    complete when :meth:`close` returns.  Writers that write ahead are
    used from one thread."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        schema: pa.Schema,
        specs: list[ColumnSpec],
        metadata: Mapping[bytes, bytes] | None = None,
        compression: str = "zstd",
        scratch: _Scratch | None = None,
        ahead: bool = False,
    ) -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r}: one of {', '.join(COMPRESSIONS)}")
        self.schema, self.specs = schema, specs
        self.metadata = dict(metadata or {})
        self.codec_id, name, options = COMPRESSIONS[compression]
        self.codec = pa.Codec(name, **options) if name else None
        self.scratch = scratch or _Scratch()
        self.file = open(path, "wb")
        self.file.write(b"PAR1")
        self.offset = 4
        self.row_groups: list[_Struct] = []
        self.num_rows = 0
        self.ahead = ahead
        self._writes: deque[Future] = deque()
        self._footer: Future | None = Future()  # (done once the footer is written)

    def write_row_group(self, pieces: Sequence[Piece]) -> None:
        """``pieces`` as one row group (each column of a piece an array of
        at least its row count of values)."""
        pieces = [(cols, n) for cols, n in pieces if n > 0]
        rows = sum(n for _, n in pieces)
        if not rows:
            return
        self.scratch.grow(max(n for _, n in pieces))
        self.scratch.new_row_group()
        # Every chunk's pages encoded first, their compression started on a
        # thread of its own as each is made; then written in order.
        encoded = [self._encode_chunk(spec, pieces) for spec in self.specs]
        begun = self.scratch.compressed
        if not self.ahead:
            self._write_group(encoded, rows, begun)
            return
        waiting = _writes_waiting()
        while len(waiting) >= WRITES_AHEAD:
            # (another writer's failure is that writer's to raise)
            wait_for((waiting.popleft(),))
        while self._writes and self._writes[0].done():
            self._writes.popleft().result()
        done = _compressor().submit(self._write_group, encoded, rows, begun)
        waiting.append(done)
        self._writes.append(done)

    def _write_group(self, encoded: list[_EncodedChunk], rows: int,
                     begun: dict[int, tuple[bytes, bytes | Future]]) -> None:  # fmt: skip
        """Write the row group :meth:`write_row_group` encoded (``begun``:
        its pages' compressions begun, by the body's ``id``)."""
        start = self.offset
        chunks = [self._write_chunk(spec, e, begun)
                  for spec, e in zip(self.specs, encoded, strict=True)]  # fmt: skip
        rg = _Struct().structs(1, [c for c, _ in chunks])
        rg.i64(2, sum(size for _, size in chunks)).i64(3, rows)  # (uncompressed)
        rg.i64(5, start).i64(6, self.offset - start)
        self.row_groups.append(rg)
        self.num_rows += rows

    def _encode(self, spec: ColumnSpec, pieces: Sequence[Piece], state: np.ndarray):
        """The chunk's pages, (encoding, values, body) each, and its
        dictionary page's body and entries (None, 0: none)."""
        s = self.scratch
        pages = []
        dictionary = spec.encoding == "dictionary"
        keyed = [(cols[spec.name], n) for cols, n in pieces]
        if all(isinstance(k, Keyed) for k, _ in keyed):
            if dictionary and spec.physical != _BOOLEAN:
                got = self._encode_keyed(spec, keyed, state)
                if got is not None:
                    return got
                state[:] = 0
        for cols, n in pieces:
            values = cols[spec.name]
            if isinstance(values, Keyed):
                values = np.asarray(values)
            if isinstance(values, OffsetPoints):
                page = _points_page(values, n, spec, state, s) if not dictionary else None
                if page is not None:
                    pages.append((_DELTA_BINARY_PACKED, n, page))
                    continue
                values = values.made()
            if isinstance(values, Runs):
                values = values[:n]
                if dictionary and not _any_null(values.values, spec.null):
                    size = s.encode_runs_dictionary(spec, values, state)
                    if size >= 0:
                        pages.append((_RLE_DICTIONARY, n, s.out[:size].tobytes()))
                        continue
                    dictionary = False
                if not dictionary and "delta" in (spec.encoding, spec.fallback):
                    pages.append((_DELTA_BINARY_PACKED, n, _runs_page(values, spec.null, state,
                                                                      s)))  # fmt: skip
                    continue
                values = np.asarray(values)
            if isinstance(values, _BooleanRun):
                size = pp.encode_boolean_run(values.value, n, state, s.out)
                pages.append((_PLAIN, n, s.out[:size].tobytes()))
                continue
            if isinstance(values, RowNumbers):
                if spec.encoding == "delta" and spec.null == pp.NOT_NULL:
                    pages.append((_DELTA_BINARY_PACKED, n, _row_numbers_page(values[:n], state)))
                    continue
                values = np.asarray(values)
            values = _encodable(values)
            if not (values.flags.writeable and values.flags.c_contiguous):
                # (a broadcast of one value, a read-only view: the encoders
                # take arrays of their own, one compiled specialisation)
                values = values.copy()
            if spec.physical == _BOOLEAN:
                size = pp.encode_booleans(values, n, state, s.levels, s.out)
                pages.append((_PLAIN, n, s.out[:size].tobytes()))
            elif dictionary and (size := s.encode_dictionary(spec, values, n, state)) >= 0:
                pages.append((_RLE_DICTIONARY, n, s.out[:size].tobytes()))
            elif "delta" in (spec.encoding, spec.fallback):
                # (a dictionary that filled up: this page and the rest as
                # its fallback says)
                dictionary = False
                size = pp.encode_delta(values, n, spec.null, state, s.levels, s.wide, s.deltas,
                                       s.out)  # fmt: skip
                pages.append((_DELTA_BINARY_PACKED, n, s.out[:size].tobytes()))
            else:
                dictionary = False
                size = pp.encode_plain(values, n, spec.null, spec.unsigned, spec.width, state,
                                       s.levels, s.out)  # fmt: skip
                pages.append((_PLAIN, n, s.out[:size].tobytes()))
        count = int(state[pp.ST_DICT])
        if not any(enc == _RLE_DICTIONARY for enc, _, _ in pages):
            # (a dictionary that filled up on the first page keeps what it
            # took: emptied for the next chunk all the same)
            s.reset_dictionary(count)
            return pages, None, 0
        # (a dictionary page, empty when every value was null, precedes
        # dictionary-encoded pages)
        size = pp.encode_dictionary_page(s.entries, count, spec.width, s.out)
        body = s.out[:size].tobytes()
        s.reset_dictionary(count)
        return pages, body, count

    def _encode_keyed(self, spec: ColumnSpec, pieces: Sequence[tuple[Keyed, int]],
                      state: np.ndarray):  # fmt: skip
        """:meth:`_encode` of a chunk of keyed pieces (None: encode it from
        its values).  Keys whose value is null (a block no symbol covers)
        are left out of the dictionary; their rows get a definition level
        of 0."""
        s = self.scratch
        rows_of = s.keyed(pieces)
        entries, counts = rows_of.entries, rows_of.counts
        count = entries.shape[0]
        # (per source its latest table: a source's tables are its decoder's
        # table of distinct blocks as it grew)
        sources = dict.fromkeys(k.source for k, _ in pieces)
        tables = [_encodable(max((k.table for k, _ in pieces if k.source == src), key=len))
                  for src in sources]  # fmt: skip
        table = tables[0] if len(tables) == 1 else np.concatenate(tables)
        rows = sum(n for _, n in pieces)
        missing = _null_mask(table[entries], spec.null)
        have = np.flatnonzero(~missing) if missing is not None and missing.any() else None
        kept = entries if have is None else entries[have]
        if not pp.keyed_values(table, kept, kept.shape[0], spec.null, spec.unsigned, rows, state,
                               s.key_values):  # fmt: skip
            return None
        values = s.key_values[: kept.shape[0]]
        # The column's dictionary: its values in the order first met (the
        # keys' order), each key's index there.
        index, dictionary = s.first_met(values)
        if have is None and dictionary.shape[0] == count:
            # (a value per key: the keys' own index pages)
            pages = [(_RLE_DICTIONARY, n, b)
                     for (_, n), b in zip(pieces, s.keyed_pages_of(rows_of), strict=True)]  # fmt: skip
            dictionary = values
        else:
            remap = index
            if have is not None:
                remap = np.full(count, -1, np.int32)
                remap[have] = index
            seen = np.maximum.accumulate(remap) + 1
            # Each key's index in the column's dictionary (-1: its value is
            # null), by the chunk's numbering of its keys.
            kind = _index_kind(dictionary.shape[0]) if have is None else np.int32
            by_key = np.zeros(rows_of.local.shape[0], kind)
            by_key[entries] = remap
            nulls = int(state[pp.ST_NULLS])
            pages = []
            for keys, (base, n_keys), (_, n), c in zip(rows_of.keys, rows_of.spans, pieces,
                                                       counts, strict=True):  # fmt: skip
                width = pp.index_width(int(seen[c - 1]) if c else 0)
                idx = s.remapped(keys, by_key[base : base + n_keys])
                if have is None:
                    size = pp.index_page(idx, n, width, s.out)
                else:
                    size = pp.index_page_nulls(idx, n, width, s.indices, s.levels, state, s.out)
                pages.append((_RLE_DICTIONARY, n, s.out[:size].tobytes()))
            # (keyed_values counted every row as a value seen)
            state[pp.ST_SEEN] -= int(state[pp.ST_NULLS]) - nulls
        state[pp.ST_DICT] = dictionary.shape[0]
        size = pp.encode_dictionary_page(dictionary, dictionary.shape[0], spec.width, s.out)
        return pages, s.out[:size].tobytes(), int(dictionary.shape[0])

    def _encode_chunk(self, spec: ColumnSpec, pieces: Sequence[Piece]) -> _EncodedChunk:
        """A column chunk's pages (see :meth:`_encode`), their compression
        begun; its memo key when it is of one value throughout.

        A chunk of one value throughout (columns given as numpy broadcasts
        of a scalar: a queue's number, its one thread) is the same bytes as
        the last chunk of that value and page sizes: those are written
        again, not encoded again."""
        value = _one_value(spec, pieces)
        key = None
        if value is not None:
            key = (spec.name, str(spec.kind), spec.encoding, spec.null, value,
                   tuple(n for _, n in pieces))  # fmt: skip
            before = self.scratch.constant_chunks.get(key)
            if before is not None:
                return _EncodedChunk(key, before=before)
            one = _constant_pages(spec, value, pieces)
            if one is not None:
                for _, _, body in one.pages:
                    self._compress_soon(body)
                return one._replace(key=key)
            # (a boolean as a run of the value; a null or a delta or PLAIN
            # column's value laid out)
            pieces = [({spec.name: _constant(spec, value, n, cols[spec.name].dtype)}, n)
                      for cols, n in pieces]  # fmt: skip
        state = np.zeros(pp.ST_SIZE, np.int64)
        pages, dictionary, dict_count = self._encode(spec, pieces, state)
        for _, _, body in pages:
            self._compress_soon(body)
        return _EncodedChunk(key, pages, dictionary, dict_count, state)

    def _write_chunk(self, spec: ColumnSpec, encoded: _EncodedChunk,
                     begun: dict[int, tuple[bytes, bytes | Future]]) -> tuple[_Struct, int]:  # fmt: skip
        """Write a column chunk :meth:`_encode_chunk` encoded (``begun``: the
        row group's compressions begun); its ColumnChunk and its
        uncompressed size."""
        key, pages, dictionary, dict_count, state, before = encoded
        memo = self.scratch.constant_chunks
        if before is not None:
            blob, dict_rel, data_rel, totals, state = before
            start = self.offset
            self.file.write(blob)
            self.offset += len(blob)
            return self._chunk_meta(spec, state, start + dict_rel if dict_rel >= 0 else None,
                                    start + data_rel, totals)  # fmt: skip
        start = self.offset
        written: list[bytes] | None = [] if key is not None else None
        dict_offset = None
        uncompressed = compressed = 0
        encodings = {_RLE}
        # A chunk of tiny pages only (a constant's, row numbers') is stored
        # as it is: a codec's frame would make them longer, and each page
        # costs a compressor's set-up.
        squeeze = self.codec is not None and not (
            all(len(body) < _TINY_PAGE for _, _, body in pages)
            and (dictionary is None or len(dictionary) < _TINY_PAGE)
        )
        if dictionary is not None:
            dict_offset = self.offset
            u, c = self._put(dictionary, _DICTIONARY_PAGE, dict_count, _PLAIN, begun, written,
                             squeeze)  # fmt: skip
            uncompressed += u
            compressed += c
            encodings.add(_PLAIN)
        data_offset = self.offset
        for enc, n, body in pages:
            u, c = self._put(body, _DATA_PAGE, n, enc, begun, written, squeeze)
            uncompressed += u
            compressed += c
            encodings.add(enc)
        totals = (uncompressed, compressed, tuple(sorted(encodings)),
                  self.codec_id if squeeze else _UNCOMPRESSED)  # fmt: skip
        if written is not None:
            if len(memo) >= 64:
                memo.clear()
            memo[key] = (b"".join(written), dict_offset - start if dict_offset else -1,
                         data_offset - start, totals, state)  # fmt: skip
        return self._chunk_meta(spec, state, dict_offset, data_offset, totals)

    def _chunk_meta(self, spec: ColumnSpec, state: np.ndarray, dict_offset: int | None,
                    data_offset: int, totals: tuple) -> tuple[_Struct, int]:  # fmt: skip
        """A chunk's ColumnChunk (its pages written at the offsets given,
        ``totals``: their sizes, encodings and compression) and its
        uncompressed size."""
        uncompressed, compressed, encodings, codec = totals
        values, nulls, lo, hi, seen = state[: pp.ST_SEEN + 1].tolist()
        bounds = None
        if seen:
            if spec.physical == _BOOLEAN:
                bounds = struct.pack("<?", bool(hi)), struct.pack("<?", bool(lo))
            elif spec.width == 4:
                bounds = struct.pack("<i", _int32(hi)), struct.pack("<i", _int32(lo))
            else:
                bounds = struct.pack("<q", hi), struct.pack("<q", lo)
        chunk = _column_chunk(spec.physical, encodings, spec.name.encode(), codec, values,
                              uncompressed, compressed, data_offset, dict_offset, nulls,
                              bounds)  # fmt: skip
        return chunk, uncompressed

    def _compress_soon(self, body: bytes) -> None:
        """Begin compressing a data page on the compressing thread (Arrow's
        codecs let go of the GIL): it runs beside the encoding of the row
        group's next columns, on a core the decoding thread leaves idle
        while it waits for this writer.  Small pages are compressed when
        written."""
        if self.codec is None or len(body) < _COMPRESS_AHEAD:
            return
        memo = self.scratch.compressed
        got = memo.get(id(body))
        if got is not None and got[0] is body:
            return  # (an index page shared by keyed columns)
        memo[id(body)] = (body, _compressor().submit(self.codec.compress, body, asbytes=True))

    def _put(self, body: bytes, kind: int, n: int, encoding: int,
             begun: dict[int, tuple[bytes, bytes | Future]], written: list[bytes] | None = None,
             squeeze: bool = True) -> tuple[int, int]:  # fmt: skip
        """Write one page (and add its bytes to ``written``), compressed
        when the writer compresses and ``squeeze`` (``begun``: the row
        group's compressions, by the body's ``id``); its uncompressed and
        compressed sizes, headers included."""
        if self.codec is None or not squeeze:
            data = body
        else:
            # (an index page of several keyed columns is compressed once;
            # a large page's compression was begun when it was made)
            got = begun.get(id(body))
            if got is not None and got[0] is body:
                data = got[1]
                if isinstance(data, Future):
                    data = data.result()
            else:
                data = self.codec.compress(body, asbytes=True)
                if kind == _DATA_PAGE and encoding == _RLE_DICTIONARY:
                    begun[id(body)] = (body, data)
        head = _page_header(kind, len(body), len(data), n, encoding)
        self.file.write(head)
        self.file.write(data)
        if written is not None:
            written += (head, data)
        self.offset += len(head) + len(data)
        return len(head) + len(body), len(head) + len(data)

    def wait(self) -> None:
        """Until the row groups given (and the footer, after
        :meth:`close_ahead`) are written, raising a failed write's error
        (the file then closed)."""
        try:
            while self._writes:
                self._writes.popleft().result()
        except BaseException:
            for f in self._writes:
                f.cancel()
            self._writes.clear()
            self.file.close()
            raise

    def close(self) -> None:
        """Write the footer (once the row groups written ahead are) and
        close the file."""
        self.close_ahead()
        self.wait()

    def close_ahead(self) -> None:
        """:meth:`close`, on the compressing thread after the row groups
        when the writer writes ahead: the encoding thread goes on to the
        next file's row groups instead of waiting for this file's to be
        compressed (:meth:`wait` for it)."""
        if not self.ahead:
            self._write_footer()
            self._footer = None
            return
        done = _compressor().submit(self._write_footer, list(self._writes))
        _writes_waiting().append(done)
        self._writes.append(done)
        self._footer = done

    def closed(self) -> bool:
        """Whether the file is written, footer and all (after
        :meth:`close_ahead`; :meth:`wait` raises what failed)."""
        return self._footer is None or self._footer.done()

    def _write_footer(self, before: Sequence[Future] = ()) -> None:
        """The footer, unless a row group's write (``before``: those given
        before it, done by now) failed: the file is only closed then."""
        try:
            if any(f.cancelled() or f.exception() is not None for f in before):
                return
            schema = [_Struct().binary(4, "schema").i32(5, len(self.specs))]
            for spec in self.specs:
                el = _Struct().i32(1, spec.physical).i32(3, _OPTIONAL).binary(4, spec.name)
                if spec.unsigned:
                    el.i32(6, _UINT_64 if spec.kind.bit_width == 64 else _UINT_8)
                    el.struct(10, _Struct().struct(10, _Struct().i8(1, spec.kind.bit_width)
                                                              .boolean(2, False)))  # fmt: skip
                schema.append(el)
            kv = dict(self.metadata)
            kv[b"ARROW:schema"] = base64.b64encode(
                self.schema.remove_metadata().serialize().to_pybytes()
            )
            pairs = [_Struct().binary(1, k).binary(2, v) for k, v in kv.items()]
            orders = [_Struct().struct(1, _Struct()) for _ in self.specs]
            footer = (
                _Struct().i32(1, 1).structs(2, schema).i64(3, self.num_rows)
                .structs(4, self.row_groups).structs(5, pairs).binary(6, "hwtrace")
                .structs(7, orders)
            ).done()  # fmt: skip
            self.file.write(footer)
            self.file.write(struct.pack("<I", len(footer)) + b"PAR1")
        finally:
            self.file.close()


def _int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


class _BooleanRun:
    """A boolean column of one value (a chunk of a queue with no gap)."""

    __slots__ = ("value",)

    def __init__(self, value: bool) -> None:
        self.value = bool(value)


def _constant(spec: ColumnSpec, value: int | bool, n: int,
              dtype: np.dtype) -> _BooleanRun | np.ndarray:  # fmt: skip
    """A column of ``n`` rows of ``value`` that :func:`_constant_pages`
    does not make, as its encoder takes it: a boolean as one run, without
    looking at a row; else laid out.  The pages are those of the laid-out
    column, byte for byte."""
    if spec.physical == _BOOLEAN:
        return _BooleanRun(bool(value))
    return np.full(n, value, dtype)


def _constant_pages(spec: ColumnSpec, value: int | bool,
                    pieces: Sequence[Piece]) -> _EncodedChunk | None:  # fmt: skip
    """The pages of a dictionary chunk of one value, not null, throughout
    (a queue's number, its thread), made without a compiled call: what
    :func:`~._parquet_pages.encode_runs_dictionary` makes of one run, byte
    for byte (definition levels: one run of ones; indices: one run of
    index 0, one bit wide), and the chunk's state.  None for other
    columns."""
    if spec.encoding != "dictionary" or spec.physical == _BOOLEAN:
        return None
    dtype = pieces[0][0][spec.name].dtype
    bits = int(_encodable(np.full(1, value, dtype)).astype(np.int64)[0])
    if _any_null(np.array([bits], np.int64), spec.null):
        return None
    pages = []
    rows = 0
    for _, n in pieces:
        run = _varint(n << 1)
        levels = run + b"\x01"
        pages.append((_RLE_DICTIONARY, n, struct.pack("<I", len(levels)) + levels + b"\x01"
                      + run + b"\x00"))  # fmt: skip
        rows += n
    state = np.zeros(pp.ST_SIZE, np.int64)
    state[pp.ST_VALUES] = state[pp.ST_SEEN] = rows
    state[pp.ST_MIN] = state[pp.ST_MAX] = bits
    state[pp.ST_DICT] = 1
    dictionary = (bits & ((1 << (8 * spec.width)) - 1)).to_bytes(spec.width, "little")
    return _EncodedChunk(None, pages, dictionary, 1, state)


def _null_mask(values: np.ndarray, null: int) -> np.ndarray | None:
    """Which of ``values`` are null by the rule ``null`` (None: no rule)."""
    if null == pp.NULL_IF_NEGATIVE:
        return values < 0
    if null == pp.NULL_IF_ZERO:
        return values == 0
    return None


def _any_null(values: np.ndarray, null: int) -> bool:
    """Is one of ``values`` null by the rule ``null``?  (A reduction, no
    mask made: a chunk's runs of trace offsets are a fifth of its rows.)"""
    if not values.shape[0]:
        return False
    if null == pp.NULL_IF_NEGATIVE:
        return bool(values.min() < 0)
    if null == pp.NULL_IF_ZERO:
        return not bool(values.all())
    return False


def _one_value(spec: ColumnSpec, pieces: Sequence[Piece]) -> int | bool | None:
    """The one value of a chunk whose pieces' columns are broadcasts of it
    (a stride of 0), else None."""
    value = None
    for cols, _ in pieces:
        a = cols[spec.name]
        if not isinstance(a, np.ndarray) or a.ndim != 1 or a.strides[0] != 0 or not a.shape[0]:
            return None
        v = a[0].item()
        if value is not None and v != value:
            return None
        value = v
    return value


def _encodable(a: np.ndarray) -> np.ndarray:
    """A column as the encoders take it: its own type (they are compiled
    for each), but uint64 as the int64 of its bits (numba compares int64
    with uint64 as floats)."""
    if a.dtype == np.uint64:
        return a.view(np.int64)
    return a
