"""perf.data with tracepoint samples as an event source.

A sample's PERF_SAMPLE_RAW is the tracefs record; its layout comes from the
file's TRACING_DATA feature (the ``format`` files ``perf record`` embedded,
read as perf's tools/perf/util/trace-event-read.c reads them), else from
tracefs; the attr's ``config`` is the tracepoint id.  Records stay in the
memory-mapped file: the addresses point into it (no copy).  Each sample's
comm is its thread's last COMM (or its parent's at FORK) at the sample's
time.  :meth:`PerfSource.write_subset` writes a perf.data of the samples
kept (:func:`hwtrace.perf.rewrite.write_subset`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import FilterError
from ..ftrace_raw import parse_tracing_data
from ..schema import Schema
from .base import (
    EventFormats,
    EventSource,
    EventType,
    StreamError,
    buffer_address,
    contexts,
    split_bad,
)


class PerfSource(EventSource):
    """perf.data samples, one event type per attr (see the module doc)."""

    def __init__(self, path: str, tracefs: str | None = None) -> None:
        from ...perf.data import PerfDataError, read_perf_data
        from ...perf.features import Feature
        from ...perf.records import RecordType

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
        formats = EventFormats(embedded, tracefs, data.path)
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
        contexts_, ctx = contexts(pid, tid, cpu, comm, comms)
        base = buffer_address(data.buf)
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
                t, _ = split_bad(t, data.buf, data.path, notes)
            types.append(t)
        self.sample_record = samples.record  # each event's row in data.records
        super().__init__(
            "perf", data.path, types, time, cpu, tid, comm, comms, contexts_, data.buf, notes
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
        from ...perf.data import PerfDataError
        from ...perf.rewrite import write_subset

        try:
            return write_subset(self.data, out, self.sample_record[~keep])
        except PerfDataError as e:
            raise StreamError(e.path, e.message, e.offset) from None


def _perf_comms(data: Any, tid: np.ndarray, time: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Each sample's comm: the thread's last COMM (or the comm it had from
    its parent at FORK) at the sample's time."""
    from ...perf.data import PerfDataError
    from ...perf.records import RecordType

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
