"""The rows of ``hwtrace script``'s listing, as ``perf script --itrace=i0ns``
(or ``b``, per block) gives them: per instruction its thread, perf's time
for it, its address and the symbol and offset perf would name, with a row
per PTWRITE payload at its place.

Rows are columns (:class:`ListingRows`); the text is written from them by
:func:`hwtrace.textout.perfscript.write_listing`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .perfflow import PerfBlocks, PtwMarks, QueueInfo

# Instructions expanded at a time: a batch's blocks are taken in pieces of
# about this many instructions, so memory stays bounded.
EXPAND_INSNS = 1 << 18


@dataclass
class ListingRows:
    """Listing rows of one piece of a batch: per row ``comm`` (an index into
    ``comms``), ``tid``, ``ns`` (perf time, -1: unknown), ``ip``, ``sym``
    (an index into ``names``/``modules``; -1: no file mapped there),
    ``off`` (bytes into the symbol), ``ninsn`` (per block, block listings
    only), ``kind`` (1: a PTWRITE of ``payload``) and per name ``plain``
    (printed without an offset: perf's ``[unknown]`` in a mapped file)."""

    comms: list[str]
    comm: np.ndarray
    tid: np.ndarray
    ns: np.ndarray
    ip: np.ndarray
    names: list[str]
    modules: list[str]
    sym: np.ndarray
    off: np.ndarray
    ninsn: np.ndarray | None
    kind: np.ndarray | None
    payload: np.ndarray | None
    plain: np.ndarray

    def __len__(self) -> int:
        return int(self.ip.shape[0])


def listing_rows(
    b: PerfBlocks, comm: Callable[[int], str], *, blocks: bool = False, ptwrite: bool = True
) -> Iterator[ListingRows]:
    """The listing rows of a batch of blocks, in pieces of about
    :data:`EXPAND_INSNS` instructions; ``comm`` names a thread."""
    for part in b.split(EXPAND_INSNS):
        if blocks:
            ips, tid, ns, n, which = part.ip, part.tid, part.ns, part.ninsn, part.image
            ends = np.arange(1, len(part) + 1)
            # A block's time: perf's for its first instruction.
            every = part.instructions()
            timed = part.queue.perf_times(every, np.repeat(which, n))
            if timed is not None and every.shape[0]:
                ns = timed[np.cumsum(n) - n]
        else:
            per = part.ninsn
            ips = part.instructions()
            tid, ns, which = (np.repeat(c, per) for c in (part.tid, part.ns, part.image))
            # perf's time for each instruction, where the queue has one.
            timed = part.queue.perf_times(ips, which)
            if timed is not None:
                ns = timed
            n = None
            ends = np.cumsum(per)
        kind = payload = None
        if part.ptw is not None and len(part.ptw) and ptwrite:
            ips, tid, ns, which, n, kind, payload = _with_ptwrite(
                part.ptw, ends, ips, tid, ns, which, n
            )
        sym, off, names, modules, plain = perf_symbols_of(part.queue, ips, which)
        tids, comm_index = np.unique(tid, return_inverse=True)
        yield ListingRows(
            [comm(int(t)) for t in tids.tolist()], comm_index.reshape(-1), tid, ns, ips,
            names, modules, sym, off, n, kind, payload, plain,
        )  # fmt: skip


def _with_ptwrite(marks: PtwMarks, ends: np.ndarray, ips, tid, ns, which, n):
    """The listing's rows with a row per PTWRITE inserted after the rows of
    the blocks before it (``ends``: rows up to each block's end): its own
    IP (the previous row's when the trace had none), time where known."""
    rows = ips.shape[0]
    pos = np.where(marks.at > 0, ends[np.maximum(marks.at - 1, 0)], 0)
    prev = np.maximum(pos - 1, 0)
    ip = np.where(marks.ip != 0, marks.ip, ips[prev] if rows else np.uint64(0)).astype(ips.dtype)
    t = tid[prev] if rows else np.full(len(marks), -1, tid.dtype)
    at_ns = np.where(marks.ns >= 0, marks.ns, ns[prev] if rows else -1).astype(ns.dtype)
    image = which[prev] if rows else np.zeros(len(marks), which.dtype)
    kind = np.insert(np.zeros(rows, np.uint8), pos, 1)
    payload = np.insert(np.zeros(rows, np.uint64), pos, marks.payload)
    count = None if n is None else np.insert(n, pos, 0)
    return (np.insert(ips, pos, ip), np.insert(tid, pos, t), np.insert(ns, pos, at_ns),
            np.insert(which, pos, image), count, kind, payload)  # fmt: skip


def perf_symbols_of(
    q: QueueInfo, ips: np.ndarray, which: np.ndarray
) -> tuple[np.ndarray, np.ndarray, list[str], list[str], np.ndarray]:
    """Per address, its name as perf script gives it (an index into the
    returned names and modules; -1: no file mapped there) and the offset
    into the symbol, from the image each ran in; the last array marks the
    names printed without an offset (``[unknown]`` in a mapped file)."""
    sym = np.full(ips.shape[0], -1, np.int64)
    off = np.zeros(ips.shape[0], np.int64)
    names: list[str] = []
    modules: list[str] = []
    plain: list[int] = []
    ids: dict[tuple[str, str, int], int] = {}

    def intern(name: str, module: str, unknown: int) -> int:
        key = (name, module, unknown)
        if key not in ids:
            ids[key] = len(names)
            names.append(name)
            modules.append(module)
            plain.append(unknown)
        return ids[key]

    images = np.unique(which)
    for image in images.tolist():
        sel = np.flatnonzero(which == image) if images.shape[0] > 1 else slice(None)
        view = q.perf_names(image)
        table = view.symbols
        addr = ips[sel]
        index, offset = table.lookup(addr)
        files = view.files_of(addr)
        # Unnamed addresses take their file: index -2 - file.
        index = np.where(index >= 0, index, np.where(files >= 0, -2 - files, -1))
        uniq, inverse = np.unique(index, return_inverse=True)
        glob = np.empty(uniq.shape[0], np.int64)
        for j, u in enumerate(uniq.tolist()):
            if u == -1:
                glob[j] = -1
            elif u < -1:
                glob[j] = intern("[unknown]", view.paths[-2 - u], 1)
            else:
                glob[j] = intern(table.name(u), table.module_name(u), 0)
        sym[sel] = glob[inverse.reshape(-1)]
        off[sel] = np.asarray(offset, np.int64)
    return sym, off, names, modules, np.array(plain, np.uint8)


__all__ = ["EXPAND_INSNS", "ListingRows", "listing_rows", "perf_symbols_of"]
