"""Packet listings besides ptdump's text: JSON lines and a human format.

Both are written by one compiled loop, many packets per call, so listing a
large trace costs no Python work per packet.  Field names come from
:data:`hwtrace.pt.packets.FIELD_NAMES`, the same names the Python packet view
uses, so a JSON row equals ``Packet.to_dict()`` plus ``time`` (the estimated
TSC) when time is tracked and known.

The human format puts one packet on a line: offset, kind, named fields (IPs,
CR3 and other addresses in hex, counts in decimal, TNT bits as ``T``/``N`` in
execution order) and the estimated TSC (``time``) when time is tracked.  With
``color=True`` kinds are coloured by family (control flow, timing, sync) with
ANSI escapes.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from .. import aot
from ..textout import pad_to, put_dec, put_hex, put_row, put_text, string_table
from .kinds import ERROR_TEXT, KIND_NAMES, DecodeError, Kind
from .packets import FIELD_NAMES, PacketTable
from .timing import TimeColumns

# Fields shown in hex in the human format; JSON always writes integers.
_HEX_FIELDS = {"ip", "cr3", "base", "payload", "tsc", "bits", "trbv", "hints"}

# ANSI colour per kind family (0: none).
_CONTROL = (Kind.TNT8, Kind.TNT64, Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.FUP)
_TIMING = (Kind.TSC, Kind.MTC, Kind.TMA, Kind.CYC, Kind.CBR)
_SYNC = (Kind.PSB, Kind.PSBEND, Kind.OVF, Kind.PAD)
_COLOR_CODES = {1: "\x1b[32m", 2: "\x1b[36m", 3: "\x1b[2m", 4: "\x1b[33m"}
_RESET = "\x1b[0m"


def _field_tables():
    names: dict[int, str] = {}
    is_hex = np.zeros((64, 3), np.uint8)
    for kind, cols in FIELD_NAMES.items():
        for j, name in enumerate(cols):
            if name:
                names[int(kind) * 3 + j] = name
                is_hex[int(kind), j] = name in _HEX_FIELDS
    names.setdefault(0, "")
    tab, lens = string_table(names, 64 * 3)
    return tab, lens, is_hex


_FIELD_TAB, _FIELD_LEN, _FIELD_HEX = _field_tables()
_KIND_TAB, _KIND_LEN = string_table(KIND_NAMES, 64)
_ERRTXT_TAB, _ERRTXT_LEN = string_table({int(k): v for k, v in ERROR_TEXT.items()}, 8)
_FAMILY = np.zeros(64, np.uint8)
for _k in _CONTROL:
    _FAMILY[int(_k)] = 1
for _k in _TIMING:
    _FAMILY[int(_k)] = 2
for _k in _SYNC:
    _FAMILY[int(_k)] = 3
_FAMILY[int(Kind.INVALID)] = 4
_COLOR_TAB, _COLOR_LEN = string_table({0: "", **_COLOR_CODES, 5: _RESET}, 8)
_TNT_KINDS = (int(Kind.TNT8), int(Kind.TNT64))

JSON, HUMAN = 0, 1


@aot.njit(cache=True)
def _error_line(out, p, style, offset, code, txt_tab, txt_len):
    if style == 0:
        p = put_text(out, p, '{"offset":')
        p = put_dec(out, p, offset)
        p = put_text(out, p, ',"error":"')
        p = put_row(out, p, txt_tab, txt_len, code)
        return put_text(out, p, '"}\n')
    p = put_hex(out, p, offset, 16)
    p = put_text(out, p, "  error: ")
    p = put_row(out, p, txt_tab, txt_len, code)
    return put_text(out, p, ", resynchronised at the next PSB\n")


@aot.njit(cache=True)
def render_loop(
    offset, kind, size, a, b, c, lo, hi,
    err_at, err_off, err_code, e,
    tsc, have_tsc, style, color, tabs, out,
):  # fmt: skip
    """Write packets ``lo..hi`` (and the errors before them) into ``out``.

    Returns the bytes written and the index of the next unprinted error.
    """
    kind_tab, kind_len, field_tab, field_len, field_hex, txt_tab, txt_len = tabs[:7]
    family, color_tab, color_len = tabs[7:]
    tnt8, tnt64 = 4, 5
    p = 0
    for i in range(lo, hi):
        while e < err_at.shape[0] and err_at[e] <= i:
            p = _error_line(out, p, style, err_off[e], err_code[e], txt_tab, txt_len)
            e += 1
        k = kind[i]
        cols = (np.uint64(a[i]), np.uint64(b[i]), np.uint64(c[i]))
        if style == 0:
            p = put_text(out, p, '{"offset":')
            p = put_dec(out, p, offset[i])
            p = put_text(out, p, ',"size":')
            p = put_dec(out, p, size[i])
            p = put_text(out, p, ',"kind":"')
            p = put_row(out, p, kind_tab, kind_len, k)
            out[p] = 34
            p += 1
            for j in range(3):
                f = k * 3 + j
                if field_len[f] == 0:
                    continue
                p = put_text(out, p, ',"')
                p = put_row(out, p, field_tab, field_len, f)
                p = put_text(out, p, '":')
                p = put_dec(out, p, cols[j])
            if have_tsc[i]:
                p = put_text(out, p, ',"time":')
                p = put_dec(out, p, tsc[i])
            p = put_text(out, p, "}\n")
            continue
        p = put_hex(out, p, offset[i], 16)
        p = put_text(out, p, "  ")
        start = p
        fam = family[k]
        if color and fam != 0:
            p = put_row(out, p, color_tab, color_len, fam)
        p = put_row(out, p, kind_tab, kind_len, k)
        if color and fam != 0:
            p = put_row(out, p, color_tab, color_len, 5)
            start += color_len[fam] + color_len[5]
        p = pad_to(out, p, start, 10)
        for j in range(3):
            f = k * 3 + j
            if field_len[f] == 0:
                continue
            out[p] = 32
            p += 1
            if (k == tnt8 or k == tnt64) and j == 0:
                # Oldest branch first: bit nbits-1 of the payload.
                nbits = b[i]
                for t in range(nbits - 1, -1, -1):
                    taken = (cols[0] >> np.uint64(t)) & np.uint64(1)
                    out[p] = 84 if taken else 78
                    p += 1
                continue
            p = put_row(out, p, field_tab, field_len, f)
            out[p] = 61
            p += 1
            if field_hex[k, j]:
                p = put_text(out, p, "0x")
                p = put_hex(out, p, cols[j], 0)
            else:
                p = put_dec(out, p, cols[j])
        if have_tsc[i]:
            p = put_text(out, p, "  time=0x")
            p = put_hex(out, p, tsc[i], 0)
        while out[p - 1] == 32:
            p -= 1
        out[p] = 10
        p += 1
    if hi == kind.shape[0]:
        while e < err_at.shape[0]:
            p = _error_line(out, p, style, err_off[e], err_code[e], txt_tab, txt_len)
            e += 1
    return p, e


_TABS = (
    _KIND_TAB,
    _KIND_LEN,
    _FIELD_TAB,
    _FIELD_LEN,
    _FIELD_HEX,
    _ERRTXT_TAB,
    _ERRTXT_LEN,
    _FAMILY,
    _COLOR_TAB,
    _COLOR_LEN,
)
_BATCH = 1 << 16
_LINE_MAX = 384  # a TNT-64 in the human format is the longest line


def _render(
    table: PacketTable, times: TimeColumns | None, style: int, color: bool = False
) -> Iterator[bytes]:
    n = len(table)
    if times is None:
        tsc = np.zeros(n, np.uint64)
        have_tsc = np.zeros(n, np.bool_)
    else:
        tsc, have_tsc = times.tsc, times.have_tsc
    err_at = np.ascontiguousarray(table.err_index, np.int64)
    err_off = np.ascontiguousarray(table.err_offset, np.int64)
    err_code = np.ascontiguousarray(table.err_code, np.int64)
    e = 0
    lo = 0
    while True:
        hi = min(n, lo + _BATCH)
        out = np.empty(_LINE_MAX * (hi - lo + 1) + 128 * len(err_at), np.uint8)
        size, e = render_loop(
            table.offset, table.kind, table.size, table.a, table.b, table.c, lo, hi,
            err_at, err_off, err_code, e, tsc, have_tsc, style, color, _TABS, out,
        )  # fmt: skip
        yield out[:size].tobytes()
        if hi >= n:
            return
        lo = hi


def json_lines(table: PacketTable, times: TimeColumns | None = None) -> Iterator[bytes]:
    """One JSON object a line per packet (and per decode error), in byte blocks."""
    return _render(table, times, JSON)


def human_lines(
    table: PacketTable, times: TimeColumns | None = None, color: bool = False
) -> Iterator[bytes]:
    """The human listing of ``table`` in byte blocks (see the module doc)."""
    return _render(table, times, HUMAN, color)


__all__ = ["DecodeError", "human_lines", "json_lines"]
