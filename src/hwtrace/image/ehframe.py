"""Function bounds from ``.eh_frame_hdr``: names for stripped code.

A stripped program (most of a distribution's binaries) keeps no symbol for
its own functions, but it keeps their unwind tables: ``.eh_frame`` holds a
Frame Description Entry (FDE) per function, with the function's start and
length, and ``.eh_frame_hdr`` a table of the FDEs sorted by start, for the
unwinder's binary search.  Disassemblers recover functions from them (IDA,
Binary Ninja and angr name such a function ``sub_<address>``).  The
layouts are the Linux Standard Base's (Core specification, "Exception
Frames": ``.eh_frame_hdr``, CIE and FDE records) with the DWARF pointer
encodings (``DW_EH_PE_*``).

The table is read as numpy arrays: a program with 100,000 functions costs
a few gathers, not a loop over its records.  A table that cannot be read
(no header, an encoding other than the ones linkers write, a record out
of bounds) gives no functions: the file's symbols stand as they are.
"""

from __future__ import annotations

import numpy as np

from ..columns import distinct
from .elfheaders import ElfHeaders

__all__ = ["PT_GNU_EH_FRAME", "eh_frame_functions"]

PT_GNU_EH_FRAME = 0x6474E550
DW_EH_PE_OMIT = 0xFF
_ABSPTR, _ULEB, _UDATA2, _UDATA4, _UDATA8 = 0x00, 0x01, 0x02, 0x03, 0x04
_SDATA2, _SDATA4, _SDATA8 = 0x0A, 0x0B, 0x0C
_PCREL, _DATAREL = 0x10, 0x30
# The fixed-size value formats (low four bits): bytes and signedness.
_FORMATS = {_ABSPTR: (8, False), _UDATA2: (2, False), _UDATA4: (4, False),
            _UDATA8: (8, False), _SDATA2: (2, True), _SDATA4: (4, True),
            _SDATA8: (8, True)}  # fmt: skip


class _Malformed(Exception):
    pass


def _uleb(buf: np.ndarray, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= buf.shape[0] or shift > 63:
            raise _Malformed
        byte = int(buf[pos])
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fixed(buf: np.ndarray, pos: int, fmt: int) -> tuple[int, int]:
    """One value of fixed-size format ``fmt`` (little-endian) at ``pos``."""
    if fmt not in _FORMATS:
        raise _Malformed
    size, signed = _FORMATS[fmt]
    if pos + size > buf.shape[0]:
        raise _Malformed
    return int.from_bytes(bytes(buf[pos : pos + size]), "little", signed=signed), pos + size


def _pointer(buf: np.ndarray, pos: int, enc: int, here: int, data: int) -> tuple[int, int]:
    """A pointer encoded ``enc`` at file offset ``pos`` (link address
    ``here``), ``data``: the base of data-relative values."""
    value, end = _uleb(buf, pos) if enc & 0x0F == _ULEB else _fixed(buf, pos, enc & 0x0F)
    app = enc & 0x70
    if app == _PCREL:
        value += here
    elif app == _DATAREL:
        value += data
    elif app != 0:
        raise _Malformed
    return value % (1 << 64), end


def _gather(buf: np.ndarray, at: np.ndarray, fmt: int) -> np.ndarray:
    """Values of fixed-size format ``fmt`` at each file offset ``at`` (int64)."""
    size, signed = _FORMATS[fmt]
    if at.shape[0] and (int(at.min()) < 0 or int(at.max()) + size > buf.shape[0]):
        raise _Malformed
    raw = buf[at[:, None] + np.arange(size)].copy()
    return raw.view(f"<{'i' if signed else 'u'}{size}").reshape(-1).astype(np.int64)


def _cie_range_format(buf: np.ndarray, pos: int) -> int:
    """The value format of the FDE addresses of the CIE at file offset
    ``pos`` (its augmentation's ``R``; absolute 8-byte pointers without)."""
    length, p = _fixed(buf, pos, _UDATA4)
    if length == 0xFFFFFFFF:
        p += 8  # (a 64-bit length)
    p += 4  # CIE id
    version, p = int(buf[p]) if p < buf.shape[0] else -1, p + 1
    if version not in (1, 3):
        raise _Malformed
    end = p
    while end < buf.shape[0] and buf[end]:
        end += 1
    augmentation = bytes(buf[p:end])
    p = end + 1
    if not augmentation.startswith(b"z"):
        return _ABSPTR
    _, p = _uleb(buf, p)  # code alignment
    _, p = _uleb(buf, p)  # data alignment (its sign does not matter here)
    p = p + 1 if version == 1 else _uleb(buf, p)[1]  # return address register
    _, p = _uleb(buf, p)  # augmentation data length
    for letter in augmentation[1:]:
        if letter == ord("R"):
            return int(buf[p]) & 0x0F if p < buf.shape[0] else -1
        if letter == ord("L"):
            p += 1
        elif letter == ord("P"):
            enc = int(buf[p])
            _, p = _pointer(buf, p + 1, enc, 0, 0)
        elif letter not in (ord("S"), ord("B")):
            raise _Malformed
    return _ABSPTR


def eh_frame_functions(head: ElfHeaders) -> tuple[np.ndarray, np.ndarray]:
    """The ``(start, size)`` (uint64 link addresses, sorted by start) of
    the functions ``.eh_frame_hdr``'s search table lists, each FDE's
    ``pc_begin`` and ``pc_range``; empty arrays when the file has no such
    table or it cannot be read."""
    empty = np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    if not head.little or head.elfclass != 64:
        return empty
    try:
        return _functions(head)
    except (_Malformed, IndexError, ValueError, OverflowError):
        return empty


def _segments(head: ElfHeaders) -> list[tuple[int, int, int]]:
    """``(vaddr, offset, filesz)`` of the file's loadable segments."""
    ph = head.program_headers
    return [(int(p["p_vaddr"]), int(p["p_offset"]), int(p["p_filesz"])) for p in ph
            if int(p["p_type"]) == 1 and int(p["p_filesz"])]  # fmt: skip


def _offsets(segments: list[tuple[int, int, int]], address: np.ndarray) -> np.ndarray:
    """The file offset of each link address (int64; -1 where no segment
    has file bytes there)."""
    out = np.full(address.shape[0], -1, np.int64)
    for vaddr, offset, size in segments:
        inside = (address >= vaddr) & (address < vaddr + size)
        out[inside] = address[inside] - vaddr + offset
    return out


def _functions(head: ElfHeaders) -> tuple[np.ndarray, np.ndarray]:
    buf = head.buf
    index = head.section_index(".eh_frame_hdr")
    if index >= 0:
        sh = head.section_headers[index]
        hdr_addr, hdr_off = int(sh["sh_addr"]), int(sh["sh_offset"])
    else:
        found = [p for p in head.program_headers if int(p["p_type"]) == PT_GNU_EH_FRAME]
        if not found:
            raise _Malformed
        hdr_addr, hdr_off = int(found[0]["p_vaddr"]), int(found[0]["p_offset"])
    if hdr_off + 4 > buf.shape[0] or int(buf[hdr_off]) != 1:
        raise _Malformed
    frame_enc, count_enc, table_enc = (int(b) for b in buf[hdr_off + 1 : hdr_off + 4])
    if count_enc == DW_EH_PE_OMIT or table_enc == DW_EH_PE_OMIT:
        raise _Malformed  # (no search table: the unwinder walks .eh_frame)
    pos = hdr_off + 4
    _, pos = _pointer(buf, pos, frame_enc, hdr_addr + (pos - hdr_off), hdr_addr)
    count, pos = _pointer(buf, pos, count_enc, hdr_addr + (pos - hdr_off), hdr_addr)
    fmt, app = table_enc & 0x0F, table_enc & 0x70
    if fmt not in _FORMATS or app not in (0, _DATAREL) or count > buf.shape[0]:
        raise _Malformed
    size = _FORMATS[fmt][0]
    table_at = pos + np.arange(2 * count, dtype=np.int64) * size
    values = _gather(buf, table_at, fmt).reshape(count, 2)
    base = hdr_addr if app == _DATAREL else 0
    start = values[:, 0] + base
    fde_addr = values[:, 1] + base
    segments = _segments(head)
    fde = _offsets(segments, fde_addr)
    if count == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    if (fde < 0).any():
        raise _Malformed
    # Each FDE: length (4 bytes; 0xffffffff: 8 more), the distance back to
    # its CIE (4), pc_begin, pc_range in the CIE's format.
    length = _gather(buf, fde, _UDATA4)
    wide = length == 0xFFFFFFFF
    field = fde + 4 + np.where(wide, 8, 0)
    cie = field - _gather(buf, field, _UDATA4)
    cies = distinct(cie)
    fmt_of = np.array([_cie_range_format(buf, c) for c in cies.tolist()], np.int64)
    fmt_each = fmt_of[np.searchsorted(cies, cie)]
    sizes = np.zeros(count, np.int64)
    for f in distinct(fmt_each).tolist():
        if f not in _FORMATS:
            raise _Malformed
        sel = fmt_each == f
        width = _FORMATS[f][0]
        sizes[sel] = _gather(buf, field[sel] + 4 + width, f)
    keep = sizes > 0
    order = np.argsort(start[keep], kind="stable")
    return (start[keep][order].astype(np.uint64), sizes[keep][order].astype(np.uint64))
