"""perf's symbol tree in compiled code (see :mod:`hwtrace.image.perfsyms`).

perf keeps a DSO's symbols in a red-black tree keyed by start, an equal
start going right of those already in (``__symbols__insert``), balanced as
the kernel's ``lib/rbtree.c`` does: the textbook insertion and erasure, a
successor taking an erased node's place.  Its shape decides which of two
overlapping symbols ``symbols__find`` meets first, so it is rebuilt here
node for node.  The tree lives in arrays indexed by node: ``key``,
``left``, ``right``, ``parent`` (-1: none), ``red``, and ``st[0]`` the root.
"""

from __future__ import annotations

import numpy as np

from .. import aot
from .elf import STB_GLOBAL, STB_WEAK


@aot.njit(cache=True, inline="always", _nrt=False)
def _child(left, right, x, d):
    return left[x] if d == 0 else right[x]


@aot.njit(cache=True, inline="always", _nrt=False)
def _set_child(left, right, x, d, v):
    if d == 0:
        left[x] = v
    else:
        right[x] = v


@aot.njit(cache=True, inline="always", _nrt=False)
def _replace(left, right, parent, st, old, new):
    """Put ``new`` where ``old`` hangs from its parent."""
    p = parent[old]
    if new != -1:
        parent[new] = p
    if p == -1:
        st[0] = new
    elif left[p] == old:
        left[p] = new
    else:
        right[p] = new


@aot.njit(cache=True, inline="always", _nrt=False)
def _rotate(left, right, parent, st, x, d):
    """Rotate at ``x`` towards side ``d`` (0: a left rotation): its child on
    the other side takes its place and ``x`` hangs from it."""
    y = _child(left, right, x, 1 - d)
    near_y = _child(left, right, y, d)
    _set_child(left, right, x, 1 - d, near_y)
    if near_y != -1:
        parent[near_y] = x
    _replace(left, right, parent, st, x, y)
    _set_child(left, right, y, d, x)
    parent[x] = y


@aot.njit(cache=True, _nrt=False)
def tree_insert(key, left, right, parent, red, st, z):
    """Insert node ``z`` (its key set), right of equal keys."""
    y = -1
    x = st[0]
    while x != -1:
        y = x
        x = left[x] if key[z] < key[x] else right[x]
    parent[z] = y
    left[z] = -1
    right[z] = -1
    if y == -1:
        st[0] = z
    elif key[z] < key[y]:
        left[y] = z
    else:
        right[y] = z
    red[z] = 1
    while parent[z] != -1 and red[parent[z]]:
        p = parent[z]
        g = parent[p]
        d = 0 if p == left[g] else 1  # the side p hangs on
        u = _child(left, right, g, 1 - d)
        if u != -1 and red[u]:
            red[p] = 0
            red[u] = 0
            red[g] = 1
            z = g
            continue
        if z == _child(left, right, p, 1 - d):
            z = p
            _rotate(left, right, parent, st, z, d)
            p = parent[z]
        red[p] = 0
        red[g] = 1
        _rotate(left, right, parent, st, g, 1 - d)
    red[st[0]] = 0


@aot.njit(cache=True, _nrt=False)
def tree_first(left, st):
    x = st[0]
    while x != -1 and left[x] != -1:
        x = left[x]
    return x


@aot.njit(cache=True, _nrt=False)
def tree_next(left, right, parent, x):
    """The node after ``x`` in key order, or -1."""
    if right[x] != -1:
        x = right[x]
        while left[x] != -1:
            x = left[x]
        return x
    p = parent[x]
    while p != -1 and x == right[p]:
        x = p
        p = parent[p]
    return p


@aot.njit(cache=True, _nrt=False)
def _erase_fixup(left, right, parent, red, st, x, p):
    while x != st[0] and (x == -1 or not red[x]):
        d = 0 if x == left[p] else 1  # the side x hangs on
        w = _child(left, right, p, 1 - d)
        if red[w]:
            red[w] = 0
            red[p] = 1
            _rotate(left, right, parent, st, p, d)
            w = _child(left, right, p, 1 - d)
        wn = _child(left, right, w, d)
        wf = _child(left, right, w, 1 - d)
        if (wn == -1 or not red[wn]) and (wf == -1 or not red[wf]):
            red[w] = 1
            x = p
            p = parent[p]
            continue
        if wf == -1 or not red[wf]:
            red[wn] = 0
            red[w] = 1
            _rotate(left, right, parent, st, w, 1 - d)
            w = _child(left, right, p, 1 - d)
        red[w] = red[p]
        red[p] = 0
        wf = _child(left, right, w, 1 - d)
        if wf != -1:
            red[wf] = 0
        _rotate(left, right, parent, st, p, d)
        x = st[0]
    if x != -1:
        red[x] = 0


@aot.njit(cache=True, _nrt=False)
def tree_erase(left, right, parent, red, st, z):
    if left[z] == -1 or right[z] == -1:
        child = left[z] if left[z] != -1 else right[z]
        p = parent[z]
        _replace(left, right, parent, st, z, child)
        black_removed = not red[z]
    else:
        y = right[z]
        while left[y] != -1:
            y = left[y]
        child = right[y]
        black_removed = not red[y]
        if parent[y] == z:
            p = y
        else:
            p = parent[y]
            _replace(left, right, parent, st, y, child)
            right[y] = right[z]
            parent[right[y]] = y
        _replace(left, right, parent, st, z, y)
        left[y] = left[z]
        parent[left[y]] = y
        red[y] = red[z]
    if black_removed:
        _erase_fixup(left, right, parent, red, st, child, p)


@aot.njit(cache=True, inline="always", _nrt=False)
def _better_or_equal(a, b, start, end, bind, underscores, length):
    """choose_best_symbol: whether symbol ``a`` is preferred to ``b`` or as
    good (a sized symbol, then not weak, then global, then fewer leading
    underscores, then the longer name)."""
    sa = end[a] > start[a]
    sb = end[b] > start[b]
    if sa != sb:
        return sa
    wa = bind[a] != STB_WEAK
    wb = bind[b] != STB_WEAK
    if wa != wb:
        return wa
    ga = bind[a] == STB_GLOBAL
    gb = bind[b] == STB_GLOBAL
    if ga != gb:
        return ga
    if underscores[a] != underscores[b]:
        return underscores[a] < underscores[b]
    return length[a] >= length[b]


@aot.njit(cache=True, _nrt=False)
def perf_tree(start, end, bind, underscores, length, n, left, right, parent, red, st, keep):
    """perf's symbols of a DSO as ``symbols__find`` sees them: symbols
    ``0 .. n-1`` (table order; their ends fixed up) inserted, the worse of
    neighbours with the same start erased (``symbols__fixup_duplicate``),
    then the PLT entries ``n ..`` inserted; writes into ``keep`` the nodes
    in key order that no ancestor's range covers (``symbols__find`` meets
    the ancestor first) and returns how many."""
    total = start.shape[0]
    st[0] = -1
    for i in range(n):
        tree_insert(start, left, right, parent, red, st, i)
    curr = tree_first(left, st)
    while curr != -1:
        nxt = tree_next(left, right, parent, curr)
        if nxt == -1:
            break
        if start[curr] != start[nxt]:
            curr = nxt
            continue
        if _better_or_equal(curr, nxt, start, end, bind, underscores, length):
            tree_erase(left, right, parent, red, st, nxt)
        else:
            tree_erase(left, right, parent, red, st, curr)
            curr = nxt
    for i in range(n, total):
        tree_insert(start, left, right, parent, red, st, i)
    count = 0
    x = tree_first(left, st)
    while x != -1:
        p = parent[x]
        covered = False
        while p != -1:
            if start[p] <= start[x] and end[x] <= end[p] and start[p] < end[p]:
                covered = True
                break
            p = parent[p]
        if not covered:
            keep[count] = x
            count += 1
        x = tree_next(left, right, parent, x)
    return count


def new_tree(size: int) -> tuple[np.ndarray, ...]:
    """Empty tree arrays for ``size`` nodes: left, right, parent, red, st."""
    return (
        np.full(size, -1, np.int64),
        np.full(size, -1, np.int64),
        np.full(size, -1, np.int64),
        np.zeros(size, np.uint8),
        np.full(1, -1, np.int64),
    )
