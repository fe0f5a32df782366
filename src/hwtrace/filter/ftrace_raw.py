"""ftrace's binary event formats: ``trace_pipe_raw`` buffers, perf's
TRACING_DATA, and the tracefs ``format`` files that say what each event id is.

``trace_pipe_raw`` (``/sys/kernel/tracing/per_cpu/cpuN/trace_pipe_raw``)
gives the ring buffer's pages as they are: a page header
(``events/header_page``: a u64 timestamp, the u64 ``commit`` word whose low
27 bits count the bytes of events in the page, then the events) and events
with the 32-bit headers ``events/header_event`` describes (``type_len`` in
the low 5 bits, ``time_delta`` in the high 27; ``type_len`` 1..28 is a data
event of ``4 * type_len`` bytes, 0 one whose length is in the next u32,
29 padding, 30 a time extend, 31 an absolute time stamp).  The page walk
(:func:`read_pages`) is a compiled loop: it gives each data event's offset
in the buffer, length, time and event id (``common_type``, the first u16 of
every record).

perf.data's TRACING_DATA feature embeds the same ``header_page``,
``header_event`` and the ``format`` files of the recorded events
(:func:`parse_tracing_data`).  :class:`Tracefs` finds an event id's format
in a tracefs directory (the live one by default).
"""

from __future__ import annotations

import os
import re
import struct
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from .. import aot
from .errors import FilterError

LIVE_TRACEFS = "/sys/kernel/tracing"

# -- page and event headers --------------------------------------------------------------

_HEADER_FIELD = re.compile(r"\s*field:\s*(?P<decl>[^;]*);\s*offset:(\d+);\s*size:(\d+);")


@dataclass(frozen=True)
class PageLayout:
    """Where a ring-buffer page keeps its timestamp, commit word and data
    (from ``events/header_page``); ``page_size`` is data offset + size."""

    timestamp_offset: int = 0
    commit_offset: int = 8
    commit_size: int = 8
    data_offset: int = 16
    data_size: int = 4080

    @property
    def page_size(self) -> int:
        return self.data_offset + self.data_size

    @classmethod
    def parse(cls, text: str, where: str = "header_page") -> PageLayout:
        fields: dict[str, tuple[int, int]] = {}
        for line in text.splitlines():
            m = _HEADER_FIELD.match(line)
            if m:
                name = m["decl"].split()[-1]
                fields[name] = (int(m[2]), int(m[3]))
        try:
            ts, commit, data = fields["timestamp"], fields["commit"], fields["data"]
        except KeyError as e:
            raise FilterError(f"no {e.args[0]!r} field: not a header_page", where=where) from None
        if commit[1] not in (4, 8) or data[1] <= 0:
            raise FilterError(f"unexpected commit size {commit[1]} or data size", where=where)
        # (the page walk reads the time stamp and the commit word of every
        # page before its data: both must lie in the page's header)
        for name, (offset, size) in (("timestamp", (ts[0], 8)), ("commit", commit)):
            if offset + size > data[0]:
                raise FilterError(f"{name} at offset {offset} ({size} bytes) is past the data "
                                  f"at offset {data[0]}", where=where)  # fmt: skip
        return cls(ts[0], commit[0], commit[1], data[0], data[1])


def _encoding(default: int, pattern: str) -> Any:
    """A field of :class:`EventHeader`: its value when ``header_event`` does
    not give it, and the pattern that reads it there."""
    return field(default=default, metadata={"pattern": pattern})


@dataclass(frozen=True)
class EventHeader:
    """The compressed event header's encoding (``events/header_event``)."""

    type_len_bits: int = _encoding(5, r"type_len\s*:\s*(\d+)\s*bits")
    time_delta_bits: int = _encoding(27, r"time_delta\s*:\s*(\d+)\s*bits")
    padding: int = _encoding(29, r"padding\s*:\s*type\s*==\s*(\d+)")
    time_extend: int = _encoding(30, r"time_extend\s*:\s*type\s*==\s*(\d+)")
    time_stamp: int = _encoding(31, r"time_stamp\s*:\s*type\s*==\s*(\d+)")
    data_max: int = _encoding(28, r"data max type_len\s*==\s*(\d+)")

    @classmethod
    def parse(cls, text: str, where: str = "header_event") -> EventHeader:
        given: dict[str, int] = {}
        for f in fields(cls):
            m = re.search(f.metadata["pattern"], text)
            if m:
                given[f.name] = int(m.group(1))
        h = cls(**given)
        if h.type_len_bits + h.time_delta_bits != 32:
            raise FilterError(
                f"type_len {h.type_len_bits} + time_delta {h.time_delta_bits} bits is not 32",
                where=where,
            )
        return h


# -- the page walk ----------------------------------------------------------------------

# Problems the walk reports (code -> message), each at a buffer offset.
BAD_COMMIT, BAD_LENGTH, BAD_TYPE, TRUNCATED_PAGE, SHORT_EVENT = 1, 2, 3, 4, 5
PROBLEMS = {
    BAD_COMMIT: "page commit size beyond the page",
    BAD_LENGTH: "event length beyond the page's committed data",
    BAD_TYPE: "unknown event header type",
    TRUNCATED_PAGE: "truncated page at the end of the file",
    SHORT_EVENT: "event shorter than its 2-byte event id",
}
_COMMIT_MASK = (1 << 27) - 1  # the rest of the word holds the missed-events flags
_MISSED_EVENTS = 1 << 31
_TS_MSB_SHIFT = 59  # an absolute time stamp keeps the low 59 bits


@aot.njit(cache=True)
def _walk(
    buf, page_size, ts_off, commit_off, commit_size, data_off, delta_bits,
    padding, extend, stamp, data_max,
    offsets, lengths, times, ids, problems,
):  # fmt: skip
    """Data events of every page of ``buf``; returns (events, problems,
    pages with missed events).  ``problems`` rows: (offset, code)."""
    n = 0
    nprob = 0
    missed = 0
    size = buf.shape[0]
    delta_mask = (1 << delta_bits) - 1
    page = 0
    while page < size:
        if page + data_off > size:
            problems[nprob, 0] = page
            problems[nprob, 1] = 4
            nprob += 1
            break
        ts = np.int64(0)
        for j in range(8):
            ts |= np.int64(buf[page + ts_off + j]) << (8 * j)
        word = np.int64(0)
        for j in range(commit_size):
            word |= np.int64(buf[page + commit_off + j]) << (8 * j)
        if word & _MISSED_EVENTS:
            missed += 1
        commit = word & _COMMIT_MASK
        end = page + data_off + commit
        if data_off + commit > page_size or end > size:
            problems[nprob, 0] = page + commit_off
            problems[nprob, 1] = 1 if data_off + commit > page_size else 4
            nprob += 1
            if nprob >= problems.shape[0]:
                break
            page += page_size
            continue
        p = page + data_off
        while p + 4 <= end:
            h = np.int64(buf[p]) | (np.int64(buf[p + 1]) << 8)
            h |= (np.int64(buf[p + 2]) << 16) | (np.int64(buf[p + 3]) << 24)
            tl = h & 31
            delta = (h >> (32 - delta_bits)) & delta_mask
            if tl == padding:
                if delta == 0:
                    break  # the rest of the page is empty
                if p + 8 > end:
                    break
                a = np.int64(buf[p + 4]) | (np.int64(buf[p + 5]) << 8)
                a |= (np.int64(buf[p + 6]) << 16) | (np.int64(buf[p + 7]) << 24)
                p += 4 + a  # a discarded event
                continue
            if tl == extend or tl == stamp:
                if p + 8 > end:
                    break
                a = np.int64(buf[p + 4]) | (np.int64(buf[p + 5]) << 8)
                a |= (np.int64(buf[p + 6]) << 16) | (np.int64(buf[p + 7]) << 24)
                v = (a << delta_bits) + delta
                if tl == extend:
                    ts += v
                else:
                    ts = ((ts >> _TS_MSB_SHIFT) << _TS_MSB_SHIFT) | v
                p += 8
                continue
            if tl > data_max:
                problems[nprob, 0] = p
                problems[nprob, 1] = 3
                nprob += 1
                break
            ts += delta
            if tl == 0:
                if p + 8 > end:
                    problems[nprob, 0] = p
                    problems[nprob, 1] = 2
                    nprob += 1
                    break
                a = np.int64(buf[p + 4]) | (np.int64(buf[p + 5]) << 8)
                a |= (np.int64(buf[p + 6]) << 16) | (np.int64(buf[p + 7]) << 24)
                start = p + 8
                length = a - 4
                nxt = p + 4 + ((a + 3) & ~3)
            else:
                start = p + 4
                length = tl * 4
                nxt = start + length
            if length < 0 or start + length > end:
                problems[nprob, 0] = p
                problems[nprob, 1] = 2
                nprob += 1
                break
            if length < 2:
                problems[nprob, 0] = p
                problems[nprob, 1] = 5
                nprob += 1
            else:
                offsets[n] = start
                lengths[n] = length
                times[n] = ts
                ids[n] = np.int64(buf[start]) | (np.int64(buf[start + 1]) << 8)
                n += 1
            p = nxt
            if nprob >= problems.shape[0]:
                break
        if nprob >= problems.shape[0]:
            break
        page += page_size
    return n, nprob, missed


@dataclass
class RawEvents:
    """Data events of one CPU's buffer: ``offsets`` into ``buf`` (the record,
    ``common_type`` first), ``lengths`` (bytes, padding included), ``times``
    (trace clock ns), ``ids`` (event ids); ``problems`` (offset, message)
    and the number of pages that lost events before them (``missed_pages``)."""

    buf: np.ndarray
    cpu: int
    offsets: np.ndarray
    lengths: np.ndarray
    times: np.ndarray
    ids: np.ndarray
    problems: list[tuple[int, str]] = field(default_factory=list)
    missed_pages: int = 0

    def __len__(self) -> int:
        return self.offsets.shape[0]


def read_pages(
    buf: np.ndarray,
    cpu: int = 0,
    layout: PageLayout | None = None,
    header: EventHeader | None = None,
) -> RawEvents:
    """Walk the ring-buffer pages of ``buf`` (a trace_pipe_raw copy)."""
    layout = layout or PageLayout()
    header = header or EventHeader()
    buf = np.asarray(buf, np.uint8)
    cap = max(buf.shape[0] // 8, 1)  # an event takes at least 8 bytes
    offsets = np.empty(cap, np.int64)
    lengths = np.empty(cap, np.int64)
    times = np.empty(cap, np.int64)
    ids = np.empty(cap, np.int64)
    problems = np.zeros((64, 2), np.int64)
    n, nprob, missed = _walk(
        buf, layout.page_size, layout.timestamp_offset, layout.commit_offset,
        layout.commit_size, layout.data_offset, header.time_delta_bits, header.padding,
        header.time_extend, header.time_stamp, header.data_max,
        offsets, lengths, times, ids, problems,
    )  # fmt: skip
    return RawEvents(
        buf,
        cpu,
        offsets[:n].copy(),
        lengths[:n].copy(),
        times[:n].copy(),
        ids[:n].copy(),
        [(int(o), PROBLEMS[int(c)]) for o, c in problems[:nprob]],
        int(missed),
    )


def read_trace_pipe_raw(fd: int, patience: int = 5) -> bytes:
    """Every page a non-blocking ``trace_pipe_raw`` descriptor gives (its
    tracing off by now).  A read may say "try again" with pages still
    there, so only ``patience`` such answers in a row end it."""
    chunks = []
    empty = 0
    while empty < patience:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            empty += 1
            time.sleep(0.001)
            continue
        if not chunk:
            break
        empty = 0
        chunks.append(chunk)
    return b"".join(chunks)


# -- perf's TRACING_DATA -----------------------------------------------------------------

_TRACING_MAGIC = b"\x17\x08\x44tracing"


@dataclass
class TracingData:
    """perf.data's TRACING_DATA: the ftrace headers and event formats.
    ``formats`` maps event id -> (system, event name, format text)."""

    version: str
    long_size: int
    page_size: int
    header_page: str
    header_event: str
    formats: dict[int, tuple[str, str, str]]


_ID_LINE = re.compile(r"^ID:\s*(\d+)\s*$", re.M)
_NAME_LINE = re.compile(r"^name:\s*(\S+)\s*$", re.M)


def parse_tracing_data(data: bytes, where: str = "TRACING_DATA") -> TracingData:
    """Parse perf's tracing data (tools/perf/util/trace-event-read.c's
    layout): magic, version, endianness, long size, page size, header_page,
    header_event, ftrace formats, then per system the event formats."""
    pos = 0

    def need(n: int) -> None:
        if pos + n > len(data):
            raise FilterError(f"truncated at byte {pos}", where=where)

    def take(n: int) -> bytes:
        nonlocal pos
        need(n)
        pos += n
        return data[pos - n : pos]

    def cstring() -> str:
        nonlocal pos
        end = data.find(b"\0", pos)
        if end < 0:
            raise FilterError(f"unterminated string at byte {pos}", where=where)
        s = data[pos:end].decode("utf-8", "replace")
        pos = end + 1
        return s

    if take(10) != _TRACING_MAGIC:
        raise FilterError("bad magic: not perf tracing data", where=where)
    version = cstring()
    big_endian = take(1)[0]
    if big_endian:
        raise FilterError("big-endian tracing data is not supported", where=where)
    long_size = take(1)[0]
    (page_size,) = struct.unpack("<I", take(4))
    if take(12) != b"header_page\0":
        raise FilterError(f"no header_page at byte {pos - 12}", where=where)
    (n,) = struct.unpack("<Q", take(8))
    header_page = take(n).decode("utf-8", "replace")
    if take(13) != b"header_event\0":
        raise FilterError(f"no header_event at byte {pos - 13}", where=where)
    (n,) = struct.unpack("<Q", take(8))
    header_event = take(n).decode("utf-8", "replace")
    formats: dict[int, tuple[str, str, str]] = {}

    def add(system: str, text: str) -> None:
        m, name = _ID_LINE.search(text), _NAME_LINE.search(text)
        if m and name:
            formats[int(m.group(1))] = (system, name.group(1), text)

    (count,) = struct.unpack("<I", take(4))
    for _ in range(count):
        (n,) = struct.unpack("<Q", take(8))
        add("ftrace", take(n).decode("utf-8", "replace"))
    (systems,) = struct.unpack("<I", take(4))
    for _ in range(systems):
        system = cstring()
        (count,) = struct.unpack("<I", take(4))
        for _ in range(count):
            (n,) = struct.unpack("<Q", take(8))
            add(system, take(n).decode("utf-8", "replace"))
    # kallsyms, printk formats and saved cmdlines follow; filters need none.
    return TracingData(version, long_size, page_size, header_page, header_event, formats)


# -- tracefs directories -----------------------------------------------------------------


class Tracefs:
    """A tracefs directory (``/sys/kernel/tracing``, an instance of it, or a
    copy with ``events/SYS/EVT/{id,format}``, ``events/header_page`` and
    ``events/header_event``): event ids to formats, the page layout."""

    def __init__(self, root: str | os.PathLike = LIVE_TRACEFS) -> None:
        self.root = Path(root)
        self.events = self.root / "events"
        self._by_id: dict[int, tuple[str, str]] | None = None
        if not self.events.is_dir():
            raise FilterError(f"{self.root}: no events/ directory (not a tracefs directory)")

    def _header(self, name: str) -> str | None:
        for d in (self.events, Path(LIVE_TRACEFS) / "events"):
            try:
                return (d / name).read_text()
            except OSError:
                continue
        return None

    def layout(self) -> tuple[PageLayout, EventHeader]:
        """The page layout and event header encoding (defaults where the
        directory has no header files)."""
        page = self._header("header_page")
        event = self._header("header_event")
        return (
            PageLayout.parse(page, str(self.events / "header_page")) if page else PageLayout(),
            EventHeader.parse(event, str(self.events / "header_event")) if event else EventHeader(),
        )

    def _index(self) -> dict[int, tuple[str, str]]:
        if self._by_id is None:
            self._by_id = {}
            for system in sorted(os.listdir(self.events)):
                sdir = self.events / system
                if not sdir.is_dir():
                    continue
                for event in sorted(os.listdir(sdir)):
                    try:
                        text = (sdir / event / "id").read_text()
                    except OSError:
                        continue
                    try:
                        self._by_id[int(text)] = (system, event)
                    except ValueError:
                        continue
        return self._by_id

    def event(self, event_id: int) -> tuple[str, str, str] | None:
        """(system, event, format text) of ``event_id``, None if unknown."""
        found = self._index().get(event_id)
        if found is None:
            return None
        system, event = found
        path = self.events / system / event / "format"
        try:
            return system, event, path.read_text()
        except OSError as e:
            raise FilterError(f"cannot read {path}: {e.strerror}") from None
