"""Compiled address-to-symbol lookup for :class:`~hwtrace.image.symbols.SymbolTable`.

A decoded flow's blocks come in long runs inside one function, so the
loop remembers the interval between two symbol starts the previous
address fell in and only searches (binary search, as ``np.searchsorted``)
when an address leaves it.  The answer is exactly the vectorised one.
"""

from __future__ import annotations

import numpy as np

from .. import aot


@aot.njit(cache=True, inline="always", _nrt=False)
def _interval(start, a):
    """The last symbol starting at or before ``a`` (-1: none) and the
    interval between symbol starts ``a`` lies in."""
    n = start.shape[0]
    # searchsorted(start, a, side="right") - 1
    lo = 0
    hi = n
    while lo < hi:
        mid = (lo + hi) >> 1
        if start[mid] <= a:
            lo = mid + 1
        else:
            hi = mid
    last = lo - 1
    lo_addr = start[last] if last >= 0 else np.uint64(0)
    # (Past the last start: up to the top address, which is searched for
    # each time it comes.)
    hi_addr = start[lo] if lo < n else np.uint64(0xFFFFFFFFFFFFFFFF)
    return last, lo_addr, hi_addr


@aot.njit(cache=True, inline="always", _nrt=False)
def _covering(end, cover, last, a):
    """The symbol covering ``a`` given the last one starting at or before
    it (-1: none)."""
    if last < 0:
        return -1
    if a < end[last]:
        return last
    outer = cover[last]
    return outer if a < end[outer] else -1


@aot.njit(cache=True, _nrt=False)
def lookup_index(start, end, cover, addr, out):
    """``out[i]``: the symbol covering ``addr[i]`` (-1: none): the last
    symbol starting at or before it if it reaches the address, else the
    longest earlier one (``cover``) if that does."""
    lo_addr = np.uint64(1)  # the remembered interval [lo_addr, hi_addr): empty
    hi_addr = np.uint64(0)
    last = -1
    for i in range(addr.shape[0]):
        a = addr[i]
        if not (a >= lo_addr and a < hi_addr):
            last, lo_addr, hi_addr = _interval(start, a)
        out[i] = _covering(end, cover, last, a)


@aot.njit(cache=True, _nrt=False)
def lookup_index_memo(start, end, cover, addr, out, memo_ip, memo_index):
    """:func:`lookup_index` through a memo of the addresses looked up
    before (a direct-mapped cache: ``memo_ip`` and ``memo_index``, a power
    of two long, each slot an address and its answer, all slots holding
    address 0's to begin with): a flow's blocks come back to the same few
    thousand addresses from function to function, where the interval of
    the last one only serves a run inside one function."""
    shift = np.uint64(64 - _log2(memo_ip.shape[0]))
    golden = np.uint64(0x9E3779B97F4A7C15)
    lo_addr = np.uint64(1)
    hi_addr = np.uint64(0)
    last = -1
    for i in range(addr.shape[0]):
        a = addr[i]
        s = (a * golden) >> shift
        if memo_ip[s] == a:
            out[i] = memo_index[s]
            continue
        if not (a >= lo_addr and a < hi_addr):
            last, lo_addr, hi_addr = _interval(start, a)
        r = _covering(end, cover, last, a)
        out[i] = r
        memo_ip[s] = a
        memo_index[s] = r


@aot.njit(cache=True, inline="always", _nrt=False)
def _log2(n):
    b = 0
    while (1 << (b + 1)) <= n:
        b += 1
    return b
