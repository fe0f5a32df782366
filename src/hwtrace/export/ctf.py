"""Writing CTF 1.8 traces (the Common Trace Format that LTTng writes and
babeltrace2 and Trace Compass read): a TSDL ``metadata`` file and one
binary stream file per CPU.

Events are given as numpy columns and packed with numpy, whole packets at
a time: every field is an unsigned little-endian integer aligned on a byte,
so records need no padding and a class's records are a packed structured
array.  Each event class has its own fields; records of different classes
interleave in time order in a stream.
"""

from __future__ import annotations

import os
import uuid as _uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the writer itself needs none of the decoders
    from ..hwevents.ptw import EventSchema, PtwEvents

__all__ = [
    "PACKET_HEAD",
    "CtfWriter",
    "EventClass",
    "packet_head",
    "tsdl_clock_block",
    "tsdl_preamble",
    "tsdl_stream_block",
    "tsdl_string",
    "tsdl_trace_block",
    "write_ptw_events",
]

CTF_MAGIC = 0xC1FC1FC1
_PACKET_EVENTS = 1 << 16  # records per packet at most


@dataclass(frozen=True)
class EventClass:
    """An event class: ``name`` and its payload ``fields`` as (name, bits)
    with bits 8, 16, 32 or 64; ``hex``: fields shown in base 16."""

    id: int
    name: str
    fields: tuple[tuple[str, int], ...]
    hex: frozenset[str] = frozenset()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(
            [("id", "<u4"), ("timestamp", "<u8")]
            + [(n, f"<u{bits // 8}") for n, bits in self.fields]
        )


# A packet's header and context, as tsdl_trace_block and tsdl_stream_block
# declare them.
PACKET_HEAD = np.dtype(
    [
        ("magic", "<u4"), ("uuid", "u1", (16,)), ("stream_id", "<u4"),
        ("timestamp_begin", "<u8"), ("timestamp_end", "<u8"), ("content_size", "<u8"),
        ("packet_size", "<u8"), ("events_discarded", "<u8"), ("cpu_id", "<u4"),
    ]
)  # fmt: skip


def packet_head(
    trace_uuid: _uuid.UUID,
    cpu: int,
    begin: int,
    end: int,
    content_bytes: int,
    packet_bytes: int,
    discarded: int = 0,
) -> np.ndarray:
    """The bytes of a packet's header and context (:data:`PACKET_HEAD`):
    its events' first and last timestamps, the bytes of its content and of
    the whole packet, and the events discarded before it."""
    p = np.zeros(1, PACKET_HEAD)
    p["magic"] = CTF_MAGIC
    p["uuid"] = np.frombuffer(trace_uuid.bytes, np.uint8)
    p["timestamp_begin"] = begin
    p["timestamp_end"] = end
    p["content_size"] = 8 * content_bytes
    p["packet_size"] = 8 * packet_bytes
    p["events_discarded"] = discarded
    p["cpu_id"] = cpu
    return p.view(np.uint8)


def _int(bits: int, base: int = 10) -> str:
    return (
        f"integer {{ size = {bits}; align = 8; signed = false; byte_order = le; base = {base}; }}"
    )


def tsdl_trace_block(
    trace_uuid: _uuid.UUID, u32: str = "uint32_t", u8: str = "uint8_t"
) -> list[str]:
    """The TSDL ``trace`` block of a CTF 1.8 little-endian trace whose
    packets begin with a magic, the trace's UUID and the stream id
    (``u32``/``u8``: how the metadata spells those integer types)."""
    return [
        "trace {",
        "\tmajor = 1;",
        "\tminor = 8;",
        f'\tuuid = "{trace_uuid}";',
        "\tbyte_order = le;",
        "\tpacket.header := struct {",
        f"\t\t{u32} magic;",
        f"\t\t{u8} uuid[16];",
        f"\t\t{u32} stream_id;",
        "\t};",
        "};",
    ]


def tsdl_string(text: str) -> str:
    """``text`` as a TSDL string literal (quotes and backslashes escaped;
    a line break would end the literal: a space)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'


def tsdl_preamble(
    trace_uuid: _uuid.UUID,
    env: dict[str, str | int],
    *,
    aliases: Sequence[str] = (),
    u32: str = "uint32_t",
    u8: str = "uint8_t",
    clock: str = "monotonic",
    clock_offset_ns: int | None = None,
) -> list[str]:
    """The TSDL of a trace before its stream: the ``/* CTF 1.8 */``
    signature, ``aliases`` (type aliases the rest uses), the ``trace``
    block (:func:`tsdl_trace_block`), ``env`` (strings quoted, numbers
    bare) and the ``clock`` block (:func:`tsdl_clock_block`), each
    followed by a blank line."""
    values = [f"\t{k} = {tsdl_string(v) if isinstance(v, str) else v};" for k, v in env.items()]
    return [
        "/* CTF 1.8 */",
        "",
        *([*aliases, ""] if aliases else []),
        *tsdl_trace_block(trace_uuid, u32, u8),
        "",
        "env {",
        *values,
        "};",
        "",
        *tsdl_clock_block(trace_uuid, clock, clock_offset_ns),
        "",
    ]


def tsdl_clock_block(
    trace_uuid: _uuid.UUID, name: str = "monotonic", offset_ns: int | None = None
) -> list[str]:
    """The TSDL ``clock`` block of CLOCK_MONOTONIC in nanoseconds; with
    ``offset_ns`` (the time of day at its zero, as LTTng gives) its values
    read as times of day, else the clock starts at 0."""
    lines = [
        "clock {",
        f"\tname = {name};",
        f'\tuuid = "{_uuid.uuid5(trace_uuid, name)}";',
        '\tdescription = "CLOCK_MONOTONIC";',
        "\tfreq = 1000000000;",
    ]
    if offset_ns is None:
        lines.append("\toffset = 0;")
    else:
        lines += [
            "\tprecision = 1;",
            f"\toffset_s = {offset_ns // 1_000_000_000};",
            f"\toffset = {offset_ns % 1_000_000_000};",
            "\tabsolute = FALSE;",
        ]
    return [*lines, "};"]


def tsdl_stream_block(
    clock_type: str,
    u32: str = "uint32_t",
    u64: str = "uint64_t",
    event_context: Sequence[str] = (),
) -> list[str]:
    """The TSDL ``stream`` block of the one stream: an event header (id,
    timestamp of ``clock_type``), the packet context :data:`PACKET_HEAD`
    holds, and ``event_context``'s field lines (none: no event context)."""
    lines = [
        "stream {",
        "\tid = 0;",
        "\tevent.header := struct {",
        f"\t\t{u32} id;",
        f"\t\t{clock_type} timestamp;",
        "\t};",
        "\tpacket.context := struct {",
        f"\t\t{clock_type} timestamp_begin;",
        f"\t\t{clock_type} timestamp_end;",
        f"\t\t{u64} content_size;",
        f"\t\t{u64} packet_size;",
        f"\t\t{u64} events_discarded;",
        f"\t\t{u32} cpu_id;",
        "\t};",
    ]
    if event_context:
        lines += ["\tevent.context := struct {", *[f"\t\t{f}" for f in event_context], "\t};"]
    return [*lines, "};"]


class CtfWriter:
    """A CTF trace in directory ``path`` with ``classes``, timestamps in
    nanoseconds of ``clock`` (``monotonic``: CLOCK_MONOTONIC, as LTTng's)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        classes: Sequence[EventClass],
        *,
        clock: str = "monotonic",
        env: dict[str, str | int] | None = None,
    ) -> None:
        self.path = os.fspath(path)
        os.makedirs(self.path, exist_ok=True)
        self.classes = {c.id: c for c in classes}
        self.uuid = _uuid.uuid4()
        self._streams: dict[int, object] = {}
        self._clock, self._env = clock, env or {}
        self._write_metadata(clock, self._env)

    def add_classes(self, classes: Sequence[EventClass]) -> None:
        """More event classes (their ids new): the metadata is written again,
        which readers take as long as they open the trace after it."""
        for c in classes:
            self.classes[c.id] = c
        self._write_metadata(self._clock, self._env)

    def _write_metadata(self, clock: str, env: dict[str, str | int]) -> None:
        aliases = [
            "typealias integer { size = 8; align = 8; signed = false; } := uint8_t;",
            "typealias integer { size = 32; align = 8; signed = false; } := uint32_t;",
            "typealias integer { size = 64; align = 8; signed = false; } := uint64_t;",
        ]
        lines = [
            *tsdl_preamble(self.uuid, env, aliases=aliases, clock=clock),
            f"typealias integer {{ size = 64; align = 8; signed = false; map = clock.{clock}.value; }}"
            " := clock_ns_t;",
            "",
            *tsdl_stream_block("clock_ns_t"),
            "",
        ]
        for c in self.classes.values():
            fields = "".join(
                f"\t\t{_int(bits, 16 if n in c.hex else 10)} {n};\n" for n, bits in c.fields
            )
            lines += [
                "event {",
                f'\tname = "{c.name}";',
                f"\tid = {c.id};",
                "\tstream_id = 0;",
                f"\tfields := struct {{\n{fields}\t}};",
                "};",
                "",
            ]
        with open(os.path.join(self.path, "metadata"), "w") as f:
            f.write("\n".join(lines))

    def _stream(self, cpu: int):
        f = self._streams.get(cpu)
        if f is None:
            f = open(os.path.join(self.path, f"stream_{cpu}"), "wb")
            self._streams[cpu] = f
        return f

    def write(
        self,
        cpu: int,
        timestamp: np.ndarray,
        class_id: np.ndarray,
        payload: dict[int, np.ndarray],
        discarded: int = 0,
    ) -> None:
        """Append events of one CPU, in time order: ``timestamp`` (ns) and
        ``class_id`` per event; ``payload[c]`` holds the payload columns of
        class ``c``'s events (a structured array with the class's fields),
        in the same order as they appear in ``class_id``."""
        n = timestamp.shape[0]
        for lo in range(0, n, _PACKET_EVENTS):
            hi = min(n, lo + _PACKET_EVENTS)
            self._packet(cpu, timestamp, class_id, payload, lo, hi, discarded if lo == 0 else 0)

    def _packet(self, cpu, timestamp, class_id, payload, lo, hi, discarded) -> None:
        ids = class_id[lo:hi]
        sizes = np.zeros(ids.shape[0], np.int64)
        for cid, c in self.classes.items():
            sizes[ids == cid] = c.dtype.itemsize
        head = PACKET_HEAD.itemsize
        offsets = head + np.concatenate(([0], np.cumsum(sizes)[:-1])) if ids.size else sizes
        content = head + int(sizes.sum())
        total = (content + 7) // 8 * 8
        buf = np.zeros(total, np.uint8)
        begin = timestamp[lo] if hi > lo else 0
        end = timestamp[hi - 1] if hi > lo else 0
        buf[:head] = packet_head(self.uuid, cpu, begin, end, content, total, discarded)
        for cid, c in self.classes.items():
            sel = np.flatnonzero(ids == cid)
            if not sel.size:
                continue
            # This class's events before lo, to find its rows of this packet.
            before = int(np.count_nonzero(class_id[:lo] == cid))
            rec = np.zeros(sel.size, c.dtype)
            rec["id"] = cid
            rec["timestamp"] = timestamp[lo:hi][sel]
            rows = payload[cid][before : before + sel.size]
            for name, _ in c.fields:
                rec[name] = rows[name]
            raw = rec.view(np.uint8).reshape(sel.size, c.dtype.itemsize)
            dest = offsets[sel][:, None] + np.arange(c.dtype.itemsize)
            buf[dest] = raw
        self._stream(cpu).write(buf.tobytes())

    def close(self) -> None:
        for f in self._streams.values():
            f.close()  # type: ignore[attr-defined]
        self._streams.clear()

    def __enter__(self) -> CtfWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_ptw_events(events: PtwEvents, directory: str | os.PathLike[str],
                     schema: EventSchema | None = None, *, to_ns=None, cpu: int = 0) -> int:  # fmt: skip
    """PTWRITE events (:mod:`hwtrace.hwevents.ptw`) as a CTF trace
    babeltrace2 reads: an event class per type (the schema's name and
    fields, else ``event_<id>`` with ``w0``...), each with the call site
    ``ip``; ``to_ns`` maps TSC to ns (default: TSC as ns).  Returns the
    number of events."""
    ids = np.unique(events.type_id)
    classes = []
    for k, tid in enumerate(ids.tolist()):
        t = schema.types.get(tid) if schema else None
        nmax = int(events.nwords[events.type_id == tid].max()) if len(events) else 0
        names = t.fields if t is not None else tuple(f"w{j}" for j in range(nmax))
        classes.append(EventClass(k, t.name if t else f"event_{tid}", (("ip", 64), *((n, 64) for n in names)),
                                  frozenset({"ip"})))  # fmt: skip
    cid = np.searchsorted(ids, events.type_id).astype(np.uint32)
    ts = np.asarray(to_ns(events.time) if to_ns else events.time, np.uint64)
    payload = {}
    for c in classes:
        rows = np.flatnonzero(cid == c.id)
        rec = np.zeros(rows.shape[0], c.dtype)
        rec["ip"] = events.ip[rows]
        for j, (name, _) in enumerate(c.fields[1:]):
            rec[name] = events.words[rows, j]
        payload[c.id] = rec
    order = np.argsort(ts, kind="stable")
    if not np.array_equal(order, np.arange(order.shape[0])):
        raise ValueError("events are not in time order")
    with CtfWriter(
        directory, classes, env={"domain": "hwtrace-ptwrite", "tracer_name": "hwtrace"}
    ) as w:
        w.write(cpu, ts, cid, payload)
    return len(events)
