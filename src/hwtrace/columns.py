"""Tables held as equal-length numpy columns.

Decoders and analyses return their rows as a dataclass of numpy arrays, one
per column; :class:`Columns` is the base that gives such a table its row
count, so each table only declares its columns."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import ClassVar

import numpy as np


class Columns:
    """Base of a dataclass whose numpy columns have one length: ``len()``
    is the number of rows, the length of the ``ROWS`` field (by default
    the first field)."""

    ROWS: ClassVar[str | None] = None

    def __len__(self) -> int:
        name = self.ROWS or next(iter(self.__dataclass_fields__))  # type: ignore[attr-defined]
        return int(getattr(self, name).shape[0])


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values (or records) of a 1-D array (``np.unique(values)``,
    whose first call imports ``numpy.ma``, a fortieth of a second of every
    command's start)."""
    a = np.sort(np.asarray(values).reshape(-1), kind="stable")
    if a.shape[0] < 2:
        return a
    keep = np.empty(a.shape[0], np.bool_)
    keep[0] = True
    if a.dtype.names:  # records: compared field by field
        keep[1:] = a[1:] != a[:-1]
    else:
        np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def distinct_rows(rows: np.ndarray) -> np.ndarray:
    """The sorted distinct rows of a 2-D array (``np.unique(rows,
    axis=0)``, without its import of ``numpy.ma``)."""
    a = np.asarray(rows)
    if a.shape[0] < 2:
        return a.copy()
    a = a[np.lexsort(a.T[::-1])]
    keep = np.empty(a.shape[0], np.bool_)
    keep[0] = True
    np.any(a[1:] != a[:-1], axis=1, out=keep[1:])
    return a[keep]


def distinct_inverse(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of a 1-D array and each value's index
    among them (``np.unique(values, return_inverse=True)``, without its
    import of ``numpy.ma``)."""
    a = np.asarray(values).reshape(-1)
    order = np.argsort(a, kind="stable")
    return _grouped(a[order], order, _changes(a[order]))


def distinct_rows_inverse(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct rows of a 2-D array and each row's index among
    them (``np.unique(rows, axis=0, return_inverse=True)``)."""
    a = np.asarray(rows)
    order = np.lexsort(a.T[::-1])
    s = a[order]
    keep = np.ones(s.shape[0], np.bool_)
    if s.shape[0] > 1:
        np.any(s[1:] != s[:-1], axis=1, out=keep[1:])
    return _grouped(s, order, keep)


def _changes(s: np.ndarray) -> np.ndarray:
    keep = np.ones(s.shape[0], np.bool_)
    if s.shape[0] > 1:
        np.not_equal(s[1:], s[:-1], out=keep[1:])
    return keep


def _grouped(s: np.ndarray, order: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    inverse = np.empty(order.shape[0], np.intp)
    inverse[order] = np.cumsum(keep) - 1
    return s[keep], inverse


def member(values: np.ndarray, sorted_set: np.ndarray) -> np.ndarray:
    """Whether each of ``values`` is in ``sorted_set`` (ascending):
    ``np.isin(values, sorted_set)``, without its import of ``numpy.ma``."""
    values = np.asarray(values)
    if sorted_set.shape[0] == 0:
        return np.zeros(values.shape, np.bool_)
    at = np.minimum(np.searchsorted(sorted_set, values), sorted_set.shape[0] - 1)
    return sorted_set[at] == values


def pow2_at_least(n: int) -> int:
    """The least power of two of at least ``n`` (1 for 0): a buffer's
    rows, or a ring's slots."""
    return 1 << max(int(n) - 1, 0).bit_length()


# The x86-64 huge page.
HUGE_PAGE = 1 << 21


def _huge_aligned(shape: int | tuple[int, ...], dtype: object, least: int,
                  zeroed: bool) -> np.ndarray:  # fmt: skip
    """An array of ``shape`` starting on a huge-page boundary, once it
    holds ``least`` bytes (else a plain one), in an allocation of 4 MiB
    at least: numpy advises the kernel to back those with huge pages, but
    its allocator hands them out at any 4 KiB page, and the kernel backs
    only whole aligned huge pages."""
    dt = np.dtype(dtype)
    dims = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    nbytes = int(np.prod(dims, dtype=np.int64)) * dt.itemsize
    make = np.zeros if zeroed else np.empty
    if nbytes < least:
        return make(dims, dt)
    raw = make(max(nbytes, HUGE_PAGE) + HUGE_PAGE, np.uint8)
    start = -raw.ctypes.data % HUGE_PAGE
    return raw[start : start + nbytes].view(dt).reshape(dims)


def dense_empty(shape: int | tuple[int, ...], dtype: object) -> np.ndarray:
    """``np.empty(shape, dtype)`` for a column written densely from its
    start, on huge pages from its first byte once it spans one: otherwise
    the 4 KiB pages before the allocation's first 2 MiB boundary (up to
    511) each fault on first touch and each take a TLB entry.  (Memory
    never written still costs nothing; a column written sparsely is better
    off without: a huge page is cleared whole.)"""
    return _huge_aligned(shape, dtype, HUGE_PAGE, False)


def random_access_zeros(shape: int | tuple[int, ...], dtype: object) -> np.ndarray:
    """``np.zeros(shape, dtype)`` for a table read and written anywhere (a
    hash table, a cache): from 512 KiB on, it lies on huge pages, so that
    a lookup finds its page in one TLB entry where 4 KiB pages take one
    each (a 1 MiB table's 256 do not stay in the first-level TLB).  The
    first touch clears 2 MiB: smaller tables are left on 4 KiB pages."""
    return _huge_aligned(shape, dtype, HUGE_PAGE // 4, True)


def repeated(value: object, n: int, kind: type) -> np.ndarray:
    """``n`` rows of ``value`` as ``kind``: a read-only broadcast of one
    value (no memory a row), for a column known to hold one value."""
    return np.broadcast_to(np.array(value, kind), (n,))


class Keyed:
    """A column whose values depend only on each row's block: ``keys``
    (one per row) into ``table`` (a value per distinct block) of
    ``source`` (the table's owner: the tables of one source only grow, so
    its keys name the same blocks in all of them), not laid out a row at a
    time.  The Parquet writer makes a dictionary chunk of it from the keys,
    its index pages shared with the other columns keyed by the same keys.
    Slices as a numpy array does; ``numpy.asarray`` gives its values."""

    __slots__ = ("keys", "source", "table", "total")
    ndim = 1

    def __init__(self, keys: np.ndarray, table: np.ndarray, source: int = 0,
                 total: int | None = None) -> None:  # fmt: skip
        self.keys, self.table, self.source = keys, table, source
        #: the sum of the rows' values (None: not known)
        self.total = total

    @property
    def dtype(self) -> np.dtype:
        return self.table.dtype

    @property
    def shape(self) -> tuple[int]:
        return self.keys.shape

    def __len__(self) -> int:
        return self.keys.shape[0]

    def __getitem__(self, rows: slice) -> Keyed:
        return Keyed(self.keys[rows], self.table, self.source)

    def sum(self) -> int:
        """The sum of the values."""
        if self.total is not None:
            return self.total
        return int(np.take(self.table, self.keys).sum())

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        values = np.take(self.table, self.keys)
        return values if dtype is None else values.astype(dtype, copy=False)


class Deferred:
    """A column of ``n`` rows made when first asked for, by ``make`` (an
    array, or a column such as :class:`Runs`), in the thread that asks: a
    decoding thread hands on a copy of what it has compactly (its block
    store's entries, a few bytes a row) and the taker's thread lays it out.
    ``nbytes``: the memory the compact form holds.  :func:`resolved` (or
    ``numpy.asarray``) gives what ``make`` made, made once; a slice is a
    column made from the whole (once) when asked for.  One thread at a time
    asks."""

    __slots__ = ("_made", "_make", "dtype", "n", "nbytes")
    ndim = 1

    def __init__(self, n: int, dtype: object, make: Callable[[], object], nbytes: int = 0) -> None:
        self.n, self.dtype, self.nbytes = int(n), np.dtype(dtype), nbytes
        self._make: Callable[[], object] | None = make
        self._made: object = None

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __len__(self) -> int:
        return self.n

    def made(self) -> object:
        """What ``make`` made (made now the first time)."""
        if self._make is not None:
            self._made, self._make = self._make(), None
        return self._made

    def __getitem__(self, rows: slice) -> Deferred:
        lo, hi, step = rows.indices(self.n)
        if step != 1:
            raise IndexError("deferred column slice with a step of 1 only")
        if (lo, hi) == (0, self.n):
            return self
        return Deferred(max(hi - lo, 0), self.dtype, lambda: self.made()[lo:hi],  # type: ignore[index]
                        self.nbytes)  # fmt: skip

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return np.asarray(self.made(), dtype)


#: Rows cut off the end of keys in sequences by walking their entries back
#: one by one at most (more: the entries' rows summed in numpy).
_CUT_WALK = 64


class SequencedKeys(Deferred):
    """Rows' keys as a block store keeps them: ``entries``, each a key or,
    from ``floor`` up, a sequence of keys (entry ``e`` stands for the
    ``seq_len[q]`` keys of ``seq_keys`` from ``seq_start[q]``, ``q = top -
    e``), for ``n`` rows; ``make`` lays them out.  A taker that can work on
    the entries (the Parquet writer: a few bytes per three or four rows)
    does; :func:`resolved` leaves them so."""

    __slots__ = ("__weakref__", "_first", "entries", "floor", "order", "seq_keys", "seq_len",
                 "seq_start", "top")  # fmt: skip

    def __init__(self, n: int, entries: np.ndarray, floor: int, top: int, seq_start: np.ndarray,
                 seq_len: np.ndarray, seq_keys: np.ndarray,
                 make: Callable[[], object]) -> None:  # fmt: skip
        nbytes = entries.nbytes + seq_start.nbytes + seq_len.nbytes + seq_keys.nbytes
        super().__init__(n, entries.dtype, make, nbytes)
        self.entries, self.floor, self.top = entries, int(floor), int(top)
        self.seq_start, self.seq_len, self.seq_keys = seq_start, seq_len, seq_keys
        # (the last cut of the first rows, held weakly: it holds these)
        self._first: tuple[int, weakref.ref] | None = None
        #: the distinct keys in the order the rows first name them, once
        #: counted (None before)
        self.order: np.ndarray | None = None

    def __getitem__(self, rows: slice) -> Deferred:
        # The first rows (a batch but its last, held back): the entries but
        # the last few, a sequence cut short as its keys.
        lo, hi, step = rows.indices(self.n)
        if step != 1 or lo != 0 or hi >= self.n:
            return super().__getitem__(rows)
        cut_before = self._first[1]() if self._first is not None and self._first[0] == hi else None
        if cut_before is not None:
            return cut_before  # (the columns keyed by these keys cut alike)
        cut, e, tail = self.n - hi, self.entries.shape[0], self.entries[:0]
        if cut > _CUT_WALK:
            # (rows far from the end, as a partition's time bucket cuts a
            # batch: the entries' rows summed, not walked back one by one)
            e, part = self._entries_before(hi)
            if part:
                start = int(self.seq_start[self.top - int(self.entries[e])])
                tail = self.seq_keys[start : start + part].astype(self.entries.dtype)
            cut = 0
        while cut > 0 and e > 0:
            e -= 1
            k = int(self.entries[e])
            length = 1 if k < self.floor else int(self.seq_len[self.top - k])
            if length > cut:
                start = int(self.seq_start[self.top - k])
                tail = self.seq_keys[start : start + length - cut].astype(self.entries.dtype)
                cut = 0
            else:
                cut -= length
        if cut > 0:
            return super().__getitem__(rows)
        entries = np.concatenate([self.entries[:e], tail]) if tail.shape[0] else self.entries[:e]
        first = SequencedKeys(hi, entries, self.floor, self.top, self.seq_start, self.seq_len,
                              self.seq_keys, lambda: self.made()[:hi])  # type: ignore[index]  # fmt: skip
        self._first = (hi, weakref.ref(first))
        return first

    def _entries_before(self, row: int) -> tuple[int, int]:
        """How many entries give rows before ``row`` whole, and how many of
        the next one's rows (a sequence's first keys) come before it."""
        k = self.entries.astype(np.int64)
        lengths = np.ones(k.shape[0], np.int64)
        seq = k >= self.floor
        lengths[seq] = self.seq_len[self.top - k[seq]]
        ends = np.cumsum(lengths)
        e = int(np.searchsorted(ends, row, side="right"))
        return e, row - (int(ends[e - 1]) if e else 0)

    def last(self) -> int:
        """The last row's key."""
        k = int(self.entries[-1])
        if k < self.floor:
            return k
        q = self.top - k
        return int(self.seq_keys[self.seq_start[q] + self.seq_len[q] - 1])


class OffsetPoints(Deferred):
    """A batch's trace offsets as a block store keeps them: ``first``, a
    held row's (None: no held row), then from row ``at`` the store's rows,
    given by its offset points ``points`` (see hwtrace.pt.blocks.put_offset:
    a byte a change, and the far ones), for ``n`` rows; ``make`` makes them
    :class:`Runs`.  The Parquet writer encodes a page of them from the
    points; :func:`resolved` leaves them so."""

    __slots__ = ("at", "first", "points")

    def __init__(self, n: int, first: int | None, points: tuple[np.ndarray, ...], at: int,
                 make: Callable[[], object]) -> None:  # fmt: skip
        super().__init__(n, np.int64, make, sum(a.nbytes for a in points))
        self.first, self.points, self.at = first, points, int(at)

    def __getitem__(self, rows: slice) -> OffsetPoints | Runs:
        lo, hi, step = rows.indices(self.n)
        if (lo, hi, step) == (0, self.n, 1):
            return self
        if step != 1 or lo != 0:
            # (rows from further on, as a partition cuts a batch: as runs)
            return self.made()[rows]  # type: ignore[index]
        # (the first rows, a batch but its held last: the same points, read
        # up to ``hi``)
        return OffsetPoints(hi, self.first, self.points, self.at, lambda: self.made()[:hi])  # type: ignore[index]


def resolved(column: object) -> object:
    """``column`` with what is deferred in it made: a :class:`Deferred`'s
    column, a :class:`Keyed` column's deferred keys laid out (not keys kept
    in sequences, :class:`SequencedKeys`, nor trace offsets kept as offset
    points, :class:`OffsetPoints`); any other column as it is."""
    if isinstance(column, SequencedKeys | OffsetPoints):
        return column
    if isinstance(column, Deferred):
        return column.made()
    keys = column.keys if isinstance(column, Keyed) else None
    if isinstance(keys, Deferred) and not isinstance(keys, SequencedKeys):
        return Keyed(keys.made(), column.table, column.source, column.total)  # type: ignore[arg-type, union-attr]
    return column


class _RunColumn:
    """A column of ``n`` int64 rows held as runs (``starts``: each run's
    first row, ``values``: what the run holds)."""

    __slots__ = ("n", "starts", "values")
    ndim = 1
    dtype = np.dtype(np.int64)

    def __init__(self, starts: np.ndarray, values: np.ndarray, n: int) -> None:
        self.starts, self.values, self.n = starts, values, int(n)

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __len__(self) -> int:
        return self.n

    def lengths(self) -> np.ndarray:
        """Each run's rows."""
        return np.diff(self.starts, append=self.n)


class Runs(_RunColumn):
    """A column of ``n`` rows given as runs of one value: run ``r`` holds
    ``values[r]`` from row ``starts[r]`` (the first at 0) to the next run's
    start; a run's value differs from the one before (a block's time,
    which changes every few hundred blocks), not laid out a row at a
    time.  The Parquet writer makes its pages a run at a time.  Slices as
    a numpy array does; ``numpy.asarray`` gives its values."""

    __slots__ = ()

    @classmethod
    def of(cls, values: np.ndarray, most: int = 4) -> Runs | np.ndarray:
        """``values`` (int64) as runs, or themselves when more than one row
        in ``most`` starts a run."""
        values = np.asarray(values, np.int64)
        n = values.shape[0]
        starts = np.flatnonzero(values[1:] != values[:-1]) + 1 if n else values[:0]
        if starts.shape[0] + 1 > n // most:
            return values
        starts = np.concatenate([np.zeros(1, np.int64), starts.astype(np.int64)])
        return cls(starts, values[starts], n)

    def __getitem__(self, rows: slice) -> Runs:
        lo, hi, step = rows.indices(self.n)
        if step != 1:
            raise IndexError("runs slice with a step of 1 only")
        if hi <= lo:
            return Runs(self.starts[:0], self.values[:0], 0)
        a = int(np.searchsorted(self.starts, lo, side="right")) - 1
        b = int(np.searchsorted(self.starts, hi, side="left"))
        if lo == 0:
            # (the rows' first runs: their starts as they are, not copied)
            return Runs(self.starts[:b], self.values[:b], hi)
        starts = self.starts[a:b] - lo
        starts[0] = 0
        return Runs(starts, self.values[a:b], hi - lo)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        return np.repeat(self.values, self.lengths()).astype(dtype or np.int64, copy=False)


def joined(starts: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs (their first rows, their values) with each run of the value of
    the one before joined to it: maximal runs, as :class:`Runs` holds."""
    keep = np.ones(values.shape[0], np.bool_)
    np.not_equal(values[1:], values[:-1], out=keep[1:])
    return starts[keep], values[keep]


class Ramps(_RunColumn):
    """A column of ``n`` int64 values that rise by one a row within runs:
    run ``r`` starts at row ``starts[r]`` with ``values[r]`` (where each
    byte of a stream cut from formatter frames was in its file: a few
    numbers per frame, not eight bytes per byte).  :meth:`at` gives
    rows' values, ``numpy.asarray`` them all."""

    __slots__ = ()

    @classmethod
    def of(cls, values: np.ndarray) -> Ramps:
        """``values`` (int64) as ramps: a run where a value is not one more
        than the one before."""
        values = np.asarray(values, np.int64)
        n = values.shape[0]
        starts = np.flatnonzero(np.diff(values) != 1) + 1 if n else values[:0]
        starts = np.concatenate([np.zeros(min(n, 1), np.int64), starts.astype(np.int64)])
        return cls(starts, values[starts], n)

    def __add__(self, offset: int) -> Ramps:
        return Ramps(self.starts, self.values + int(offset), self.n)

    def at(self, rows: np.ndarray) -> np.ndarray:
        """The values of ``rows`` (each in ``0..n-1``)."""
        rows = np.asarray(rows, np.int64)
        run = np.searchsorted(self.starts, rows, side="right") - 1
        return self.values[run] + (rows - self.starts[run])

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        # (each run's value less its first row, a row at a time, plus the
        # rows, 65,536 at a time: eight bytes a row and little more)
        out = np.repeat(self.values - self.starts, self.lengths())
        for lo in range(0, self.n, _RAMP_ROWS):
            hi = min(lo + _RAMP_ROWS, self.n)
            out[lo:hi] += np.arange(lo, hi, dtype=np.int64)
        return out.astype(dtype or np.int64, copy=False)


#: Rows :class:`Ramps` lays out at a time.
_RAMP_ROWS = 1 << 16
