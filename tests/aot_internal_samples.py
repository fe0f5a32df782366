"""A module whose loops Python calls name themselves in ``AOT_ENTRIES``:
the others are only called by loops (tests/package/test_aot.py)."""

import numpy as np

from hwtrace import aot

AOT_ENTRIES = ("outer",)


@aot.njit(cache=True, _nrt=False)
def inner(a, k):
    """An internal loop: its code is linked into its callers'."""
    s = np.int64(0)
    for i in range(a.shape[0]):
        s += a[i] * k
    return s


@aot.njit(cache=True, _nrt=False)
def outer(a):
    return inner(a, 3) + 1
