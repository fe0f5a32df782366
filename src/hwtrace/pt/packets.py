"""The Intel PT packet layer: bytes to packets and packets to bytes.

Decoding produces a :class:`PacketTable`, a struct of numpy arrays with one row
per packet (see :mod:`hwtrace.pt.kinds` for what the payload columns mean),
plus the decode errors met on the way.  The per-byte work is compiled
(:mod:`hwtrace.pt._loops`, imported on first use: importing this module
does not import numba); this module allocates, loops over chunks and offers
a friendly per-packet view (:class:`Packet`).

Large files are memory-mapped and decoded in chunks split at PSB boundaries,
which is also how decoding goes parallel (:func:`iter_chunks`,
:func:`decode_file`).
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ._state import STOP_ERRORS, STOP_ROWS, new_decoder_state, packet_errata
from .config import PtConfig
from .kinds import ERROR_TEXT, IP_KINDS, KIND_NAMES, DecodeError, Kind

# Names of the payload columns per kind, for the friendly view and JSON.
FIELD_NAMES: dict[Kind, tuple[str | None, str | None, str | None]] = {
    Kind.TIP: ("ip", "ipc", None),
    Kind.TIP_PGE: ("ip", "ipc", None),
    Kind.TIP_PGD: ("ip", "ipc", None),
    Kind.FUP: ("ip", "ipc", None),
    Kind.TNT8: ("bits", "nbits", None),
    Kind.TNT64: ("bits", "nbits", None),
    Kind.MODE_EXEC: ("mode", None, None),
    Kind.MODE_TSX: ("mode", None, None),
    Kind.PIP: ("cr3", "nr", None),
    Kind.VMCS: ("base", None, None),
    Kind.CBR: ("ratio", None, None),
    Kind.TSC: ("tsc", None, None),
    Kind.MTC: ("ctc", None, None),
    Kind.TMA: ("ctc", "fc", None),
    Kind.CYC: ("value", None, None),
    Kind.MNT: ("payload", None, None),
    Kind.PTW: ("payload", "plc", "ip"),
    Kind.EXSTOP: (None, None, "ip"),
    Kind.MWAIT: ("hints", "ext", None),
    Kind.PWRE: ("state", "sub_state", "hw"),
    Kind.PWRX: ("last", "deepest", "wake"),
    Kind.BBP: ("type", "sz", None),
    Kind.BIP: ("payload", "id", "sz4"),
    Kind.BEP: (None, None, "ip"),
    Kind.CFE: ("type", "vector", "ip"),
    Kind.EVD: ("payload", "type", None),
    Kind.TRIG: ("trbv", "icnt", "flags"),
}


@dataclass(frozen=True, slots=True)
class Packet:
    """One packet.  ``a``, ``b``, ``c`` are the payload columns; named views
    such as ``ip``, ``cr3`` or ``tsc`` are available through :meth:`get` and
    :meth:`fields`.  Equality ignores where the packet was found."""

    kind: Kind
    a: int = 0
    b: int = 0
    c: int = 0
    offset: int = field(default=-1, compare=False)
    size: int = field(default=0, compare=False)

    @classmethod
    def make(cls, kind: Kind | str, **named: int) -> Packet:
        """Build a packet from named fields, e.g. ``Packet.make("tip", ip=0x1000, ipc=6)``."""
        if isinstance(kind, str):
            kind = KIND_BY_NAME[kind]
        cols = [0, 0, 0]
        names = FIELD_NAMES.get(kind, (None, None, None))
        for key, value in named.items():
            if key not in names:
                raise ValueError(f"{KIND_NAMES[kind]} has no field {key!r} (fields: {names})")
            cols[names.index(key)] = int(value)
        return cls(kind, cols[0], cols[1], cols[2])

    @property
    def name(self) -> str:
        return KIND_NAMES[self.kind]

    def fields(self) -> dict[str, int]:
        names = FIELD_NAMES.get(self.kind, (None, None, None))
        return {n: v for n, v in zip(names, (self.a, self.b, self.c), strict=True) if n}

    def get(self, name: str) -> int:
        return self.fields()[name]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"offset": self.offset, "size": self.size, "kind": self.name}
        d.update(self.fields())
        return d


KIND_BY_NAME = {name: Kind(k) for k, name in KIND_NAMES.items()}


@dataclass(frozen=True, slots=True)
class DecodeIssue:
    """A place where decoding failed; decoding resumed at the next PSB."""

    offset: int
    code: DecodeError
    index: int  # number of packets decoded before it

    @property
    def message(self) -> str:
        return ERROR_TEXT[self.code]

    def __str__(self) -> str:
        return f"offset {self.offset:#x}: {self.message}"


_EMPTY_U64 = np.zeros(0, np.uint64)


@dataclass
class PacketTable:
    """Decoded packets as columns (one row per packet) and the decode errors."""

    offset: np.ndarray  # int64, file offset of each packet
    kind: np.ndarray  # uint8, a Kind
    size: np.ndarray  # uint8
    a: np.ndarray  # uint64 payload column
    b: np.ndarray  # uint32 payload column
    c: np.ndarray  # uint8 flags column
    err_offset: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    err_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    err_index: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    synced: bool = True  # False: no PSB was found to start from

    @classmethod
    def empty(cls, synced: bool = True) -> PacketTable:
        return cls(
            np.zeros(0, np.int64),
            np.zeros(0, np.uint8),
            np.zeros(0, np.uint8),
            _EMPTY_U64.copy(),
            np.zeros(0, np.uint32),
            np.zeros(0, np.uint8),
            synced=synced,
        )

    def __len__(self) -> int:
        return int(self.offset.shape[0])

    def __getitem__(self, i: int) -> Packet:
        return Packet(
            Kind(int(self.kind[i])),
            int(self.a[i]),
            int(self.b[i]),
            int(self.c[i]),
            int(self.offset[i]),
            int(self.size[i]),
        )

    def __iter__(self) -> Iterator[Packet]:
        for i in range(len(self)):
            yield self[i]

    @property
    def errors(self) -> list[DecodeIssue]:
        return [
            DecodeIssue(int(o), DecodeError(int(c)), int(i))
            for o, c, i in zip(self.err_offset, self.err_code, self.err_index, strict=True)
        ]

    def packets(self) -> list[Packet]:
        return list(self)

    def counts(self) -> dict[str, int]:
        """How many packets of each kind."""
        kinds, counts = np.unique(self.kind, return_counts=True)
        return {KIND_NAMES[int(k)]: int(n) for k, n in zip(kinds, counts, strict=True)}

    @staticmethod
    def concat(tables: Sequence[PacketTable]) -> PacketTable:
        if not tables:
            return PacketTable.empty()
        base = 0
        idx = []
        for t in tables:
            idx.append(t.err_index + base)
            base += len(t)
        return PacketTable(
            *(np.concatenate([getattr(t, f) for t in tables]) for f in _COLS),
            err_offset=np.concatenate([t.err_offset for t in tables]),
            err_code=np.concatenate([t.err_code for t in tables]),
            err_index=np.concatenate(idx),
            synced=any(t.synced for t in tables),
        )


_COLS = ("offset", "kind", "size", "a", "b", "c")


def as_buffer(data: bytes | bytearray | memoryview | np.ndarray) -> np.ndarray:
    """View bytes-like data as a uint8 array without copying."""
    if isinstance(data, np.ndarray):
        return data.view(np.uint8).reshape(-1)
    return np.frombuffer(data, dtype=np.uint8)


def sync_forward(data: Any, offset: int = 0) -> int:
    """Offset of the first PSB at or after ``offset``, or -1."""
    buf = as_buffer(data)
    if offset >= buf.shape[0]:
        return -1
    return int(_loops().sync_forward(buf, offset, 0, buf.shape[0]))


def sync_backward(data: Any, offset: int | None = None) -> int:
    """Offset of the last PSB starting before ``offset`` (default: the end), or -1."""
    buf = as_buffer(data)
    end = buf.shape[0]
    return int(_loops().sync_backward(buf, end if offset is None else offset, 0, end))


def _loops() -> Any:
    """The compiled loops (importing them imports numba: only when used)."""
    from . import _loops as K

    return K


class ColumnBuffers:
    """Columns of the given types kept from one use to the next.

    A decoder that reads a trace window by window would otherwise write
    every window into fresh memory, and in a virtual machine the page
    faults of fresh memory cost more than decoding into it.  What
    :meth:`take` returns is valid until the next call."""

    def __init__(self, dtypes: tuple) -> None:
        self.dtypes = dtypes
        self._cols: tuple[np.ndarray, ...] = tuple(np.empty(0, t) for t in dtypes)

    def take(self, n: int) -> tuple[np.ndarray, ...]:
        """Columns of at least ``n`` rows (their contents undefined)."""
        if self._cols[0].shape[0] < n:
            # (A quarter to spare: a window a few bytes longer than the first,
            # as most are, would otherwise make new columns of half as many
            # rows again, all fresh memory; rows never written cost none.)
            cap = max(n + n // 4, self._cols[0].shape[0] * 3 // 2)
            self._cols = tuple(np.empty(cap, t) for t in self.dtypes)
        return self._cols

    def columns(self) -> tuple[np.ndarray, ...]:
        """The columns :meth:`take` last returned, whole (what was written
        into them is in views of their first rows)."""
        return self._cols


class PacketBuffers(ColumnBuffers):
    """Packet columns (:data:`ROW_TYPES`) with the decoder state and error
    columns :func:`decode_range` also needs, all kept from one call to the
    next: a decoder reading a trace window by window then hands the packet
    loop the very arrays of its last call, which it does not look at again
    (a fresh record array alone costs more to pass than a small window
    costs to decode)."""

    def __init__(self) -> None:
        super().__init__(ROW_TYPES)
        self._states: dict[tuple[bool, int], tuple[np.ndarray, np.ndarray]] = {}
        self._errors = new_errors(1024)

    def decoder_state(self, resync: bool, errata: int) -> np.ndarray:
        """The kept decoder state, set to a new one's (not synchronising)."""
        fresh, state = self.decoder_states(resync, errata)
        state[...] = fresh
        return state

    def decoder_states(self, resync: bool, errata: int) -> tuple[np.ndarray, np.ndarray]:
        """A new decoder state (not synchronising) and the kept one, as
        they are (a compiled caller copies the one into the other)."""
        got = self._states.get((resync, errata))
        if got is None:
            fresh = new_decoder_state(sync=False, resync=resync, errata=errata)
            got = self._states[(resync, errata)] = (fresh, fresh.copy())
        return got

    def errors(self) -> tuple[np.ndarray, ...]:
        """The kept error columns (their contents undefined)."""
        return self._errors


def decode_range(
    buf: np.ndarray,
    start: int,
    end: int,
    *,
    resync: bool = True,
    errata: int = 0,
    buffers: ColumnBuffers | None = None,
) -> PacketTable:
    """Decode ``buf[start:end]`` assuming a packet starts at ``start``.

    Offsets are positions in ``buf``.  Errors are recorded and, with
    ``resync``, decoding goes on at the next PSB.  With ``buffers`` (of
    :data:`ROW_TYPES`) the table's columns are views of them, valid until
    their next use; :class:`PacketBuffers` also keep the decoder's state
    and error columns.
    """
    K = _loops()
    kept = buffers if isinstance(buffers, PacketBuffers) else None
    if kept is not None:
        state = kept.decoder_state(resync, errata)
    else:
        state = new_decoder_state(sync=False, resync=resync, errata=errata)
    s = state[0]
    s["pos"] = s["sync_pos"] = start
    s["final"] = 1
    # (The loop reads no further than ``end``: the buffer itself is passed,
    # the same object from call to call.)
    parts: list[PacketTable] = []
    ecap = 1024
    while True:
        # No packet is shorter than a byte: one row per byte never overflows
        # (and rows never written cost no memory).
        cap = max(64, end - int(s["pos"]) + 64)
        rows = new_rows(cap) if buffers is None or parts else buffers.take(cap)
        errs = kept.errors() if kept is not None and not parts else new_errors(ecap)
        s["errors"] = 0
        stop = K.decode_stream(buf, end, state, rows, errs, True)
        parts.append(table_of(rows, errs, int(s["rows"]), int(s["errors"])))
        if stop != STOP_ERRORS and stop != STOP_ROWS:
            break
        ecap *= 2
    return parts[0] if len(parts) == 1 else PacketTable.concat(parts)


# The packet columns' types, in the order the kernels take them.
ROW_TYPES = (np.int64, np.uint8, np.uint8, np.uint64, np.uint32, np.uint8)


def new_rows(capacity: int) -> tuple[np.ndarray, ...]:
    """Empty packet columns (offset, kind, size, a, b, c) for the decoder."""
    return tuple(np.empty(capacity, t) for t in ROW_TYPES)


def new_errors(capacity: int) -> tuple[np.ndarray, ...]:
    """Empty error columns (offset, DecodeError, row index) for the decoder."""
    return (np.empty(capacity, np.int64), np.empty(capacity, np.int8), np.empty(capacity, np.int64))


def table_of(
    rows: tuple[np.ndarray, ...], errs: tuple[np.ndarray, ...], n: int, nerr: int
) -> PacketTable:
    """The first ``n`` rows and ``nerr`` errors the decoder wrote, as a table
    (views, not copies)."""
    offs, kinds, sizes, a, b, c = rows
    eo, ec, ei = errs
    return PacketTable(
        offs[:n], kinds[:n], sizes[:n], a[:n], b[:n], c[:n], eo[:nerr], ec[:nerr], ei[:nerr]
    )


def decode(
    data: bytes | bytearray | memoryview | np.ndarray,
    *,
    sync: bool = True,
    resync: bool = True,
    config: PtConfig | None = None,
) -> PacketTable:
    """Decode a PT byte stream into a :class:`PacketTable`.

    With ``sync`` (the default) decoding starts at the first PSB, as Intel's
    decoder does; without it, a packet is assumed to start at offset 0.
    ``config`` selects the CPU's errata workarounds.
    """
    buf = as_buffer(data)
    end = buf.shape[0]
    start = 0
    if sync:
        start = sync_forward(buf)
        if start < 0:
            return PacketTable.empty(synced=False)
    return decode_range(buf, start, end, resync=resync, errata=packet_errata(config))


def map_file(path: str | os.PathLike[str]) -> np.ndarray:
    """Memory-map a file read-only as a uint8 array (empty files give an empty array)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return np.zeros(0, np.uint8)
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    return np.frombuffer(mm, dtype=np.uint8)


class _Spliced:
    """The pages of a file mapped at ``address`` (``file_bytes`` of it) and
    followed by memory of another kind (see :func:`register_spliced`):
    :meth:`madvise` as mmap's, applied to the file's pages only."""

    def __init__(self, holder: object, address: int, file_bytes: int) -> None:
        import ctypes

        self.holder = weakref.ref(holder)
        self.address, self.file_bytes = address, file_bytes
        self._madvise = ctypes.CDLL(None).madvise
        self._madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def madvise(self, flag: int, start: int, length: int) -> None:
        end = min(start + length, self.file_bytes // mmap.PAGESIZE * mmap.PAGESIZE)
        if end > start:
            self._madvise(self.address + start, end - start, flag)


_SPLICED: dict[int, _Spliced] = {}


def register_spliced(holder: object, address: int, file_bytes: int) -> None:
    """Arrays over ``holder`` (memory at ``address`` whose first
    ``file_bytes`` map a file, the rest not) are released as a mapped file's
    are (:func:`release`), their other memory kept."""
    key = id(holder)
    _SPLICED[key] = _Spliced(holder, address, file_bytes)
    weakref.finalize(holder, _SPLICED.pop, key, None)


def _mapping(buf: np.ndarray) -> tuple[mmap.mmap | _Spliced | None, np.ndarray]:
    """The file mapping ``buf`` is a view of (None: not one), and the array
    over the whole of it."""
    root = buf
    while isinstance(root.base, np.ndarray):
        root = root.base
    mm = root.base
    if isinstance(mm, memoryview):  # np.frombuffer keeps a view of the mapping
        mm = mm.obj
    if isinstance(mm, mmap.mmap):
        return mm, root
    spliced = _SPLICED.get(id(mm))
    if spliced is not None and spliced.holder() is mm:
        return spliced, root
    return None, root


def is_mapped(buf: np.ndarray) -> bool:
    """Is ``buf`` (a view of) a mapped file (:func:`map_file`)?"""
    return _mapping(buf)[0] is not None


def release(buf: np.ndarray, start: int, end: int) -> None:
    """Tell the kernel ``buf[start:end]`` of a mapped file (:func:`map_file`)
    is not needed any more, so reading a large trace front to back keeps
    only what is in use resident.  Other buffers are left alone."""
    mm, root = _mapping(buf)
    if mm is None or end <= start:
        return
    shift = buf.ctypes.data - root.ctypes.data  # buf may be a slice of the mapping
    page = mmap.PAGESIZE
    first = -(-(start + shift) // page) * page
    last = ((end + shift) // page) * page
    if last > first:
        mm.madvise(mmap.MADV_DONTNEED, first, last - first)


#: How far around a touched page the kernel may map others of the file:
#: Linux's fault-around (``fault_around_bytes``, 64 KiB) maps whole folios
#: of the page cache, which are up to 2 MiB on recent kernels.
FAULT_AROUND = 2 << 20


def read_released(buf: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """A copy of ``buf[lo:hi]``; the pages of a mapped file around it are let
    go (with the ones the kernel mapped beside them), so reading a little of
    every MiB of a large trace leaves nothing resident."""
    out = np.array(buf[lo:hi])
    release(buf, max(0, lo - FAULT_AROUND), min(buf.shape[0], hi + FAULT_AROUND))
    return out


def psb_plus_end(buf: np.ndarray, psb: int, end: int | None = None,
                 missing: int | None = None) -> int:  # fmt: skip
    """The offset just after the PSBEND of the PSB+ at ``psb``, reading no
    further than ``end`` (the buffer's end by default); ``missing`` (default
    ``end``) when no PSBEND follows or the packets break off first.  One
    compiled walk over the packets (a window's decoder asks at every
    window)."""
    end = buf.shape[0] if end is None else end
    got = int(_loops().psb_plus_end(buf, psb, end))
    if got >= 0:
        return got
    return end if missing is None else missing


def psb_chunks(buf: np.ndarray, chunk_bytes: int = 16 << 20) -> list[tuple[int, int]]:
    """Split a stream into ``(start, end)`` ranges of about ``chunk_bytes``
    that each begin at a PSB, so each can be decoded on its own."""
    starts, _ = psb_cuts(buf, chunk_bytes)
    if not starts:
        return []
    return list(zip(starts, [*starts[1:], buf.shape[0]], strict=True))


def psb_cuts(buf: np.ndarray, chunk_bytes: int) -> tuple[list[int], list[int]]:
    """Where :func:`psb_chunks` cuts ``buf`` (PSB offsets), and where each
    of those PSBs' PSB+ ends (the PSB's offset where it breaks off or the
    buffer ends first); one compiled pass."""
    room = buf.shape[0] // max(int(chunk_bytes), 1) + 2
    starts, ends = np.empty(room, np.int64), np.empty(room, np.int64)
    n = int(_loops().psb_cuts(buf, int(chunk_bytes), starts, ends))
    return starts[:n].tolist(), ends[:n].tolist()


def iter_chunks(
    data: str | os.PathLike[str] | bytes | np.ndarray,
    chunk_bytes: int = 16 << 20,
) -> Iterator[PacketTable]:
    """Decode a stream (a path is memory-mapped) chunk by chunk, in order.

    Memory use is bounded by the chunk size, so files larger than memory work.
    """
    buf = map_file(data) if isinstance(data, (str, os.PathLike)) else as_buffer(data)
    for start, end in psb_chunks(buf, chunk_bytes):
        yield decode_range(buf, start, end)


def decode_file(
    path: str | os.PathLike[str],
    *,
    jobs: int | None = None,
    chunk_bytes: int = 16 << 20,
) -> PacketTable:
    """Decode a whole file, split at PSBs and decoded on ``jobs`` threads
    (default: all cores); the result is in stream order."""
    buf = map_file(path)
    ranges = psb_chunks(buf, chunk_bytes)
    if not ranges:
        return PacketTable.empty(synced=False)
    jobs = jobs or os.cpu_count() or 1
    if jobs == 1 or len(ranges) == 1:
        return PacketTable.concat([decode_range(buf, s, e) for s, e in ranges])
    from concurrent.futures import ThreadPoolExecutor  # here: ptdump starts without it

    with ThreadPoolExecutor(jobs) as pool:
        return PacketTable.concat(list(pool.map(lambda r: decode_range(buf, *r), ranges)))


def count_packets(
    data: str | os.PathLike[str] | bytes | np.ndarray,
    *,
    jobs: int = 1,
    chunk_bytes: int = 16 << 20,
) -> int:
    """Decode a whole stream into columns and return the packet count.

    This is the benchmark's unit of work: every packet fully decoded and
    stored, chunk by chunk so memory stays bounded.
    """
    buf = map_file(data) if isinstance(data, (str, os.PathLike)) else as_buffer(data)
    ranges = psb_chunks(buf, chunk_bytes)

    def one(r: tuple[int, int]) -> int:
        return len(decode_range(buf, *r))

    if jobs <= 1 or len(ranges) <= 1:
        return sum(one(r) for r in ranges)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as pool:
        return sum(pool.map(one, ranges))


# --------------------------------------------------------------------------
# Encoding


def compress_ip(ip: int, last_ip: int | None) -> tuple[int, int]:
    """Choose the smallest IP compression that reproduces ``ip`` given the
    decoder's last IP, as the hardware does.  Returns ``(ipc, payload)``."""
    ip &= (1 << 64) - 1
    if last_ip is not None:
        if (ip >> 16) == (last_ip >> 16):
            return 1, ip & 0xFFFF
        if (ip >> 32) == (last_ip >> 32):
            return 2, ip & 0xFFFFFFFF
    top = ip >> 47
    if top == 0 or top == (1 << 17) - 1:
        return 3, ip & 0xFFFFFFFFFFFF
    if last_ip is not None and (ip >> 48) == (last_ip >> 48):
        return 4, ip & 0xFFFFFFFFFFFF
    return 6, ip


def encode_table(kinds: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> bytes:
    """Encode packet columns to bytes."""
    kinds = np.ascontiguousarray(kinds, np.uint8)
    a = np.ascontiguousarray(a, np.uint64)
    b = np.ascontiguousarray(b, np.uint32)
    c = np.ascontiguousarray(c, np.uint8)
    # Upper bound: no packet is longer than 16 bytes.
    out = np.empty(16 * kinds.shape[0] + 16, np.uint8)
    n = int(_loops().encode_rows(kinds, a, b, c, out))
    if n < 0:
        row = -n - 1
        bad = Packet(Kind(int(kinds[row])), int(a[row]), int(b[row]), int(c[row]))
        raise ValueError(f"packet {row} cannot be encoded: {bad}")
    return out[:n].tobytes()


def encode(packets: Iterable[Packet] | PacketTable) -> bytes:
    """Encode packets to bytes: ``decode(encode(x), sync=False)`` gives ``x`` back."""
    if isinstance(packets, PacketTable):
        return encode_table(packets.kind, packets.a, packets.b, packets.c)
    pk = list(packets)
    if not pk:
        return b""
    return encode_table(
        np.fromiter((int(p.kind) for p in pk), np.uint8, len(pk)),
        np.fromiter((p.a & (1 << 64) - 1 for p in pk), np.uint64, len(pk)),
        np.fromiter((p.b for p in pk), np.uint32, len(pk)),
        np.fromiter((p.c for p in pk), np.uint8, len(pk)),
    )


__all__ = [
    "FIELD_NAMES",
    "IP_KINDS",
    "ColumnBuffers",
    "DecodeIssue",
    "Packet",
    "PacketBuffers",
    "PacketTable",
    "compress_ip",
    "count_packets",
    "decode",
    "decode_file",
    "decode_range",
    "encode",
    "encode_table",
    "iter_chunks",
    "map_file",
    "psb_chunks",
    "psb_cuts",
    "psb_plus_end",
    "sync_backward",
    "sync_forward",
]
