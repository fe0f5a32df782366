"""A perf.data's decoded flow into the analyses of
:mod:`hwtrace.analysis.latency`: latency intervals and call-path profiles
of every thread of every trace queue."""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence

import numpy as np

from ..session.perfflow import PerfBlocks
from .latency import LatencyProfiler
from .patterns import AtomTable

# A function's offset at the end of a code address's name.
_OFFSET = re.compile(r"\+0x[0-9a-f]+$")


class CodeNames:
    """Names of code addresses from the symbols of the images a flow's
    blocks ran in, gathered as the batches go by (:meth:`add`)."""

    def __init__(self) -> None:
        self.tables: list = []
        self.images: list = []
        self._seen: dict[int, tuple[object, object]] = {}
        # Names found so far (call paths name the same functions over and
        # over); forgotten when an image comes in.
        self._found: dict[tuple[int, bool], tuple[str, bool]] = {}
        self._named: dict[tuple[int, bool], str] = {}

    def add(self, q, image: int):
        """Gather queue ``q``'s image number ``image``; its symbol table."""
        im = q.images[image]
        held = self._seen.get(id(im))
        if held is None or held[0] is not im:
            table = q.symbols(image)
            held = self._seen[id(im)] = (im, table)
            self.tables.append(table)
            self.images.append(im)
            self._found.clear()
            self._named.clear()
        return held[1]

    def _lookup(self, addr: int, with_module: bool) -> tuple[str, bool]:
        key = (addr, with_module)
        got = self._found.get(key)
        if got is None:
            got = self._found[key] = self._search(addr, with_module)
        return got

    def _search(self, addr: int, with_module: bool) -> tuple[str, bool]:
        for table in self.tables:
            got = table.symbolize(addr, with_module=with_module)
            if got:
                return got, True
        return self._located(addr)

    def _located(self, addr: int) -> tuple[str, bool]:
        """Where no symbol covers ``addr``: its file and offset."""
        for image in self.images:
            got = image.locate(addr)
            if got:
                return got, False
        return "", False

    def names(self, addrs: Sequence[int] | np.ndarray, with_module: bool = False) -> list[str]:
        """:meth:`name` of each of ``addrs``, each symbol table searched
        once for all of them (a call-path profile's few thousand
        functions)."""
        addr = np.asarray(addrs, np.uint64)
        found = self._found
        left = np.array([a for a in set(addr.tolist()) if (a, with_module) not in found], np.uint64)
        for table in self.tables:
            if not left.size:
                break
            got = table.symbolize_all(left, with_module)
            for a, where in zip(left.tolist(), got, strict=True):
                if where:
                    found[(a, with_module)] = (where, True)
            left = left[np.array([not where for where in got], bool)]
        for a in left.tolist():
            found[(a, with_module)] = self._located(a)
        return [self.name(a, with_module) for a in addr.tolist()]

    def where(self, addr: int, with_module: bool = True) -> str:
        """``module!function+0x1a`` of a code address; where no symbol
        covers it, the file and offset (``module+0x1f0``); "" when unknown."""
        return self._lookup(addr, with_module)[0]

    def name(self, addr: int, with_module: bool = False) -> str:
        """A code address's function (``module!function``): :meth:`where`
        without the offset into the function."""
        key = (addr, with_module)
        named = self._named.get(key)
        if named is None:
            got, symbol = self._lookup(addr, with_module)
            # (names may hold a "+": ``*ABS*+0x9f1c0@plt``)
            named = self._named[key] = _OFFSET.sub("", got) if symbol else got
        return named


class LatencyFeed:
    """Call it on each :class:`~hwtrace.session.perfflow.PerfBlocks` batch, in
    flow order: a stream per AUX queue, a stretch of blocks of one image at
    a time; intervals are kept per thread (or per CPU, the patterns'
    ``per``)."""

    def __init__(self, profiler: LatencyProfiler, threaded: bool = True) -> None:
        import os

        from .latency import ProfilerThread

        self.profiler = profiler
        # The walk on its own thread while the decoder goes on (see
        # ProfilerThread), where there is a second CPU.
        self.front = (
            ProfilerThread(profiler) if threaded and (os.cpu_count() or 1) > 1 else profiler
        )
        self.streams: dict[int, int] = {}
        self.atoms: dict[int, tuple[object, AtomTable]] = {}
        self.names = CodeNames()

    def _atoms(self, q, image: int) -> AtomTable:
        im = q.images[image]
        held = self.atoms.get(id(im))
        if held is None or held[0] is not im:
            table = self.names.add(q, image)
            held = self.atoms[id(im)] = (im, AtomTable(self.profiler.patterns, table))
        return held[1]

    def __call__(self, b: PerfBlocks) -> None:
        q = b.queue
        sid = self.streams.get(q.index)
        if sid is None:
            sid = self.streams[q.index] = self.front.stream()
        n = len(b)
        if not n:
            return
        per_cpu = self.profiler.patterns.per == "cpu"
        cuts = np.flatnonzero(np.diff(b.image)) + 1
        key = q.cpu if per_cpu else b.tid
        for lo, hi in itertools.pairwise([0, *cuts.tolist(), n]):
            image = int(b.image[lo])
            self.front.add(
                sid, q.code_table(image), self._atoms(q, image), b.ip[lo:hi], b.ninsn[lo:hi],
                b.mode[lo:hi], b.run[lo:hi], b.ns[lo:hi],
                key if np.ndim(key) == 0 else key[lo:hi], q.cpu, b.gap[lo:hi],
            )  # fmt: skip

    def result(self):
        """The profile of everything fed (the walk done)."""
        if self.front is not self.profiler:
            self.front.close()
        return self.profiler.result()

    def close(self) -> None:
        """Wait for the walk (after an error too)."""
        if self.front is not self.profiler:
            self.front.close()

    def name(self, addr: int, with_module: bool = False) -> str:
        """A code address's function (``module!function``; see :class:`CodeNames`)."""
        return self.names.name(addr, with_module)


class CallPathProfile:
    """``hwtrace report``'s call paths (``--folded``, ``--paths``,
    ``--html``, ``--timeline``): the call-path profile of every thread
    (:mod:`hwtrace.analysis.latency`), each path rooted at its command
    (``group="comm"``), thread, process or CPU.  Feed it a perf.data's
    blocks (:meth:`feed`) in flow order, then :meth:`close` it."""

    def __init__(self, sideband, group: str = "comm", timeline: bool = False) -> None:
        from .patterns import PatternSet

        self.labels: list[str] = []
        self._ids: dict[str, int] = {}
        self.sideband = sideband
        patterns = PatternSet()
        patterns.per = "cpu" if group == "cpu" else "thread"
        self.group_by = group
        self.profiler = LatencyProfiler(patterns, keep=False, calls=False, profile=True,
                                        group=self._group, timeline=timeline)  # fmt: skip
        self._feed = LatencyFeed(self.profiler)

    def _group(self, stream: int, key: int) -> int:
        sb = self.sideband
        if self.group_by == "cpu":
            label = f"cpu{key}" if key >= 0 else "cpu?"
        elif key < 0:
            label = "?"
        elif self.group_by == "comm":
            label = sb.comm_of(key)
        elif self.group_by == "thread":
            label = f"{sb.comm_of(key)}/{key}"
        else:
            pid = sb.pid_of(key)
            label = f"{sb.comm_of(pid if pid >= 0 else key)}/{pid}"
        got = self._ids.get(label)
        if got is None:
            got = self._ids[label] = len(self.labels)
            self.labels.append(label)
        return got

    def feed(self, b: PerfBlocks) -> None:
        self._feed(b)

    def result(self):
        """The call-path profile of everything fed."""
        return self._feed.result()

    def close(self) -> None:
        self._feed.close()

    def name(self, addr: int) -> str:
        """``module!function`` of a code address."""
        return self._feed.name(addr, with_module=True)

    def names(self, addrs: Sequence[int] | np.ndarray) -> list[str]:
        """:meth:`name` of each of ``addrs`` (the symbol tables searched
        once for all)."""
        return self._feed.names.names(addrs, with_module=True)

    def group(self, g: int) -> str:
        """The name of group number ``g``."""
        return self.labels[g] if 0 <= g < len(self.labels) else "?"


__all__ = ["CallPathProfile", "CodeNames", "LatencyFeed"]
