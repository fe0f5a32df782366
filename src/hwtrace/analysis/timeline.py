"""Function slices per thread from a profile's timeline: where each
thread's call path changed (:class:`~hwtrace.analysis.latency.Timeline`)
becomes, per thread, the calls that were open and when, nested as a
flame chart or Perfetto's slices show them.

A change from path ``p`` to path ``q`` at time ``t`` ends, at ``t``, the
frames of ``p`` that are not ``q``'s (innermost first) and begins ``q``'s
new ones; a change to no path (where a thread's trace stopped) ends them
all.  Times are the flow's (block times: a call's slice starts at the
time of the block its callee's first instruction is in).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .. import aot
from ..columns import Columns
from .latency import LatencyResult


@dataclass
class Slices(Columns):
    """Calls as slices: per slice its ``key`` (tid or CPU), ``depth`` (0:
    the root), the function's ``addr`` (the callee's entry, or an address in
    the root function), ``start`` and ``end`` (the flow's time unit) and
    ``path`` (the call path it is the tail of)."""

    key: np.ndarray
    depth: np.ndarray
    addr: np.ndarray
    start: np.ndarray
    end: np.ndarray
    path: np.ndarray


def _path_arrays(result: LatencyResult) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each path's parent (-1: a root), address and depth (0: a root)."""
    n = len(result.paths)
    parent = np.fromiter((p for p, _ in result.paths), np.int64, n)
    addr = np.fromiter((a for _, a in result.paths), np.uint64, n)
    parent = np.where(parent < 0, -1, parent)
    depth = np.zeros(n, np.int64)
    # Parents are interned before their children: one pass in order.
    for i in np.flatnonzero(parent >= 0).tolist():
        depth[i] = depth[parent[i]] + 1
    return parent, addr, depth


@aot.njit(cache=True, nogil=True, _nrt=False)
def _slices(slot, time, path, parent, depth, out, stack, starts, chain):
    """Walk the changes (grouped per slot, in order) into ``out`` rows
    (slot, depth, path, start, end); returns the rows written (counted
    only, when ``out`` has no rows).  A change costs the frames it ends
    and begins, not the depth of its path: a real program's paths run a
    hundred frames deep, and a change is mostly a call or a return."""
    n = slot.shape[0]
    write = out.shape[0] > 0
    k = 0
    top = 0  # frames open for the current slot
    cur = -1
    for i in range(n):
        s = slot[i]
        if s != cur:
            top = 0  # a new slot (the previous one ended with a change to no path)
            cur = s
        t = time[i]
        q = path[i]
        # The new path's frames below those it shares with the open ones
        # (the open frames are a path's, outermost first: where one is
        # the new path's, so are all above it).
        m = depth[q] + 1 if q >= 0 else 0
        x = q
        d = m - 1
        while d >= 0 and not (d < top and stack[d] == x):
            chain[d] = x
            x = parent[x]
            d -= 1
        keep = d + 1
        for d in range(top - 1, keep - 1, -1):
            if write:
                out[k, 0] = s
                out[k, 1] = d
                out[k, 2] = stack[d]
                out[k, 3] = starts[d]
                out[k, 4] = t
            k += 1
        for d in range(keep, m):
            stack[d] = chain[d]
            starts[d] = t
        top = m
    return k


def call_slices(result: LatencyResult) -> Slices:
    """The calls of every thread (or CPU) of a profile made with
    ``timeline=True``, as slices ordered per thread by their end."""
    tl = result.timeline
    if tl is None:
        raise ValueError("the profile was made without timeline=True")
    parent, addr, depth = _path_arrays(result)
    order = np.argsort(tl.slot, kind="stable")  # per slot, in flow order
    slot, time, path = tl.slot[order], tl.time[order], tl.path[order]
    maxdepth = int(depth.max()) + 1 if depth.shape[0] else 1
    work = (np.zeros(maxdepth, np.int64), np.zeros(maxdepth, np.int64),
            np.zeros(maxdepth, np.int64))  # fmt: skip
    # (counted first: a slice a call, where the paths' depths would
    # reserve a row for every frame of every change)
    count = _slices(slot, time, path, parent, depth, np.zeros((0, 5), np.int64), *work)
    out = np.zeros((max(count, 1), 5), np.int64)
    got = _slices(slot, time, path, parent, depth, out, *work)
    out = out[:got]
    keys = np.zeros(int(tl.slot.max()) + 1 if len(tl) else 1, np.int64)
    keys[tl.slot] = tl.key
    return Slices(keys[out[:, 0]], out[:, 1], addr[out[:, 2]] if got else np.zeros(0, np.uint64),
                  out[:, 3], out[:, 4], out[:, 2])  # fmt: skip


__all__ = ["Slices", "call_slices"]
