"""The patch backend's compiled loops: the sweep's leaders and windows, the
arithmetic flags' liveness, and the placement of stubs.

Apart from :mod:`.sites` and :mod:`.layout` so that a recording whose
sweeps and plans are all cached imports no numba: these are imported
where a sweep or a plan is made.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .sites import K_BAD, K_CALL, K_COND, K_FAR, K_JMP, K_OTHER, K_SYSCALL

__all__ = [
    "flags_dead",
    "flags_dead_everywhere",
    "mark_jump_tables",
    "mark_leaders",
    "place_stubs",
    "windows",
]


@njit(cache=True)
def mark_leaders(ips, lens, kinds, targets, extra, leaders):
    n = ips.shape[0]
    for i in range(n):
        k = kinds[i]
        if k != K_OTHER and i + 1 < n:
            leaders[i + 1] = True
        if k == K_COND or k == K_JMP or k == K_CALL:
            j = np.searchsorted(ips, targets[i])
            if j < n and ips[j] == targets[i]:
                leaders[j] = True
    for a in extra:
        j = np.searchsorted(ips, a)
        if j < n and ips[j] == a:
            leaders[j] = True


@njit(cache=True)
def mark_jump_tables(ips, kinds, rip_targets, leaders, lo, hi, tables):
    """Targets of relative jump tables: for a RIP-relative operand T whose
    int32 entries e give T + e at instruction starts inside the code, every
    such entry (until the first that does not) is a leader."""
    addrs, bounds, entries = tables
    n = ips.shape[0]
    for t in range(addrs.shape[0]):
        base = np.int64(addrs[t])
        for e in range(bounds[t], bounds[t + 1]):
            a = np.uint64(base + np.int64(entries[e]))
            inside = False
            for s in range(lo.shape[0]):
                if lo[s] <= a < hi[s]:
                    inside = True
            if not inside:
                break
            j = np.searchsorted(ips, a)
            if j >= n or ips[j] != a or kinds[j] == K_BAD:
                break
            leaders[j] = True


@njit(cache=True)
def windows(ips, lens, kinds, leaders, instrumented, before):
    """For each instrumented instruction (index): the first instruction of
    its shortest window (-1 where its block has fewer than 5 bytes up to
    it: a trap site), the first instruction of its block, and the first a
    window may start at when it crosses leaders (the blocks before it that fall
    through into it, up to the last control transfer).  Where ``before``
    is set the window ends before the instruction (a call that stays in
    place), and -1 means its block has fewer than 5 bytes before it."""
    first = np.full(instrumented.shape[0], -1, np.int64)
    block = np.empty(instrumented.shape[0], np.int64)
    reach = np.empty(instrumented.shape[0], np.int64)
    for w in range(instrumented.shape[0]):
        i = instrumented[w]
        total = np.int64(0) if before[w] else np.int64(lens[i])
        j = i
        while j > 0 and not leaders[j]:
            p = j - 1
            if kinds[p] != K_OTHER or ips[p] + lens[p] != ips[j]:
                break
            j = p
            total += lens[j]
            if total >= 5 and first[w] < 0:
                first[w] = j
        if lens[i] >= 5 and not before[w]:
            first[w] = i
        block[w] = j
        while j > 0:
            p = j - 1
            if kinds[p] != K_OTHER or ips[p] + lens[p] != ips[j]:
                break
            j = p
        reach[w] = j
    return first, block, reach


@njit(cache=True)
def flags_dead(ips, lens, kinds, flags, targets, at):
    """Whether the arithmetic flags are dead at instruction ``at`` (index;
    -1: unknown code): every path from it writes each of them before
    reading it.  Follows straight-line code and direct jumps; any other
    control transfer, a system call or undecodable bytes before all six
    are written count as reads."""
    n = ips.shape[0]
    undecided = 0x3F
    for _ in range(64):
        if at < 0 or at >= n:
            return False
        k = kinds[at]
        if k == K_BAD or k == K_FAR or k == K_SYSCALL:
            return False
        f = np.int64(flags[at])
        if f & undecided:
            return False
        undecided &= ~(f >> 8)
        if undecided == 0:
            return True
        if k == K_JMP:
            t = targets[at]
            at = np.searchsorted(ips, t)
            if at >= n or ips[at] != t:
                return False
        elif k != K_OTHER:
            return False
        elif at + 1 >= n or ips[at] + lens[at] != ips[at + 1]:
            return False
        else:
            at += 1
    return False


@njit(cache=True)
def flags_dead_everywhere(ips, lens, kinds, flags, targets):
    """:func:`flags_dead` at every instruction."""
    out = np.zeros(ips.shape[0], np.bool_)
    for i in range(ips.shape[0]):
        out[i] = flags_dead(ips, lens, kinds, flags, targets, i)
    return out


@njit(cache=True)
def _deposit(x, free):
    out = np.uint64(0)
    k = np.uint64(0)
    for b in range(32):
        bit = np.uint64(1) << np.uint64(b)
        if free & bit:
            if (x >> k) & np.uint64(1):
                out |= bit
            k += np.uint64(1)
    return out


@njit(cache=True)
def place_stubs(sites, masks, pats, lo, hi, occ):
    """A 5-byte stub address in ``[lo, hi)`` for each jump at ``sites``
    whose displacement must meet ``(mask, pattern)``, first fit, free in
    ``occ`` (one byte per arena byte); -1 where none."""
    out = np.full(sites.shape[0], -1, np.int64)
    for s in range(sites.shape[0]):
        base = sites[s] + 5
        rlo = lo - base
        rhi = hi - 5 - base
        if rlo < -(1 << 31) or rhi >= (1 << 31) or (rlo < 0) != (rhi < 0):
            continue  # the arena is not wholly on one side within reach
        ulo = np.uint64(rlo & 0xFFFFFFFF)
        uhi = np.uint64(rhi & 0xFFFFFFFF)
        mask = np.uint64(masks[s])
        pat = np.uint64(pats[s])
        free = ~mask & np.uint64(0xFFFFFFFF)
        nfree = 0
        for b in range(32):
            if free & (np.uint64(1) << np.uint64(b)):
                nfree += 1
        # smallest x with deposit(x) | pat >= ulo
        a, z = np.uint64(0), np.uint64(1) << np.uint64(nfree)
        while a < z:
            m = (a + z) >> np.uint64(1)
            if (_deposit(m, free) | pat) >= ulo:
                z = m
            else:
                a = m + np.uint64(1)
        x = a
        limit = np.uint64(1) << np.uint64(nfree)
        while x < limit:
            u = _deposit(x, free) | pat
            if u > uhi:
                break
            rel = np.int64(u) if u < np.uint64(1 << 31) else np.int64(u) - (np.int64(1) << 32)
            t = base + rel
            o = t - lo
            ok = True
            for q in range(5):
                if occ[o + q]:
                    ok = False
                    break
            if ok:
                for q in range(5):
                    occ[o + q] = 1
                out[s] = t
                break
            x += np.uint64(1)
    return out
