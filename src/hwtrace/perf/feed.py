"""A perf.data's decoded flow into the analyses of
:mod:`hwtrace.analysis.latency`: latency intervals and call-path profiles
of every thread of every trace queue."""

from __future__ import annotations

import itertools

import numpy as np

from ..analysis.latency import LatencyProfiler
from ..analysis.patterns import AtomTable
from .trace import PerfBlocks


class LatencyFeed:
    """Call it on each :class:`~hwtrace.perf.trace.PerfBlocks` batch, in
    flow order: a stream per AUX queue, a stretch of blocks of one image at
    a time; intervals are kept per thread (or per CPU, the patterns'
    ``per``)."""

    def __init__(self, profiler: LatencyProfiler) -> None:
        self.profiler = profiler
        self.streams: dict[int, int] = {}
        self.atoms: dict[int, tuple[object, AtomTable]] = {}
        self.tables: list = []
        self.images: list = []

    def _atoms(self, q, image: int) -> AtomTable:
        im = q.images[image]
        held = self.atoms.get(id(im))
        if held is None or held[0] is not im:
            table = q.symbols(image)
            held = self.atoms[id(im)] = (im, AtomTable(self.profiler.patterns, table))
            self.tables.append(table)
            self.images.append(im)
        return held[1]

    def __call__(self, b: PerfBlocks) -> None:
        q = b.queue
        sid = self.streams.get(q.index)
        if sid is None:
            sid = self.streams[q.index] = self.profiler.stream()
        n = len(b)
        if not n:
            return
        per_cpu = self.profiler.patterns.per == "cpu"
        cuts = np.flatnonzero(np.diff(b.image)) + 1
        key = q.cpu if per_cpu else b.tid
        for lo, hi in itertools.pairwise([0, *cuts.tolist(), n]):
            image = int(b.image[lo])
            self.profiler.add(
                sid, q.code_table(image), self._atoms(q, image), b.ip[lo:hi], b.ninsn[lo:hi],
                b.mode[lo:hi], b.run[lo:hi], b.ns[lo:hi],
                key if np.ndim(key) == 0 else key[lo:hi], q.cpu, b.gap[lo:hi],
            )  # fmt: skip

    def name(self, addr: int, with_module: bool = False) -> str:
        """A code address's function (``module!function``), from the
        symbols of the images decoded; where none covers it, the file and
        offset (``module+0x1f0``)."""
        for table in self.tables:
            got = table.symbolize(addr, with_module=with_module)
            if got:
                return got.split("+", 1)[0]
        for image in self.images:
            got = image.locate(addr)
            if got:
                return got
        return ""


__all__ = ["LatencyFeed"]
