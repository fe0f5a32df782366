"""Recorded event streams a compiled filter can run over, and running it.

A source (:func:`open_source`) gives, per event type, a
:class:`~.schema.Schema` and the address of each event's raw record in
memory, plus one context record per event (``$ctx.pid``, ``tid``,
``cpu_id``, ``procname`` where the source knows them), so that
:func:`apply_filter` can run a filter compiled once per type over all of
that type's events in native loops (:meth:`CompiledFilter.run_many`):

* :class:`PerfSource`: perf.data with tracepoint samples.  A sample's
  PERF_SAMPLE_RAW is the tracefs record; its layout comes from the file's
  TRACING_DATA feature (the ``format`` files perf embedded), else from
  tracefs; the attr's ``config`` is the tracepoint id.  Records stay in the
  memory-mapped file: the addresses point into it (no copy).
  :meth:`PerfSource.write_subset` writes a perf.data of the samples kept.
* :class:`FtraceSource`: copies of ``per_cpu/cpuN/trace_pipe_raw`` (ring
  buffer pages, :mod:`.ftrace_raw`), event ids resolved through a tracefs
  directory; again the records are used where they lie.
* :class:`CtfSource`: CTF traces read with babeltrace2's Python bindings
  (``bt2``, Debian's python3-bt2); payloads are packed into records
  (:func:`~.records.pack_many`) laid out from bt2's field classes.

Listings (text like ftrace's ``trace``, or JSON lines) of perf and ftrace
events are written by a compiled kernel straight from the raw records.

Bad input raises :class:`StreamError` (one line: file and offset).
"""

from __future__ import annotations

import fnmatch
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from ..textout import (
    align_right,
    put_byte,
    put_bytes,
    put_cstring,
    put_dec,
    put_signed,
    string_list_table,
)
from . import ast
from .compile import CompiledFilter, compile_filter
from .errors import FilterError
from .ftrace_raw import LIVE_TRACEFS, RawEvents, Tracefs, parse_tracing_data, read_pages
from .parse import parse
from .records import RecordBatch, pack_many
from .schema import (
    DEFAULT_CONTEXT,
    ArrayType,
    FloatType,
    IntType,
    Schema,
    SequenceType,
    StringType,
    StructType,
    Type,
    layout,
)
from .sources import schema_from_tracefs


class StreamError(Exception):
    """Input that cannot be read: ``path``, ``offset`` (or None) and ``message``."""

    def __init__(self, path: str, message: str, offset: int | None = None) -> None:
        super().__init__(path, message, offset)
        self.path = path
        self.message = message
        self.offset = offset

    def __str__(self) -> str:
        at = f": offset {self.offset:#x}" if self.offset is not None else ""
        return f"{self.path}{at}: {self.message}"


# -- sources ------------------------------------------------------------------------------


@dataclass
class EventType:
    """The events of one type in a source.

    ``rows`` are the events' positions in the source's order (the columns
    of :class:`EventSource`); ``addresses`` their raw records' addresses;
    ``offsets`` / ``sizes`` the same records as byte ranges of the source's
    ``buf`` (perf and ftrace sources: the listing kernel reads them there).
    """

    name: str
    schema: Schema
    rows: np.ndarray
    addresses: np.ndarray
    offsets: np.ndarray | None = None
    sizes: np.ndarray | None = None
    note: str = ""  # why the schema is what it is (e.g. no format found)

    def __len__(self) -> int:
        return self.rows.shape[0]


@dataclass
class EventSource:
    """Events of several types with per-event columns in the source's
    order: ``time`` (ns, -1 unknown), ``cpu``, ``tid``, ``comm`` (index
    into ``comms``), ``context`` (row of ``contexts``, the packed context
    records)."""

    kind: str
    path: str
    types: list[EventType]
    time: np.ndarray
    cpu: np.ndarray
    tid: np.ndarray
    comm: np.ndarray
    comms: list[str]
    contexts: RecordBatch
    buf: np.ndarray | None = None
    problems: list[str] = field(default_factory=list)  # damage found in the input
    notes: list[str] = field(default_factory=list)  # facts worth saying (formats' origin)
    keep: list[Any] = field(default_factory=list, repr=False)

    def __len__(self) -> int:
        return self.time.shape[0]


def _contexts(
    pid: np.ndarray, tid: np.ndarray, cpu: np.ndarray, comm: np.ndarray, comms: Sequence[str]
) -> tuple[RecordBatch, np.ndarray]:
    """One packed DEFAULT_CONTEXT record per distinct (pid, tid, cpu, comm)
    and each event's row among them."""
    n = pid.shape[0]
    keys = (comm, cpu, tid, pid)  # lexsort: the last key sorts first
    if n:
        order = np.lexsort(keys)
        ordered = [k[order] for k in keys]
        change = np.zeros(n, np.bool_)
        change[0] = True
        for k in ordered:
            change[1:] |= k[1:] != k[:-1]
        inverse = np.empty(n, np.int64)
        inverse[order] = np.cumsum(change) - 1
        first = order[change]
    else:
        inverse = np.zeros(0, np.int64)
        first = np.zeros(0, np.int64)
    uniq = {"pid": pid[first], "tid": tid[first], "cpu": cpu[first], "comm": comm[first]}
    if first.shape[0] == 0:  # one zero record, for filters over no events
        uniq = {"pid": np.zeros(1, np.int64), "tid": np.zeros(1, np.int64),
                "cpu": np.zeros(1, np.int64), "comm": np.full(1, -1, np.int64)}  # fmt: skip
    names = [comms[c].encode() if c >= 0 else b"" for c in uniq["comm"].tolist()]
    batch = pack_many(
        DEFAULT_CONTEXT,
        {
            "procname": names,
            "pid": uniq["pid"],
            "vpid": uniq["pid"],
            "tid": uniq["tid"],
            "vtid": uniq["tid"],
            "cpu_id": uniq["cpu"],
        },
    )
    return batch, inverse


# Records shorter than their schema, or with a data_loc beyond the record,
# would let a filter read outside them: such events are refused.
@njit(cache=True)
def _valid_records(buf, offsets, sizes, fixed, locs):
    n = offsets.shape[0]
    ok = np.ones(n, np.bool_)
    for i in range(n):
        o = offsets[i]
        s = sizes[i]
        if s < fixed or o < 0 or o + s > buf.shape[0]:
            ok[i] = False
            continue
        for k in range(locs.shape[0]):
            at = o + locs[k]
            v = (
                np.int64(buf[at])
                | (np.int64(buf[at + 1]) << 8)
                | (np.int64(buf[at + 2]) << 16)
                | (np.int64(buf[at + 3]) << 24)
            )
            if (v & 0xFFFF) + (v >> 16) > s:
                ok[i] = False
                break
    return ok


def _check_records(
    buf: np.ndarray, schema: Schema, offsets: np.ndarray, sizes: np.ndarray
) -> np.ndarray:
    locs = np.array(
        [
            f.offset
            for f in schema.fields
            if (isinstance(f.type, StringType | SequenceType) and f.type.storage == "data_loc")
        ],
        np.int64,
    )
    return _valid_records(buf, offsets.astype(np.int64), sizes.astype(np.int64), schema.size, locs)


def _split_bad(
    t: EventType, buf: np.ndarray, where: str, notes: list[str]
) -> tuple[EventType, np.ndarray]:
    """Drop the events whose records do not hold their schema; say so."""
    assert t.offsets is not None and t.sizes is not None
    ok = _check_records(buf, t.schema, t.offsets, t.sizes)
    bad = np.flatnonzero(~ok)
    if bad.shape[0]:
        notes.append(
            f"{where}: {bad.shape[0]} {t.name} record(s) too short for their format or with "
            f"a field beyond the record (first at offset {int(t.offsets[bad[0]]):#x}): skipped"
        )
        t = EventType(
            t.name, t.schema, t.rows[ok], t.addresses[ok], t.offsets[ok], t.sizes[ok], t.note
        )
    return t, bad


def _buffer_address(buf: np.ndarray) -> int:
    return int(buf.ctypes.data) if buf.shape[0] else 0


class _Formats:
    """Event id -> (name, schema) from embedded formats, else a tracefs dir."""

    def __init__(
        self, embedded: dict[int, tuple[str, str, str]] | None, tracefs: str | None, where: str
    ) -> None:
        self.embedded = embedded or {}
        self.tracefs_path = tracefs
        self._tracefs: Tracefs | None = None
        self.where = where
        self.cache: dict[int, tuple[str, Schema, str]] = {}

    def tracefs(self) -> Tracefs | None:
        if self._tracefs is None:
            try:
                self._tracefs = Tracefs(self.tracefs_path or LIVE_TRACEFS)
            except FilterError:
                if self.tracefs_path:
                    raise
                return None
        return self._tracefs

    def get(self, event_id: int, fallback_name: str) -> tuple[str, Schema, str]:
        if event_id in self.cache:
            return self.cache[event_id]
        note = ""
        found = self.embedded.get(event_id)
        if found is None:
            fs = self.tracefs()
            found = fs.event(event_id) if fs is not None else None
            if found is not None and self.embedded:
                note = f"format of event id {event_id} taken from {fs.root if fs else ''}"
        if found is None:
            name = fallback_name or f"id {event_id}"
            result = (name, Schema.declare(name, []), f"no format for event id {event_id}")
        else:
            system, event, text = found
            try:
                schema = schema_from_tracefs(text, event)
            except FilterError as e:
                raise StreamError(self.where, f"format of {system}:{event}: {e}") from None
            result = (f"{system}:{event}", schema, note)
        self.cache[event_id] = result
        return result


# -- perf.data ------------------------------------------------------------------------------


class PerfSource(EventSource):
    """perf.data samples, one event type per attr (see the module doc)."""

    def __init__(self, path: str, tracefs: str | None = None) -> None:
        from ..perf.data import PerfDataError, read_perf_data
        from ..perf.features import Feature
        from ..perf.records import RecordType

        try:
            data = read_perf_data(path)
        except PerfDataError as e:
            raise StreamError(e.path, e.message, e.offset) from None
        self.data = data
        r = data.records
        if np.any(r["type"] == RecordType.COMPRESSED):
            at = int(r["offset"][np.flatnonzero(r["type"] == RecordType.COMPRESSED)[0]])
            raise StreamError(
                data.path, "compressed records (perf record -z) are not supported", at
            )
        embedded = None
        td_bytes = data.raw_features.get(int(Feature.TRACING_DATA))
        td_where = f"{data.path}: TRACING_DATA"
        if td_bytes is None:
            for i in data.where(RecordType.HEADER_TRACING_DATA).tolist():
                start = int(r["offset"][i] + r["size"][i])
                td_bytes = bytes(data.buf[start : start + int(r["payload"][i])])
                td_where = f"{data.path}: offset {int(r['offset'][i]):#x}: HEADER_TRACING_DATA"
        if td_bytes:
            try:
                embedded = parse_tracing_data(td_bytes, td_where).formats
            except FilterError as e:
                raise StreamError(data.path, str(e)) from None
        formats = _Formats(embedded, tracefs, data.path)
        samples = data.samples()
        n = len(samples)
        rec_off = r["offset"][samples.record].astype(np.int64)
        raw_off = samples["raw_offset"].astype(np.int64) if n else np.zeros(0, np.int64)
        raw_size = samples["raw_size"].astype(np.int64) if n else np.zeros(0, np.int64)
        columns = set(samples.columns)
        pid = samples["pid"].astype(np.int64) if "pid" in columns else np.full(n, -1, np.int64)
        tid = samples["tid"].astype(np.int64) if "tid" in columns else np.full(n, -1, np.int64)
        cpu = samples["cpu"].astype(np.int64) if "cpu" in columns else np.full(n, -1, np.int64)
        time = samples["time"].astype(np.int64) if "time" in columns else np.full(n, -1, np.int64)
        comms, comm = _perf_comms(data, tid, time)
        notes = [str(e) for e in data.errors]  # damage the reader skipped
        contexts, ctx = _contexts(pid, tid, cpu, comm, comms)
        base = _buffer_address(data.buf)
        types: list[EventType] = []
        for a in np.unique(samples.attr).tolist():
            rows = np.flatnonzero(samples.attr == a)
            ea = data.attrs[a]
            attr = ea.attr
            if attr.type == 2 and attr.sample_type & 1024:
                # PERF_TYPE_TRACEPOINT: config is the event id, RAW the record.
                name, schema, note = formats.get(int(attr.config), ea.name)
            else:
                name = ea.name or f"event {a}"
                schema = Schema.declare(name, [])
                note = "no PERF_SAMPLE_RAW tracepoint record: only $ctx fields"
            offsets = rec_off[rows] + raw_off[rows]
            t = EventType(
                name,
                schema,
                rows,
                (np.uint64(base) + offsets.astype(np.uint64))
                if base
                else offsets.astype(np.uint64),
                offsets,
                raw_size[rows],
                note,
            )
            if schema.fields:
                t, _ = _split_bad(t, data.buf, data.path, notes)
            types.append(t)
        self.sample_record = samples.record  # each event's row in data.records
        super().__init__(
            "perf", data.path, types, time, cpu, tid, comm, comms, contexts, data.buf, notes
        )
        if embedded is None and any(a.attr.type == 2 for a in data.attrs):
            where = formats.tracefs()
            self.notes.append(
                f"{data.path}: no TRACING_DATA: event formats from "
                f"{where.root if where else 'nowhere (no tracefs)'}"
            )
        self.context_rows = ctx

    def write_subset(self, out: str, keep: np.ndarray) -> tuple[int, int]:
        """Write ``out``: this perf.data with only the samples whose
        ``keep`` (bool, one per event in source order) is set; every other
        record, the header, attrs and features as they are (feature and
        AUXTRACE offsets moved by the bytes removed;
        :func:`hwtrace.perf.rewrite.write_subset`).  Returns (records, bytes)
        written to the data section."""
        from ..perf.data import PerfDataError
        from ..perf.rewrite import write_subset

        try:
            return write_subset(self.data, out, self.sample_record[~keep])
        except PerfDataError as e:
            raise StreamError(e.path, e.message, e.offset) from None


def _perf_comms(data: Any, tid: np.ndarray, time: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Each sample's comm: the thread's last COMM (or the comm it had from
    its parent at FORK) at the sample's time."""
    from ..perf.data import PerfDataError
    from ..perf.records import RecordType

    r = data.records
    rows = np.flatnonzero((r["type"] == RecordType.COMM) | (r["type"] == RecordType.FORK))
    # Sideband records: a few per thread, in time order.
    rows = rows[np.argsort(r["time"][rows], kind="stable")]
    names: list[str] = []
    index: dict[str, int] = {}
    timeline: dict[int, list[tuple[int, int]]] = {}
    for i in rows.tolist():
        try:
            body = data.record(i).body
        except PerfDataError as e:
            data.errors.append(e)
            continue
        t = int(r["time"][i])
        if int(r["type"][i]) == RecordType.COMM:
            c = index.setdefault(body.comm, len(names))
            if c == len(names):
                names.append(body.comm)
            timeline.setdefault(body.tid, []).append((t, c))
        else:
            parent = timeline.get(body.ptid)
            if parent and body.tid != body.ptid:
                timeline.setdefault(body.tid, []).append((t, parent[-1][1]))
    comm = np.full(tid.shape[0], -1, np.int64)
    if tid.shape[0] == 0:
        return names, comm
    utid, inverse = np.unique(tid, return_inverse=True)
    inverse = inverse.reshape(-1)
    order = np.argsort(inverse, kind="stable")
    bounds = np.searchsorted(inverse[order], np.arange(utid.shape[0] + 1))
    for k, t in enumerate(utid.tolist()):
        line = timeline.get(t)
        if not line:
            continue
        sel = order[bounds[k] : bounds[k + 1]]
        times = np.array([e[0] for e in line], np.int64)
        ids = np.array([e[1] for e in line], np.int64)
        at = np.searchsorted(times, time[sel], side="right") - 1
        comm[sel] = ids[np.maximum(at, 0)]
    return names, comm


# -- ftrace trace_pipe_raw ------------------------------------------------------------------

_CPU_NAME = re.compile(r"cpu(\d+)")


def _raw_inputs(path: str) -> list[tuple[str, int]]:
    """The per-CPU files of ``path``: a file (its CPU from a ``cpuN`` in its
    path, else 0) or a directory of ``cpuN`` files or ``cpuN/trace_pipe_raw``."""
    p = Path(path)
    if p.is_dir():
        found = []
        for child in sorted(p.iterdir()):
            m = _CPU_NAME.fullmatch(child.name.split(".")[0])
            if not m:
                continue
            f = child / "trace_pipe_raw" if child.is_dir() else child
            if f.is_file():
                found.append((str(f), int(m.group(1))))
        if not found:
            raise StreamError(path, "no cpuN or cpuN/trace_pipe_raw files in this directory")
        return found
    m = _CPU_NAME.findall(str(p))
    return [(path, int(m[-1]) if m else 0)]


def _saved_cmdlines(tracefs: Path) -> dict[int, str]:
    """pid -> comm from ``saved_cmdlines`` (an instance of the live tracefs
    shares the top directory's)."""
    candidates = [tracefs]
    live = Path(LIVE_TRACEFS)
    if tracefs.resolve().is_relative_to(live):
        candidates.append(live)
    for d in candidates:
        try:
            text = (d / "saved_cmdlines").read_text()
        except OSError:
            continue
        out = {}
        for line in text.splitlines():
            pid, _, comm = line.partition(" ")
            if pid.isdigit():
                out[int(pid)] = comm
        return out
    return {}


class FtraceSource(EventSource):
    """Events of trace_pipe_raw copies (see the module doc); ``path`` a
    file or a directory of per-CPU files; ``tracefs`` the tracefs
    directory the event ids belong to (default: the live one)."""

    def __init__(self, path: str, tracefs: str | None = None) -> None:
        try:
            fs = Tracefs(tracefs or LIVE_TRACEFS)
        except FilterError as e:
            raise StreamError(tracefs or LIVE_TRACEFS, e.message) from None
        try:
            page, header = fs.layout()
        except FilterError as e:
            raise StreamError(str(fs.events), str(e)) from None
        notes: list[str] = []
        info: list[str] = []
        parts: list[RawEvents] = []
        bufs: list[np.ndarray] = []
        starts = []
        total = 0
        for f, cpu in _raw_inputs(path):
            try:
                size = os.path.getsize(f)
                buf = np.memmap(f, np.uint8, "r") if size else np.zeros(0, np.uint8)
            except OSError as e:
                raise StreamError(f, f"cannot read: {e.strerror}") from None
            if size and size < page.data_offset:
                raise StreamError(f, f"{size} bytes: shorter than a page header", 0)
            ev = read_pages(buf, cpu, page, header)
            if ev.problems and len(ev) == 0:
                off, msg = ev.problems[0]
                raise StreamError(f, f"{msg} (not a trace_pipe_raw copy?)", off)
            for off, msg in ev.problems:
                notes.append(f"{f}: offset {off:#x}: {msg}")
            if ev.missed_pages:
                info.append(f"{f}: {ev.missed_pages} page(s) follow lost events")
            parts.append(ev)
            bufs.append(buf)
            starts.append(total)
            total += buf.shape[0]
        # One buffer for all CPUs (the listing kernel reads one array); the
        # filters read the records in place, in each file's own mapping.
        big = np.concatenate(bufs) if len(bufs) > 1 else bufs[0]
        offsets = np.concatenate([e.offsets + s for e, s in zip(parts, starts, strict=True)])
        addresses = np.concatenate(
            [np.uint64(_buffer_address(b)) + e.offsets.astype(np.uint64) for e, b in zip(parts, bufs, strict=True)]
        ) if parts else np.zeros(0, np.uint64)  # fmt: skip
        lengths = np.concatenate([e.lengths for e in parts])
        time = np.concatenate([e.times for e in parts])
        ids = np.concatenate([e.ids for e in parts])
        cpu = np.concatenate([np.full(len(e), e.cpu, np.int64) for e in parts])
        order = np.lexsort((cpu, time))  # merged in time order, as `trace` shows
        offsets, addresses, lengths, time, ids, cpu = (
            a[order] for a in (offsets, addresses, lengths, time, ids, cpu)
        )
        formats = _Formats(None, str(fs.root), path)
        # common_pid: at offset 4 of every record (the common fields'
        # layout is the same for all events).
        tid = np.full(time.shape[0], -1, np.int64)
        long_enough = lengths >= 8
        at = offsets[long_enough]
        tid[long_enough] = (
            big[at + 4].astype(np.int64)
            | (big[at + 5].astype(np.int64) << 8)
            | (big[at + 6].astype(np.int64) << 16)
            | (big[at + 7].astype(np.int64) << 24)
        ).astype(np.int32)
        cmdlines = _saved_cmdlines(fs.root)
        upid, pinv = np.unique(tid, return_inverse=True)
        comms = [cmdlines.get(p, "<...>") if p != 0 else "<idle>" for p in upid.tolist()]
        comm = pinv.reshape(-1).astype(np.int64)
        contexts, ctx = _contexts(np.full_like(tid, -1), tid, cpu, comm, comms)
        types = []
        for event_id in np.unique(ids).tolist():
            rows = np.flatnonzero(ids == event_id)
            try:
                name, schema, note = formats.get(int(event_id), "")
            except FilterError as e:
                raise StreamError(str(fs.root), str(e)) from None
            if note.startswith("no format"):
                note += f" in {fs.root}: only $ctx fields"
            t = EventType(name, schema, rows, addresses[rows], offsets[rows], lengths[rows], note)
            if schema.fields:
                t, _ = _split_bad(t, big, path, notes)
            types.append(t)
        super().__init__(
            "ftrace", path, types, time, cpu, tid, comm, comms, contexts, big, notes, info, bufs
        )
        self.context_rows = ctx


# -- CTF through babeltrace2 ----------------------------------------------------------------


def import_bt2() -> Any:
    """babeltrace2's Python bindings, also from Debian's python3-bt2 when
    this interpreter is a virtualenv of the same Python version.  Raises
    ImportError with what to install."""
    try:
        import bt2  # type: ignore[import-not-found]

        return bt2
    except ImportError:
        pass
    # Debian's package, for the same Python version as this interpreter.
    d = "/usr/lib/python3/dist-packages"
    version = f"{sys.version_info.major}{sys.version_info.minor}"
    if list(Path(d, "bt2").glob(f"_native_bt.cpython-{version}-*.so")):
        sys.path.append(d)
        try:
            import bt2  # type: ignore[import-not-found]

            return bt2
        except ImportError:
            sys.path.remove(d)
    raise ImportError(
        "babeltrace2's Python bindings (bt2) are not importable: install python3-bt2 "
        f"(Debian) for Python {sys.version_info.major}.{sys.version_info.minor}"
    )


def _bytes_for(values: int) -> int:
    return next(n for n in (1, 2, 4, 8) if values <= 8 * n)


def _bt2_type(bt2: Any, fc: Any) -> Type | None:
    """A schema type for a bt2 field class (None: not representable)."""
    if isinstance(fc, bt2._BoolFieldClassConst):
        return IntType(1, False)
    if isinstance(fc, bt2._IntegerFieldClassConst):
        signed = isinstance(fc, bt2._SignedIntegerFieldClassConst)
        return IntType(_bytes_for(fc.field_value_range), signed)
    if isinstance(fc, bt2._RealFieldClassConst):
        # bt2 2.0: one class with is_single_precision; 2.1: two classes.
        single = getattr(bt2, "_SinglePrecisionRealFieldClassConst", None)
        if getattr(fc, "is_single_precision", False) or (single and isinstance(fc, single)):
            return FloatType(4)
        return FloatType(8)
    if isinstance(fc, bt2._StringFieldClassConst):
        return StringType("ptr")
    if isinstance(fc, bt2._StructureFieldClassConst):
        members = []
        for name in fc:
            t = _bt2_type(bt2, fc[name].field_class)
            if t is not None:
                members.append((name, t))
        return layout(members)
    if isinstance(fc, bt2._StaticArrayFieldClassConst):
        el = _bt2_type(bt2, fc.element_field_class)
        return ArrayType(el, fc.length) if el is not None else None
    if isinstance(fc, bt2._DynamicArrayFieldClassConst):
        el = _bt2_type(bt2, fc.element_field_class)
        # The length field is not kept apart: the elements go after the
        # record with their byte count (a data_loc sequence).
        return SequenceType(el, "data_loc") if el is not None else None
    return None  # variants, options, bit arrays


def _bt2_value(bt2: Any, f: Any, t: Type) -> Any:
    if isinstance(t, StructType):
        return {m.name: _bt2_value(bt2, f[m.name], m.type) for m in t.fields}
    if isinstance(t, (ArrayType, SequenceType)):
        return [_bt2_value(bt2, x, t.element) for x in f]
    if isinstance(t, StringType):
        return str(f)
    if isinstance(t, FloatType):
        return float(f)
    return int(f)


class CtfSource(EventSource):
    """A CTF trace (or a directory of them) through bt2 (see the module doc)."""

    def __init__(self, path: str) -> None:
        bt2 = import_bt2()
        try:
            # ctf.fs on the trace directories themselves: babeltrace2 2.0's
            # auto-discovery aborts the process on a bad metadata file.
            root = Path(path)
            dirs = (
                [root]
                if (root / "metadata").is_file()
                else sorted({m.parent for m in root.rglob("metadata")})
            )
            fs_class = bt2.find_plugin("ctf").source_component_classes["fs"]
            spec = bt2.ComponentSpec(fs_class, {"inputs": [str(d) for d in dirs]})
            it = bt2.TraceCollectionMessageIterator(spec)
            by_name: dict[str, list[int]] = {}
            schemas: dict[str, Schema] = {}
            values: dict[str, list[dict[str, Any]]] = {}
            time: list[int] = []
            cpu: list[int] = []
            pid: list[int] = []
            tid: list[int] = []
            comm: list[int] = []
            comms: list[str] = []
            comm_index: dict[str, int] = {}
            for msg in it:
                if type(msg) is not bt2._EventMessageConst:
                    continue
                ev = msg.event
                name = ev.name
                schema = schemas.get(name)
                if schema is None:
                    pfc = ev.cls.payload_field_class
                    st = _bt2_type(bt2, pfc) if pfc is not None else None
                    schema = schemas[name] = Schema(name, st or layout([]))
                row = {}
                if ev.payload_field is not None:
                    row = _bt2_value(bt2, ev.payload_field, schema.struct)
                by_name.setdefault(name, []).append(len(time))
                values.setdefault(name, []).append(row)
                try:
                    time.append(int(msg.default_clock_snapshot.ns_from_origin))
                except (bt2.NonexistentClockSnapshot, AttributeError, ValueError):
                    time.append(-1)
                ctx = _bt2_context(ev)
                cpu.append(ctx.get("cpu_id", -1))
                pid.append(ctx.get("vpid", ctx.get("pid", -1)))
                tid.append(ctx.get("vtid", ctx.get("tid", -1)))
                procname = ctx.get("procname")
                if procname is None:
                    comm.append(-1)
                else:
                    comm.append(comm_index.setdefault(procname, len(comms)))
                    if comm[-1] == len(comms):
                        comms.append(procname)
        except bt2._Error as e:
            raise StreamError(str(path), f"babeltrace2 cannot read it: {_bt2_message(e)}") from None
        columns = [np.array(c, np.int64) for c in (time, cpu, pid, tid, comm)]
        t_time, t_cpu, t_pid, t_tid, t_comm = columns
        contexts, ctx_rows = _contexts(t_pid, t_tid, t_cpu, t_comm, comms)
        types = []
        keep: list[Any] = []
        for name, rows in by_name.items():
            try:
                batch = pack_many(schemas[name], values[name])
            except FilterError as e:
                raise StreamError(str(path), f"event {name}: {e}") from None
            keep.append(batch)
            types.append(EventType(name, schemas[name], np.array(rows, np.int64), batch.addresses))
        super().__init__(
            "ctf", str(path), types, t_time, t_cpu, t_tid, t_comm, comms, contexts, None, [], [],
            keep,
        )  # fmt: skip
        self.values = values
        self.context_rows = ctx_rows


def _bt2_context(ev: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    packet = ev.packet if ev.stream.cls.supports_packets else None
    pc = packet.context_field if packet is not None else None
    for f in (pc, ev.common_context_field, ev.specific_context_field):
        if f is None:
            continue
        for key in ("cpu_id", "vpid", "pid", "vtid", "tid"):
            if key in f and key not in out:
                out[key] = int(f[key])
        if "procname" in f and "procname" not in out:
            out["procname"] = str(f["procname"])
    return out


def _bt2_message(e: Any) -> str:
    """The first (innermost) cause babeltrace2 gives, on one line."""
    for cause in e:
        text = str(getattr(cause, "message", "")).strip()
        if text:
            return text.splitlines()[0]
    return (str(e).strip().splitlines() or ["unknown error"])[0]


# -- opening ------------------------------------------------------------------------------


def open_source(path: str, tracefs: str | None = None) -> EventSource:
    """The source for ``path``: a perf.data (by its magic), a CTF trace (a
    directory with a ``metadata`` file somewhere under it), else
    trace_pipe_raw copies (a file, or a directory of ``cpuN`` files)."""
    p = Path(path)
    if not p.exists():
        raise StreamError(path, "no such file or directory")
    if p.is_dir():
        if (p / "data").is_file() and _is_perf(p / "data"):
            return PerfSource(str(p), tracefs)
        if (p / "metadata").is_file() or any(p.rglob("metadata")):
            return CtfSource(path)
        return FtraceSource(path, tracefs)
    if _is_perf(p):
        return PerfSource(path, tracefs)
    if p.name == "metadata":
        return CtfSource(str(p.parent))
    return FtraceSource(path, tracefs)


def _is_perf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(8) in (b"PERFILE2", b"2ELIFREP", b"PERFFILE")
    except OSError as e:
        raise StreamError(str(p), f"cannot read: {e.strerror}") from None


# -- running a filter -----------------------------------------------------------------------


@dataclass
class TypeResult:
    """One event type's run: its compiled filter, the verdict per event of
    the type, and the fields the filter names that the type lacks."""

    type: EventType
    filter: CompiledFilter
    passed: np.ndarray
    missing: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return int(self.passed.sum())


@dataclass
class FilterRun:
    source: EventSource
    results: list[TypeResult]
    keep: np.ndarray  # per event in source order: selected and passed

    def __iter__(self) -> Iterator[TypeResult]:
        return iter(self.results)


def _event_refs(tree: ast.Node) -> list[ast.FieldRef]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.FieldRef) and n.root == "event"]


def _uses_context(tree: ast.Node) -> bool:
    return any(
        isinstance(n, ast.FieldRef) and n.root != "event" and n.path is not None
        for n in ast.walk(tree)
    )


def select_types(types: Sequence[EventType], patterns: Sequence[str] | None) -> list[EventType]:
    """Types whose name (or the part after ``system:``) matches a glob of
    ``patterns``; all of them when there is none."""
    if not patterns:
        return list(types)
    out = []
    for t in types:
        short = t.name.split(":", 1)[-1]
        if any(fnmatch.fnmatchcase(t.name, p) or fnmatch.fnmatchcase(short, p) for p in patterns):
            out.append(t)
    return out


def apply_filter(
    source: EventSource,
    expression: str,
    tier: str = "ebpf-jit",
    *,
    events: Sequence[str] | None = None,
) -> FilterRun:
    """Compile ``expression`` once per event type of ``source`` (selected by
    ``events`` globs) and run it over each type's events in native loops.

    LTTng's rule across types: a type that lacks a field the filter names
    gets the filter compiled with ``unknown="false"`` (its events then fail
    where that field is read); a field no type has is an error, reported
    against the first type with its column.  Raises :class:`FilterError`.
    """
    tree = parse(expression)  # syntax errors, once, with the caret
    refs = _event_refs(tree)
    chosen = select_types(source.types, events)
    keep = np.zeros(len(source), np.bool_)
    results: list[TypeResult] = []
    missing_by_type: list[tuple[str, ...]] = []
    for t in chosen:
        missing = []
        for ref in refs:
            try:
                found = t.schema.resolve(ref.names, ref.text)
            except FilterError:
                found = True  # misuse: compile_filter reports it with the column
            if found is None and ref.text not in missing:
                missing.append(ref.text)
        missing_by_type.append(tuple(missing))
    if chosen:
        everywhere = set(missing_by_type[0]).intersection(*missing_by_type[1:])
        if everywhere:
            # No type has it: a typo, not LTTng's lenient case.
            compile_filter(expression, chosen[0].schema, tier)  # type: ignore[arg-type]
    else:
        compile_filter(expression, Schema.declare("none", []), tier, unknown="false")  # type: ignore[arg-type]
    context_address = source.contexts.address(0)
    ctx_rows = getattr(source, "context_rows", np.zeros(len(source), np.int64))
    for t, missing in zip(chosen, missing_by_type, strict=True):
        cf = _compile(expression, t.schema, tier, bool(missing))
        if len(t) == 0:
            passed = np.zeros(0, np.bool_)
        elif not _uses_context(cf.tree):
            passed = cf.run_many(t.addresses, context_address)
        else:
            passed = _run_by_context(cf, t.addresses, ctx_rows[t.rows], source.contexts)
        keep[t.rows] = passed
        results.append(TypeResult(t, cf, passed, missing))
    return FilterRun(source, results, keep)


def _compile(expression: str, schema: Schema, tier: str, lenient: bool) -> CompiledFilter:
    unknown = "false" if lenient else "error"
    return compile_filter(expression, schema, tier, unknown=unknown)  # type: ignore[arg-type]


def _run_by_context(
    cf: CompiledFilter, addresses: np.ndarray, rows: np.ndarray, contexts: RecordBatch
) -> np.ndarray:
    """Verdicts with each event's own context: one native run per context
    record (events grouped by it), not a Python step per event."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    cuts = np.flatnonzero(np.diff(sorted_rows)) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [rows.shape[0]]])
    out = np.zeros(rows.shape[0], np.bool_)
    ordered = addresses[order]
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        out[order[s:e]] = cf.run_many(ordered[s:e], contexts.address(int(sorted_rows[s])))
    return out


# -- listings ------------------------------------------------------------------------------

K_INT, K_STR_INLINE, K_STR_LOC, K_ARRAY, K_SEQ_LOC = 1, 2, 3, 4, 5


def _field_program(schema: Schema) -> list[tuple[int, int, int, int, int, str]]:
    """(kind, offset, size, signed, count, name) per printable field; the
    ``common_*`` fields are left out, as ``trace`` does."""
    out = []
    for f in schema.fields:
        if f.name.startswith("common_"):
            continue
        t = f.type
        if isinstance(t, IntType):
            out.append((K_INT, f.offset, t.size, int(t.signed), 0, f.name))
        elif isinstance(t, StringType) and t.storage == "inline":
            out.append((K_STR_INLINE, f.offset, t.capacity, 0, 0, f.name))
        elif isinstance(t, StringType) and t.storage == "data_loc":
            out.append((K_STR_LOC, f.offset, 4, 0, 0, f.name))
        elif isinstance(t, ArrayType) and isinstance(t.element, IntType):
            out.append((K_ARRAY, f.offset, t.element.size, int(t.element.signed), t.length, f.name))
        elif (
            isinstance(t, SequenceType)
            and t.storage == "data_loc"
            and isinstance(t.element, IntType)
        ):
            out.append((K_SEQ_LOC, f.offset, t.element.size, int(t.element.signed), 0, f.name))
    return out


# JSON pieces as byte arrays (numba compiles loops over str slowly).
_J_TIME = np.frombuffer(b'{"time":', np.uint8)
_J_CPU = np.frombuffer(b',"cpu":', np.uint8)
_J_TID = np.frombuffer(b',"tid":', np.uint8)
_J_COMM = np.frombuffer(b',"comm":"', np.uint8)
_J_EVENT = np.frombuffer(b'","event":"', np.uint8)
_J_FIELDS = np.frombuffer(b'","fields":{', np.uint8)
_J_NULL = np.frombuffer(b"null", np.uint8)


@njit(cache=True)
def _read_int(buf, at, size, signed):
    v = np.uint64(0)
    for j in range(size):
        v |= np.uint64(buf[at + j]) << np.uint64(8 * j)
    if signed and size < 8 and (v >> np.uint64(8 * size - 1)) & np.uint64(1):
        v |= ~np.uint64(0) << np.uint64(8 * size)
    return v


@njit(cache=True)
def _int_value(out, p, buf, at, size, signed):
    v = _read_int(buf, at, size, signed)
    if signed:
        return put_signed(out, p, np.int64(v))
    return put_dec(out, p, v)


@njit(cache=True)
def _render(
    buf, offsets, sizes, etype, time, cpu, tid, comm, order, lo, hi,
    prog, pstart, pend, fname_tab, fname_len, ename_tab, ename_len, comm_tab, comm_len,
    json, out,
):  # fmt: skip
    p = 0
    for k in range(lo, hi):
        i = order[k]
        t = etype[i]
        base = offsets[i]
        size = sizes[i]
        c = comm[i]
        if json:
            p = put_bytes(out, p, _J_TIME)
            p = put_signed(out, p, time[i])
            p = put_bytes(out, p, _J_CPU)
            p = put_signed(out, p, cpu[i])
            p = put_bytes(out, p, _J_TID)
            p = put_signed(out, p, tid[i])
            p = put_bytes(out, p, _J_COMM)
            if c >= 0:
                p = put_cstring(out, p, comm_tab[c], 0, comm_len[c], True)
            p = put_bytes(out, p, _J_EVENT)
            p = put_cstring(out, p, ename_tab[t], 0, ename_len[t], True)
            p = put_bytes(out, p, _J_FIELDS)
        else:
            start = p
            if c >= 0:
                p = put_cstring(out, p, comm_tab[c], 0, comm_len[c], False)
            p = align_right(out, p, start, 16)
            p = put_byte(out, p, 45)
            start = p
            p = put_signed(out, p, tid[i])
            while p - start < 7:
                p = put_byte(out, p, 32)
            p = put_byte(out, p, 32)
            p = put_byte(out, p, 91)
            start = p
            p = put_signed(out, p, cpu[i])
            if p - start < 3:
                n = p - start
                for j in range(n - 1, -1, -1):
                    out[start + 3 - n + j] = out[start + j]
                for j in range(3 - n):
                    out[start + j] = 48
                p = start + 3
            p = put_byte(out, p, 93)
            p = put_byte(out, p, 32)
            start = p
            if time[i] >= 0:
                p = put_dec(out, p, time[i] // 1_000_000_000)
                p = align_right(out, p, start, 6)
                p = put_byte(out, p, 46)
                frac = time[i] % 1_000_000_000
                for j in range(8, -1, -1):
                    out[p + j] = 48 + frac % 10
                    frac //= 10
                p += 9
            else:
                p = put_byte(out, p, 45)
                p = align_right(out, p, start, 16)
            p = put_byte(out, p, 58)
            p = put_byte(out, p, 32)
            p = put_cstring(out, p, ename_tab[t], 0, ename_len[t], False)
            p = put_byte(out, p, 58)
        first = True
        for j in range(pstart[t], pend[t]):
            kind = prog[j, 0]
            off = prog[j, 1]
            fsize = prog[j, 2]
            signed = prog[j, 3] != 0
            count = prog[j, 4]
            if json:
                if not first:
                    p = put_byte(out, p, 44)
                p = put_byte(out, p, 34)
                p = put_cstring(out, p, fname_tab[j], 0, fname_len[j], True)
                p = put_byte(out, p, 34)
                p = put_byte(out, p, 58)
            else:
                p = put_byte(out, p, 32)
                p = put_cstring(out, p, fname_tab[j], 0, fname_len[j], False)
                p = put_byte(out, p, 61)
            first = False
            if off + fsize > size:
                if json:
                    p = put_bytes(out, p, _J_NULL)
                continue
            if kind == 1:
                p = _int_value(out, p, buf, base + off, fsize, signed)
            elif kind == 2 or kind == 3:
                if kind == 2:
                    s0 = base + off
                    n = fsize
                else:
                    loc = _read_int(buf, base + off, 4, False)
                    s0 = base + np.int64(loc & np.uint64(0xFFFF))
                    n = np.int64(loc >> np.uint64(16))
                    if s0 + n > base + size:
                        n = 0
                if json:
                    p = put_byte(out, p, 34)
                p = put_cstring(out, p, buf, s0, n, json)
                if json:
                    p = put_byte(out, p, 34)
            else:
                if kind == 4:
                    s0 = base + off
                    n = count
                else:
                    loc = _read_int(buf, base + off, 4, False)
                    s0 = base + np.int64(loc & np.uint64(0xFFFF))
                    n = np.int64(loc >> np.uint64(16)) // fsize
                    if s0 + n * fsize > base + size:
                        n = 0
                p = put_byte(out, p, 91)
                for e in range(n):
                    if e:
                        p = put_byte(out, p, 44)
                    p = _int_value(out, p, buf, s0 + e * fsize, fsize, signed)
                p = put_byte(out, p, 93)
        if json:
            p = put_byte(out, p, 125)
            p = put_byte(out, p, 125)
        p = put_byte(out, p, 10)
    return p


def render_listing(
    source: EventSource, keep: np.ndarray, *, json: bool = False, chunk_bytes: int = 1 << 23
) -> Iterator[bytes]:
    """The events with ``keep`` set, in time order, as text lines like
    ftrace's ``trace`` (``comm-tid [cpu] seconds: event: field=value ...``)
    or JSON lines, in byte chunks."""
    if source.kind == "ctf":
        yield from _render_ctf(source, keep, json)
        return
    assert source.buf is not None
    n = len(source)
    etype = np.full(n, -1, np.int64)
    offsets = np.zeros(n, np.int64)
    sizes = np.zeros(n, np.int64)
    prog_rows: list[tuple[int, int, int, int, int]] = []
    fnames: list[str] = []
    pstart, pend = [], []
    bound = []
    for k, t in enumerate(source.types):
        etype[t.rows] = k
        assert t.offsets is not None and t.sizes is not None
        offsets[t.rows] = t.offsets
        sizes[t.rows] = t.sizes
        fields = _field_program(t.schema)
        pstart.append(len(prog_rows))
        for kind, off, size, signed, count, name in fields:
            prog_rows.append((kind, off, size, signed, count))
            fnames.append(name)
        pend.append(len(prog_rows))
        biggest = int(t.sizes.max(initial=0))
        per_field = sum(
            len(name) + 8 + (6 * (size or 1) if kind == K_STR_INLINE else 0)
            + (22 * max(count, 1) if kind == K_ARRAY else 0)
            + (6 * biggest + 22 * biggest if kind in (K_STR_LOC, K_SEQ_LOC) else 24)
            for kind, off, size, signed, count, name in fields
        )  # fmt: skip
        bound.append(200 + 6 * len(t.name) + per_field)
    sel = np.flatnonzero(keep & (etype >= 0))
    if sel.shape[0] == 0:
        return
    # Time order, as `trace` and `perf script` list (perf.data's file order
    # is only ordered within each flush round).
    sel = sel[np.argsort(source.time[sel], kind="stable")]
    prog = np.array(prog_rows or [(0, 0, 0, 0, 0)], np.int64).reshape(-1, 5)
    fname_tab, fname_len = string_list_table(fnames)
    ename_tab, ename_len = string_list_table([t.name for t in source.types])
    comm_tab, comm_len = string_list_table(source.comms)
    line_max = max(bound) + 6 * int(comm_len.max(initial=0))
    per_chunk = max(1, chunk_bytes // line_max)
    out = np.empty(per_chunk * line_max, np.uint8)
    cols = (
        source.buf, offsets, sizes, etype,
        np.ascontiguousarray(source.time, np.int64), np.ascontiguousarray(source.cpu, np.int64),
        np.ascontiguousarray(source.tid, np.int64), np.ascontiguousarray(source.comm, np.int64),
        sel.astype(np.int64),
    )  # fmt: skip
    for lo in range(0, sel.shape[0], per_chunk):
        hi = min(lo + per_chunk, sel.shape[0])
        used = _render(
            *cols, lo, hi, prog, np.array(pstart, np.int64), np.array(pend, np.int64),
            fname_tab, fname_len, ename_tab, ename_len, comm_tab, comm_len, json, out,
        )  # fmt: skip
        yield out[:used].tobytes()


def _render_ctf(source: EventSource, keep: np.ndarray, json: bool) -> Iterator[bytes]:
    """CTF events come from bt2 as Python values, one by one; they are
    listed from those values (bt2 already costs Python work per event)."""
    import json as _json

    values: dict[str, list[dict[str, Any]]] = source.values  # type: ignore[attr-defined]
    where: dict[int, tuple[str, int]] = {}
    for t in source.types:
        for j, row in enumerate(t.rows.tolist()):
            where[row] = (t.name, j)
    lines = []
    for i in np.flatnonzero(keep).tolist():
        name, j = where[i]
        c = int(source.comm[i])
        comm = source.comms[c] if c >= 0 else ""
        row = values[name][j]
        if json:
            lines.append(
                _json.dumps(
                    {
                        "time": int(source.time[i]),
                        "cpu": int(source.cpu[i]),
                        "tid": int(source.tid[i]),
                        "comm": comm,
                        "event": name,
                        "fields": row,
                    },
                    separators=(",", ":"),
                )
            )
        else:
            ts = int(source.time[i])
            stamp = f"{ts // 1_000_000_000:6d}.{ts % 1_000_000_000:09d}" if ts >= 0 else "-"
            fields = " ".join(f"{k}={_ctf_text(v)}" for k, v in row.items())
            lines.append(
                f"{comm:>16}-{int(source.tid[i]):<7} [{int(source.cpu[i]):03d}] {stamp}: "
                f"{name}: {fields}".rstrip()
            )
    if lines:
        yield ("\n".join(lines) + "\n").encode()


def _ctf_text(v: Any) -> str:
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}={_ctf_text(x)}" for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + ",".join(_ctf_text(x) for x in v) + "]"
    if isinstance(v, float):
        return repr(v)
    return str(v)
