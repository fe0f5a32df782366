"""The decoded instruction flow as Apache Parquet datasets, for SQL (DuckDB)
and dataframes (pyarrow, pandas, Polars).

A flow directory holds one dataset per table:

* ``blocks/cpu=N/bucket=K/part-*.parquet``: one row per decoded block
  (:func:`blocks_table`), partitioned Hive style by CPU and a bucket of
  perf time, so that a reader filtering on either opens only those
  directories (Apache Arrow's and DuckDB's Hive partitioning);
* ``instructions/cpu=N/bucket=K/``: on request, one row per instruction;
* ``events/``: PTWRITE payloads at their place in the flow;
* ``gaps/``: where the trace could not be decoded;
* ``symbols/``, ``images/``, ``comms/``: the names the rows' ids stand for.

Symbol and image ids are hashes of what names them (an image's path and
build id; a symbol's image, start and name), so every process that decodes
a part of a recording gives a symbol the same id and the tables of several
writers merge by id.  Settings and provenance are in each file's Parquet
key-value metadata (key ``hwtrace``) and in ``_meta.json``.

Memory stays bounded: rows wait per partition until a row group's worth
is there (or the whole budget is used), then go to that partition's open
file; only a bounded number of files is open at a time.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..columns import Deferred, OffsetPoints, distinct, repeated
from ..image.symbols import SymbolTable
from ..pt.blocks import gather
from ..pt.decode import Gap
from ..session import PerfSession
from ..session.perfflow import PerfBlocks, PerfStream, QueueInfo
from . import _parquet_pages as pages
from .parquet_file import (
    COMPRESSIONS,
    Keyed,
    ParquetFileWriter,
    Piece,
    RowNumbers,
    Runs,
    _Scratch,
    column_specs,
)
from .query import FORMAT, read_meta

__all__ = [
    "BATCH_ROWS",
    "BLOCKS_SCHEMA",
    "FORMAT",
    "FlowParquetWriter",
    "FunctionCallRows",
    "Names",
    "blocks_columns",
    "blocks_table",
    "build_ids_of",
    "events_table",
    "finish_dataset",
    "image_id",
    "instructions_columns",
    "instructions_table",
    "read_meta",
    "symbol_id",
    "threads_of",
    "write_dataset",
]

#: the key of hwtrace's settings in every file's Parquet key-value metadata
META_KEY = b"hwtrace"

BLOCKS_SCHEMA = pa.schema(
    [
        ("queue", pa.int32()),  # the AUX queue (number in the recording)
        ("cpu", pa.int32()),  # -1: a per-thread queue
        ("tid", pa.int64()),  # -1: unknown (perf's convention)
        ("pid", pa.int64()),
        ("time", pa.int64()),  # perf time (ns) at the block; null: unknown
        ("duration", pa.int64()),  # ns, until the next block or until tracing stopped
        ("ip", pa.uint64()),
        ("instructions", pa.int64()),
        ("mode", pa.uint8()),  # 16, 32 or 64
        ("space", pa.int32()),  # the queue's address space (image number) it ran in
        ("symbol", pa.int64()),  # symbols.id; null: no symbol covers the ip
        ("image", pa.int64()),  # images.id; null: no file holds the ip
        ("row", pa.int64()),  # the block's number in its queue
        ("gap", pa.bool_()),  # the flow has a gap before it
        # where in the queue's trace its decoding began ("offset" is an SQL word)
        ("trace_offset", pa.int64()),
    ]
)
#: Rows per row group at least (a partition's rows wait until there are
#: as many).
ROW_GROUP = 1 << 17
#: ... and of the blocks dataset: about a million, a batch of a decode
#: to Parquet, so that each column chunk's fixed costs (its
#: metadata, dictionary page and the Python around them, a tenth of the
#: writer's time at a batch a row group) are paid half as often, and zstd
#: finds more to share (3% less).  (An instruction row is wider and there
#: are several per block: those keep the smaller groups.)
BLOCKS_ROW_GROUP = 1_000_000
#: Rows of the batches a decode to Parquet asks the stream for: a batch
#: is then a page of each column and a row group by itself (the stream
#: passes on a row fewer than asked, the last block waiting for its
#: duration), and the work per batch (Python's, numpy's: 1-2 ms of each
#: thread) is spread over many rows (2^19 against 2^18: a tenth less
#: time, 35 MB more memory; 2^20 against 2^19: 3-4% less, the same peak
#: on the flow benchmark, 20 MB more on an event-dense one; 2^21 slower
#: again).
BATCH_ROWS = 1 << 20
#: Trace bytes whose packets a decode to Parquet decodes at a time.  The
#: flow loop opens the next window itself (no call from Python between
#: windows), and a window's packets reach only through its limit's PSB+:
#: 64 KiB windows, whose columns stay in cache, decode the flow benchmark's
#: perf.data with 6% less CPU than 512 KiB ones and the event-dense one's
#: with 9% less (16 KiB: as 64; 128 KiB: 1-2% more).
WINDOW_BYTES = 1 << 16
#: Rows per part file at most (4 batches of a decode to Parquet); a
#: partition with more is written as several files.
FILE_ROWS = 1 << 22
#: Parquet encodings per column (Apache Parquet "Encodings"): dictionaries
#: for the columns with few distinct values (code addresses included: a
#: program runs a bounded set of blocks; durations, 0 but where the time
#: changes), DELTA_BINARY_PACKED for the rising ones (row numbers, times)
#: and for durations once a chunk's dictionary is full; the rest PLAIN.
#: With zstd this is about a tenth of the default's size, written in half
#: its time.
BLOCKS_ENCODING = {
    "dictionary": ["queue", "tid", "pid", "ip", "instructions", "mode", "space", "symbol",
                   "image", "gap", "duration"],
    "delta": ["time", "duration", "row", "trace_offset"],
}  # fmt: skip
INSTRUCTIONS_ENCODING = {"dictionary": ["queue", "k", "ip"], "delta": ["row", "time"]}
#: Which values of the block and instruction columns stand for null.
BLOCKS_NULLS = {"time": pages.NULL_IF_NEGATIVE, "symbol": pages.NULL_IF_ZERO,
                "image": pages.NULL_IF_ZERO, "trace_offset": pages.NULL_IF_NEGATIVE}  # fmt: skip
INSTRUCTIONS_NULLS = {"time": pages.NULL_IF_NEGATIVE}
INSTRUCTIONS_SCHEMA = pa.schema(
    [("queue", pa.int32()), ("cpu", pa.int32()), ("row", pa.int64()), ("k", pa.int32()),
     ("ip", pa.uint64()), ("time", pa.int64())]
)  # fmt: skip
EVENTS_SCHEMA = pa.schema(
    [("queue", pa.int32()), ("cpu", pa.int32()), ("tid", pa.int64()), ("row", pa.int64()),
     ("kind", pa.string()), ("ip", pa.uint64()), ("payload", pa.uint64()),
     ("size", pa.int32()), ("time", pa.int64())]
)  # fmt: skip
GAPS_SCHEMA = pa.schema(
    [("queue", pa.int32()), ("cpu", pa.int32()), ("queue_tid", pa.int64()), ("seq", pa.int32()),
     ("trace_offset", pa.int64()), ("ip", pa.uint64()), ("tsc", pa.uint64()),
     ("reason", pa.string()), ("code", pa.int32())]
)  # fmt: skip
SYMBOLS_SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("module", pa.string()),
     ("function", pa.string()), ("start", pa.uint64()), ("size", pa.uint64()),
     ("image", pa.int64()), ("first_queue", pa.int32()), ("first_space", pa.int32()),
     ("first_index", pa.int64())]
)  # fmt: skip
IMAGES_SCHEMA = pa.schema([("id", pa.int64()), ("path", pa.string()), ("build_id", pa.string())])
COMMS_SCHEMA = pa.schema([("tid", pa.int64()), ("pid", pa.int64()), ("comm", pa.string())])
# One row per function call (``hwtrace decode --calls``): the thread, the
# CPU it was entered on, the callee's entry address and function
# (module!name), its entry time and duration (ns) and its instructions,
# from its entry through its return, both counted.
CALLS_SCHEMA = pa.schema(
    [("tid", pa.int64()), ("cpu", pa.int32()), ("entry", pa.uint64()), ("function", pa.string()),
     ("time", pa.int64()), ("duration", pa.int64()), ("instructions", pa.int64())]
)  # fmt: skip


def _hash64(*parts: object) -> int:
    """A signed 64-bit BLAKE2b of ``parts``: the same in every process and
    run (Python's ``hash`` of a string is not)."""
    text = "\0".join(str(p) for p in parts).encode("utf-8", "surrogateescape")
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little", signed=True)


def image_id(path: str, build_id: bytes | None = None) -> int:
    """The id of the file at ``path`` (with ``build_id`` when known)."""
    return _hash64("image", path, build_id.hex() if build_id else "")


def symbol_id(image: int, start: int, name: str) -> int:
    """The id of symbol ``name`` at ``start`` in image ``image``."""
    return _hash64("symbol", image, start, name)


def build_ids_of(sideband: object) -> dict[str, bytes]:
    """The build ids a recording's sideband knows, by mapped path."""
    out: dict[str, bytes] = {}
    spaces = getattr(sideband, "spaces", {})
    maps = [m for gens in spaces.values() for s in gens for m in s.mappings]
    maps += list(getattr(sideband, "kernel_mappings", []))
    for m in maps:
        if m.build_id:
            out.setdefault(m.path, m.build_id)
    return out


@dataclass
class _SymbolRow:
    name: str
    module: str
    function: str
    start: int
    size: int
    image: int
    first: tuple[int, int, int]  # (queue, space, index in its table): report's order


@dataclass
class Names:
    """The symbols and images that :func:`blocks_table` met, by id.

    Rows do not depend on what a :class:`Names` holds; it only gathers the
    names behind their ids.  Several (one per process) merge into one with
    :meth:`merge`, whatever the order of the batches each saw.
    """

    build_ids: Mapping[str, bytes] = field(default_factory=dict)
    symbols: dict[int, _SymbolRow] = field(default_factory=dict)
    images: dict[int, tuple[str, str]] = field(default_factory=dict)
    # Per symbol table (kept alive, so that its id() stays its own): the
    # ids of its symbols and images, worked out once.
    _tables: dict[int, tuple[SymbolTable, dict[int, tuple[int, int]]]] = field(
        default_factory=dict, repr=False
    )
    _sections: dict[int, tuple[object, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False
    )
    # Per symbol (its module, address and name): its ids and its image's.
    _by_name: dict[tuple[str, int, str], tuple[int, int]] = field(default_factory=dict, repr=False)
    # Per (symbol table, queue, space): the ids of the block addresses met.
    _by_ip: dict[tuple[int, int, int], _AddressIds] = field(default_factory=dict, repr=False)
    # Per (queue, block store): the ids of its distinct blocks so far.
    _by_key: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = field(
        default_factory=dict, repr=False
    )

    def image(self, path: str) -> int:
        bid = self.build_ids.get(path)
        iid = image_id(path, bid)
        if iid not in self.images:
            self.images[iid] = (path, bid.hex() if bid else "")
        return iid

    def ids_of(
        self, table: SymbolTable, used: np.ndarray, queue: int, space: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Symbol ids and image ids of symbols ``used`` (distinct indices
        into ``table``), met in address space ``space`` of ``queue``."""
        got = self._tables.get(id(table))
        if got is None:
            got = self._tables[id(table)] = (table, {})
        known: dict[int, tuple[int, int]] = got[1]
        sids = np.empty(used.shape[0], np.int64)
        iids = np.empty(used.shape[0], np.int64)
        for j, u in enumerate(used.tolist()):
            pair = known.get(u)
            if pair is None:
                # (a symbol met before in another table, a later set of a
                # process's mappings: its ids as then, not hashed again)
                module, start, name = table.module_name(u), int(table.start[u]), table.name(u)
                pair = self._by_name.get((module, start, name))
                if pair is None:
                    iid = self.image(module) if module else 0
                    pair = self._by_name[(module, start, name)] = (symbol_id(iid, start, name), iid)
                known[u] = pair
            sids[j], iids[j] = pair
            first = (queue, space, u)
            row = self.symbols.get(pair[0])
            if row is None:
                self.symbols[pair[0]] = _SymbolRow(
                    table.name(u), table.module_name(u), table.qualified_name(u),
                    int(table.start[u]), int(table.size[u]), pair[1], first,
                )  # fmt: skip
            elif first < row.first:
                row.first = first
        return sids, iids

    def ids_at(
        self, table: SymbolTable, index: np.ndarray, queue: int, space: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Symbol ids and image ids (0: none) of rows whose symbols are
        ``index`` into ``table`` (-1: none), met in ``space`` of ``queue``
        (:meth:`block_ids` asks only for addresses not met before)."""
        index = np.asarray(index, np.int64)
        s = np.zeros(index.shape[0], np.int64)
        i = np.zeros(index.shape[0], np.int64)
        found = index >= 0
        if found.any():
            used, inverse = np.unique(index[found], return_inverse=True)
            sids, iids = self.ids_of(table, used, queue, space)
            s[found], i[found] = sids[inverse], iids[inverse]
        return s, i

    def block_ids(self, q: QueueInfo, space: int, ip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Symbol ids and image ids (0: none) of blocks at ``ip`` that ran
        in address space ``space`` of queue ``q``: worked out once per
        address (:func:`_space_ids`), then found by it (a hot loop's few
        addresses make most of a flow's blocks)."""
        table = q.symbols(space)
        key = (id(table), q.index, space)
        known = self._by_ip.get(key)
        if known is None:
            known = self._by_ip[key] = _AddressIds(table)
        index, new = known.index(ip)
        if new.shape[0]:
            known.learn(*_space_ids(q, self, space, new, table))
        image = known.image[: known.count]
        symbol = np.empty(index.shape[0], np.int64)
        gather(known.symbol, index, symbol)
        if image.shape[0] and pages.one_value(image):
            # (mostly one file: no need to look it up a row)
            return symbol, repeated(image[0], index.shape[0], np.int64)
        by_row = np.empty(index.shape[0], np.int64)
        gather(known.image, index, by_row)
        return symbol, by_row

    def key_ids(self, q: QueueInfo, source: int, table: Mapping[str, np.ndarray]
                ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
        """Symbol and image ids of the distinct blocks of ``table`` (a block
        store's, ``source`` its number) of queue ``q``: a store's table only
        grows, so each block's are worked out once, when it is new."""
        n = table["ip"].shape[0]
        got = self._by_key.get((q.index, source))
        if got is None or got[0].shape[0] < n:
            known = 0 if got is None else got[0].shape[0]
            sym, img = np.zeros(n, np.int64), np.zeros(n, np.int64)
            if got is not None:
                sym[:known], img[:known] = got
            k_ip, k_space = table["ip"][known:], table["image"][known:]
            for space in distinct(k_space).tolist():
                sel = np.flatnonzero(k_space == space)
                sym[known + sel], img[known + sel] = self.block_ids(q, int(space), k_ip[sel])
            got = self._by_key[(q.index, source)] = (sym, img)
        return got[0][:n], got[1][:n]

    def sections(self, image: object) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Start, end and image id of an image's sections, by address."""
        got = self._sections.get(id(image))
        if got is None:
            starts, ends, ids = [], [], []
            for _, s in image.mappings():  # type: ignore[attr-defined]
                path = s.path or s.name
                starts.append(s.address)
                ends.append(s.end)
                ids.append(self.image(path) if path else 0)
            got = (
                image,
                np.array(starts, np.uint64),
                np.array(ends, np.uint64),
                np.array(ids, np.int64),
            )
            self._sections[id(image)] = got
        return got[1], got[2], got[3]

    def portable(self) -> Names:
        """Only the names met (no symbol tables): what another process
        needs to :meth:`merge` them, small to send."""
        return Names(symbols={k: _SymbolRow(**v.__dict__) for k, v in self.symbols.items()},
                     images=dict(self.images))  # fmt: skip

    def merge(self, other: Names) -> None:
        """Take in what ``other`` met."""
        self.images.update(other.images)
        for sid, row in other.symbols.items():
            mine = self.symbols.get(sid)
            if mine is None:
                self.symbols[sid] = _SymbolRow(**row.__dict__)
            elif row.first < mine.first:
                mine.first = row.first

    def symbols_table(self) -> pa.Table:
        ids = sorted(self.symbols)
        rows = [self.symbols[i] for i in ids]
        return pa.Table.from_pydict(
            {
                "id": ids,
                "name": [r.name for r in rows],
                "module": [r.module for r in rows],
                "function": [r.function for r in rows],
                "start": [r.start for r in rows],
                "size": [r.size for r in rows],
                "image": [r.image for r in rows],
                "first_queue": [r.first[0] for r in rows],
                "first_space": [r.first[1] for r in rows],
                "first_index": [r.first[2] for r in rows],
            },
            schema=SYMBOLS_SCHEMA,
        )

    def images_table(self) -> pa.Table:
        ids = sorted(self.images)
        return pa.Table.from_pydict(
            {
                "id": ids,
                "path": [self.images[i][0] for i in ids],
                "build_id": [self.images[i][1] for i in ids],
            },
            schema=IMAGES_SCHEMA,
        )


class _AddressIds:
    """The symbol and image ids of the block addresses of one address
    space met so far, by address: a hash table (compiled, as a Parquet
    dictionary's) numbers the addresses in the order met."""

    def __init__(self, table: SymbolTable) -> None:
        self.table = table  # (kept alive: its id() is part of the key)
        self.count = 0
        self.keys = np.zeros(1 << 10, np.int64)
        self.slots = np.full(1 << 10, -1, np.int64)
        self.entries = np.zeros(1 << 9, np.int64)
        self.symbol = np.zeros(1 << 9, np.int64)
        self.image = np.zeros(1 << 9, np.int64)
        self.rows = np.empty(0, np.int64)

    def index(self, ip: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each address's number, and the addresses new among them (whose
        ids :meth:`learn` takes next)."""
        values = np.ascontiguousarray(ip).view(np.int64)
        if self.rows.shape[0] < values.shape[0]:
            self.rows = np.empty(max(values.shape[0], 2 * self.rows.shape[0]), np.int64)
        out = self.rows[: values.shape[0]]
        before = self.count
        while True:
            got = pages.index_values(values, self.keys, self.slots, self.entries, self.count, out)
            if got >= 0:
                break
            self.count = -2 - got
            self._grow()
        self.count = got
        return out, self.entries[before:got].view(np.uint64)

    def learn(self, symbol: np.ndarray, image: np.ndarray) -> None:
        """The ids of the addresses :meth:`index` found new."""
        lo = self.count - symbol.shape[0]
        self.symbol[lo : self.count] = symbol
        self.image[lo : self.count] = image

    def _grow(self) -> None:
        size = 4 * self.slots.shape[0]
        self.keys = np.zeros(size, np.int64)
        self.slots = np.full(size, -1, np.int64)
        for name in ("entries", "symbol", "image"):
            grown = np.zeros(size // 2, np.int64)
            grown[: self.count] = getattr(self, name)[: self.count]
            setattr(self, name, grown)
        pages.place_entries(self.keys, self.slots, self.entries, self.count)


def _ids(b: PerfBlocks, names: Names) -> tuple[np.ndarray, np.ndarray]:
    """Per block: its symbol's id and its image's id (0: none), from the
    symbols of the address space it ran in (as ``hwtrace report`` looks
    them up), else from the file section holding its address."""
    parts = b.images()
    if len(parts) == 1:
        return names.block_ids(b.queue, parts[0][0], b.ip)
    n = len(b)
    sym = np.zeros(n, np.int64)
    img = np.zeros(n, np.int64)
    for space, sel in parts:
        sym[sel], img[sel] = names.block_ids(b.queue, space, b.ip[sel])
    return sym, img


def _space_ids(
    q: QueueInfo, names: Names, space: int, ip: np.ndarray, table: SymbolTable
) -> tuple[np.ndarray, np.ndarray]:
    """The symbol and image ids of blocks at ``ip`` that ran in address
    space ``space`` of queue ``q``."""
    index = table.index_of(ip)
    s, i = names.ids_at(table, index, q.index, space)
    # Code no symbol covers: the file its section is of.
    rest = np.flatnonzero((index < 0) | (i == 0))
    if rest.shape[0] and space < len(q.images):
        starts, ends, ids = names.sections(q.images[space])
        if starts.shape[0]:
            k = np.searchsorted(starts, ip[rest], side="right").astype(np.int64) - 1
            ok = (k >= 0) & (ip[rest] < ends[np.maximum(k, 0)])
            i[rest[ok]] = ids[k[ok]]
    return s, i


def _keyed_ids(b: PerfBlocks, names: Names) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`_ids` of the distinct blocks of ``b.key_table`` (once a block,
    not once a row: see :meth:`Names.key_ids`), which of them ``b``'s rows
    name, and the rows' instructions."""
    t = b.key_table
    named, n_insn = pages.named_keys(b.keys, t["ninsn"])
    sym, img = names.key_ids(b.queue, b.key_source, t)
    return sym, img, named, n_insn


def _nullable(values: np.ndarray, missing: np.ndarray, kind: pa.DataType) -> pa.Array:
    return pa.array(values, type=kind, mask=missing if missing.any() else None)


def blocks_columns(b: PerfBlocks,
                   names: Names) -> dict[str, np.ndarray | RowNumbers | Keyed | Runs]:  # fmt: skip
    """One batch of attributed blocks as numpy columns of
    :data:`BLOCKS_SCHEMA` (nulls as :data:`BLOCKS_NULLS` says); a column
    of one value is a read-only broadcast of it, ``row`` a
    :class:`~.parquet_file.RowNumbers`, ``time`` and ``duration`` as the
    batch has them (:class:`~hwtrace.columns.Runs` in a stream of a
    thread's queue to Parquet), and when the batch has block keys
    the columns of the block (``ip``, ``instructions``, ``symbol``,
    ``image``) are :class:`~.parquet_file.Keyed` (``numpy.asarray`` gives
    any one's values).

    The rows depend only on the batch: the same batch gives the same rows in
    any process, whatever ``names`` met before (``names`` gathers the
    symbols and images the ids stand for).  ``row`` numbers the block in
    its queue, ``trace_offset`` is where in the queue's trace (the AUXTRACE
    records' data in order) its decoding began (-1: not known).
    """
    n = len(b)
    q = b.queue
    offset = _int64s(b.offset) if b.offset is not None else repeated(-1, n, np.int64)
    one = b.uniform
    ip: np.ndarray | Keyed
    ninsn: np.ndarray | Keyed
    if b.keys is not None and b.key_table is not None:
        # (columns of the block: a dictionary of the batch's distinct
        # blocks, each row its key)
        t = b.key_table
        sym_k, img_k, named, n_insn = _keyed_ids(b, names)
        src = b.key_source
        ip = Keyed(b.keys, t["ip"], src)
        ninsn = Keyed(b.keys, t["ninsn"].astype(np.int64), src, n_insn)
        sym = Keyed(b.keys, sym_k, src)
        images = img_k[named]
        if images.shape[0] and (images == images[0]).all():
            img = repeated(int(images[0]), n, np.int64)  # (mostly one file)
        else:
            img = Keyed(b.keys, img_k, src)
        space = (Keyed(b.keys, t["image"].astype(np.int64), src) if isinstance(b.image, Keyed)
                 else _one_value(b.image, np.int32, "image" in one))  # fmt: skip
    else:
        ip, ninsn = np.asarray(b.ip, np.uint64), np.asarray(b.ninsn, np.int64)
        sym, img = _ids(b, names)
        img = _one_value(img, np.int64)
        space = _one_value(b.image, np.int32, "image" in one)
    return {
        "queue": repeated(q.index, n, np.int32),
        "cpu": repeated(q.cpu, n, np.int32),
        "tid": _one_value(b.tid, np.int64, "tid" in one),
        "pid": _one_value(b.pid, np.int64, "pid" in one),
        "time": _int64s(b.ns),
        "duration": _int64s(b.duration),
        "ip": ip,
        "instructions": ninsn,
        "mode": _one_value(b.mode, np.uint8, "mode" in one),
        "space": space,
        "symbol": sym,
        "image": img,
        "row": RowNumbers(b.row, n),
        "gap": _one_value(b.gap, np.bool_),
        "trace_offset": offset,
    }


def _int64s(values: np.ndarray | Runs | OffsetPoints) -> np.ndarray | Runs | OffsetPoints:
    """A column of int64 values as it is (runs stay runs, offset points
    points)."""
    return values if isinstance(values, Runs | OffsetPoints) else np.asarray(values, np.int64)


def _one_value(values: np.ndarray, kind: type, known: bool = False) -> np.ndarray:
    """``values`` as ``kind``: a broadcast of one when all are the same
    (most columns of a batch of one thread are; ``known``: they are)."""
    values = np.asarray(values)
    if values.shape[0] and (known or values.strides[0] == 0):
        return repeated(values[0], values.shape[0], kind)
    if not values.shape[0] or values[0] != values[-1]:
        return np.asarray(values, kind)
    # (bytes are few: numpy's comparison; wider values, a compiled pass that
    # stops at the first stretch that differs)
    same = (values == values[0]).all() if values.itemsize == 1 else pages.one_value(values)
    return repeated(values[0], values.shape[0], kind) if same else np.asarray(values, kind)


def _table(columns: Mapping[str, np.ndarray | RowNumbers], schema: pa.Schema,
           nulls: Mapping[str, int]) -> pa.Table:  # fmt: skip
    """Numpy columns as an Arrow table, with their nulls."""
    arrays = []
    for f in schema:
        v = np.asarray(columns[f.name])
        rule = nulls.get(f.name, pages.NOT_NULL)
        missing = None if rule == pages.NOT_NULL else (v < 0 if rule == pages.NULL_IF_NEGATIVE
                                                       else v == 0)  # fmt: skip
        arrays.append(
            pa.array(
                v, type=f.type, mask=missing if missing is not None and missing.any() else None
            )
        )
    return pa.Table.from_arrays(arrays, schema=schema)


def blocks_table(b: PerfBlocks, names: Names) -> pa.Table:
    """One batch of attributed blocks as rows (:data:`BLOCKS_SCHEMA`), as
    :func:`blocks_columns` gives them."""
    return _table(blocks_columns(b, names), BLOCKS_SCHEMA, BLOCKS_NULLS)


def events_table(b: PerfBlocks) -> pa.Table:
    """The PTWRITE payloads among a batch's blocks (:data:`EVENTS_SCHEMA`):
    ``row`` is the block each follows (-1: before the queue's first)."""
    m = b.ptw
    if m is None or not len(m):
        return EVENTS_SCHEMA.empty_table()
    n = len(m)
    at = np.asarray(m.at, np.int64)
    before = np.maximum(at - 1, 0)
    tid = b.tid[np.minimum(before, max(len(b) - 1, 0))] if len(b) else np.full(n, b.queue.tid)
    ns = np.asarray(m.ns, np.int64)
    return pa.Table.from_arrays(
        [
            pa.array(np.full(n, b.queue.index, np.int32)),
            pa.array(np.full(n, b.queue.cpu, np.int32)),
            pa.array(np.asarray(tid, np.int64)),
            pa.array(b.row + at - 1),
            pa.array(np.full(n, "ptwrite", object), pa.string()),
            pa.array(np.asarray(m.ip, np.uint64)),
            pa.array(np.asarray(m.payload, np.uint64)),
            pa.array(np.asarray(m.size, np.int32)),
            _nullable(ns, ns < 0, pa.int64()),
        ],
        schema=EVENTS_SCHEMA,
    )


def instructions_columns(b: PerfBlocks) -> dict[str, np.ndarray]:
    """Every instruction of a batch as numpy columns of
    :data:`INSTRUCTIONS_SCHEMA`: the block ``row`` it is in, its place
    ``k`` in that block, its address and the block's time (-1: unknown)."""
    ips = b.instructions()
    per = np.asarray(b.ninsn, np.int64)
    total = ips.shape[0]
    starts = np.cumsum(per) - per
    k = np.arange(total, dtype=np.int64) - np.repeat(starts, per)
    return {
        "queue": np.full(total, b.queue.index, np.int32),
        "cpu": np.full(total, b.queue.cpu, np.int32),
        "row": np.repeat(b.row + np.arange(len(b), dtype=np.int64), per),
        "k": k.astype(np.int32),
        "ip": np.asarray(ips, np.uint64),
        "time": np.repeat(np.asarray(b.ns, np.int64), per),
    }


def instructions_table(b: PerfBlocks) -> pa.Table:
    """Every instruction of a batch (:data:`INSTRUCTIONS_SCHEMA`), as
    :func:`instructions_columns` gives them."""
    return _table(instructions_columns(b), INSTRUCTIONS_SCHEMA, INSTRUCTIONS_NULLS)


#: Writes between two returns of Arrow's free memory to the system.
RELEASE_EVERY = 32


def _then_release(fn: Callable[..., object]) -> Callable[..., object]:
    """``fn``, then Arrow's memory pool hands back what it keeps unused:
    its default pool (mimalloc) otherwise keeps the pages of freed
    buffers, most of all those freed by another thread than the one that
    allocated them, and a long decode grew by 0.5 MB/s."""

    def run(*args: object, **kwargs: object) -> object:
        try:
            return fn(*args, **kwargs)
        finally:
            pa.default_memory_pool().release_unused()

    return run


def _held_bytes(column: object) -> int:
    """The memory a batch's column holds (a broadcast of one value: one)."""
    if isinstance(column, np.ndarray):
        return column.itemsize if column.ndim and column.strides[0] == 0 else column.nbytes
    if isinstance(column, Keyed):
        return column.keys.nbytes
    if isinstance(column, Runs):
        return column.starts.nbytes + column.values.nbytes
    if isinstance(column, Deferred):
        return column.nbytes
    return 0


def _bucket_runs(starts: np.ndarray, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows' buckets, given from rows ``starts`` on, as runs of one bucket
    (each run's first row, its bucket)."""
    keep = np.append(True, buckets[1:] != buckets[:-1])
    return starts[keep], buckets[keep]


def _batch_bytes(b: PerfBlocks) -> int:
    """About the memory a batch of blocks holds until it is written."""
    columns = (b.ip, b.ninsn, b.mode, b.ns, b.duration, b.tid, b.pid, b.image, b.run, b.gap,
               b.offset, b.keys)  # fmt: skip
    return sum(_held_bytes(c) for c in columns)


class _Io:
    """Where the Parquet writes run: in the caller's thread, or (``background``)
    in order on one thread of their own, at most ``depth`` behind, so a
    single decoding process encodes and compresses row groups (Arrow's
    writer releases the GIL) while it decodes the next batch.  A write
    that says what memory it holds (``weight``) may wait beside more, up
    to ``most``, while those waiting hold at most ``budget`` bytes: a
    batch given by block keys (a few MB) queues where one laid out (tens
    of MB) would not, and the decoding thread runs on through the
    writer's slower batches instead of waiting for each (an event-dense
    trace to Parquet: a tenth less time).  A failed write is raised by
    the next call."""

    def __init__(self, background: bool, depth: int = 2, most: int = 8,
                 budget: int = 32 << 20) -> None:  # fmt: skip
        self.worker = -1  # the thread's ident, once it runs
        self.pool = (
            ThreadPoolExecutor(1, thread_name_prefix="hwtrace-parquet", initializer=self._started)
            if background
            else None
        )
        self.depth, self.most, self.budget = depth, most, budget
        self.pending: deque[tuple[Future, int]] = deque()
        self.weight = 0  # the bytes the writes waiting hold
        self.calls = 0

    def _started(self) -> None:
        self.worker = threading.get_ident()

    @property
    def elsewhere(self) -> bool:
        """Whether a write given now runs on the thread of its own (not in
        the caller's: no thread, or the caller is that thread)."""
        return self.pool is not None and threading.get_ident() != self.worker

    def run(self, fn: Callable[..., object], *args: object, **kwargs: object) -> None:
        self.submit(None, fn, *args, **kwargs)

    def submit(self, weight: int | None, fn: Callable[..., object], *args: object,
               **kwargs: object) -> None:  # fmt: skip
        """:meth:`run` a write that holds ``weight`` bytes (None: not known)."""
        self.calls += 1
        if self.calls % RELEASE_EVERY == 0:
            fn = _then_release(fn)
        if not self.elsewhere:
            # (a write that a write on the thread asks for runs there and then)
            fn(*args, **kwargs)
            return
        while self.pending and (
            len(self.pending) >= self.most
            or (len(self.pending) >= self.depth
                and (weight is None or self.weight + weight > self.budget))
        ):  # fmt: skip
            self._done()
        self.pending.append((self.pool.submit(fn, *args, **kwargs), weight or 0))
        self.weight += weight or 0

    def _done(self) -> None:
        future, weight = self.pending.popleft()
        self.weight -= weight
        future.result()

    def wait(self) -> None:
        """Until every write is done (raising the first that failed)."""
        while self.pending:
            self._done()

    def stop(self) -> None:
        """Wait for what is running, drop the rest, end the thread."""
        for f, _ in self.pending:
            f.cancel()
        self.pending.clear()
        self.weight = 0
        if self.pool is not None:
            self.pool.shutdown(wait=True)


class _Partitioned:
    """A Hive-partitioned dataset (``cpu=N/bucket=K/part-NNNNN.parquet``)
    written a batch at a time: rows wait per partition until a row group's
    worth (or the budget of waiting rows) is reached; at most ``max_open``
    files are open, the least recently written closed first (a partition
    written again later gets a new part file).

    Rows come as numpy columns (``nulls``: which values stand for null).
    Files are written by the compiled writer (:mod:`.parquet_file`) when it
    stores every column and the compression is one it offers, else by
    Arrow's; either way in ``io``'s thread."""

    def __init__(
        self, root: Path, schema: pa.Schema, metadata: dict[bytes, bytes], *,
        row_group: int, budget: int, max_open: int, compression: str,
        encoding: Mapping[str, list[str]] | None = None,
        nulls: Mapping[str, int] | None = None, prefix: str = "part",
        hidden: bool = False, io: _Io | None = None,
    ) -> None:  # fmt: skip
        self.root, self.prefix, self.hidden = root, prefix, hidden
        self.io = io or _Io(False)
        self.written: list[Path] = []
        enc = encoding or {}
        self.nulls = dict(nulls or {})
        self.options: dict[str, object] = {"compression": compression}
        if enc:
            self.options["use_dictionary"] = list(enc.get("dictionary", []))
            # (a column also a dictionary's: delta once the dictionary is
            # full, in this writer only; Arrow's goes PLAIN)
            delta = [c for c in enc.get("delta", []) if c not in enc.get("dictionary", [])]
            self.options["column_encoding"] = dict.fromkeys(delta, "DELTA_BINARY_PACKED")
        # The partition columns live in the directory names only.
        self.schema = schema.remove(schema.get_field_index("cpu")).with_metadata(metadata)
        self.specs = (column_specs(self.schema, enc, self.nulls)
                      if compression in COMPRESSIONS else None)  # fmt: skip
        self.scratch = _Scratch() if self.specs is not None else None
        self.row_group, self.budget, self.max_open = row_group, budget, max_open
        self.compression = compression
        self.waiting: dict[tuple[int, int], list[Piece]] = {}
        self.counts: dict[tuple[int, int], int] = {}
        self.total = 0
        self.open: OrderedDict[tuple[int, int], ParquetFileWriter | pq.ParquetWriter] = (
            OrderedDict()
        )
        self.in_file: dict[tuple[int, int], int] = {}  # rows in each open file
        # Files closed whose footers may still be being written (see
        # ParquetFileWriter.close_ahead).
        self.closing: list[ParquetFileWriter] = []
        self.parts: dict[tuple[int, int], int] = {}
        self.rows = 0

    def write(self, columns: Mapping[str, np.ndarray], cpu: int,
              bucket: np.ndarray | tuple[np.ndarray, np.ndarray] | int) -> None:  # fmt: skip
        """Rows (numpy columns, all of one length) of CPU ``cpu``, each in
        time bucket ``bucket``, all in that one, or by its runs (each run's
        first row, its bucket)."""
        n = next(iter(columns.values())).shape[0]
        if n == 0:
            return
        self.rows += n
        if isinstance(bucket, int | np.integer):
            edges, top = [0, n], int(bucket)
            first = [int(bucket)]
        else:
            if isinstance(bucket, np.ndarray):
                # Perf time rises along a queue: buckets come in runs.
                bucket = _bucket_runs(np.arange(n, dtype=np.int64), bucket)
            starts, values = bucket
            edges = [*starts.tolist(), n]
            first = values.tolist()
            top = max(first)
        for (lo, hi), b in zip(itertools.pairwise(edges), first, strict=True):
            key = (cpu, int(b))
            piece = columns if (lo, hi) == (0, n) else {c: v[lo:hi] for c, v in columns.items()}
            self.waiting.setdefault(key, []).append((piece, hi - lo))
            self.counts[key] = self.counts.get(key, 0) + hi - lo
            self.total += hi - lo
            # (The dataset's first rows are a row group at once: the writing
            # thread, idle until then, starts while the next batch decodes.)
            if self.counts[key] >= self.row_group or not self.parts:
                self._flush(key)
        # A queue's later rows come in later buckets: this CPU's earlier
        # buckets are done (an open file holds its encoders and metadata;
        # a queue going back in time writes a new part file).
        done = {k for k in (*self.open, *self.waiting) if k[0] == cpu and 0 <= k[1] < top}
        for key in sorted(done):
            self._flush(key)
            w = self.open.pop(key, None)
            if w is not None:
                self.in_file.pop(key, None)
                self._close_file(w)
        if self.total > self.budget:
            for key in sorted(self.waiting, key=lambda k: -self.counts[k]):
                self._flush(key)
                if self.total <= self.budget // 2:
                    break

    def _close_file(self, w: ParquetFileWriter | pq.ParquetWriter) -> None:
        if isinstance(w, ParquetFileWriter):
            # (those written by now let go: a writer holds its file's
            # metadata; wait raises what failed)
            while self.closing and self.closing[0].closed():
                self.closing.pop(0).wait()
            self.closing.append(w)
            self.io.run(w.close_ahead)
        else:
            self.io.run(w.close)

    def _new_writer(self, path: Path) -> ParquetFileWriter | pq.ParquetWriter:
        if self.specs is not None:
            # (on a thread of its own, the writes go on on the compressing
            # thread while the next row group is encoded)
            return ParquetFileWriter(path, self.schema, self.specs, self.schema.metadata,
                                     self.compression, self.scratch,
                                     ahead=self.io.pool is not None)  # fmt: skip
        return pq.ParquetWriter(path, self.schema, **self.options)

    def _write_group(self, w: ParquetFileWriter | pq.ParquetWriter, pieces: list[Piece]) -> None:
        if isinstance(w, ParquetFileWriter):
            w.write_row_group(pieces)
            return
        tables = [_table({c: v[:n] for c, v in cols.items()}, self.schema, self.nulls)
                  for cols, n in pieces]  # fmt: skip
        w.write_table(pa.concat_tables(tables), row_group_size=self.row_group)

    def _flush(self, key: tuple[int, int]) -> None:
        parts = self.waiting.pop(key, None)
        if not parts:
            return
        n = self.counts.pop(key)
        self.total -= n
        w = self.open.get(key)
        if w is None:
            if len(self.open) >= self.max_open:
                old_key, old = self.open.popitem(last=False)
                self.in_file.pop(old_key, None)
                self._close_file(old)
            part = self.parts.get(key, 0)
            self.parts[key] = part + 1
            d = self.root / f"cpu={key[0]}" / f"bucket={key[1]}"
            d.mkdir(parents=True, exist_ok=True)
            w = self._new_writer(_name(d, f"{self.prefix}-{part:05d}.parquet", self.hidden,
                                       self.written))  # fmt: skip
            self.open[key] = w
        else:
            self.open.move_to_end(key)
        self.io.run(self._write_group, w, parts)
        self.in_file[key] = self.in_file.get(key, 0) + n
        if self.in_file[key] >= FILE_ROWS:
            # A writer keeps every row group's metadata until the file is
            # closed: a file per FILE_ROWS keeps that bounded too.
            self._close_file(self.open.pop(key))
            del self.in_file[key]

    def flush(self) -> None:
        """Write the rows waiting for a row group's worth (in ``io``'s
        thread: :meth:`_Io.wait` for them, then :meth:`wait_written`)."""
        for key in list(self.waiting):
            self._flush(key)

    def wait_written(self) -> None:
        """Until the open files' row groups are written (theirs are written
        ahead, see ParquetFileWriter; ``io`` idle: after :meth:`_Io.wait`)."""
        for w in self.open.values():
            if isinstance(w, ParquetFileWriter):
                w.wait()
        while self.closing:
            self.closing.pop(0).wait()

    def close(self, empty_file: bool = True) -> None:
        self.flush()
        if not self.parts and empty_file:
            # No rows: one empty file, so that readers find the schema.
            d = self.root / "cpu=-1" / "bucket=-1"
            d.mkdir(parents=True, exist_ok=True)
            pq.write_table(self.schema.empty_table(), d / "part-00000.parquet")
        while self.open:
            _, w = self.open.popitem(last=False)
            self._close_file(w)
        self.io.wait()
        while self.closing:
            self.closing.pop(0).wait()
        _reveal(self.written)


def _name(d: Path, name: str, hidden: bool, written: list[Path]) -> Path:
    """Where to write file ``name`` of directory ``d``: under a hidden name
    (readers skip names starting with a dot) until :func:`_reveal`, when
    the file may be cut short by a process that dies."""
    path = d / name
    if hidden:
        written.append(path)
        return d / f".{name}.tmp"
    return path


def _reveal(written: list[Path]) -> None:
    """Give finished hidden files their names (a rename: atomic)."""
    for path in written:
        (path.parent / f".{path.name}.tmp").replace(path)
    written.clear()


class _Plain:
    """An unpartitioned dataset written in parts as rows come."""

    def __init__(self, root: Path, schema: pa.Schema, metadata: dict[bytes, bytes],
                 row_group: int, compression: str, prefix: str = "part",
                 hidden: bool = False, io: _Io | None = None) -> None:  # fmt: skip
        self.root, self.schema = root, schema.with_metadata(metadata)
        self.io = io or _Io(False)
        self.prefix, self.hidden = prefix, hidden
        self.written: list[Path] = []
        self.row_group, self.compression = row_group, compression
        self.waiting: list[pa.Table] = []
        self.count = 0
        self.rows = 0
        self.writer: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if table.num_rows:
            self.waiting.append(table)
            self.count += table.num_rows
            self.rows += table.num_rows
            if self.count >= self.row_group:
                self._flush()

    def _flush(self) -> None:
        if self.writer is None:
            self.root.mkdir(parents=True, exist_ok=True)
            path = _name(self.root, f"{self.prefix}-00000.parquet", self.hidden, self.written)
            self.writer = pq.ParquetWriter(path, self.schema,
                                           compression=self.compression)  # fmt: skip
        if self.waiting:
            self.io.run(self.writer.write_table, pa.concat_tables(self.waiting),
                        row_group_size=self.row_group)  # fmt: skip
        self.waiting, self.count = [], 0

    def close(self, empty_file: bool = True) -> None:
        # An empty dataset still gets its (empty) file: readers find the schema.
        if not empty_file and not self.rows:
            return
        self._flush()
        assert self.writer is not None
        self.io.run(self.writer.close)
        self.io.wait()
        _reveal(self.written)


class FlowParquetWriter:
    """Writes a decoded flow into ``directory`` (see the module doc), batch
    by batch, in bounded memory.

    ``metadata``: settings and provenance (JSON-able), kept in every
    file's key-value metadata and in ``_meta.json``.  ``bucket_ns``: the
    width of the time buckets blocks are partitioned by; ``instructions``:
    also write one row per instruction.  ``names``: gathers the symbols and
    images (give the recording's build ids, :func:`build_ids_of`).
    ``row_group``: the rows of a row group at least (default
    :data:`BLOCKS_ROW_GROUP` for blocks, :data:`ROW_GROUP` for the rest).

    ``part``: write only blocks, instructions and events, into the
    directory another writer made, in files named ``PART-NNNNN.parquet``
    (hidden until :meth:`close`): several processes write one flow so, and
    the directory's writer counts their rows (:meth:`add_part`) and writes
    the rest.  ``background``: encode and write the Parquet files on a
    thread of their own, overlapping the caller's decoding (one process
    then uses about two cores).
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        metadata: Mapping[str, object],
        *,
        names: Names | None = None,
        bucket_ns: int = 1_000_000_000,
        instructions: bool = False,
        row_group: int | None = None,
        budget_rows: int = 1 << 21,
        max_open: int = 64,
        compression: str = "zstd",
        part: str | None = None,
        background: bool = False,
    ) -> None:
        self.root = Path(directory)
        self.io = _Io(background)
        self.part = part
        if part is None:
            if self.root.exists() and any(self.root.iterdir()):
                raise FileExistsError(f"{self.root}: exists and is not empty")
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise FileNotFoundError(f"{self.root}: no such directory")
        names_of = {"prefix": part or "part", "hidden": part is not None, "io": self.io}
        self.external = {"blocks": 0, "events": 0, "instructions": 0}
        self.names = names if names is not None else Names()
        self.bucket_ns = max(int(bucket_ns), 1)
        self.metadata = {"format": FORMAT, "bucket_ns": self.bucket_ns,
                         "instructions": bool(instructions), **metadata}  # fmt: skip
        kv = {META_KEY: json.dumps(self.metadata, sort_keys=True).encode()}
        self._kv = kv
        self.compression = compression
        block_group = row_group or BLOCKS_ROW_GROUP
        row_group = row_group or ROW_GROUP
        self.blocks = _Partitioned(self.root / "blocks", BLOCKS_SCHEMA, kv, row_group=block_group,
                                   budget=budget_rows, max_open=max_open,
                                   compression=compression, encoding=BLOCKS_ENCODING,
                                   nulls=BLOCKS_NULLS, **names_of)  # fmt: skip
        self.instructions = (
            _Partitioned(self.root / "instructions", INSTRUCTIONS_SCHEMA, kv,
                         row_group=row_group, budget=budget_rows, max_open=max_open,
                         compression=compression, encoding=INSTRUCTIONS_ENCODING,
                         nulls=INSTRUCTIONS_NULLS, **names_of)
            if instructions else None
        )  # fmt: skip
        self.events = _Plain(self.root / "events", EVENTS_SCHEMA, kv, row_group, compression,
                             **names_of)  # fmt: skip
        self.gaps = _Plain(self.root / "gaps", GAPS_SCHEMA, kv, row_group, compression,
                           io=self.io)  # fmt: skip
        self._n_insn = 0
        self.closed = False

    @property
    def n_insn(self) -> int:
        """The instructions of the blocks written (all those given so far:
        the writes still running on the thread of its own are waited for)."""
        if self.io.elsewhere:
            self.io.wait()
        return self._n_insn

    def drain(self) -> None:
        """Write every block (and instruction) given so far, the rows
        waiting for a row group's worth too, and wait until they are
        written: what a decode's time must include.  More may be given
        after."""
        self.io.wait()  # (the batches given: their rows join those waiting)
        self.blocks.flush()
        if self.instructions is not None:
            self.instructions.flush()
        self.io.wait()
        for d in (self.blocks, self.instructions):
            if d is not None:
                d.wait_written()

    def _bucket(self, ns: np.ndarray | Runs) -> tuple[np.ndarray, np.ndarray] | int:
        """The rows' time bucket (-1: time unknown): the one of them all,
        or as runs (each run's first row, its bucket).  Perf time rises
        along a queue: a batch's buckets are a few runs, found among its
        time's runs or by searching its times, not by dividing each row's."""
        bucket_ns = self.bucket_ns
        values = ns.values if isinstance(ns, Runs) else np.asarray(ns, np.int64)
        if not len(values):
            return -1
        lo, hi = pages.min_max(values)
        if lo >= 0 and lo // bucket_ns == hi // bucket_ns:
            return lo // bucket_ns
        if hi < 0:
            return -1
        if not isinstance(ns, Runs) and (values[1:] >= values[:-1]).all():
            # The unknown times first, then the first row of each bucket
            # (the last of those that start at one row: the others are
            # buckets the times jump over).
            known = int(np.searchsorted(values, 0, "left"))
            edges = np.arange(values[known] // bucket_ns, hi // bucket_ns + 1, dtype=np.int64)
            starts = np.searchsorted(values, edges * bucket_ns, "left")
            if known:
                starts, edges = np.append(0, starts), np.append(-1, edges)
            keep = np.append(starts[:-1] != starts[1:], True)
            return starts[keep], edges[keep]
        starts = ns.starts if isinstance(ns, Runs) else np.arange(len(values), dtype=np.int64)
        return _bucket_runs(starts, np.where(values >= 0, values // bucket_ns, -1))

    def write_blocks(self, b: PerfBlocks, expand_insns: int = 1 << 18) -> None:
        """One batch of blocks (and its PTWRITE marks); its instructions too
        when asked for, ``expand_insns`` at a time.  With a thread of its
        own, the batch's columns are made there too (symbols looked up,
        block keys counted), not in the decoding thread: the batch's
        arrays are the writer's from now on."""
        if self.io.elsewhere:
            self.io.submit(_batch_bytes(b), self._write_blocks, b, expand_insns)
        else:
            self._write_blocks(b, expand_insns)

    def _write_blocks(self, b: PerfBlocks, expand_insns: int) -> None:
        b = b.resolved()
        if not len(b):
            self.write_events(b)
            return
        cpu = b.queue.cpu
        cols = blocks_columns(b, self.names)
        self.blocks.write(cols, cpu, self._bucket(b.ns))
        insns = cols["instructions"]
        self._n_insn += insns.sum() if isinstance(insns, Keyed) else int(np.asarray(insns).sum())
        if self.instructions is not None:
            # (the block columns laid out: a stream to Parquet may give its
            # block's columns by key)
            for part in b.dense().split(expand_insns):
                cols = instructions_columns(part)
                self.instructions.write(cols, cpu, self._bucket(cols["time"]))
        self.write_events(b)

    def write_events(self, b: PerfBlocks) -> None:
        """The decoder events a batch carries (PTWRITE payloads)."""
        if b.ptw is not None and len(b.ptw):
            self.events.write(events_table(b))

    def write_gaps(self, queue: QueueInfo | int, gaps: Sequence[Gap], cpu: int = -1,
                   tid: int = -1) -> None:  # fmt: skip
        """A queue's gaps (a :class:`QueueInfo`, or its number with its cpu and tid)."""
        if isinstance(queue, QueueInfo):
            queue, cpu, tid = queue.index, queue.cpu, queue.tid
        n = len(gaps)
        if not n:
            return
        self.gaps.write(
            pa.Table.from_pydict(
                {
                    "queue": [queue] * n,
                    "cpu": [cpu] * n,
                    "queue_tid": [tid] * n,
                    "seq": list(range(n)),
                    "trace_offset": [g.offset for g in gaps],
                    "ip": [g.ip for g in gaps],
                    "tsc": [g.time for g in gaps],
                    "reason": [g.reason for g in gaps],
                    "code": [g.code for g in gaps],
                },
                schema=GAPS_SCHEMA,
            )
        )

    def write_comms(self, comms: Mapping[int, tuple[int, str]]) -> None:
        """Thread names: tid -> (pid, comm)."""
        tids = sorted(comms)
        t = pa.Table.from_pydict(
            {"tid": tids, "pid": [comms[t][0] for t in tids], "comm": [comms[t][1] for t in tids]},
            schema=COMMS_SCHEMA,
        )
        self._single("comms", t)

    def write_calls(self, columns: Mapping[str, object]) -> None:
        """Every function call (:data:`CALLS_SCHEMA`'s columns)."""
        self._single("function_calls", pa.Table.from_pydict(dict(columns), schema=CALLS_SCHEMA))

    def _single(self, name: str, table: pa.Table) -> None:
        d = self.root / name
        d.mkdir(parents=True, exist_ok=True)
        pq.write_table(table.replace_schema_metadata(self._kv), d / "part-00000.parquet",
                       compression=self.compression)  # fmt: skip

    def add_part(self, rows: Mapping[str, int], n_insn: int, names: Names) -> None:
        """Count the rows a ``part`` writer wrote (its :meth:`close`'s
        ``rows``, instructions decoded and names)."""
        for k in self.external:
            self.external[k] += int(rows.get(k, 0))
        self._n_insn += int(n_insn)
        self.names.merge(names)

    def close(self, extra: Mapping[str, object] | None = None) -> dict[str, object]:
        """Finish every file, write the symbols, images and ``_meta.json``
        (with ``extra``: what became known while decoding); returns the
        metadata written.  A ``part`` writer finishes its files only and
        returns ``{"rows": ...}``."""
        if self.closed:
            return self.metadata
        self.closed = True
        try:
            return self._close(extra)
        finally:
            self.io.stop()

    def _close(self, extra: Mapping[str, object] | None) -> dict[str, object]:
        self.io.wait()  # (the batches still being written)
        ext = self.external
        self.blocks.close(empty_file=self.part is None and not ext["blocks"])
        if self.instructions is not None:
            self.instructions.close(empty_file=self.part is None and not ext["instructions"])
        self.events.close(empty_file=self.part is None and not ext["events"])
        if self.part is not None:
            rows = {"blocks": self.blocks.rows, "events": self.events.rows}
            if self.instructions is not None:
                rows["instructions"] = self.instructions.rows
            return {"rows": rows}
        self.gaps.close()
        self._single("symbols", self.names.symbols_table())
        self._single("images", self.names.images_table())
        if not (self.root / "comms").exists():
            self.write_comms({})
        rows = {"blocks": self.blocks.rows + ext["blocks"],
                "events": self.events.rows + ext["events"], "gaps": self.gaps.rows,
                "symbols": len(self.names.symbols), "images": len(self.names.images)}  # fmt: skip
        if self.instructions is not None:
            rows["instructions"] = self.instructions.rows + ext["instructions"]
        meta = {**self.metadata, **(extra or {}), "rows": rows}
        tmp = self.root / "_meta.json.tmp"
        tmp.write_text(json.dumps(meta, indent=1, sort_keys=True) + "\n")
        tmp.replace(self.root / "_meta.json")
        self.metadata = meta
        return meta

    def abort(self) -> None:
        """Close the open files after a failure (the directory is left
        without ``_meta.json``: readers see it is incomplete)."""
        if self.closed:
            return
        self.closed = True
        self.io.stop()  # no write runs while the files are closed
        for d in (self.blocks, self.instructions):
            if d is not None:
                while d.open:
                    d.open.popitem(last=False)[1].close()
        for p in (self.events, self.gaps):
            if p.writer is not None:
                p.writer.close()


def threads_of(b: PerfBlocks) -> list[int]:
    """The threads a batch of blocks ran in (mostly one: no sort then)."""
    if not len(b):
        return []
    first = int(b.tid[0])
    if "tid" in b.uniform or (b.tid == first).all():
        return [first]
    return np.unique(b.tid).tolist()


def finish_dataset(
    writer: FlowParquetWriter,
    flow: PerfStream,
    tids: Iterable[int],
    extra: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """Write what follows a decoded flow's blocks (per queue its gaps, the
    threads' pids and commands, the queues and problems into ``_meta.json``)
    and close ``writer``; returns the metadata written."""
    for q in flow.queues:
        writer.write_gaps(q, q.gaps)
    sb = flow.sideband
    writer.write_comms({t: (sb.pid_of(t) if t >= 0 else -1, sb.comm_of(t) if t >= 0 else "?")
                        for t in tids})  # fmt: skip
    queues = [{"index": q.index, "cpu": q.cpu, "tid": q.tid, "trace_bytes": q.trace_bytes,
               "blocks": q.n_blocks, "instructions": q.n_insn, "gaps": len(q.gaps)}
              for q in flow.queues]  # fmt: skip
    return writer.close(
        {"queues": queues, "problems": list(flow.problems), "n_gaps": flow.n_gaps,
         "instructions_decoded": writer.n_insn} | dict(extra or {})
    )  # fmt: skip


def write_dataset(
    session: PerfSession,
    directory: str | os.PathLike[str],
    *,
    instructions: bool = False,
    bucket_ns: int = 1_000_000_000,
    metadata: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """Decode ``session`` into a Parquet dataset in ``directory`` (new or
    empty): blocks, events, gaps, symbols, images, comms and, with
    ``instructions``, a row per instruction, as ``hwtrace decode`` writes
    it.  Returns the dataset's metadata (``_meta.json``)."""
    names = Names(build_ids=build_ids_of(session.sideband))
    meta = {"input": {"path": str(session.path)}, "calls": list(session.calls)}
    writer = FlowParquetWriter(directory, dict(metadata or meta), names=names,
                               bucket_ns=bucket_ns, instructions=instructions,
                               background=True)  # fmt: skip
    tids: set[int] = set()

    def take(b: PerfBlocks) -> None:
        writer.write_blocks(b)
        tids.update(threads_of(b))

    try:
        flow = session.decode(take, batch_rows=BATCH_ROWS, runs=False, window_bytes=WINDOW_BYTES,
                              deferred=True)  # fmt: skip
        return finish_dataset(writer, flow, tids)
    except BaseException:
        writer.abort()
        raise


class FunctionCallRows:
    """The ``function_calls`` dataset (``hwtrace decode --function-calls``):
    every call of every thread, from the per-thread stack of calls
    ``funclatency`` walks (:mod:`hwtrace.analysis.latency`), so a call's
    instructions are the same: its entry through its return.  Call
    :meth:`feed` on each batch of blocks, then :meth:`write`."""

    def __init__(self) -> None:
        # (the latency walk compiles loops: loaded when calls are asked for)
        from ..analysis.feed import LatencyFeed
        from ..analysis.latency import LatencyProfiler
        from ..analysis.patterns import PatternSet

        self.profiler = LatencyProfiler(PatternSet(), keep=True, every_call=True)
        self.latency = LatencyFeed(self.profiler)

    def feed(self, b: PerfBlocks) -> None:
        """Walk a batch's calls (its columns whole, as the walk's loops
        take them)."""
        self.latency(b.dense())

    def write(self, writer: FlowParquetWriter) -> dict[str, int]:
        """The calls into ``writer``'s ``function_calls``; what to note in
        the metadata."""
        result = self.latency.result()
        iv = result.intervals
        heads = result.path_heads() if result.paths else np.zeros(1, np.uint64)
        entry = heads[iv.path] if len(iv) else np.zeros(0, np.uint64)
        uniq, inverse = np.unique(entry, return_inverse=True)
        names = np.array([self.latency.name(int(x), with_module=True) or f"{int(x):#x}"
                          for x in uniq.tolist()] or [""], object)  # fmt: skip
        writer.write_calls({
            "tid": iv.key, "cpu": iv.cpu.astype(np.int32), "entry": entry,
            "function": names[inverse.reshape(-1)] if len(iv) else names[:0], "time": iv.t_open,
            "duration": iv.dt, "instructions": iv.dic,
        })  # fmt: skip
        return {"function_calls": len(iv), "function_calls_dropped_for_gaps": result.gapped_calls}

    def close(self) -> None:
        self.latency.close()
