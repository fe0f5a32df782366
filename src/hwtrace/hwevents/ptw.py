"""Typed software events carried in Intel PT by PTWRITE packets.

An event is a few 64-bit words written with ``ptwrite``, each one a PTW
packet in the trace: a header word, then the payload words.  The header
says which event type and how many words follow, and carries a marker so
a decoder that lost its place (an overflow, a damaged stream) finds the
next event::

    header = MARK << 40 | nwords << 32 | type id     (MARK = 0x485458, "HTX")

With PT's ``fup_on_ptw`` a FUP after the header's PTW gives the call
site's IP.  Time is PT's: the time model's time at the header's packet
(TSC, TMA, MTC, CYC); a software channel writing the same packets puts a
TSC packet before each event, so its times are exact.

Types are declared once (:class:`EventSchema`: an id, a name, the payload
field names), in Python or JSON; :meth:`EventSchema.c_header` writes the C
header a program includes to emit them.

:func:`encode_events` writes events as the packets hardware (or the
software channel) would; :func:`decode_events` reads any PT stream back
to typed events (compiled: the packet scan, the time model and the event
assembly run in numba), with a count of the events lost to damage.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import aot
from ..columns import Columns
from ..pt.config import PtConfig
from ..pt.kinds import Kind
from ..pt.packets import as_buffer, encode_table, map_file
from ..pt.select import kind_mask, timed_chunks

__all__ = [
    "MARK",
    "MAX_WORDS",
    "EventSchema",
    "EventType",
    "PtwEvents",
    "decode_events",
    "encode_events",
]

MARK = 0x485458

# The loop Python calls (the other is built into it: hwtrace.aot).
AOT_ENTRIES = ("_assemble",)
MAX_WORDS = 8


@dataclass(frozen=True)
class EventType:
    id: int
    name: str
    fields: tuple[str, ...] = ()


@dataclass
class EventSchema:
    """Event types by id (``types``)."""

    types: dict[int, EventType] = field(default_factory=dict)

    def add(self, id: int, name: str, fields: tuple[str, ...] | list[str] = ()) -> EventType:
        if not 0 <= id < 1 << 32:
            raise ValueError(f"event {name}: id {id} is not a 32-bit number")
        if len(fields) > MAX_WORDS:
            raise ValueError(f"event {name}: {len(fields)} fields, at most {MAX_WORDS}")
        if id in self.types:
            raise ValueError(f"event {name}: id {id} is already {self.types[id].name}")
        t = EventType(id, name, tuple(fields))
        self.types[id] = t
        return t

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EventSchema:
        """From JSON: ``{"events": [{"id": 1, "name": "x", "fields": ["a"]}, ...]}``."""
        try:
            doc = json.loads(Path(path).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {e.lineno} column {e.colno}: {e.msg}") from None
        schema = cls()
        for k, ev in enumerate(doc.get("events", [])):
            try:
                schema.add(int(ev["id"]), str(ev["name"]), [str(f) for f in ev.get("fields", [])])
            except (KeyError, TypeError) as e:
                raise ValueError(f"{path}: event {k}: missing or bad {e}") from None
        return schema

    def c_header(self, guard: str = "HWTRACE_EVENTS_H", *, channel: bool = True) -> str:
        """A C header with an inline function per event type.  An event is
        ``ptwrite`` instructions where the CPU has PTWRITE (CPUID leaf 0x14,
        EBX bit 4) and, with ``channel``, hwtrace's software channel
        (``hwtrace_channel.h``, beside this header) where it has not: the
        same PT packets either way.  ``HWTRACE_PTWRITE=1`` or ``0`` in the
        environment forces the choice (1 on a CPU without PTWRITE: for
        ``hwtrace record``'s software backend, which carries them out)."""
        lines = [
            f"#ifndef {guard}", f"#define {guard}",
            "/* hwtrace events: PTWRITE where the CPU has it, else hwtrace's",
            " * software channel (the same PT packets).  Made by hwtrace. */",
            "#include <stdint.h>", "#include <stdlib.h>", "#include <cpuid.h>",
        ]  # fmt: skip
        if channel:
            lines.append('#include "hwtrace_channel.h"')
        lines += [
            "",
            "static inline void hwtrace_ptwrite(uint64_t v)",
            "{", '\t__asm__ volatile("ptwrite %0" : : "r"(v) : "memory");', "}", "",
            "static int hwtrace_use_ptwrite_ = -1;",
            "static inline int hwtrace_use_ptwrite(void)",
            "{",
            "\tif (__builtin_expect(hwtrace_use_ptwrite_ < 0, 0)) {",
            '\t\tconst char *force = getenv("HWTRACE_PTWRITE");',
            "\t\tunsigned a = 0, b = 0, c = 0, d = 0;",
            "\t\tif (force && *force)",
            "\t\t\thwtrace_use_ptwrite_ = *force == '1';",
            "\t\telse",
            "\t\t\thwtrace_use_ptwrite_ = __get_cpuid_max(0, 0) >= 0x14 &&",
            "\t\t\t\t__get_cpuid_count(0x14, 0, &a, &b, &c, &d) && (b >> 4 & 1);",
            "\t}",
            "\treturn hwtrace_use_ptwrite_;",
            "}", "",
        ]  # fmt: skip
        for t in self.types.values():
            args = ", ".join(f"uint64_t {f}" for f in t.fields) or "void"
            header = (MARK << 40) | (len(t.fields) << 32) | t.id
            lines += [f"static inline void hwtrace_{t.name}({args})", "{"]
            if channel:
                lines.append("\tif (hwtrace_use_ptwrite()) {")
            ind = "\t\t" if channel else "\t"
            lines.append(f"{ind}hwtrace_ptwrite({header:#x}ULL);")
            lines += [f"{ind}hwtrace_ptwrite({f});" for f in t.fields]
            if channel:
                words = ", ".join(t.fields) or "0"
                lines += ["\t} else {", f"\t\tconst uint64_t w[] = {{{words}}};",
                          f"\t\thwtrace_emit({t.id}u, {len(t.fields)}, w);", "\t}"]  # fmt: skip
            lines += ["}", ""]
        lines += [f"#endif /* {guard} */", ""]
        return "\n".join(lines)


def header_word(type_id: int, nwords: int) -> int:
    return (MARK << 40) | (nwords << 32) | type_id


def encode_events(
    type_ids: np.ndarray,
    words: np.ndarray,
    nwords: np.ndarray,
    times: np.ndarray,
    ips: np.ndarray | None = None,
    *,
    psb_every: int = 64,
) -> bytes:
    """The PT of events ``k``: a TSC packet with ``times[k]``, the header's
    PTW (with a FUP of ``ips[k]`` when given), ``nwords[k]`` PTW of
    ``words[k]``; a PSB+ (with TSC) first and every ``psb_every`` events."""
    n = type_ids.shape[0]
    kinds, a_col, b_col, c_col = [], [], [], []

    def put(k, a, b=0, c=0) -> None:
        kinds.append(int(k))
        a_col.append(int(a))
        b_col.append(int(b))
        c_col.append(int(c))

    for k in range(n):
        t = int(times[k])
        if k % psb_every == 0:
            put(Kind.PSB, 0)
            put(Kind.TSC, t)
            put(Kind.PSBEND, 0)
        else:
            put(Kind.TSC, t)
        has_ip = ips is not None
        put(Kind.PTW, header_word(int(type_ids[k]), int(nwords[k])), 1, 1 if has_ip else 0)
        if has_ip:
            put(Kind.FUP, int(ips[k]), 6)
        for j in range(int(nwords[k])):
            put(Kind.PTW, int(words[k, j]), 1, 0)
    return encode_table(np.array(kinds, np.uint8), np.array(a_col, np.uint64),
                        np.array(b_col, np.uint32), np.array(c_col, np.uint8))  # fmt: skip


@dataclass
class PtwEvents(Columns):
    """Decoded events: ``time`` (TSC), ``type_id``, ``ip`` (0: none),
    ``nwords``, ``words`` (rows of MAX_WORDS), the trace ``offset`` of each
    header; ``lost``: events cut by damage or overflow; ``stray``: PTW
    words outside any event."""

    time: np.ndarray
    type_id: np.ndarray
    ip: np.ndarray
    nwords: np.ndarray
    words: np.ndarray
    offset: np.ndarray
    lost: int = 0
    stray: int = 0
    problems: list[str] = field(default_factory=list)

    def rows(self, schema: EventSchema | None = None) -> list[dict]:
        """One dict per event: time, name (or id), ip (where known), fields
        (named by ``schema``, else ``w0``...)."""
        types = schema.types if schema else {}
        out = []
        for tm, tid, ip, nw, words in zip(self.time.tolist(), self.type_id.tolist(), self.ip.tolist(),
                                          self.nwords.tolist(), self.words.tolist(), strict=True):  # fmt: skip
            t = types.get(tid)
            names = t.fields if t is not None else tuple(f"w{j}" for j in range(nw))
            row = {"time": tm, "event": t.name if t else tid}
            if ip:
                row["ip"] = f"{ip:#x}"
            row["fields"] = dict(zip(names[:nw], words[:nw], strict=False))
            out.append(row)
        return out

    def json_lines(self, schema: EventSchema | None = None) -> list[str]:
        """:meth:`rows` as JSON, one per event."""
        return [json.dumps(r) for r in self.rows(schema)]


# FUP IPs are compressed against the last IP of any IP packet: keep them all.
_KEEP = kind_mask((Kind.PTW, Kind.FUP, Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.PSB))
_PTW, _FUP, _OVF, _PSB = int(Kind.PTW), int(Kind.FUP), int(Kind.OVF), int(Kind.PSB)
_TIP, _PGE, _PGD = int(Kind.TIP), int(Kind.TIP_PGE), int(Kind.TIP_PGD)


@aot.njit(cache=True, _nrt=False)
def _last_ip(last, a, ipc):
    """The last IP after an IP packet with compression ``ipc`` (the SDM's
    IP compression; libipt's pt_last_ip_update_ip).  ``ipc`` 0: suppressed."""
    if ipc == 0:
        return last
    if ipc == 1:
        m = np.uint64(0xFFFF)
    elif ipc == 2:
        m = np.uint64(0xFFFFFFFF)
    elif ipc == 3:
        v = a & np.uint64(0xFFFFFFFFFFFF)
        if v & np.uint64(1 << 47):
            v |= np.uint64(0xFFFF000000000000)
        return v
    elif ipc == 4:
        m = np.uint64(0xFFFFFFFFFFFF)
    else:
        return a
    return (last & ~m) | (a & m)


@aot.njit(cache=True, _nrt=False)
def _assemble(
    kind, a, b, c, tsc, offset, err_rows, out_t, out_id, out_ip, out_n, out_w, out_off, counts
):
    """PTW rows to events; returns the events written."""
    n = 0
    want = -1  # payload words still expected (-1: a header is expected)
    got = 0
    cur = -1
    e = 0
    pending_ip = False
    last = np.uint64(0)
    for i in range(kind.shape[0]):
        while e < err_rows.shape[0] and err_rows[e] <= i:
            if want > 0:
                counts[0] += 1  # the event in progress is lost
                n = cur
            want = -1
            pending_ip = False
            e += 1
        k = kind[i]
        if k == _OVF:
            if want > 0:
                counts[0] += 1
                n = cur
            want = -1
            pending_ip = False
            continue
        if k == _PSB:
            last = np.uint64(0)
            continue
        if k == _TIP or k == _PGE or k == _PGD:
            last = _last_ip(last, a[i], b[i])
            continue
        if k == _FUP:
            last = _last_ip(last, a[i], b[i])
            if pending_ip and cur >= 0 and b[i] != 0:
                out_ip[cur] = last
            pending_ip = False
            continue
        if k != _PTW:
            continue
        v = a[i]
        if want > 0:
            out_w[cur, got] = v
            got += 1
            want -= 1
            continue
        if (v >> np.uint64(40)) == np.uint64(MARK):
            nw = int((v >> np.uint64(32)) & np.uint64(0xFF))
            if nw > MAX_WORDS:
                counts[1] += 1
                continue
            if n >= out_t.shape[0]:
                return -1
            cur = n
            out_t[cur] = tsc[i]
            out_id[cur] = v & np.uint64(0xFFFFFFFF)
            out_ip[cur] = 0
            out_n[cur] = nw
            out_off[cur] = offset[i]
            for j in range(MAX_WORDS):
                out_w[cur, j] = 0
            n += 1
            want = nw
            got = 0
            pending_ip = c[i] != 0
        else:
            counts[1] += 1  # a word outside any event
    if want > 0:
        counts[0] += 1
        n = cur
    return n


def _new_event_columns(cap: int) -> tuple[np.ndarray, ...]:
    """Room for ``cap`` events (time, id, ip, words used, words, offset;
    _assemble writes every field of the rows it returns)."""
    return (np.empty(cap, np.uint64), np.empty(cap, np.uint32), np.empty(cap, np.uint64),
            np.empty(cap, np.int64), np.empty((cap, MAX_WORDS), np.uint64), np.empty(cap, np.int64))  # fmt: skip


def decode_events(data, config: PtConfig | None = None, *, chunk_bytes: int = 4 << 20) -> PtwEvents:
    """The PTWRITE events of a PT stream (bytes, a buffer or a path)."""
    config = config or PtConfig()
    buf = map_file(data) if isinstance(data, (str, os.PathLike)) else as_buffer(data)
    lost = stray = 0
    problems: list[str] = []
    # (Each chunk's events go after the last chunk's, not into columns of
    # their own joined at the end: fresh memory costs more than decoding.)
    out = _new_event_columns(0)
    n = 0
    synced = False
    for _, end, table, times in timed_chunks(buf, _KEEP, config, chunk_bytes):
        synced = True
        for off, code in zip(table.err_offset.tolist(), table.err_code.tolist(), strict=True):
            problems.append(f"offset {off:#x}: decode error {code}: resynchronised at the next PSB")
        room = n + int(np.count_nonzero(table.kind == _PTW)) + 1
        if out[0].shape[0] < room:
            # Room for as many events a byte as so far, for the whole stream.
            guess = room * max(1, buf.shape[0]) // max(1, end)
            wider = _new_event_columns(max(room, guess, out[0].shape[0] * 3 // 2))
            for old, new in zip(out, wider, strict=True):
                new[:n] = old[:n]
            out = wider
        counts = np.zeros(2, np.int64)
        rows = _assemble(table.kind, table.a, table.b, table.c, times.tsc, table.offset,
                         table.err_index.astype(np.int64), *(c[n:] for c in out), counts)  # fmt: skip
        lost += int(counts[0])
        stray += int(counts[1])
        n += rows
    if not synced:
        problems.append("no PSB: the stream never synchronises")
    t, i, ip, nw, w, off = (c[:n] for c in out)
    if lost:
        problems.append(f"{lost} events cut by an overflow or damage")
    return PtwEvents(t, i, ip, nw, w, off, lost, stray, problems)
