"""Where kernel-filtered tracepoint events go: JSON lines, perf.data or CTF.

:func:`open_trace_output` picks the writer by the path (``*.jsonl`` /
``*.json``: JSON lines; ``*.data``: perf.data; anything else: a CTF trace
directory).  Every writer takes the :class:`~hwtrace.ktrace.trace.EventBatch`
es a :class:`~hwtrace.ktrace.trace.KernelTrace` reads, one after the other
(:meth:`TraceOutput.write`), then :meth:`TraceOutput.close` with the
session's counters.  Batches are handled whole with numpy, per event type:
records are gathered into a matrix (one row per event), fields decoded or
copied by column, and output bytes placed with one scatter per field run;
only JSON's final ``json.dumps`` (and each distinct string's decode) is per
event.

* JSON lines: ``{"time", "cpu", "event", "pid", "tid", "comm", "fields"}``
  per event, each batch in time order; the ``common_*`` fields are left out
  of ``fields`` (their facts are the line's own keys).  The last line is
  ``{"summary": counts}`` when :meth:`~TraceOutput.close` is given counts.
* perf.data as ``perf record -e SYSTEM:EVENT`` writes it: one tracepoint
  event per type (``config`` the tracepoint id, ``sample_type``
  IDENTIFIER|TID|TIME|CPU|PERIOD|RAW, CLOCK_MONOTONIC time), each event a
  SAMPLE whose RAW is the tracefs record, the event formats in the
  TRACING_DATA feature (:func:`build_tracing_data`) and COMM records naming
  the threads: ``perf script`` prints the events with their fields.
  Batches of several sessions (each with its own filter) may be written
  in turn: FINISHED_ROUND records go only where no earlier event can
  follow, so perf's time ordering stays right.
* CTF 1.8 (as LTTng's kernel traces): a stream file per session and CPU
  (``channelS_CPU``; each in time order), an event class ``SYSTEM:EVENT`` per type with the record's fields (integers with
  their size and signedness, ``char[N]`` as UTF-8 char arrays,
  ``__data_loc`` strings as strings, integer arrays and sequences), the
  pid, tid and procname as the stream's event context, timestamps in
  nanoseconds of the monotonic clock.  ``babeltrace2 DIR`` prints them.

A tracepoint BPF program's context is the raw record with its first eight
bytes (the ``common_*`` header) overwritten by the kernel with a
``struct pt_regs *`` (perf_trace_run_bpf_submit), so the copies the kernel
programs make start with a kernel address.  The writers put the header
back: ``common_type`` the tracepoint id, ``common_pid`` the thread, flags
and preempt count 0 (a BPF program cannot know them).
"""

from __future__ import annotations

import bisect
import json
import os
import platform
import struct
import time
import uuid as _uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from .. import aot
from ..export.ctf import PACKET_HEAD, packet_head, tsdl_preamble, tsdl_stream_block, tsdl_string
from ..filter.ebpf.kernel import HEADER as HEADER_DTYPE
from ..filter.listing import read_int
from ..filter.printfmt import word_fields, word_rows
from ..filter.schema import ArrayType, IntType, SequenceType, StringType, Type
from ..filter.sources import pointer_fields
from ..perf.attr import PerfEventAttr, PerfType
from ..perf.features import Feature
from ..perf.records import Comm, LostSamples, RecordType, SampleId, SampleType, sample_dtype
from ..perf.writer import CLOCK_MONOTONIC, PerfDataWriter, host_env
from ..textout import (
    digit_count,
    pad_to,
    put_dec,
    put_hex,
    put_row,
    put_seconds,
    put_signed,
    put_spaces,
    put_text,
    string_list_table,
)
from .trace import EventBatch, TracedEvent

__all__ = [
    "OutputError",
    "TextOutput",
    "TraceOutput",
    "build_tracing_data",
    "open_trace_output",
]

_TRACEFS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


class OutputError(Exception):
    """An output that cannot be written; the message (one line) says why."""


# -- what each event type's record holds -------------------------------------------------


@dataclass(frozen=True)
class _Field:
    """One payload field: ``kind`` "int", "chars" (char[N]), "ints" (an
    integer array of ``dims``), "str" (``__data_loc char[]``) or "seq"
    (``__data_loc T[]`` of integers ``size`` bytes each)."""

    name: str
    kind: str
    offset: int
    size: int  # int: bytes; chars: N; ints/seq: element bytes; str: 4
    signed: bool = False
    dims: tuple[int, ...] = ()
    hex: bool = False  # an int that is a pointer: listed in hex
    # An int the kernel prints as words (flags, enumerations; see
    # hwtrace.filter.printfmt): its value's text in a text line.
    words: Callable[[int], str] | None = None

    @property
    def fixed(self) -> int:
        """Bytes the field takes in the record (data_loc: its u32)."""
        if self.kind == "ints":
            return self.size * int(np.prod(self.dims))
        return 4 if self.kind in ("str", "seq") else self.size

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(f"<{'i' if self.signed else 'u'}{self.size}")


def _array_dims(t: Type) -> tuple[tuple[int, ...], IntType] | None:
    dims: list[int] = []
    while isinstance(t, ArrayType):
        dims.append(t.length)
        t = t.element
    return (tuple(dims), t) if isinstance(t, IntType) else None


@dataclass
class _Plan:
    """An event type as the writers see it: its fields (``common_*`` left
    out), the common header's fields, and the record's fixed bytes."""

    event: TracedEvent
    fields: list[_Field]
    common: dict[str, tuple[int, int]]  # common_* name -> (offset, size), within 8 bytes
    fixed_end: int

    @classmethod
    def of(cls, e: TracedEvent) -> _Plan:
        fields: list[_Field] = []
        common: dict[str, tuple[int, int]] = {}
        pointers = pointer_fields(e.format_text)
        ints = {f.name for f in e.schema.fields if isinstance(f.type, IntType)}
        words = word_fields(e.format_text, ints)
        for f in e.schema.fields:
            t = f.type
            if f.name.startswith("common_"):
                if isinstance(t, IntType) and f.offset + t.size <= 8:
                    common[f.name] = (f.offset, t.size)
                continue
            if isinstance(t, IntType):
                hex_ = f.name in pointers
                fields.append(_Field(f.name, "int", f.offset, t.size, t.signed, hex=hex_,
                                     words=words.get(f.name)))  # fmt: skip
            elif isinstance(t, StringType) and t.storage == "inline":
                fields.append(_Field(f.name, "chars", f.offset, t.capacity))
            elif isinstance(t, StringType) and t.storage == "data_loc":
                fields.append(_Field(f.name, "str", f.offset, 4))
            elif isinstance(t, ArrayType) and (found := _array_dims(t)) is not None:
                dims, el = found
                fields.append(_Field(f.name, "ints", f.offset, el.size, el.signed, dims))
            elif (
                isinstance(t, SequenceType)
                and t.storage == "data_loc"
                and isinstance(t.element, IntType)
            ):
                el = t.element
                fields.append(_Field(f.name, "seq", f.offset, el.size, el.signed))
            # Anything else (pointers to strings, floats, structures) cannot
            # come from a tracefs format: left out.
        end = max([f.offset + f.fixed for f in fields] + [o + s for o, s in common.values()] + [8])
        return cls(e, fields, common, end)


@dataclass
class _Group:
    """The events of one type in a batch: their ``rows`` in the batch, the
    records as a zero-padded matrix (one row each) and their sizes."""

    k: int  # the writer's event index
    rows: np.ndarray
    mat: np.ndarray  # (n, width) uint8
    sizes: np.ndarray  # int64

    @property
    def width(self) -> int:
        return self.mat.shape[1]


def _copy_segments(
    out: np.ndarray,
    out_starts: np.ndarray,
    src: np.ndarray,
    src_starts: np.ndarray,
    lens: np.ndarray,
) -> None:
    """``out[out_starts[i] : out_starts[i] + lens[i]] = src[src_starts[i] : ...]``
    for every ``i``, in one gather and one scatter."""
    lens = np.asarray(lens, np.int64)
    out_starts = np.asarray(out_starts, np.int64)
    src_starts = np.asarray(src_starts, np.int64)
    total = int(lens.sum())
    if total <= 0:
        return
    widest = int(lens.max())
    if widest * lens.shape[0] <= 2 * total:
        # Lengths alike (the usual case): an (events, widest) index, masked.
        j = np.arange(widest)
        keep = j < lens[:, None]
        out[(out_starts[:, None] + j)[keep]] = src[(src_starts[:, None] + j)[keep]]
        return
    # Lengths far apart: one index run per segment, from the jumps between them.
    some = lens > 0
    out_starts, src_starts, lens = out_starts[some], src_starts[some], lens[some]
    first = (np.cumsum(lens) - lens)[1:]
    step = np.ones(total, np.int64)
    step[0] = out_starts[0]
    step[first] = out_starts[1:] - (out_starts[:-1] + lens[:-1]) + 1
    dst = np.cumsum(step)
    step[0] = src_starts[0]
    step[first] = src_starts[1:] - (src_starts[:-1] + lens[:-1]) + 1
    out[dst] = src[np.cumsum(step)]


def _rows(buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, width: int) -> np.ndarray:
    """``buf[starts[i] : starts[i] + sizes[i]]`` as row ``i`` of an
    (events, ``width``) matrix, zero beyond each size: whole rows are
    gathered from a sliding window over ``buf``."""
    n = starts.shape[0]
    mat = np.zeros((n, width), np.uint8)
    inside = starts + width <= buf.shape[0]
    if buf.shape[0] >= width and inside.any():
        window = np.lib.stride_tricks.sliding_window_view(buf, width)
        mat[inside] = window[starts[inside]]
    for i in np.flatnonzero(~inside).tolist():  # the last records of the buffer
        s = int(starts[i])
        part = buf[s : s + width]
        mat[i, : part.shape[0]] = part
    mat[np.arange(width) >= sizes[:, None]] = 0
    return mat


def _data_loc(g: _Group, f: _Field) -> tuple[np.ndarray, np.ndarray]:
    """Where each event's ``__data_loc`` data is in its row, and its
    length, cut to the record."""
    v = np.ascontiguousarray(g.mat[:, f.offset : f.offset + 4]).view("<u4").reshape(-1)
    v = v.astype(np.int64)
    start, length = v & 0xFFFF, v >> 16
    end = np.minimum(start + length, g.sizes)
    length = np.maximum(end - start, 0)
    return np.where(length > 0, start, 0), length


def _concat(g: _Group, start: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes ``row[start : start + length]`` of each event one after
    the other, and where each begins."""
    n = g.rows.shape[0]
    offs = np.cumsum(length) - length
    flat = np.zeros(int(length.sum()), np.uint8)
    _copy_segments(flat, offs, g.mat.reshape(-1), np.arange(n) * g.width + start, length)
    return flat, offs


def _strlen(flat: np.ndarray, offs: np.ndarray, length: np.ndarray) -> np.ndarray:
    """The length of each string ``flat[offs : offs + length]`` up to its
    first NUL."""
    zeros = np.flatnonzero(flat == 0)
    if zeros.shape[0] == 0:
        return length
    k = np.searchsorted(zeros, offs)
    nul = np.where(k < zeros.shape[0], zeros[np.minimum(k, zeros.shape[0] - 1)], flat.shape[0])
    return np.minimum(nul - offs, length)


def _split_texts(flat: np.ndarray, offs: np.ndarray, length: np.ndarray) -> list[str]:
    """Each ``flat[offs : offs + length]`` up to its first NUL as text
    (each distinct value decoded once)."""
    data = flat.tobytes()
    cache: dict[bytes, str] = {}
    out = []
    for o, n in zip(offs.tolist(), _strlen(flat, offs, length).tolist(), strict=True):
        raw = data[o : o + n]
        text = cache.get(raw)
        if text is None:
            text = cache[raw] = raw.decode("utf-8", "replace")
        out.append(text)
    return out


def _texts(chars: np.ndarray) -> list[str]:
    """Each row of ``chars`` (a ``char[N]``: NUL-terminated or full) as
    text, each distinct value decoded once."""
    n, w = chars.shape
    if n == 0 or w == 0:
        return [""] * n
    nul = chars == 0
    length = np.where(nul.any(axis=1), nul.argmax(axis=1), w)
    cut = np.where(np.arange(w) < length[:, None], chars, 0).astype(np.uint8)
    values, inverse = np.unique(cut.view(f"S{w}").reshape(n), return_inverse=True)
    decoded = [v.decode("utf-8", "replace") for v in values.tolist()]
    return [decoded[i] for i in inverse.reshape(-1).tolist()]


class TraceOutput:
    """Base of the writers: :meth:`write` each batch, then :meth:`close`."""

    count = 0  # events written

    def __init__(self, path: str, events: Sequence[TracedEvent]) -> None:
        if not events:
            raise OutputError(f"{path}: no events to write")
        self.path = path
        self.events = list(events)
        self.plans = [_Plan.of(e) for e in self.events]
        self._index: dict[str, int] = {}
        for k, e in enumerate(self.events):
            self._index.setdefault(e.name, k)
        self.count = 0
        self.closed = False

    def write(self, batch: EventBatch) -> None:
        raise NotImplementedError

    def close(self, counts: dict[str, int] | None = None) -> None:
        raise NotImplementedError

    def __enter__(self) -> TraceOutput:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.closed:
            self.close()

    # -- batches as groups of one event type ---------------------------------------------

    def _kinds(self, batch: EventBatch) -> np.ndarray:
        """Each event's index among this output's events."""
        table = np.empty(len(batch.events), np.int64)
        for i, e in enumerate(batch.events):
            k = self._index.get(e.name)
            if k is None:
                raise OutputError(f"{self.path}: event {e.name} was not given when it was opened")
            table[i] = k
        return table[batch.header["event"].astype(np.int64)]

    def _groups(self, batch: EventBatch) -> list[_Group]:
        """The batch's events per type, records copied into a matrix each
        with their common header set right (see the module doc)."""
        n = len(batch)
        if n == 0:
            return []
        kinds = self._kinds(batch)
        starts = batch.starts.astype(np.int64)
        sizes = batch.sizes.astype(np.int64)
        tids = batch.header["tid"]
        out = []
        for k in np.unique(kinds).tolist():
            plan = self.plans[k]
            rows = np.flatnonzero(kinds == k)
            size = sizes[rows]
            width = max(int(size.max()), plan.fixed_end)
            mat = _rows(batch.buf, starts[rows], size, width)
            self._fix_common(plan, mat, size, tids[rows])
            out.append(_Group(k, rows, mat, size))
        return out

    @staticmethod
    def _fix_common(plan: _Plan, mat: np.ndarray, sizes: np.ndarray, tids: np.ndarray) -> None:
        """Records whose ``common_type`` is not their tracepoint's id (a
        BPF program's copy: see the module doc) get their common header:
        the id, the thread as ``common_pid``, zero flags and preempt count
        (which a BPF program cannot know)."""
        tp = plan.event.tracepoint_id
        typ = plan.common.get("common_type", (0, 2))
        pid = plan.common.get("common_pid", (4, 4))
        have = np.zeros(mat.shape[0], np.int64)
        for j in range(typ[1]):
            have |= mat[:, typ[0] + j].astype(np.int64) << (8 * j)
        bad = (have != tp) & (sizes >= 8)
        if not bad.any():
            return
        rows = np.flatnonzero(bad)
        mat[rows, 0:8] = 0
        value = np.full(rows.shape[0], tp, np.int64).astype(f"<u{typ[1]}")
        mat[rows, typ[0] : typ[0] + typ[1]] = value.view(np.uint8).reshape(-1, typ[1])
        value = tids[rows].astype(np.int64).astype(f"<i{pid[1]}")
        mat[rows, pid[0] : pid[0] + pid[1]] = value.view(np.uint8).reshape(-1, pid[1])


# -- JSON lines ------------------------------------------------------------------------------

_JSON = json.JSONEncoder(ensure_ascii=False)


class JsonLinesOutput(TraceOutput):
    """One JSON object per event (see the module doc), written by compiled
    loops a batch at a time."""

    JSON = True  # (TextOutput: the text lines)

    def __init__(self, path: str, events: Sequence[TracedEvent]) -> None:
        super().__init__(path, events)
        self._line_setup()
        try:
            self.file: TextIO = open(path, "w", encoding="utf-8")
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None

    def _line_setup(self) -> None:
        self.line_plans = [_LinePlan.of(p, self.JSON) for p in self.plans]
        self.names = string_list_table(
            [_JSON.encode(e.name) if self.JSON else f"{e.name}: " for e in self.events]
        )

    def _put(self, text: bytes) -> None:
        if hasattr(self.file, "buffer"):
            self.file.flush()
            self.file.buffer.write(text)
        else:
            self.file.write(text.decode("utf-8"))

    def lines(self, batch: EventBatch) -> bytes | None:
        """The batch's lines, in time order (None: an event with a field
        or a string the compiled writer does not take)."""
        n = len(batch)
        h = batch.header
        f_start = np.zeros(n, np.int64)
        f_len = np.zeros(n, np.int64)
        pieces, at = [], 0
        kind = np.zeros(n, np.int64)
        for g in self._groups(batch):
            lp = self.line_plans[g.k]
            if lp.arrays is None:
                return None
            m = g.rows.shape[0]
            w_idx, w_tab, w_lens = self._words(g, lp)
            most = lp.most + int(w_lens.max(initial=0)) * w_idx.shape[1]
            out = np.empty(m * (most + lp.strings * (_JSON_BYTE * g.width + 2)), np.uint8)
            starts, lens = np.empty(m, np.int64), np.empty(m, np.int64)
            used = _field_lines(g.mat, g.sizes, *lp.arrays, w_idx, w_tab, w_lens, out, starts,
                                lens)  # fmt: skip
            if used < 0:
                return None
            pieces.append(out[:used])
            f_start[g.rows] = starts + at
            f_len[g.rows] = lens
            kind[g.rows] = g.k
            at += used
        fields = np.concatenate(pieces) if pieces else np.zeros(0, np.uint8)
        names, comm = np.unique(h["comm"], return_inverse=True)
        texts = [bytes(c).decode("utf-8", "replace") for c in names.tolist()]
        comm_tab, comm_lens = string_list_table(
            [_JSON.encode(c) if self.JSON else f"{c:>16}" for c in texts]
        )
        order = np.argsort(h["time"], kind="stable")
        out = np.empty(at + n * (comm_tab.shape[1] + self.names[0].shape[1] + 160), np.uint8)
        write = _json_lines if self.JSON else _event_lines
        used = write(order, comm.reshape(-1).astype(np.int64), comm_tab, comm_lens,
                     h["pid"].astype(np.int64), h["tid"].astype(np.int64), h["cpu"].astype(np.int64),
                     h["time"].astype(np.int64), kind, *self.names, fields, f_start, f_len, out)  # fmt: skip
        return out[:used].tobytes()

    def _words(self, g: _Group, lp: _LinePlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The texts of the group's fields printed as words: for each event
        and such field the row of its text in a table (each distinct value
        put into words once)."""
        m = g.rows.shape[0]
        idx = np.zeros((m, len(lp.words)), np.int64)
        texts: list[str] = []
        for j, f in enumerate(lp.words):
            assert f.words is not None
            cols = np.ascontiguousarray(g.mat[:, f.offset : f.offset + f.size])
            idx[:, j] = word_rows(cols.view(f.dtype).reshape(m), f.words, texts)
        return idx, *string_list_table(texts)

    def decode(self, g: _Group) -> dict[str, list]:
        """The group's field values, one list per field (event order)."""
        plan = self.plans[g.k]
        n = g.rows.shape[0]
        out: dict[str, list] = {}
        for f in plan.fields:
            cols = g.mat[:, f.offset : f.offset + f.fixed]
            if f.kind == "int":
                out[f.name] = np.ascontiguousarray(cols).view(f.dtype).reshape(n).tolist()
            elif f.kind == "chars":
                out[f.name] = _texts(cols)
            elif f.kind == "ints":
                values = np.ascontiguousarray(cols).view(f.dtype)
                out[f.name] = values.reshape(n, *f.dims).tolist()
            elif f.kind == "str":
                start, length = _data_loc(g, f)
                out[f.name] = _split_texts(*_concat(g, start, length), length)
            else:  # seq
                start, length = _data_loc(g, f)
                count = length // f.size
                flat, _ = _concat(g, start, count * f.size)
                values = flat.view(f.dtype).tolist()
                ends = np.cumsum(count).tolist()
                out[f.name] = [values[e - c : e] for e, c in zip(ends, count.tolist(), strict=True)]
        return out

    def render(self, batch: EventBatch, line) -> list[str]:
        """Each event as ``line(header columns, i, event name, fields)``,
        in time order."""
        n = len(batch)
        h = batch.header
        cols = {
            "time": h["time"].tolist(),
            "cpu": h["cpu"].tolist(),
            "pid": h["pid"].astype(np.int64).tolist(),
            "tid": h["tid"].astype(np.int64).tolist(),
            "comm": _texts(np.ascontiguousarray(h["comm"]).view(np.uint8).reshape(n, 16)),
        }
        lines = [""] * n
        for g in self._groups(batch):
            name = self.events[g.k].name
            items = list(self.decode(g).items())
            if not self.JSON:
                shown = {f.name: f for f in self.plans[g.k].fields if f.hex or f.words}
                items = [(f, _shown(shown[f], c) if f in shown else c) for f, c in items]
            for j, i in enumerate(g.rows.tolist()):
                lines[i] = line(cols, i, name, {f: c[j] for f, c in items})
        return [lines[i] for i in np.argsort(h["time"], kind="stable").tolist()]

    def write(self, batch: EventBatch) -> None:
        if len(batch) == 0:
            return
        text = self.lines(batch)
        if text is None:
            self.file.write("".join(f"{line}\n" for line in self.render(batch, _json_line)))
        else:
            self._put(text)
        self.count += len(batch)

    def close(self, counts: dict[str, int] | None = None) -> None:
        if self.closed:
            return
        if counts is not None:
            self.file.write(json.dumps({"summary": dict(counts)}) + "\n")
        self.file.close()
        self.closed = True


def _shown(f: _Field, values: list) -> list:
    """An int field's values as a text line shows them."""
    if f.words is not None:
        return [f.words(v) for v in values]
    return [f"{v:#x}" for v in values]


# Field kinds of the compiled text lines (_Field.kind; _T_HEX: a pointer
# in a text line).
_T_INT, _T_CHARS, _T_INTS, _T_STR, _T_HEX, _T_WORDS = 0, 1, 2, 3, 4, 5
_T_OF = {"int": _T_INT, "chars": _T_CHARS, "ints": _T_INTS, "str": _T_STR}
_INT_TEXT = 20  # the digits of a 64-bit value and its sign


@aot.njit(cache=True, _nrt=False)
def _utf8_valid(row, s, e):
    """Is ``row[s:e]`` valid UTF-8 as Python's strict decoder judges it (no
    overlong forms, surrogates or code points past U+10FFFF)?"""
    i = s
    while i < e:
        c = row[i]
        if c < 0x80:
            i += 1
            continue
        if 0xC2 <= c <= 0xDF:
            n, lo, hi = 1, 0x80, 0xBF
        elif c == 0xE0:
            n, lo, hi = 2, 0xA0, 0xBF
        elif c == 0xED:
            n, lo, hi = 2, 0x80, 0x9F
        elif 0xE1 <= c <= 0xEF:
            n, lo, hi = 2, 0x80, 0xBF
        elif c == 0xF0:
            n, lo, hi = 3, 0x90, 0xBF
        elif c == 0xF4:
            n, lo, hi = 3, 0x80, 0x8F
        elif 0xF1 <= c <= 0xF3:
            n, lo, hi = 3, 0x80, 0xBF
        else:
            return False
        if i + n >= e or not (lo <= row[i + 1] <= hi):
            return False
        for k in range(2, n + 1):
            if not (0x80 <= row[i + k] <= 0xBF):
                return False
        i += n + 1
    return True


@aot.njit(cache=True, _nrt=False)
def _field_lines(mat, sizes, f_kind, f_off, f_size, f_signed, f_base, f_count, tab, tab_lens,
                 json, w_idx, w_tab, w_lens, out, starts, lens):  # fmt: skip
    """Each record's ``name=value ...`` (its fields as TextOutput writes
    them; ``json``: ``"name": value, ...`` as JsonLinesOutput's encoder
    writes them) into ``out``: row ``j`` at ``starts[j]``, ``lens[j]``
    bytes.  ``tab`` rows: each field's ``name=`` (row ``f``), then for an
    integer array the text before each element and after the last
    (Python's list repr: ``[[1, 2], [3, 4]]``), from row ``f_base[f]``.
    A field printed as words is row ``w_idx[j, f_base[f]]`` of ``w_tab``.
    Returns the bytes written, or -1 - j when record ``j`` holds a string
    that is not valid UTF-8 (Python writes the batch then)."""
    p = 0
    for j in range(mat.shape[0]):
        row = mat[j]
        starts[j] = p
        for f in range(f_kind.shape[0]):
            if f:
                if json:
                    out[p] = 44
                    p += 1
                out[p] = 32
                p += 1
            p = put_row(out, p, tab, tab_lens, f)
            k, off, size, signed = f_kind[f], f_off[f], f_size[f], f_signed[f]
            if k == _T_INT:
                v = read_int(row, off, size, signed)
                p = put_signed(out, p, np.int64(v)) if signed else put_dec(out, p, v)
            elif k == _T_WORDS:
                p = put_row(out, p, w_tab, w_lens, w_idx[j, f_base[f]])
            elif k == _T_HEX:
                out[p] = 48  # 0x
                out[p + 1] = 120
                p = put_hex(out, p + 2, read_int(row, off, size, False), 0)
            elif k == _T_INTS:
                base, count = f_base[f], f_count[f]
                for e in range(count):
                    p = put_row(out, p, tab, tab_lens, base + e)
                    v = read_int(row, off + e * size, size, signed)
                    p = put_signed(out, p, np.int64(v)) if signed else put_dec(out, p, v)
                p = put_row(out, p, tab, tab_lens, base + count)
            else:
                if k == _T_CHARS:
                    s, e = off, off + size
                else:  # a __data_loc string, cut to the record
                    w = read_int(row, off, 4, False)
                    s = np.int64(w & np.uint64(0xFFFF))
                    e = min(s + np.int64(w >> np.uint64(16)), sizes[j])
                    if e <= s:
                        s = e = 0
                n = s
                while n < e and row[n] != 0:
                    n += 1
                if not _utf8_valid(row, s, n):
                    return -1 - j
                if json:
                    p = _put_json_string(out, p, row, s, n)
                else:
                    for b in range(s, n):
                        out[p] = row[b]
                        p += 1
        lens[j] = p - starts[j]
    return p


@aot.njit(cache=True, _nrt=False)
def _put_json_string(out, p, row, s, e):
    """``row[s:e]`` (valid UTF-8) as a JSON string, escaped as Python's
    encoder escapes it without ``ensure_ascii``: quote, backslash, and the
    control characters (``\\n``, ``\\r``, ``\\t``, ``\\b``, ``\\f``, else
    ``\\u00xx``)."""
    out[p] = 34
    p += 1
    for b in range(s, e):
        c = row[b]
        if c == 34 or c == 92:
            out[p], out[p + 1] = 92, c
            p += 2
        elif c >= 0x20:
            out[p] = c
            p += 1
        else:
            out[p] = 92
            if c == 10:
                out[p + 1] = 110
            elif c == 13:
                out[p + 1] = 114
            elif c == 9:
                out[p + 1] = 116
            elif c == 8:
                out[p + 1] = 98
            elif c == 12:
                out[p + 1] = 102
            else:
                out[p + 1], out[p + 2], out[p + 3], out[p + 4] = 117, 48, 48, 48 + (c >> 4)
                low = c & 15
                out[p + 5] = 48 + low if low < 10 else 87 + low
                p += 4
            p += 2
    out[p] = 34
    return p + 1


def _list_template(dims: tuple[int, ...]) -> list[str]:
    """The text before each element of an integer array of ``dims``, and
    after the last, as Python writes the nested list."""
    parts: list[str] = []
    cur = ""

    def nest(level: int) -> None:
        nonlocal cur
        cur += "["
        for i in range(dims[level]):
            if i:
                cur += ", "
            if level == len(dims) - 1:
                parts.append(cur)
                cur = ""
            else:
                nest(level + 1)
        cur += "]"

    nest(0)
    return [*parts, cur]


@dataclass
class _LinePlan:
    """An event type's fields for :func:`_field_lines` (``json``: as JSON
    members): its arrays and the most bytes a record's fields take, its
    ``__data_loc`` strings aside (None: a field it cannot write)."""

    arrays: tuple | None
    most: int
    strings: int = 0  # __data_loc strings: each at most the record's width
    words: list[_Field] = field(default_factory=list)  # printed as words (w_idx's columns)

    @classmethod
    def of(cls, plan: _Plan, json: bool = False) -> _LinePlan:
        fields = plan.fields
        if any(f.kind not in _T_OF for f in fields):
            return cls(None, 0)
        rows = [f"{_JSON.encode(f.name)}: " if json else f"{f.name}=" for f in fields]
        base = np.zeros(len(fields), np.int64)
        count = np.zeros(len(fields), np.int64)
        most = 1
        for i, f in enumerate(fields):
            most += len(rows[i].encode()) + 2
            if f.kind == "ints":
                tmpl = _list_template(f.dims)
                base[i], count[i] = len(rows), len(tmpl) - 1
                rows += tmpl
                most += sum(len(t) for t in tmpl) + _INT_TEXT * (len(tmpl) - 1)
            elif f.kind == "int":
                most += _INT_TEXT
            elif f.kind == "chars":
                most += _JSON_BYTE * f.size + 2
        tab, lens = string_list_table(rows)
        words = [] if json else [f for f in fields if f.words is not None]
        for i, f in enumerate(fields):
            if f in words:
                base[i] = words.index(f)
        kinds = [
            _T_WORDS if f in words else _T_HEX if f.hex and not json else _T_OF[f.kind]
            for f in fields
        ]
        arrays = (
            np.array(kinds, np.int64),
            np.array([f.offset for f in fields], np.int64),
            np.array([f.size for f in fields], np.int64),
            np.array([f.signed for f in fields], np.bool_),
            base, count, tab, lens, json,
        )  # fmt: skip
        return cls(arrays, most, sum(f.kind == "str" for f in fields), words)


_JSON_BYTE = 6  # the most a string's byte takes in JSON (\u001f)


@aot.njit(cache=True, _nrt=False)
def _event_lines(order, comm, comm_tab, comm_lens, pid, tid, cpu, time, kind, name_tab,
                 name_lens, fields, f_start, f_len, out):  # fmt: skip
    """The events' lines in ``order``: ``comm pid/tid [cpu] seconds:
    system:event: fields``, as ``perf script`` prints tracepoints (the
    comm right-aligned to 16, the pid to 7, the tid left-aligned to 7);
    returns the bytes written."""
    p = 0
    for r in range(order.shape[0]):
        i = order[r]
        p = put_row(out, p, comm_tab, comm_lens, comm[i])
        out[p] = 32
        p = put_spaces(out, p + 1, 7 - digit_count(pid[i], 10))
        p = put_dec(out, p, pid[i])
        out[p] = 47
        start = p + 1
        p = pad_to(out, put_dec(out, start, tid[i]), start, 7)
        out[p], out[p + 1] = 32, 91
        p += 2
        for _ in range(3 - digit_count(cpu[i], 10)):
            out[p] = 48
            p += 1
        p = put_dec(out, p, cpu[i])
        out[p], out[p + 1] = 93, 32
        p = put_seconds(out, p + 2, time[i], 0)
        out[p], out[p + 1] = 58, 32
        p = put_row(out, p + 2, name_tab, name_lens, kind[i])
        s = f_start[i]
        for b in range(f_len[i]):
            out[p + b] = fields[s + b]
        p += f_len[i]
        out[p] = 10
        p += 1
    return p


@aot.njit(cache=True, _nrt=False)
def _json_lines(order, comm, comm_tab, comm_lens, pid, tid, cpu, time, kind, name_tab, name_lens,
                fields, f_start, f_len, out):  # fmt: skip
    """The events' JSON objects in ``order``, a line each, as
    JsonLinesOutput's encoder writes them (``name_tab``, ``comm_tab``: the
    names and commands already as JSON strings); returns the bytes
    written."""
    p = 0
    for r in range(order.shape[0]):
        i = order[r]
        p = put_text(out, p, '{"time": ')
        p = put_dec(out, p, time[i])
        p = put_text(out, p, ', "cpu": ')
        p = put_dec(out, p, cpu[i])
        p = put_text(out, p, ', "event": ')
        p = put_row(out, p, name_tab, name_lens, kind[i])
        p = put_text(out, p, ', "pid": ')
        p = put_dec(out, p, pid[i])
        p = put_text(out, p, ', "tid": ')
        p = put_dec(out, p, tid[i])
        p = put_text(out, p, ', "comm": ')
        p = put_row(out, p, comm_tab, comm_lens, comm[i])
        p = put_text(out, p, ', "fields": {')
        s = f_start[i]
        for b in range(f_len[i]):
            out[p + b] = fields[s + b]
        p += f_len[i]
        p = put_text(out, p, "}}\n")
    return p


class TextOutput(JsonLinesOutput):
    """A line per event on a text stream, as ``perf script`` prints
    tracepoints: ``comm pid/tid [cpu] seconds: system:event: name=value ...``
    (written by compiled loops, a batch at a time)."""

    JSON = False

    def __init__(self, stream: TextIO, events: Sequence[TracedEvent]) -> None:
        TraceOutput.__init__(self, "<stdout>", events)
        self._line_setup()
        self.file = stream

    def write(self, batch: EventBatch) -> None:
        if len(batch) == 0:
            return
        text = self.lines(batch)
        if text is None:
            self.file.write("".join(f"{line}\n" for line in self.render(batch, _text_line)))
        else:
            self._put(text)
        self.file.flush()
        self.count += len(batch)

    def close(self, counts: dict[str, int] | None = None) -> None:
        self.closed = True


def _json_line(c: dict, i: int, name: str, fields: dict) -> str:
    """An event's JSON object from its decoded fields (the writer for
    events the compiled one does not take)."""
    return _JSON.encode({"time": c["time"][i], "cpu": c["cpu"][i], "event": name,
                         "pid": c["pid"][i], "tid": c["tid"][i], "comm": c["comm"][i],
                         "fields": fields})  # fmt: skip


def _text_line(c: dict, i: int, name: str, fields: dict) -> str:
    """An event's line from its decoded fields (the writer for events the
    compiled one does not take)."""
    text = " ".join(f"{f}={v}" for f, v in fields.items())
    t = c["time"][i]
    return (f"{c['comm'][i]:>16} {c['pid'][i]:>7}/{c['tid'][i]:<7} [{c['cpu'][i]:03d}] "
            f"{t // 1_000_000_000}.{t % 1_000_000_000:09d}: {name}: {text}")  # fmt: skip


# -- perf.data -------------------------------------------------------------------------------

_TRACING_MAGIC = b"\x17\x08\x44tracing"
_TRACING_VERSION = b"0.6"
# The usual headers (x86-64, 4 KiB pages), for when tracefs cannot be read.
_HEADER_PAGE = (
    "\tfield: u64 timestamp;\toffset:0;\tsize:8;\tsigned:0;\n"
    "\tfield: local_t commit;\toffset:8;\tsize:8;\tsigned:1;\n"
    "\tfield: int overwrite;\toffset:8;\tsize:1;\tsigned:1;\n"
    "\tfield: char data;\toffset:16;\tsize:4080;\tsigned:0;\n"
)
_HEADER_EVENT = (
    "# compressed entry header\n\ttype_len    :    5 bits\n\ttime_delta  :   27 bits\n"
    "\tarray       :   32 bits\n\n\tpadding     : type == 29\n\ttime_extend : type == 30\n"
    "\ttime_stamp : type == 31\n\tdata max type_len  == 28\n"
)


def _tracefs_header(name: str, default: str) -> str:
    for root in _TRACEFS:
        try:
            return Path(root, "events", name).read_text()
        except OSError:
            continue
    return default


def build_tracing_data(
    events: Sequence[TracedEvent],
    *,
    header_page: str | None = None,
    header_event: str | None = None,
    page_size: int | None = None,
    long_size: int = 8,
) -> bytes:
    """perf's tracing data (TRACING_DATA feature) for ``events``, laid out
    as tools/perf/util/trace-event-info.c writes it and trace-event-read.c
    reads it: magic, version "0.6", endianness, long size, page size,
    ``header_page`` and ``header_event`` (from tracefs by default), no
    ftrace formats, the events' ``format`` files grouped by system, then
    empty kallsyms, printk formats and saved cmdlines."""
    page = _tracefs_header("header_page", _HEADER_PAGE) if header_page is None else header_page
    event = _tracefs_header("header_event", _HEADER_EVENT) if header_event is None else header_event
    out = bytearray(_TRACING_MAGIC + _TRACING_VERSION + b"\0")
    out += bytes([0, long_size])  # little endian
    out += struct.pack("<I", page_size or os.sysconf("SC_PAGE_SIZE"))
    for tag, text in ((b"header_page\0", page), (b"header_event\0", event)):
        raw = text.encode()
        out += tag + struct.pack("<Q", len(raw)) + raw
    out += struct.pack("<I", 0)  # ftrace (function tracer) formats
    systems: dict[str, dict[str, bytes]] = {}
    for e in events:
        system, _, name = e.name.partition(":")
        systems.setdefault(system, {}).setdefault(name, e.format_text.encode())
    out += struct.pack("<I", len(systems))
    for system, formats in systems.items():
        out += system.encode() + b"\0" + struct.pack("<I", len(formats))
        for text in formats.values():
            out += struct.pack("<Q", len(text)) + text
    out += struct.pack("<I", 0)  # kallsyms
    out += struct.pack("<I", 0)  # printk formats
    out += struct.pack("<Q", 0)  # saved cmdlines
    return bytes(out)


_SAMPLE_TYPE = (
    SampleType.IDENTIFIER | SampleType.TID | SampleType.TIME | SampleType.CPU
    | SampleType.PERIOD | SampleType.RAW
)  # fmt: skip
# A SAMPLE of _SAMPLE_TYPE up to the raw data.
_SAMPLE_HEAD = sample_dtype(_SAMPLE_TYPE)
assert _SAMPLE_HEAD.itemsize == 52
_MISC_KERNEL = 1  # PERF_RECORD_MISC_KERNEL: tracepoints fire in the kernel


class PerfDataOutput(TraceOutput):
    """perf.data with one tracepoint event per type (see the module doc)."""

    def __init__(self, path: str, events: Sequence[TracedEvent], cmdline: list[str]) -> None:
        super().__init__(path, events)
        try:
            self.writer = PerfDataWriter(path, cmdline=list(cmdline) or ["hwtrace"], **host_env())
        except OSError as e:
            raise OutputError(f"{path}: cannot write: {e.strerror}") from None
        for k, e in enumerate(self.events):
            attr = PerfEventAttr(
                type=PerfType.TRACEPOINT, config=e.tracepoint_id, sample_period=1,
                sample_type=int(_SAMPLE_TYPE), sample_id_all=1, use_clockid=1,
                clockid=CLOCK_MONOTONIC, disabled=1, inherit=1,
            )  # fmt: skip
            if k == 0:  # the event the sideband (COMM) belongs to, as perf record's first
                attr.comm = attr.task = attr.comm_exec = 1
            self.writer.add_attr(attr, [k + 1], e.name)
        self.writer.set_feature(Feature.TRACING_DATA, build_tracing_data(self.events))
        self.writer.set_monotonic_clock()
        self.writer.finished_init()
        # tid -> the times of its COMM records and the names they gave
        self._comms: dict[int, tuple[list[int], list[bytes]]] = {}
        self._last = 0  # the latest time written
        self._round_max: int | None = None  # the latest time at the last FINISHED_ROUND

    def _comm_records(self, batch: EventBatch) -> None:
        """COMM records naming each thread at its first event with each new
        name: where the names given so far (at any time: batches of several
        sessions interleave in time) do not already say that name then.
        Thread 0, the idle task of every CPU (``swapper/N``), is left to
        perf ("swapper")."""
        h = batch.header
        tid = h["tid"].astype(np.int64)
        comm = h["comm"]
        stamp = h["time"].astype(np.int64)
        order = np.lexsort((stamp, tid))  # by thread, then time
        t, c = tid[order], comm[order]
        start = np.ones(t.shape[0], np.bool_)  # a thread's first event, or a new name
        start[1:] = (t[1:] != t[:-1]) | (c[1:] != c[:-1])
        rows = order[start & (t != 0)]
        for i in rows[np.argsort(stamp[rows], kind="stable")].tolist():
            tid_i, name, at = int(tid[i]), bytes(comm[i]), int(stamp[i])
            times, names = self._comms.setdefault(tid_i, ([], []))
            k = bisect.bisect_right(times, at)
            if k and names[k - 1] == name:
                continue
            times.insert(k, at)
            names.insert(k, name)
            pid = int(h["pid"][i])
            sid = SampleId(pid=pid, tid=tid_i, time=at, cpu=int(h["cpu"][i]))
            text = name.split(b"\0", 1)[0].decode("utf-8", "replace")
            self.writer.add_record(Comm(pid, tid_i, text), sample_id=sid)

    def write(self, batch: EventBatch) -> None:
        n = len(batch)
        if n == 0:
            return
        groups = self._groups(batch)
        h = batch.header
        order = np.argsort(h["time"], kind="stable")
        self._comm_records(batch)
        kinds = np.empty(n, np.int64)
        raw_size = np.empty(n, np.int64)
        for g in groups:
            kinds[g.rows] = g.k
            raw_size[g.rows] = g.sizes
        padded = (raw_size + 4 + 7) // 8 * 8 - 4  # perf pads RAW so that 4 + size is 8s
        head = np.zeros(n, _SAMPLE_HEAD)
        head["type"] = RecordType.SAMPLE
        head["misc"] = _MISC_KERNEL
        head["size"] = _SAMPLE_HEAD.itemsize + padded
        head["identifier"] = kinds + 1
        head["pid"] = h["pid"]
        head["tid"] = h["tid"]
        head["time"] = h["time"]
        head["cpu"] = h["cpu"]
        head["period"] = 1
        head["raw_size"] = padded
        # Records are whole u64s: each type's as a matrix of words, placed
        # in time order.
        hs = _SAMPLE_HEAD.itemsize
        words = (hs + padded) // 8
        lens = words[order]
        at = np.empty(n, np.int64)  # each event's record, in words from the start
        at[order] = np.cumsum(lens) - lens
        out = np.zeros(int(lens.sum()), np.uint64)
        for g in groups:
            m = g.rows.shape[0]
            w = int(words[g.rows].max())
            rec = np.zeros((m, 8 * w), np.uint8)
            rec[:, :hs] = head[g.rows].view(np.uint8).reshape(m, hs)
            keep = min(g.width, 8 * w - hs)
            rec[:, hs : hs + keep] = g.mat[:, :keep]  # zero beyond each record
            _copy_segments(out, at[g.rows], rec.view(np.uint64).reshape(-1), np.arange(m) * w,
                           words[g.rows])  # fmt: skip
        self.writer.add_bytes(out.tobytes())
        self._last = max(self._last, int(h["time"].max()))
        # FINISHED_ROUND lets perf sort and deliver the events up to the
        # latest time at the round before; later events earlier than that
        # are "out of order".  A batch of one session follows the one
        # before in time, but batches of several sessions interleave: a
        # round goes in only when this batch starts after the last round's
        # latest time (every session has got past it, as far as is known).
        if self._round_max is None or int(h["time"].min()) >= self._round_max:
            self.writer.finished_round()
            self._round_max = self._last
        self.count += n

    def close(self, counts: dict[str, int] | None = None) -> None:
        if self.closed:
            return
        lost = int((counts or {}).get("lost", 0))
        if lost:
            sid = SampleId(pid=0, tid=0, time=self._last, cpu=0)
            self.writer.add_record(LostSamples(lost), sample_id=sid)
        self.writer.close()
        self.closed = True


# -- CTF -------------------------------------------------------------------------------------

# Event header (id, timestamp) and the stream's event context (pid, tid, procname).
_EVENT_HEAD = np.dtype(
    [("id", "<u4"), ("timestamp", "<u8"), ("pid", "<i4"), ("tid", "<i4"), ("procname", "S16")]
)
_TSDL_KEYWORDS = {"_Bool", "_Complex", "_Imaginary"}


def _ctf_int(size: int, signed: bool, extra: str = "", base: int = 10) -> str:
    sign = "true" if signed else "false"
    return (
        f"integer {{ size = {8 * size}; align = 8; signed = {sign}; byte_order = le; "
        f"base = {base};{extra} }}"
    )


def _ctf_name(name: str) -> str:
    # LTTng's convention: a leading underscore, which readers drop, keeps
    # field names off TSDL's keywords.
    out = f"_{name}"
    return f"_{out}" if out in _TSDL_KEYWORDS else out


def _ctf_fields(plan: _Plan) -> list[str]:
    lines = []
    for f in plan.fields:
        name = _ctf_name(f.name)
        if f.kind == "int":
            # (a pointer in hex, as LTTng's ctf_integer_hex)
            lines.append(f"{_ctf_int(f.size, f.signed, base=16 if f.hex else 10)} {name};")
        elif f.kind == "chars":
            lines.append(f"{_ctf_int(1, False, ' encoding = UTF8;')} {name}[{f.size}];")
        elif f.kind == "ints":
            dims = "".join(f"[{d}]" for d in f.dims)
            lines.append(f"{_ctf_int(f.size, f.signed)} {name}{dims};")
        elif f.kind == "str":
            lines.append(f"string {{ encoding = UTF8; }} {name};")
        else:
            length = f"_{name}_length"
            lines.append(f"{_ctf_int(4, False)} {length};")
            lines.append(f"{_ctf_int(f.size, f.signed)} {name}[{length}];")
    return lines


@dataclass(frozen=True)
class _Step:
    """A piece of a CTF payload: ``copy`` (``length`` record bytes at
    ``offset``), ``str`` (a data_loc string and its NUL) or ``seq`` (a u32
    count and a data_loc array of ``size``-byte integers)."""

    kind: str
    offset: int
    length: int = 0
    size: int = 0


def _steps(plan: _Plan) -> list[_Step]:
    steps: list[_Step] = []
    for f in plan.fields:
        if f.kind in ("int", "chars", "ints"):
            last = steps[-1] if steps else None
            if last is not None and last.kind == "copy" and last.offset + last.length == f.offset:
                steps[-1] = _Step("copy", last.offset, last.length + f.fixed)
            else:
                steps.append(_Step("copy", f.offset, f.fixed))
        else:
            steps.append(_Step(f.kind, f.offset, 0, f.size))
    return steps


class CtfOutput(TraceOutput):
    """A CTF 1.8 trace in a directory (see the module doc)."""

    def __init__(self, path: str, events: Sequence[TracedEvent], cmdline: list[str]) -> None:
        super().__init__(path, events)
        try:
            os.makedirs(path, exist_ok=True)
            if os.listdir(path):
                raise OutputError(
                    f"{path}: directory is not empty (a CTF trace is written to a new or "
                    "empty directory)"
                )
        except OSError as e:
            raise OutputError(f"{path}: cannot create the trace directory: {e.strerror}") from None
        self.uuid = _uuid.uuid4()
        self.steps = [_steps(p) for p in self.plans]
        # A stream per session (the batches' event list) and CPU, each in
        # time order: channelS_CPU, as LTTng names a channel's streams.
        self._sessions: list[list[TracedEvent]] = []
        self._files: dict[tuple[int, int], object] = {}
        self._last: dict[tuple[int, int], int] = {}  # per stream: the latest timestamp
        self._write_metadata(cmdline)

    def _write_metadata(self, cmdline: list[str]) -> None:
        uname = platform.uname()
        # The clock's offset makes its values times of day, as LTTng's do.
        offset = time.time_ns() - time.monotonic_ns()
        env = {
            "hostname": uname.node, "domain": "kernel", "sysname": uname.system,
            "kernel_release": uname.release, "kernel_version": uname.version,
            "tracer_name": "hwtrace", "cmdline": " ".join(cmdline),
        }  # fmt: skip
        u32 = _ctf_int(4, False)
        u64 = _ctf_int(8, False)
        # The stream's event context, as _EVENT_HEAD lays it out.
        context = [
            f"{_ctf_int(4, True)} _pid;",
            f"{_ctf_int(4, True)} _tid;",
            f"{_ctf_int(1, False, ' encoding = UTF8;')} _procname[16];",
        ]
        lines = [
            *tsdl_preamble(self.uuid, env, u32=u32, u8=_ctf_int(1, False), clock_offset_ns=offset),
            "typealias integer { size = 64; align = 8; signed = false; byte_order = le; "
            "base = 10; map = clock.monotonic.value; } := clock_monotonic_t;",
            "",
            *tsdl_stream_block("clock_monotonic_t", u32, u64, context),
            "",
        ]
        for k, plan in enumerate(self.plans):
            lines += ["event {", f"\tname = {tsdl_string(plan.event.name)};", f"\tid = {k};",
                      "\tstream_id = 0;"]  # fmt: skip
            body = _ctf_fields(plan)
            if body:
                lines += ["\tfields := struct {", *[f"\t\t{b}" for b in body], "\t};"]
            lines += ["};", ""]
        try:
            with open(os.path.join(self.path, "metadata"), "w") as f:
                f.write("\n".join(lines))
        except OSError as e:
            raise OutputError(f"{self.path}: cannot write metadata: {e.strerror}") from None

    def _payload(self, g: _Group) -> list[tuple[_Step, np.ndarray, np.ndarray, np.ndarray]]:
        """Per step of the group's type: each event's bytes there, where
        they come from in the group's matrix (flat) and how many."""
        n = g.rows.shape[0]
        base = np.arange(n, dtype=np.int64) * g.width
        out = []
        for s in self.steps[g.k]:
            if s.kind == "copy":
                length = np.full(n, s.length, np.int64)
                out.append((s, length, base + s.offset, length))
                continue
            f = _Field("", s.kind, s.offset, s.size)
            start, length = _data_loc(g, f)
            if s.kind == "str":
                flat, offs = _concat(g, start, length)
                length = _strlen(flat, offs, length)
                out.append((s, length + 1, base + start, length))
            else:
                length = length // s.size * s.size
                out.append((s, length + 4, base + start, length))
        return out

    def write(self, batch: EventBatch) -> None:
        n = len(batch)
        if n == 0:
            return
        h = batch.header
        groups = self._groups(batch)
        pieces = {g.k: self._payload(g) for g in groups}
        kinds = np.empty(n, np.int64)
        size = np.full(n, _EVENT_HEAD.itemsize, np.int64)
        for g in groups:
            kinds[g.rows] = g.k
            for _, length, _, _ in pieces[g.k]:
                size[g.rows] += length
        session = next((i for i, s in enumerate(self._sessions) if s is batch.events), None)
        if session is None:
            session = len(self._sessions)
            self._sessions.append(batch.events)
        cpu = h["cpu"].astype(np.int64)
        stamp = h["time"].astype(np.int64)
        order = np.lexsort((stamp, cpu))  # by CPU, then time
        cpus, first = np.unique(cpu[order], return_index=True)
        bounds = [*first.tolist(), n]
        # Each CPU's packet: its header, then its events.
        total = int(size.sum()) + PACKET_HEAD.itemsize * cpus.shape[0]
        at = np.empty(n, np.int64)
        packet_at = []
        pos = 0
        for j in range(cpus.shape[0]):
            rows = order[bounds[j] : bounds[j + 1]]
            packet_at.append(pos)
            lens = size[rows]
            at[rows] = pos + PACKET_HEAD.itemsize + np.cumsum(lens) - lens
            pos += PACKET_HEAD.itemsize + int(lens.sum())
        buf = np.zeros(total, np.uint8)
        # A stream's times never go back (the reader requires it; a
        # session's events on a CPU come in time order anyway).
        for j, c in enumerate(cpus.tolist()):
            rows = order[bounds[j] : bounds[j + 1]]
            stamp[rows] = np.maximum(stamp[rows], self._last.get((session, c), 0))
        head = np.zeros(n, _EVENT_HEAD)
        head["id"] = kinds
        head["timestamp"] = stamp
        head["pid"] = h["pid"].astype(np.int64)
        head["tid"] = h["tid"].astype(np.int64)
        head["procname"] = h["comm"]
        hs = _EVENT_HEAD.itemsize
        _copy_segments(buf, at, head.view(np.uint8), np.arange(n) * hs, np.full(n, hs))
        for g in groups:
            dest = at[g.rows] + hs
            src = g.mat.reshape(-1)
            for s, length, start, count in pieces[g.k]:
                if s.kind == "seq":
                    c = (count // s.size).astype("<u4").view(np.uint8)
                    m = g.rows.shape[0]
                    _copy_segments(buf, dest, c, np.arange(m) * 4, np.full(m, 4))
                    _copy_segments(buf, dest + 4, src, start, count)
                else:
                    _copy_segments(buf, dest, src, start, count)  # a string's NUL stays 0
                dest = dest + length
        for j, c in enumerate(cpus.tolist()):
            rows = order[bounds[j] : bounds[j + 1]]
            lo = packet_at[j]
            hi = packet_at[j + 1] if j + 1 < len(packet_at) else total
            self._packet_header(buf[lo:hi], c, int(stamp[rows[0]]), int(stamp[rows[-1]]), 0)
            self._stream((session, c)).write(buf[lo:hi].tobytes())  # type: ignore[attr-defined]
            self._last[(session, c)] = int(stamp[rows[-1]])
        self.count += n

    def _packet_header(self, packet: np.ndarray, cpu: int, begin: int, end: int,
                       discarded: int) -> None:  # fmt: skip
        size = packet.shape[0]
        packet[: PACKET_HEAD.itemsize] = packet_head(
            self.uuid, cpu, begin, end, size, size, discarded
        )

    def _stream(self, key: tuple[int, int]):
        f = self._files.get(key)
        if f is None:
            try:
                f = open(os.path.join(self.path, f"channel{key[0]}_{key[1]}"), "wb")
            except OSError as e:
                raise OutputError(f"{self.path}: cannot write a stream: {e.strerror}") from None
            self._files[key] = f
        return f

    def close(self, counts: dict[str, int] | None = None) -> None:
        if self.closed:
            return
        lost = int((counts or {}).get("lost", 0))
        if lost and self._files:
            # An empty packet that says the events were lost (CTF counts
            # discarded events per stream; the session counts them in all).
            key = min(self._files)
            packet = np.zeros(PACKET_HEAD.itemsize, np.uint8)
            last = self._last.get(key, 0)
            self._packet_header(packet, key[1], last, last, lost)
            self._stream(key).write(packet.tobytes())  # type: ignore[attr-defined]
        for f in self._files.values():
            f.close()  # type: ignore[attr-defined]
        self._files.clear()
        self.closed = True


# -- choosing ----------------------------------------------------------------------------------


def open_trace_output(path: str, events: list[TracedEvent], *, cmdline: list[str]) -> TraceOutput:
    """JSON lines for ``*.jsonl`` / ``*.json``; perf.data for ``*.data``
    (``perf.data`` included); otherwise a CTF trace in directory ``path``.
    Raises :class:`OutputError` for a path that cannot be used."""
    if not path:
        raise OutputError("no output path")
    p = Path(path)
    bare = path.rstrip(os.sep)
    if bare.endswith((".jsonl", ".json")):
        kind = "JSON lines"
    elif bare.endswith(".data") or p.name == "perf.data":
        kind = "perf.data"
    else:
        kind = "CTF"
    if kind != "CTF":
        if p.is_dir() or path.endswith(os.sep):
            raise OutputError(f"{path}: is a directory ({kind} output is a file)")
        parent = p.parent
        if not parent.is_dir():
            raise OutputError(f"{path}: no directory {parent}")
        if kind == "JSON lines":
            return JsonLinesOutput(path, events)
        return PerfDataOutput(path, events, cmdline)
    if p.exists() and not p.is_dir():
        raise OutputError(
            f"{path}: exists and is not a directory (a CTF trace is a directory; name a "
            "file *.jsonl for JSON lines or *.data for perf.data)"
        )
    return CtfOutput(path, events, cmdline)


_WARM_FORMAT = """\
name: warm
ID: 1
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;
\tfield:unsigned char common_preempt_count;\toffset:3;\tsize:1;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:int value;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char name[8];\toffset:12;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] path;\toffset:20;\tsize:4;\tsigned:0;
\tfield:unsigned long args[2];\toffset:24;\tsize:16;\tsigned:0;

print fmt: "value=%d", REC->value
"""


def warm_text() -> None:
    """Compile the lines' loops (:class:`TextOutput`, :class:`JsonLinesOutput`) for the arrays a
    batch gives them, on one made-up event: ``hwtrace aot warm`` builds
    them into the native library."""
    import io

    from ..filter.sources import schema_from_tracefs

    e = TracedEvent("hwtrace:warm", schema_from_tracefs(_WARM_FORMAT), _WARM_FORMAT, 1)
    record = struct.pack("<HBBiI8sI2Q", 1, 0, 0, 1, 7, b"warm", (2 << 16) | 40, 1, 2) + b"/\0"
    header = np.zeros(1, HEADER_DTYPE)
    header["size"] = len(record)
    buf = np.frombuffer(bytes(HEADER_DTYPE.itemsize) + record, np.uint8).copy()
    batch = EventBatch([e], header, buf, np.array([HEADER_DTYPE.itemsize], np.int64),
                       np.array([len(record)], np.int64))  # fmt: skip
    TextOutput(io.StringIO(), [e]).write(batch)
    with JsonLinesOutput(os.devnull, [e]) as out:
        out.lines(batch)
