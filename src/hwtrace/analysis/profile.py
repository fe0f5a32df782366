"""Per-thread instruction and time profiles of a decoded flow.

:class:`ThreadProfiler` is fed executed blocks in pieces (start address,
instruction count, time, duration, thread, process), each piece from one
address space of one trace queue, and adds up per thread and function the
instructions and the time spent; a piece is reduced to a few sums per
(thread, function) in numpy and dropped, so a flow of any length is
profiled in bounded memory.  :meth:`ThreadProfiler.result` gives a
:class:`ThreadProfile` per thread: its process (that of its earliest
block), instructions, time span and per-function costs.

Functions are the symbols of each address space (``module!name``), numbered
in the order ``hwtrace report`` has always listed them: trace queue by
queue, address space by address space, symbol by symbol; a block is
attributed to the function holding its first instruction.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from .. import aot
from ..columns import Keyed, Runs, distinct
from ..image.symbols import SymbolTable
from ..session import PerfSession
from ..session.perfflow import PerfBlocks, PerfStream

__all__ = ["FunctionCost", "Profile", "ThreadProfile", "ThreadProfiler", "profile_session"]


@aot.njit(cache=True, nogil=True, _nrt=False)
def add_pairs(pair, ninsn, duration, blocks, insn, time):
    """Per ``pair`` (a thread's function, numbered) its blocks,
    instructions and time (ns), added to those of the pairs before."""
    for i in range(pair.shape[0]):
        p = pair[i]
        blocks[p] += 1
        insn[p] += ninsn[i]
        time[p] += duration[i]


def _same_rows(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are views of the same rows (two columns of
    a batch keyed by the same keys, each sliced on its own)."""
    ia, ib = a.__array_interface__, b.__array_interface__
    return ia["data"][0] == ib["data"][0] and a.shape == b.shape and a.strides == b.strides


@dataclass(frozen=True)
class FunctionCost:
    """One function's share of a thread: instructions and time (ns), and
    each as a percentage of the thread's."""

    name: str
    instructions: float
    time_ns: float
    instruction_share: float
    time_share: float


@dataclass
class ThreadProfile:
    """One thread: ``by_insn`` / ``by_time`` per function (index ``k + 1``
    for function ``k`` of :attr:`Profile.names`, 0 for code no symbol
    covers)."""

    tid: int
    pid: int
    comm: str
    instructions: int
    span_ns: int  # from its first to its last timed block (0: no time)
    by_insn: np.ndarray
    by_time: np.ndarray
    names: list[str] = field(repr=False)

    def top(self, n: int, by: str = "insn") -> list[FunctionCost]:
        """The ``n`` functions with the most instructions (``by="time"``:
        the most time), those with any."""
        if by not in ("insn", "time"):
            raise ValueError(f"by {by!r}: 'insn' or 'time'")
        total_i = max(self.by_insn.sum(), 1)
        total_t = max(self.by_time.sum(), 1)
        weight = self.by_insn if by == "insn" else self.by_time
        out = []
        # (ties in the order the functions are numbered)
        for k in np.argsort(-weight, kind="stable")[:n].tolist():
            if weight[k] == 0:
                break
            out.append(
                FunctionCost(
                    self.names[k - 1] if k else "[unknown]",
                    float(self.by_insn[k]),
                    float(self.by_time[k]),
                    float(100 * self.by_insn[k] / total_i),
                    float(100 * self.by_time[k] / total_t),
                )
            )
        return out


@dataclass
class Profile:
    """Every thread's profile, threads in ascending order."""

    threads: list[ThreadProfile]
    names: list[str]  # the functions, module!name
    instructions: int  # of every block


@dataclass
class _Thread:
    instructions: int = 0
    first: tuple[int, int, int] | None = None  # (ns, source, row) of its earliest block
    pid: int = -1
    lo: int = -1  # earliest / latest block time (-1: none timed)
    hi: int = -1

    def see(self, first: tuple[int, int, int], pid: int, timed: np.ndarray) -> None:
        """Blocks whose earliest is ``first`` (of process ``pid``), with
        the times ``timed`` (those known)."""
        if self.first is None or first < self.first:
            self.first, self.pid = first, pid
        if timed.shape[0]:
            lo, hi = int(timed.min()), int(timed.max())
            self.lo = lo if self.lo < 0 else min(self.lo, lo)
            self.hi = max(self.hi, hi)


class ThreadProfiler:
    """Adds up executed blocks per thread and function (see the module doc)."""

    def __init__(self) -> None:
        self.instructions = 0
        self._threads: dict[int, _Thread] = {}
        self._symbols: dict[tuple[int, Hashable], SymbolTable] = {}
        # (source, space, tid) -> the functions it ran in (symbol index + 1,
        # 0: none; rising) and their instructions and time: merged with a
        # batch's in numpy, not a function at a time.
        self._sums: dict[tuple[int, Hashable, int], tuple[np.ndarray, ...]] = {}

    def add(
        self,
        source: int,
        space: Hashable,
        symbols: SymbolTable,
        *,
        ip: np.ndarray,
        ninsn: np.ndarray,
        ns: np.ndarray,
        duration: np.ndarray,
        tid: np.ndarray,
        pid: np.ndarray,
        row: np.ndarray,
    ) -> None:
        """Blocks of trace queue ``source`` that ran in address space
        ``space`` (symbols ``symbols``), in flow order: per block its start
        ``ip``, ``ninsn`` instructions, perf time ``ns`` (-1: none),
        ``duration`` (ns), thread, process and ``row``, its number in its
        queue (blocks of equal time are ordered by queue, then by that
        number, to find a thread's first)."""
        n = ip.shape[0]
        if n == 0:
            return
        key = (source, space)
        self._symbols.setdefault(key, symbols)
        if (isinstance(ip, Keyed) and isinstance(ninsn, Keyed) and _same_rows(ip.keys, ninsn.keys)
                and isinstance(tid, np.ndarray) and bool((tid == tid[0]).all())):  # fmt: skip
            self._add_keyed(source, key, symbols, ip, ninsn, ns, duration, int(tid[0]), pid, row)
            return
        ip, ninsn, ns, duration, pid = (np.asarray(c) for c in (ip, ninsn, ns, duration, pid))
        ninsn = ninsn.astype(np.int64)
        tid = np.asarray(tid).astype(np.int64)
        # Each block's function as a small number (0: no symbol), so that
        # the sums per (thread, function) are counts into a table, not
        # sorts of the batch.
        code = symbols.index_of(ip) + 1
        width = int(code.max()) + 1
        self.instructions += int(ninsn.sum())
        if (tid == tid[0]).all():  # (a thread's queue: one thread a batch)
            threads, t_inverse = tid[:1], None
            pair = code
        else:
            threads, t_inverse = np.unique(tid, return_inverse=True)
            t_inverse = t_inverse.reshape(-1)
            pair = t_inverse * width + code
        size = threads.shape[0] * width
        blocks, insn, time = (np.zeros(size, np.int64) for _ in range(3))
        add_pairs(pair, ninsn, np.asarray(duration, np.int64), blocks, insn, time)
        used = np.flatnonzero(blocks)
        owner = used // width
        for j, t in enumerate(threads.tolist()):
            mine = used[owner == j]
            self._sum(key, t, mine % width, insn[mine], time[mine])
            sel = slice(None) if t_inverse is None else np.flatnonzero(t_inverse == j)
            th = self._threads.get(t)
            if th is None:
                th = self._threads[t] = _Thread()
            t_ns = ns[sel]
            th.instructions += int(ninsn[sel].sum())
            k = int(np.argmin(t_ns))
            th.see((int(t_ns[k]), source, int(row[sel][k])), int(pid[sel][k]), t_ns[t_ns >= 0])

    def _sum(self, key: tuple, tid: int, code: np.ndarray, insn: np.ndarray,
             time: np.ndarray) -> None:  # fmt: skip
        """Add a thread's instructions and time in the functions ``code``
        (rising, each a symbol index + 1; 0: none) of address space
        ``key`` (sums below 2**53 may come as floats)."""
        code = code.astype(np.int64)
        insn, time = insn.astype(np.int64), time.astype(np.int64)
        k = (*key, tid)
        got = self._sums.get(k)
        if got is not None:
            # (the union of both, each one's sums added where it is)
            old_code, old_insn, old_time = got
            code_all = distinct(np.concatenate((old_code, code)))
            at_old, at_new = np.searchsorted(code_all, old_code), np.searchsorted(code_all, code)
            sums = []
            for old, new in ((old_insn, insn), (old_time, time)):
                both = np.zeros(code_all.shape[0], np.int64)
                both[at_old] = old
                both[at_new] += new
                sums.append(both)
            code, insn, time = code_all, sums[0], sums[1]
        self._sums[k] = (code, insn, time)

    def _add_keyed(self, source: int, key: tuple, symbols: SymbolTable, ip: Keyed,
                   ninsn: Keyed, ns: np.ndarray | Runs, duration: np.ndarray | Runs, tid: int,
                   pid: np.ndarray, row: np.ndarray) -> None:  # fmt: skip
        """:meth:`add` of one thread's blocks given by key (a stream that
        asked for no code runs): each distinct block's function found once,
        the sums made per key; times given as runs read run by run."""
        keys = ip.keys
        m = ip.table.shape[0]
        count = np.bincount(keys, minlength=m)
        key_insn = count * ninsn.table[:m].astype(np.int64)
        if isinstance(duration, Runs):
            # (a duration is 0 but where the time changes: the rows of the
            # runs of other values only)
            live = np.flatnonzero(duration.values != 0)
            lengths = duration.lengths()[live]
            at = np.repeat(duration.starts[live] - np.cumsum(lengths) + lengths, lengths)
            at += np.arange(at.shape[0])
            key_time = np.bincount(keys[at], np.repeat(duration.values[live], lengths), m)
        else:
            key_time = np.bincount(keys, np.asarray(duration, np.float64), m)
        # Per function (0: none), from its keys' sums (exact: below 2**53).
        present = np.flatnonzero(count)
        code = symbols.index_of(ip.table[present]) + 1
        blocks, insn, time = (np.bincount(code, w[present]) for w in (count, key_insn, key_time))
        used = np.flatnonzero(blocks)
        self._sum(key, tid, used, insn[used], time[used])
        self.instructions += int(key_insn.sum())
        th = self._threads.get(tid)
        if th is None:
            th = self._threads[tid] = _Thread()
        th.instructions += int(key_insn.sum())
        if isinstance(ns, Runs):
            r = int(np.argmin(ns.values))
            first_ns, k, timed = int(ns.values[r]), int(ns.starts[r]), ns.values[ns.values >= 0]
        else:
            t_ns = np.asarray(ns)
            k = int(np.argmin(t_ns))
            first_ns, timed = int(t_ns[k]), t_ns[t_ns >= 0]
        th.see((first_ns, source, int(row[k])), int(pid[k]), timed)

    def add_blocks(self, b: PerfBlocks) -> None:
        """A batch of a perf.data's decoded blocks (:meth:`add` per address
        space it ran in)."""
        q = b.queue
        rows = b.row + np.arange(len(b))
        parts = b.images()
        if len(parts) == 1:
            # (one address space: the columns as they are, by key or as
            # runs when the stream gave them so)
            self.add(q.index, parts[0][0], q.symbols(parts[0][0]), ip=b.ip, ninsn=b.ninsn,
                     ns=b.ns, duration=b.duration, tid=b.tid, pid=b.pid, row=rows)  # fmt: skip
            return
        b = b.dense()
        for image, sel in parts:
            self.add(
                q.index, image, q.symbols(image), ip=b.ip[sel], ninsn=b.ninsn[sel],
                ns=b.ns[sel], duration=b.duration[sel], tid=b.tid[sel], pid=b.pid[sel],
                row=rows[sel],
            )  # fmt: skip

    def result(self, comm: Callable[[int], str]) -> Profile:
        """The profile of everything added; ``comm(tid)`` names a thread."""
        names: list[str] = []
        ids: dict[str, int] = {}
        # Per address space, its functions any thread ran in (symbol
        # index + 1, rising) and each one's place among the names (+ 1).
        seen: dict[tuple[int, Hashable], np.ndarray] = {}
        for (source, space, _), (code, _, _) in self._sums.items():
            got = seen.get((source, space))
            seen[(source, space)] = code if got is None else distinct(np.concatenate((got, code)))
        glob: dict[tuple[int, Hashable], tuple[np.ndarray, np.ndarray]] = {}
        for key in sorted(seen):
            table = self._symbols[key]
            codes = seen[key][seen[key] > 0]
            place = np.zeros(codes.shape[0], np.int64)
            for j, u in enumerate(codes.tolist()):
                name = table.qualified_name(u - 1)
                if name not in ids:
                    ids[name] = len(names)
                    names.append(name)
                place[j] = ids[name] + 1
            glob[key] = (codes, place)
        by_insn = {t: np.zeros(len(names) + 1) for t in self._threads}
        by_time = {t: np.zeros(len(names) + 1) for t in self._threads}
        for (source, space, t), (code, i, d) in self._sums.items():
            codes, place = glob[(source, space)]
            k = np.zeros(code.shape[0], np.int64)
            named = code > 0
            k[named] = place[np.searchsorted(codes, code[named])]
            np.add.at(by_insn[t], k, i)
            np.add.at(by_time[t], k, d)
        threads = []
        for t in sorted(self._threads):
            th = self._threads[t]
            threads.append(
                ThreadProfile(
                    t, th.pid, comm(t), th.instructions, th.hi - th.lo if th.lo >= 0 else 0,
                    by_insn[t], by_time[t], names,
                )
            )  # fmt: skip
        return Profile(threads, names, self.instructions)


def profile_session(session: PerfSession) -> tuple[Profile, PerfStream]:
    """``hwtrace report``'s profile of a perf.data: per thread its
    instructions, time span and per-function costs; with the decoding's
    queues, gaps and problems."""
    profiler = ThreadProfiler()
    flow = session.decode(profiler.add_blocks)
    return profiler.result(session.comm), flow
