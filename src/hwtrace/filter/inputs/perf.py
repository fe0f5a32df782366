"""perf.data with tracepoint samples as an event source.

A sample's PERF_SAMPLE_RAW is the tracefs record; its layout comes from the
file's TRACING_DATA feature (the ``format`` files ``perf record`` embedded,
read as perf's tools/perf/util/trace-event-read.c reads them), else from
tracefs; the attr's ``config`` is the tracepoint id.  Records stay in the
memory-mapped file: the addresses point into it (no copy).  Each sample's
comm is its thread's last COMM (or its parent's at FORK) at the sample's
time.

:class:`PerfInput` reads the file a range of records at a time
(:meth:`PerfInput.chunk`), so ``hwtrace filter`` runs over a perf.data of
any size in bounded memory; :class:`PerfSource` is the whole file as one
source.  :meth:`PerfSource.write_subset` writes a perf.data of the samples
kept (:func:`hwtrace.perf.rewrite.write_subset`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, fields

import numpy as np

from ...columns import distinct
from ...perf.data import PerfData, PerfDataError, SampleProblem, read_perf_data
from ...perf.features import Feature
from ...perf.records import RecordType
from ...pt.packets import release
from ..errors import FilterError
from ..ftrace_raw import parse_tracing_data
from ..schema import Schema
from .base import (
    EventFormats,
    EventSource,
    EventType,
    EventTypeInfo,
    StreamError,
    StreamInput,
    bad_records_note,
    buffer_address,
    contexts,
    split_bad,
)

# Records read at a time by PerfInput.chunks.
CHUNK_RECORDS = 1 << 16


class CommTimeline:
    """Each thread's comm over time, from a perf.data's COMM and FORK
    records (a few per thread): ``names`` are the comms, :meth:`lookup`
    gives a sample's.  Records that cannot be parsed are in ``errors``."""

    def __init__(self, data: PerfData) -> None:
        r = data.records
        rows = np.flatnonzero((r["type"] == RecordType.COMM) | (r["type"] == RecordType.FORK))
        rows = rows[np.argsort(r["time"][rows], kind="stable")]  # in time order
        self.names: list[str] = []
        self.errors: list[PerfDataError] = []
        index: dict[str, int] = {}
        line: dict[int, list[tuple[int, int]]] = {}
        for i in rows.tolist():
            try:
                body = data.record(i).body
            except PerfDataError as e:
                self.errors.append(e)
                continue
            t = int(r["time"][i])
            if int(r["type"][i]) == RecordType.COMM:
                c = index.setdefault(body.comm, len(self.names))
                if c == len(self.names):
                    self.names.append(body.comm)
                line.setdefault(body.tid, []).append((t, c))
            else:
                parent = line.get(body.ptid)
                if parent and body.tid != body.ptid:
                    line.setdefault(body.tid, []).append((t, parent[-1][1]))
        self._line = {
            tid: (np.array([e[0] for e in v], np.int64), np.array([e[1] for e in v], np.int64))
            for tid, v in line.items()
        }

    def lookup(self, tid: np.ndarray, time: np.ndarray) -> np.ndarray:
        """The comm (index into ``names``, -1: none known) of thread
        ``tid[i]`` at ``time[i]``."""
        comm = np.full(tid.shape[0], -1, np.int64)
        if tid.shape[0] == 0:
            return comm
        utid, inverse = np.unique(tid, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        bounds = np.searchsorted(inverse[order], np.arange(utid.shape[0] + 1))
        for k, t in enumerate(utid.tolist()):
            got = self._line.get(t)
            if got is None:
                continue
            times, ids = got
            sel = order[bounds[k] : bounds[k + 1]]
            at = np.searchsorted(times, time[sel], side="right") - 1
            comm[sel] = ids[np.maximum(at, 0)]
        return comm


@dataclass
class PerfChunk(EventSource):
    """The samples of records ``start..stop`` of a perf.data (types in the
    input's order, every one present, maybe without events)."""

    start: int = 0
    stop: int = 0
    sample_record: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    context_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    sample_problems: list[SampleProblem] = field(default_factory=list)
    # Per type: (events refused by split_bad, file offset of the first).
    bad: list[tuple[int, int]] = field(default_factory=list)


class PerfInput(StreamInput):
    """A perf.data's tracepoint samples, one event type per event (attr)
    that has samples, read a range of records at a time (see the module
    doc).  Raises :class:`~.base.StreamError` for a file that cannot be
    read."""

    kind = "perf"

    def __init__(self, path: str, tracefs: str | None = None) -> None:
        try:
            data = read_perf_data(path)
        except PerfDataError as e:
            raise StreamError(e.path, e.message, e.offset) from None
        self.data = data
        self.path = data.path
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
        formats = EventFormats(embedded, tracefs, data.path)
        self.read_errors = [str(e) for e in data.errors]  # damage the reader skipped
        self.timeline = CommTimeline(data)
        self.comms = self.timeline.names
        sampled = (r["type"] == RecordType.SAMPLE) & (r["attr"] >= 0)
        self.attrs: list[int] = distinct(r["attr"][sampled]).tolist()
        self.columns = set(data.sample_columns(self.attrs))
        self.types = []
        for a in self.attrs:
            ea = data.attrs[a]
            attr = ea.attr
            if attr.type == 2 and attr.sample_type & 1024:
                # PERF_TYPE_TRACEPOINT: config is the event id, RAW the record.
                name, schema, note = formats.get(int(attr.config), ea.name)
                text = formats.texts.get(int(attr.config), "")
            else:
                name = ea.name or f"event {a}"
                schema = Schema.declare(name, [])
                note = "no PERF_SAMPLE_RAW tracepoint record: only $ctx fields"
                text = ""
            self.types.append(EventTypeInfo(name, schema, note, text))
        self.notes = []
        if embedded is None and any(a.attr.type == 2 for a in data.attrs):
            where = formats.tracefs()
            self.notes.append(
                f"{data.path}: no TRACING_DATA: event formats from "
                f"{where.root if where else 'nowhere (no tracefs)'}"
            )
        self._base = buffer_address(data.buf)
        self._scanned: tuple[list[str], list[int | None]] | None = None

    def __len__(self) -> int:
        return self.data.records["offset"].shape[0]

    def chunk(self, start: int, stop: int) -> PerfChunk:
        """The samples among records ``start..stop``, as a source."""
        data = self.data
        r = data.records
        samples, problems = data.decode_samples(start, stop)
        n = len(samples)
        rec_off = r["offset"][samples.record].astype(np.int64)
        raw_off = samples["raw_offset"].astype(np.int64) if n else np.zeros(0, np.int64)
        raw_size = samples["raw_size"].astype(np.int64) if n else np.zeros(0, np.int64)
        columns = self.columns

        def column(name: str) -> np.ndarray:
            if name in columns:
                return samples[name].astype(np.int64)
            return np.full(n, -1, np.int64)

        pid, tid, cpu, time = (column(c) for c in ("pid", "tid", "cpu", "time"))
        comm = self.timeline.lookup(tid, time)
        contexts_, ctx = contexts(pid, tid, cpu, comm, self.comms)
        base = self._base
        types: list[EventType] = []
        bad: list[tuple[int, int]] = []
        for k, a in enumerate(self.attrs):
            info = self.types[k]
            rows = np.flatnonzero(samples.attr == a)
            offsets = rec_off[rows] + raw_off[rows]
            t = EventType(
                info.name,
                info.schema,
                rows,
                (np.uint64(base) + offsets.astype(np.uint64))
                if base
                else offsets.astype(np.uint64),
                offsets,
                raw_size[rows],
                info.note,
                info.format_text,
            )
            refused = (0, 0)
            if info.schema.fields:
                t, out = split_bad(t, data.buf)
                if out.shape[0]:
                    refused = (out.shape[0], int(offsets[out[0]]))
            types.append(t)
            bad.append(refused)
        return PerfChunk(
            "perf", data.path, types, time, cpu, tid, comm, self.comms, contexts_, data.buf,
            start=start, stop=stop, sample_record=samples.record, context_rows=ctx,
            sample_problems=problems, bad=bad,
        )  # fmt: skip

    def _ranges(self) -> Iterator[tuple[int, int]]:
        n = len(self)
        for lo in range(0, n, CHUNK_RECORDS):
            yield lo, min(lo + CHUNK_RECORDS, n)

    def problems_of(self, chunks: list[PerfChunk]) -> list[str]:
        """The damage found in ``chunks``: the reader's, the samples', the
        COMM/FORK records', then the records refused per type, each said
        once for all the chunks."""
        return self._problems([(c.sample_problems, c.bad) for c in chunks])

    def _problems(
        self, parts: list[tuple[list[SampleProblem], list[tuple[int, int]]]]
    ) -> list[str]:
        sample = SampleProblem.merge([p for problems, _ in parts for p in problems])
        out = self.read_errors + [str(p.error(self.path)) for p in sample]
        out += [str(e) for e in self.timeline.errors]
        for k, info in enumerate(self.types):
            refused = [bad[k] for _, bad in parts if bad[k][0]]
            if refused:
                count = sum(n for n, _ in refused)
                out.append(bad_records_note(self.path, info.name, count, refused[0][1]))
        return out

    def _scan(self) -> tuple[list[str], list[int | None]]:
        """One pass over the file before filtering: its problems (said
        before any output) and, per range, the earliest sample time of the
        ranges after it (how far a time-ordered listing can go after each
        range)."""
        if self._scanned is None:
            parts = []
            earliest: list[int | None] = []
            for lo, hi in self._ranges():
                c = self.chunk(lo, hi)
                earliest.append(int(c.time.min()) if len(c) else None)
                parts.append((c.sample_problems, c.bad))
                self._release(lo, hi)
            after: list[int | None] = []
            low: int | None = None
            for e in reversed(earliest):
                after.append(low)
                if e is not None:
                    low = e if low is None else min(low, e)
            self._scanned = (self._problems(parts), after[::-1])
        return self._scanned

    @property
    def problems(self) -> list[str]:  # type: ignore[override]
        """The damage in the whole file (found by a first pass over it)."""
        return self._scan()[0]

    def chunks(self) -> Iterator[tuple[PerfChunk, int | None]]:
        """Each range of records as a source, with the earliest time of the
        samples after it (None: the last range)."""
        after = self._scan()[1]
        for (lo, hi), later in zip(self._ranges(), after, strict=True):
            yield self.chunk(lo, hi), later
            self._release(lo, hi)

    def _release(self, start: int, stop: int) -> None:
        """Let the pages of records ``start..stop`` leave memory (they are
        read again from the page cache if needed)."""
        r = self.data.records
        if stop > start:
            end = int(r["offset"][stop - 1] + r["size"][stop - 1] + r["payload"][stop - 1])
            release(self.data.buf, int(r["offset"][start]), end)


class PerfSource(PerfChunk):
    """A perf.data's samples, the whole file as one source (see the module
    doc)."""

    def __init__(self, path: str, tracefs: str | None = None) -> None:
        inp = PerfInput(path, tracefs)
        whole = inp.chunk(0, len(inp))
        super().__init__(**{f.name: getattr(whole, f.name) for f in fields(whole)})
        self.data = inp.data
        self.problems = inp.problems_of([whole])
        self.notes = list(inp.notes)

    def write_subset(self, out: str, keep: np.ndarray) -> tuple[int, int]:
        """Write ``out``: this perf.data with only the samples whose
        ``keep`` (bool, one per event in source order) is set; every other
        record, the header, attrs and features as they are (feature and
        AUXTRACE offsets moved by the bytes removed;
        :func:`hwtrace.perf.rewrite.write_subset`).  Returns (records, bytes)
        written to the data section."""
        from ...perf.rewrite import write_subset

        try:
            return write_subset(self.data, out, self.sample_record[~keep])
        except PerfDataError as e:
            raise StreamError(e.path, e.message, e.offset) from None
