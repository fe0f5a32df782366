"""Compiled text writers: numbers and strings written into byte buffers.

hwtrace's listings (Intel ptdump and ptxed text, the packet listings,
``hwtrace script``, ``hwtrace filter``) are written by numba loops many
lines per call into a ``uint8`` buffer, so a large trace costs no Python
work per line.  The loops share these helpers.

Every writer takes the buffer ``out`` and the position ``p`` to write at
and returns the position after what it wrote; none checks bounds: callers
size ``out`` for the longest line they can write.

Names go into loops as *string tables* (:func:`string_table`,
:func:`string_list_table`): a 2-D ``uint8`` array with one row per string
and the row lengths, written with :func:`put_row`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from .. import aot
from ..aot import njit


def string_table(strings: Mapping[int, str], size: int) -> tuple[np.ndarray, np.ndarray]:
    """``strings`` (row -> text) as a table of ``size`` rows for
    :func:`put_row`: the UTF-8 bytes per row (undecodable characters
    replaced) and their lengths; rows not given are empty."""
    data = {k: s.encode("utf-8", "replace") for k, s in strings.items()}
    width = max((len(d) for d in data.values()), default=0) + 1
    tab = np.zeros((size, width), np.uint8)
    lens = np.zeros(size, np.int64)
    for k, d in data.items():
        tab[k, : len(d)] = np.frombuffer(d, np.uint8)
        lens[k] = len(d)
    return tab, lens


def string_list_table(strings: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """:func:`string_table` of a list, row ``k`` holding ``strings[k]``;
    one empty row when the list is empty (row 0 stays valid)."""
    return string_table(dict(enumerate(strings)), max(len(strings), 1))


def packed_strings(strings: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """``strings`` one after another in one ``uint8`` array with
    :data:`COPY_SLACK` bytes of room after them, and where each starts
    (``len(strings) + 1`` entries, the last the end): string ``k`` is
    ``data[start[k]:start[k + 1]]``, for :func:`put_slice_over`."""
    start = np.zeros(len(strings) + 1, np.int64)
    np.cumsum([len(x) for x in strings], out=start[1:])
    data = np.zeros(int(start[-1]) + COPY_SLACK, np.uint8)
    data[: start[-1]] = np.frombuffer(b"".join(strings), np.uint8)
    return data, start


def lines_in_chunks(
    write: Callable[[int, np.ndarray, int, np.ndarray], tuple[int, int]], n: int, line_max: int
) -> tuple[np.ndarray, np.ndarray]:
    """The text of ``n`` lines a compiled loop writes a chunk at a time,
    and where each line starts (``n + 1`` positions, the last the end).
    ``write(i, out, cap, starts)`` writes lines from ``i`` into ``out``
    until ``cap`` bytes are written (a line at most ``line_max`` bytes),
    setting ``starts[k]`` to where line ``i + k`` starts and
    ``starts[j - i]`` to the end; it returns the bytes written and the
    next line ``j``."""
    chunk = 1 << 20
    starts = np.empty(n + 1, np.int64)
    pieces: list[np.ndarray] = []
    done = i = 0
    while True:
        out = np.empty(chunk + line_max, np.uint8)
        p, j = write(i, out, chunk, starts[i:])
        starts[i : j + 1] += done
        pieces.append(out[:p])
        done += p
        i = j
        if i >= n:
            break
    return (pieces[0] if len(pieces) == 1 else np.concatenate(pieces)), starts


def reorder_lines(
    text: np.ndarray, starts: np.ndarray, ends: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The lines ``text[starts[k]:ends[k]]`` in the order ``order`` gives,
    as one text, and where each starts there (one more position, the
    end)."""
    lengths = (ends - starts)[order]
    new_starts = np.zeros(len(order) + 1, np.int64)
    np.cumsum(lengths, out=new_starts[1:])
    out = np.empty(int(new_starts[-1]), np.uint8)
    gather_lines(text, starts[order], ends[order], out)
    return out, new_starts


def put_text(out: np.ndarray, p: int, text: str) -> int:
    """The characters of ``text`` (a string constant of the loop; ASCII)."""
    for ch in text.encode():
        out[p] = ch
        p += 1
    return p


def _memcpy(dst: np.ndarray, at: int, src: np.ndarray, start: int, n: int) -> None:
    """``memcpy(&dst[at], &src[start], n)`` on two byte arrays (in loops
    a numba intrinsic, see :func:`_numba_extensions`)."""
    dst[at : at + n] = src[start : start + n]


# put_slice_over copies in chunks of this many bytes: the room it needs
# after what it reads and writes.
_CHUNK = 32
COPY_SLACK = _CHUNK


def _copy_chunks(dst: np.ndarray, at: int, src: np.ndarray, start: int, n: int) -> None:
    """Copy ``n`` bytes in whole ``_CHUNK``-byte pieces (in loops a numba
    intrinsic, see :func:`_numba_extensions`)."""
    m = -(-n // _CHUNK) * _CHUNK
    dst[at : at + m] = src[start : start + m]


def _leading_zeros(v: int) -> int:
    """The zero bits above a 64-bit value's highest one (64 for 0; in
    loops the processor's count, see :func:`_numba_extensions`)."""
    return 64 - int(v).bit_length()


def _numba_extensions() -> None:
    from numba import types
    from numba.core import cgutils
    from numba.core.errors import TypingError
    from numba.extending import intrinsic, overload

    @overload(put_text, inline="always", prefer_literal=True)
    def _put_text_compiled(out, p, text):
        # A constant string becomes a constant byte tuple at compile time:
        # no string object exists at run time, so callers need no NRT.
        if not isinstance(text, types.StringLiteral):
            raise TypingError("put_text takes a string constant")
        data = tuple(text.literal_value.encode())
        n = len(data)

        def impl(out, p, text):
            for j in range(n):
                out[p + j] = data[j]
            return p + n

        return impl

    def byte_copy(name, emit):
        """An intrinsic ``(dst, at, src, start, n)`` on two byte arrays whose
        code ``emit(builder, &dst[at], &src[start], n)`` writes."""

        def copy(typingctx, dst, at, src, start, n):
            sig = types.void(dst, types.intp, src, types.intp, types.intp)

            def codegen(context, builder, signature, args):
                d = context.make_array(signature.args[0])(context, builder, args[0])
                s = context.make_array(signature.args[2])(context, builder, args[2])
                dst_at = builder.gep(d.data, [args[1]])
                src_at = builder.gep(s.data, [args[3]])
                emit(builder, dst_at, src_at, args[4])

            return sig, codegen

        copy.__name__ = copy.__qualname__ = name
        return intrinsic(copy)

    def emit_memcpy(builder, dst, src, n):
        cgutils.raw_memcpy(builder, dst, src, n, 1)

    def emit_chunks(builder, dst, src, n):
        from llvmlite import ir

        chunk = ir.VectorType(ir.IntType(8), _CHUNK)
        width = ir.Constant(n.type, _CHUNK)
        count = builder.udiv(builder.add(n, ir.Constant(n.type, _CHUNK - 1)), width)
        with cgutils.for_range(builder, count) as loop:
            off = builder.mul(loop.index, width)
            src_chunk = builder.bitcast(builder.gep(src, [off]), chunk.as_pointer())
            dst_chunk = builder.bitcast(builder.gep(dst, [off]), chunk.as_pointer())
            builder.store(builder.load(src_chunk, align=1), dst_chunk, align=1)

    from numba.cpython.unsafe.numbers import leading_zeros

    globals()["_memcpy"] = byte_copy("memcpy", emit_memcpy)
    globals()["_copy_chunks"] = byte_copy("copy_chunks", emit_chunks)
    globals()["_leading_zeros"] = leading_zeros


aot.on_numba(_numba_extensions)


@njit(cache=True, _nrt=False)
def put_byte(out: np.ndarray, p: int, c: int) -> int:
    """One byte."""
    out[p] = c
    return p + 1


@njit(cache=True, inline="always", _nrt=False)
def put_slice(out: np.ndarray, p: int, src: np.ndarray, start: int, end: int) -> int:
    """``src[start:end]`` (one ``memcpy``, not a slice: slicing needs
    numba's reference counting, which the loops here do without)."""
    _memcpy(out, p, src, start, end - start)
    return p + (end - start)


@njit(cache=True, inline="always", _nrt=False)
def put_slice_over(out: np.ndarray, p: int, src: np.ndarray, start: int, end: int) -> int:
    """``src[start:end]`` copied in whole 32-byte pieces: up to 31 bytes
    past ``end`` are read and past the copy written (both arrays must have
    that much room), but there is no call and no branch on the length, which
    makes copying many short strings (ptxed's lines) several times faster
    than ``memcpy``."""
    _copy_chunks(out, p, src, start, end - start)
    return p + (end - start)


@njit(cache=True, _nrt=False)
def put_bytes(out: np.ndarray, p: int, piece: np.ndarray) -> int:
    """The bytes of a ``uint8`` array (cheaper for numba to compile than a
    long :func:`put_text` constant)."""
    for j in range(piece.shape[0]):
        out[p + j] = piece[j]
    return p + piece.shape[0]


@njit(cache=True, inline="always", _nrt=False)
def put_row(out: np.ndarray, p: int, tab: np.ndarray, lens: np.ndarray, k: int) -> int:
    """Row ``k`` of a string table."""
    for j in range(lens[k]):
        out[p] = tab[k, j]
        p += 1
    return p


_HEX_HIGH = np.uint64(0x0606060606060606)
_HEX_ONES = np.uint64(0x0101010101010101)
_HEX_ZERO = np.uint64(0x3030303030303030)
_HEX_LETTER = np.uint64(ord("a") - ord("0") - 10)


@njit(cache=True, inline="always", _nrt=False)
def _hex_chars(h):
    """The 8 hex digits of the 32-bit ``h`` as ASCII in one word, the least
    significant digit in the lowest byte (the nibbles spread to bytes by
    shifts and masks, then offset to '0'-'9' or 'a'-'f' without branches)."""
    x = np.uint64(h) & np.uint64(0xFFFFFFFF)
    x = ((x & np.uint64(0xFFFF0000)) << np.uint64(16)) | (x & np.uint64(0xFFFF))
    x = ((x & np.uint64(0x0000FF000000FF00)) << np.uint64(8)) | (x & np.uint64(0x000000FF000000FF))
    x = ((x & np.uint64(0x00F000F000F000F0)) << np.uint64(4)) | (x & np.uint64(0x000F000F000F000F))
    letters = ((x + _HEX_HIGH) >> np.uint64(4)) & _HEX_ONES
    return x + _HEX_ZERO + letters * _HEX_LETTER


@njit(cache=True, inline="always", _nrt=False)
def put_hex(out: np.ndarray, p: int, v: int, width: int) -> int:
    """``v`` as unsigned hex, lower case, zero-padded to ``width`` digits
    (C's ``%0*llx``; no ``0x``), without a loop per digit."""
    v = np.uint64(v)
    digits = (64 - np.int64(_leading_zeros(v)) + 3) // 4
    if digits < width:
        digits = width
    if digits == 0:
        digits = 1
    lo = _hex_chars(v)
    if digits > 8:
        hi = _hex_chars(v >> np.uint64(32))
        for j in range(digits - 8):
            out[p + j] = (hi >> np.uint64(8 * (digits - 9 - j))) & np.uint64(0xFF)
        p += digits - 8
        digits = 8
    for j in range(digits):
        out[p + j] = (lo >> np.uint64(8 * (digits - 1 - j))) & np.uint64(0xFF)
    return p + digits


@njit(cache=True, inline="always", _nrt=False)
def put_upper_hex(out: np.ndarray, p: int, v: int, width: int) -> int:
    """``v`` as upper-case hex (C's ``%0*llX``)."""
    q = put_hex(out, p, v, width)
    for j in range(p, q):
        if out[j] >= 97:
            out[j] -= 32
    return q


@njit(cache=True, inline="always", _nrt=False)
def put_updated_bits(out: np.ndarray, p: int, value: int, bits: int) -> int:
    """OpenCSD's `` ~[0xBITS]``: the low ``bits`` of an address or a
    timestamp, the bits a packet carried (its ETM and STM listings)."""
    mask = np.uint64(0xFFFFFFFFFFFFFFFF)
    if bits < 64:
        mask = (np.uint64(1) << np.uint64(bits)) - np.uint64(1)
    p = put_text(out, p, " ~[0x")
    p = put_upper_hex(out, p, np.uint64(value) & mask, 0)
    return put_text(out, p, "]")


@njit(cache=True, inline="always", _nrt=False)
def hex_digit_count(v: int) -> int:
    """Digits of ``v`` as unsigned hex (1 for 0)."""
    n = (64 - np.int64(_leading_zeros(np.uint64(v))) + 3) // 4
    return n if n > 0 else 1


@njit(cache=True, _nrt=False)
def put_dec(out: np.ndarray, p: int, v: int) -> int:
    """``v`` as unsigned decimal (C's ``%llu``)."""
    v = np.uint64(v)
    n = 1
    t = v // np.uint64(10)
    while t != 0:
        n += 1
        t //= np.uint64(10)
    for j in range(n - 1, -1, -1):
        out[p + j] = 48 + (v % np.uint64(10))
        v //= np.uint64(10)
    return p + n


@njit(cache=True, _nrt=False)
def put_signed(out: np.ndarray, p: int, v: int) -> int:
    """``v`` (int64) as signed decimal (C's ``%lld``)."""
    if v < 0:
        out[p] = 45
        return put_dec(out, p + 1, np.uint64(-(v + 1)) + np.uint64(1))
    return put_dec(out, p, v)


@njit(cache=True, inline="always", _nrt=False)
def digit_count(v: int, base: int) -> int:
    """Digits of the non-negative ``v`` in ``base``."""
    n = 1
    v //= base
    while v:
        n += 1
        v //= base
    return n


@njit(cache=True, inline="always", _nrt=False)
def put_spaces(out: np.ndarray, p: int, n: int) -> int:
    """``n`` blanks (none when ``n <= 0``)."""
    for _ in range(n):
        out[p] = 32
        p += 1
    return p


@njit(cache=True, inline="always", _nrt=False)
def put_seconds(out: np.ndarray, p: int, ns: int, width: int) -> int:
    """``ns`` (nanoseconds, >= 0) as seconds with nine decimals, the whole
    seconds right-aligned in ``width`` columns (C's ``%*llu.%09llu``)."""
    return put_seconds_to(out, p, ns, width, 9)


@njit(cache=True, _nrt=False)
def put_seconds_to(out: np.ndarray, p: int, ns: int, width: int, digits: int) -> int:
    """``ns`` (nanoseconds, >= 0) as seconds with ``digits`` decimals (the
    rest cut off, as perf's microseconds ``%*llu.%06llu``), the whole
    seconds right-aligned in ``width`` columns."""
    sec = ns // 1_000_000_000
    p = put_spaces(out, p, width - digit_count(sec, 10))
    p = put_dec(out, p, sec)
    out[p] = 46
    frac = ns % 1_000_000_000
    for _ in range(9 - digits):
        frac //= 10
    for j in range(digits, 0, -1):
        out[p + j] = 48 + frac % 10
        frac //= 10
    return p + 1 + digits


@njit(cache=True, _nrt=False)
def pad_to(out: np.ndarray, p: int, start: int, width: int) -> int:
    """Blanks after the bytes written since ``start`` up to ``width``
    columns (left-aligns them, C's ``%-*s``)."""
    while p - start < width:
        out[p] = 32
        p += 1
    return p


@njit(cache=True, _nrt=False)
def gather_lines(text: np.ndarray, starts: np.ndarray, ends: np.ndarray, out: np.ndarray) -> int:
    """``text[starts[k]:ends[k]]`` for every ``k``, one after another in
    ``out`` (lines of several listings merged in another order); returns
    the bytes written."""
    p = 0
    for k in range(starts.shape[0]):
        p = put_slice(out, p, text, starts[k], ends[k])
    return p


@njit(cache=True, _nrt=False)
def align_right(out: np.ndarray, p: int, start: int, width: int) -> int:
    """Right-align the bytes written since ``start`` in ``width`` columns
    (C's ``%*s``): they move right and blanks fill the gap."""
    n = p - start
    if n >= width:
        return p
    shift = width - n
    for j in range(n - 1, -1, -1):
        out[start + shift + j] = out[start + j]
    for j in range(shift):
        out[start + j] = 32
    return start + width


@njit(cache=True, _nrt=False)
def put_cstring(out: np.ndarray, p: int, src: np.ndarray, start: int, n: int, json: bool) -> int:
    """Bytes of ``src`` from ``start``, up to ``n`` of them or a NUL:
    JSON-escaped (quote, backslash, control bytes as ``\\u00XX``) or, for
    text, control bytes and DEL as ``.``."""
    for j in range(n):
        c = src[start + j]
        if c == 0:
            break
        if json:
            if c == 34 or c == 92:
                out[p] = 92
                out[p + 1] = c
                p += 2
            elif c < 32:
                out[p] = 92
                out[p + 1] = 117
                out[p + 2] = 48
                out[p + 3] = 48
                hi = c >> 4
                lo = c & 15
                out[p + 4] = 48 + hi
                out[p + 5] = (48 + lo) if lo < 10 else (87 + lo)
                p += 6
            else:
                out[p] = c
                p += 1
        else:
            out[p] = 46 if (c < 32 or c == 127) else c
            p += 1
    return p


__all__ = [
    "COPY_SLACK",
    "align_right",
    "digit_count",
    "hex_digit_count",
    "packed_strings",
    "pad_to",
    "put_byte",
    "put_bytes",
    "put_cstring",
    "put_dec",
    "put_hex",
    "put_row",
    "put_seconds",
    "put_signed",
    "put_slice_over",
    "put_spaces",
    "put_text",
    "put_updated_bits",
    "put_upper_hex",
    "string_list_table",
    "string_table",
]


# -- call paths in tables --------------------------------------------------------


def elide_paths(keys: Sequence[str], width: int, sep: str = ";", mark: str = "…") -> list[str]:
    """Call paths (``root;caller;callee``) shortened to ``width``
    characters for a table, in the middle: the root and the innermost
    frames stay (the leaf tells rows apart, and paths that share a root
    differ towards their leaves); the outer frames after the root go
    first, as few as need to, and the mark says how many went
    (``root;…(3);caller;leaf``), so paths of different depths stay apart.
    A single name too long is cut in its middle."""
    out = []
    for key in keys:
        frames = key.split(sep)
        if len(key) <= width or len(frames) < 3:
            out.append(key if len(key) <= width else _elide_name(key, width, mark))
            continue
        first = 1
        while True:
            text = sep.join([frames[0], f"{mark}({first - 1})", *frames[first:]])
            if len(text) <= width or first >= len(frames) - 1:
                break
            first += 1
        if len(text) > width:
            head = f"{frames[0]}{sep}{mark}({first - 1}){sep}"
            text = head + _elide_name(frames[-1], width - len(head), mark)
            if len(text) > width:
                text = _elide_name(frames[-1], width, mark)
        out.append(text)
    return out


def _elide_name(name: str, width: int, mark: str = "…") -> str:
    """``name`` cut in its middle to ``width`` characters (its end, which
    names the function, kept longer)."""
    if len(name) <= width:
        return name
    if width <= 1:
        return name[-max(width, 0) :]
    left = (width - 1) // 3
    return name[:left] + mark + name[len(name) - (width - 1 - left) :]


def fit_paths(
    keys: Sequence[str], headers: Sequence[str], rows: Sequence[Sequence[str]], total: int
) -> list[str]:
    """``keys`` (paths or names) shortened by :func:`elide_paths` to the
    width left for their column in a rich table ``total`` wide (no outer
    edge, padding of one either side) beside the other columns, whose
    ``headers`` and cells (``rows``) are given."""
    used = sum(max([len(h), *(len(r[j]) for r in rows)]) + 3 for j, h in enumerate(headers))
    return elide_paths(keys, max(total - used - 2, 24))
