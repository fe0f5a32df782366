"""The event streams a compiled filter runs over: the model every input
adapter (:mod:`hwtrace.filter.inputs`) fills.

A source gives, per event type, a :class:`~hwtrace.filter.schema.Schema`
and the address of each event's raw record in memory, plus one context
record per event (``$ctx.pid``, ``tid``, ``cpu_id``, ``procname`` where the
source knows them), so that a filter compiled once per type runs over all
of that type's events in native loops
(:meth:`~hwtrace.filter.compile.CompiledFilter.run_many`).

Records whose bytes do not hold their schema (too short, a ``data_loc``
beyond the record) would let a filter read outside them: :func:`split_bad`
finds them in a compiled pass and the sources leave them out, saying so.
Bad input raises :class:`StreamError` (one line: file and offset).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ... import aot
from ..errors import FilterError
from ..ftrace_raw import LIVE_TRACEFS, Tracefs
from ..packing import RecordBatch, pack_many
from ..schema import DEFAULT_CONTEXT, Schema, SequenceType, StringType
from ..sources import schema_from_tracefs


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
    format_text: str = ""  # the tracefs format it came from, when one did

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


@dataclass
class EventTypeInfo:
    """An event type as an input knows it before reading its events: name
    (``system:event``), record layout and why the layout is what it is."""

    name: str
    schema: Schema
    note: str = ""
    format_text: str = ""  # the tracefs format the schema is from, when one is


class StreamInput:
    """Recorded events read as one source or several in order
    (:meth:`chunks`), for inputs too large to hold at once.

    ``types`` are the event types in the order every chunk lists them
    (``chunk.types[k]`` is of type ``types[k]``); ``comms`` the names the
    chunks' ``comm`` columns index; ``problems`` the damage found in the
    whole input (known before the first chunk), ``notes`` facts worth
    saying."""

    kind: str
    path: str
    types: list[EventTypeInfo]
    comms: list[str]
    problems: list[str]
    notes: list[str]

    def chunks(self) -> Iterator[tuple[EventSource, int | None]]:
        """Each chunk with the earliest event time of the chunks after it
        (None: no chunk follows), so a time-ordered listing knows how far
        it can go."""
        raise NotImplementedError


class WholeInput(StreamInput):
    """A source read at once, as a :class:`StreamInput` of one chunk."""

    def __init__(self, source: EventSource) -> None:
        self.source = source
        self.kind, self.path = source.kind, source.path
        self.types = [EventTypeInfo(t.name, t.schema, t.note, t.format_text) for t in source.types]
        self.comms = source.comms
        self.problems, self.notes = source.problems, source.notes

    def chunks(self) -> Iterator[tuple[EventSource, int | None]]:
        yield self.source, None


def contexts(
    pid: np.ndarray,
    tid: np.ndarray,
    cpu: np.ndarray,
    comm: np.ndarray,
    comms: Sequence[str],
    *,
    uid: np.ndarray | None = None,
    gid: np.ndarray | None = None,
) -> tuple[RecordBatch, np.ndarray]:
    """One packed DEFAULT_CONTEXT record per distinct (pid, tid, cpu, comm,
    uid, gid) and each event's row among them (uid and gid where the
    source knows them, else 0)."""
    n = pid.shape[0]
    zero = np.zeros(n, np.int64)
    uid = zero if uid is None else uid
    gid = zero if gid is None else gid
    keys = (gid, uid, comm, cpu, tid, pid)  # lexsort: the last key sorts first
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
    uniq = {"pid": pid[first], "tid": tid[first], "cpu": cpu[first], "comm": comm[first],
            "uid": uid[first], "gid": gid[first]}  # fmt: skip
    if first.shape[0] == 0:  # one zero record, for filters over no events
        uniq = {k: np.zeros(1, np.int64) for k in uniq}
        uniq["comm"] = np.full(1, -1, np.int64)
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
            "uid": uniq["uid"],
            "gid": uniq["gid"],
        },
    )
    return batch, inverse


# Records shorter than their schema, or with a data_loc beyond the record,
# would let a filter read outside them: such events are refused.
@aot.njit(cache=True)
def _valid_records(buf, offsets, sizes, fixed, locs, ok):
    """Clear ``ok[i]`` for each record ``i`` that does not hold its schema."""
    n = offsets.shape[0]
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
    ok = np.ones(offsets.shape[0], np.bool_)
    _valid_records(buf, offsets.astype(np.int64), sizes.astype(np.int64), schema.size, locs, ok)
    return ok


def split_bad(t: EventType, buf: np.ndarray) -> tuple[EventType, np.ndarray]:
    """``t`` without the events whose records do not hold their schema, and
    those events' positions in ``t`` (:func:`bad_records_note` says so)."""
    assert t.offsets is not None and t.sizes is not None
    ok = _check_records(buf, t.schema, t.offsets, t.sizes)
    bad = np.flatnonzero(~ok)
    if bad.shape[0]:
        t = EventType(
            t.name, t.schema, t.rows[ok], t.addresses[ok], t.offsets[ok], t.sizes[ok], t.note,
            t.format_text,
        )  # fmt: skip
    return t, bad


def bad_records_note(where: str, name: str, count: int, first_offset: int) -> str:
    """The problem :func:`split_bad`'s refusals are reported as."""
    return (
        f"{where}: {count} {name} record(s) too short for their format or with "
        f"a field beyond the record (first at offset {first_offset:#x}): skipped"
    )


def buffer_address(buf: np.ndarray) -> int:
    """The address of ``buf``'s first byte (0 for an empty buffer)."""
    return int(buf.ctypes.data) if buf.shape[0] else 0


class EventFormats:
    """Event id -> (name, schema) from embedded formats, else a tracefs dir."""

    def __init__(
        self, embedded: dict[int, tuple[str, str, str]] | None, tracefs: str | None, where: str
    ) -> None:
        self.embedded = embedded or {}
        self.tracefs_path = tracefs
        self._tracefs: Tracefs | None = None
        self.where = where
        self.cache: dict[int, tuple[str, Schema, str]] = {}
        self.texts: dict[int, str] = {}  # event id -> its format file's text

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
            self.texts[event_id] = text
        self.cache[event_id] = result
        return result
