"""Executed blocks kept compactly: a dictionary of distinct blocks and one
small key per executed block.

A program runs the same few thousand blocks millions of times, so the
decoder's block rows (address, instruction count, mode, image, trace
offset, time: 30 bytes each) are kept as a key into a table of distinct
``(address, instructions, mode, image)`` blocks (2 bytes per row while
there are fewer than 65,535 of them, then 4) plus the rows at which the
trace offset and the time change (the offset changes about once per three
to five blocks, at each TNT or TIP packet: a byte each, the rows since the
last change and the offset's step; the time at timing packets, 2 bytes
each, steps likewise).  A stretch of
blocks the decoder replays (see hwtrace.pt._flowloop) is kept once, as a
*sequence*, and each replay stores one key naming it: on a plain trace a
key stands for three to four blocks.  Memory a process has never touched
costs far more to fill than to read, so this is what makes keeping a
decoding's results about as cheap as counting them.

:class:`BlockStore` collects decoder batches; :meth:`BlockStore.columns`
gives the dense columns back on demand; :class:`CompactBlocks` joins the
stores of several decoding threads in order.
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import aot
from ..columns import SequencedKeys, dense_empty
from .codetable import C_KEY_OWNER

_EMPTY_SLOT = np.uint64(0xFFFFFFFFFFFFFFFF)
_store_ids = itertools.count()
_U2_LIMIT = 0xFFFF  # keys that fit a uint16 key column

# Store state (int64 words): rows, distinct blocks, offset and time change
# points held, the last offset and time, whether a row was stored; the
# entries of the key column, the sequences and the keys they hold (see
# below); the store's number, and whether the decoder may store rows itself
# (S_LIVE: a uint16 key column); the row of the last offset change and the
# far offset points held; a copy of the row counters taken at the
# decoder's step start (S_SAVED..., see store_save).
S_ROWS, S_KEYS, S_OFF, S_TIME, S_LAST_OFF, S_LAST_TIME, S_STARTED = range(7)
S_ENT, S_NSEQ, S_SEQ_POOL, S_SEQ_GEN = 7, 8, 9, 10
S_T_AT, S_T_FAR = 11, 12
S_ID, S_LIVE, S_OFF_AT, S_OFF_FAR = 13, 14, 15, 16
_SAVED_SLOTS = (S_ROWS, S_OFF, S_TIME, S_LAST_OFF, S_LAST_TIME, S_STARTED, S_OFF_AT, S_ENT,
                S_T_AT, S_T_FAR, S_OFF_FAR)  # fmt: skip
S_SAVED = 17  # 17..27: the slots of _SAVED_SLOTS as they were
_NS = 28
# Sequences.  The decoder replays the same stretches of blocks millions of
# times (see hwtrace.pt._flowloop); such a stretch's keys are kept once, as
# a *sequence*, and each replay stores one entry naming it in the key
# column instead of a key per row: in a uint16 column the keys from
# 0xFFFE down (key 0xFFFE - i is sequence i), the blocks' from 0 up.  So
# the key column holds entries, S_ENT of them, standing for S_ROWS rows;
# the offset and time points count rows.  Sequences stay when the rows go
# (clear), as the distinct blocks do, until they fill half their room: then
# clear() lets them go with the rows and starts a new generation
# (S_SEQ_GEN), which the decoder's replay cache follows.  A store whose key
# column widens to uint32 has them expanded.
SEQ_TOP = 0xFFFE
SEQ_MAX = 1 << 14  # sequences a store holds
SEQ_POOL = 1 << 18  # keys they hold in all
SEQ_MIN_ROWS = 2  # a stretch of one row is stored as its key
# An offset point is a byte: the rows since the last point (high four
# bits, below OFF_ROWS) and the offset's step (low four, 0 to 15 bytes).
# Between two TNT or TIP packets a decoder passes a few rows and a few
# bytes (99.3-99.9% of the points of the benchmark's traces fit, the rest
# are after timing packets or a gap), and the offset points are written
# once per replayed stretch: their memory, fresh pages the kernel must
# clear, costs more than the writes.  A point that does not fit is *far*
# (OFF_FAR and up): its row and offset, absolute, are the next of the far
# points (S_OFF_FAR of them, in arrays as long as the points', of which
# only what is written costs).  The first point of a store is far.
OFF_ROWS = 15
OFF_BYTES = 16
OFF_FAR = 0xF0
# A time point is a uint16: the rows since the last point (high five bits,
# below T_ROWS) and the time's step (low eleven, TSC ticks, below T_TICKS).
# On a trace with CYC packets the time changes every few rows, by tens of
# ticks (all but 0.07% of the benchmark's points fit): 2 bytes a point
# where row and time took 16.  A point that does not fit (the first, after
# a gap, a time that goes back a little, an estimate corrected) is *far*
# (T_FAR and up), as offset points are.
T_ROWS = 31
T_TICKS = 1 << 11
T_FAR = 0xF800
# Why the compaction loop stopped before the batch's end.
_FULL_ROWS, _FULL_KEYS, _FULL_OFF, _FULL_TIME = 1, 2, 3, 4


@aot.njit(cache=True, inline="always", _nrt=False)
def _slot(ip, meta, mask):
    h = (ip ^ (meta * np.uint64(0x9E3779B97F4A7C15))) * np.uint64(0xBF58476D1CE4E5B9)
    return np.int64((h >> np.uint64(32)) & np.uint64(mask))


@aot.njit(cache=True, inline="always", _nrt=False)
def _block_key(a, ninsn, mode, image, tab, cols, n_keys, key_limit):
    """The key of block ``(a, ninsn, mode, image)``, added when new;
    returns ``(key, n_keys)``, key -1 when the table is full."""
    h_ip, h_meta, h_id = tab
    k_ip, k_ninsn, k_mode, k_image = cols[0], cols[1], cols[2], cols[3]
    mask = h_ip.shape[0] - 1
    meta = np.uint64(ninsn) | (np.uint64(mode) << np.uint64(32))
    meta |= np.uint64(image) << np.uint64(40)
    s = _slot(a, meta, mask)
    while True:
        if h_id[s] >= 0 and h_ip[s] == a and h_meta[s] == meta:
            return h_id[s], n_keys
        if h_id[s] < 0:
            if n_keys >= key_limit:
                return -1, n_keys
            h_ip[s] = a
            h_meta[s] = meta
            h_id[s] = n_keys
            k_ip[n_keys] = a
            k_ninsn[n_keys] = ninsn
            k_mode[n_keys] = mode
            k_image[n_keys] = image
            return n_keys, n_keys + 1
        s = (s + 1) & mask


@aot.njit(cache=True, inline="always", _nrt=False)
def put_offset(pts, far_row, far_val, state, n_off, row, dr, dv, o):
    """Append the offset point at ``row`` (``dr`` rows and ``dv`` bytes
    from the last; offset ``o``) at ``n_off``, room known; returns the new
    count."""
    at = np.uint64(n_off)  # (unsigned: no check for a negative index)
    if np.uint64(dr) < OFF_ROWS and np.uint64(dv) < OFF_BYTES:
        pts[at] = (dr << 4) | dv
    else:
        _put_far(pts, at, OFF_FAR, far_row, far_val, state, S_OFF_FAR, row, o)
    return n_off + 1


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_far(pts, at, marker, far_row, far_val, state, slot, row, value):
    """Point ``at`` is far: ``marker`` there, and ``(row, value)`` the next
    of the far points (``state[slot]`` of them)."""
    k = np.uint64(state[slot])
    far_row[k] = row
    far_val[k] = value
    state[slot] = k + np.uint64(1)
    pts[at] = marker


@aot.njit(cache=True, inline="always", _nrt=False)
def offset_point(pts, far_row, far_val, j, k, row, value):
    """Point ``j`` of an offset stream read from ``row``, ``value`` (``k``:
    the far points read): ``(row, value, k)`` it starts."""
    p = np.int64(pts[j])
    if p >= OFF_FAR:
        return far_row[k], far_val[k], k + np.uint64(1)
    return row + (p >> 4), value + (p & 15), k


@aot.njit(cache=True, inline="always", _nrt=False)
def next_offset_change(pts, far_row, far_val, j, k, row, value, at, n, last):
    """The next change of a batch's trace offset from offset point ``j`` on
    (the points read up to ``row``, ``value``, ``k`` of them far), the
    store's rows from row ``at`` of the batch's ``n``: of the points at one
    row the last holds, and one to ``last`` (the offset before; offsets are
    not negative) is none.  Returns its row in the batch (``n``: no more)
    and offset, and the reading's state ``(j, k, row, value)``."""
    m = pts.shape[0]
    while j < m:
        row, value, k = offset_point(pts, far_row, far_val, j, k, row, value)
        j += 1
        if row + at >= n:
            j = m
            break
        while j < m:
            p = np.int64(pts[j])
            if (p >= OFF_FAR and far_row[k] != row) or (p < OFF_FAR and p >> 4 != 0):
                break
            row, value, k = offset_point(pts, far_row, far_val, j, k, row, value)
            j += 1
        if value != last:
            return row + at, value, j, k, row, value
    return np.int64(n), last, j, k, row, value


@aot.njit(cache=True, inline="always", _nrt=False)
def put_time(t_pts, t_far_row, t_far_val, state, n_t, row, t, last_t):
    """Append the time point ``(row, t)`` (the last at ``state[S_T_AT]``,
    ``last_t``) at ``n_t``, room known; returns the new count."""
    dr = row - state[S_T_AT]
    dv = t - last_t
    at = np.uint64(n_t)  # (unsigned: no check for a negative index)
    if np.uint64(dr) < T_ROWS and dv < T_TICKS:
        t_pts[at] = (dr << 11) | np.int64(dv)
    else:
        _put_far(t_pts, at, T_FAR, t_far_row, t_far_val, state, S_T_FAR, row, t)
    state[S_T_AT] = row
    return n_t + 1


@aot.njit(cache=True, inline="always", _nrt=False)
def put_row(keys, off_pts, off_far_row, off_far_val, t_pts, t_far_row, t_far_val, key, o, t,
            n_rows, n_off, n_t, last_off, last_t, started, off_at, state, n_ent):  # fmt: skip
    """Store a row of block ``key`` decoded at trace offset ``o`` and time
    ``t``, given the store's counters (``off_at``: the row of the last
    offset change; ``n_ent``: the key column's entries); returns ``(why,
    n_rows, n_off, n_t, last_off, last_t, off_at)`` after it (one entry
    more when stored): ``why`` 0 when stored, else which array is full
    (nothing stored)."""
    new_o = not started or o != last_off
    new_t = not started or t != last_t
    if n_rows >= keys.shape[0]:  # (rows: see BlockStore.make_room)
        return _FULL_ROWS, n_rows, n_off, n_t, last_off, last_t, off_at
    if new_t and n_t >= t_pts.shape[0]:
        return _FULL_TIME, n_rows, n_off, n_t, last_off, last_t, off_at
    if new_o:
        if n_off >= off_pts.shape[0]:
            return _FULL_OFF, n_rows, n_off, n_t, last_off, last_t, off_at
        # (The first point far: OFF_ROWS rows is no short step.)
        dr = n_rows - off_at if started else np.int64(OFF_ROWS)
        n_off = put_offset(off_pts, off_far_row, off_far_val, state, n_off, n_rows, dr,
                           o - last_off, o)  # fmt: skip
        last_off = o
        off_at = n_rows
    keys[n_ent] = key
    if new_t:
        n_t = put_time(t_pts, t_far_row, t_far_val, state, n_t, n_rows, t, last_t)
        last_t = t
    return 0, n_rows + 1, n_off, n_t, last_off, last_t, off_at


@aot.njit(cache=True, _nrt=False)
def _compact(ip, ninsn, mode, offset, time, run, run_key, start, end, image, keys, tab, cols,
             state):  # fmt: skip
    """Append the batch's rows ``start`` to ``end``; returns ``(next row,
    reason)``: reason 0 when the batch is done, else which array is full.

    A row that is a whole run of the decoder's code table (``run[i] >= 0``)
    finds its key in ``run_key`` (-1: not known yet), without hashing."""
    off_pts, off_far_row, off_far_val = cols[4], cols[5], cols[12]
    t_pts, t_far_row, t_far_val = cols[6], cols[7], cols[11]
    n_rows, n_keys, n_off, n_t = state[S_ROWS], state[S_KEYS], state[S_OFF], state[S_TIME]
    last_off, last_t, started = state[S_LAST_OFF], np.uint64(state[S_LAST_TIME]), state[S_STARTED]
    off_at = state[S_OFF_AT]
    n_ent = state[S_ENT]
    key_limit = store_key_limit(keys, tab, cols, state)
    i = start
    why = 0
    while i < end:
        r = run[i]
        key = run_key[r] if r >= 0 else -1
        if key < 0:
            key, n_keys = _block_key(ip[i], ninsn[i], mode[i], image, tab, cols, n_keys, key_limit)
            if key < 0:
                why = _FULL_KEYS
                break
            if r >= 0:
                run_key[r] = key
        why, n_rows, n_off, n_t, last_off, last_t, off_at = put_row(
            keys, off_pts, off_far_row, off_far_val, t_pts, t_far_row, t_far_val, key, offset[i],
            time[i], n_rows, n_off, n_t, last_off, last_t, started, off_at, state, n_ent,
        )  # fmt: skip
        if why:
            break
        started = 1
        n_ent += 1
        i += 1
    state[S_ROWS], state[S_KEYS], state[S_OFF], state[S_TIME] = n_rows, n_keys, n_off, n_t
    state[S_ENT] = n_ent
    state[S_LAST_OFF], state[S_LAST_TIME], state[S_STARTED] = last_off, np.int64(last_t), started
    state[S_OFF_AT] = off_at
    return i, why


@aot.njit(cache=True, inline="always", _nrt=False)
def keys_limit(keys):
    """How many distinct blocks a key column of this type can name."""
    return _U2_LIMIT if keys.itemsize == 2 else 0x7FFFFFFF


@aot.njit(cache=True, inline="always", _nrt=False)
def store_key_limit(keys, tab, cols, state):
    """How many distinct blocks the store can hold before it must grow
    (the keys of its sequences taken)."""
    return min(cols[0].shape[0], tab[0].shape[0] >> 1, keys_limit(keys) - state[S_NSEQ])


@aot.njit(cache=True, inline="always", _nrt=False)
def store_sequence(cols, state, src, start, m, n_keys):
    """Keep ``src[start:start + m]`` (a replayed stretch's keys) as a
    sequence of the store; returns its key, -1 when there is no room (in
    the sequences, or in the uint16 key space beside the ``n_keys``
    distinct blocks)."""
    seq_start, seq_len, seq_keys = cols[8], cols[9], cols[10]
    i, at = state[S_NSEQ], state[S_SEQ_POOL]
    if (
        m < SEQ_MIN_ROWS
        or i >= seq_start.shape[0]
        or at + m > seq_keys.shape[0]
        or n_keys + i + 1 >= _U2_LIMIT
    ):
        return np.int64(-1)
    for j in range(m):
        seq_keys[np.uint64(at + j)] = src[np.uint64(start + j)]
    seq_start[i] = at
    seq_len[i] = m
    state[S_NSEQ] = i + 1
    state[S_SEQ_POOL] = at + m
    return np.int64(SEQ_TOP - i)


@aot.njit(cache=True, nogil=True, _nrt=False)
def expand_entries(entries, floor, seq_start, seq_len, seq_keys, out):
    """The key of every row from a key column's ``entries`` (keys from
    ``floor`` up name sequences, see SEQ_TOP) into ``out``."""
    r = np.uint64(0)
    n_out, n_pool = np.uint64(out.shape[0]), np.uint64(seq_keys.shape[0])
    for i in range(entries.shape[0]):
        k = np.int64(entries[i])
        if k >= floor:
            q = SEQ_TOP - k
            at = np.uint64(seq_start[q])
            m = np.uint64(seq_len[q])
            if m <= 8 and r + 8 <= n_out and at + 8 <= n_pool:
                # Eight keys copied whatever the length (one vector; those
                # past it are written over next): no loop to mispredict.
                for j in range(8):
                    out[r + np.uint64(j)] = seq_keys[at + np.uint64(j)]
            else:
                for j in range(m):
                    out[r + np.uint64(j)] = seq_keys[at + np.uint64(j)]
            r += m
        else:
            out[r] = k
            r += np.uint64(1)
    return np.int64(r)


@aot.njit(cache=True, nogil=True, _nrt=False)
def entries_ninsn(entries, floor, seq_start, seq_len, seq_keys, k_ninsn):
    """The instructions of the rows a key column's entries stand for."""
    total = np.uint64(0)
    for i in range(entries.shape[0]):
        k = np.int64(entries[i])
        if k >= floor:
            q = SEQ_TOP - k
            at = seq_start[q]
            for j in range(seq_len[q]):
                total += np.uint64(k_ninsn[seq_keys[at + j]])
        else:
            total += np.uint64(k_ninsn[k])
    return total


# -- the decoder storing rows itself ------------------------------------------
#
# The compiled decoder (hwtrace.pt._flowloop) takes a store as one tuple,
# ``(keys, tab, cols, state)`` (BlockStore.kernel_store), and while
# ``state[S_LIVE]`` stores its rows there directly instead of writing them
# out for Python to append: a row that is a code run finds its key in the
# code table's ``r_key``, which caches the keys of the store
# ``counts[C_KEY_OWNER]`` names.  A decoding step that is undone (see the
# decoder's save_state) undoes its stored rows with store_restore; distinct
# blocks it added stay (they are only never referred to).


@aot.njit(cache=True, _nrt=False)
def store_save(state):
    """Remember the row counters (at a decoding step's start)."""
    for j in range(len(_SAVED_SLOTS)):
        state[S_SAVED + j] = state[_SAVED_SLOTS[j]]


@aot.njit(cache=True, _nrt=False)
def store_restore(state):
    """Drop the rows stored since :func:`store_save`."""
    for j in range(len(_SAVED_SLOTS)):
        state[_SAVED_SLOTS[j]] = state[S_SAVED + j]


@aot.njit(cache=True, _nrt=False)
def claim_run_keys(counts, r_key, n_runs, state):
    """Make the code table's run keys the store's (they were another's)."""
    if counts[C_KEY_OWNER] != state[S_ID]:
        for r in range(min(n_runs, r_key.shape[0])):
            r_key[r] = -1
        counts[C_KEY_OWNER] = state[S_ID]


@aot.njit(cache=True, _nrt=False)
def store_rows(st, ip, ninsn, mode, offset, time, run, n, image, r_key):
    """Append rows ``0..n`` of a decoder's output if the store surely has
    room for them (else nothing: the rows go to Python, which grows it);
    returns whether it did."""
    keys, tab, cols, state = st
    if (
        state[S_ROWS] + n > keys.shape[0]
        or state[S_OFF] + n > cols[4].shape[0]
        or state[S_TIME] + n > cols[6].shape[0]
        or state[S_KEYS] + n > store_key_limit(keys, tab, cols, state)
    ):
        return False
    _, why = _compact(
        ip, ninsn, mode, offset, time, run, r_key, 0, n, image, keys, tab, cols, state
    )
    return why == 0  # (a point a row at most: the room was there)


@aot.njit(cache=True, nogil=True, _nrt=False)
def blocks_of(keys, k_ip, k_ninsn, k_mode, k_image, ip, ninsn, mode, image):
    """The block of each of a store's ``keys`` (into the distinct blocks
    ``k_*``), into the columns given (an empty column is not written)."""
    n = keys.shape[0]
    if ip.shape[0] >= n:
        for i in range(n):
            ip[i] = k_ip[keys[i]]
    if ninsn.shape[0] >= n:
        for i in range(n):
            ninsn[i] = k_ninsn[keys[i]]
    if mode.shape[0] >= n:
        for i in range(n):
            mode[i] = k_mode[keys[i]]
    if image.shape[0] >= n:
        for i in range(n):
            image[i] = k_image[keys[i]]


@aot.njit(cache=True, nogil=True, _nrt=False)
def offsets_of(off_pts, off_far_row, off_far_val, n, offset):
    """``n`` rows' trace offsets from a store's offset points (see
    put_offset)."""
    row = np.int64(0)
    value = np.int64(0)
    k = np.uint64(0)  # (unsigned: no check for a negative index)
    for j in range(off_pts.shape[0]):
        to, new, k = offset_point(off_pts, off_far_row, off_far_val, j, k, row, value)
        if to - row <= 8 and row + 8 <= n:
            # Eight rows written whatever the step (one vector; those past
            # it are written over next): a few rows a step, mostly.
            at = np.uint64(row)  # (unsigned: no check for a negative index)
            for t in range(8):
                offset[at + np.uint64(t)] = value
            row = to
        else:
            upto = min(to, n)
            run = offset[row:upto]  # (indexed from a range: no negative-index checks)
            for t in range(run.shape[0]):
                run[t] = value
            row = upto
        value = new
    tail = offset[row:n]
    for t in range(tail.shape[0]):
        tail[t] = value


@aot.njit(cache=True, nogil=True, _nrt=False)
def offset_points(off_pts, off_far_row, off_far_val, rows, values):
    """The rows where the trace offset changes and the new offsets (into
    ``rows``, ``values``) from a store's offset points."""
    row = np.int64(0)
    value = np.int64(0)
    k = np.uint64(0)
    for j in range(off_pts.shape[0]):
        row, value, k = offset_point(off_pts, off_far_row, off_far_val, j, k, row, value)
        rows[j] = row
        values[j] = value


@aot.njit(cache=True, nogil=True, _nrt=False)
def time_points(t_pts, t_far_row, t_far_val, rows, values):
    """The rows where the time changes and the new times (into ``rows``,
    ``values``) from a store's time points (see put_time)."""
    row = np.int64(0)
    value = np.uint64(0)
    k = np.uint64(0)  # (unsigned: no check for a negative index)
    for j in range(t_pts.shape[0]):
        p = np.int64(t_pts[j])
        if p >= T_FAR:
            row = t_far_row[k]
            value = t_far_val[k]
            k += np.uint64(1)
        else:
            row += p >> 11
            value += np.uint64(p & (T_TICKS - 1))
        rows[j] = row
        values[j] = value


@aot.njit(cache=True, nogil=True, _nrt=False)
def expand_rows(keys, k_ip, k_ninsn, k_mode, k_image, off_pts, off_far_row, off_far_val, t_row,
                t_val, ip, ninsn, mode, image, offset, time):  # fmt: skip
    """Rows ``0..len(keys)`` of a store as dense columns: each key's block,
    the trace offset from its points and the time from its change points
    (``t_row`` rows, ``t_val`` times)."""
    n = keys.shape[0]
    blocks_of(keys, k_ip, k_ninsn, k_mode, k_image, ip, ninsn, mode, image)
    offsets_of(off_pts, off_far_row, off_far_val, n, offset)
    for j in range(t_row.shape[0]):
        end = t_row[j + 1] if j + 1 < t_row.shape[0] else n
        time[t_row[j] : end] = t_val[j]


_DUMMY: tuple | None = None


def dummy_store() -> tuple:
    """A store the decoder never stores into (for every other sink)."""
    global _DUMMY
    if _DUMMY is None:
        cols = (np.zeros(1, np.uint64), np.zeros(1, np.uint32), np.zeros(1, np.uint8),
                np.zeros(1, np.uint16), np.zeros(1, np.uint8), np.zeros(1, np.int64),
                np.zeros(1, np.uint16), np.zeros(1, np.int64), np.zeros(0, np.int64),
                np.zeros(0, np.int64), np.zeros(0, np.uint16), np.zeros(1, np.uint64),
                np.zeros(1, np.int64))  # fmt: skip
        tab = (np.zeros(2, np.uint64), np.zeros(2, np.uint64), np.full(2, -1, np.int64))
        state = np.zeros(_NS, np.int64)
        state[S_ID] = -2
        _DUMMY = (np.zeros(1, np.uint16), tab, cols, state)
    return _DUMMY


def grown(arr: np.ndarray, used: int, size: int, dense: bool = True) -> np.ndarray:
    """``arr``'s first ``used`` rows in a new array of ``size`` rows (of the
    same shape otherwise; the rest left as it comes).  ``dense``: a column
    written densely from its start (:func:`~hwtrace.columns.dense_empty`)."""
    shape = (size, *arr.shape[1:])
    new = dense_empty(shape, arr.dtype) if dense else np.empty(shape, arr.dtype)
    new[:used] = arr[:used]
    return new


def _grown_points(pts: np.ndarray, far_row: np.ndarray, far_val: np.ndarray, n: int,
                  far: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Offset or time points (``n`` of them, ``far`` far) with twice the
    room; the far arrays as long as the points (any of them may be far)."""
    size = 2 * pts.shape[0]
    return grown(pts, n, size), grown(far_row, far, size, False), grown(far_val, far, size, False)


class StoredKeys:
    """A copy of a store's key column as stored (:meth:`BlockStore.entries`
    and the sequences they name): its rows' keys laid out later, in any
    thread, once the store has moved on (a few bytes a row where the
    keys take two)."""

    __slots__ = ("entries", "floor", "seq_keys", "seq_len", "seq_start")

    def __init__(self, store: BlockStore) -> None:
        self.entries = store.entries().copy()
        floor, start, length, pool = store.sequences()
        self.floor = floor
        if self.entries.shape[0] == len(store):
            start, length, pool = start[:0], length[:0], pool[:0]  # (no sequence named)
        self.seq_start, self.seq_len, self.seq_keys = start.copy(), length.copy(), pool.copy()

    @property
    def nbytes(self) -> int:
        return (
            self.entries.nbytes + self.seq_keys.nbytes + self.seq_start.nbytes + self.seq_len.nbytes
        )

    def into(self, out: np.ndarray) -> None:
        """The rows' keys into ``out`` (as many rows as the store held)."""
        if self.seq_start.shape[0] == 0:
            out[:] = self.entries
        else:
            expand_entries(self.entries, self.floor, self.seq_start, self.seq_len,
                           self.seq_keys, out)  # fmt: skip

    def last(self) -> int:
        """The last row's key."""
        k = int(self.entries[-1])
        if k < self.floor or self.seq_start.shape[0] == 0:
            return k
        q = SEQ_TOP - k
        return int(self.seq_keys[self.seq_start[q] + self.seq_len[q] - 1])


def sequenced_keys(store: BlockStore, first: int, later: np.ndarray) -> SequencedKeys | None:
    """A batch's keys kept in sequences, as the store holds its rows (a copy):
    a held row's key (``first``; -1: none), the store's rows, then
    ``later`` (the keys of rows after them, found or added in its table).
    None where a key of ``later`` would read as a sequence's (the key
    space of a uint16 column full)."""
    floor, start, length, pool = store.sequences()
    if later.shape[0] and int(later.max()) >= floor:
        return None
    stored = store.entries()
    rows = len(store)
    if stored.shape[0] == rows:
        start, length, pool = start[:0], length[:0], pool[:0]  # (no sequence named)
    held = 1 if first >= 0 else 0
    entries = np.empty(held + stored.shape[0] + later.shape[0], stored.dtype)
    if held:
        entries[0] = first
    entries[held : held + stored.shape[0]] = stored
    entries[held + stored.shape[0] :] = later
    start, length, pool = start.copy(), length.copy(), pool.copy()
    n = held + rows + later.shape[0]

    def make() -> np.ndarray:
        out = np.empty(n, entries.dtype)
        expand_entries(entries, floor, start, length, pool, out)
        return out

    return SequencedKeys(n, entries, floor, SEQ_TOP, start, length, pool, make)


class BlockStore:
    """Executed blocks, compactly (see the module docstring).  Rows are
    appended with :meth:`append`; ``expect_rows`` sizes the key column
    (memory never touched costs nothing)."""

    def __init__(self, expect_rows: int = 1 << 16) -> None:
        # (The key column and the points are written densely from their
        # start: see dense_empty.  The far points are few.)
        self.keys = dense_empty(max(expect_rows, 1 << 12), np.uint16)
        self._new_table(1 << 12)
        # The trace offset changes about once per five rows; sized so they
        # never need copying (pages never written cost nothing).
        changes = max(expect_rows // 4, 1 << 12)
        self.off_pts = dense_empty(changes, np.uint8)
        self.off_far_row = np.empty(changes, np.int64)
        self.off_far_val = np.empty(changes, np.int64)
        self.time_pts = dense_empty(changes, np.uint16)
        self.time_far_row = np.empty(changes, np.int64)
        self.time_far_val = np.empty(changes, np.uint64)
        self.seq_start = np.empty(SEQ_MAX, np.int64)
        self.seq_len = np.empty(SEQ_MAX, np.int64)
        self.seq_keys = np.empty(SEQ_POOL, np.uint16)
        self.state = np.zeros(_NS, np.int64)
        self.state[S_ID] = next(_store_ids)
        self._kernel_store: tuple | None = None
        self._expanded: tuple | None = None  # ((entries, rows, clears), the key column)
        self._expand_buf: np.ndarray | None = None
        self._clears = 0
        self._by_runs: dict[int, list] = {}
        self._no_runs = np.zeros(0, np.int32)

    def kernel_store(self) -> tuple:
        """The store as the compiled decoder takes it (see store_rows): live
        while its key column is ``uint16``, else :func:`dummy_store`; the
        same tuple until an array is grown."""
        if self.keys.dtype != np.uint16:
            self.state[S_LIVE] = 0
            return dummy_store()
        if self._kernel_store is None:
            self.state[S_LIVE] = 1
            self._kernel_store = (
                self.keys, (self.h_ip, self.h_meta, self.h_id),
                self._cols(), self.state,
            )  # fmt: skip
        return self._kernel_store

    def _cols(self) -> tuple:
        return (self.k_ip, self.k_ninsn, self.k_mode, self.k_image, self.off_pts,
                self.off_far_row, self.time_pts, self.time_far_row, self.seq_start, self.seq_len,
                self.seq_keys, self.time_far_val, self.off_far_val)  # fmt: skip

    def _new_table(self, capacity: int) -> None:
        self._kernel_store = None
        old = getattr(self, "k_ip", None)
        n = int(self.state[S_KEYS]) if old is not None else 0
        self.h_ip = np.full(2 * capacity, _EMPTY_SLOT, np.uint64)
        self.h_meta = np.zeros(2 * capacity, np.uint64)
        self.h_id = np.full(2 * capacity, -1, np.int64)
        cols = {"k_ip": np.uint64, "k_ninsn": np.uint32, "k_mode": np.uint8, "k_image": np.uint16}
        for name, dt in cols.items():
            arr = np.zeros(capacity, dt)
            if old is not None:
                arr[:n] = getattr(self, name)[:n]
            setattr(self, name, arr)
        if n:
            _rehash(self.h_ip, self.h_meta, self.h_id, self.k_ip, self.k_ninsn, self.k_mode,
                    self.k_image, n)  # fmt: skip

    # -- filling ---------------------------------------------------------------
    def append(
        self,
        ip: np.ndarray,
        ninsn: np.ndarray,
        mode: np.ndarray,
        offset: np.ndarray,
        time: np.ndarray,
        image: int = 0,
        run: np.ndarray | None = None,
        runs: object = None,
        n_runs: int = 0,
    ) -> None:
        """Append block rows (the decoder's batch columns).  ``run`` numbers
        the rows that are whole runs of code (-1: not one), below
        ``n_runs``; ``runs`` names that numbering (rows of the same run
        number in the same ``runs`` are the same block), so those rows
        need no hashing."""
        if run is None:
            run, runs, n_runs = np.full(ip.shape[0], -1, np.int32), None, 0
        run_key = self._run_keys(runs, n_runs)
        start = 0
        while True:
            start, why = _compact(
                ip, ninsn, mode, offset, time, run, run_key, start, ip.shape[0], image, self.keys,
                (self.h_ip, self.h_meta, self.h_id), self._cols(), self.state,
            )  # fmt: skip
            if why == 0:
                return
            self._grow(why)

    def _run_keys(self, runs: object, n_runs: int) -> np.ndarray:
        """The key of each run of the numbering ``runs`` (-1: none yet)."""
        if runs is None:
            return self._no_runs
        held = self._by_runs.get(id(runs))
        if held is None or held[0] is not runs:
            # ``runs`` is held so its id is not reused while it is a key.
            held = self._by_runs[id(runs)] = [runs, np.full(max(n_runs, 1 << 10), -1, np.int32)]
        if held[1].shape[0] < n_runs:
            wider = np.full(max(n_runs, 2 * held[1].shape[0]), -1, np.int32)
            wider[: held[1].shape[0]] = held[1]
            held[1] = wider
        return held[1]

    def _grow(self, why: int) -> None:
        self._kernel_store = None
        s = self.state
        if why == _FULL_ROWS:
            self.keys = grown(self.keys, int(s[S_ENT]), 2 * self.keys.shape[0])
        elif why == _FULL_KEYS:
            if self.keys.dtype == np.uint16 and s[S_KEYS] >= _U2_LIMIT - s[S_NSEQ]:
                # The blocks need the sequences' keys: a key a row.
                rows = len(self)
                wide = np.empty(max(self.keys.shape[0], rows), np.uint32)
                wide[:rows] = self.key_column()
                self.keys = wide
                s[S_ENT] = rows
                s[S_NSEQ] = s[S_SEQ_POOL] = 0
            if s[S_KEYS] >= self.k_ip.shape[0] or 2 * s[S_KEYS] >= self.h_ip.shape[0]:
                self._new_table(2 * self.k_ip.shape[0])
        elif why == _FULL_OFF:
            self.off_pts, self.off_far_row, self.off_far_val = _grown_points(
                self.off_pts, self.off_far_row, self.off_far_val, int(s[S_OFF]), int(s[S_OFF_FAR])
            )
        else:
            self.time_pts, self.time_far_row, self.time_far_val = _grown_points(
                self.time_pts, self.time_far_row, self.time_far_val, int(s[S_TIME]),
                int(s[S_T_FAR]),
            )  # fmt: skip

    def row_keys(self, ip: np.ndarray, ninsn: np.ndarray, mode: np.ndarray,
                 image: np.ndarray, out: np.ndarray) -> None:  # fmt: skip
        """Each row's key into :meth:`table` (blocks not met before added to
        it) into ``out``, without storing the rows: how the rows a decoder
        wrote out, not stored, are named by the same keys as those it
        stored.  ``image``: a value a row, or one for all."""
        image = np.asarray(image, np.int64).reshape(-1)
        start, end = 0, ip.shape[0]
        while start < end:
            start = _row_keys(ip, ninsn, mode, image, start, end, out, self.keys,
                              (self.h_ip, self.h_meta, self.h_id), self._cols(), self.state)  # fmt: skip
            if start < end:
                self._grow(_FULL_KEYS)

    def drain(self, ip: np.ndarray, ninsn: np.ndarray, mode: np.ndarray, image: np.ndarray,
              offset: np.ndarray, time: np.ndarray) -> int:  # fmt: skip
        """Write the rows held into the given columns (with room for them:
        ``uint64``, ``uint32``, ``uint8``, ``int64``, ``int64``,
        ``uint64``) and forget them, keeping the distinct blocks (so the
        decoder's cached keys stay good): how a stream takes the rows the
        decoder stored, batch by batch.  Returns how many there were."""
        n = len(self)
        if n:
            expand_rows(self.key_column(), self.k_ip, self.k_ninsn, self.k_mode, self.k_image,
                        *self.offset_steps(), *self.time_changes(), ip, ninsn, mode, image,
                        offset, time)  # fmt: skip
        self.clear()
        return n

    def clear(self) -> None:
        """Forget the rows held, keeping the distinct blocks (the decoder's
        cached keys stay good); the arrays that filled up grow, since the
        decoder cannot grow them."""
        s = self.state
        self._clears += 1
        self._expanded = None
        if 2 * s[S_NSEQ] >= self.seq_start.shape[0] or 2 * s[S_SEQ_POOL] >= self.seq_keys.shape[0]:
            # (A long stream keeps replaying into fresh sequences.)
            s[S_NSEQ] = s[S_SEQ_POOL] = 0
            s[S_SEQ_GEN] += 1
        if int(s[S_OFF]) == self.off_pts.shape[0] and s[S_OFF] < 2 * self.keys.shape[0]:
            self._grow(_FULL_OFF)
        if int(s[S_TIME]) == self.time_pts.shape[0] and s[S_TIME] < self.keys.shape[0]:
            self._grow(_FULL_TIME)
        for slot in _SAVED_SLOTS:
            s[slot] = 0
        if 2 * int(s[S_KEYS]) >= self.k_ip.shape[0] and self.keys.dtype == np.uint16:
            self._grow(_FULL_KEYS)

    def reserve(self, rows: int) -> None:
        """Hold ``rows`` rows before the decoder stops (from now: no rows
        held)."""
        if len(self) == 0 and rows > self.keys.shape[0]:
            self.keys = np.empty(rows, self.keys.dtype)
            self._kernel_store = None

    def make_room(self, rows: int = 1 << 12) -> None:
        """Grow the rows and change points with room for fewer than ``rows``
        more, and the table of distinct blocks when it is full (the decoder
        stops when the store is full, for Python to make room, and then
        stores into it again)."""
        s = self.state
        # (Rows, not the entries that hold them, fill the key column: a
        # store sized to a batch holds a batch whatever replays stored.)
        while s[S_ROWS] + rows > self.keys.shape[0]:
            self._grow(_FULL_ROWS)
        while s[S_OFF] + rows > self.off_pts.shape[0]:
            self._grow(_FULL_OFF)
        while s[S_TIME] + rows > self.time_pts.shape[0]:
            self._grow(_FULL_TIME)
        wide = self.keys.dtype != np.uint16
        limit = min(self.k_ip.shape[0], self.h_ip.shape[0] >> 1,
                    0x7FFFFFFF if wide else _U2_LIMIT - int(s[S_NSEQ]))  # fmt: skip
        if s[S_KEYS] + rows > limit:
            self._grow(_FULL_KEYS)

    @property
    def live(self) -> bool:
        """Whether the decoder can store rows here itself (while the keys
        are ``uint16``: up to 65,535 distinct blocks)."""
        return self.keys.dtype == np.uint16

    # -- reading ---------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.state[S_ROWS])

    @property
    def number(self) -> int:
        """The store's number, its own in this process."""
        return int(self.state[S_ID])

    @property
    def n_keys(self) -> int:
        return int(self.state[S_KEYS])

    def key_column(self, out: np.ndarray | None = None) -> np.ndarray:
        """Each row's block, an index into :meth:`table` (made from the
        entries when sequences stand for rows, valid until the rows are
        cleared); or written into ``out`` (of as many rows, any integer
        type), and that returned."""
        entries = self.entries()
        if out is not None:
            if entries.shape[0] == len(self):
                out[:] = entries
            else:
                expand_entries(entries, *self.sequences(), out)
            return out
        if entries.shape[0] == len(self):
            return entries
        memo = (entries.shape[0], len(self), self._clears)
        if self._expanded is None or self._expanded[0] != memo:
            # (Into one buffer, reused: a stream asks for each batch's.)
            buf = self._expand_buf
            if buf is None or buf.shape[0] < len(self) or buf.dtype != self.keys.dtype:
                buf = self._expand_buf = np.empty(max(len(self), self.keys.shape[0]),
                                                  self.keys.dtype)  # fmt: skip
            out = buf[: len(self)]
            expand_entries(entries, *self.sequences(), out)
            self._expanded = (memo, out)
        return self._expanded[1]

    def entries(self) -> np.ndarray:
        """The key column as stored: a block's key, or a sequence's (from
        :meth:`sequences`' floor up) standing for several rows."""
        return self.keys[: int(self.state[S_ENT])]

    def sequences(self) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
        """The sequences: the lowest key naming one, and each one's start
        and length in the pool of keys, and the pool."""
        n, pool = int(self.state[S_NSEQ]), int(self.state[S_SEQ_POOL])
        return SEQ_TOP + 1 - n, self.seq_start[:n], self.seq_len[:n], self.seq_keys[:pool]

    def n_insn(self) -> int:
        """The instructions of the rows held."""
        return int(entries_ninsn(self.entries(), *self.sequences(), self.k_ninsn))

    def table(self) -> dict[str, np.ndarray]:
        """The distinct blocks: ``ip``, ``ninsn``, ``mode``, ``image``."""
        n = self.n_keys
        return {"ip": self.k_ip[:n], "ninsn": self.k_ninsn[:n], "mode": self.k_mode[:n],
                "image": self.k_image[:n]}  # fmt: skip

    def offset_steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The trace offset's change points as stored (see put_offset): the
        points, and the far points' rows and offsets."""
        n, far = int(self.state[S_OFF]), int(self.state[S_OFF_FAR])
        return self.off_pts[:n], self.off_far_row[:far], self.off_far_val[:far]

    def last_offset(self) -> int:
        """The trace offset of the last row stored."""
        return int(self.state[S_LAST_OFF])

    def offset_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows where the trace offset changes, and the new offsets."""
        return _offset_changes(*self.offset_steps())

    def time_steps(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The time's change points as stored (see put_time): the points,
        and the far points' rows and times."""
        n, far = int(self.state[S_TIME]), int(self.state[S_T_FAR])
        return (
            self.time_pts[:n],
            self.time_far_row[:far],
            self.time_far_val[:far],
        )

    def time_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows where the time changes, and the new times."""
        return _time_changes(*self.time_steps())


@aot.njit(cache=True, _nrt=False)
def _row_keys(ip, ninsn, mode, image, start, end, out, keys, tab, cols, state):
    """Keys of rows ``start`` to ``end`` into ``out`` (see
    BlockStore.row_keys); returns the row it stopped at, before ``end``
    when the table is full."""
    n_keys = state[S_KEYS]
    key_limit = store_key_limit(keys, tab, cols, state)
    one = image.shape[0] == 1
    i = start
    while i < end:
        key, n_keys = _block_key(ip[i], ninsn[i], mode[i], image[0] if one else image[i], tab,
                                 cols, n_keys, key_limit)  # fmt: skip
        if key < 0:
            break
        out[i] = key
        i += 1
    state[S_KEYS] = n_keys
    return i


@aot.njit(cache=True, _nrt=False)
def _rehash(h_ip, h_meta, h_id, k_ip, k_ninsn, k_mode, k_image, n):
    mask = h_ip.shape[0] - 1
    for key in range(n):
        meta = np.uint64(k_ninsn[key]) | (np.uint64(k_mode[key]) << np.uint64(32))
        meta |= np.uint64(k_image[key]) << np.uint64(40)
        s = _slot(k_ip[key], meta, mask)
        while h_id[s] >= 0:
            s = (s + 1) & mask
        h_ip[s] = k_ip[key]
        h_meta[s] = meta
        h_id[s] = key


def _time_changes(t_pts: np.ndarray, t_far_row: np.ndarray,
                  t_far_val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Time change points (rows, times) from their steps (see put_time)."""
    rows, values = np.empty(t_pts.shape[0], np.int64), np.empty(t_pts.shape[0], np.uint64)
    time_points(t_pts, t_far_row, t_far_val, rows, values)
    return rows, values


def _offset_changes(pts: np.ndarray, far_row: np.ndarray, far_val: np.ndarray,
                    row_base: int = 0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Offset change points (rows, offsets) from their points (see
    put_offset)."""
    rows, values = np.empty(pts.shape[0], np.int64), np.empty(pts.shape[0], np.int64)
    offset_points(pts, far_row, far_val, rows, values)
    if row_base:
        rows += row_base
    return rows, values


def _joined_table(ip: np.ndarray, meta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One table of several stores' distinct blocks (``ip``, ``meta``:
    their tables end to end), numbered by first appearance, so the first
    store's blocks keep their keys: the rows of ``ip`` it keeps, and each
    row's number in it."""
    both = np.stack([ip, meta], axis=1)
    _, first, inverse = np.unique(both, axis=0, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    number = np.empty(order.shape[0], np.int64)
    number[order] = np.arange(order.shape[0])
    return first[order], number[inverse.reshape(-1)]


def _joined_keys(stores: list[BlockStore], renumbered: np.ndarray, n_distinct: int) -> np.ndarray:
    """Every row's key in the stores' joined table (:func:`_joined_table`).
    Each store's keys are written once into the joined column: a copy of a
    column of 32 M rows is 64 MB of fresh memory to fault in and fill, which
    costs more than the decoding threads saved."""
    wide = np.uint32 if n_distinct > _U2_LIMIT else np.uint16
    keys = np.empty(sum(len(s) for s in stores), wide)
    row = base = 0
    for s in stores:
        out = keys[row : row + len(s)]
        if base == 0:
            # (numbered as they were; copied from the store's own column,
            # not expanded into the wider joined one: the expansion keeps
            # the one specialisation the warm-up compiles)
            out[:] = s.key_column()
        else:
            gather(renumbered[base : base + s.n_keys].astype(wide), s.key_column(), out)
        row += len(s)
        base += s.n_keys
    return keys


@aot.njit(cache=True, nogil=True, _nrt=False)
def gather(table, index, out):
    """``out[i] = table[index[i]]``: a column looked up by each row's key
    (numpy's gathers take 3-9 ns a row here, this loop well under 1)."""
    for i in range(index.shape[0]):
        out[i] = table[index[i]]


def expand_changes(rows: np.ndarray, values: np.ndarray, n: int, dtype) -> np.ndarray:
    """A dense column of ``n`` rows from its change points."""
    if n == 0:
        return np.zeros(0, dtype)
    lengths = np.diff(rows, append=n)
    return np.repeat(values.astype(dtype, copy=False), lengths)


def _joined(parts: list[np.ndarray], dtype) -> np.ndarray:
    """The parts end to end (one part is used as it is: no copy)."""
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, dtype)


class CompactBlocks:
    """The blocks of one decoding, joined from its stores in order: a key
    per row into one table of distinct blocks, and change points for the
    trace offset and time."""

    def __init__(self, stores: list[BlockStore]) -> None:
        tables = [s.table() for s in stores]
        ip = np.concatenate([t["ip"] for t in tables])
        meta = np.concatenate(
            [
                t["ninsn"].astype(np.uint64)
                | (t["mode"].astype(np.uint64) << np.uint64(32))
                | (t["image"].astype(np.uint64) << np.uint64(40))
                for t in tables
            ]
        )
        # Rows stay the stores' entries and sequences until a column is
        # asked for (a decoding that wants counts or the distinct blocks
        # never makes a key a row).
        self._keys: np.ndarray | None = None
        self._stores: list[BlockStore] = stores
        self._renumbered: np.ndarray | None = None
        if len(stores) == 1:
            uniq_index = np.arange(ip.shape[0])
        else:
            uniq_index, self._renumbered = _joined_table(ip, meta)
        self.ip = ip[uniq_index]
        m = meta[uniq_index]
        self.ninsn = (m & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        self.mode = ((m >> np.uint64(32)) & np.uint64(0xFF)).astype(np.uint8)
        self.image = (m >> np.uint64(40)).astype(np.uint16)
        self.n = sum(len(s) for s in stores)
        base = 0
        # The offsets and times stay as the stores keep them (steps: 1 and 2
        # bytes a point where absolute ones take 16) until asked for.
        self._offset_steps: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]] = []
        self._time_steps: list[tuple[tuple[np.ndarray, ...], int]] = []
        for s in stores:
            self._offset_steps.append((*s.offset_steps(), base))
            self._time_steps.append((s.time_steps(), base))
            base += len(s)
        self._times: tuple[np.ndarray, np.ndarray] | None = None

    def time_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows where the time changes, and the new times."""
        if self._times is None:
            rows, values = [], []
            for steps, base in self._time_steps:
                r, v = _time_changes(*steps)
                rows.append(r + base if base else r)
                values.append(v)
            self._times = (_joined(rows, np.int64), _joined(values, np.uint64))
        return self._times

    @property
    def time_rows(self) -> np.ndarray:
        """The rows where the time changes."""
        return self.time_changes()[0]

    @property
    def time_values(self) -> np.ndarray:
        """The time from each of :attr:`time_rows` on."""
        return self.time_changes()[1]

    def offset_changes(self) -> tuple[np.ndarray, np.ndarray]:
        """The rows where the trace offset changes, and the new offsets."""
        parts = [_offset_changes(*p) for p in self._offset_steps]
        return (_joined([r for r, _ in parts], np.int64), _joined([v for _, v in parts], np.int64))

    @property
    def keys(self) -> np.ndarray:
        """Each row's key into the distinct blocks."""
        if self._keys is None:
            if self._renumbered is None:
                self._keys = self._stores[0].key_column()
            else:
                self._keys = _joined_keys(self._stores, self._renumbered, self.ip.shape[0])
                self._stores = []  # (the keys are all they were kept for)
        return self._keys

    @property
    def nbytes(self) -> int:
        steps = sum(sum(a.nbytes for a in p[:3]) for p in self._offset_steps)
        if self._keys is not None:
            keys = self._keys.nbytes
        else:
            keys = sum(
                s.entries().nbytes + sum(a.nbytes for a in s.sequences()[1:]) for s in self._stores
            )
        if self._times is not None:
            times = sum(a.nbytes for a in self._times)
        else:
            times = sum(a.nbytes for steps, _ in self._time_steps for a in steps)
        return steps + keys + times + sum(
            a.nbytes for a in (self.ip, self.ninsn, self.mode, self.image)
        )  # fmt: skip

    def n_insn(self) -> int:
        if self._keys is None:
            return sum(s.n_insn() for s in self._stores)
        counts = np.bincount(self._keys, minlength=self.ip.shape[0])
        return int(np.dot(counts.astype(np.uint64), self.ninsn.astype(np.uint64)))

    def column(self, name: str) -> np.ndarray:
        """A dense column: ``ip``, ``ninsn``, ``mode``, ``image``,
        ``offset`` or ``time``."""
        if name == "offset":
            # (Laid out from the points, store by store: a tenth of the time
            # of change points expanded with numpy.)
            out = np.empty(self.n, np.int64)
            ends = [p[3] for p in self._offset_steps[1:]] + [self.n]
            for (pts, far_row, far_val, base), end in zip(self._offset_steps, ends, strict=True):
                offsets_of(pts, far_row, far_val, end - base, out[base:end])
            return out
        if name == "time":
            return expand_changes(*self.time_changes(), self.n, np.uint64)
        return getattr(self, name)[self.keys]


__all__ = ["BlockStore", "CompactBlocks", "expand_changes", "gather", "grown"]
