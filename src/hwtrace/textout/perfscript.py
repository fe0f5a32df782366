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
    digit_count,
    put_dec,
    put_hex,
    put_row,
    put_seconds,
    put_spaces,
    put_text,
    string_list_table,
)


@aot.njit(cache=True)
def _render(
    comm, tid, ns, ip, sym, off, ninsn, blocks, kind, payload,
    comm_tab, comm_len, name_tab, name_len, mod_tab, mod_len, plain,
    lo, hi, out,
):  # fmt: skip
    """Lines ``lo..hi`` into ``out``; returns the bytes written."""
    p = 0
    for i in range(lo, hi):
        k = comm[i]
        p = put_spaces(out, p, 16 - comm_len[k])
        p = put_row(out, p, comm_tab, comm_len, k)
        out[p] = 32
        p += 1
        t = tid[i]
        neg = t < 0
        mag = -t if neg else t
        p = put_spaces(out, p, 5 - digit_count(mag, 10) - (1 if neg else 0))
        if neg:
            out[p] = 45
            p += 1
        p = put_dec(out, p, mag)
        out[p] = 32
        p += 1
        if ns[i] >= 0:
            p = put_seconds(out, p, ns[i], 5)
        else:
            p = put_spaces(out, p, 14)
            out[p] = 45
            p += 1
        p = put_text(out, p, ":  ")
        a = np.uint64(ip[i])
        n = 1
        q = a >> np.uint64(4)
        while q != 0:
            n += 1
            q >>= np.uint64(4)
        p = put_spaces(out, p, 16 - n)
        p = put_hex(out, p, a, 0)
        out[p] = 32
        p += 1
        s = sym[i]
        if s < 0:
            p = put_text(out, p, "[unknown] ([unknown])")
        else:
            p = put_row(out, p, name_tab, name_len, s)
            if plain[s] == 0:
                p = put_text(out, p, "+0x")
                p = put_hex(out, p, off[i], 0)
            p = put_text(out, p, " (")
            p = put_row(out, p, mod_tab, mod_len, s)
            out[p] = 41
            p += 1
        if kind[i] == 1:
            p = put_text(out, p, " ptwrite: 0x")
            p = put_hex(out, p, payload[i], 0)
        elif blocks:
            out[p] = 32
            p = put_dec(out, p + 1, ninsn[i])
            p = put_text(out, p, " insns")
        out[p] = 10
        p += 1
    return p


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
    chunk: int = 1 << 16,
) -> Iterator[bytes]:
    """The listing as byte chunks.  Per line: ``comm`` (index into
    ``comms``), ``tid``, ``ns`` (perf time, -1 unknown), ``ip``, ``sym``
    (index into ``names``/``modules``, -1: no file mapped there) and
    ``off`` (bytes into the symbol); a name whose ``plain`` entry is
    nonzero is printed without the offset (perf's ``[unknown]`` in a mapped
    file); ``ninsn`` per line makes it a block listing; a line whose
    ``kind`` is 1 is a PTWRITE of ``payload`` instead."""
    comm_tab, comm_len = string_list_table([c[:16] for c in comms])
    name_tab, name_len = string_list_table(names)
    mod_tab, mod_len = string_list_table(modules)
    plains = np.zeros(max(len(names), 1), np.uint8) if plain is None else plain.astype(np.uint8)
    blocks = ninsn is not None
    counts = ninsn if ninsn is not None else np.zeros(1, np.int64)
    width = 120 + int(name_len.max(initial=0)) + int(mod_len.max(initial=0))
    out = np.empty(chunk * width, np.uint8)
    cols = (
        np.ascontiguousarray(comm, np.int64),
        np.ascontiguousarray(tid, np.int64),
        np.ascontiguousarray(ns, np.int64),
        np.ascontiguousarray(ip, np.uint64),
        np.ascontiguousarray(sym, np.int64),
        np.ascontiguousarray(off, np.int64),
        np.ascontiguousarray(counts, np.int64),
    )
    n = ip.shape[0]
    kinds = np.zeros(n, np.uint8) if kind is None else np.ascontiguousarray(kind, np.uint8)
    payloads = (
        np.zeros(n, np.uint64) if payload is None else np.ascontiguousarray(payload, np.uint64)
    )
    for lo in range(0, ip.shape[0], chunk):
        hi = min(lo + chunk, ip.shape[0])
        n = _render(
            *cols,
            blocks,
            kinds,
            payloads,
            comm_tab,
            comm_len,
            name_tab,
            name_len,
            mod_tab,
            mod_len,
            plains,
            lo,
            hi,
            out,
        )
        yield out[:n].tobytes()


def write_listing(rows, out: BinaryIO) -> None:
    """Write listing rows (:class:`hwtrace.session.listing.ListingRows`)
    to the binary stream ``out``."""
    for chunk in render_lines(
        rows.comms, rows.comm, rows.tid, rows.ns, rows.ip, rows.names, rows.modules,
        rows.sym, rows.off, rows.ninsn, kind=rows.kind, payload=rows.payload, plain=rows.plain,
    ):  # fmt: skip
        out.write(chunk)
