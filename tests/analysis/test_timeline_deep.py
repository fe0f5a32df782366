"""Call slices from a timeline whose paths run deep: a change costs the
frames it ends and begins, whatever the depth of its path (a real
program's call paths run a hundred frames deep and change at every call
and return)."""

from types import SimpleNamespace

import numpy as np

from hwtrace.analysis.latency import Timeline
from hwtrace.analysis.timeline import call_slices


def test_deep_paths_give_a_slice_a_call():
    depth = 20_000
    # One chain of calls, each path the one above's callee.
    paths = [(i - 1, 0x1000 + i) for i in range(depth)]
    calls = 50_000
    # The innermost call made and returned from again and again, then the
    # trace stops (no path): every frame ends there.
    path = np.array([depth - 1, *[depth - 2, depth - 1] * calls, -2], np.int64)
    n = path.shape[0]
    tl = Timeline(np.full(n, 7), np.zeros(n, np.int64), np.arange(n, dtype=np.int64) * 10, path)
    sl = call_slices(SimpleNamespace(paths=paths, timeline=tl))
    # (each change reserving a row for every frame of its path: 10^9 rows)
    assert len(sl) == calls + depth
    inner = sl.depth == depth - 1
    assert inner.sum() == calls + 1 and (sl.end[inner] - sl.start[inner] == 10).all()
    outer = np.flatnonzero(sl.depth == 0)
    assert outer.shape[0] == 1 and sl.start[outer[0]] == 0 and sl.end[outer[0]] == (n - 1) * 10
    assert (sl.key == 7).all() and (sl.addr[outer] == 0x1000).all()
