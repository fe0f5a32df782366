"""Copies of ftrace's ``per_cpu/cpuN/trace_pipe_raw`` as an event source.

The files hold ring-buffer pages (:mod:`hwtrace.filter.ftrace_raw`); event
ids are resolved through a tracefs directory (the live one by default) and
records are used where they lie in the memory-mapped files.  Events of all
CPUs are merged in time order, as ftrace's ``trace`` file shows them; a
thread's comm comes from tracefs's ``saved_cmdlines``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np

from ..errors import FilterError
from ..ftrace_raw import LIVE_TRACEFS, RawEvents, Tracefs, read_pages
from .base import (
    EventFormats,
    EventSource,
    EventType,
    StreamError,
    bad_records_note,
    buffer_address,
    contexts,
    split_bad,
)

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
            [np.uint64(buffer_address(b)) + e.offsets.astype(np.uint64) for e, b in zip(parts, bufs, strict=True)]
        ) if parts else np.zeros(0, np.uint64)  # fmt: skip
        lengths = np.concatenate([e.lengths for e in parts])
        time = np.concatenate([e.times for e in parts])
        ids = np.concatenate([e.ids for e in parts])
        cpu = np.concatenate([np.full(len(e), e.cpu, np.int64) for e in parts])
        order = np.lexsort((cpu, time))  # merged in time order, as `trace` shows
        offsets, addresses, lengths, time, ids, cpu = (
            a[order] for a in (offsets, addresses, lengths, time, ids, cpu)
        )
        formats = EventFormats(None, str(fs.root), path)
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
        contexts_, ctx = contexts(np.full_like(tid, -1), tid, cpu, comm, comms)
        types = []
        for event_id in np.unique(ids).tolist():
            rows = np.flatnonzero(ids == event_id)
            try:
                name, schema, note = formats.get(int(event_id), "")
            except FilterError as e:
                raise StreamError(str(fs.root), str(e)) from None
            if note.startswith("no format"):
                note += f" in {fs.root}: only $ctx fields"
            t = EventType(name, schema, rows, addresses[rows], offsets[rows], lengths[rows], note,
                          formats.texts.get(int(event_id), ""))  # fmt: skip
            if schema.fields:
                t, bad = split_bad(t, big)
                if bad.shape[0]:
                    first = int(offsets[rows[bad[0]]])
                    notes.append(bad_records_note(path, name, bad.shape[0], first))
            types.append(t)
        super().__init__(
            "ftrace", path, types, time, cpu, tid, comm, comms, contexts_, big, notes, info, bufs
        )
        self.context_rows = ctx
