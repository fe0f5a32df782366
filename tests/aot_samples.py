"""Loops of every argument and result shape the native library handles
(tests/package/test_aot.py builds a library of them)."""

import numba as nb
import numpy as np

from hwtrace import aot


@nb.njit(inline="always")
def _twice(x):
    return 2 * x


@aot.njit(nogil=True, _nrt=False)
def total(buf, start, end):
    """Sum of a read-only byte buffer's slice: arrays, ints, an int result."""
    s = 0
    for i in range(start, end):
        s += buf[i]
    return s


@aot.njit(_nrt=False)
def fill(state, out, value, scale, flag):
    """Tuples of arrays (one 2-D), uint64, float and bool scalars; writes
    in place and returns a tuple of mixed scalars."""
    counts, rows = out
    n = 0
    for i in range(rows.shape[0]):
        for j in range(rows.shape[1]):
            rows[i, j] = value + np.uint64(i * rows.shape[1] + j)
            n += 1
    counts[0] = n
    state[0][0] += 1
    return n, _twice(scale) if flag else scale, flag


@aot.njit(_nrt=False)
def nothing(a):
    a[0] = 7


@aot.njit(_nrt=False)
def checked(a, i):
    if i >= a.shape[0]:
        raise IndexError("past the end")
    return a[i] > 0


@aot.njit(_nrt=False)
def calls_loop(buf):
    """A loop calling another through its CompiledLoop object."""
    return total(buf, 0, buf.shape[0]) + 1


@aot.njit
def allocates(n):
    """Needs numba's runtime (it allocates): stays numba's."""
    return np.arange(n).sum()
