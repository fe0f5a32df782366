"""Decoding the Intel PT of a perf.data, attributed to processes and threads.

Each AUX queue (one per CPU, or per thread with ``--per-thread``) is decoded
on its own; at every enabling of tracing the sideband says which thread ran
then and so which image the decoder must walk (see
:func:`hwtrace.pt.decode.decode_trace`'s ``context``).  Blocks then get their
perf time, CPU, thread and process as columns, and a symbol on demand.

Two forms:

* :func:`decode_perf` keeps every queue's whole flow (a
  :class:`~hwtrace.pt.decode.FlowResult` per queue) for the library user
  who wants columns;
* :func:`stream_perf` decodes each queue window by window through
  :class:`~hwtrace.pt.flowdec.FlowDecoder` and hands each batch of blocks,
  attributed (:class:`PerfBlocks`), to a callback that formats or
  aggregates it and lets it go: memory stays bounded whatever the size of
  the trace.  ``hwtrace script`` and ``hwtrace report`` use it.

Both cut a queue's trace into the same PSB-aligned ranges
(:func:`hwtrace.pt.decode.chunk_ranges`) and decode them with the same options, so they give
the same blocks.  A queue's trace is read where it lies in the
memory-mapped perf.data when one AUXTRACE record holds it; a trace split
over several records (as perf writes its AUX buffer) is joined into an
unlinked temporary file, mapped, so it is not held in memory either; pages
are released as decoding moves on.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from ..columns import (
    Columns,
    Deferred,
    Keyed,
    OffsetPoints,
    Runs,
    SequencedKeys,
    distinct,
    repeated,
    resolved,
)
from ..image import Image
from ..image.kernelcode import KernelCode
from ..image.perfsyms import perf_symbols
from ..image.revisions import EXACT_SOURCES, CodeRevisions
from ..image.sections import ImageError
from ..image.symbols import SymbolTable
from ..perf.attr import PerfType
from ..perf.data import PerfData
from ..perf.intelpt import (
    aux_queues,
    pt_config_of,
    queue_trace,
    sideband_of,
    tsc_conversion_of,
)
from ..perf.sideband import AddressSpace, BinaryLocator, Sideband, TscConversion
from ..pt import flowrows as FK
from ..pt.blocks import BlockStore, StoredKeys, sequenced_keys
from ..pt.codeindex import CodeIndex
from ..pt.decode import DecodeOptions, FlowResult, Gap, chunk_ranges, decode_trace
from ..pt.flowdec import FlowBatch, FlowDecoder, FlowSink
from ..pt.flowrows import CodeTable, Ev, error_gaps, instruction_rows
from ..pt.timing import durations, stamps_to_ns
from ._attribution import (
    attribute_rows,
    attribute_stored,
    duration_runs,
    durations_of,
    offset_runs,
    stops_and_gaps,
    time_runs,
)
from .perftime import PerfClock, transfer_class


@dataclass
class QueueFlow:
    """One AUX queue's decoded flow with per-block attribution columns.

    The columns (perf time, duration, thread, process) are made on first
    use: a flow of tens of millions of blocks needs hundreds of MB for each,
    which a caller that wants the blocks alone does not pay."""

    cpu: int  # -1 for a per-thread queue
    tid: int  # -1 for a per-CPU queue
    flow: FlowResult
    symbols: list[SymbolTable]  # per image index of ``flow.images``
    contexts: QueueContexts = field(repr=False)  # what attributes the blocks
    trace_bytes: int = 0
    _instructions: np.ndarray | None = field(default=None, repr=False)
    _attributed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _duration: np.ndarray | None = field(default=None, repr=False)

    def instructions(self) -> np.ndarray:
        """Every instruction's address (expanded once, then kept)."""
        if self._instructions is None:
            self._instructions = self.flow.instructions()
        return self._instructions

    def _attribution(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._attributed is None:
            self._attributed = self.contexts.attribute(self.flow.block_time)
        return self._attributed

    @property
    def block_ns(self) -> np.ndarray:
        """Perf time of each block (int64; -1: no time)."""
        return self._attribution()[0]

    @property
    def block_tid(self) -> np.ndarray:
        """Thread of each block (int64; -1 where unknown)."""
        return self._attribution()[1]

    @property
    def block_pid(self) -> np.ndarray:
        """Process of each block (int64; -1 where unknown)."""
        return self._attribution()[2]

    @property
    def block_duration(self) -> np.ndarray:
        """Nanoseconds each block ran: until the next block or until tracing
        stopped after it (0: unknown)."""
        if self._duration is None:
            ns = self.block_ns
            ev = self.flow.event_columns()
            stop = np.isin(ev["type"], _STOP.astype(ev["type"].dtype))
            k = ev["block"][stop] - 1
            t = ev["time"][stop]
            ok = (k >= 0) & (k < ns.shape[0])
            k, t = k[ok], t[ok]
            self._duration = durations(ns, k, self.contexts.stop_values(ns, k, t))
        return self._duration

    @property
    def gaps(self) -> list[Gap]:
        return self.flow.gaps


QueueT = TypeVar("QueueT")


@dataclass
class PerfDecoding(Generic[QueueT]):
    """What decoding a perf.data's Intel PT learned, queue by queue, with
    the sideband and TSC conversion it used."""

    queues: list[QueueT]
    sideband: Sideband
    conversion: TscConversion | None
    problems: list[str] = field(default_factory=list)
    # Functions a cut to calls was asked for that the decoded code lacks.
    missing_calls: list[str] = field(default_factory=list)

    @property
    def n_gaps(self) -> int:
        return sum(len(q.gaps) for q in self.queues)


@dataclass
class PerfFlow(PerfDecoding[QueueFlow]):
    """The decoded Intel PT of a perf.data."""

    def blocks(self) -> dict[str, np.ndarray]:
        """All queues' blocks as columns, in time order: ``ip``, ``ninsn``,
        ``ns``, ``duration`` (ns), ``cpu``, ``tid``, ``pid``, ``queue`` and ``symbol`` (index into
        :meth:`symbol_names`, -1 where none covers the address)."""
        cols: dict[str, list[np.ndarray]] = {
            k: [] for k in ("ip", "ninsn", "ns", "duration", "cpu", "tid", "pid", "queue", "symbol")
        }
        names: dict[str, int] = {}
        self._names = []
        for qi, q in enumerate(self.queues):
            f = q.flow
            n = f.block_ip.shape[0]
            cols["ip"].append(f.block_ip)
            cols["ninsn"].append(f.block_ninsn.astype(np.int64))
            cols["ns"].append(q.block_ns)
            cols["duration"].append(q.block_duration)
            cols["cpu"].append(np.full(n, q.cpu, np.int64))
            cols["tid"].append(q.block_tid)
            cols["pid"].append(q.block_pid)
            cols["queue"].append(np.full(n, qi, np.int64))
            cols["symbol"].append(self._symbolize(q, names))
        out = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in cols.items()}
        order = np.argsort(out["ns"], kind="stable")
        return {k: v[order] for k, v in out.items()}

    def _symbolize(self, q: QueueFlow, names: dict[str, int]) -> np.ndarray:
        f = q.flow
        which = f.block_image if f.block_image is not None else np.zeros(f.block_ip.shape, int)
        out = np.full(f.block_ip.shape[0], -1, np.int64)
        for image_index in np.unique(which).tolist():
            sel = np.flatnonzero(which == image_index)
            table = q.symbols[image_index]
            index, _ = table.lookup(f.block_ip[sel])
            uniq, inverse = np.unique(index, return_inverse=True)
            ids = []
            for u in uniq.tolist():
                if u < 0:
                    ids.append(-1)
                    continue
                name = table.qualified_name(u)
                if name not in names:
                    names[name] = len(self._names)
                    self._names.append(name)
                ids.append(names[name])
            out[sel] = np.array(ids, np.int64)[inverse]
        return out

    def symbol_names(self) -> list[str]:
        """Names behind the ``symbol`` column of the last :meth:`blocks`."""
        return list(getattr(self, "_names", []))


def setup_decoding(
    data: PerfData,
    locator: BinaryLocator | None,
    kernel: KernelCode | None,
    sideband: Sideband | None,
) -> tuple[BinaryLocator, Sideband, list[str], object]:
    """What both decodings start from: the locator, the sideband model, the
    problems known so far and (when there is Intel PT) the conversion, the
    decoder configuration, the kernel code and the queues."""
    locator = locator or BinaryLocator()
    sb = sideband if sideband is not None else sideband_of(data)
    from ..perf.notes import recording_notes

    source = recording_notes(data.path).get("revisions") if data.path else None
    if source in EXACT_SOURCES:
        sb.set_user_poke_source(source)
    pt = data.intel_pt
    problems: list[str] = [str(e) for e in data.errors]
    if pt is None:
        hint = ""
        if any(a.attr.type == PerfType.TRACEPOINT for a in data.attrs):
            # (perf record -e SYSTEM:EVENT; hwtrace trace -o x.data)
            hint = f" (its tracepoint samples: hwtrace filter 1 {data.path})"
        problems.append(f"{data.path}: no Intel PT AUXTRACE_INFO: nothing to decode{hint}")
        return locator, sb, problems, None
    conv = tsc_conversion_of(data)
    if not any(r.kind == "jitdump" for r in sb.revisions):
        problems += sb.add_jitdump_code(locator, conv)
    kernel = kernel if kernel is not None else sb.kernel_image(locator)
    if sb.kernel_mappings and (kernel is None or not len(kernel.image)):
        problems.append(
            f"{data.path}: no kernel code: traced kernel code shows as gaps"
            + ("" if kernel is not None else " and without names")
            + "; give a --kcore directory or a --vmlinux"
            + ("" if kernel is not None else " (or --kallsyms for names)")
        )
    queues = aux_queues(data, bool(pt.per_cpu_mmaps))
    return locator, sb, problems, (conv, pt_config_of(data), kernel, queues)


#: Images a later one of their process replaced (see QueueContexts) that keep
#: their merged symbol tables.
SUPERSEDED_SYMBOLS_KEPT = 4
_NEVER = 1 << 63


class QueueContexts:
    """Which image a queue's decoder walks when tracing is enabled: the
    address space of the thread the sideband says ran then (per-thread
    queues: the queue's own thread), one image per process and set of live
    mappings, made once."""

    def __init__(self, cpu, tid, sb, conv, locator, kernel) -> None:
        self.cpu, self.tid, self.sb, self.conv = cpu, tid, sb, conv
        self.locator, self.kernel = locator, kernel
        self.images: dict[tuple[int, int, int], Image] = {}
        # Per image, the tables its symbols merge, merged when asked for
        # (:meth:`symbols`); a process that maps its libraries one by one
        # has an image for each step, and their merged tables would
        # otherwise grow with the recording.
        self.symbol_parts: dict[int, tuple[SymbolTable, ...]] = {}
        self.pid_of_image: dict[int, int] = {}
        self.space_of_image: dict[int, tuple[AddressSpace | None, int]] = {}
        self._merged: dict[int, SymbolTable] = {}
        self.perf_names_of: dict[int, PerfNames] = {}
        # Images a later one of their process took the place of (it mapped
        # more, or exec'd): the decoder is past them, and of those only the
        # last few asked for keep their merged tables.
        self._superseded: set[int] = set()
        self._superseded_kept: OrderedDict[int, None] = OrderedDict()
        # When each image's process left its address space (see dead_images).
        self._dies: dict[int, tuple[Image, int]] = {}
        self._next_death = _NEVER
        self._images_seen = 0
        self._dead: dict[int, Image] = {}
        # Per process image generation: the last image made, the mappings
        # it holds and its symbol tables (the next is made from it).
        self.latest: dict[tuple[int, int], tuple[Image, list, list]] = {}
        self.last_ns = 0

    def image_for(self, ns: int) -> Image:
        sb, kernel = self.sb, self.kernel
        t = self.tid if self.tid >= 0 else int(sb.threads_on(self.cpu, np.array([ns]))[0])
        pid = sb.pid_of(t)
        space = sb.space_at(pid, ns)
        live = len(space.mappings_at(ns)) if space is not None else 0
        key = (pid, id(space), live)
        got = self.images.get(key)
        if got is None:
            if space is None:
                got = kernel.image if kernel is not None else Image("empty")
                parts = (kernel.symbols,) if kernel is not None else ()
            else:
                got, parts = self._space_image(pid, space, ns)
            self.images[key] = got
            self.symbol_parts[id(got)] = tuple(parts)
            self.pid_of_image[id(got)] = pid if space is not None else -1
            self.space_of_image[id(got)] = (space, ns)
        return got

    def dead_images(self) -> list[Image]:
        """The images of address spaces their process had left (by exec)
        before the time the decoder last asked about: it will not walk
        them again.  (Their merged symbol tables are kept as superseded
        images' are.)"""
        ns = self.last_ns
        if self._images_seen != len(self.images):
            self._images_seen = len(self.images)
            for image in self.images.values():
                if id(image) not in self._dies:
                    self._dies[id(image)] = (image, self._death(image))
            self._next_death = self._soonest_death()
        if ns >= self._next_death:
            for key, (image, t) in self._dies.items():
                if t <= ns and key not in self._dead:
                    self._dead[key] = image
                    if key not in self._superseded:
                        self._supersede(image)
            self._next_death = self._soonest_death()
        return list(self._dead.values())

    def _soonest_death(self) -> int:
        return min((t for k, (_, t) in self._dies.items() if k not in self._dead), default=_NEVER)

    def _death(self, image: Image) -> int:
        """When the process of ``image`` left its address space (_NEVER:
        not in the recording)."""
        space, _ = self.space_of_image[id(image)]
        if space is None:
            return _NEVER
        spaces = self.sb.spaces.get(self.pid_of_image[id(image)], ())
        return min((s.since for s in spaces if s.since > space.since), default=_NEVER)

    def _space_image(self, pid: int, space: AddressSpace,
                     ns: int) -> tuple[Image, list[SymbolTable]]:  # fmt: skip
        """The image of ``space`` at ``ns``: made from the last one made of
        it when that one's mappings are the first of those live now (a
        process mapping more code: the decoder keeps what it decoded of
        the earlier ones, see FlowDecoder)."""
        maps = space.mappings_at(ns)
        last = self.latest.get((pid, id(space)))
        base, tables, live = None, [], 0
        if (
            last is not None
            and len(last[1]) <= len(maps)
            and all(a is b for a, b in zip(last[1], maps, strict=False))
        ):
            base, live, tables = last[0], len(last[1]), last[2]
        image, parts, tables = space.grown_image(base, tables, live, self.locator, ns,
                                                 self.kernel, self.sb.jitdumps.get(pid))  # fmt: skip
        if last is not None:
            self._supersede(last[0])
        self.latest[(pid, id(space))] = (image, maps, tables)
        return image, parts

    def _supersede(self, image: Image) -> None:
        self._superseded.add(id(image))
        self._keep(id(image))

    def _keep(self, key: int) -> None:
        """Note that image ``key``'s merged tables were used; of superseded
        images, those used longest ago let theirs go."""
        if key not in self._superseded:
            return
        kept = self._superseded_kept
        kept[key] = None
        kept.move_to_end(key)
        while len(kept) > SUPERSEDED_SYMBOLS_KEPT:
            gone, _ = kept.popitem(last=False)
            self._merged.pop(gone, None)
            self.perf_names_of.pop(gone, None)

    def context(self, tsc: int | None, ip: int) -> Image:
        """:func:`~hwtrace.pt.decode.decode_trace`'s ``context``."""
        if tsc is not None and self.conv is not None:
            self.last_ns = int(self.conv.to_ns(tsc))
        return self.image_for(self.last_ns)

    def __call__(self, tsc: int | None, ip: int) -> Image:
        """:meth:`context`: a context for decode_trace, with :meth:`stable_until`."""
        return self.context(tsc, ip)

    def first(self) -> Image:
        return self.image_for(0 if self.conv is None else self.last_ns)

    def stable_until(self) -> int:
        """The TSC before which :meth:`image_for` gives the image it gives
        at ``last_ns`` (the next thread switch on the queue's CPU, exec or
        mapping of the process), a little early; 0: no time."""
        if self.conv is None:
            return 0
        ns, sb = self.last_ns, self.sb
        changes = []
        t = self.tid
        if t < 0:
            st = sb.switch_times(self.cpu)
            i = int(np.searchsorted(st, ns, side="right"))
            if i < st.shape[0]:
                changes.append(int(st[i]))
            t = int(sb.threads_on(self.cpu, np.array([ns]))[0])
        pid = sb.pid_of(t)
        changes += [s.since for s in sb.spaces.get(pid, ()) if s.since > ns]
        space = sb.space_at(pid, ns)
        if space is not None:
            changes += [m.time for m in space.mappings if m.time > ns]
        if not changes:
            return 1 << 62
        return max(int(self.conv.to_tsc(min(changes))) - 64, 0)

    def symbols(self, image: Image) -> SymbolTable:
        """The symbols of ``image`` (of an overlay of code revisions, its
        base image's), merged from its tables once and kept while it is
        its process's latest image (and a while after)."""
        base = getattr(image, "revision_base", None)
        if base is not None:
            image = base
        key = id(image)
        got = self._merged.get(key)
        if got is None:
            parts = self.symbol_parts.get(key)
            if parts is None:
                return SymbolTable.empty()
            got = self._merged[key] = SymbolTable.merge(parts)
        self._keep(key)
        return got

    def perf_names(self, image: Image) -> PerfNames:
        """How perf names the addresses of ``image``: its files' symbols
        as perf loads them (:func:`~hwtrace.image.perfsyms.perf_symbols`),
        the kernel's and JIT code's as :meth:`symbols` has them, and the
        mapped files, for addresses no symbol covers."""
        base = getattr(image, "revision_base", None)
        if base is not None:
            image = base
        got = self.perf_names_of.get(id(image))
        if got is not None:
            self._keep(id(image))
            return got
        space, ns = self.space_of_image.get(id(image), (None, 0))
        files = space.files_at(self.locator, ns) if space is not None else []
        tables, replaced = [], set()
        for m, found, bias in files:
            if found is not None and bias is not None:
                try:
                    tables.append(perf_symbols(str(found)).relocate(bias, m.path))
                except (ImageError, OSError, ValueError):
                    continue  # the decode said what is wrong with the file
                replaced.add(m.path)
        # The kernel's and JIT code's symbols stay as they are.
        own = self.symbols(image)
        keep = np.array([own.modules[k] not in replaced for k in own.module.tolist()], bool)
        if keep.any():
            tables.append(own.subset(keep))
        got = self.perf_names_of[id(image)] = PerfNames(
            SymbolTable.merge(tables),
            np.array([m.start for m, _, _ in files], np.uint64),
            np.array([m.end for m, _, _ in files], np.uint64),
            [m.path for m, _, _ in files],
        )
        self._keep(id(image))
        return got

    def revisions_for(self, image: Image) -> CodeRevisions | None:
        """The code revisions of the process ``image`` is of (the decoder's
        ``revisions``)."""
        return self.sb.code_revisions(self.pid_of_image.get(id(image), -1), self.conv)

    def attribute(
        self,
        block_time: np.ndarray,
        out: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Perf time (-1: none), thread and process of blocks with decoder
        time stamps ``block_time`` (into the int64 arrays ``out``, if given;
        else a thread's queue gets its thread and process as read-only
        columns of one value, which take no memory)."""
        conv, sb = self.conv, self.sb
        n = block_time.shape[0]
        if out is not None:
            ns, tids, pids = out
        elif self.tid >= 0:
            ns = np.empty(n, np.int64)
            tids = np.broadcast_to(np.int64(self.tid), (n,))
            pids = np.broadcast_to(np.int64(sb.pid_of(self.tid)), (n,))
        else:
            ns, tids, pids = (np.empty(n, np.int64) for _ in range(3))
        if conv is not None:
            stamps_to_ns(block_time, conv.time_shift, conv.time_mult, conv.time_zero, out=ns)
        else:
            ns.fill(-1)
        if self.tid < 0:
            tids[:] = sb.threads_on(self.cpu, np.maximum(ns, 0))
            pids[:] = self._pids(tids)
        elif out is not None:
            # (a thread's queue: one thread and process throughout, not
            # looked for in the column just filled)
            tids.fill(self.tid)
            pids.fill(sb.pid_of(self.tid))
        return ns, tids, pids

    def thread_columns(self) -> tuple:
        """What :func:`~._attribution.attribute_rows` takes to attribute
        blocks: the TSC conversion (``conv``), the queue's thread and
        process (-1: a CPU's queue), and the CPU's switches (times, the
        thread and process switched to)."""
        conv = np.zeros(4, np.uint64)
        if self.conv is not None:
            c = self.conv
            conv[:] = (1, c.time_shift, c.time_mult, c.time_zero % (1 << 64))
        if self.tid >= 0:
            none = np.zeros(0, np.int64)
            return conv, self.tid, self.sb.pid_of(self.tid), none, none, none
        times = self.sb.switch_times(self.cpu)
        tids = self.sb.threads_on(self.cpu, times)
        pids = np.array([self.sb.pid_of(t) if t >= 0 else -1 for t in tids.tolist()], np.int64)
        return conv, -1, -1, times, tids, pids

    def _pids(self, tids: np.ndarray) -> np.ndarray | int:
        """The process of each thread (one for all: an int); threads come in
        long runs, so the runs are looked up, not every row."""
        n = tids.shape[0]
        if n == 0:
            return tids.copy()
        if tids[0] == tids[-1] and (tids == tids[0]).all():
            t = int(tids[0])
            return self.sb.pid_of(t) if t >= 0 else -1
        heads = np.flatnonzero(tids[1:] != tids[:-1]) + 1
        heads = np.concatenate([[0], heads])
        run_tids = tids[heads]
        uniq, inverse = np.unique(run_tids, return_inverse=True)
        pids = np.array([self.sb.pid_of(int(t)) if t >= 0 else -1 for t in uniq], np.int64)
        return np.repeat(pids[inverse.reshape(-1)], np.diff(np.append(heads, n)))

    def stop_values(self, ns: np.ndarray, k: np.ndarray, t: np.ndarray) -> np.ndarray:
        """How long blocks ``k`` ran when tracing stopped after them at
        decoder times ``t`` (0: unknown)."""
        if self.conv is None:
            return np.zeros(k.shape[0], np.int64)
        return np.where(t > 0, np.asarray(self.conv.to_ns(t), np.int64) - ns[k], 0)


_STOP = np.array([int(Ev.DISABLED), int(Ev.ASYNC_DISABLED)], np.uint64)
_IS_STOP = FK.type_table(_STOP)


def decode_perf(
    data: PerfData,
    locator: BinaryLocator | None = None,
    *,
    kernel: KernelCode | None = None,
    jobs: int = 1,
    sideband: Sideband | None = None,
    chunk_bytes: int | None = None,
    revision_window: int = 0,
) -> PerfFlow:
    """Decode every AUX queue of ``data`` against the sideband's images,
    keeping each queue's whole flow.

    ``kernel`` is the kernel's code (:mod:`.kernel`: a ``--kcore``
    directory, a vmlinux or kallsyms); without it, kernel modules the
    sideband maps as files are used where the locator finds them.
    ``sideband``: the model of ``data``'s sideband, when the caller already
    built it (:func:`~hwtrace.perf.intelpt.sideband_of`).  ``chunk_bytes``: the size of the
    PSB-aligned ranges each queue is cut into (:func:`~hwtrace.pt.decode.chunk_ranges`;
    by default as :func:`~hwtrace.pt.decode.decode_trace` cuts them).
    ``revision_window`` (TSC ticks): gaps that near a code revision's start
    are decoded again with the neighbouring revision (see
    :func:`~hwtrace.pt.decode.decode_trace`); the queue's flow lists those
    revisions in ``ambiguous``.
    """
    locator, sb, problems, setup = setup_decoding(data, locator, kernel, sideband)
    if setup is None:
        return PerfFlow([], sb, None, problems)
    conv, config, kernel, queues = setup
    out: list[QueueFlow] = []
    for cpu, tid, starts, sizes in queues:
        ctx = QueueContexts(cpu, tid, sb, conv, locator, kernel)
        with queue_trace(data, starts, sizes) as trace:
            first = ctx.first()
            flow = decode_trace(
                trace, first, config, jobs=jobs, chunk_bytes=chunk_bytes, context=ctx,
                revisions=ctx.revisions_for, revision_window=revision_window,
            )  # fmt: skip
            n_bytes = trace.shape[0]
        images_used = flow.images or [first]
        symbols = [ctx.symbols(im) for im in images_used]
        out.append(QueueFlow(cpu, tid, flow, symbols, ctx, n_bytes))
    problems += list(locator.problems.values()) + sb.revision_conflicts()
    return PerfFlow(out, sb, conv, problems)


@dataclass
class PerfNames:
    """An image's addresses named as perf script names them: ``symbols``
    (module: the path the recording mapped), and the mapped files
    (``start``, ``end``, ``path``, later mappings over earlier ones) that
    name an address no symbol covers (``[unknown] (path)``)."""

    symbols: SymbolTable
    start: np.ndarray
    end: np.ndarray
    paths: list[str]

    def files_of(self, addresses: np.ndarray) -> np.ndarray:
        """The mapping (index into ``paths``) each address is in, -1: none."""
        out = np.full(addresses.shape[0], -1, np.int64)
        for k in range(len(self.paths)):  # per mapping, later ones win
            inside = (addresses >= self.start[k]) & (addresses < self.end[k])
            out[inside] = k
        return out


# --------------------------------------------------------------------------
# Streaming


@dataclass
class QueueInfo:
    """One AUX queue of a :func:`stream_perf` decoding: its CPU (-1 for a
    per-thread queue) and thread (-1 for a per-CPU one), the images its
    decoder walked (numbered in order of first use, as blocks' ``image``)
    with their symbols, and, once decoded, its gaps and totals."""

    index: int
    cpu: int
    tid: int
    images: list[Image]
    trace_bytes: int = 0
    gaps: list[Gap] = field(default_factory=list)
    n_blocks: int = 0
    n_insn: int = 0
    _ctx: QueueContexts | None = field(default=None, repr=False)
    _code: dict[int, CodeIndex] | None = field(default=None, repr=False)
    _decoder: FlowDecoder | None = field(default=None, repr=False)
    #: perf's instruction times over this queue's trace, while it is decoded
    clock: PerfClock | None = field(default=None, repr=False)
    _classes: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def has_clock(self) -> bool:
        """Whether :meth:`perf_times` gives times (the queue is being
        decoded and its TSC converts to perf time)."""
        ctx = self._ctx
        return self.clock is not None and ctx is not None and ctx.conv is not None

    def perf_times(
        self,
        ips: np.ndarray,
        image: np.ndarray,
        classes: np.ndarray | None = None,
        out: np.ndarray | None = None,
        targets: np.ndarray | None = None,
    ) -> np.ndarray | None:
        """The perf time (ns) perf script gives each of ``ips``, the next
        instructions of this queue's flow (``image``: the image number of
        each; ``classes``: their transfer classes, :func:`transfer_class`,
        when the caller knows them, with ``targets`` for direct branches;
        ``out``: an int64 array of their size to write them into); None
        when the queue has no clock (no TSC conversion) or is not being
        decoded."""
        ctx = self._ctx
        if not self.has_clock():
            return None
        assert self.clock is not None and ctx is not None and ctx.conv is not None
        if classes is None:
            classes = self._transfer_classes(ips, image)
        conv = ctx.conv
        to_ns = (conv.time_shift, conv.time_mult, conv.time_zero)
        return self.clock.times(ips, classes, to_ns, out=out, targets=targets)

    def _transfer_classes(self, ips: np.ndarray, image: np.ndarray) -> np.ndarray:
        cls = np.zeros(ips.shape[0], np.uint8)
        for im in np.unique(image).tolist():
            sel = np.flatnonzero(image == im)
            uniq, inverse = np.unique(ips[sel], return_inverse=True)
            code = self.code(im)
            got = np.empty(uniq.shape[0], np.uint8)
            for j, ip in enumerate(uniq.tolist()):
                key = (im, ip)
                c = self._classes.get(key)
                if c is None:
                    insn = code.cache.get(ip, 64)
                    c = 0 if isinstance(insn, int) else transfer_class(insn.iclass, insn.is_direct)
                    self._classes[key] = c
                got[j] = c
            cls[sel] = got[inverse.reshape(-1)]
        return cls

    def symbols(self, image: int) -> SymbolTable:
        """The symbols of image number ``image``."""
        assert self._ctx is not None
        return self._ctx.symbols(self.images[image])

    def perf_names(self, image: int) -> PerfNames:
        """How perf script names the addresses of image number ``image``."""
        assert self._ctx is not None
        return self._ctx.perf_names(self.images[image])

    def code_table(self, image: int) -> CodeTable:
        """The decoder's code table of image number ``image`` (what block
        ``run`` numbers refer to)."""
        assert self._decoder is not None
        for table in self._decoder.tables:
            if image in table.indices:
                return table
        raise KeyError(image)

    def release_tables(self, images: set[int]) -> None:
        """Have the decoder let go of the code tables of image numbers
        ``images`` (:meth:`~hwtrace.pt.flowdec.FlowDecoder.release_tables`):
        their code is listed from :meth:`code` should it be asked for."""
        if self._decoder is not None and images:
            self._decoder.release_tables(images)

    def listing_table(self, image: int) -> CodeTable:
        """The code table the instructions of image number ``image`` are
        listed from (:meth:`PerfBlocks.instruction_rows`): the decoder's
        while the queue is decoded (blocks' ``run`` numbers are its runs),
        else :meth:`code`'s."""
        if self._decoder is not None:
            for table in self._decoder.tables:
                if image in table.indices:
                    return table
        return self.code(image).table

    def code(self, image: int) -> CodeIndex:
        """The decoded instructions of image number ``image`` (one
        :class:`~hwtrace.pt.codeindex.CodeIndex` per image, shared by the
        queues of a decoding)."""
        assert self._code is not None
        im = self.images[image]
        got = self._code.get(id(im))
        if got is None:
            got = self._code[id(im)] = CodeIndex(im)
        return got


@dataclass
class PtwMarks(Columns):
    """The PTWRITE payloads among a batch of blocks, in flow order: ``at``
    (how many of the batch's blocks ran before each), ``ip`` (the PTWRITE
    instruction when the trace gave it with a FUP, else 0), ``payload``,
    ``size`` (4 or 8 bytes) and perf time ``ns`` (-1: none)."""

    at: np.ndarray
    ip: np.ndarray
    payload: np.ndarray
    size: np.ndarray
    ns: np.ndarray

    @staticmethod
    def empty() -> PtwMarks:
        z = np.zeros(0, np.int64)
        return PtwMarks(z, z.astype(np.uint64), z.astype(np.uint64), z, z.copy())

    def select(self, which: np.ndarray, at: np.ndarray) -> PtwMarks:
        return PtwMarks(at, self.ip[which], self.payload[which], self.size[which], self.ns[which])

    def piece(self, lo: int, hi: int) -> PtwMarks:
        """The marks after a block of ``lo..hi`` (or before the first, for
        ``lo`` 0), numbered in that piece."""
        sel = (self.at > lo) & (self.at <= hi) if lo else self.at <= hi
        return self.select(sel, self.at[sel] - lo)

    @staticmethod
    def join(parts: list[PtwMarks]) -> PtwMarks:
        if not parts:
            return PtwMarks.empty()
        return PtwMarks(*(np.concatenate([getattr(m, c) for m in parts]) for c in _PTW_COLUMNS))


_PTW_COLUMNS = ("at", "ip", "payload", "size", "ns")


@dataclass
class PerfBlocks:
    """A batch of one queue's decoded blocks, in flow order, attributed:
    start ``ip``, ``ninsn``, execution ``mode``, perf time ``ns`` (-1: none),
    ``duration`` (ns, until the next block or until tracing stopped),
    thread ``tid`` and process ``pid`` (-1: unknown), the ``image``
    (number in ``queue.images``) each ran in, the code ``run`` of
    :meth:`QueueInfo.code_table` a block is (-1: not a whole run), and
    ``gap``: the flow has a gap before the block (nonzero, its kind:
    :data:`~hwtrace.pt.flowrows.GAP_LOST`, tracing stopped or a decode
    error; :data:`~hwtrace.pt.flowrows.GAP_REJOINED`, tracing left the
    traced ranges at a branch and came back here, nothing lost).  ``row`` is the first block's number in its queue;
    ``offset``: where in the queue's trace each block's decoding began
    (the packet ptdump lists there; None: not known; in a stream whose run
    is not asked for, :class:`~hwtrace.columns.Runs`).  ``keys``, when
    given, names each block by a row of ``key_table`` (its ``ip``,
    ``ninsn``, ``mode`` and ``image`` columns: the distinct blocks of the
    decoder's :class:`~hwtrace.pt.blocks.BlockStore`), so that what
    depends only on the block (its symbol, a dictionary of addresses) is
    worked out once per distinct block; in a stream whose run is not asked
    for, ``ip`` and ``ninsn`` are then :class:`~hwtrace.columns.Keyed`
    columns of those keys, and a thread's queue's ``ns`` and ``duration``
    :class:`~hwtrace.columns.Runs`, not laid out a row at a time
    (``numpy.asarray`` gives their values, :meth:`dense` arrays of them)."""

    queue: QueueInfo
    ip: np.ndarray
    ninsn: np.ndarray
    mode: np.ndarray
    ns: np.ndarray
    duration: np.ndarray
    tid: np.ndarray
    pid: np.ndarray
    image: np.ndarray
    run: np.ndarray
    gap: np.ndarray
    row: int
    #: the PTWRITE payloads among these blocks (None: none)
    ptw: PtwMarks | None = None
    offset: np.ndarray | Runs | None = None
    #: columns known to hold one value throughout (no need to look at
    #: every row to find out; the Parquet writer writes them once); in a
    #: stream whose run is not asked for they are read-only broadcasts of
    #: it (:meth:`dense` makes arrays of them)
    uniform: frozenset[str] = frozenset()
    keys: np.ndarray | None = None
    key_table: Mapping[str, np.ndarray] | None = None
    #: whose table ``key_table`` is (a number of its own per block store:
    #: the keys of different stores name different blocks)
    key_source: int = -1

    def __len__(self) -> int:
        return self.ip.shape[0]

    @property
    def lazy(self) -> bool:
        """Whether a column is not laid out a row at a time (a
        :class:`~hwtrace.columns.Keyed` or :class:`~hwtrace.columns.Runs`
        one)."""
        return any(not isinstance(getattr(self, c), np.ndarray) for c in _COLUMNS) or not (
            self.offset is None or isinstance(self.offset, np.ndarray)
        )

    def resolved(self) -> PerfBlocks:
        """The batch with its deferred columns made (in this thread; see
        :class:`QueueSink`): its keys an array, its trace offsets runs."""
        if not isinstance(self.keys, Deferred) and not isinstance(self.offset, Deferred):
            return self
        cols = [resolved(getattr(self, c)) for c in _COLUMNS]
        return PerfBlocks(self.queue, *cols, row=self.row, ptw=self.ptw,  # type: ignore[arg-type]
                          offset=resolved(self.offset), uniform=self.uniform,  # type: ignore[arg-type]
                          keys=resolved(self.keys), key_table=self.key_table,  # type: ignore[arg-type]
                          key_source=self.key_source)  # fmt: skip

    def dense(self) -> PerfBlocks:
        """The batch with every column an array of its own (a column of one
        value may be a read-only broadcast of it, see :attr:`uniform`), as
        compiled loops take them."""
        if not self.uniform and not self.lazy:
            return self
        cols = [np.ascontiguousarray(getattr(self, c)) for c in _COLUMNS]
        offset = None if self.offset is None else np.ascontiguousarray(self.offset)
        return PerfBlocks(self.queue, *cols, row=self.row, ptw=self.ptw, offset=offset,
                          uniform=self.uniform, keys=self.keys,
                          key_table=self.key_table, key_source=self.key_source)  # fmt: skip

    def split(self, max_insn: int) -> Iterator[PerfBlocks]:
        """The blocks in consecutive pieces of at most ``max_insn``
        instructions each (a longer block alone), to expand a piece at a
        time."""
        ends = np.cumsum(self.ninsn)
        if ends.shape[0] == 0 or ends[-1] <= max_insn:
            yield self
            return
        lo = 0
        while lo < ends.shape[0]:
            done = ends[lo - 1] if lo else 0
            hi = max(int(np.searchsorted(ends, done + max_insn, side="right")), lo + 1)
            yield PerfBlocks(
                self.queue, *(getattr(self, c)[lo:hi] for c in _COLUMNS), row=self.row + lo,
                ptw=self.ptw.piece(lo, hi) if self.ptw is not None else None,
                offset=self.offset[lo:hi] if self.offset is not None else None,
                uniform=self.uniform, keys=self.keys[lo:hi] if self.keys is not None else None,
                key_table=self.key_table, key_source=self.key_source,
            )  # fmt: skip
            lo = hi

    def take(self, which: np.ndarray, gap: np.ndarray | None = None) -> PerfBlocks:
        """The blocks ``which`` selects (indices or a mask), with ``gap``
        instead of their own gap flags when given."""
        cols = [getattr(self, c)[which] for c in _COLUMNS]
        if gap is not None:
            cols[-1] = gap.astype(self.gap.dtype)
        ptw = None
        if self.ptw is not None and len(self.ptw):
            # A mark stays with the block it follows (the first block's for
            # one before any).
            idx = np.arange(len(self))[which]
            before = np.maximum(self.ptw.at - 1, 0)
            pos = np.searchsorted(idx, before)
            kept = (pos < idx.shape[0]) & (idx[np.minimum(pos, max(idx.shape[0] - 1, 0))] == before)
            kept &= idx.shape[0] > 0
            ptw = self.ptw.select(kept, np.where(self.ptw.at[kept] > 0, pos[kept] + 1, 0))
        offset = self.offset[which] if self.offset is not None else None
        uniform = self.uniform - {"gap"} if gap is not None else self.uniform
        return PerfBlocks(self.queue, *cols, row=self.row, ptw=ptw, offset=offset,
                          uniform=uniform, keys=self.keys[which] if self.keys is not None else None,
                          key_table=self.key_table, key_source=self.key_source)  # fmt: skip

    def images(self) -> list[tuple[int, np.ndarray | slice]]:
        """``(image number, selection)`` for each image the blocks ran in."""
        image = np.asarray(self.image)  # (a column by key laid out)
        if image.shape[0] and ("image" in self.uniform or (image == image[0]).all()):
            return [(int(image[0]), slice(None))]
        if not image.shape[0]:
            return []
        # (a few images, numbered from 0: counted, not sorted)
        lo, hi = int(image.min()), int(image.max())
        if 0 <= lo and hi < 1 << 16:
            uniq = np.flatnonzero(np.bincount(image, minlength=hi + 1))
        else:
            uniq = distinct(image)
        return [(int(u), np.flatnonzero(image == u)) for u in uniq.tolist()]

    def instruction_rows(
        self, out: tuple[np.ndarray, np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """Every instruction's address, in order, with its index in the
        code table of its image (:meth:`QueueInfo.listing_table`) and,
        when the blocks ran in more than one image, the image of each (else
        None: all in ``self.image[0]``); the indices are into
        :meth:`QueueInfo.listing_table`.  ``out``: arrays with room for the
        addresses and indices (:func:`~hwtrace.pt.flowrows.instruction_rows`)."""
        parts = self.images()
        q = self.queue
        if len(parts) == 1:
            image, _ = parts[0]
            ips, rows = instruction_rows(q.listing_table(image), self.ip, self.ninsn, self.mode,
                                         out=out, runs=self.run)  # fmt: skip
            return ips, rows, None
        n = int(self.ninsn.sum())
        ips, rows = np.empty(n, np.uint64), np.empty(n, np.int64)
        owner = np.repeat(self.image, self.ninsn.astype(np.int64))
        for image, sel in parts:
            got, k = instruction_rows(q.listing_table(image), self.ip[sel], self.ninsn[sel],
                                      self.mode[sel], runs=self.run[sel])  # fmt: skip
            at = owner == image
            ips[at], rows[at] = got, k
        return ips, rows, owner

    def instructions(self) -> np.ndarray:
        """Every instruction's address, in order."""
        parts = self.images()
        if len(parts) == 1:
            image, _ = parts[0]
            return self.queue.code(image).expand(self.ip, self.ninsn, self.mode)
        out = np.empty(int(self.ninsn.sum()), np.uint64)
        owner = np.repeat(self.image, self.ninsn.astype(np.int64))
        for image, sel in parts:
            got = self.queue.code(image).expand(self.ip[sel], self.ninsn[sel], self.mode[sel])
            out[owner == image] = got
        return out


@dataclass
class PerfStream(PerfDecoding[QueueInfo]):
    """What :func:`stream_perf` learned besides the blocks."""


#: Rows of the decoder's batches a QueueSink asks for at most.
MAX_DECODER_ROWS = 1 << 18
#: Rows a deferred stream's first store holds before it grows (it passes
#: its rows on at half a batch, as every store does: passing the first
#: 2^17 rows on at once, for the writer's thread to start sooner, measured
#: no faster, the decoder's first windows being what the writer waits for).
FIRST_DEFERRED_ROWS = 1 << 17


def _gap_now(kind: int) -> int:
    """A gap of ``kind`` before a block: a stop still pending has no enable
    that tells what it was (lost)."""
    return FK.GAP_LOST if kind > FK.GAP_REJOINED else kind


_COLUMNS = ("ip", "ninsn", "mode", "ns", "duration", "tid", "pid", "image", "run", "gap")
# What a QueueSink gathers of the decoder's batches (as the decoder has them).
_GATHERED = (("ip", np.uint64), ("ninsn", np.uint32), ("mode", np.uint8), ("time", np.uint64),
             ("image", np.int64), ("run", np.int32), ("offset", np.int64))  # fmt: skip
# The columns a QueueSink passes on, with their types.
_PASSED = (("ip", np.uint64), ("ninsn", np.int64), ("mode", np.uint8), ("image", np.int64),
           ("run", np.int32), ("offset", np.int64), ("ns", np.int64), ("tid", np.int64),
           ("pid", np.int64), ("duration", np.int64))  # fmt: skip
#: The columns of the block a stream to Parquet takes by key.  (The
#: image too: a block decoded before a process mapped more code keeps the
#: image it was decoded in, so a real program's batches mix images a row
#: at a time, and laying them out made each such batch's rows attributed
#: one by one.)
_BY_KEY = ("ip", "ninsn", "image")
#: The columns the attribution loops write, in their order.
_ATTRIBUTED = tuple(c for c, _ in _PASSED if c != "duration")
_KIND = dict(_PASSED)
_NO_TIMES = np.zeros(0, np.int64)
_NO_TSC = np.zeros(0, np.uint64)
_NO_RUN = np.zeros(0, np.int32)
_NO_OFFSET = np.zeros(0, np.int64)
# Empty columns to attribute into: a column of one value is not written.
_NOWHERE = {c: np.zeros(0, kind) for c, kind in _PASSED}


class QueueSink(FlowSink):
    """Gathers the decoder's batches (which end at every event the sideband
    is asked about, so may be a few blocks each) into batches of at most
    ``rows`` blocks, attributes them and passes them on, one block behind:
    the last block's duration waits for the next block (or for tracing to
    stop, or for the queue to end).

    ``runs=False``: the blocks' ``run`` is not asked for (-1 throughout):
    the decoder then keeps its rows compactly (:class:`~hwtrace.pt.blocks.
    BlockStore`) and replays the stretches of flow it has decoded before,
    as when decoding with every block kept, and the rows are taken from
    there batch by batch.  ``deferred`` too: the rows' keys and trace
    offsets are handed on as copies of the store's compact form
    (:class:`~hwtrace.columns.Deferred`), laid out by whoever takes the
    batch (a Parquet writer, in its own thread), not in the decoding
    thread."""

    def __init__(
        self, q: QueueInfo, ctx: QueueContexts, emit: Callable[[PerfBlocks], None], rows: int,
        *, runs: bool = True, deferred: bool = False,
    ) -> None:  # fmt: skip
        self.q, self.ctx, self.emit, self.target = q, ctx, emit, max(rows, 1)
        self.runs = runs
        self.defer = deferred and not runs
        # The decoder's batches as large as the ones passed on (though not
        # so small that it stops for every few blocks, nor so large that its
        # buffers weigh): a full one is passed on without being gathered.
        self.BLOCK_ROWS = min(max(self.target, 1 << 12), MAX_DECODER_ROWS)
        # The decoder's batches since the last attribution, gathered into
        # buffers kept from one attribution to the next (the decoder reuses
        # its own); ``n_parts`` rows of them are filled.
        self.gather = {c: np.empty(0, t) for c, t in _GATHERED}
        self.n_parts = 0
        self.events: list[tuple[np.ndarray, ...]] = []  # (rows, offsets, block rows before)
        self.held: dict[str, np.ndarray] | None = None  # the last block, duration pending
        self.held_stop: int | None = None  # when tracing stopped after it (TSC; 0: unknown)
        self.threads = ctx.thread_columns()
        self.held_row = 0
        self.rows = 0  # block rows passed on or held
        self.gap_next = FK.GAP_NONE  # a gap before the next block gathered (its kind)
        self.ptw_pending: PtwMarks | None = None  # marks after the held block
        self.store = None
        self.deferred = 0  # rows of earlier decoder batches waiting in the store
        self.key_table: Mapping[str, np.ndarray] | None = None  # the last batch's
        self.store_number = -1
        self.dead_seen = 0  # the images ctx.dead_images gave, when last asked
        if not runs:
            # The decoder stores rows itself and stops when the store is
            # full, for its rows to be passed on; it writes out only the
            # rows it cannot store (a far jump's): small buffers, and a
            # batch no larger than those passed on when the two add up.
            small = 1 << 12
            self.store_rows = max(self.target - small, small)
            # (a deferred stream's first store smaller: see FIRST_DEFERRED_ROWS)
            first = min(self.store_rows, FIRST_DEFERRED_ROWS) if self.defer else self.store_rows
            self.store = BlockStore(first)
            self.BLOCK_ROWS = small

    def output(self) -> tuple:
        if self.store is not None and not self.store.live and not len(self.store):
            # More distinct blocks than the decoder can store itself (its
            # keys two bytes): a new store, a new source of keys, which the
            # held block is named in (a real program's code outgrows one
            # after some millions of rows; its rows came out laid out from
            # then on, and were written a row at a time).
            self._new_store()
        return self.storing_output(self.store)

    def _new_store(self) -> None:
        store = BlockStore(self.store_rows)
        held = self.held
        if held is not None and "key" in held:
            key = np.empty(1, np.uint16)
            store.row_keys(held["ip"].astype(np.uint64), held["ninsn"].astype(np.uint32),
                           held["mode"].astype(np.uint8), held["image"], key)  # fmt: skip
            held["key"] = key
        self.store = store

    def make_room(self) -> None:
        if self.store is not None:
            self.store.make_room()

    def batch(self, b: FlowBatch) -> None:
        q = self.q
        q.n_insn += b.n_insn
        n = b.ip.shape[0]
        q.n_blocks += n + b.n_virtual
        # (the batch's first row, numbered in ``gather``: after the rows
        # gathered and those of earlier batches still in the store)
        base = self.n_parts + self.deferred
        if len(b.events):
            # Event rows (reused by the decoder): kept for _attribute.
            self.events.append((b.events.copy(), b.event_offset.copy(), b.event_block + base))
        stored = len(self.store) if self.store is not None else 0
        # (a store outgrown by its distinct blocks takes no more rows from
        # the decoder: what it holds is passed on now, and a new store
        # takes the next rows, rather than a batch's worth laid out)
        outgrown = stored > 0 and not self.store.live
        if stored and not self.n_parts and not n and 2 * stored < self.target and not outgrown:
            # A small batch all in the store (a window's last rows): they
            # wait there for the next batch's, still keyed and with their
            # time and offset points, not laid out and gathered.
            self.deferred = stored
            return
        self.deferred = 0
        base = self.n_parts
        if stored and not base and (2 * (stored + n) >= self.target or outgrown):
            # A batch of a compact stream, about as large as those passed
            # on: attributed straight from the store (and the decoder's
            # arrays, for the rows it could not store).
            self._attribute(self._batch_columns(b, n), stored=True)
            return
        if stored:
            # The rows the decoder stored come before those it wrote out.
            self._room(self.n_parts + len(self.store))
            g, lo = self.gather, self.n_parts
            got = self.store.drain(g["ip"][lo:], g["ninsn"][lo:], g["mode"][lo:],
                                   g["image"][lo:], g["offset"][lo:], g["time"][lo:])  # fmt: skip
            g["run"][lo : lo + got] = -1
            self.n_parts += got
        if 2 * n >= self.target and not self.n_parts:
            # A batch about as large as those passed on (the usual one, the
            # decoder's buffers full): attributed straight from the
            # decoder's arrays, not gathered first.
            self._attribute(self._batch_columns(b, n))
            return
        if n:
            lo, hi = self.n_parts, self.n_parts + n
            self._room(hi)
            for c, v in self._batch_columns(b, n).items():
                self.gather[c][lo:hi] = v
            self.n_parts = hi
        if self.n_parts >= self.target:
            self._attribute()

    def _room(self, rows: int) -> None:
        """Gather buffers with room for ``rows`` rows."""
        g = self.gather
        if rows > g["ip"].shape[0]:
            # (a batch's worth at once: growing by doubling from a few rows
            # copied and faulted in the rows gathered again at each step)
            size = max(rows, 2 * g["ip"].shape[0], self.target + (1 << 12))
            for c, v in g.items():
                grown = np.empty(size, v.dtype)
                grown[: self.n_parts] = v[: self.n_parts]
                g[c] = grown

    @staticmethod
    def _batch_columns(b: FlowBatch, n: int) -> dict[str, np.ndarray | int]:
        """The gathered columns of decoder batch ``b`` (``n`` blocks), as
        the batch has them (-1 where it has none)."""
        return {
            "ip": b.ip, "ninsn": b.ninsn, "mode": b.mode, "time": b.time, "image": b.image,
            "run": b.run if b.run is not None else -1,
            "offset": b.offset if b.offset.shape[0] == n else -1,
        }  # fmt: skip

    def _attribute(
        self, batch: Mapping[str, np.ndarray | int] | None = None, stored: bool = False
    ) -> None:
        """Attribute the gathered blocks (or, given, the columns of one
        decoder batch, none gathered; or the rows the store holds) and
        pass on all but the last."""
        stop_k, stop_t, (gap_k, gap_v), ptw = self._events()
        m = len(self.store) if stored else 0
        rest = self.n_parts if batch is None else batch["ip"].shape[0]
        n = m + rest
        self.n_parts = 0
        if not n:
            if len(ptw):
                # No block since: the marks follow the held block.
                ptw.at[:] = 1 if self.held is not None else 0
                self.ptw_pending = PtwMarks.join([m for m in (self.ptw_pending, ptw) if m])
            if stop_k.shape[0] and self.held is not None:
                # Tracing stopped with no block since the held one.
                self.held_stop = int(stop_t[-1])
            self.gap_next = FK.joined_gap(np.append(gap_v, self.gap_next))
            return
        held = 1 if self.held is not None else 0
        total = n + held
        keys, last_key = self._keys(held, m, rest, batch, total)
        # The columns passed on: the held block, then the gathered ones
        # (new arrays: whoever takes a batch may keep it), attributed in one
        # compiled pass; a stream to Parquet takes the block's own columns
        # by key, not laid out.
        t = self.store.table() if m or keys is not None else None
        one = self._uniform(held, m, rest, batch, t if m else None)
        # (an image of one value stays that: a broadcast, not a key a row)
        by_key = (
            tuple(c for c in _BY_KEY if c != "image" or c not in one)
            if keys is not None and not self.runs
            else ()
        )
        # ... and, for a thread's queue (no switches to look up a row at a
        # time), the time and duration as runs: from the store's time
        # points, not laid out.
        t_row, t_val = self.store.time_changes() if m else (_NO_TIMES, _NO_TSC)
        timed = bool(by_key) and "tid" in one and (not m or (t_row.shape[0] and t_row[0] == 0))
        lazy = (*by_key, "ns", "duration") if timed else by_key
        # ... and the trace offsets of rows all from the store as runs, from
        # its change points (one every few rows).
        offsets_as_runs = bool(by_key) and m > 0 and not rest
        if offsets_as_runs:
            lazy = (*lazy, "offset")
        cols = {c: repeated(one[c], total, kind) if c in one else np.empty(total, kind)
                for c, kind in _PASSED if c not in lazy}  # fmt: skip
        if held:
            for c, v in cols.items():
                if c != "duration" and c not in one:
                    v[0] = self.held[c][0]
        # Blocks after which tracing stopped, numbered in ``cols``.
        k = stop_k - 1 + held
        keep = (k >= 0) & (k < total)
        k, stop_t = k[keep], stop_t[keep]
        if held and self.held_stop is not None:
            k = np.concatenate([[0], k])
            stop_t = np.concatenate([np.array([self.held_stop], np.uint64), stop_t])
        # (columns of one value are not written: an empty array in their place)
        out = [_NOWHERE[c] if c in one or c in lazy else cols[c] for c in _ATTRIBUTED]
        # (nothing laid out a row at a time: deferred keys stay deferred)
        if m and (any(o.shape[0] for o in out) or not isinstance(keys, Deferred)):
            store = self.store
            # (keys kept in sequences stay so for the taker, laid out once here)
            keys = resolved(keys)
            laid = keys.made() if isinstance(keys, SequencedKeys) else keys
            stored_keys = laid[held : held + m] if laid is not None else store.key_column()
            attribute_stored(
                stored_keys, t["ip"], t["ninsn"], t["mode"], t["image"],
                *store.offset_steps(), t_row, t_val, held, *self.threads, *out,
            )  # fmt: skip
        rest_ns = np.empty(total if timed and rest else 0, np.int64)
        if rest:
            # (the rows written out laid out, their times too)
            self._attribute_rows(batch, rest, held + m,
                                 [rest_ns if c == "ns" and timed else o
                                  for c, o in zip(_ATTRIBUTED, out, strict=True)])  # fmt: skip
        if offsets_as_runs:
            cols["offset"], last_offset = self._offset_runs(held, total)
        if timed:
            conv = self.threads[0]
            starts, ns = time_runs(self.held["ns"] if held else None, t_row, t_val, held,
                                   rest_ns[held + m :], held + m, conv)  # fmt: skip
            cols["ns"] = Runs(starts, ns, total)
            cols["duration"] = Runs(*duration_runs(starts, ns, total, k, stop_t, conv), total)
        else:
            durations_of(cols["ns"], cols["duration"], k, stop_t, self.threads[0])
        if m:
            self.store.clear()
            self.store.reserve(self.store_rows)
        inside = gap_k < n
        held_gap = int(self.held["gap"][0]) if held else 0
        if inside.any() or self.gap_next or held_gap:
            gap = cols["gap"] = FK.no_gaps(total)
            gap[held] = _gap_now(self.gap_next)
            # (a lost flow where a rejoin meets it at one block: it counts)
            # (a stop pending before a block: lost, see _gap_now)
            kinds = np.where(gap_v > FK.GAP_REJOINED, FK.GAP_LOST, gap_v)
            FK.mark_gaps(gap, held + gap_k[inside], kinds[inside])
            if held:
                gap[0] = held_gap
        else:
            # (no gap, as in most batches: a broadcast, told at a glance)
            cols["gap"] = repeated(0, total, np.uint8)
        self.gap_next = FK.joined_gap(gap_v[~inside])  # (a pending stop: still pending)
        uniform = frozenset(one)
        first_row = self.held_row if held else self.rows
        last = k == total - 1
        self.held_stop = int(stop_t[last][-1]) if last.any() else None
        self.held = {c: np.asarray(v[total - 1 :]).copy() for c, v in cols.items()
                     if c != "duration" and not isinstance(v, Deferred)}  # fmt: skip
        if isinstance(cols["offset"], Deferred):
            self.held["offset"] = np.array([last_offset], np.int64)
        self.key_table = None
        if keys is not None:
            self.held["key"] = np.array([last_key], keys.dtype)
            self.key_table, self.store_number = t, self.store.number
            for c in by_key:
                self.held[c] = t[c][self.held["key"]].astype(_KIND[c])
                cols[c] = Keyed(keys, t[c], self.store_number)
        self.held_row = first_row + total - 1
        self.rows += n
        # The marks, numbered by the blocks of ``cols`` before each; those
        # after the (new) held block wait with it.
        ptw.at += held
        marks = PtwMarks.join([m for m in (self.ptw_pending, ptw) if m])
        later = marks.at >= total
        self.ptw_pending = (
            marks.select(later, marks.at[later] - (total - 1)) if later.any() else None
        )
        marks = marks.select(~later, marks.at[~later])
        for lo in range(0, total - 1, self.target):
            hi = min(lo + self.target, total - 1)
            self.emit(PerfBlocks(self.q, *(cols[c][lo:hi] for c in _COLUMNS), row=first_row + lo,
                                 ptw=marks.piece(lo, hi) if len(marks) else None,
                                 offset=cols["offset"][lo:hi], uniform=uniform,
                                 keys=keys[lo:hi] if keys is not None else None,
                                 key_table=self.key_table,
                                 key_source=self.store_number))  # fmt: skip
        if total == 1 and len(marks):
            # Only the held block: its marks wait with it.
            self.ptw_pending = PtwMarks.join(
                [marks, self.ptw_pending] if self.ptw_pending else [marks]
            )
        self._release_code()

    def _release_code(self) -> None:
        """Have the decoder let go of the code tables of images the
        queue's processes have left (by exec): a program exec'd in turn by
        another (a shell, an interpreter's start-up) would otherwise keep
        every one.  Once passed on, a batch is not kept (its ``run``
        numbers are its table's), so only the held block's image waits; a
        batch whose keys its taker lays out later keeps no run."""
        dead = self.ctx.dead_images()
        if len(dead) == self.dead_seen or self.deferred:
            return
        gone = {id(im) for im in dead}
        numbers = {i for i, im in enumerate(self.q.images)
                   if id(getattr(im, "revision_base", im)) in gone}  # fmt: skip
        held = int(self.held["image"][0]) if self.held is not None else -1
        self.q.release_tables(numbers - {held})
        if held not in numbers:
            self.dead_seen = len(dead)  # (else again with the next batch)

    def _offset_runs(self, held: int, total: int) -> tuple[Runs | Deferred, int]:
        """The trace offset of the held block (if ``held``) and of the rows
        the store holds after it, as runs (deferred: the store's offset
        points, see :class:`QueueSink`), and the last row's."""
        first = int(self.held["offset"][0]) if held else None
        points = self.store.offset_steps()
        if not self.defer:
            runs = Runs(*offset_runs(first, *points, held, total), total)
            return runs, int(runs.values[-1])
        points = tuple(a.copy() for a in points)
        last = self.store.last_offset()  # (the rows are all the store's)
        return OffsetPoints(
            total,
            first,
            points,
            held,
            lambda: Runs(*offset_runs(first, *points, held, total), total),
        ), last

    def _keys(self, held: int, m: int, rest: int,
              batch: Mapping[str, np.ndarray | int] | None, total: int,
              ) -> tuple[np.ndarray | Deferred | None, int]:  # fmt: skip
        """The next batch's block keys into the store's table (the held
        block's, the stored rows', then the written-out rows' found or
        added there), or None: no store, or the held block has none; and
        the last row's key.  Deferred (see :class:`QueueSink`) when asked
        to and the store holds rows."""
        store = self.store
        if store is None or (held and "key" not in self.held):
            return None, -1
        # (two bytes a key while the table may not outgrow them, as the
        # store keeps its own: half the memory the writer reads)
        narrow = store.keys.dtype == np.uint16 and store.n_keys + rest < 1 << 16
        kind = np.uint16 if narrow else np.uint32
        first = int(self.held["key"][0]) if held else -1
        src = None
        if rest:
            src = batch if batch is not None else {c: v[:rest] for c, v in self.gather.items()}
        if self.defer and m:
            later = np.empty(rest, kind)
            if src is not None:
                store.row_keys(src["ip"], src["ninsn"], src["mode"], src["image"], later)
            if narrow:
                # (the store's entries and sequences as they are: the
                # Parquet writer reads them so, laid out only if asked)
                kept = sequenced_keys(store, first if held else -1, later)
                if kept is not None:
                    return kept, kept.last()
            stored = StoredKeys(store)
            last = int(later[-1]) if rest else stored.last()

            def make() -> np.ndarray:
                keys = np.empty(total, kind)
                if held:
                    keys[0] = first
                stored.into(keys[held : held + m])
                keys[held + m :] = later
                return keys

            return Deferred(total, kind, make, stored.nbytes + later.nbytes), last
        keys = np.empty(total, kind)
        if held:
            keys[0] = first
        if m:
            # (expanded straight into the batch's keys)
            store.key_column(out=keys[held : held + m])
        if src is not None:
            store.row_keys(src["ip"], src["ninsn"], src["mode"], src["image"], keys[held + m :])
        return keys, int(keys[-1])

    def _uniform(
        self, held: int, m: int, rest: int, batch: Mapping[str, np.ndarray | int] | None,
        table: Mapping[str, np.ndarray] | None,
    ) -> dict[str, int]:  # fmt: skip
        """The columns of the next batch known to hold one value throughout,
        with it, found without a pass over its rows: the run (not asked
        for), the thread and process of a per-thread queue, the mode and
        address space when every block the store holds has the same (and
        the few rows after it, and the held one, too).  Those are passed on
        as read-only broadcasts of the value and not written a row.  Only
        when the run is not asked for (a decode to Parquet): other streams'
        takers run compiled loops on whole columns."""
        if self.runs:
            return {}
        one = {"run": -1}
        if self.threads[1] >= 0:
            one["tid"], one["pid"] = int(self.threads[1]), int(self.threads[2])
        if table is None or rest > 1 << 13:
            return one
        src = batch if batch is not None else self.gather
        for c in ("mode", "image"):
            first = self.held[c][0] if held else table[c][0]
            if not (table[c] == first).all():
                continue
            r = src[c] if rest else np.zeros(0, np.int64)
            if np.ndim(r) == 0 or r.shape[0] == 1:
                # (the decoder's batch gives one value for all its rows)
                same = np.ndim(r) == 0 or r[0] == first
            else:
                same = bool((r[:rest] == first).all())
            if same:
                one[c] = int(first)
        return one

    def _attribute_rows(
        self, batch: Mapping[str, np.ndarray | int] | None, n: int, at: int,
        out: list[np.ndarray],
    ) -> None:  # fmt: skip
        """:func:`attribute_rows` of the ``n`` gathered rows (or of
        ``batch``) into rows ``at`` on of the columns ``out``."""
        src = {c: v[:n] for c, v in self.gather.items()} if batch is None else batch
        ninsn = src["ninsn"]
        if ninsn.dtype != np.uint32:
            ninsn = ninsn.astype(np.uint32)
        image = src["image"]
        image = np.array([image], np.int64) if np.ndim(image) == 0 else image
        run, offset = src["run"], src["offset"]
        run = _NO_RUN if np.ndim(run) == 0 else run
        offset = _NO_OFFSET if np.ndim(offset) == 0 else offset
        attribute_rows(
            src["ip"], ninsn, src["mode"], src["time"], image, run, offset, at,
            *self.threads, *out,
        )  # fmt: skip

    def _events(self) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray], PtwMarks]:
        """Gaps from the gathered events' errors; the stops of tracing
        (gathered blocks before each, decoder time); the gathered blocks
        before which the flow has a gap (stops, errors, overflows) and its
        kind (flowrows.GAP_*)."""
        if not self.events:
            z = np.zeros(0, np.int64)
            return z, np.zeros(0, np.uint64), (z, np.zeros(0, np.uint8)), PtwMarks.empty()
        if len(self.events) == 1:
            ev, offsets, blocks = self.events[0]
        else:
            ev, offsets, blocks = (np.concatenate(c) for c in zip(*self.events, strict=True))
        self.events = []
        # (one compiled pass: a batch of an event-dense trace has thousands)
        stop_k, stop_t, gap_k, gap_v, n_err, n_ptw, lead = stops_and_gaps(
            ev, blocks, _IS_STOP, self.gap_next if self.gap_next > FK.GAP_REJOINED else 0
        )
        if self.gap_next > FK.GAP_REJOINED:
            self.gap_next = lead  # (the stop before these events, now its enable came)
        if n_err:
            self.q.gaps.extend(error_gaps(ev, offsets))
        ptw = PtwMarks.empty()
        if n_ptw:
            types, flags = ev[:, FK.E_TYPE], ev[:, FK.E_FLAGS]
            real = (types < FK.X_ERROR) & ((flags & FK.F_STATUS) == 0)
            w = np.flatnonzero(real & (types == FK.EV_PTWRITE))
            t = np.where((flags[w] & FK.F_HAS_TSC) != 0, ev[w, FK.E_TSC], np.uint64(0))
            ns = self.ctx.attribute(t)[0]
            ip = np.where((flags[w] & FK.F_SUPP) == 0, ev[w, FK.E_IP], np.uint64(0))
            ptw = PtwMarks(blocks[w].astype(np.int64), ip, ev[w, FK.E_PAYLOAD].copy(),
                           ev[w, FK.E_SIZE].astype(np.int64), ns)  # fmt: skip
        return stop_k, stop_t, (gap_k, gap_v), ptw

    def _take_deferred(self) -> bool:
        """Whether rows of earlier batches wait in the store (they are
        passed on now: nothing is gathered after them)."""
        waiting, self.deferred = self.deferred > 0, 0
        return waiting

    def start_at(self, row: int, gap: bool) -> None:
        """Number the first block ``row`` and mark a gap before it: how a
        sink fed a later part of a queue's flow continues the one before."""
        self.rows, self.gap_next = row, gap

    def flush(self) -> None:
        """Attribute and pass on what is gathered, all but the last block
        (its duration waits for the next one)."""
        self._attribute(stored=self._take_deferred())

    def finish(self) -> None:
        """Pass on what is gathered, then the last block (it ran until
        tracing stopped, if that is known)."""
        self._attribute(stored=self._take_deferred())
        if self.held is None:
            return
        cols = dict(self.held)
        key = cols.pop("key", None)
        zero = np.zeros(1, np.int64)
        stop = np.array([self.held_stop or 0], np.uint64)
        cols["duration"] = durations(cols["ns"], zero, self.ctx.stop_values(cols["ns"], zero, stop))
        keyed = key is not None and self.key_table is not None
        self.emit(PerfBlocks(self.q, *(cols[c] for c in _COLUMNS), row=self.held_row,
                             ptw=self.ptw_pending, offset=cols["offset"],
                             keys=key if keyed else None,
                             key_table=self.key_table if keyed else None,
                             key_source=self.store_number))  # fmt: skip
        self.held = None
        self.ptw_pending = None


def stream_perf(
    data: PerfData,
    on_blocks: Callable[[PerfBlocks], None],
    locator: BinaryLocator | None = None,
    *,
    kernel: KernelCode | None = None,
    sideband: Sideband | None = None,
    batch_rows: int = 1 << 15,
    chunk_bytes: int = 1 << 20,
    window_bytes: int = 1 << 17,
    runs: bool = True,
    deferred: bool = False,
) -> PerfStream:
    """Decode every AUX queue of ``data`` (as :func:`decode_perf`), queue
    by queue in the same order, handing the blocks to ``on_blocks`` in
    batches of at most ``batch_rows`` (one queue's, in flow order) as the
    decoder produces them; nothing of a batch is kept once ``on_blocks``
    returns.  Returns the queues (with their gaps), the sideband and the
    problems met.  ``chunk_bytes`` as for :func:`decode_perf`;
    ``window_bytes``: the trace whose packets are decoded at a time (the
    decoder's memory, :attr:`~hwtrace.pt.flowdec.FlowDecoder.window_bytes`;
    a stream is kept to a few times what one batch needs).  ``runs=False``:
    the blocks' code-table runs are not needed (``run`` -1), which lets
    the decoder replay what it decoded before (see :class:`QueueSink`);
    with ``deferred`` too, a batch's block keys and trace offsets may be
    :class:`~hwtrace.columns.Deferred` (:meth:`PerfBlocks.resolved` makes
    them, in the thread that takes the batch)."""
    locator, sb, problems, setup = setup_decoding(data, locator, kernel, sideband)
    if setup is None:
        return PerfStream([], sb, None, problems)
    conv, config, kernel, queues = setup
    aux = data.auxtrace_columns()
    code: dict[int, CodeIndex] = {}
    infos: list[QueueInfo] = []
    for index, (cpu, tid, starts, sizes) in enumerate(queues):
        ctx = QueueContexts(cpu, tid, sb, conv, locator, kernel)
        dec = FlowDecoder(
            ctx.first(), config, DecodeOptions().flow_options(),
            on_event=decoder_hook(ctx), stop_at="enabled", revisions=ctx.revisions_for,
        )  # fmt: skip
        dec.window_bytes = window_bytes
        q = QueueInfo(index, cpu, tid, dec.images, _ctx=ctx, _code=code, _decoder=dec)
        infos.append(q)
        sink = QueueSink(q, ctx, on_blocks, batch_rows, runs=runs, deferred=deferred)
        with queue_trace(data, starts, sizes) as trace:
            q.trace_bytes = trace.shape[0]
            ref = aux["reference"][aux["data_offset"] == starts[0]] if starts.shape[0] else []
            q.clock = PerfClock(
                trace, config.mtc_freq, (config.cpuid_0x15_ebx, config.cpuid_0x15_eax),
                config.nom_freq, int(ref[0]) if len(ref) else 0,
            )  # fmt: skip
            # (its caches sized for the whole queue, not for one range)
            dec.expect(trace.shape[0])
            for s, e in chunk_ranges(trace, chunk_bytes):
                dec.decode(trace, sink, s, e)
            sink.finish()
            q.clock = None
        # Code the trace could not tell from the code it replaced.
        problems += [f"queue {index} (tid {tid}): {u}" for u in dec.unplaced]
    problems += list(locator.problems.values()) + sb.revision_conflicts()
    return PerfStream(infos, sb, conv, problems)


def decoder_hook(ctx: QueueContexts) -> Callable[[np.ndarray, int], object]:
    """The decoder's event hook for ``ctx``, as
    :func:`~hwtrace.pt.decode.decode_trace` makes it from a ``context``."""

    def hook(row: np.ndarray, offset: int) -> object:
        has_tsc = int(row[FK.E_FLAGS]) & FK.F_HAS_TSC
        return ctx.context(int(row[FK.E_TSC]) if has_tsc else None, int(row[FK.E_IP]))

    # The decoder stops at an enable only once the context may change (a
    # trace of a filtered function enables it at every call).
    hook.stop_from = ctx.stable_until  # type: ignore[attr-defined]
    return hook
