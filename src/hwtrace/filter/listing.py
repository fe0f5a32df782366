"""Listings of filtered events: text like ftrace's ``trace`` file, or JSON lines.

A text line is ``comm-tid [cpu] seconds.nanoseconds: system:event:
field=value ...`` (the ``common_*`` fields left out, as ``trace`` does;
flags and enumerations in the words ``trace`` prints them in, from the
event's ``print fmt``: :mod:`hwtrace.filter.printfmt`); a
JSON line ``{"time", "cpu", "tid", "comm", "event", "fields": {...}}``.
Events are listed in time order, as ``trace`` and ``perf script`` list them.

For perf.data and ftrace sources a compiled loop writes the lines
straight from the raw records, from a per-type field program (kind, offset,
size, signedness, count per field), so listing millions of events does no
Python work per event.  CTF events are listed from the values bt2 gave
(:func:`hwtrace.filter.inputs.ctf.render_ctf_listing`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import BinaryIO

import numpy as np

from .. import aot
from ..columns import distinct
from ..textout import (
    align_right,
    put_byte,
    put_bytes,
    put_cstring,
    put_dec,
    put_seconds,
    put_signed,
    string_list_table,
)
from .inputs.base import EventSource, EventTypeInfo, StreamInput
from .printfmt import word_fields, word_rows
from .schema import ArrayType, IntType, Schema, SequenceType, StringType

K_INT, K_STR_INLINE, K_STR_LOC, K_ARRAY, K_SEQ_LOC = 1, 2, 3, 4, 5
K_WORDS = 6  # an int printed as words: row w_idx[event, count] of the words table


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


@aot.njit(cache=True, inline="always")
def _put_int_member(out, p, key, v):
    """A JSON member with an integer value: ``key`` (its text from the
    separator to the colon), then ``v``."""
    return put_signed(out, put_bytes(out, p, key), v)


@aot.njit(cache=True, _nrt=False)
def read_int(buf, at, size, signed):
    """The little-endian integer of ``size`` bytes at ``buf[at]`` (sign-
    extended when ``signed``), as a uint64."""
    v = np.uint64(0)
    for j in range(size):
        v |= np.uint64(buf[at + j]) << np.uint64(8 * j)
    if signed and size < 8 and (v >> np.uint64(8 * size - 1)) & np.uint64(1):
        v |= ~np.uint64(0) << np.uint64(8 * size)
    return v


@aot.njit(cache=True)
def _data_loc(buf, base, size, off, elem):
    """A ``__data_loc`` field at ``off`` of the record at ``base`` (``size``
    bytes): where its data starts and how many ``elem``-byte elements it
    holds; none when the data runs past the record."""
    loc = read_int(buf, base + off, 4, False)
    start = base + np.int64(loc & np.uint64(0xFFFF))
    n = np.int64(loc >> np.uint64(16)) // elem
    if start + n * elem > base + size:
        n = 0
    return start, n


@aot.njit(cache=True)
def _int_value(out, p, buf, at, size, signed):
    v = read_int(buf, at, size, signed)
    if signed:
        return put_signed(out, p, np.int64(v))
    return put_dec(out, p, v)


@aot.njit(cache=True)
def _render(
    buf, offsets, sizes, etype, time, cpu, tid, comm, order, lo, hi,
    prog, pstart, pend, fname_tab, fname_len, ename_tab, ename_len, comm_tab, comm_len,
    w_idx, w_tab, w_len, json, out,
):  # fmt: skip
    p = 0
    for k in range(lo, hi):
        i = order[k]
        t = etype[i]
        base = offsets[i]
        size = sizes[i]
        c = comm[i]
        if json:
            p = _put_int_member(out, p, _J_TIME, time[i])
            p = _put_int_member(out, p, _J_CPU, cpu[i])
            p = _put_int_member(out, p, _J_TID, tid[i])
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
                p = put_seconds(out, p, time[i], 6)
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
            elif kind == 6:
                r = w_idx[i, count]
                p = put_cstring(out, p, w_tab[r], 0, w_len[r], False)
            elif kind == 2 or kind == 3:
                if kind == 2:
                    s0 = base + off
                    n = fsize
                else:
                    s0, n = _data_loc(buf, base, size, off, np.int64(1))
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
                    s0, n = _data_loc(buf, base, size, off, fsize)
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


class _Lines:
    """The compiled writer's tables for a list of event types and comms:
    per type its field program (kind, offset, size, signedness, count per
    field), and the names as byte tables."""

    def __init__(self, types: Sequence[EventTypeInfo], comms: Sequence[str], json: bool) -> None:
        prog_rows: list[tuple[int, int, int, int, int]] = []
        fnames: list[str] = []
        pstart, pend = [], []
        # A line's size bound per type: fixed + per_byte * its largest record.
        fixed, per_byte = [], []
        # Per type, its ints printed as words: (w_idx column, offset, size,
        # signed, the value's words).
        self.words: list[list[tuple[int, int, int, int, Callable[[int], str]]]] = []
        for t in types:
            fields = _field_program(t.schema)
            ints = {name for kind, *_, name in fields if kind == K_INT}
            texts = {} if json else word_fields(t.format_text, ints)
            pstart.append(len(prog_rows))
            mine: list[tuple[int, int, int, int, Callable[[int], str]]] = []
            for kind, off, size, signed, count, name in fields:
                if name in texts and kind == K_INT:
                    kind, count = K_WORDS, len(mine)
                    mine.append((count, off, size, signed, texts[name]))
                prog_rows.append((kind, off, size, signed, count))
                fnames.append(name)
            self.words.append(mine)
            pend.append(len(prog_rows))
            fixed.append(
                200 + 6 * len(t.name) + sum(
                    len(name) + 8 + (6 * (size or 1) if kind == K_STR_INLINE else 0)
                    + (22 * max(count, 1) if kind == K_ARRAY else 0)
                    + (0 if kind in (K_STR_LOC, K_SEQ_LOC) else 24)
                    for kind, off, size, signed, count, name in fields
                )
            )  # fmt: skip
            per_byte.append(28 * sum(1 for f in fields if f[0] in (K_STR_LOC, K_SEQ_LOC)))
        self.fixed = np.array(fixed or [0], np.int64)
        self.per_byte = np.array(per_byte or [0], np.int64)
        self.prog = np.array(prog_rows or [(0, 0, 0, 0, 0)], np.int64).reshape(-1, 5)
        self.pstart = np.array(pstart or [0], np.int64)
        self.pend = np.array(pend or [0], np.int64)
        self.fname = string_list_table(fnames)
        self.ename = string_list_table([t.name for t in types])
        self.comm = string_list_table(list(comms))
        self.json = json

    def render(
        self, buf: np.ndarray, cols: dict[str, np.ndarray], chunk_bytes: int
    ) -> Iterator[bytes]:
        """Lines for the events of ``cols`` (``offset``, ``size`` of the
        record in ``buf``, ``etype``, ``time``, ``cpu``, ``tid``, ``comm``),
        in their order, in byte chunks."""
        n = cols["etype"].shape[0]
        if n == 0:
            return
        etype = np.ascontiguousarray(cols["etype"], np.int64)
        sizes = np.ascontiguousarray(cols["size"], np.int64)
        biggest = np.zeros(self.fixed.shape[0], np.int64)
        np.maximum.at(biggest, etype, sizes)
        present = distinct(etype)
        line_max = int((self.fixed[present] + self.per_byte[present] * biggest[present]).max())
        line_max += 6 * int(self.comm[1].max(initial=0))
        w_idx, w_tab, w_len = self._words(buf, cols, etype, sizes)
        line_max += int(w_len.max(initial=0)) * w_idx.shape[1]
        per_chunk = max(1, chunk_bytes // line_max)
        out = np.empty(per_chunk * line_max, np.uint8)
        args = (
            buf, np.ascontiguousarray(cols["offset"], np.int64), sizes, etype,
            *(np.ascontiguousarray(cols[c], np.int64) for c in ("time", "cpu", "tid", "comm")),
            np.arange(n, dtype=np.int64),
        )  # fmt: skip
        for lo in range(0, n, per_chunk):
            hi = min(lo + per_chunk, n)
            used = _render(
                *args, lo, hi, self.prog, self.pstart, self.pend, *self.fname, *self.ename,
                *self.comm, w_idx, w_tab, w_len, self.json, out,
            )  # fmt: skip
            yield out[:used].tobytes()

    def _words(
        self, buf: np.ndarray, cols: dict[str, np.ndarray], etype: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each event and int of its type printed as words, the row of
        its words in a table (each distinct value put into words once)."""
        n = etype.shape[0]
        idx = np.zeros((n, max((len(w) for w in self.words), default=0)), np.int64)
        texts: list[str] = []
        if idx.shape[1] == 0:
            return idx, *string_list_table(texts)
        offsets = np.asarray(cols["offset"], np.int64)
        for k, words in enumerate(self.words):
            if not words:
                continue
            sel = np.flatnonzero(etype == k)
            for col, off, size, signed, text in words:
                # (a record too short for the field does not print it)
                at = np.minimum(offsets[sel, None] + off + np.arange(size), buf.shape[0] - 1)
                dtype = np.dtype(f"<{'i' if signed else 'u'}{size}")
                raw = np.ascontiguousarray(buf[at]).view(dtype).reshape(-1)
                idx[sel, col] = word_rows(raw, text, texts)
        return idx, *string_list_table(texts)


def _events(source: EventSource, keep: np.ndarray) -> dict[str, np.ndarray]:
    """The events of ``source`` with ``keep`` set, in source order, as the
    columns :meth:`_Lines.render` reads."""
    n = len(source)
    etype = np.full(n, -1, np.int64)
    offsets = np.zeros(n, np.int64)
    sizes = np.zeros(n, np.int64)
    for k, t in enumerate(source.types):
        assert t.offsets is not None and t.sizes is not None
        etype[t.rows] = k
        offsets[t.rows] = t.offsets
        sizes[t.rows] = t.sizes
    sel = np.flatnonzero(keep & (etype >= 0))
    return {
        "offset": offsets[sel], "size": sizes[sel], "etype": etype[sel],
        "time": source.time[sel].astype(np.int64), "cpu": source.cpu[sel].astype(np.int64),
        "tid": source.tid[sel].astype(np.int64), "comm": source.comm[sel].astype(np.int64),
    }  # fmt: skip


def _take(cols: dict[str, np.ndarray], which: np.ndarray | slice) -> dict[str, np.ndarray]:
    return {k: v[which] for k, v in cols.items()}


def render_listing(
    source: EventSource, keep: np.ndarray, *, json: bool = False, chunk_bytes: int = 1 << 23
) -> Iterator[bytes]:
    """The events with ``keep`` set, in time order, as text lines like
    ftrace's ``trace`` (``comm-tid [cpu] seconds: event: field=value ...``)
    or JSON lines, in byte chunks."""
    if source.kind == "ctf":
        from .inputs.ctf import render_ctf_listing

        yield from render_ctf_listing(source, keep, json)
        return
    assert source.buf is not None
    cols = _events(source, keep)
    # Time order, as `trace` and `perf script` list (perf.data's file order
    # is only ordered within each flush round).
    cols = _take(cols, np.argsort(cols["time"], kind="stable"))
    yield from _Lines(source.types, source.comms, json).render(source.buf, cols, chunk_bytes)


class ListingWriter:
    """Writes a listing of an input read in chunks (:class:`~hwtrace.filter.
    inputs.base.StreamInput`), in time order as :func:`render_listing`
    orders a whole source: each chunk's kept events join those held back,
    and those no later chunk can precede (not after the earliest time of
    the chunks to come) are written; the rest wait.  A perf.data's rounds
    keep that wait short."""

    def __init__(
        self, out: BinaryIO, input: StreamInput, *, json: bool = False, chunk_bytes: int = 1 << 23
    ) -> None:
        self.out, self.json, self.chunk_bytes = out, json, chunk_bytes
        self.lines = _Lines(input.types, input.comms, json) if input.kind != "ctf" else None
        self.held: dict[str, np.ndarray] | None = None  # in time order

    def add(self, source: EventSource, keep: np.ndarray, later: int | None) -> None:
        """The events of chunk ``source`` with ``keep`` set; ``later`` the
        earliest event time of the chunks still to come (None: none)."""
        if self.lines is None:  # CTF: one chunk, listed from bt2's values
            for chunk in render_listing(source, keep, json=self.json):
                self.out.write(chunk)
            return
        assert source.buf is not None
        cols = _events(source, keep)
        if self.held is not None:
            cols = {k: np.concatenate([self.held[k], v]) for k, v in cols.items()}
        cols = _take(cols, np.argsort(cols["time"], kind="stable"))
        ready = cols["time"].shape[0]
        if later is not None:
            ready = int(np.searchsorted(cols["time"], later, side="right"))
        for chunk in self.lines.render(source.buf, _take(cols, slice(0, ready)), self.chunk_bytes):
            self.out.write(chunk)
        self.held = _take(cols, slice(ready, None))
