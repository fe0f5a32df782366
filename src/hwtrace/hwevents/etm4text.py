"""ETMv4/ETE packets listed as OpenCSD's ``trc_pkt_lister`` lists them,
written by one compiled loop into a byte buffer.

The lines are :func:`hwtrace.hwevents.etm4.etm4_dump_lines`'s (the same
text, byte for byte); a capture of a few hundred thousand packets is
listed without Python work per packet.  :func:`etm4_listing` returns the
text and where each line starts, so that the lines of several sources can
be merged by their indices (:mod:`hwtrace.session.coresight`).
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ..textout import (
    lines_in_chunks,
    put_dec,
    put_hex,
    put_row,
    put_signed,
    put_text,
    put_updated_bits,
    put_upper_hex,
    string_table,
)
from .etm4 import _EXCEPTIONS, _NAMES, E_ASYNC, E_CFG, _header_name
from .etm4 import Etm4Kind as K

AOT_ENTRIES = ("_format_lines",)

# The packet kinds as plain integers, for the loop.
_TRACE_INFO, _TIMESTAMP, _EXCEPT, _ITE = (
    int(K.TRACE_INFO),
    int(K.TIMESTAMP),
    int(K.EXCEPT),
    int(K.ITE),
)
_CCNT_F1, _CCNT_F3, _COMMIT = int(K.CCNT_F1), int(K.CCNT_F3), int(K.COMMIT)
_CANCEL_F1, _CANCEL_F1_MISPRED = int(K.CANCEL_F1), int(K.CANCEL_F1_MISPRED)
_MISPREDICT, _CANCEL_F2, _CANCEL_F3 = int(K.MISPREDICT), int(K.CANCEL_F2), int(K.CANCEL_F3)
_CTXT, _Q, _ADDR_MATCH, _SRC_ADDR_MATCH = (
    int(K.CTXT),
    int(K.Q),
    int(K.ADDR_MATCH),
    int(K.SRC_ADDR_MATCH),
)
_ADDR_CTXT_FIRST, _ADDR_CTXT_LAST = int(K.ADDR_CTXT_L_32IS0), int(K.ADDR_CTXT_L_64IS1)
_ADDR_S_IS0, _ADDR_S_IS1 = int(K.ADDR_S_IS0), int(K.ADDR_S_IS1)
_SRC_ADDR_S_IS0, _SRC_ADDR_S_IS1 = int(K.SRC_ADDR_S_IS0), int(K.SRC_ADDR_S_IS1)
_ADDR_LAST, _ATOM_FIRST, _ATOM_LAST = int(K.SRC_ADDR_L_64IS1), int(K.ATOM_F1), int(K.ATOM_F6)
_RESERVED, _BAD_SEQUENCE = int(K.RESERVED), int(K.BAD_SEQUENCE)
_INCOMPLETE_EOT = int(K.INCOMPLETE_EOT)
# Rows of the name table past the kinds: a header reserved for the
# configuration; a header byte's packet name (256 rows, then I_ASYNC).
_ROW_CFG = 128
_ROW_HEADER = 129
_ROW_HEADER_ASYNC = _ROW_HEADER + 256
_ROWS = _ROW_HEADER_ASYNC + 1
# The longest line the loop writes (names, two addresses, a context).
_LINE_MAX = 512


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_context(out, p, fl, el, context, vmid):
    if not fl & 4:
        return put_text(out, p, "Ctxt: Same")
    p = put_text(out, p, "Ctxt: ")
    if fl & 32:
        p = put_text(out, p, "AArch64,")
    else:
        p = put_text(out, p, "AArch32, ")
    p = put_text(out, p, "EL")
    p = put_dec(out, p, el)
    if fl & 64:
        p = put_text(out, p, ", NS; ")
    else:
        p = put_text(out, p, ", S; ")
    if fl & 8:
        p = put_text(out, p, "CID=0x")
        p = put_hex(out, p, context, 8)
        p = put_text(out, p, "; ")
    if fl & 16:
        p = put_text(out, p, "VMID=0x")
        p = put_hex(out, p, vmid, 4)
        p = put_text(out, p, "; ")
    return p


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_atoms(out, p, bits, n):
    bits = np.int64(bits)
    for j in range(n):
        out[p] = 69 if (bits >> j) & 1 else 78  # E, N
        p += 1
    return p


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_count(out, p, v):
    """A signed decimal in brackets: ``(v)``."""
    out[p] = 40
    p = put_signed(out, p + 1, v)
    out[p] = 41
    return p + 1


@aot.njit(cache=True, _nrt=False)
def _format_lines(
    offset, kind, address, atoms, natoms, cc, ts, context, vmid, el, flags, event, info,
    payload, names, name_lens, exceptions, exception_lens, head, head_len, ete, e_cfg,
    e_async, lo, hi, out, cap, starts,
):  # fmt: skip
    """Lines of packets ``lo``.. (up to ``hi``) into ``out`` until ``cap``
    bytes are written; ``starts[i - lo]`` is where packet ``i``'s line
    starts.  Returns the bytes written and the next packet."""
    p = 0
    i = lo
    while i < hi and p < cap:
        starts[i - lo] = p
        k = np.int64(kind[i])
        p = put_text(out, p, "Idx:")
        p = put_signed(out, p, offset[i])
        p = put_row(out, p, head, head_len, 0)
        cfg_reserved = k == _RESERVED and event[i] == e_cfg
        p = put_row(out, p, names, name_lens, _ROW_CFG if cfg_reserved else k)
        a = address[i]
        if k == _TRACE_INFO:
            v = info[i]
            p = put_text(out, p, "; INFO=0x")
            p = put_hex(out, p, v, 0)
            p = put_text(out, p, " { CC.")
            p = put_dec(out, p, v & 1)
            if ete:
                p = put_text(out, p, ", TSTATE.")
                p = put_dec(out, p, (v >> 6) & 1)
            p = put_text(out, p, " }")
            if v & 1:
                p = put_text(out, p, "; CC_THRESHOLD=0x")
                p = put_hex(out, p, cc[i], 0)
        elif k == _TIMESTAMP:
            p = put_text(out, p, "; Updated val = 0x")
            p = put_hex(out, p, ts[i], 0)
            if cc[i] >= 0:
                p = put_text(out, p, "; CC=0x")
                p = put_hex(out, p, cc[i], 0)
        elif _CCNT_F1 <= k <= _CCNT_F3:
            p = put_text(out, p, "; Count=0x")
            p = put_hex(out, p, cc[i], 0)
        elif k == _EXCEPT:
            et = info[i]
            p = put_text(out, p, ";  ")
            if 0 <= et < 16:
                p = put_row(out, p, exceptions, exception_lens, et)
            else:
                p = put_text(out, p, "Reserved")
            p = put_text(out, p, ";")
            if payload[i] == 1:
                p = put_text(out, p, " Ret Addr Follows;")
            elif payload[i] == 2:
                p = put_text(out, p, " Ret Addr Follows, Match Prev;")
        elif k == _COMMIT:
            p = put_text(out, p, "; Commit")
            p = _put_count(out, p, info[i])
        elif k == _CANCEL_F1 or k == _CANCEL_F1_MISPRED:
            p = put_text(out, p, "; Cancel")
            p = _put_count(out, p, info[i])
            if k == _CANCEL_F1_MISPRED:
                p = put_text(out, p, ", Mispredict")
        elif k == _MISPREDICT or k == _CANCEL_F2 or k == _CANCEL_F3:
            p = put_text(out, p, "; ")
            if natoms[i]:
                p = put_text(out, p, "Atom: ")
                p = _put_atoms(out, p, atoms[i], natoms[i])
                p = put_text(out, p, ", ")
            if k != _MISPREDICT:
                p = put_text(out, p, "Cancel")
                p = _put_count(out, p, info[i])
                p = put_text(out, p, ", ")
            p = put_text(out, p, "Mispredict")
        elif _ATOM_FIRST <= k <= _ATOM_LAST:
            p = put_text(out, p, "; ")
            p = _put_atoms(out, p, atoms[i], natoms[i])
        elif k == _CTXT:
            p = put_text(out, p, "; ")
            p = _put_context(out, p, flags[i], el[i], context[i], vmid[i])
        elif k == _ADDR_MATCH or k == _SRC_ADDR_MATCH:
            p = put_text(out, p, ", [")
            p = put_signed(out, p, info[i])
            p = put_text(out, p, "]; Addr=0x")
            p = put_upper_hex(out, p, a, 16)
            p = put_text(out, p, "; ")
        elif k == _ADDR_S_IS0 or k == _ADDR_S_IS1 or k == _SRC_ADDR_S_IS0 or k == _SRC_ADDR_S_IS1:
            p = put_text(out, p, "; Addr=0x")
            p = put_upper_hex(out, p, a, 16)
            p = put_updated_bits(out, p, a, flags[i] & 0x1F)
        elif _ADDR_CTXT_FIRST <= k <= _ADDR_LAST:
            p = put_text(out, p, "; Addr=0x")
            p = put_upper_hex(out, p, a, 16)
            p = put_text(out, p, "; ")
            if k <= _ADDR_CTXT_LAST:
                p = _put_context(out, p, flags[i], el[i], context[i], vmid[i])
        elif k == _ITE:
            p = put_text(out, p, "; EL")
            p = put_signed(out, p, info[i])
            p = put_text(out, p, "; Payload=0x")
            p = put_upper_hex(out, p, payload[i], 0)
        elif k == _BAD_SEQUENCE:
            if event[i] == e_async:
                p = put_text(out, p, "[I_ASYNC]")
            else:
                p = put_text(out, p, "[I_EXTENSION]")
        elif k == _INCOMPLETE_EOT or cfg_reserved:
            h = info[i] & 0xFF
            row = _ROW_HEADER + h
            if k == _INCOMPLETE_EOT and h == 0 and payload[i] != 0:
                row = _ROW_HEADER_ASYNC
            out[p] = 91
            p = put_row(out, p + 1, names, name_lens, row)
            out[p] = 93
            p += 1
        elif k == _Q:
            qt = payload[i]
            if qt == 0xF:
                p = put_text(out, p, "; Count(Unknown)")
            else:
                p = put_text(out, p, "; Count")
                p = _put_count(out, p, info[i])
            if qt <= 2:
                p = put_text(out, p, "; [")
                p = put_dec(out, p, qt)
                p = put_text(out, p, "]")
            if qt <= 2 or qt == 5 or qt == 6 or qt == 0xA or qt == 0xB:
                p = put_text(out, p, "; Addr=0x")
                p = put_upper_hex(out, p, a, 16)
                if natoms[i]:
                    p = put_updated_bits(out, p, a, natoms[i])
        out[p] = 10
        p += 1
        i += 1
    starts[i - lo] = p
    return p, i


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    rows: dict[int, str] = {}
    for k, (name, desc) in _NAMES.items():
        rows[_ROW_CFG if k == -E_CFG else int(k)] = f"{name} : {desc}"
    for k in range(128):
        rows.setdefault(k, "I_UNKNOWN : ")
    for h in range(256):
        rows[_ROW_HEADER + h] = _header_name(h)
    rows[_ROW_HEADER_ASYNC] = _header_name(0, True)
    names, name_lens = string_table(rows, _ROWS)
    exceptions, exception_lens = string_table(dict(enumerate(_EXCEPTIONS)), len(_EXCEPTIONS))
    return names, name_lens, exceptions, exception_lens


_TABLES: tuple[np.ndarray, ...] | None = None


def etm4_listing(packets, trace_id: int = 0, *, ete: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Every packet's ``trc_pkt_lister`` line (see
    :func:`hwtrace.hwevents.etm4.etm4_dump_lines`) as one ``uint8`` text
    and where each line starts (``len(packets) + 1`` positions, the last
    the text's end)."""
    global _TABLES
    if _TABLES is None:
        _TABLES = _tables()
    names, name_lens, exceptions, exception_lens = _TABLES
    head, head_len = string_table({0: f"; ID:{trace_id:x};\t"}, 1)
    n = len(packets)
    cols = (
        np.ascontiguousarray(packets.offset, np.int64), packets.kind, packets.address,
        packets.atoms, packets.natoms, packets.cc, packets.ts, packets.context, packets.vmid,
        packets.el, packets.flags, packets.event, packets.info, packets.payload,
    )  # fmt: skip
    return lines_in_chunks(
        lambda i, out, cap, starts: _format_lines(
            *cols, names, name_lens, exceptions, exception_lens, head, head_len, ete, E_CFG,
            E_ASYNC, i, n, out, cap, starts,
        ),
        n, _LINE_MAX,
    )  # fmt: skip
