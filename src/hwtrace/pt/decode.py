"""Instruction-flow reconstruction as a library: trace bytes + image → columns.

:func:`decode_trace` turns an Intel PT stream into a :class:`FlowResult`:
the executed basic blocks as numpy columns (start IP, instruction count,
time, trace offset), the events, and every gap where decoding failed.  A
trace is cut at PSB boundaries into chunks that decode independently: in
order for :func:`iter_flow` (bounded memory, any trace size) or on several
threads for :func:`decode_trace` with ``jobs``.  Each chunk is decoded by
the compiled :class:`~hwtrace.pt.flowdec.FlowDecoder`.

Why a chunk also reads the next chunk's PSB+: the PSB+ says where execution
was when it was written (its FUP), which may be in the middle of a block.
Decoding it walks the previous chunk's flow exactly up to that address, so
the next chunk, which starts there, neither repeats nor misses instructions.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..columns import dense_empty
from ..image.revisions import CodeRevisions, revised_instructions
from ..image.symbols import SymbolTable
from . import _flowloop as K
from . import flowrows as R
from .blocks import BlockStore, CompactBlocks, grown
from .codetable import CodeTable
from .config import PtConfig
from .flowdec import FlowBatch, FlowDecoder, FlowOptions, FlowSettings, FlowSink, UnplacedRevision
from .flowrows import (
    OUT_EVENTS,
    OUT_RUN,
    CodeView,
    Event,
    Gap,
    error_gaps,
    event_object,
    instructions_of,
)
from .packets import as_buffer, map_file

# Which image runs from an enabling of tracing on: ``context(tsc, ip)``, tsc
# None when the trace has no time there; returns None to keep the image.
Context = Callable[[int | None, int], object]
# Code revisions for a decoding: one store, or one per image (see FlowDecoder).
Revisions = CodeRevisions | Callable[[object], CodeRevisions | None] | None

_EMPTY_EVENTS = np.zeros((0, R.EW), np.uint64)


@dataclass(frozen=True, slots=True)
class AmbiguousRevision:
    """A revision whose start fell inside a decode's modification window:
    the decode failed at trace ``offset`` near its start, and succeeded
    further with the revision taken to begin at ``used_from`` (the
    neighbouring revision's bytes ran up to there)."""

    address: int
    size: int
    valid_from: int
    used_from: int
    offset: int
    source: str

    def __str__(self) -> str:
        side = "later" if self.used_from > self.valid_from else "earlier"
        return (
            f"ambiguous code revision at {self.address:#x} ({self.source}): decoded as "
            f"beginning {side}, at {self.used_from} instead of {self.valid_from} "
            f"(trace offset {self.offset:#x})"
        )


class _BlockColumn:
    """A block column of :class:`FlowResult` (``block_ip`` is column
    ``ip``), made dense from the decoder's batches on first use."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.column = name.removeprefix("block_")

    def __get__(self, result: FlowResult | None, owner: type | None = None) -> Any:
        if result is None:
            return self
        return result._column(self.column)


class FlowResult:
    """Executed blocks as columns, events, gaps.

    ``block_ip[i]`` starts ``block_ninsn[i]`` instructions that ran one after
    another (straight-line or through direct jumps and calls);
    ``block_time`` is the time stamp of the last packet consumed before the
    block and ``block_offset`` the trace offset of the packet being decoded.

    The decoder keeps blocks compactly (:attr:`blocks`, see
    :mod:`hwtrace.pt.blocks`); the dense columns are made when first read.
    """

    def __init__(
        self,
        block_ip: np.ndarray | None = None,
        block_ninsn: np.ndarray | None = None,
        block_time: np.ndarray | None = None,
        block_offset: np.ndarray | None = None,
        block_mode: np.ndarray | None = None,  # 16, 32 or 64 (None: all 64)
        gaps: list[Gap] | None = None,
        *,
        blocks: CompactBlocks | None = None,
        n_insn: int | None = None,
    ) -> None:
        self.blocks = blocks
        self._dense: dict[str, np.ndarray | None] = {}
        if blocks is None:
            self._dense.update(
                ip=block_ip if block_ip is not None else np.zeros(0, np.uint64),
                ninsn=block_ninsn if block_ninsn is not None else np.zeros(0, np.uint32),
                time=block_time if block_time is not None else np.zeros(0, np.uint64),
                offset=block_offset if block_offset is not None else np.zeros(0, np.int64),
                mode=block_mode,
                image=None,
            )
        self._n_insn = n_insn
        self.gaps: list[Gap] = gaps if gaps is not None else []
        # The code the blocks ran, per image (index in ``images``): the
        # decoders' code tables as they were at the end (one per decoding
        # thread that ran the image).
        self.code: dict[int, list[CodeView]] = {}
        # (instructions, blocks) when decoded with keep_blocks=False: the
        # columns are then empty.
        self.counted: tuple[int, int] | None = None
        self.images: list = []
        # The events: rows as the decoder writes them (see
        # hwtrace.pt.flowrows), their trace offsets, and the number of
        # blocks before each.
        self.event_rows: np.ndarray = _EMPTY_EVENTS
        self.event_offset: np.ndarray = np.zeros(0, np.int64)
        self.event_block: np.ndarray = np.zeros(0, np.int64)
        # Revisions the decode took to begin elsewhere than their sources
        # said (see decode_trace's revision_window), and revisions the
        # trace could not place among the instructions decoded from them.
        self.ambiguous: list[AmbiguousRevision | UnplacedRevision] = []

    def _column(self, name: str) -> np.ndarray | None:
        if name not in self._dense:
            col = self.blocks.column(name)
            if name == "image" and not col.any():
                col = None  # every block in the first image
            self._dense[name] = col
        return self._dense[name]

    block_ip = _BlockColumn()
    block_ninsn = _BlockColumn()
    block_time = _BlockColumn()
    block_offset = _BlockColumn()
    block_mode = _BlockColumn()  # 16, 32 or 64 (None: all 64)

    @property
    def block_image(self) -> np.ndarray | None:
        """The image each block ran in, as an index into ``images`` (None:
        all in the first)."""
        return self._column("image")

    @block_image.setter
    def block_image(self, value: np.ndarray | None) -> None:
        self._dense["image"] = value

    @property
    def events(self) -> list[tuple[int, Event]]:
        """The events as ``(trace offset, Event)``; ``Event.block`` places
        each in the flow (see :meth:`event_columns` for columns)."""
        out = []
        for row, off, blk in zip(self.event_rows, self.event_offset, self.event_block, strict=True):
            ev = event_object(row)
            ev.block = int(blk)
            out.append((int(off), ev))
        return out

    @property
    def n_insn(self) -> int:
        if self.counted is not None:
            return self.counted[0]
        if self._n_insn is None:
            self._n_insn = int(self.block_ninsn.sum(dtype=np.uint64))
        return self._n_insn

    @property
    def n_blocks(self) -> int:
        if self.counted is not None:
            return self.counted[1]
        if self.blocks is not None:
            return self.blocks.n
        return int(self.block_ip.shape[0])

    def instructions(self) -> np.ndarray:
        """The address of every executed instruction, in order."""
        if self.counted is not None:
            raise ValueError("decoded with keep_blocks=False: only counts were kept")
        ip, ninsn, image = self.block_ip, self.block_ninsn, self.block_image
        mode = self.block_mode
        if mode is None:
            mode = np.full(ip.shape[0], 64, np.uint8)
        if image is None:
            return instructions_of(self.code.get(0, []), ip, ninsn, mode)
        out = np.empty(self.n_insn, np.uint64)
        owner = np.repeat(image, ninsn.astype(np.int64))
        for u in np.unique(image).tolist():
            sel = image == u
            out[owner == u] = instructions_of(self.code.get(u, []), ip[sel], ninsn[sel], mode[sel])
        return out

    def event_columns(self) -> dict[str, np.ndarray]:
        """The events as columns: ``type`` (:class:`Ev`), ``ip`` (0 when
        suppressed), ``time``, ``offset`` and ``block``, the index of the first
        block after the event, which places it in the instruction flow."""
        rows = self.event_rows
        flags = rows[:, R.E_FLAGS]
        supp = (flags & R.F_SUPP) != 0
        has_tsc = (flags & R.F_HAS_TSC) != 0
        return {
            "type": rows[:, R.E_TYPE].astype(np.uint8),
            "ip": np.where(supp, np.uint64(0), rows[:, R.E_IP]),
            "time": np.where(has_tsc, rows[:, R.E_TSC], np.uint64(0)),
            "offset": self.event_offset.copy(),
            "block": self.event_block.copy(),
        }

    def revised(self) -> np.ndarray:
        """Per executed instruction (as :meth:`instructions`): was it
        decoded from code revision bytes that differ from the image's own
        (the files')?  Those decodes are right only because of the
        revisions; without them they would fail or, worse, succeed with
        the wrong flow."""
        ips = self.instructions()
        image = self.block_image
        which = (
            np.zeros(ips.shape[0], np.int64)
            if image is None
            else np.repeat(image.astype(np.int64), self.block_ninsn)
        )
        images = self.images or [None]
        return revised_instructions(images, which, ips)

    def instruction_times(self) -> np.ndarray:
        """The time stamp of every executed instruction (its block's)."""
        return np.repeat(self.block_time, self.block_ninsn)

    def symbolize(self, symbols: SymbolTable, instructions: bool = False) -> Symbolized:
        """Function, offset and module of every block start (or instruction)."""
        addresses = self.instructions() if instructions else self.block_ip
        index, offset = symbols.lookup(addresses)
        return Symbolized(addresses, index, offset, symbols)


@dataclass
class Symbolized:
    """Addresses resolved against a symbol table, as columns.

    ``index`` is the symbol of each address (-1: none covers it) and
    ``offset`` the distance from its start; names are looked up per distinct
    symbol, so labelling millions of instructions stays cheap.
    """

    address: np.ndarray
    index: np.ndarray
    offset: np.ndarray
    symbols: SymbolTable

    def names(self, with_module: bool = False) -> np.ndarray:
        """A name per address (``""`` where no symbol covers it)."""
        uniq, inverse = np.unique(self.index, return_inverse=True)
        name = self.symbols.qualified_name if with_module else self.symbols.name
        labels = np.array([name(int(i)) if i >= 0 else "" for i in uniq], dtype=object)
        return labels[inverse]

    def labels(self) -> list[str]:
        """``func+0x12`` per address, as perf and ptxed users read them."""
        names = self.names()
        return [
            (f"{n}+{int(o):#x}" if o else n) if n else f"{int(a):#x}"
            for n, o, a in zip(names, self.offset, self.address, strict=True)
        ]


# --------------------------------------------------------------------------
# Collecting the decoder's output.


@dataclass
class DecodeOptions(FlowSettings):
    """What the library decoder is told beyond the PT configuration."""

    def flow_options(self) -> FlowOptions:
        # The library loses nothing after an error: the next PSB is looked
        # for at the failing packet, not after it; it keeps the flow's
        # events only (see keep_flow_events).
        return FlowOptions(
            self.flags, self.addr_filter, self.events, self.fast, self.replay, keep_going=True,
            empty_blocks=False, status_events=False,
        )  # fmt: skip


class _Collector(FlowSink):
    """Keeps (or only counts) the block rows, and the events and gaps.

    The decoder writes each batch's block rows into one small buffer,
    reused; kept rows go into a :class:`~hwtrace.pt.blocks.BlockStore`, a
    few bytes each, most of them stored there by the decoder itself.  It
    writes event rows where they stay, in the collector's event columns."""

    # (The buffer FlowSink.output makes needs no event rows: they are the
    # event columns' own, EVENT_ROOM of them free at every output.)
    EVENT_ROWS = 1
    EVENT_ROOM = FlowSink.EVENT_ROWS

    def __init__(self, keep: bool, expect_rows: int = 1 << 20) -> None:
        self.keep = keep
        self.store = BlockStore(expect_rows) if keep else None
        self.n_insn = 0
        self.n_blocks = 0
        # (Room for an event every 16 bytes of trace, at most a million:
        # syscall-dense traces have one every 140.)
        self.events = _EventColumns(min(max(expect_rows // 64, 256), 1 << 20))
        self.gaps: list[Gap] = []

    def output(self) -> tuple:
        out = self.storing_output(self.store)
        return out[:OUT_EVENTS] + self.events.room(self.EVENT_ROOM) + out[OUT_RUN:]

    def make_room(self) -> None:
        if self.store is not None:
            self.store.make_room()

    def batch(self, b: FlowBatch) -> None:
        nrows = b.ip.shape[0]
        if self.store is not None and nrows:
            t = b.table
            self.store.append(b.ip, b.ninsn, b.mode, b.offset, b.time, b.image, b.run,
                              t.run_numbering, t.n_runs)  # fmt: skip
        self.n_insn += b.n_insn
        base = self.n_blocks
        self.n_blocks += nrows + b.n_virtual
        if not len(b.events):
            return
        self.gaps += error_gaps(b.events, b.event_offset)
        self.events.commit(len(b.events), base)


class _EventColumns:
    """Event rows, their offsets and blocks, written where they stay.

    The decoder writes its rows into :meth:`room`'s views of the columns,
    made for as many events as the trace may well hold: pages never written
    cost nothing, where a buffer copied from would be fresh memory twice
    (and its page faults cost more than the copying in a virtual machine).
    More events than that grow them."""

    def __init__(self, expect: int = 256) -> None:
        self.n = 0
        self.rows = dense_empty((expect, R.EW), np.uint64)
        self.offsets = dense_empty(expect, np.int64)
        self.blocks = dense_empty(expect, np.int64)

    def room(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of the free rows, at least ``k`` of them (what is written
        there counts once :meth:`commit` says so)."""
        n = self.n
        if n + k > self.offsets.shape[0]:
            cap = max(n + k, 2 * self.offsets.shape[0], 256)
            self.rows = grown(self.rows, n, cap)
            self.offsets = grown(self.offsets, n, cap)
            self.blocks = grown(self.blocks, n, cap)
        return self.rows[n:], self.offsets[n:], self.blocks[n:]

    def commit(self, m: int, base: int) -> None:
        """Keep the flow's events among the ``m`` rows written after the
        last commit, their blocks moved by ``base``."""
        n = self.n
        self.n = n + int(K.keep_flow_events(self.rows, self.offsets, self.blocks, n, m, base))

    def columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(rows, offsets, blocks)``, as many as were appended."""
        n = self.n
        return self.rows[:n], self.offsets[:n], self.blocks[:n]


def _code_views(tables: list[CodeTable]) -> dict[int, list[CodeView]]:
    """The decoders' code tables as they are now, per image index."""
    out: dict[int, list[CodeView]] = {}
    for t in tables:
        view = CodeView(t)
        for index in t.indices:
            out.setdefault(index, []).append(view)
    return out


def _joined(parts: list[np.ndarray], empty: np.ndarray) -> np.ndarray:
    """``parts`` as one array (one part as it is: they are the collector's own)."""
    if not parts:
        return empty
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _result(collectors: list[_Collector], decoders: list[FlowDecoder]) -> FlowResult:
    keep = collectors[0].keep
    n_insn = sum(c.n_insn for c in collectors)
    if keep:
        res = FlowResult(blocks=CompactBlocks([c.store for c in collectors]), n_insn=n_insn)
    else:
        res = FlowResult()
        res.counted = (n_insn, sum(c.n_blocks for c in collectors))
    tables = [t for d in decoders for t in d.tables]
    res.code = _code_views(tables)
    res.images = decoders[0].images
    base = 0
    rows, offsets, blocks = [], [], []
    for c in collectors:
        if c.events.n:
            r, o, b = c.events.columns()
            rows.append(r)
            offsets.append(o)
            blocks.append(b + base if base else b)
        base += c.n_blocks
    res.event_rows = _joined(rows, np.zeros((0, R.EW), np.uint64))
    res.event_offset = _joined(offsets, np.zeros(0, np.int64))
    res.event_block = _joined(blocks, np.zeros(0, np.int64))
    res.gaps = [g for c in collectors for g in c.gaps]
    for d in decoders:
        res.ambiguous += d.unplaced
        d.unplaced = []  # reported once (iter_flow reuses its decoder)
    return res


def _decoder(
    image, config, options, context, images=None, keep=True, revisions=None
) -> FlowDecoder:
    hook = None
    if context is not None:

        def hook(row: np.ndarray, offset: int):
            has_tsc = int(row[R.E_FLAGS]) & R.F_HAS_TSC
            return context(int(row[R.E_TSC]) if has_tsc else None, int(row[R.E_IP]))

        until = getattr(context, "stable_until", None)
        if until is not None:
            hook.stop_from = until  # type: ignore[attr-defined]

    opts = (options or DecodeOptions()).flow_options()
    opts.count_only = not keep
    return FlowDecoder(
        image, config, opts, on_event=hook, stop_at="enabled", images=images, revisions=revisions
    )


# The size of the PSB-aligned chunks a trace is decoded in: on threads, a
# chunk is what a thread takes at a time; a decoder on its own decodes
# larger ones, as each chunk costs it a resynchronisation at its PSB and a
# batch (~0.3 ms: 16 MiB chunks decode syscalls-2k and psb1k-cyc ~2%
# faster than 1 MiB ones).  Where the chunks are cut never changes what
# is decoded.
CHUNK_BYTES = 1 << 20
SOLO_CHUNK_BYTES = 1 << 24


def chunk_ranges(buf: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> list[tuple[int, int]]:
    """The ranges a trace is decoded in (by :func:`decode_trace`, and by
    whoever decodes it piece by piece the same way): about ``chunk_bytes``
    each, starting at a PSB, each but the last running on through the next
    range's PSB+ (whose FUP says where the next range starts, so the flow up
    to there is decoded once)."""
    from .packets import is_mapped, psb_cuts, read_released

    if is_mapped(buf):
        # (Windows near each cut, let go once read: a large trace's pages
        # are not kept resident.)
        return chunk_ranges_of(lambda lo, hi: read_released(buf, lo, hi), buf.shape[0], chunk_bytes)
    starts, plus_ends = psb_cuts(buf, chunk_bytes)
    if not starts:
        return []
    return list(zip(starts, [*plus_ends[1:], buf.shape[0]], strict=True))


#: bytes read at a time while looking for a PSB (a PSB+ comes every few KiB)
SYNC_WINDOW = 1 << 14


def chunk_ranges_of(
    read: Callable[[int, int], np.ndarray], size: int, chunk_bytes: int = 1 << 20,
    window: int = SYNC_WINDOW,
) -> list[tuple[int, int]]:  # fmt: skip
    """:func:`chunk_ranges` of a trace of ``size`` bytes that is not one
    buffer (a queue split over several AUXTRACE records, a file on another
    machine): ``read(lo, hi)`` gives its bytes ``lo..hi``.  Only a window
    of ``window`` bytes near each cut is read; the ranges are exactly those
    of the whole buffer (the PSB search keeps the buffer's word alignment
    and never takes a PSB whose pattern may run on past a window)."""
    window = max(int(window), 256)
    first = _sync_forward_of(read, size, 0, window)
    if first < 0:
        return []
    starts = [first]
    target = first + chunk_bytes
    while target < size:
        nxt = _sync_forward_of(read, size, target, window)
        if nxt < 0:
            break
        if nxt > starts[-1]:
            starts.append(nxt)
        target = nxt + chunk_bytes
    out = []
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else size
        if i + 1 < len(starts):
            e = _psb_plus_end_of(read, size, e)
        out.append((s, e))
    return out


def _sync_forward_of(read: Callable[[int, int], np.ndarray], size: int, pos: int,
                     window: int) -> int:  # fmt: skip
    """The first PSB at or after ``pos`` (-1: none), as the sync kernel
    finds it in the whole buffer, reading windows that start 8-byte aligned
    (the kernel scans aligned words) and overlap by 64 bytes."""
    from ._loops import PSB_SIZE, sync_forward

    w0 = max(0, (pos - 64) // 8 * 8)
    while w0 < size:
        w1 = min(size, w0 + window)
        win = np.ascontiguousarray(read(w0, w1))
        r = int(sync_forward(win, max(pos - w0, 0), 0, w1 - w0))
        # The kernel walks a PSB's pattern to its end: one reaching the
        # window's end may go on in the next bytes.
        if r >= 0 and (w1 == size or r + PSB_SIZE + 2 < w1 - w0):
            return w0 + r
        if w1 == size:
            return -1
        w0 = (w1 - 64) // 8 * 8
    return -1


def _psb_plus_end_of(read: Callable[[int, int], np.ndarray], size: int, psb: int) -> int:
    """:func:`~hwtrace.pt.packets.psb_plus_end` (``missing``: ``psb``)
    reading the same growing spans from ``psb`` as it looks in."""
    from ._loops import psb_plus_end as psb_plus_end_loop
    from ._state import PSB_PLUS_SPAN

    span = PSB_PLUS_SPAN
    while True:
        stop = min(size, psb + span)
        win = np.ascontiguousarray(read(psb, stop))
        got = psb_plus_end_loop(win, 0, stop - psb)
        if got >= 0:
            return psb + got
        if got == -2 or stop >= size:
            return psb  # (a packet broken off or bad, or none at all)
        span *= 4


def _as_buffer(data) -> np.ndarray:
    if isinstance(data, (str, os.PathLike)):
        return map_file(data)
    return as_buffer(data)


def _expected_rows(trace_bytes: int) -> int:
    # Real traces give 1-3 blocks per trace byte; memory never touched
    # costs nothing, and the columns double if more come.
    return 4 * trace_bytes + (1 << 16)


# Each decoding thread learns the code it runs into (decoding instructions
# with iced-x86, in Python, under the GIL) and the chunks' results are
# merged at the end: a thread pays for that only with a few MiB of trace
# of its own.
MIN_BYTES_PER_JOB = 6 << 20


def useful_jobs(jobs: int, trace_bytes: int, job_bytes: int = MIN_BYTES_PER_JOB) -> int:
    """How many of ``jobs`` threads a trace of ``trace_bytes`` is worth:
    no more than the CPUs this process may run on, and one per
    ``job_bytes`` of trace."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(jobs, cpus, trace_bytes // max(job_bytes, 1)))


def decode_trace(
    data,
    image,
    config: PtConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    jobs: int = 1,
    chunk_bytes: int | None = None,
    keep_blocks: bool = True,
    context: Context | None = None,
    job_bytes: int = MIN_BYTES_PER_JOB,
    revisions: Revisions = None,
    revision_window: int = 0,
) -> FlowResult:
    """Decode a whole trace (bytes, numpy buffer or file path) against
    ``image``.  ``jobs`` > 1 decodes PSB-aligned chunks on that many threads
    (each with its own decoded code) and merges them in order.  Without
    ``keep_blocks`` only the totals, events and gaps are kept.
    ``chunk_bytes``: the chunks' size (:func:`chunk_ranges`; by default
    :data:`CHUNK_BYTES` on threads, :data:`SOLO_CHUNK_BYTES` on one).

    ``context(tsc, ip)``, when given, is asked at every enabling of tracing
    (a PSB+ with tracing on, TIP.PGE) for the image of the code running then
    (None: keep the current one): how sideband switches processes.  A
    context with a ``stable_until()`` method (the TSC before which its last
    answer holds) is asked again only at an enabling from then on.

    ``revisions``: code that changed while the trace ran (a
    :class:`~hwtrace.image.revisions.CodeRevisions` in the trace's TSC, or
    a function giving one per image); code is read as it was at the time
    of the flow (see :class:`~hwtrace.pt.flowdec.FlowDecoder`), and
    :meth:`FlowResult.revised` tells which instructions came from revised
    bytes.

    ``revision_window`` (TSC ticks): how far apart a revision's time and
    the moment its bytes really began to run may be (another CPU still
    running the old bytes after a ``text_poke``, a time stamp that lags the
    flow).  A decode that fails within that distance of a revision's start
    is tried again with the neighbouring revision (the revision taken to
    begin just after the failure, or just before it); a trial with fewer
    gaps (or as many, and more instructions) is kept, and the revision is
    reported in :attr:`FlowResult.ambiguous`.

    Where the trace cannot tell whether instructions ran a revision's bytes
    or the bytes it replaced (no time stamps there; a revision not timed at
    a trace point that began between two flow packets), the decode reads
    the revision's and reports it as an
    :class:`~hwtrace.pt.flowdec.UnplacedRevision` in
    :attr:`FlowResult.ambiguous`, with the addresses concerned."""
    result = _decode_trace(data, image, config, options, jobs, chunk_bytes, keep_blocks,
                           context, job_bytes, revisions)  # fmt: skip
    if revision_window > 0 and revisions is not None and result.gaps:

        def trial(revised: Revisions) -> FlowResult:
            return _decode_trace(data, image, config, options, jobs, chunk_bytes, keep_blocks,
                                 context, job_bytes, revised)  # fmt: skip

        result = _neighbouring_revisions(result, revisions, image, revision_window, trial)
    return result


# Trials of neighbouring revisions one decoding may make.
MAX_REVISION_TRIALS = 16


def _stores_used(revisions: Revisions, result: FlowResult, image) -> list[CodeRevisions]:
    """The stores a decoding read code through (one, or one per image)."""
    if isinstance(revisions, CodeRevisions):
        return [revisions]
    out: list[CodeRevisions] = []
    for im in result.images or [image]:
        store = revisions(im) if revisions is not None else None
        if store is not None and len(store) and all(store is not s for s in out):
            out.append(store)
    return out


def _swapping(revisions: Revisions, swaps: dict[int, CodeRevisions]) -> Revisions:
    """``revisions`` with the stores in ``swaps`` (by id) replaced."""
    if isinstance(revisions, CodeRevisions):
        return swaps.get(id(revisions), revisions)
    assert revisions is not None

    def store_of(image) -> CodeRevisions | None:
        store = revisions(image)
        return swaps.get(id(store), store) if store is not None else None

    return store_of


def _neighbouring_revisions(
    result: FlowResult,
    revisions: Revisions,
    image,
    window: int,
    trial: Callable[[Revisions], FlowResult],
) -> FlowResult:
    """Retry the gaps near a revision's start with that revision moved to
    the other side of the failure (see :func:`decode_trace`)."""
    ambiguous: list[AmbiguousRevision] = []
    swaps: dict[int, CodeRevisions] = {}  # original store (id) -> the one used now
    tried: set[tuple[int, int, int]] = set()
    trials = 0
    progress = True
    while progress and trials < MAX_REVISION_TRIALS:
        progress = False
        for gap in result.gaps:
            if not gap.time:
                continue
            t = gap.time
            for original in _stores_used(revisions, result, image):
                store = swaps.get(id(original), original)
                near = sorted(
                    (r for r in store.revisions if abs(r.valid_from - t) <= window),
                    key=lambda r: abs(r.valid_from - t),
                )
                for r in near:
                    # Began after the last time before the failure: its bytes
                    # may have run already; began at or before it: the old
                    # bytes may still have run.
                    moved = t if r.valid_from > t else t + 1
                    key = (id(original), r.id, moved)
                    if key in tried or trials >= MAX_REVISION_TRIALS:
                        continue
                    tried.add(key)
                    trials += 1
                    candidate = store.retimed(r, moved)
                    got = trial(_swapping(revisions, {**swaps, id(original): candidate}))
                    if (len(got.gaps), -got.n_insn) < (len(result.gaps), -result.n_insn):
                        ambiguous.append(AmbiguousRevision(
                            r.address, len(r.data), r.valid_from, moved, gap.offset, r.source))  # fmt: skip
                        result, swaps[id(original)], progress = got, candidate, True
                        break
                if progress:
                    break
            if progress:
                break
    result.ambiguous = [*result.ambiguous, *ambiguous]
    return result


def _decode_trace(
    data, image, config, options, jobs, chunk_bytes, keep_blocks, context, job_bytes, revisions
) -> FlowResult:
    config = config or PtConfig()
    buf = _as_buffer(data)
    jobs = useful_jobs(jobs, buf.shape[0], job_bytes)
    if chunk_bytes is None:
        chunk_bytes = CHUNK_BYTES if jobs > 1 else SOLO_CHUNK_BYTES
    ranges = chunk_ranges(buf, chunk_bytes)
    if jobs <= 1 or len(ranges) <= 1:
        dec = _decoder(image, config, options, context, keep=keep_blocks, revisions=revisions)
        dec.expect(buf.shape[0])
        sink = _Collector(keep_blocks, _expected_rows(buf.shape[0]))
        for s, e in ranges:
            dec.decode(buf, sink, s, e)
        return _result([sink], [dec])
    jobs = min(jobs, len(ranges))
    images: list = []
    decoders = [
        _decoder(image, config, options, context, images, keep_blocks, revisions)
        for _ in range(jobs)
    ]
    # Contiguous runs of chunks per thread keep each one's decoded code warm.
    per = -(-len(ranges) // jobs)
    groups = [ranges[i * per : (i + 1) * per] for i in range(jobs)]

    def run(i: int) -> _Collector:
        size = sum(e - s for s, e in groups[i])
        decoders[i].expect(size)
        sink = _Collector(keep_blocks, _expected_rows(size))
        for s, e in groups[i]:
            decoders[i].decode(buf, sink, s, e)
        return sink

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(jobs) as pool:
        sinks = list(pool.map(run, range(jobs)))
    return _result(sinks, decoders)


def iter_flow(
    data,
    image,
    config: PtConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    chunk_bytes: int = 1 << 20,
    context: Context | None = None,
    revisions: Revisions = None,
) -> Iterator[FlowResult]:
    """Decode chunk by chunk, in order, with bounded memory (``revisions``
    as for :func:`decode_trace`)."""
    config = config or PtConfig()
    buf = _as_buffer(data)
    dec = _decoder(image, config, options, context, revisions=revisions)
    dec.expect(buf.shape[0])
    for s, e in chunk_ranges(buf, chunk_bytes):
        sink = _Collector(True)
        dec.decode(buf, sink, s, e)
        yield _result([sink], [dec])


__all__ = [
    "CHUNK_BYTES",
    "SOLO_CHUNK_BYTES",
    "AmbiguousRevision",
    "DecodeOptions",
    "FlowResult",
    "Gap",
    "Symbolized",
    "UnplacedRevision",
    "chunk_ranges",
    "decode_trace",
    "iter_flow",
]
