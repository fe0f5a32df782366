"""Reading perf.data: file mode and pipe mode.

:func:`read_perf_data` (or :class:`PerfData` directly) maps a file (or takes
bytes, or reads a pipe such as stdin) and gives:

* ``header``: the file header (:class:`FileHeader`), ``pipe`` for pipe mode;
* ``attrs``: the events (:class:`EventAttr`: attr, sample IDs, name), from
  the attrs section or the HEADER_ATTR records of pipe mode;
* ``features``: parsed feature sections by :class:`~.features.Feature`
  (file mode: the sections after the data; pipe mode: HEADER_FEATURE
  records), ``raw_features`` their bytes;
* ``records``: the data section indexed by a compiled walk into numpy
  columns, one row per record (:data:`RECORD_COLUMNS`): ``offset``, ``type``,
  ``misc``, ``size`` (header.size), ``payload`` (bytes following the record
  outside header.size: AUXTRACE data), ``attr`` (index into ``attrs`` as
  perf resolves it, -1 if none), and the sample_id fields ``time`` (-1 when
  absent), ``pid``, ``tid``, ``cpu`` (-1) and ``id`` (0);
* :meth:`PerfData.samples`: SAMPLE records decoded into columns without a
  Python loop per sample;
* :meth:`PerfData.record` / :meth:`PerfData.user_record`: one record's body
  (kernel types through :mod:`hwtrace.perf.records`, perf's own through
  :mod:`hwtrace.perf.user`); :meth:`PerfData.auxtrace` the AUXTRACE
  records with zero-copy payload views; :attr:`PerfData.auxtrace_info`,
  :attr:`PerfData.intel_pt`, :attr:`PerfData.time_conv`.

Bad input: a file that cannot be read at all (no magic, a truncated header,
an attrs section beyond the file) raises :class:`PerfDataError` naming the
file and offset.  Damage inside the data or feature sections does not: the
reader keeps every record it can read before and after the damage
(resynchronising on the next plausible record), lists each unreadable
stretch in ``gaps`` and describes it in ``errors`` (PerfDataError objects).
Unknown record types are indexed, skipped by the typed accessors and warned
about once per type.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ..columns import distinct
from ..pt.packets import register_spliced, release
from . import _loops as K
from .attr import AttrError, PerfEventAttr
from .features import Feature, FeatureError, parse_feature
from .records import Record, RecordError, RecordType, parse_record
from .user import Auxtrace, AuxtraceInfo, HeaderAttr, HeaderFeature, IntelPtInfo, TimeConv
from .user import parse_user_record as _parse_user

__all__ = [
    "MAGIC",
    "RECORD_COLUMNS",
    "EventAttr",
    "FileHeader",
    "PerfData",
    "PerfDataError",
    "PerfDataWarning",
    "SampleProblem",
    "Samples",
    "read_perf_data",
]

MAGIC = b"PERFILE2"
FILE_HEADER_SIZE = 104
PIPE_HEADER_SIZE = 16
RECORD_COLUMNS = (
    "offset",
    "type",
    "misc",
    "size",
    "payload",
    "attr",
    "time",
    "pid",
    "tid",
    "cpu",
    "id",
)
_RESOLVED = ("attr", "time", "pid", "tid", "cpu", "id")
GAP_REASONS = {
    K.GAP_SIZE: "impossible record size (below the 8-byte header)",
    K.GAP_BEYOND: "record goes beyond the end of the data",
    K.GAP_TRUNCATED_HEADER: "truncated record header",
    K.GAP_AUX_CUT: "AUXTRACE record's trace cut short by the end of the data",
}


class PerfDataError(Exception):
    """Bad perf.data input: ``path``, ``offset`` (file offset) and ``message``."""

    def __init__(self, path: str, offset: int, message: str) -> None:
        super().__init__(path, offset, message)
        self.path = path
        self.offset = offset
        self.message = message

    def __str__(self) -> str:
        return f"{self.path}: offset {self.offset:#x}: {self.message}"


class PerfDataWarning(UserWarning):
    """Something in a perf.data this reader skips (an unknown record type)."""


@dataclass
class FileHeader:
    """``struct perf_file_header`` (pipe mode: magic and size only)."""

    size: int
    attr_size: int = 0
    attrs_offset: int = 0
    attrs_size: int = 0
    data_offset: int = 0
    data_size: int = 0
    event_types_offset: int = 0
    event_types_size: int = 0
    features: tuple[int, ...] = ()  # set feature bits


@dataclass
class EventAttr:
    """One event: its attr, its sample IDs and (from EVENT_DESC) its name."""

    attr: PerfEventAttr
    ids: tuple[int, ...] = ()
    name: str = ""


@dataclass
class Samples:
    """SAMPLE records as columns (see ``_loops.SAMPLE_COLUMNS``).

    ``record`` is each sample's row in ``PerfData.records``, ``attr`` its
    event; ``columns`` the names present for the events' sample_types (every
    column of :data:`_loops.SAMPLE_COLUMNS` can be read, absent ones are 0).
    Offsets (``callchain_offset``, ``raw_offset``, ``branch_offset``, …) are
    relative to the record start: ``data.buf[records.offset[r] + off]``.
    ``bad`` is nonzero for samples too short for their fields.
    """

    record: np.ndarray
    attr: np.ndarray
    matrix: np.ndarray = field(repr=False)
    columns: tuple[str, ...]

    def __len__(self) -> int:
        return self.record.shape[0]

    def __getitem__(self, name: str) -> np.ndarray:
        col = self.matrix[:, K.SAMPLE_COLUMNS.index(name)]
        if name in ("pid", "tid", "cpu"):
            return col.astype(np.uint32).view(np.int32)
        if name == "time":
            return col.view(np.int64)
        return col


_COLUMNS_OF_BIT = {
    1 << 16: ("identifier",), 1: ("ip",), 2: ("pid", "tid"), 4: ("time",), 8: ("addr",),
    64: ("id",), 512: ("stream_id",), 128: ("cpu",), 256: ("period",),
    32: ("callchain_offset", "callchain_nr"), 1024: ("raw_offset", "raw_size"),
    2048: ("branch_offset", "branch_nr"), 4096: ("regs_user_abi", "regs_user_offset"),
    8192: ("stack_user_offset", "stack_user_size", "stack_user_dyn_size"),
    1 << 14: ("weight",), 1 << 24: ("weight",), 1 << 15: ("data_src",),
    1 << 17: ("transaction",), 1 << 18: ("regs_intr_abi", "regs_intr_offset"),
    1 << 19: ("phys_addr",), 1 << 21: ("cgroup",), 1 << 22: ("data_page_size",),
    1 << 23: ("code_page_size",), 1 << 20: ("aux_offset", "aux_size"),
}  # fmt: skip


def _sample_columns(st: int, rf: int) -> list[str]:
    cols: list[str] = []
    for bit, names in _COLUMNS_OF_BIT.items():
        if st & bit:
            cols += [n for n in names if n not in cols]
    if st & 16:
        cols.append("read_offset")
        if rf & 8:
            cols.append("read_nr")
        else:
            cols.append("read_value")
            cols += [n for b, n in ((4, "read_id"), (16, "read_lost")) if rf & b]
        cols += [n for b, n in ((1, "read_time_enabled"), (2, "read_time_running")) if rf & b]
    return cols


def _name(t: int) -> str:
    try:
        return RecordType(t).name
    except ValueError:
        return f"type {t}"


def _followed_by(buf: np.ndarray, path: str | None, at: int, more: bytes) -> np.ndarray:
    """``buf`` with ``more`` at ``at`` (page-aligned, past its end): a
    file's mapping (``path``) and an anonymous one right after it, so the
    file is not copied; other buffers are copied."""
    if path is None:
        out = np.zeros(at + len(more), np.uint8)
        out[: buf.shape[0]] = buf
        out[at:] = np.frombuffer(more, np.uint8)
        return out
    import ctypes
    import weakref

    libc = ctypes.CDLL(None, use_errno=True)
    mmap_ = libc.mmap
    mmap_.restype = ctypes.c_void_p
    mmap_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                      ctypes.c_int, ctypes.c_long]  # fmt: skip
    total = at + len(more)
    base = mmap_(None, total, mmap.PROT_READ | mmap.PROT_WRITE,
                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # fmt: skip
    if base in (None, ctypes.c_void_p(-1).value):
        raise PerfDataError(path, 0, f"cannot map {total} bytes: {os.strerror(ctypes.get_errno())}")
    holder = (ctypes.c_uint8 * total).from_address(base)
    weakref.finalize(holder, libc.munmap, ctypes.c_void_p(base), ctypes.c_size_t(total))
    fd = os.open(path, os.O_RDONLY)
    try:
        # (MAP_FIXED: the file over the first pages of the region)
        got = mmap_(base, buf.shape[0], mmap.PROT_READ, mmap.MAP_PRIVATE | _MAP_FIXED, fd, 0)
    finally:
        os.close(fd)
    if got != base:
        raise PerfDataError(path, 0, f"cannot map the file: {os.strerror(ctypes.get_errno())}")
    ctypes.memmove(base + at, more, len(more))
    register_spliced(holder, base, buf.shape[0])  # (release() lets the file's pages go)
    out = np.frombuffer(holder, np.uint8)
    out.flags.writeable = False
    return out


_MAP_FIXED = 0x10  # Linux's

# What one COMPRESSED record may decompress to when the header does not
# say (its mmap_len): a ring buffer of a GiB, more than perf record -m
# gives by default by three orders of magnitude.
_COMPRESSED_LIMIT = 1 << 30


def _read_stream(stream: BinaryIO) -> np.ndarray:
    """A stream's bytes to its end, unless its first eight are no perf.data
    magic: then those alone (enough to say so), not the rest of, say,
    ``/dev/zero`` or a mistaken pipe, read into memory first."""
    head = b""
    while len(head) < 8:  # (a raw pipe may give fewer bytes than asked)
        more = stream.read(8 - len(head))
        if not more:
            break
        head += more
    if len(head) < 8 or head not in (MAGIC, MAGIC[::-1], b"PERFFILE"):
        return np.frombuffer(head, np.uint8)
    return np.frombuffer(head + stream.read(), np.uint8)


class PerfData:
    """A perf.data file read into memory-mapped columns (see the module doc).

    ``source``: a path, ``"-"`` for stdin, bytes, or a binary file object
    (read to its end: pipes work).  ``name`` names the input in messages.
    """

    def __init__(
        self, source: str | os.PathLike | bytes | BinaryIO, name: str | None = None
    ) -> None:
        self.buf: np.ndarray
        self.directory: str | None = None
        self._mapped: str | None = None  # the file buf maps
        #: where the records decompressed from COMPRESSED ones start in buf
        self.decompressed_at: int | None = None
        self._held_by: np.ndarray | None = None  # per record: its COMPRESSED record's offset
        if isinstance(source, bytes | bytearray | memoryview):
            self.path = name or "<bytes>"
            self.buf = np.frombuffer(bytes(source), np.uint8)
        elif isinstance(source, str | os.PathLike):
            if str(source) == "-":
                self.path = name or "<stdin>"
                self.buf = _read_stream(sys.stdin.buffer)
            else:
                if os.path.isdir(source):
                    # ``perf record --kcore`` writes a directory: the data
                    # file inside, kcore_dir beside it (:attr:`kcore_dir`).
                    self.directory = os.fspath(source)
                    source = os.path.join(source, "data")
                self.path = name or str(source)
                try:
                    if stat.S_ISREG(os.stat(source).st_mode):
                        n = os.path.getsize(source)
                        self.buf = np.memmap(source, np.uint8, "r") if n else np.zeros(0, np.uint8)
                        self._mapped = os.fspath(source) if n else None
                    else:
                        # A pipe, FIFO or terminal (``-i /dev/stdin`` under
                        # ``cat x |``): its size says nothing, read it through.
                        with open(source, "rb") as stream:
                            self.buf = _read_stream(stream)
                except OSError as e:
                    raise PerfDataError(self.path, 0, f"cannot read: {e.strerror}") from None
        else:
            self.path = name or getattr(source, "name", "<stream>")
            self.buf = _read_stream(source)
        self.errors: list[PerfDataError] = []
        self.warnings: list[str] = []

        self.attrs: list[EventAttr] = []
        self.features: dict[Feature | int, Any] = {}
        self.raw_features: dict[int, bytes] = {}
        self.feature_sections: dict[int, tuple[int, int]] = {}
        self.pipe = False
        self._user_cache: dict[int, object] = {}
        self._read()

    # -- structure -------------------------------------------------------------

    def _err(self, offset: int, message: str) -> PerfDataError:
        return PerfDataError(self.path, offset, message)

    def _read(self) -> None:
        b = self.buf
        n = b.shape[0]
        magic = bytes(b[:8])
        if n < 8 or (n < 16 and magic == MAGIC):
            raise self._err(0, f"not a perf.data file: {n} bytes, shorter than any header")
        if magic != MAGIC:
            if magic == MAGIC[::-1]:
                raise self._err(0, "big-endian perf.data (byte-swapped magic) is not supported")
            if magic == b"PERFFILE":
                raise self._err(0, "version 1 perf.data (magic PERFFILE) is not supported")
            raise self._err(0, f"not a perf.data file: magic {magic!r}, expected {MAGIC!r}")
        hsize = struct.unpack_from("<Q", b, 8)[0]
        if hsize == PIPE_HEADER_SIZE:
            self.pipe = True
            self.header = FileHeader(hsize)
            self._index(PIPE_HEADER_SIZE, n)
            self._decompress()
            self._pipe_headers()
        else:
            self._file_header(hsize, n)
            h = self.header
            self._index(h.data_offset, h.data_offset + h.data_size)
            # (the features first: they bound what COMPRESSED records hold)
            self._file_features()
            self._decompress()
        self._resolve()

    def _file_header(self, hsize: int, n: int) -> None:
        if hsize < 72 or hsize > FILE_HEADER_SIZE:
            raise self._err(8, f"header size {hsize}: neither 16 (pipe) nor 72..104 (file)")
        if n < hsize:
            raise self._err(0, f"truncated header: {n} of {hsize} bytes")
        v = struct.unpack_from("<7Q", b := self.buf, 16)
        bits: tuple[int, ...] = ()
        if hsize >= FILE_HEADER_SIZE:
            words = struct.unpack_from("<4Q", b, 72)
            bits = tuple(w * 64 + i for w in range(4) for i in range(64) if words[w] >> i & 1)
        self.header = FileHeader(hsize, *v, bits)  # type: ignore[arg-type]
        h = self.header
        if h.attr_size < 64 + 16 or h.attr_size % 8:
            raise self._err(
                16, f"impossible attr size {h.attr_size} (attr plus 16-byte ids section)"
            )
        if h.attrs_offset + h.attrs_size > n:
            raise self._err(
                24,
                f"attrs section {h.attrs_offset:#x}+{h.attrs_size:#x} goes beyond the file ({n:#x} bytes)",
            )
        asz = h.attr_size - 16
        for k in range(h.attrs_size // h.attr_size):
            at = h.attrs_offset + k * h.attr_size
            try:
                attr = PerfEventAttr.parse(b, at, asz)
            except AttrError as e:
                raise self._err(at, f"attr {k}: {e}") from None
            ioff, isz = struct.unpack_from("<QQ", b, at + asz)
            if ioff + isz > n or isz % 8:
                self.errors.append(
                    self._err(at + asz, f"attr {k}: ids section {ioff:#x}+{isz:#x} beyond the file")
                )
                ids: tuple[int, ...] = ()
            else:
                ids = struct.unpack_from(f"<{isz // 8}Q", b, ioff)
            self.attrs.append(EventAttr(attr, ids))
        if h.data_offset > n:
            raise self._err(
                40, f"data section starts at {h.data_offset:#x}, beyond the file ({n:#x} bytes)"
            )
        if h.data_offset + h.data_size > n:
            self.errors.append(
                self._err(
                    48,
                    f"data section {h.data_offset:#x}+{h.data_size:#x} goes beyond the file ({n:#x} bytes): file truncated",
                )
            )
            h.data_size = n - h.data_offset
        if h.data_size == 0 and not h.features and n > h.data_offset:
            # perf writes the header last: a killed perf leaves data_size 0.
            self.errors.append(
                self._err(
                    48,
                    "data size 0 in the header (perf did not finish): reading to the end of the file",
                )
            )
            h.data_size = n - h.data_offset  # fmt: skip

    def _file_features(self) -> None:
        h = self.header
        n = self.buf.shape[0]
        at = h.data_offset + h.data_size
        feats = [f for f in h.features if f != 0]
        if not feats:
            return
        if at + 16 * len(feats) > n:
            self.errors.append(
                self._err(at, f"feature table of {len(feats)} sections goes beyond the file")
            )
            return
        for k, f in enumerate(feats):
            off, size = struct.unpack_from("<QQ", self.buf, at + 16 * k)
            if off + size > n:
                self.errors.append(
                    self._err(
                        at + 16 * k,
                        f"feature {_feat_name(f)} section {off:#x}+{size:#x} goes beyond the file",
                    )
                )
                continue
            self.feature_sections[f] = (off, size)
            self._feature(f, off, bytes(self.buf[off : off + size]))

    def _feature(self, f: int, off: int, data: bytes) -> None:
        self.raw_features[f] = data
        try:
            self.features[Feature(f) if f in Feature._value2member_map_ else f] = parse_feature(
                f, data, self.features
            )  # type: ignore[arg-type]
        except FeatureError as e:
            self.errors.append(self._err(off + e.offset, f"feature {_feat_name(f)}: {e.message}"))

    def _index(self, start: int, end: int) -> None:
        self.records, self.gaps = self._index_span(start, end, True)
        self._gap_errors(self.gaps)
        typ = self.records["type"]
        kinds = distinct(typ)
        for t in kinds.tolist():
            if not (1 <= t <= 21 or 64 <= t <= 82):
                k = int(np.count_nonzero(typ == t))
                msg = f"{self.path}: {k} record(s) of unknown type {t} skipped (first at offset {int(self.records['offset'][typ == t][0]):#x})"
                self.warnings.append(msg)
                warnings.warn(msg, PerfDataWarning, stacklevel=3)

    def _gap_errors(self, gaps: np.ndarray) -> None:
        for g_off, g_len, why in gaps:
            what = (
                f"{int(g_len)} bytes missing, the trace before them kept"
                if why == K.GAP_AUX_CUT
                else f"skipped {int(g_len)} bytes to the next readable record"
            )
            self.errors.append(self._err(int(g_off), f"{GAP_REASONS[int(why)]}: {what}"))

    def _index_span(
        self, start: int, end: int, let_go: bool
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """The records of ``buf[start:end]`` (the first five columns) and
        the stretches that could not be read; ``let_go``: the pages read
        are released (a mapped file's)."""
        b = self.buf
        total = max((end - start) // 8, 1)
        cap = min(total, 1 << 20)
        cols: list[list[np.ndarray]] = [[] for _ in range(5)]
        gaps = np.zeros((64, 3), np.int64)
        ng = 0
        pos = start
        while True:
            off = np.empty(cap, np.int64)
            typ = np.empty(cap, np.uint32)
            misc = np.empty(cap, np.uint16)
            size = np.empty(cap, np.uint32)
            pay = np.empty(cap, np.int64)
            was = pos
            n, ng, pos = K.index_records(b, pos, end, off, typ, misc, size, pay, gaps, ng, 8)
            if let_go:
                release(b, was, pos)  # headers read: the pages need not stay resident
            for c, a in zip(cols, (off, typ, misc, size, pay), strict=True):
                c.append(a[:n])
            if pos >= end:
                break
            if ng >= gaps.shape[0]:
                gaps = np.concatenate([gaps, np.zeros_like(gaps)])
            cap = min(cap * 2, total)
        records = {
            name: np.concatenate(c) for name, c in zip(RECORD_COLUMNS[:5], cols, strict=True)
        }
        return records, gaps[:ng]

    def _decompress(self) -> None:
        """The records of the COMPRESSED records (``perf record -z``), each
        indexed right after the one whose body completes it, as perf
        processes them.  Their bytes follow the file's in :attr:`buf`
        (``decompressed_at`` on): the file stays mapped, not copied."""
        r = self.records
        rows = np.flatnonzero(r["type"] == RecordType.COMPRESSED)
        if rows.shape[0] == 0:
            return
        from .zstd import ZstdDecompressor, ZstdError

        # perf decompresses a record's body into a buffer of the header's
        # mmap_len (perf_session__process_compressed_event) and reads no
        # more of it; without the header (a pipe), a bound all the same.
        limit = int((self.features.get(Feature.COMPRESSED) or {}).get("mmap_len") or 0)
        if limit <= 0:
            limit = _COMPRESSED_LIMIT
        pieces: list[bytes] = []
        ends: list[int] = []
        done = 0
        try:
            stream = ZstdDecompressor()
            for i in rows.tolist():
                off, size = int(r["offset"][i]), int(r["size"][i])
                try:
                    piece = stream.feed(bytes(self.buf[off + 8 : off + size]), limit)
                except ZstdError as e:
                    self.errors.append(self._err(off, f"COMPRESSED record: {e}"))
                    break
                pieces.append(piece)
                done += len(piece)
                ends.append(done)
        except ZstdError as e:
            self.errors.append(self._err(int(r["offset"][rows[0]]), str(e)))
        if not done:
            return
        at = -(-self.buf.shape[0] // mmap.PAGESIZE) * mmap.PAGESIZE
        self.buf = _followed_by(self.buf, self._mapped, at, b"".join(pieces))
        self.decompressed_at = at
        side, gaps = self._index_span(at, at + done, False)
        self._gap_errors(gaps)
        # Each decompressed record after the COMPRESSED record its end is in.
        last = side["offset"] - at + side["size"].astype(np.int64)
        owner = rows[np.minimum(np.searchsorted(np.asarray(ends), last), len(ends) - 1)]
        order = np.argsort(
            np.concatenate([2 * np.arange(r["offset"].shape[0]), 2 * owner + 1]),
            kind="stable",
        )
        self.records = {k: np.concatenate([r[k], side[k]])[order] for k in r}
        held = np.concatenate([np.full(r["offset"].shape[0], -1), r["offset"][owner]])
        self._held_by = held[order]

    def file_offset(self, i: int) -> int:
        """Where record ``i`` is in the file: its offset, or for a record
        decompressed from a COMPRESSED record that record's (as ``perf
        report -D`` shows them)."""
        held = self._held_by
        if held is not None and held[i] >= 0:
            return int(held[i])
        return int(self.records["offset"][i])

    def _pipe_headers(self) -> None:
        """Pipe mode: attrs from HEADER_ATTR, features from HEADER_FEATURE records."""
        typ = self.records["type"]
        for i in np.flatnonzero(
            (typ == RecordType.HEADER_ATTR) | (typ == RecordType.HEADER_FEATURE)
        ).tolist():
            r = self.user_record(i)
            if isinstance(r, HeaderAttr):
                self.attrs.append(EventAttr(r.attr, tuple(r.ids)))
            elif isinstance(r, HeaderFeature):
                self.feature_sections[r.feature] = (
                    int(self.records["offset"][i]) + 16,
                    len(r.data),
                )
                self._feature(r.feature, int(self.records["offset"][i]) + 16, r.data)

    def _resolve(self) -> None:
        """Event names from EVENT_DESC; each record's attr and sample_id fields."""
        for d in self.features.get(Feature.EVENT_DESC) or []:
            for ea in self.attrs:
                if (d.ids and set(d.ids) & set(ea.ids)) or (
                    not d.ids and not ea.name and ea.attr == d.attr
                ):
                    ea.name = d.name
        r = self.records
        m = r["offset"].shape[0]
        na = len(self.attrs)
        st = np.array([a.attr.sample_type for a in self.attrs], np.uint64)
        sid_all = np.array([bool(a.attr.sample_id_all) for a in self.attrs], np.bool_)
        pairs = sorted({(i, k) for k, a in enumerate(self.attrs) for i in a.ids})
        id_sorted = np.array([p[0] for p in pairs], np.uint64)
        id_attr = np.array([p[1] for p in pairs], np.int64)
        id_pos, is_pos = (self.attrs[0].attr.id_pos, self.attrs[0].attr.is_pos) if na else (-1, -1)
        out = {
            "attr": np.empty(m, np.int32), "time": np.empty(m, np.int64), "pid": np.empty(m, np.int32),
            "tid": np.empty(m, np.int32), "cpu": np.empty(m, np.int32), "id": np.empty(m, np.uint64),
        }  # fmt: skip
        if na == 0:
            st = np.zeros(0, np.uint64)
            sid_all = np.zeros(1, np.bool_)
        step = 1 << 18  # records at a time, their pages released after
        for lo in range(0, m, step):
            hi = min(lo + step, m)
            K.sample_ids(
                self.buf, r["offset"][lo:hi], r["type"][lo:hi], r["size"][lo:hi], st, sid_all,
                id_sorted, id_attr, id_pos, is_pos, *(out[c][lo:hi] for c in _RESOLVED),
            )  # fmt: skip
            release(
                self.buf, int(r["offset"][lo]), int(r["offset"][hi - 1]) + int(r["size"][hi - 1])
            )
        r.update(out)

    # -- access ----------------------------------------------------------------

    def __len__(self) -> int:
        return self.records["offset"].shape[0]

    def where(self, rtype: int) -> np.ndarray:
        """Row numbers of the records of type ``rtype``."""
        return np.flatnonzero(self.records["type"] == rtype)

    def record(self, i: int) -> Record:
        """Record row ``i`` parsed by :func:`hwtrace.perf.records.parse_record`
        (perf-tool and SAMPLE records come back with raw bodies)."""
        off = int(self.records["offset"][i])
        a = int(self.records["attr"][i])
        ea = self.attrs[a if a >= 0 else 0].attr if self.attrs else PerfEventAttr()
        try:
            return parse_record(self.buf, off, ea.sample_type, bool(ea.sample_id_all))
        except RecordError as e:
            raise self._err(e.offset, e.message) from None

    def user_record(self, i: int) -> object:
        """Perf-tool record row ``i`` (type >= 64) parsed by :mod:`hwtrace.perf.user`."""
        if i in self._user_cache:
            return self._user_cache[i]
        off = int(self.records["offset"][i])
        try:
            v = _parse_user(
                self.buf, off, int(self.records["type"][i]), int(self.records["size"][i])
            )
        except RecordError as e:
            raise self._err(e.offset, e.message) from None
        self._user_cache[i] = v
        return v

    def iter_user(self, rtype: int) -> Iterator[tuple[int, object]]:
        """(row, parsed record) for each record of perf-tool type ``rtype``;
        malformed ones are added to ``errors`` and skipped."""
        for i in self.where(rtype).tolist():
            try:
                yield i, self.user_record(i)
            except PerfDataError as e:
                self.errors.append(e)

    def auxtrace(self) -> list[Auxtrace]:
        """The AUXTRACE records in file order, each with a view of its data."""
        return [r for _, r in self.iter_user(RecordType.AUXTRACE)]  # type: ignore[misc]

    def auxtrace_columns(self) -> dict[str, np.ndarray]:
        """The AUXTRACE records in file order as columns, read in one
        vectorised pass (no object per record): ``row`` (in
        :attr:`records`), ``size``, ``offset`` (in the AUX buffer's
        stream), ``reference``, ``idx``, ``tid``, ``cpu`` and
        ``data_offset`` (where the trace bytes start in :attr:`buf`).
        Records too short, or whose data goes beyond the file, are left out
        and described in ``errors``, as :meth:`auxtrace` does; the last
        record of a file cut short gives the trace it holds (``size``: what
        is there; the index reported what is missing)."""
        r = self.records
        rows = self.where(RecordType.AUXTRACE)
        off = r["offset"][rows].astype(np.int64)
        short = r["size"][rows] < 48
        fields = np.zeros((rows.shape[0], 40), np.uint8)
        ok_rows = np.flatnonzero(~short & (off + 48 <= self.buf.shape[0]))
        if ok_rows.shape[0]:
            fields[ok_rows] = self.buf[off[ok_rows, None] + 8 + np.arange(40)]
        dt = np.dtype(
            [("size", "<u8"), ("offset", "<u8"), ("reference", "<u8"), ("idx", "<u4"),
             ("tid", "<i4"), ("cpu", "<i4"), ("reserved", "<u4")]
        )  # fmt: skip
        rec = fields.view(dt).reshape(-1)
        start = off + r["size"][rows].astype(np.int64)
        # (a record cut short by the end of the data: its bytes up to the
        # end, as the index kept them and reported the rest)
        sizes = np.minimum(rec["size"].astype(np.int64), r["payload"][rows])
        beyond = start + sizes > self.buf.shape[0]
        for i in np.flatnonzero(short | beyond).tolist():
            what = (
                f"AUXTRACE of {int(r['size'][rows[i]])} bytes is too short (needs 48)"
                if short[i]
                else f"AUXTRACE payload of {int(rec['size'][i])} bytes goes beyond the data"
            )
            self.errors.append(self._err(int(off[i]), what))
        good = ~(short | beyond)
        return {
            "row": rows[good],
            "size": sizes[good],
            "offset": rec["offset"][good].astype(np.int64),
            "reference": rec["reference"][good],
            "idx": rec["idx"][good].astype(np.int64),
            "tid": rec["tid"][good].astype(np.int64),
            "cpu": rec["cpu"][good].astype(np.int64),
            "data_offset": start[good],
        }

    @property
    def auxtrace_info(self) -> AuxtraceInfo | None:
        for _, r in self.iter_user(RecordType.AUXTRACE_INFO):
            return r  # type: ignore[return-value]
        return None

    @property
    def kcore_dir(self) -> str | None:
        """The kernel code ``perf record --kcore`` saved beside the data."""
        if self.directory is None:
            return None
        d = os.path.join(self.directory, "kcore_dir")
        return d if os.path.isfile(os.path.join(d, "kcore")) else None

    @property
    def intel_pt(self) -> IntelPtInfo | None:
        """Intel PT's settings from AUXTRACE_INFO (None if the file has none)."""
        info = self.auxtrace_info
        return info.intel_pt if info else None

    @property
    def time_conv(self) -> TimeConv | None:
        for _, r in self.iter_user(RecordType.TIME_CONV):
            return r  # type: ignore[return-value]
        return None

    def samples(self, attr: int | None = None) -> Samples:
        """SAMPLE records (of event ``attr``, or of all events) as columns;
        samples that cannot be decoded are described in ``errors``."""
        got, problems = self.decode_samples(attr=attr)
        self.errors += [p.error(self.path) for p in problems]
        return got

    def decode_samples(
        self, start: int = 0, stop: int | None = None, *, attr: int | None = None
    ) -> tuple[Samples, list[SampleProblem]]:
        """The SAMPLE records among rows ``start..stop`` of :attr:`records`
        (of event ``attr``, or of all events) as columns, and, per event,
        what could not be decoded (not added to ``errors``: a caller
        reading the file a range at a time adds the ranges' problems up,
        :meth:`SampleProblem.merge`)."""
        r = self.records
        stop = r["offset"].shape[0] if stop is None else stop
        typ = r["type"][start:stop]
        ra_all = r["attr"][start:stop]
        rows = start + np.flatnonzero(
            (typ == RecordType.SAMPLE)
            & (ra_all >= 0)
            & ((ra_all == attr) if attr is not None else True)
        )
        mat = np.zeros((rows.shape[0], K.NCOL), np.uint64)
        ra = r["attr"][rows]
        cols: list[str] = []
        problems: list[SampleProblem] = []
        for a in distinct(ra).tolist():
            at = self.attrs[a].attr
            sel = np.flatnonzero(ra == a)
            sub = np.empty((sel.shape[0], K.NCOL), np.uint64)
            hw_idx = bool(at.branch_sample_type & (1 << 17))  # PERF_SAMPLE_BRANCH_HW_INDEX
            if not self.sample_decodable(a):
                problems.append(SampleProblem(a, at, int(r["offset"][rows[sel[0]]]), 0))
                continue
            K.decode_samples(
                self.buf, r["offset"][rows[sel]], r["size"][rows[sel]].astype(np.int64),
                at.sample_type, at.read_format, hw_idx, bin(at.sample_regs_user).count("1"),
                bin(at.sample_regs_intr).count("1"), sub,
            )  # fmt: skip
            mat[sel] = sub
            cols += [c for c in _sample_columns(at.sample_type, at.read_format) if c not in cols]
            bad = np.flatnonzero(sub[:, K.C_BAD])
            if bad.shape[0]:
                first = int(r["offset"][rows[sel[bad[0]]]])
                problems.append(SampleProblem(a, at, first, bad.shape[0]))
        return Samples(rows, ra, mat, tuple(cols)), problems

    def sample_decodable(self, attr: int) -> bool:
        """Whether event ``attr``'s samples can be decoded (no sample_type
        or read_format bits this reader does not know)."""
        at = self.attrs[attr].attr
        return not (at.sample_type >> 25 or at.read_format >> 5)

    def sample_columns(self, attrs: list[int]) -> tuple[str, ...]:
        """The :class:`Samples` columns the samples of events ``attrs``
        have (as :meth:`samples` gives them for those events)."""
        cols: list[str] = []
        for a in attrs:
            if self.sample_decodable(a):
                at = self.attrs[a].attr
                cols += [
                    c for c in _sample_columns(at.sample_type, at.read_format) if c not in cols
                ]
        return tuple(cols)

    def summary(self) -> dict[str, int]:
        """Record counts by type name."""
        t, c = np.unique(self.records["type"], return_counts=True)
        return {_name(int(a)): int(b) for a, b in zip(t, c, strict=True)}


@dataclass
class SampleProblem:
    """Samples of event ``attr`` that could not be decoded: ``short``
    records too short for their sample_type (the first at file offset
    ``offset``), or, when ``short`` is 0, all of them (the event has
    sample_type or read_format bits this reader does not know; ``offset``:
    its first sample)."""

    attr: int
    event: PerfEventAttr = field(repr=False)
    offset: int
    short: int

    def error(self, path: str) -> PerfDataError:
        at = self.event
        if not self.short:
            what = (
                f"event {self.attr} has unknown sample_type/read_format bits "
                f"({at.sample_type:#x}/{at.read_format:#x}): its samples are not decoded"
            )
        else:
            what = (
                f"{self.short} SAMPLE record(s) of event {self.attr} too short for their "
                f"sample_type {at.sample_type:#x}"
            )
        return PerfDataError(path, self.offset, what)

    @staticmethod
    def merge(problems: list[SampleProblem]) -> list[SampleProblem]:
        """Problems of consecutive ranges as one per event, in event order
        (counts added, the first offset kept)."""
        out: dict[int, SampleProblem] = {}
        for p in problems:
            got = out.get(p.attr)
            if got is None:
                out[p.attr] = SampleProblem(p.attr, p.event, p.offset, p.short)
            else:
                got.short += p.short
        return [out[a] for a in sorted(out)]


def _feat_name(f: int) -> str:
    try:
        return Feature(f).name
    except ValueError:
        return f"#{f}"


def read_perf_data(source: str | Path | bytes | BinaryIO, name: str | None = None) -> PerfData:
    """Read a perf.data (file or pipe mode); see :class:`PerfData`."""
    return PerfData(source, name)
