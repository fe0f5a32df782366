"""``hwtrace script``'s listing: one line per instruction or block, as
``perf script --itrace=i0ns --ns -F comm,tid,time,ip,sym,symoff,dso``
prints it, written by a compiled loop.

A line is ``comm tid seconds.nanoseconds:  ip symbol+0xoff (module)``
(perf's widths: 16, 5, 5 and 16; ``[unknown] (module)`` where no symbol
covers the address, ``[unknown] ([unknown])`` where no file is mapped),
with `` N insns`` appended per block; a PTWRITE payload in the flow is a
line of its own at its place, ending ``ptwrite: 0xPAYLOAD``, or as
``perf script --itrace=...w`` lists them (perf's event name and payload
text, or with its ``-F`` the address alone; ``ptwrite`` of
:class:`ListingWriter`).  Names go into the loop as byte tables
(one row per distinct comm, symbol name and module), so listing millions of
instructions does no Python work per line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import BinaryIO
from weakref import WeakKeyDictionary

import numpy as np

from .. import aot
from . import (
    COPY_SLACK,
    digit_count,
    hex_digit_count,
    packed_strings,
    put_bytes,
    put_dec,
    put_hex,
    put_seconds_to,
    put_slice_over,
    put_spaces,
    put_text,
)


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_place(out, p, a, s, o, head_data, head_at, tail_data, tail_at, plain, blank, json):
    """An instruction's address and name: ``  ip symbol+0xoff (module)``,
    or as JSON ``,"ip":"0x...","sym":...,"symoff":N,"dso":...``."""
    a = np.uint64(a)
    if json:
        p = put_text(out, p, ',"ip":"0x')
        p = put_hex(out, p, a, 0)
        out[p] = 34
        p += 1
        if s < 0:
            return put_text(out, p, ',"sym":null,"dso":null')
    else:
        p = put_slice_over(out, p, blank, 0, 16 - hex_digit_count(a))
        p = put_hex(out, p, a, 0)
        out[p] = 32
        p += 1
        if s < 0:
            return put_text(out, p, "[unknown] ([unknown])")
    p = put_slice_over(out, p, head_data, head_at[s], head_at[s + 1])
    if plain[s] == 0:
        if json:
            p = put_text(out, p, ',"symoff":')
            p = put_dec(out, p, o)
        else:
            p = put_hex(out, p, o, 0)
    return put_slice_over(out, p, tail_data, tail_at[s], tail_at[s + 1])


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_thread(scratch, comm_data, comm_at, k, t, blank, json):
    """A line's start up to its time into ``scratch``: ``comm tid `` (perf's
    widths), or as JSON ``{"comm":...,"tid":N,"time":``; its length."""
    if json:
        q = put_text(scratch, 0, '{"comm":')
        q = put_slice_over(scratch, q, comm_data, comm_at[k], comm_at[k + 1])
        q = put_text(scratch, q, ',"tid":')
    else:
        q = put_slice_over(scratch, 0, blank, 0, max(16 - (comm_at[k + 1] - comm_at[k]), 0))
        q = put_slice_over(scratch, q, comm_data, comm_at[k], comm_at[k + 1])
        scratch[q] = 32
        q += 1
    neg = t < 0
    mag = -t if neg else t
    if not json:
        q = put_spaces(scratch, q, 5 - digit_count(mag, 10) - (1 if neg else 0))
    if neg:
        scratch[q] = 45
        q += 1
    q = put_dec(scratch, q, mag)
    if json:
        return put_text(scratch, q, ',"time":')
    scratch[q] = 32
    return q + 1


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_time(scratch, w, blank, json, usec, event):
    """A line's time into ``scratch`` at ``_TIME_AT``: perf's seconds
    (nanoseconds, ``usec``: microseconds; ``-`` unknown), a colon, the
    text ``event`` and two spaces, or as JSON nanoseconds (null); its
    length."""
    if json:
        if w >= 0:
            q = put_dec(scratch, _TIME_AT, w)
        else:
            q = put_text(scratch, _TIME_AT, "null")
        return q - _TIME_AT
    if w >= 0:
        q = put_seconds_to(scratch, _TIME_AT, w, 5, 6 if usec else 9)
    else:
        q = put_slice_over(scratch, _TIME_AT, blank, 0, 11 if usec else 14)
        scratch[q] = 45
        q += 1
    scratch[q] = 58
    q = put_bytes(scratch, q + 1, event)
    q = put_text(scratch, q, "  ")
    return q - _TIME_AT


@aot.njit(cache=True, _nrt=False)
def _put_ptw_payload(out, p, value, with_ip, blank):
    """perf script's text of a PTWRITE's payload (perf's
    perf_sample__fprintf_synth_ptwrite): `` IP: 1 payload: 0x2a `` (C's
    ``%#x``: 0 without the prefix), the payload's bytes when they are
    printable ASCII up to its NULs, a blank, padded to 34 columns, then
    the blank before the address."""
    start = p
    p = put_text(out, p, " IP: ")
    out[p] = 49 if with_ip else 48
    p = put_text(out, p + 1, " payload: ")
    if value == 0:
        out[p] = 48
        p += 1
    else:
        p = put_text(out, p, "0x")
        p = put_hex(out, p, value, 0)
    out[p] = 32
    p += 1
    printable = True
    ended = False
    for j in range(8):
        c = (np.uint64(value) >> np.uint64(8 * j)) & np.uint64(0xFF)
        if c == 0:
            ended = True
        elif ended or c < 32 or c > 126:
            printable = False
    if printable:
        for j in range(8):
            c = (np.uint64(value) >> np.uint64(8 * j)) & np.uint64(0xFF)
            if c == 0:
                break
            out[p] = np.uint8(c)
            p += 1
    out[p] = 32
    p += 1
    if p - start < 34:
        p = put_slice_over(out, p, blank, 0, 34 - (p - start))
    out[p] = 32
    return p + 1


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_end(out, p, json):
    """A line's end: a newline, after a JSON object's brace."""
    if json:
        out[p] = 125
        p += 1
    out[p] = 10
    return p + 1


@aot.njit(cache=True, _nrt=False)
def _render(
    comm, tid, ns, ip, sym, off, ninsn, blocks, kind, payload,
    comm_data, comm_at, head_data, head_at, tail_data, tail_at, plain, blank,
    scratch, lo, hi, out, cap,
    use_rows, rows, rt_at, rt_len, rt_pool, rt_used, room, json, usec, event, ptw_perf,
    ptw_event,
):  # fmt: skip
    """Lines from ``lo`` (up to ``hi``) into ``out`` until ``cap`` bytes
    are written; returns the bytes written and the next line.  A line's
    thread columns and its time are what the line before had more often
    than not: they are formatted into ``scratch`` when they change and
    copied from there.  With ``use_rows``, the rest of an instruction's
    line depends only on its code-table row (``rows``): it is formatted
    once into the pool ``rt_pool`` (``rt_at``/``rt_len`` per row, -1: not
    yet; ``rt_used[0]`` bytes used; ``room``: the longest line) and
    copied from there while the pool has room.  ``json``: each line a
    JSON object (``comm``, ``tid``, ``time`` in ns or null, ``ip`` in hex
    as perf's JSON gives addresses, ``sym``, ``symoff`` where perf prints
    one, ``dso``; ``insns`` or ``ptwrite``), the names JSON-quoted in the
    byte tables; ``usec``: text times in microseconds (perf script's
    without ``--ns``); ``event``: text after a text time's colon (perf
    script's period and event name); ``ptw_event``: PTWRITEs' lines are
    perf script's, this text (perf's name of its PTWRITE event) in place
    of ``event`` and its payload before the address (empty: without
    ``event``, the address alone); ``ptw_perf`` false: hwtrace's own
    PTWRITE lines (`` ptwrite: 0xPAYLOAD`` after the address)."""
    p = 0
    i = lo
    last_comm = -1
    last_tid = np.int64(0)
    plen = 0
    last_ns = np.int64(-2)
    tlen = 0
    pool_end = rt_pool.shape[0] - _SLACK - room
    while i < hi and p < cap:
        k = comm[i]
        t = tid[i]
        if k != last_comm or t != last_tid:
            last_comm, last_tid = k, t
            plen = _put_thread(scratch, comm_data, comm_at, k, t, blank, json)
        p = put_slice_over(out, p, scratch, 0, plen)
        w = ns[i]
        if w != last_ns:
            last_ns = w
            tlen = _put_time(scratch, w, blank, json, usec, event)
        p = put_slice_over(out, p, scratch, _TIME_AT, _TIME_AT + tlen)
        if use_rows and kind[i] == 0:
            r = rows[i]
            at = rt_at[r]
            if at < 0 and rt_used[0] <= pool_end:
                at = rt_used[0]
                q = _put_place(rt_pool, at, ip[i], sym[i], off[i], head_data, head_at,
                               tail_data, tail_at, plain, blank, json)  # fmt: skip
                q = _put_end(rt_pool, q, json)
                rt_at[r] = at
                rt_len[r] = q - at
                rt_used[0] = q
            if at >= 0:
                p = put_slice_over(out, p, rt_pool, at, at + rt_len[r])
                i += 1
                continue
        if kind[i] != 0 and ptw_event.shape[0] and not json:
            # perf script's PTWRITE sample: its event's name in place of
            # the instructions', then perf's text of the payload (" IP: 1
            # payload: 0x2a " and the payload as text when it is
            # printable ASCII, padded to 34 columns) before the address.
            p -= event.shape[0] + 2
            p = put_bytes(out, p, ptw_event)
            p = _put_ptw_payload(out, p, payload[i], kind[i] == 1, blank)
        p = _put_place(out, p, ip[i], sym[i], off[i], head_data, head_at, tail_data, tail_at,
                       plain, blank, json)  # fmt: skip
        if kind[i] != 0 and (json or not ptw_perf):
            if json:
                p = put_text(out, p, ',"ptwrite":"0x')
                p = put_hex(out, p, payload[i], 0)
                out[p] = 34
                p += 1
            else:
                p = put_text(out, p, " ptwrite: 0x")
                p = put_hex(out, p, payload[i], 0)
        elif blocks:
            if json:
                p = put_text(out, p, ',"insns":')
                p = put_dec(out, p, ninsn[i])
            else:
                out[p] = 32
                p = put_dec(out, p + 1, ninsn[i])
                p = put_text(out, p, " insns")
        p = _put_end(out, p, json)
        i += 1
    return p, i


# Where in the scratch row the time's text goes (the thread's before it).
_TIME_AT = 256
_BLANK = np.full(COPY_SLACK * 2, 32, np.uint8)
_SLACK = COPY_SLACK
# The text of instructions' lines kept per code table (see _render).
_POOL_BYTES = 4 << 20
_NO_ROWS = np.zeros(1, np.int64)


class _RowText:
    """Instructions' line text by code-table row, for one code table."""

    def __init__(self, pool_bytes: int = _POOL_BYTES) -> None:
        self.at = np.zeros(0, np.int64)
        self.length = np.zeros(0, np.int64)
        self.pool = np.zeros(pool_bytes + _SLACK, np.uint8)
        self.used = np.zeros(1, np.int64)

    def cover(self, rows: int) -> None:
        if self.at.shape[0] < rows:
            at = np.full(max(rows, self.at.shape[0] * 3 // 2), -1, np.int64)
            at[: self.at.shape[0]] = self.at
            length = np.zeros(at.shape[0], np.int64)
            length[: self.length.shape[0]] = self.length
            self.at, self.length = at, length


class ListingWriter:
    """Writes listing rows to a binary stream (:meth:`write`) in chunks of
    about ``chunk`` bytes, keeping its buffers and the names' packed text
    from call to call."""

    def __init__(
        self, out: BinaryIO, chunk: int = 1 << 22, row_text_bytes: int = _POOL_BYTES,
        *, json: bool = False, usec: bool = False, event: str = "", ptwrite: str | None = None,
    ) -> None:  # fmt: skip
        self.out, self.chunk, self.row_text_bytes = out, chunk, row_text_bytes
        self.json = json
        self.usec = usec  # times in microseconds, as perf script prints them without --ns
        # (what perf script prints after the time by default: the period and
        # the event's name; for instructions' lines, one per instruction)
        self.event = np.frombuffer(event.encode(), np.uint8).copy()
        # PTWRITEs' lines: hwtrace's (None), or perf script's with perf's
        # name of its PTWRITE event in place of ``event``'s ("": the address
        # alone, as perf prints them with -F)
        self.ptw_perf = ptwrite is not None
        self.ptw_event = np.frombuffer((ptwrite or "").encode(), np.uint8).copy()
        self._scratch = np.zeros(_TIME_AT * 2 + COPY_SLACK + self.event.shape[0], np.uint8)
        self._names: tuple[int, int] = (-1, -1)
        self._buf = np.zeros(0, np.uint8)
        self._zeros = np.zeros(0, np.uint64)
        # (by code table, while the table lives: a decoder lets go of the
        # tables of code no longer run)
        self._row_text: WeakKeyDictionary[object, _RowText] = WeakKeyDictionary()
        self._no_text = _RowText(0)

    def write(self, rows) -> None:
        """Write :class:`~hwtrace.session.listing.ListingRows`."""
        for view in self.views(
            rows.comms, rows.comm, rows.tid, rows.ns, rows.ip, rows.names, rows.modules,
            rows.sym, rows.off, rows.ninsn, rows.kind, rows.payload, rows.plain,
            rows.code_row, rows.code,
        ):  # fmt: skip
            self.out.write(view)

    def views(
        self, comms, comm, tid, ns, ip, names, modules, sym, off, ninsn, kind, payload, plain,
        code_row=None, code=None,
    ) -> Iterator[memoryview]:  # fmt: skip
        """The text of the rows (as :func:`render_lines` takes them) in
        chunks, each a view valid until the next is asked for.  With
        ``code_row`` (each instruction's row in the code table ``code``,
        whose rows name one instruction each) an instruction's address and
        name are formatted once per row (and kept while ``code`` lives: it
        takes a weak reference)."""
        key = (id(names), len(names))
        if key != self._names:
            # Names only grow within a listing: packed again when they do.
            self._names = key
            self._plains = np.zeros(max(len(names), 1), np.uint8)
            if plain is not None:
                self._plains[: len(plain)] = plain
            if self.json:
                heads = [b',"sym":' + _quoted(n) for n in names]
                tails = [b',"dso":' + _quoted(m) for m in modules]
            else:
                heads = [_utf8(n) + (b"" if self._plains[k] else b"+0x")
                         for k, n in enumerate(names)]  # fmt: skip
                tails = [b" (" + _utf8(m) + b")" for m in modules]
            self._heads, self._tails = packed_strings(heads), packed_strings(tails)
        comm_data, comm_at = packed_strings(
            [_quoted(c) if self.json else _utf8(c[:16]) for c in comms]
        )
        head_data, head_at = self._heads
        tail_data, tail_at = self._tails
        width = (160 + self.event.shape[0] + self.ptw_event.shape[0]
                 + int(np.diff(head_at).max(initial=0))
                 + int(np.diff(tail_at).max(initial=0)))  # fmt: skip
        if self.json:
            width += 100 + int(np.diff(comm_at).max(initial=0))
        need = self.chunk + width + COPY_SLACK
        if self._buf.shape[0] < need:
            self._buf = np.empty(need, np.uint8)
        n = ip.shape[0]
        if self._zeros.shape[0] < max(n, 1):
            self._zeros = np.zeros(max(n, 1), np.uint64)
        blocks = ninsn is not None
        cols = (
            np.ascontiguousarray(comm, np.int64),
            np.ascontiguousarray(tid, np.int64),
            np.ascontiguousarray(ns, np.int64),
            np.ascontiguousarray(ip, np.uint64),
            np.ascontiguousarray(sym, np.int64),
            np.ascontiguousarray(off, np.int64),
            np.ascontiguousarray(ninsn if blocks else self._zeros[:1].view(np.int64), np.int64),
        )
        kinds = self._zeros.view(np.uint8) if kind is None else np.ascontiguousarray(kind, np.uint8)
        payloads = self._zeros if payload is None else np.ascontiguousarray(payload, np.uint64)
        out = self._buf
        view = memoryview(out)
        use_rows = code_row is not None and code is not None and not blocks and n > 0
        if use_rows:
            text = self._row_text.get(code)
            if text is None:
                text = self._row_text[code] = _RowText(self.row_text_bytes)
            rows = np.ascontiguousarray(code_row, np.int64)
            text.cover(int(rows.max()) + 1)
        else:
            text, rows = self._no_text, _NO_ROWS
        lo = 0
        while lo < n:
            m, lo = _render(
                *cols, blocks, kinds, payloads, comm_data, comm_at, head_data, head_at,
                tail_data, tail_at, self._plains, _BLANK, self._scratch, lo, n, out, self.chunk,
                use_rows, rows, text.at, text.length, text.pool, text.used, width, self.json,
                self.usec, self.event, self.ptw_perf, self.ptw_event,
            )  # fmt: skip
            yield view[:m]


def render_lines(
    comms: Sequence[str],
    comm: np.ndarray,
    tid: np.ndarray,
    ns: np.ndarray,
    ip: np.ndarray,
    names: Sequence[str],
    modules: Sequence[str],
    sym: np.ndarray,
    off: np.ndarray,
    ninsn: np.ndarray | None = None,
    *,
    kind: np.ndarray | None = None,
    payload: np.ndarray | None = None,
    plain: np.ndarray | None = None,
    chunk: int = 1 << 22,
    usec: bool = False,
) -> Iterator[bytes]:
    """The listing as byte chunks.  Per line: ``comm`` (index into
    ``comms``), ``tid``, ``ns`` (perf time, -1 unknown), ``ip``, ``sym``
    (index into ``names``/``modules``, -1: no file mapped there) and
    ``off`` (bytes into the symbol); a name whose ``plain`` entry is
    nonzero is printed without the offset (perf's ``[unknown]`` in a mapped
    file); ``ninsn`` per line makes it a block listing; a line whose
    ``kind`` is 1 is a PTWRITE of ``payload`` instead; ``usec``: times in
    microseconds."""
    writer = ListingWriter(None, chunk, usec=usec)  # type: ignore[arg-type]
    for view in writer.views(
        comms, comm, tid, ns, ip, names, modules, sym, off, ninsn, kind, payload, plain
    ):
        yield bytes(view)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def _quoted(text: str) -> bytes:
    """``text`` as a JSON string (ASCII, so any byte of a name is safe)."""
    return json.dumps(text).encode()


def write_listing(rows, out: BinaryIO) -> None:
    """Write listing rows (:class:`hwtrace.session.listing.ListingRows`)
    to the binary stream ``out`` (:class:`ListingWriter` keeps its buffers
    for the next)."""
    ListingWriter(out).write(rows)
