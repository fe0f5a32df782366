"""``hwtrace script``'s listing: one line per instruction or block, as
``perf script --itrace=i0ns --ns -F comm,tid,time,ip,sym,symoff,dso``
prints it, written by a compiled loop.

A line is ``comm tid seconds.nanoseconds:  ip symbol+0xoff (module)``
(perf's widths: 16, 5, 5 and 16; ``[unknown] (module)`` where no symbol
covers the address, ``[unknown] ([unknown])`` where no file is mapped),
with `` N insns`` appended per block; a PTWRITE payload in the flow is a
line of its own at its place, ending ``ptwrite: 0xPAYLOAD`` (as ``perf
script --itrace=w`` lists them).  Names go into the loop as byte tables
(one row per distinct comm, symbol name and module), so listing millions of
instructions does no Python work per line.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import BinaryIO

import numpy as np

from .. import aot
from . import (
    COPY_SLACK,
    digit_count,
    hex_digit_count,
    packed_strings,
    put_dec,
    put_hex,
    put_seconds,
    put_slice_over,
    put_spaces,
    put_text,
)


@aot.njit(cache=True, _nrt=False)
def _render(
    comm, tid, ns, ip, sym, off, ninsn, blocks, kind, payload,
    comm_data, comm_at, head_data, head_at, tail_data, tail_at, plain, blank,
    scratch, lo, hi, out, cap,
):  # fmt: skip
    """Lines from ``lo`` (up to ``hi``) into ``out`` until ``cap`` bytes
    are written; returns the bytes written and the next line.  A line's
    thread columns and its time are what the line before had more often
    than not: they are formatted into ``scratch`` when they change and
    copied from there."""
    p = 0
    i = lo
    last_comm = -1
    last_tid = np.int64(0)
    plen = 0
    last_ns = np.int64(-2)
    tlen = 0
    while i < hi and p < cap:
        k = comm[i]
        t = tid[i]
        if k != last_comm or t != last_tid:
            last_comm, last_tid = k, t
            q = put_slice_over(scratch, 0, blank, 0, max(16 - (comm_at[k + 1] - comm_at[k]), 0))
            q = put_slice_over(scratch, q, comm_data, comm_at[k], comm_at[k + 1])
            scratch[q] = 32
            q += 1
            neg = t < 0
            mag = -t if neg else t
            q = put_spaces(scratch, q, 5 - digit_count(mag, 10) - (1 if neg else 0))
            if neg:
                scratch[q] = 45
                q += 1
            q = put_dec(scratch, q, mag)
            scratch[q] = 32
            plen = q + 1
        p = put_slice_over(out, p, scratch, 0, plen)
        w = ns[i]
        if w != last_ns:
            last_ns = w
            if w >= 0:
                q = put_seconds(scratch, _TIME_AT, w, 5)
            else:
                q = put_slice_over(scratch, _TIME_AT, blank, 0, 14)
                scratch[q] = 45
                q += 1
            q = put_text(scratch, q, ":  ")
            tlen = q - _TIME_AT
        p = put_slice_over(out, p, scratch, _TIME_AT, _TIME_AT + tlen)
        a = np.uint64(ip[i])
        p = put_slice_over(out, p, blank, 0, 16 - hex_digit_count(a))
        p = put_hex(out, p, a, 0)
        out[p] = 32
        p += 1
        s = sym[i]
        if s < 0:
            p = put_text(out, p, "[unknown] ([unknown])")
        else:
            p = put_slice_over(out, p, head_data, head_at[s], head_at[s + 1])
            if plain[s] == 0:
                p = put_hex(out, p, off[i], 0)
            p = put_slice_over(out, p, tail_data, tail_at[s], tail_at[s + 1])
        if kind[i] == 1:
            p = put_text(out, p, " ptwrite: 0x")
            p = put_hex(out, p, payload[i], 0)
        elif blocks:
            out[p] = 32
            p = put_dec(out, p + 1, ninsn[i])
            p = put_text(out, p, " insns")
        out[p] = 10
        p += 1
        i += 1
    return p, i


# Where in the scratch row the time's text goes (the thread's before it).
_TIME_AT = 64
_BLANK = np.full(COPY_SLACK * 2, 32, np.uint8)


class ListingWriter:
    """Writes listing rows to a binary stream (:meth:`write`) in chunks of
    about ``chunk`` bytes, keeping its buffers and the names' packed text
    from call to call."""

    def __init__(self, out: BinaryIO, chunk: int = 1 << 22) -> None:
        self.out, self.chunk = out, chunk
        self._names: tuple[int, int] = (-1, -1)
        self._buf = np.zeros(0, np.uint8)
        self._scratch = np.zeros(_TIME_AT * 2 + COPY_SLACK, np.uint8)
        self._zeros = np.zeros(0, np.uint64)

    def write(self, rows) -> None:
        """Write :class:`~hwtrace.session.listing.ListingRows`."""
        for view in self.views(
            rows.comms, rows.comm, rows.tid, rows.ns, rows.ip, rows.names, rows.modules,
            rows.sym, rows.off, rows.ninsn, rows.kind, rows.payload, rows.plain,
        ):  # fmt: skip
            self.out.write(view)

    def views(
        self, comms, comm, tid, ns, ip, names, modules, sym, off, ninsn, kind, payload, plain
    ) -> Iterator[memoryview]:
        """The text of the rows (as :func:`render_lines` takes them) in
        chunks, each a view valid until the next is asked for."""
        key = (id(names), len(names))
        if key != self._names:
            # Names only grow within a listing: packed again when they do.
            self._names = key
            self._plains = np.zeros(max(len(names), 1), np.uint8)
            if plain is not None:
                self._plains[: len(plain)] = plain
            heads = [_utf8(n) + (b"" if self._plains[k] else b"+0x") for k, n in enumerate(names)]
            self._heads = packed_strings(heads)
            self._tails = packed_strings([b" (" + _utf8(m) + b")" for m in modules])
        comm_data, comm_at = packed_strings([_utf8(c[:16]) for c in comms])
        head_data, head_at = self._heads
        tail_data, tail_at = self._tails
        width = 120 + int(np.diff(head_at).max(initial=0)) + int(np.diff(tail_at).max(initial=0))
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
        lo = 0
        while lo < n:
            m, lo = _render(
                *cols, blocks, kinds, payloads, comm_data, comm_at, head_data, head_at,
                tail_data, tail_at, self._plains, _BLANK, self._scratch, lo, n, out, self.chunk,
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
) -> Iterator[bytes]:
    """The listing as byte chunks.  Per line: ``comm`` (index into
    ``comms``), ``tid``, ``ns`` (perf time, -1 unknown), ``ip``, ``sym``
    (index into ``names``/``modules``, -1: no file mapped there) and
    ``off`` (bytes into the symbol); a name whose ``plain`` entry is
    nonzero is printed without the offset (perf's ``[unknown]`` in a mapped
    file); ``ninsn`` per line makes it a block listing; a line whose
    ``kind`` is 1 is a PTWRITE of ``payload`` instead."""
    writer = ListingWriter(None, chunk)  # type: ignore[arg-type]
    for view in writer.views(
        comms, comm, tid, ns, ip, names, modules, sym, off, ninsn, kind, payload, plain
    ):
        yield bytes(view)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "replace")


def write_listing(rows, out: BinaryIO) -> None:
    """Write listing rows (:class:`hwtrace.session.listing.ListingRows`)
    to the binary stream ``out`` (:class:`ListingWriter` keeps its buffers
    for the next)."""
    ListingWriter(out).write(rows)
