"""Compiled encoders of Parquet data pages (Apache Parquet "Encodings"):
PLAIN, RLE_DICTIONARY (dictionary indices in the RLE/bit-packing hybrid),
DELTA_BINARY_PACKED, PLAIN booleans, and the definition levels of an
optional column (the hybrid on one bit, after a four-byte length, as data
pages of format version 1 have them).

Every encoder writes one page's body into ``out`` from its start and
returns its length; values are integer or boolean arrays (uint64 as the
int64 of its bits).  Which values are null is a rule on the value (``null``:
:data:`NOT_NULL`, :data:`NULL_IF_NEGATIVE`, :data:`NULL_IF_ZERO`), so no
mask is built.  Each encoder also keeps the column chunk's statistics in
``state`` (:data:`ST_VALUES` ...): the page's values are added to the
chunk's count, nulls, minimum and maximum (compared unsigned when
``unsigned``).
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ..columns import SequencedKeys
from ..pt.blocks import OFF_FAR, next_offset_change

NOT_NULL = 0
NULL_IF_NEGATIVE = 1
NULL_IF_ZERO = 2

# A column chunk's state (int64[ST_SIZE]).
ST_VALUES = 0  # values (rows) so far, nulls included
ST_NULLS = 1
ST_MIN = 2  # (bits; meaningful once ST_SEEN)
ST_MAX = 3
ST_SEEN = 4  # non-null values so far
ST_DICT = 5  # dictionary entries
ST_SIZE = 8

#: entries a column chunk's dictionary holds at most; a page that would
#: add more is written PLAIN instead (and the chunk's later pages too)
DICT_LIMIT = 1 << 16
#: slots of a dictionary's hash table (a power of two, twice the limit)
DICT_SLOTS = DICT_LIMIT * 2
#: slots a dictionary's hash table starts with (it grows fourfold when half
#: full, up to DICT_SLOTS: a column of few values probes a table in L1)
DICT_SLOTS_MIN = 1 << 10
#: encode_dictionary's answer when the table wants more slots
GROW = -2
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # (Fibonacci hashing: Knuth, TAOCP 6.4)


_SIGN = np.int64(-(1 << 63))


@aot.njit(cache=True, nogil=True, _nrt=False)
def _put_le(out, pos, v, nbytes):
    """``v``'s low ``nbytes`` bytes at ``pos``, little-endian; the position after."""
    u = np.uint64(v)
    for b in range(nbytes):
        out[pos + b] = np.uint8((u >> np.uint64(8 * b)) & np.uint64(0xFF))
    return pos + nbytes


@aot.njit(cache=True, nogil=True, _nrt=False)
def _put_u64(out, pos, v):
    """``v``'s eight bytes at ``pos``, little-endian; the position after.
    (LLVM merges the byte stores into one unaligned store; a uint64 view
    of a slice pays numba's checks of the view at every call.)"""
    u = np.uint64(v)
    at = np.uint64(pos)  # (unsigned: no check for a negative index)
    for b in range(8):
        out[at + np.uint64(b)] = np.uint8((u >> np.uint64(8 * b)) & np.uint64(0xFF))
    return pos + 8


@aot.njit(cache=True, nogil=True, _nrt=False)
def _uvarint(out, pos, v):
    v = np.uint64(v)
    while v >= np.uint64(0x80):
        out[pos] = np.uint8((v & np.uint64(0x7F)) | np.uint64(0x80))
        v >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(v)
    return pos + 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def _zigzag(out, pos, v):
    v = np.int64(v)
    z = np.uint64(v << np.int64(1)) ^ np.uint64(v >> np.int64(63))
    return _uvarint(out, pos, z)


@aot.njit(cache=True, nogil=True, _nrt=False)
def _bit_length(u):
    # (halving steps: a delta miniblock asks for every 32 values)
    u = np.uint64(u)
    b = 0
    for step in (32, 16, 8, 4, 2, 1):
        if u >> np.uint64(step):
            u >>= np.uint64(step)
            b += step
    return b + (1 if u else 0)


@aot.njit(cache=True, nogil=True, _nrt=False)
def _shift(slots):
    """The right shift that leaves a hash's top bits as a slot of ``slots``
    (a power of two of them): a value's slot is its hash's top bits."""
    return np.uint64(64 - _bit_length(slots.shape[0] - 1))


@aot.njit(cache=True, nogil=True, _nrt=False)
def _is_null(v, null):
    if null == NULL_IF_NEGATIVE:
        return v < 0
    if null == NULL_IF_ZERO:
        return v == 0
    return False


@aot.njit(cache=True, nogil=True, _nrt=False)
def _pack(out, pos, values, start, stop, count, width, base):
    """``count`` values ``values[start:] - base`` (zeros past ``stop``),
    each in ``width`` bits, least significant bit first; ``count * width``
    is a multiple of 8.  Returns the position after them."""
    if width == 0:
        return pos
    acc = np.uint64(0)
    nb = 0
    w = np.uint64(width)
    src = values[start:stop]  # (indexed from a range: no negative-index checks)
    have = src.shape[0]
    for t in range(count):
        x = np.uint64(src[t] - base) if t < have else np.uint64(0)
        acc |= x << np.uint64(nb)
        nb += width
        if nb >= 64:
            pos = _put_u64(out, pos, acc)
            nb -= 64
            # (the bits of x that did not fit; none when it ended exactly)
            acc = (x >> (w - np.uint64(nb))) if nb > 0 else np.uint64(0)
    while nb > 0:
        out[pos] = np.uint8(acc & np.uint64(0xFF))
        acc >>= np.uint64(8)
        nb -= 8
        pos += 1
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _rle_run(out, pos, count, value, width):
    """An RLE run of the hybrid: ``count`` times ``value`` (``width`` bits)."""
    pos = _uvarint(out, pos, count << 1)
    return _put_le(out, pos, value, (width + 7) // 8)


@aot.njit(cache=True, nogil=True, _nrt=False)
def _load_bytes(values, at):
    """Eight of the byte ``values`` from ``at`` as a little-endian word
    (LLVM makes the eight loads one)."""
    a = np.uint64(at)  # (unsigned: no check for a negative index)
    word = np.uint64(0)
    for b in range(8):
        word |= np.uint64(values[a + np.uint64(b)]) << np.uint64(8 * b)
    return word


@aot.njit(cache=True, nogil=True, _nrt=False)
def _squeeze(word, width):
    """A word of eight bytes, each below ``2**width`` (``width`` at most
    8), as eight ``width``-bit fields, the first lowest: bit-packed as the
    hybrid packs a group, in three steps (pairs, quads, the two halves)
    instead of a shift a value."""
    w = np.uint64(width)
    word = (word & np.uint64(0x00FF00FF00FF00FF)) | (
        (word & np.uint64(0xFF00FF00FF00FF00)) >> (np.uint64(8) - w)
    )
    word = (word & np.uint64(0x0000FFFF0000FFFF)) | (
        (word & np.uint64(0xFFFF0000FFFF0000)) >> (np.uint64(16) - np.uint64(2) * w)
    )
    return (word & np.uint64(0x00000000FFFFFFFF)) | (
        (word & np.uint64(0xFFFFFFFF00000000)) >> (np.uint64(32) - np.uint64(4) * w))  # fmt: skip


@aot.njit(cache=True, nogil=True, _nrt=False)
def _pack_groups(out, pos, values, groups, width):
    """``groups`` groups of eight of ``values`` (``width`` at most 8 bits
    each) bit-packed: a group is ``width`` bytes, made in one word (byte
    values: read as one word and packed by :func:`_squeeze`)."""
    if values.itemsize == 1:
        for g in range(groups):
            _put_u64(out, pos, _squeeze(_load_bytes(values, 8 * g), width))
            pos += width  # (the word's bytes past ``width`` are written over next)
        return pos
    w = np.uint64(width)
    for g in range(groups):
        group = values[8 * g : 8 * g + 8]
        acc = np.uint64(0)
        for t in range(8):
            acc |= np.uint64(group[t]) << (w * np.uint64(t))
        _put_u64(out, pos, acc)  # (its bytes past ``width`` are overwritten next)
        pos += width
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _pack_groups_wide(out, pos, values, groups, width):
    """:func:`_pack_groups` of values of 9 to 16 bits: a group is
    ``width`` bytes, made in two words (the dictionary indices of a chunk
    of more than 256 distinct blocks).  Pairs, then quads, then the two
    halves, as :func:`_squeeze` joins bytes: no shift that depends on a
    value's place in the group, no branch a value."""
    w = np.uint64(width)
    w2 = w + w
    w4 = w2 + w2  # (36 to 64: the second half starts in the low word)
    for g in range(groups):
        group = values[8 * g : 8 * g + 8]
        p0 = np.uint64(group[0]) | (np.uint64(group[1]) << w)
        p1 = np.uint64(group[2]) | (np.uint64(group[3]) << w)
        p2 = np.uint64(group[4]) | (np.uint64(group[5]) << w)
        p3 = np.uint64(group[6]) | (np.uint64(group[7]) << w)
        q0 = p0 | (p1 << w2)
        q1 = p2 | (p3 << w2)
        if width == 16:
            lo, hi = q0, q1  # (a shift by 64 is undefined in LLVM: kept apart)
        else:
            lo = q0 | (q1 << w4)
            hi = q1 >> (np.uint64(64) - w4)
        _put_u64(out, pos, lo)
        _put_u64(out, pos + 8, hi)  # (its bytes past ``width`` are overwritten next)
        pos += width
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _pack_groups_of(out, pos, values, groups, width, base):
    """:func:`_pack_groups` of ``values - base``: a miniblock of small
    deltas, eight of them shifted independently into a word (not one
    after another into an accumulator, a dependency chain a value)."""
    w = np.uint64(width)
    for g in range(groups):
        group = values[8 * g : 8 * g + 8]
        acc = np.uint64(0)
        for t in range(8):
            acc |= np.uint64(group[t] - base) << (w * np.uint64(t))
        _put_u64(out, pos, acc)
        pos += width
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _hybrid(out, pos, values, n, width):
    """``values[:n]`` in the RLE/bit-packing hybrid: runs of eight or more
    equal values as RLE runs, the rest in bit-packed runs of groups of
    eight (the last one padded with zeros).  ``out`` has eight bytes to
    spare past the encoding."""
    i = 0
    while i < n:
        rest = values[i:n]  # (indexed from ranges: no negative-index checks)
        v = rest[0]
        j = 1
        if values.itemsize == 1:
            # (byte values: a run's length found eight at a time, as one word)
            same = np.uint64(v) * np.uint64(0x0101010101010101)
            while j + 8 <= rest.shape[0] and _load_bytes(rest, j) == same:
                j += 8
        while j < rest.shape[0] and rest[j] == v:
            j += 1
        if j >= 8:
            pos = _rle_run(out, pos, j, v, width)
            i += j
            continue
        # A packed run, until a run of eight equal values starts a group
        # (a group's seven comparisons made without a branch each; eight
        # byte values compared as one word with their first repeated).
        m = rest.shape[0]
        k = 8
        found = False
        while k + 8 <= m:
            if values.itemsize == 1:
                word = _load_bytes(rest, k)
                same = word == (word & np.uint64(0xFF)) * np.uint64(0x0101010101010101)
            else:
                g = rest[k : k + 8]
                g0 = g[0]
                differ = (g[1] ^ g0) | (g[2] ^ g0) | (g[3] ^ g0) | (g[4] ^ g0)
                differ |= (g[5] ^ g0) | (g[6] ^ g0) | (g[7] ^ g0)
                same = differ == 0
            if same:
                found = True
                break
            k += 8
        groups = k // 8 if found else (m + 7) // 8
        pos = _packed_run(out, pos, rest, groups, width)
        i += 8 * groups
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _packed_run(out, pos, rest, groups, width):
    """A bit-packed run of the hybrid: ``groups`` groups of eight of
    ``rest`` (zeros past its end)."""
    pos = _uvarint(out, pos, (groups << 1) | 1)
    full = min(groups, rest.shape[0] // 8)
    if width <= 8:
        pos = _pack_groups(out, pos, rest, full, width)
    elif width <= 16:
        pos = _pack_groups_wide(out, pos, rest, full, width)
    else:
        return _pack(out, pos, rest, 0, rest.shape[0], 8 * groups, width, 0)
    return _pack(out, pos, rest, 8 * full, rest.shape[0], 8 * (groups - full), width, 0)


@aot.njit(cache=True, nogil=True, _nrt=False)
def _levels(out, values, n, null, state, levels):
    """The definition levels of ``values[:n]`` (a four-byte length, then
    the hybrid on one bit) at the start of ``out``; nulls counted into
    ``state``.  Returns the position after them."""
    nulls = 0
    # (a loop per rule, without branches: vectorised)
    if null == NULL_IF_NEGATIVE:
        for i in range(n):
            nulls += values[i] < 0
    elif null == NULL_IF_ZERO:
        for i in range(n):
            nulls += values[i] == 0
    if nulls == 0:
        pos = _rle_run(out, 4, n, 1, 1)
    else:
        for i in range(n):
            levels[i] = 0 if _is_null(values[i], null) else 1
        pos = _hybrid(out, 4, levels, n, 1)
    _put_le(out, 0, pos - 4, 4)
    state[ST_VALUES] += n
    state[ST_NULLS] += nulls
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _see(state, v, unsigned):
    if state[ST_SEEN] == 0:
        state[ST_MIN] = v
        state[ST_MAX] = v
    else:
        key = v ^ _SIGN if unsigned else v
        lo = state[ST_MIN] ^ _SIGN if unsigned else state[ST_MIN]
        hi = state[ST_MAX] ^ _SIGN if unsigned else state[ST_MAX]
        if key < lo:
            state[ST_MIN] = v
        if key > hi:
            state[ST_MAX] = v
    state[ST_SEEN] += 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def _merge(state, lo, hi, count):
    """Signed minimum ``lo`` and maximum ``hi`` of ``count`` more values."""
    if count == 0:
        return
    if state[ST_SEEN] == 0 or lo < state[ST_MIN]:
        state[ST_MIN] = lo
    if state[ST_SEEN] == 0 or hi > state[ST_MAX]:
        state[ST_MAX] = hi
    state[ST_SEEN] += count


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_plain(values, n, null, unsigned, width, state, levels, out):
    """A PLAIN page of ``values[:n]`` (``width``: 4 or 8 bytes a value)."""
    pos = _levels(out, values, n, null, state, levels)
    for i in range(n):
        v = values[i]
        if _is_null(v, null):
            continue
        _see(state, v, unsigned)
        pos = _put_le(out, pos, v, width)
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_booleans(values, n, state, levels, out):
    """A PLAIN page of booleans ``values[:n]`` (0 or 1; never null)."""
    pos = _levels(out, values, n, 0, state, levels)
    # A byte of eight rows at a time (shifts of independent rows, no chain
    # through an accumulator); the statistics from whether any row was
    # set and any clear.
    src = values[:n]  # (indexed from a range: no negative-index checks)
    full = n // 8
    ones = np.uint8(0)
    zeros = np.uint8(0)
    # (bytes read as bytes: eight of numba's booleans are eight loads)
    raw = values.view(np.uint8)
    for g in range(full):
        if values.itemsize == 1 and _load_bytes(raw, 8 * g) == 0:
            # (eight clear rows at once: a gap column is nearly all clear)
            out[pos + g] = 0
            zeros = np.uint8(0xFF)
            continue
        group = src[8 * g : 8 * g + 8]
        byte = np.uint8(0)
        for t in range(8):
            byte |= np.uint8(group[t] != 0) << np.uint8(t)
        out[pos + g] = byte
        ones |= byte
        zeros |= byte ^ np.uint8(0xFF)
    pos += full
    if n > 8 * full:
        byte = np.uint8(0)
        for t in range(n - 8 * full):
            bit = np.uint8(src[8 * full + t] != 0)
            byte |= bit << np.uint8(t)
            ones |= bit
            zeros |= np.uint8(1) - bit
        out[pos] = byte
        pos += 1
    _merge(state, 0 if zeros != 0 else 1, 1 if ones != 0 else 0, n)
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_boolean_run(value, n, state, out):
    """:func:`encode_booleans`' page, byte for byte, of ``n`` rows of
    ``value``: whole bytes of its bit, without a row looked at."""
    pos = _rle_run(out, 4, n, 1, 1)
    _put_le(out, 0, pos - 4, 4)
    state[ST_VALUES] += n
    if n == 0:
        return pos
    bit = 1 if value else 0
    _see(state, bit, False)
    state[ST_SEEN] += n - 1
    full = np.uint8(0xFF if bit else 0)
    for b in range(n // 8):
        out[pos + b] = full
    pos += n // 8
    if n % 8:
        out[pos] = np.uint8(((1 << (n % 8)) - 1) if bit else 0)
        pos += 1
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def _dictionary_index(v, keys, slots, shift, entries, count):
    """The index of ``v`` in a dictionary of ``count`` entries, added
    (index ``count``) if new; -1 when it is new and the dictionary full,
    :data:`GROW` when it is new and the table half full."""
    mask = slots.shape[0] - 1
    s = np.int64((np.uint64(v) * _GOLDEN) >> shift)
    while True:
        k = slots[s]
        if k < 0:
            if count >= entries.shape[0]:
                return -1
            if 2 * (count + 1) > slots.shape[0] and slots.shape[0] < DICT_SLOTS:
                # (the caller gives more slots, places the entries before
                # this page and asks again)
                return GROW
            slots[s] = count
            keys[s] = v
            entries[count] = v
            return count
        if keys[s] == v:
            return k
        s = (s + 1) & mask


@aot.njit(cache=True, nogil=True, _nrt=False)
def _index_width(count):
    """Bits of an index into a dictionary of ``count`` entries (at least 1)."""
    return max(_bit_length(count - 1), 1) if count > 1 else 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_dictionary(values, n, null, unsigned, state, keys, slots, entries, indices, levels,
                      out):  # fmt: skip
    """An RLE_DICTIONARY page of ``values[:n]``: each non-null value's
    index in the column chunk's dictionary (``entries``, in the order first
    seen; ``keys``/``slots`` its hash table, slot -1: empty), a byte of bit
    width, then the indices in the hybrid.  Returns -1 when the page would
    take the dictionary past its size (the page is then written PLAIN; the
    entries it added stay in the dictionary, unused), :data:`GROW` when the
    table is half full (give it four times the slots, place the dictionary's
    entries, :func:`place_entries`, and ask again)."""
    before = state[ST_DICT]
    count = before
    shift = _shift(slots)
    m = 0
    last = np.int64(0)
    start = 0
    if n > 0 and (null == NOT_NULL or not _is_null(values[0], null)):
        # A page of one value (a queue's, a thread's): its index once,
        # then a comparison a row (or'ed a stretch at a time: vectorised).
        v0 = values[0]
        differ = values[0] ^ v0
        for lo in range(0, n, 4096):
            stretch = values[lo : min(lo + 4096, n)]
            for t in range(stretch.shape[0]):
                differ |= stretch[t] ^ v0
            if differ != 0:
                break
        if differ == 0:
            start = n
            m = n
            last = v0
    for i in range(start, n):
        v = values[i]
        if null != NOT_NULL and _is_null(v, null):
            continue
        # The usual case first: a value already in the table, at its slot
        # (unsigned: no negative-index check).
        slot = (np.uint64(v) * _GOLDEN) >> shift
        k = slots[slot]
        if k >= 0 and keys[slot] == v:
            indices[m] = k
            m += 1
            continue
        index = _dictionary_index(v, keys, slots, shift, entries, count)
        if index == -1:
            # Full: the page goes PLAIN; what it added stays unused.
            state[ST_DICT] = count
            return -1
        if index == GROW:
            return GROW
        if index == count:
            count += 1
        indices[m] = index
        m += 1
    if start == n and n > 0:
        index = _dictionary_index(last, keys, slots, shift, entries, count)
        if index < 0:
            state[ST_DICT] = count
            return index
        if index == count:
            count += 1
        pos = _levels(out, values, n, null, state, levels)
        if index == count - 1 and count > before:
            _see(state, last, unsigned)
            state[ST_SEEN] += n - 1
        else:
            state[ST_SEEN] += n
        state[ST_DICT] = count
        width = _index_width(count)
        out[pos] = width
        return _rle_run(out, pos + 1, n, index, width)
    pos = _levels(out, values, n, null, state, levels)
    for e in range(before, count):
        _see(state, entries[e], unsigned)
    state[ST_SEEN] += m - (count - before)
    state[ST_DICT] = count
    width = _index_width(count)
    out[pos] = width
    return _hybrid(out, pos + 1, indices, m, width)


@aot.njit(cache=True, inline="always", _nrt=False)
def _delta_header(out, pos, m, first):
    """DELTA_BINARY_PACKED's header: blocks of 128 in four miniblocks, ``m``
    values, the first ``first``.  Returns the position after it."""
    pos = _uvarint(out, pos, 128)
    pos = _uvarint(out, pos, 4)
    pos = _uvarint(out, pos, m)
    return _zigzag(out, pos, first)


@aot.njit(cache=True, nogil=True, _nrt=False)
def _delta_block(seg, cnt, blk, out, pos):
    """A block of DELTA_BINARY_PACKED: the ``cnt`` deltas of ``seg[:cnt +
    1]`` (into ``blk``), their minimum, then four miniblocks' widths (the
    bits of their values or'ed) and the miniblocks; a block of one delta
    (rows, a time that does not move) is told by or'ing and packs nothing.
    Returns the position after it."""
    for j in range(cnt):
        blk[j] = np.int64(seg[j + 1]) - np.int64(seg[j])
    dmin = blk[0]
    differ = np.int64(0)
    for j in range(cnt):
        differ |= blk[j] ^ dmin
    if differ != 0:
        for j in range(cnt):
            dmin = min(dmin, blk[j])
    pos = _zigzag(out, pos, dmin)
    widths_at = pos
    pos += 4
    for mb in range(4):
        width = 0
        if differ != 0 and 32 * mb < cnt:
            part = blk[32 * mb : min(32 * mb + 32, cnt)]
            bits = np.int64(0)
            for j in range(part.shape[0]):
                bits |= part[j] - dmin
            width = _bit_length(bits)
            if width <= 8 and part.shape[0] == 32:
                pos = _pack_groups_of(out, pos, part, 4, width, dmin)
            else:
                pos = _pack(out, pos, part, 0, part.shape[0], 32, width, dmin)
        out[widths_at + mb] = width
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_delta(values, n, null, state, levels, wide, deltas, out):
    """A DELTA_BINARY_PACKED page of the non-null ``values[:n]`` (blocks of
    128 deltas in four miniblocks of 32; ``wide``: int64 scratch of ``n``,
    where the non-null values are gathered when some are null; ``deltas``:
    int64 scratch of at least 128).  A block at a time, its deltas in a
    buffer that stays in cache (:func:`_delta_block`).

    The values' range comes first, in one pass: a page whose range holds
    no null by its rule (trace offsets, times: none negative) has one run
    of definition levels and its range as its statistics, no pass to count
    nulls."""
    lo = np.int64(0)
    hi = np.int64(0)
    if n > 0:
        lo = np.int64(values[0])
        hi = lo
        for i in range(n):
            v = np.int64(values[i])
            lo = min(lo, v)
            hi = max(hi, v)
    if (null == NOT_NULL or n == 0 or (null == NULL_IF_NEGATIVE and lo >= 0)
            or (null == NULL_IF_ZERO and (lo > 0 or hi < 0))):  # fmt: skip
        pos = _rle_run(out, 4, n, 1, 1)
        _put_le(out, 0, pos - 4, 4)
        state[ST_VALUES] += n
        m = n
        src = values
    else:
        nulls = state[ST_NULLS]
        pos = _levels(out, values, n, null, state, levels)
        m = n - (state[ST_NULLS] - nulls)  # the values stored
        src = wide
        k = 0
        for i in range(n):
            v = values[i]
            if not _is_null(v, null):
                wide[k] = v
                k += 1
        lo = np.int64(src[0]) if m > 0 else np.int64(0)
        hi = lo
        for i in range(m):
            v = np.int64(src[i])
            lo = min(lo, v)
            hi = max(hi, v)
    first = np.int64(src[0]) if m > 0 else np.int64(0)
    pos = _delta_header(out, pos, m, first)
    blk = deltas[:128]
    done = 1
    while done < m:
        cnt = min(128, m - done)
        # (indices into slices from ranges are known not negative: numba
        # leaves out its check for negative indices, and the loops vectorise)
        pos = _delta_block(src[done - 1 : done + cnt], cnt, blk, out, pos)
        done += cnt
    _merge(state, lo, hi, m)
    return pos


# -- columns given as runs of one value -------------------------------------------
#
# A block's time changes once every few hundred blocks, and its duration is 0
# but where the time changes: given as runs (the row each starts at, its
# value), their pages are made a run at a time, not a row at a time, byte for
# byte the pages of the values.  Runs are maximal: a run's value differs from
# the one before.


@aot.njit(cache=True, nogil=True, _nrt=False)
def _run_end(starts, k, r, n):
    return starts[r + 1] if r + 1 < k else n


@aot.njit(cache=True, nogil=True, _nrt=False)
def _hybrid_runs(out, pos, starts, vals, k, n, width, scratch):
    """:func:`_hybrid` of the ``n`` values made of ``k`` maximal runs
    (``scratch``: room for the values of a bit-packed run): the same
    decisions, taken a run at a time; only the values of packed runs are
    laid out."""
    i = 0
    r = 0
    while i < n:
        end = _run_end(starts, k, r, n)
        if end - i >= 8:
            pos = _rle_run(out, pos, end - i, vals[r], width)
            i = end
            r += 1
            continue
        # A packed run, until a group of eight lies within one run (a run
        # is maximal: its values are the only equal ones in a row).
        left = n - i
        g = 0
        q = r
        while True:
            g += 8
            if g >= left:
                break
            if g + 8 <= left:
                while _run_end(starts, k, q, n) <= i + g:
                    q += 1
                if _run_end(starts, k, q, n) >= i + g + 8:
                    break
        groups = (min(g, left) + 7) // 8
        m = min(8 * groups, left)
        q = r
        for t in range(m):
            while _run_end(starts, k, q, n) <= i + t:
                q += 1
            scratch[t] = vals[q]
        pos = _packed_run(out, pos, scratch[:m], groups, width)
        i += 8 * groups
        while r < k and _run_end(starts, k, r, n) <= i:
            r += 1
    return pos


@aot.njit(cache=True, inline="always", _nrt=False)
def _runs_block(out, pos, starts, vals, k, c, done, cnt, blk, scratch):
    """The block of the ``cnt`` deltas of rows ``done`` on of values given
    as ``k`` maximal runs (``c``: the first run that starts at ``done`` or
    later; the one before it holds at ``done - 1``), as
    :func:`_delta_block` makes it of them laid out.  ``blk``: int64
    scratch of 128, ``scratch`` of 129.  Returns the position after it and
    the first run after it."""
    hi = done + cnt
    c0 = c
    if c >= k or starts[c] >= hi:
        for t in range(5):
            out[pos + t] = 0
        return pos + 5, c
    # One pass over the block's changes ors their deltas per miniblock (in
    # registers, no branch on which); kept when no delta is negative and
    # some are 0 (their minimum 0).
    o0 = np.int64(0)
    o1 = np.int64(0)
    o2 = np.int64(0)
    o3 = np.int64(0)
    while c < k and starts[c] < hi:
        d = vals[c] - vals[c - 1]
        mb = (starts[c] - done) >> 5
        o0 |= d if mb == 0 else 0
        o1 |= d if mb == 1 else 0
        o2 |= d if mb == 2 else 0
        o3 |= d if mb == 3 else 0
        c += 1
    if (o0 | o1 | o2 | o3) >= 0 and c - c0 < cnt:
        # Each change's bits or'ed into words at its place (a miniblock of
        # 32 values of w bits is 4w bytes, the four back to back), the
        # word after taking what crosses over: no branch a change.
        nmb = (cnt + 31) >> 5
        w0 = _bit_length(o0)
        w1 = _bit_length(o1) if nmb > 1 else 0
        w2 = _bit_length(o2) if nmb > 2 else 0
        w3 = _bit_length(o3) if nmb > 3 else 0
        out[pos] = 0  # (the minimum, zigzag 0)
        out[pos + 1] = w0
        out[pos + 2] = w1
        out[pos + 3] = w2
        out[pos + 4] = w3
        b1 = 32 * w0
        b2 = b1 + 32 * w1
        b3 = b2 + 32 * w2
        nbytes = (b3 + 32 * w3) >> 3
        words = blk  # (at most 4 * 32 * 63 bits: 126 words and one to cross into)
        for t in range((nbytes >> 3) + 2):
            words[t] = 0
        for u in range(c0, c):
            rel = starts[u] - done
            mb = rel >> 5
            w = w0 if mb == 0 else (w1 if mb == 1 else (w2 if mb == 2 else w3))
            base = 0 if mb == 0 else (b1 if mb == 1 else (b2 if mb == 2 else b3))
            g = np.uint64(base + (rel & 31) * w)
            v = np.uint64(vals[u] - vals[u - 1])
            a = g >> np.uint64(6)
            off = g & np.uint64(63)
            words[a] = np.int64(np.uint64(words[a]) | (v << off))
            spill = (v >> np.uint64(1)) >> (np.uint64(63) - off)
            words[a + np.uint64(1)] = np.int64(np.uint64(words[a + np.uint64(1)]) | spill)
        p = pos + 5
        for t in range((nbytes + 7) >> 3):
            _put_u64(out, p + 8 * t, words[t])
        return p + nbytes, c
    # (values laid out: the one before the block, then its own)
    q = c0 - 1
    for t in range(cnt + 1):
        while q + 1 < k and starts[q + 1] <= done - 1 + t:
            q += 1
        scratch[t] = vals[q]
    return _delta_block(scratch[: cnt + 1], cnt, blk, out, pos), c


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_runs_delta(starts, vals, k, m, level_starts, level_vals, kl, n, nulls, state,
                      blk, scratch, out):  # fmt: skip
    """:func:`encode_delta`'s page, byte for byte, of ``n`` rows given as
    runs: the ``m`` non-null values in ``k`` maximal runs (``starts``
    numbered among them), the rows' definition levels in ``kl`` maximal
    runs (``nulls`` of them null).  ``blk``: int64 scratch of 128;
    ``scratch``: int64 scratch of ``n``.  A block of deltas with no change
    of value is five bytes; one whose deltas are 0 but where values change
    (their minimum 0) packs its miniblocks by setting the bits of those
    changes (:func:`_runs_block`); any other block is laid out and packed
    as :func:`encode_delta` does."""
    if nulls == 0:
        pos = _rle_run(out, 4, n, 1, 1)
    else:
        pos = _hybrid_runs(out, 4, level_starts, level_vals, kl, n, 1, scratch)
    _put_le(out, 0, pos - 4, 4)
    state[ST_VALUES] += n
    state[ST_NULLS] += nulls
    first = np.int64(vals[0]) if m > 0 else np.int64(0)
    pos = _delta_header(out, pos, m, first)
    low = first
    high = first
    for r in range(k):
        low = min(low, vals[r])
        high = max(high, vals[r])
    done = 1
    c = 1  # the next run to start
    while done < m:
        cnt = min(128, m - done)
        pos, c = _runs_block(out, pos, starts, vals, k, c, done, cnt, blk, scratch)
        done += cnt
    _merge(state, low, high, m)
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_points_delta(has_first, first, pts, far_row, far_val, at, n, state, blk, run_rows,
                        run_values, scratch, out):  # fmt: skip
    """:func:`encode_delta`'s page, byte for byte, of the ``n`` trace
    offsets (none null: none negative) of a batch whose first row is a
    held one's (``first``, when ``has_first``) and whose rows from ``at``
    are a block store's, given by the store's offset points (``pts``,
    ``far_row``, ``far_val``; the first at the store's first row), a
    block of 128 rows at a time, none laid out for the whole page: a
    block of near points only has their steps placed as bytes at their
    rows (in ``blk``) and packed; any other has its changes read into
    ``run_rows``/``run_values`` (int64 scratch of 130) and packed as
    :func:`encode_runs_delta` packs runs.  ``blk``: int64 scratch of 128,
    ``scratch`` of 129.  Returns the page's length; -1 (nothing written)
    when the store's first row has no point."""
    j = 0
    kf = np.uint64(0)
    row = np.int64(0)
    value = np.int64(0)
    v0 = np.int64(first)
    if not has_first:
        r, v0, j, kf, row, value = next_offset_change(pts, far_row, far_val, j, kf, row, value, at, n,
                                                np.int64(-1))  # fmt: skip
        if r != 0:
            return -1
    pos = _rle_run(out, 4, n, 1, 1)
    _put_le(out, 0, pos - 4, 4)
    state[ST_VALUES] += n
    pos = _delta_header(out, pos, n, v0)
    low = v0
    high = v0
    held_row = np.int64(0)  # the change holding before the next block
    held_value = v0
    nr, nv, j, kf, row, value = next_offset_change(
        pts, far_row, far_val, j, kf, row, value, at, n, v0
    )
    m = pts.shape[0]
    dense = blk.view(np.uint8)  # (a block's deltas as bytes, where they fit)
    done = 1
    while done < n:
        cnt = min(128, n - done)
        hi = done + cnt
        # Most blocks' changes are near points, each a row or more after
        # the last: their steps are the deltas, placed as bytes where their
        # rows are and packed a group of eight at a time.  A block with any
        # other point is read as the reader reads it (below).
        d0 = nv - held_value
        fast = nr < hi and 0 <= d0 < 256
        if fast:
            for t in range(16):
                blk[t] = 0
            dense[nr - done] = d0
            changed = 1
            r = row
            v = value
            jj = j
            while True:
                if jj >= m:
                    break
                pt = np.int64(pts[jj])
                if pt >= OFF_FAR or pt < 16:
                    fast = False  # (a far point, or a second at one row)
                    break
                r2 = r + (pt >> 4)
                if r2 + at >= hi:
                    break
                dense[r2 + at - done] = pt & 15
                changed += (pt & 15) != 0
                r = r2
                v += pt & 15
                jj += 1
        if fast and changed < cnt:
            low = min(low, nv)
            high = max(high, v)
            held_row = r + at if jj > j else nr
            held_value = v
            row, value, j = r, v, jj
            nr, nv, j, kf, row, value = next_offset_change(pts, far_row, far_val, j, kf, row, value,
                                                     at, n, held_value)  # fmt: skip
            # (the minimum 0, then each miniblock's width: its bytes or'ed)
            nmb = (cnt + 31) >> 5
            out[pos] = 0
            p = pos + 5
            for mb in range(4):
                bits = np.uint64(0)
                if mb < nmb:
                    for t in range(4):
                        bits |= np.uint64(blk[4 * mb + t])
                bits |= bits >> np.uint64(32)
                bits |= bits >> np.uint64(16)
                bits |= bits >> np.uint64(8)
                w = _bit_length(bits & np.uint64(0xFF))
                out[pos + 1 + mb] = w
                if w:
                    p = _pack_groups(out, p, dense[32 * mb : 32 * mb + 32], 4, w)
            pos = p
            done = hi
            continue
        run_rows[0] = held_row
        run_values[0] = held_value
        k = 1
        while nr < hi:
            run_rows[k] = nr
            run_values[k] = nv
            k += 1
            low = min(low, nv)
            high = max(high, nv)
            held_row, held_value = nr, nv
            nr, nv, j, kf, row, value = next_offset_change(pts, far_row, far_val, j, kf, row, value,
                                                     at, n, nv)  # fmt: skip
        pos, _ = _runs_block(out, pos, run_rows, run_values, k, 1, done, cnt, blk, scratch)
        done = hi
    _merge(state, low, high, n)
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_runs_dictionary(starts, vals, k, n, unsigned, state, keys, slots, entries, indices,
                           scratch, out):  # fmt: skip
    """:func:`encode_dictionary`'s page (and answer), byte for byte, of
    ``n`` rows none null given as ``k`` maximal runs: a value looked up
    once a run; the indices written a run at a time (``indices``: room for
    ``k``; ``scratch``: int64 of ``n``)."""
    before = state[ST_DICT]
    count = before
    shift = _shift(slots)
    for r in range(k):
        index = _dictionary_index(vals[r], keys, slots, shift, entries, count)
        if index == -1:
            state[ST_DICT] = count
            return -1
        if index == GROW:
            return GROW
        if index == count:
            count += 1
        indices[r] = index
    pos = _rle_run(out, 4, n, 1, 1)
    _put_le(out, 0, pos - 4, 4)
    state[ST_VALUES] += n
    if k == 1:
        # (a page of one value, as encode_dictionary writes it)
        if count > before:
            _see(state, vals[0], unsigned)
            state[ST_SEEN] += n - 1
        else:
            state[ST_SEEN] += n
    else:
        for e in range(before, count):
            _see(state, entries[e], unsigned)
        state[ST_SEEN] += n - (count - before)
    state[ST_DICT] = count
    width = _index_width(count)
    out[pos] = width
    if k == 1:
        return _rle_run(out, pos + 1, n, indices[0], width)
    return _hybrid_runs(out, pos + 1, starts, indices, k, n, width, scratch)


@aot.njit(cache=True, nogil=True, _nrt=False)
def encode_dictionary_page(entries, count, width, out):
    """The chunk's dictionary ``entries[:count]``, PLAIN (``width`` bytes
    each)."""
    pos = 0
    for e in range(count):
        pos = _put_le(out, pos, entries[e], width)
    return pos


@aot.njit(cache=True, nogil=True, _nrt=False)
def reset_dictionary(slots, entries, count):
    """Empty a dictionary of ``count`` entries for the next column chunk."""
    mask = slots.shape[0] - 1
    shift = _shift(slots)
    for e in range(count):
        s = np.int64((np.uint64(entries[e]) * _GOLDEN) >> shift)
        while slots[s] != e:
            s = (s + 1) & mask
        slots[s] = -1


@aot.njit(cache=True, nogil=True, _nrt=False)
def place_entries(keys, slots, entries, count):
    """Put a dictionary's ``count`` entries into an empty table (grown)."""
    mask = slots.shape[0] - 1
    shift = _shift(slots)
    for e in range(count):
        v = entries[e]
        s = np.int64((np.uint64(v) * _GOLDEN) >> shift)
        while slots[s] >= 0:
            s = (s + 1) & mask
        slots[s] = e
        keys[s] = v


@aot.njit(cache=True, nogil=True, _nrt=False)
def min_max(values):
    """The least and the greatest of ``values`` (at least one), in one pass."""
    lo = values[0]
    hi = values[0]
    for i in range(values.shape[0]):
        lo = min(lo, values[i])
        hi = max(hi, values[i])
    return lo, hi


@aot.njit(cache=True, nogil=True, _nrt=False)
def one_value(values):
    """Whether every one of ``values`` (at least one) is the first."""
    v0 = values[0]
    for lo in range(0, values.shape[0], 4096):
        # (or'ed a stretch at a time: vectorised, and an early way out)
        stretch = values[lo : min(lo + 4096, values.shape[0])]
        differ = stretch[0] ^ v0
        for t in range(stretch.shape[0]):
            differ |= stretch[t] ^ v0
        if differ != 0:
            return False
    return True


@aot.njit(cache=True, nogil=True, _nrt=False)
def index_values(values, keys, slots, entries, count, out):
    """``out[i]``: the index of ``values[i]`` among a table's ``count``
    entries (``entries`` in the order first seen, ``keys``/``slots`` its
    hash table, as a dictionary's), those not in it added.  Returns the new
    count, or ``-2 - count`` when the table must grow first (more slots,
    :func:`place_entries`; then index the values again)."""
    shift = _shift(slots)
    for i in range(values.shape[0]):
        v = values[i]
        slot = (np.uint64(v) * _GOLDEN) >> shift
        k = slots[slot]
        if k >= 0 and keys[slot] == v:
            out[i] = k
            continue
        index = _dictionary_index(v, keys, slots, shift, entries, count)
        if index < 0:
            return -2 - count
        if index == count:
            count += 1
        out[i] = index
    return count


# -- columns named by block keys ------------------------------------------------
#
# Several columns of the block rows (address, instructions, symbol, image)
# depend only on the block, and the decoder names each row's block by a key
# into its table of distinct blocks.  A chunk of such a column needs no value
# hashed: its dictionary is made from the chunk's distinct keys (a few
# thousand), and a row's index is its key's value's, found by the key
# (remap_entries: one gather a row, no hash).  A column with a value per key
# has the index pages of the keys' own indices, made once for all such
# columns; another (instructions, symbol, mostly the address too: a block
# entered at one address may end in several places) maps each key to its
# value's index.


# Keys kept in sequences (hwtrace.columns.SequencedKeys): a column of
# ``entries``, each a key or, from ``floor`` up, a sequence of keys (entry
# ``e`` names sequence ``top - e``).  A stretch of blocks a loop runs is
# one entry, so these passes read a third to a quarter of the rows' bytes,
# and a sequence already met is not looked into again.  Keys given one per
# row are entries with no sequences (``floor`` above every key).


@aot.njit(cache=True, nogil=True, _nrt=False)
def first_seen_entries(entries, floor, top, seq_start, seq_len, seq_keys, values, seen, seq_sums,
                       order, total):  # fmt: skip
    """The keys the entries' rows name, in the order they first name them
    (into ``order``; ``seen``: zeros, a flag per key, left set for those),
    and the sum of ``values[key]`` over the rows (into ``total[0]``): a
    sequence's keys looked into at its first use only, their sum kept in
    ``seq_sums`` (-1 each: not yet).  Returns how many keys ``order``
    holds."""
    n = 0
    acc = np.int64(0)
    for i in range(entries.shape[0]):
        k = np.int64(entries[i])
        if k >= floor:
            q = top - k
            s = seq_sums[q]
            if s < 0:
                s = 0
                first = seq_start[q]
                for j in range(seq_len[q]):
                    kk = seq_keys[first + j]
                    s += np.int64(values[kk])
                    if seen[kk] == 0:
                        seen[kk] = 1
                        order[n] = kk
                        n += 1
                seq_sums[q] = s
            acc += s
        else:
            acc += np.int64(values[k])
            if seen[k] == 0:
                seen[k] = 1
                order[n] = k
                n += 1
    total[0] = acc
    return n


@aot.njit(cache=True, nogil=True, _nrt=False)
def index_entries(entries, floor, top, seq_start, seq_len, seq_keys, base, state, local,
                  key_entries, seen, stamp):  # fmt: skip
    """The keys the entries' rows name into a chunk's dictionary of keys,
    in the order the rows first name them (``base + key`` in the chunk's
    numbering of its tables' keys; ``key_entries``: the keys in that
    order, ``state[ST_DICT]`` of them; ``local[key]``: a key's index, -1:
    not in it yet).  ``seen[q] == stamp``: sequence ``q`` looked into (a
    new ``stamp`` a call)."""
    count = state[ST_DICT]
    at = np.uint64(base)  # (unsigned: no negative-index checks)
    for i in range(entries.shape[0]):
        k = np.int64(entries[i])
        if k >= floor:
            q = top - k
            if seen[q] == stamp:
                continue
            seen[q] = stamp
            first = seq_start[q]
            for j in range(seq_len[q]):
                kk = np.uint64(seq_keys[first + j]) + at
                if local[kk] < 0:
                    local[kk] = count
                    key_entries[count] = kk
                    count += 1
        else:
            kk = np.uint64(k) + at
            if local[kk] < 0:
                local[kk] = count
                key_entries[count] = kk
                count += 1
    state[ST_DICT] = count


@aot.njit(cache=True, inline="always", _nrt=False)
def _remap_entries(entries, floor, top, seq_start, seq_len, pool, remap, out, size):
    """:func:`remap_entries` of indices of ``size`` bytes (a constant where
    inlined: the copies' words unrolled)."""
    step = np.uint64(size)
    span = np.uint64(16 * size)
    r = np.uint64(0)  # (the next row's first byte)
    n_out, n_pool = np.uint64(out.shape[0]), np.uint64(pool.shape[0])
    for i in range(entries.shape[0]):
        k = np.int64(entries[i])
        if k >= floor:
            q = top - k
            at = np.uint64(seq_start[q]) * step
            m = np.uint64(seq_len[q]) * step
            if m <= span and r + span <= n_out and at + span <= n_pool:
                for w in range(2 * size):
                    o = np.uint64(8 * w)
                    _put_u64(out, r + o, _load_bytes(pool, at + o))
            else:
                for j in range(m):
                    out[r + np.uint64(j)] = pool[at + np.uint64(j)]
            r += m
        else:
            v = np.uint64(remap[np.uint64(k)])
            for b in range(size):
                out[r + np.uint64(b)] = np.uint8((v >> np.uint64(8 * b)) & np.uint64(0xFF))
            r += step
    return np.int64(r // step)


@aot.njit(cache=True, nogil=True, _nrt=False)
def remap_entries(entries, floor, top, seq_start, seq_len, pool, remap, out):
    """Each row's ``remap[key]`` into ``out`` from the entries: a
    sequence's from ``pool`` (its keys remapped, as ``seq_keys`` holds
    them).  ``pool`` and ``out`` are bytes (views of arrays of ``remap``'s
    type): a sequence of up to sixteen keys is copied as words, whatever
    its length (those past it are written over next).  Returns the rows."""
    if remap.itemsize == 1:
        return _remap_entries(entries, floor, top, seq_start, seq_len, pool, remap, out, 1)
    if remap.itemsize == 2:
        return _remap_entries(entries, floor, top, seq_start, seq_len, pool, remap, out, 2)
    return _remap_entries(entries, floor, top, seq_start, seq_len, pool, remap, out, 4)


@aot.njit(cache=True, nogil=True, _nrt=False)
def index_page_nulls(rows, n, width, indices, levels, state, out):
    """An RLE_DICTIONARY page of ``n`` rows whose dictionary indices are
    ``rows`` (-1: null, a block no symbol covers): each row's definition
    level, then the indices of the rows that have a value, as
    :func:`encode_dictionary` writes a page of the same values; the null
    rows counted into ``state``.  Returns the page's length."""
    m = 0
    for i in range(n):
        r = rows[i]
        levels[i] = r >= 0
        indices[m] = r
        m += r >= 0
    if m == n:
        return index_page(rows, n, width, out)
    pos = _hybrid(out, 4, levels, n, 1)
    _put_le(out, 0, pos - 4, 4)
    state[ST_NULLS] += n - m
    out[pos] = width
    return _hybrid(out, pos + 1, indices, m, width)


@aot.njit(cache=True, nogil=True, _nrt=False)
def index_page(indices, n, width, out):
    """An RLE_DICTIONARY page of ``n`` non-null rows of dictionary
    ``indices`` (``width`` bits): levels, the width, the indices in the
    hybrid (one RLE run when all are the same, as :func:`encode_dictionary`
    writes a page of one value).  Returns the page's length."""
    pos = _rle_run(out, 4, n, 1, 1)
    _put_le(out, 0, pos - 4, 4)
    out[pos] = width
    if 0 < n < 8:
        # (from eight rows up the hybrid makes the one run itself)
        same = True
        for i in range(1, n):
            same &= indices[i] == indices[0]
        if same:
            return _rle_run(out, pos + 1, n, indices[0], width)
    return _hybrid(out, pos + 1, indices, n, width)


@aot.njit(cache=True, nogil=True, _nrt=False)
def keyed_values(table, entries, count, null, unsigned, rows, state, values):
    """The dictionary of a keyed chunk of ``rows`` rows: each of its
    ``count`` keys' value in ``table`` into ``values``, with the chunk's
    statistics into ``state``.  Returns False (``state`` then unusable)
    when one of them is null: such a column is not keyed."""
    for e in range(count):
        v = table[entries[e]]
        if null != NOT_NULL and _is_null(v, null):
            return False
        values[e] = v
        _see(state, v, unsigned)
    state[ST_SEEN] += rows - count
    state[ST_VALUES] += rows
    return True


def index_width(count: int) -> int:
    """Bits of an index into a dictionary of ``count`` entries: the
    compiled encoders' ``_index_width``, for the writer's Python (a
    compiled call costs more than the answer)."""
    return max((int(count) - 1).bit_length(), 1) if count > 1 else 1


@aot.njit(cache=True, nogil=True, _nrt=False)
def forget_keys(local, entries, count):
    """Empty a keyed dictionary of ``count`` entries for the next chunk."""
    for e in range(count):
        local[entries[e]] = -1


@aot.njit(cache=True, nogil=True, _nrt=False)
def count_keys(keys, counts, lanes):
    """``counts[k]``: how many of ``keys`` are ``k`` (added to it).  With
    ``lanes`` (int64, four rows of zeros as long as ``counts``, left
    zeros) the rows are counted in turn into four counts per key, then
    summed: a loop's few blocks, each met again a few rows on, increment
    four counts one after another, not one count waiting on its last
    increment (twice as fast on the flow benchmark's keys)."""
    n = keys.shape[0]
    m = counts.shape[0]
    if lanes.shape[0] < 4 or lanes.shape[1] < m:
        for i in range(n):
            counts[keys[i]] += 1
        return
    for i in range(n // 4):
        lanes[0, keys[4 * i]] += 1
        lanes[1, keys[4 * i + 1]] += 1
        lanes[2, keys[4 * i + 2]] += 1
        lanes[3, keys[4 * i + 3]] += 1
    for i in range(n - n % 4, n):
        lanes[0, keys[i]] += 1
    for k in range(m):
        counts[k] += lanes[0, k] + lanes[1, k] + lanes[2, k] + lanes[3, k]
        lanes[0, k] = 0
        lanes[1, k] = 0
        lanes[2, k] = 0
        lanes[3, k] = 0


#: Keys counted in four lanes at most (the lanes then stay in L1/L2; a
#: larger table of blocks is counted a row at a time).
COUNT_LANES_MAX = 1 << 13


def key_counts(keys: np.ndarray, m: int) -> np.ndarray:
    """How many of ``keys`` (each below ``m``) name each key."""
    counts = np.zeros(m, np.int64)
    lanes = np.zeros((4, m) if m <= COUNT_LANES_MAX else (0, 0), np.int64)
    count_keys(keys, counts, lanes)
    return counts


def named_keys(keys: np.ndarray | SequencedKeys, values: np.ndarray) -> tuple[np.ndarray, int]:
    """Which keys (below ``values``' length) the rows of ``keys`` name, and
    the sum of ``values`` over the rows (a batch's instructions from its
    blocks').  Keys kept in sequences get their first-seen order
    (``order``: the Parquet writer's dictionary of keys, without another
    pass); counting them a row each would cost more."""
    m = values.shape[0]
    if isinstance(keys, SequencedKeys):
        order = np.empty(m, np.int64)
        seen = np.zeros(m, np.uint8)
        total = np.zeros(1, np.int64)
        found = first_seen_entries(keys.entries, keys.floor, keys.top, keys.seq_start,
                                   keys.seq_len, keys.seq_keys, values, seen,
                                   np.full(keys.seq_start.shape[0], -1, np.int64), order,
                                   total)  # fmt: skip
        keys.order = order[:found]
        return seen.view(np.bool_), int(total[0])
    counts = key_counts(keys, m)
    return counts > 0, int(counts @ values.astype(np.int64))
