"""A perf.data's Intel PT decoded by Dask workers, stitched into exactly
:func:`~hwtrace.session.perfflow.stream_perf`'s rows.

Why it is exact: each AUX queue's trace is cut at PSB boundaries
(:func:`~hwtrace.pt.decode.chunk_ranges`, each range reading the next one's
PSB+), so pieces of consecutive ranges decode independently into the very
blocks one pass gives.  What one pass carries from a range to the next is
small, and the client restores it:

* the image numbering (images in order of first use) and each image's
  code-run numbering (runs in order of first visit): a worker reports the
  images and runs its fresh decoder met, in order, and the client merges
  them piece after piece, keeping the first of each;
* the decoder's state where a piece starts: the image it walks and the last
  perf time the sideband was asked about.  A piece starts as the first one
  does; that is right whenever the piece's first enabling of tracing comes
  before any block and carries a time stamp (always, for perf's traces), and
  the worker says when it was not.  Then the client decodes that piece again
  from the state the previous piece ended in.

Attribution (perf time, thread, process, durations, gaps, PTWRITE marks)
is :class:`~hwtrace.session.perfflow.QueueSink`'s, run on the client over the
workers' block columns, so the rules are the single pass's own.  Code
revisions (TEXT_POKE, JIT code) make a queue's pieces depend on one another
further; such a queue is decoded as one piece.

:func:`decode_to_parquet` keeps the blocks on the workers: a first task
decodes a piece and keeps only its summary (block count, images, first
block, the events before it, gaps), the client numbers the piece from the
summaries, and a second task decodes it again and writes its Parquet rows
through the single pass's sink.  No task holds more than a decoder batch
and the writer's row groups, so a worker's memory does not grow with the
piece or the trace; the price is decoding twice (the second decoding is a
fifth of the write task's work).

Workers read the input from the path they are given (a shared file system):
each keeps the parsed perf.data, sideband and images once per input, keyed
by path, size and modification time, so a task ships only offsets.  Tasks
are pure, so Dask may run one again after losing a worker (Dask docs:
"Worker resilience", ``Client.submit(retries=)``).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..image import Image
from ..perf.data import PerfData, PerfDataError
from ..perf.sideband import BinaryLocator, Sideband
from ..pt import flowrows as FK
from ..pt.decode import DecodeOptions, chunk_ranges, chunk_ranges_of
from ..pt.flowdec import FlowBatch, FlowDecoder, FlowSink
from ..pt.flowrows import C_MISS_IP, C_MISS_MODE, CodeTable, build_run, gap_events
from ..pt.packets import read_released
from ..session import PerfSession, SessionError
from ..session.perfflow import (
    PerfBlocks,
    PerfStream,
    QueueContexts,
    QueueInfo,
    QueueSink,
    decoder_hook,
    error_gaps,
    setup_decoding,
)

_MASK64 = (1 << 64) - 1
_REVISION_KINDS = ("text_poke", "bpf_image", "jitdump")
_EMPTY = np.zeros(0, np.int64)


class DistributedError(Exception):
    """A distributed decoding could not run: one line naming the place."""


# --------------------------------------------------------------------------
# Planning


def plan_pieces(
    trace: np.ndarray, task_bytes: int, chunk_bytes: int
) -> list[list[tuple[int, int]]]:
    """A queue's trace as Dask tasks: consecutive PSB-aligned chunk ranges
    (:func:`~hwtrace.pt.decode.chunk_ranges`) grouped into pieces of about
    ``task_bytes`` each."""
    return group_pieces(chunk_ranges(trace, chunk_bytes), task_bytes)


def group_pieces(ranges: list[tuple[int, int]], task_bytes: int) -> list[list[tuple[int, int]]]:
    """Consecutive chunk ranges grouped into pieces of about ``task_bytes``."""
    pieces: list[list[tuple[int, int]]] = []
    size = 0
    for s, e in ranges:
        if not pieces or size >= task_bytes:
            pieces.append([])
            size = 0
        pieces[-1].append((s, e))
        size += e - s
    return pieces


def _has_revisions(sb: Sideband) -> bool:
    return any(r.kind in _REVISION_KINDS and r.new for r in sb.revisions)


# --------------------------------------------------------------------------
# Images by a name every process agrees on


def _space_key(sb: Sideband, cpu: int, tid: int, ns: int) -> tuple[int, int, int]:
    """``(pid, address space number, live mappings)``: what
    :class:`~hwtrace.session.perfflow.QueueContexts` makes one image of at ``ns``,
    named without object identities."""
    t = tid if tid >= 0 else int(sb.threads_on(cpu, np.array([ns]))[0])
    pid = sb.pid_of(t)
    space = sb.space_at(pid, ns)
    if space is None:
        return pid, -1, 0
    pos = next(i for i, s in enumerate(sb.spaces[pid]) if s is space)
    return pid, pos, len(space.mappings_at(ns))


class _WorkerContexts(QueueContexts):
    """The queue's contexts, with images kept across the worker's tasks
    (``shared``, by :func:`_space_key`) and each image's portable
    description (``desc``)."""

    def __init__(self, cpu, tid, sb, conv, locator, kernel, shared: dict) -> None:
        super().__init__(cpu, tid, sb, conv, locator, kernel)
        self.shared = shared
        self.desc: dict[int, tuple] = {}

    def image_for(self, ns: int) -> Image:
        key = _space_key(self.sb, self.cpu, self.tid, ns)
        got = self.shared.get(key)
        if got is None:
            image = super().image_for(ns)
            got = self.shared[key] = (image, self.symbol_parts[id(image)],
                                      self.pid_of_image[id(image)])  # fmt: skip
        image, parts, pid = got
        self.symbol_parts[id(image)] = parts
        self.pid_of_image[id(image)] = pid
        self.desc.setdefault(id(image), ("base", *key, ns))
        return image

    def describe(self, image: Image) -> tuple:
        """``("base", pid, space, live, ns)`` or ``("overlay", base, epoch)``."""
        base = getattr(image, "revision_base", None)
        if base is None:
            return self.desc[id(image)]
        store = self.revisions_for(base)
        assert store is not None
        for epoch in range(1, store.boundaries().shape[0] + 1):
            if store.overlay(base, epoch) is image:
                return ("overlay", self.describe(base), epoch)
        raise AssertionError("an overlay of no known epoch")


def _key(desc: tuple) -> tuple:
    """An image description without the time it was first asked for."""
    if desc[0] == "base":
        return desc[:4]
    return ("overlay", _key(desc[1]), desc[2])


# --------------------------------------------------------------------------
# The worker's side


@dataclass
class _Input:
    data: PerfData
    locator: BinaryLocator
    sb: Sideband
    conv: object
    config: object
    kernel: object
    queues: list
    images: dict = field(default_factory=dict)
    build_ids: dict | None = None


_INPUTS: dict[tuple, _Input] = {}
_INPUTS_LOCK = threading.Lock()


_MALLOC_TUNED = False


def _malloc_for_batches() -> None:
    """Let glibc's malloc keep freed memory for the next batch.

    A Dask nanny starts its workers with ``MALLOC_TRIM_THRESHOLD_`` set
    (Dask docs, "Worker Memory Management": to hand freed memory back to the
    system), and a fixed trim threshold also fixes the mmap threshold at
    128 KiB (glibc's mallopt(3)): then every batch's arrays are fresh
    mappings, and a worker spends as long in page faults as in decoding.
    Allocations under 64 MiB come from the heap again; memory stays bounded
    by the batches in use."""
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        m_trim_threshold, m_mmap_threshold = -1, -3
        libc.mallopt(m_mmap_threshold, 64 << 20)
        libc.mallopt(m_trim_threshold, 128 << 20)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def _decoding_setup(path: str, symfs: str | None) -> tuple:
    """The perf.data at ``path`` opened as a session and set up for
    decoding: ``(data, locator, sideband, problems, setup)`` (``setup``
    None: no Intel PT)."""
    try:
        session = PerfSession.open(path, symfs=symfs, all_calls=True)
    except SessionError as e:
        raise DistributedError(str(e)) from None
    setup = setup_decoding(session.data, session.locator, session.kernel, session.sideband)
    return (session.data, *setup)


def _open_input(path: str, symfs: str | None) -> _Input:
    """The parsed input, once per worker process and input file."""
    _malloc_for_batches()
    st = os.stat(path)
    key = (os.path.abspath(path), symfs, st.st_size, st.st_mtime_ns)
    with _INPUTS_LOCK:
        got = _INPUTS.get(key)
        if got is None:
            data, locator, sb, _, setup = _decoding_setup(path, symfs)
            if setup is None:
                raise PerfDataError(path, 0, "no Intel PT AUXTRACE_INFO: nothing to decode")
            conv, config, kernel, queues = setup
            got = _INPUTS[key] = _Input(data, locator, sb, conv, config, kernel, queues)
        return got


def probe_input(path: str) -> str | None:
    """Whether this process can read ``path`` (None) or why not."""
    try:
        with open(path, "rb") as f:
            f.read(8)
    except OSError as e:
        return e.strerror or str(e)
    return None


def _file_spans(starts: np.ndarray, sizes: np.ndarray, lo: int, hi: int) -> list[tuple[int, int]]:
    """Where bytes ``lo..hi`` of a queue's trace (its AUXTRACE records'
    data in order) are in the file: ``(offset, end)`` per record."""
    ends = np.cumsum(sizes)
    j = int(np.searchsorted(ends, lo, side="right"))
    spans = []
    at = lo
    while at < hi and j < ends.shape[0]:
        rec_lo = int(ends[j] - sizes[j])
        a = at - rec_lo
        b = min(hi, int(ends[j])) - rec_lo
        spans.append((int(starts[j]) + a, int(starts[j]) + b))
        at = rec_lo + b
        j += 1
    return spans


def _read_range(data: PerfData, starts: np.ndarray, sizes: np.ndarray, lo: int, hi: int):
    """Bytes ``lo..hi`` of a queue's trace: a view of the mapped file when
    one record holds them."""
    parts = [data.buf[a:b] for a, b in _file_spans(starts, sizes, lo, hi)]
    if len(parts) == 1:
        return parts[0]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


def _copy_range(data: PerfData, starts: np.ndarray, sizes: np.ndarray, lo: int, hi: int):
    """Bytes ``lo..hi`` of a queue's trace, copied; the file's pages are let
    go (planning reads a little of every MiB of a trace of any size)."""
    spans = _file_spans(starts, sizes, lo, hi)
    parts = [read_released(data.buf, a, b) for a, b in spans]
    return np.concatenate(parts) if parts else np.zeros(0, np.uint8)


class _Pieces(FlowSink):
    """The decoder's batches as segments of one image each: block columns,
    event rows (offsets in queue coordinates) and counts."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.segments: list[dict] = []
        self.rows = 0

    def batch(self, b: FlowBatch) -> None:
        n = b.ip.shape[0]
        seg = self.segments[-1] if self.segments else None
        if seg is None or (n and seg["n"] and seg["image"] != b.image):
            seg = {"image": b.image, "n": 0, "cols": [], "ev": [], "n_insn": 0, "n_virtual": 0}
            self.segments.append(seg)
        if n and not seg["n"]:
            seg["image"] = b.image
        if len(b.events):
            seg["ev"].append((b.events.copy(), b.event_offset + self.base,
                              b.event_block + seg["n"]))  # fmt: skip
        if n:
            run = b.run.copy() if b.run is not None else np.full(n, -1, np.int32)
            seg["cols"].append((b.ip.copy(), b.ninsn.copy(), b.mode.copy(), b.time.copy(), run,
                                b.offset.astype(np.int64) + self.base))  # fmt: skip
            seg["n"] += n
            self.rows += n
        seg["n_insn"] += b.n_insn
        seg["n_virtual"] += b.n_virtual

    def result(self) -> list[tuple]:
        out = []
        for seg in self.segments:
            if seg["cols"]:
                cols = tuple(np.concatenate(c) for c in zip(*seg["cols"], strict=True))
            else:
                z = np.zeros(0, np.uint64)
                cols = (z, np.zeros(0, np.uint32), np.zeros(0, np.uint8), z, np.zeros(0, np.int32),
                        _EMPTY)  # fmt: skip
            if seg["ev"]:
                ev = tuple(np.concatenate(c) for c in zip(*seg["ev"], strict=True))
            else:
                ev = (np.zeros((0, FK.EW), np.uint64), _EMPTY, _EMPTY)
            out.append((seg["image"], *cols, *ev, seg["n_insn"], seg["n_virtual"]))
        return out


@dataclass(frozen=True)
class PieceTask:
    """What a worker is told of a piece: the input (``path``, ``symfs``),
    queue number ``queue``, its chunk ``ranges`` of the queue's trace,
    ``start``, the state to start from (``(image description, last perf
    time)``; None: as a queue's first piece starts) and ``first``: it is
    the queue's first piece (every image its decoder numbers counts)."""

    path: str
    symfs: str | None
    queue: int
    ranges: list[tuple[int, int]]
    start: tuple | None = None
    first: bool = False

    @property
    def base(self) -> int:
        """The piece's first trace byte in its queue."""
        return self.ranges[0][0]


def decode_piece(task: PieceTask) -> dict:
    """Decode a piece (a Dask task): the blocks' columns (``segments``) and
    what the client stitches by."""
    sink = _Pieces(task.base)
    out = _decode(task, sink, lambda ctx, dec: sink)
    out["segments"] = sink.result()
    return out


def summarize_piece(task: PieceTask) -> dict:
    """What the client needs of a piece (a Dask task): all of
    :func:`decode_piece`'s answer but the blocks, and ``n`` (blocks),
    ``n_insn``, ``n_virtual``, ``gaps`` (from its errors), ``head`` (the
    events before its first block; all of them when it has none), ``first``
    (its first block: local image and one-row columns) and ``tail_gap`` (a
    gap after its last block).  Memory is bounded by a decoder batch: the
    blocks are counted, not kept."""
    sink = _Summary(task.base)
    out = _decode(task, sink, lambda ctx, dec: sink)
    out.update(sink.result())
    return out


def _decode(task: PieceTask, counter, make_sink) -> dict:
    """Decode ``task``'s ranges into the sink ``make_sink(contexts,
    decoder)`` makes; ``counter`` (a sink with ``rows``: blocks so far) is
    what the decoder's state is judged by.  Returns what the client stitches
    pieces by."""
    queue, ranges, start, first = task.queue, task.ranges, task.start, task.first
    inp = _open_input(task.path, task.symfs)
    cpu, tid, starts, sizes = inp.queues[queue]
    lo, hi = ranges[0][0], ranges[-1][1]
    buf = _read_range(inp.data, starts, sizes, lo, hi)
    shared = inp.images.setdefault(queue if tid >= 0 else "cpu", {})
    ctx = _WorkerContexts(cpu, tid, inp.sb, inp.conv, inp.locator, inp.kernel, shared)
    if start is None:
        image = ctx.first()
    else:
        image = ctx.image_for(start[0][4])
        ctx.last_ns = start[1]
    base_hook = decoder_hook(ctx)
    seen = {"hooks": 0, "rows_at_first": -1, "tsc": False, "no_tsc_first": False,
            "base": None}  # fmt: skip

    def hook(row: np.ndarray, offset: int) -> object:
        has_tsc = int(row[FK.E_FLAGS]) & FK.F_HAS_TSC
        if not seen["hooks"]:
            seen["rows_at_first"] = counter.rows
        if not has_tsc and not seen["tsc"]:
            seen["no_tsc_first"] = True
        seen["tsc"] |= bool(has_tsc)
        seen["hooks"] += 1
        got = base_hook(row, offset)
        seen["base"] = got
        return got

    dec = FlowDecoder(
        image, inp.config, DecodeOptions().flow_options(), on_event=hook, stop_at="enabled",
        revisions=ctx.revisions_for,
    )  # fmt: skip
    n_setup = 0 if first else len(dec.images)
    sink = make_sink(ctx, dec)
    for s, e in ranges:
        dec.decode(buf, sink, s - lo, e - lo)
    runs = {}
    for t in dec.tables:
        n = t.n_runs
        runs[t.index] = (t.r_ip[:n].copy(), t.r_mode[:n].copy())
    used_base = counter.rows > 0 and (seen["rows_at_first"] != 0)
    return {
        "images": [ctx.describe(im) for im in dec.images],
        "n_setup": n_setup,
        "runs": runs,
        "start": start,
        "used_base": used_base and not first,
        "used_last_ns": seen["no_tsc_first"] and inp.conv is not None and not first,
        "end_base": ctx.describe(seen["base"]) if seen["base"] is not None else None,
        "end_last_ns": ctx.last_ns if seen["tsc"] else None,
        "problems": dict(inp.locator.problems),
        "worker_pid": os.getpid(),
    }


class _Summary(FlowSink):
    """The decoder's batches summarised for :func:`summarize_piece`."""

    def __init__(self, base: int) -> None:
        self.base = base
        self.rows = self.n_insn = self.n_virtual = 0
        self.gaps: list = []
        self.head_ev: list[np.ndarray] = []
        self.head_off: list[np.ndarray] = []
        self.first: tuple | None = None
        self.tail_gap = False

    def batch(self, b: FlowBatch) -> None:
        m = b.ip.shape[0]
        self.n_insn += b.n_insn
        self.n_virtual += b.n_virtual
        ev = b.events
        if ev.shape[0]:
            off = b.event_offset + self.base
            self.gaps += error_gaps(ev, off)
            gm = gap_events(ev)
            if self.first is None:
                before = b.event_block == 0 if m else np.ones(ev.shape[0], np.bool_)
                self.head_ev.append(ev[before].copy())
                self.head_off.append(off[before])
            self.tail_gap = (
                bool(gm[b.event_block >= m].any()) if m else self.tail_gap or bool(gm.any())
            )
        elif m:
            self.tail_gap = False
        if m and self.first is None:
            run = b.run[:1].copy() if b.run is not None else np.full(1, -1, np.int32)
            self.first = (b.image, b.ip[:1].copy(), b.ninsn[:1].copy(), b.mode[:1].copy(),
                          b.time[:1].copy(), run, b.offset[:1].astype(np.int64) + self.base)  # fmt: skip
        self.rows += m

    def result(self) -> dict:
        head = (np.concatenate(self.head_ev) if self.head_ev else np.zeros((0, FK.EW), np.uint64),
                np.concatenate(self.head_off) if self.head_off else _EMPTY)  # fmt: skip
        return {"n": self.rows, "n_insn": self.n_insn, "n_virtual": self.n_virtual,
                "gaps": self.gaps, "first": self.first, "tail_gap": self.tail_gap,
                "head": head}  # fmt: skip


# --------------------------------------------------------------------------
# The client's side


class _RebuiltCode:
    """Code tables numbered as the single pass's decoder numbered them (its
    runs built again in the same order), for :meth:`QueueInfo.code_table`;
    made when first asked for."""

    def __init__(self, images: list[Image], runs: list[list[tuple[int, int]]]) -> None:
        self._images, self._runs = images, runs
        self._tables: list[CodeTable] | None = None

    @property
    def tables(self) -> list[CodeTable]:
        if self._tables is None:
            self._tables = []
            for index, (image, runs) in enumerate(zip(self._images, self._runs, strict=True)):
                t = CodeTable(image)
                t.index = index
                for want, (ip, mode) in enumerate(runs):
                    while True:
                        got = build_run(t.tuple, np.uint64(ip), np.uint8(mode))
                        if got == -1:
                            t.fill(int(t.counts[C_MISS_IP]) & _MASK64, int(t.counts[C_MISS_MODE]))
                        elif got == -2:
                            t.grow_runs()
                        else:
                            break
                    assert got == want, (got, want)
                self._tables.append(t)
        return self._tables


class _Stitch:
    """One queue's pieces joined in order into the single pass's numbering
    and handed to its :class:`QueueSink`."""

    def __init__(
        self, q: QueueInfo, ctx: QueueContexts, sink: QueueSink, runs: list[list[tuple[int, int]]]
    ) -> None:
        self.q, self.ctx, self.sink = q, ctx, sink
        self.index: dict[tuple, int] = {}  # image key -> number
        self.run_index: list[dict[tuple[int, int], int]] = []
        self.runs = runs  # per image, its runs (ip, mode) in the pass's order
        self.end_base: tuple | None = None
        self.end_last_ns = 0

    def fits(self, r: dict) -> bool:
        """Whether piece ``r`` started in the state the previous one ended in
        (as far as it mattered)."""
        setup = r["images"][: r["n_setup"]]
        if any(_key(d) not in self.index for d in setup):
            return False
        if r["used_base"] and (
            self.end_base is None
            or _key(self.end_base) != _key(r["start"][0] if r["start"] else setup[0])
        ):
            return False
        start_ns = r["start"][1] if r["start"] else 0
        return not (r["used_last_ns"] and start_ns != self.end_last_ns)

    def start_state(self) -> tuple | None:
        return (self.end_base, self.end_last_ns) if self.end_base is not None else None

    def _image(self, desc: tuple) -> Image:
        return _image_of(self.ctx, desc)

    def add(self, r: dict) -> None:
        images, run_maps = self.number(r)
        for seg in r["segments"]:
            li, ip, ninsn, mode, time, run, offset, ev, evoff, evblock, n_insn, n_virtual = seg
            m = run_maps.get(li)
            if m is not None and run.shape[0]:
                run = np.where(run >= 0, m[np.maximum(run, 0)], -1).astype(np.int32)
            batch = FlowBatch(ip, ninsn, _EMPTY, mode, offset, time, ev, evoff, evblock,
                              None, int(images[li]), run, n_insn, 0, n_virtual)  # fmt: skip
            self.sink.batch(batch)

    def number(self, r: dict) -> tuple[np.ndarray, dict[int, np.ndarray]]:
        """Piece ``r``'s images and runs numbered as the single pass numbers
        them (new ones appended in order); the state it ends in taken."""
        images = np.zeros(len(r["images"]), np.int64)
        for i, desc in enumerate(r["images"]):
            k = _key(desc)
            g = self.index.get(k)
            if g is None:
                g = self.index[k] = len(self.q.images)
                self.q.images.append(self._image(desc))
                self.run_index.append({})
                self.runs.append([])
            images[i] = g
        run_maps: dict[int, np.ndarray] = {}
        for li, (ips, modes) in r["runs"].items():
            g = int(images[li])
            known, order = self.run_index[g], self.runs[g]
            m = np.empty(ips.shape[0], np.int32)
            for j, k in enumerate(zip(ips.tolist(), modes.tolist(), strict=True)):
                v = known.get(k)
                if v is None:
                    v = known[k] = len(order)
                    order.append(k)
                m[j] = v
            run_maps[li] = m
        if r["end_base"] is not None:
            self.end_base = r["end_base"]
        elif self.end_base is None and r["start"] is None and r["images"]:
            self.end_base = r["images"][0]
        if r["end_last_ns"] is not None:
            self.end_last_ns = r["end_last_ns"]
        return images, run_maps


#: Trace per Dask task of :func:`decode_distributed`.  A task's result holds its blocks' columns (25
#: bytes a block; dense traces give up to ~4 blocks a trace byte, 55 MB a
#: MiB for compiled loops), and the workers keep finished results until the
#: client takes them: 1 MiB keeps a worker's memory near half a GiB where
#: 32 MiB took it past 1.5 GiB; Dask's cost per task (a few ms) stays small
#: against a MiB's decoding (0.1-0.2 s).
DEFAULT_TASK_BYTES = 1 << 20
#: Trace per piece of :func:`decode_to_parquet`, whose tasks hold a batch at
#: a time whatever the piece's size: bigger pieces make Dask's cost per
#: task (about 20 ms here) small against a piece's work (1.5-2 s).
PARQUET_TASK_BYTES = 4 << 20


class _Tasks:
    """Dask futures, or (no client) the same functions run here when their
    result is asked for: tasks submitted ahead then cost no memory."""

    def __init__(self, client, retries: int) -> None:
        self.client, self.retries = client, retries

    def submit(self, fn, *args):
        if self.client is None:
            return fn, args
        return self.client.submit(fn, *args, pure=True, retries=self.retries)

    def result(self, handle):
        if self.client is None:
            fn, args = handle
            return fn(*args)
        return handle.result()

    def cancel(self, handles) -> None:
        if self.client is not None and handles:
            self.client.cancel(list(handles))


def _plan(path: str, symfs: str | None, task_bytes: int, chunk_bytes: int | None):
    """Read the input's headers and sideband and cut every queue's trace into
    pieces: ``(locator, sideband, problems, setup, plans, sizes)`` (``setup``
    None: no Intel PT).  A sideband with code revisions keeps each queue
    whole (one piece), which is exact but not parallel."""
    chunk_bytes = chunk_bytes or min(task_bytes, 1 << 20)
    data, locator, sb, problems, setup = _decoding_setup(path, symfs)
    plans: list[list[list[tuple[int, int]]]] = []
    sizes: list[int] = []
    if setup is None:
        return locator, sb, problems, None, plans, sizes
    whole = _has_revisions(sb)
    for _, _, starts, lengths in setup[3]:
        # Read near the cuts only: a queue in many records is not copied.
        size = int(np.asarray(lengths).sum())
        sizes.append(size)

        def read(lo: int, hi: int, starts=starts, lengths=lengths) -> np.ndarray:
            return _copy_range(data, starts, lengths, lo, hi)

        pieces = group_pieces(chunk_ranges_of(read, size, chunk_bytes), task_bytes)
        if whole and pieces:
            pieces = [[r for p in pieces for r in p]]
        plans.append(pieces)
    return locator, sb, problems, setup, plans, sizes


@dataclass(frozen=True)
class ClusterOptions:
    """Where and how :func:`decode_distributed` and :func:`decode_to_parquet`
    spread their work.

    ``workers`` > 0: a local Dask cluster of that many worker processes
    (one thread each), closed on return, error or ^C; ``cluster``: the
    address of a running Dask scheduler (``tcp://host:port``) whose workers
    can read the input (and write the output); neither: the same tasks in
    this process.  ``symfs``: as perf's.  ``task_bytes``: trace per task
    (None: the function's default); ``chunk_bytes``: the PSB-aligned cuts a
    task is made of; ``retries``: times Dask runs a failed task again;
    ``batch_rows``: blocks per batch handed on; ``connect_timeout``: seconds
    to wait for ``cluster``'s scheduler."""

    workers: int = 0
    cluster: str | None = None
    symfs: str | None = None
    task_bytes: int | None = None
    retries: int = 3
    chunk_bytes: int | None = None
    batch_rows: int = 1 << 17
    connect_timeout: float = 10.0


def decode_distributed(
    path: str, on_blocks: Callable[[PerfBlocks], None], **options: Any
) -> PerfStream:
    """Decode the Intel PT of the perf.data at ``path`` as
    :func:`~hwtrace.session.perfflow.stream_perf` does, the work cut into Dask
    tasks of about ``task_bytes`` (default :data:`DEFAULT_TASK_BYTES`) of
    trace each; ``options``: :class:`ClusterOptions`' fields.

    ``on_blocks`` gets each queue's blocks in flow order, queue by queue,
    with exactly stream_perf's rows (batches may be cut elsewhere).  Raises
    :class:`DistributedError` (one line) when the cluster or the input
    cannot be used."""
    o = ClusterOptions(**options)
    plan = _plan(path, o.symfs, o.task_bytes or DEFAULT_TASK_BYTES, o.chunk_bytes)
    locator, sb, problems, setup, plans, sizes = plan
    if setup is None:
        return PerfStream([], sb, None, problems)
    conv, _, kernel, queues = setup
    with _client(o, path) as client:
        tasks = _Tasks(client, o.retries)
        infos = _run(tasks, path, o.symfs, plans, sizes, queues, sb, conv, locator, kernel,
                     on_blocks, o.batch_rows, max(o.workers, _n_workers(client)))  # fmt: skip
    problems += list(locator.problems.values()) + sb.revision_conflicts()
    return PerfStream(infos, sb, conv, problems)


def _queues(queues, sizes, sb, conv, locator, kernel, infos: list[QueueInfo]):
    """Each queue's number, info (appended to ``infos``) and contexts on the
    client, its code tables rebuilt from the pieces' runs (``stitch_runs``)
    as they are stitched; the queues share their code."""
    code: dict = {}
    for qi, (cpu, tid, _, _) in enumerate(queues):
        ctx = QueueContexts(cpu, tid, sb, conv, locator, kernel)
        images: list[Image] = []
        stitch_runs: list[list[tuple[int, int]]] = []
        q = QueueInfo(qi, cpu, tid, images, trace_bytes=sizes[qi], _ctx=ctx, _code=code,
                      _decoder=_RebuiltCode(images, stitch_runs))  # fmt: skip
        infos.append(q)
        yield qi, q, ctx, stitch_runs


class _InOrder:
    """The pieces of every queue, in order, run by the task ``fn``
    (:func:`decode_piece` or :func:`summarize_piece`) and submitted
    ``ahead`` of the one being taken."""

    def __init__(self, tasks: _Tasks, fn, path: str, symfs: str | None, plans, ahead: int,
                 locator) -> None:  # fmt: skip
        self.tasks, self.fn, self.path, self.symfs = tasks, fn, path, symfs
        self.plans, self.ahead, self.locator = plans, ahead, locator
        self.order = [(qi, k) for qi, pieces in enumerate(plans) for k in range(len(pieces))]
        self.pending: deque = deque()
        self.next = 0

    def _refill(self) -> None:
        while self.next < len(self.order) and len(self.pending) < self.ahead:
            qi, k = self.order[self.next]
            task = PieceTask(self.path, self.symfs, qi, self.plans[qi][k], None, k == 0)
            self.pending.append((qi, k, self.tasks.submit(self.fn, task)))
            self.next += 1

    def take(self, qi: int, k: int, stitch: _Stitch) -> tuple[dict, tuple | None]:
        """Piece ``k`` of queue ``qi``'s answer and the state its decoding
        started in (None: as a queue's first piece starts)."""
        self._refill()
        pqi, pk, handle = self.pending.popleft()
        assert (pqi, pk) == (qi, k)
        r = self.tasks.result(handle)
        self._refill()
        start = None
        if k and not stitch.fits(r):
            # The piece began otherwise than the pass would have: again,
            # from the state the previous piece ended in.
            start = stitch.start_state()
            task = PieceTask(self.path, self.symfs, qi, self.plans[qi][k], start)
            r = self.tasks.result(self.tasks.submit(self.fn, task))
            assert stitch.fits(r)
        for p, msg in r["problems"].items():
            self.locator.problems.setdefault(p, msg)
        return r, start

    def handles(self) -> list:
        """The tasks submitted and not taken."""
        return [h for _, _, h in self.pending]


def _run(tasks, path, symfs, plans, sizes, queues, sb, conv, locator, kernel, on_blocks,
         batch_rows, n_workers) -> list[QueueInfo]:  # fmt: skip
    # Tasks submitted ahead of the one being stitched: enough to keep every
    # worker busy while the client stitches, few enough that the results
    # waiting on the workers stay bounded (each worker holds about two).
    pieces = _InOrder(tasks, decode_piece, path, symfs, plans, max(2, 2 * n_workers), locator)
    infos: list[QueueInfo] = []
    try:
        for qi, q, ctx, stitch_runs in _queues(queues, sizes, sb, conv, locator, kernel, infos):
            sink = QueueSink(q, ctx, on_blocks, batch_rows)
            stitch = _Stitch(q, ctx, sink, stitch_runs)
            for k in range(len(plans[qi])):
                r, _ = pieces.take(qi, k, stitch)
                stitch.add(r)
            sink.finish()
    finally:
        tasks.cancel(pieces.handles())
    return infos


def _n_workers(client) -> int:
    if client is None:
        return 0
    return len(client.scheduler_info().get("workers", {}))


#: Dask settings of the local cluster ``--workers`` starts (Dask docs,
#: "Configuration"); a real cluster's workers can be given the same.
LOCAL_CLUSTER_CONFIG = {
    "distributed.worker.profile.enabled": False,
    "distributed.admin.system-monitor.interval": "2s",
}


class _client:
    """A Dask client for ``workers`` local processes or a running
    ``cluster`` (None: none) whose workers can read ``readable`` and write
    into ``writable``; the local cluster is closed on exit."""

    def __init__(self, options: ClusterOptions, readable: str, writable: str | None = None) -> None:
        self.workers, self.cluster = options.workers, options.cluster
        self.timeout = options.connect_timeout
        self.readable, self.writable = readable, writable
        self.local = None
        self.client = None

    def __enter__(self):
        client = self._connect()
        if client is not None:
            try:
                _check_readable(client, self.readable)
                if self.writable is not None:
                    _check_writable(client, self.writable)
            except BaseException:
                # (a with statement whose __enter__ raises never calls
                # __exit__: the client and a local cluster's workers would
                # outlive the error)
                self.__exit__(None, None, None)
                raise
        return client

    def _connect(self):
        if not self.workers and not self.cluster:
            return None
        import logging

        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise DistributedError(
                "decoding with workers or on a cluster needs Dask's distributed package "
                "(pip install 'hwtrace[cluster]')"
            ) from None

        if self.cluster:
            try:
                self.client = Client(self.cluster, timeout=self.timeout)
            except (OSError, TimeoutError) as e:
                raise DistributedError(
                    f"{self.cluster}: no Dask scheduler answered within {self.timeout:g} s "
                    f"({type(e).__name__})"
                ) from None
            return self.client
        import dask

        # hwtrace's tasks gain nothing from Dask's statistical profiler (a
        # thread in every worker sampling the task's stack every 10 ms) on
        # cores the decoding needs.
        with dask.config.set(LOCAL_CLUSTER_CONFIG):
            # No dashboard; the scheduler's HTTP server (health, metrics)
            # starts anyway, on any free port: on Dask's 8787 it warned
            # whenever another cluster held that port.
            self.local = LocalCluster(
                n_workers=self.workers, threads_per_worker=1, processes=True,
                dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"},
                silence_logs=logging.ERROR,
            )  # fmt: skip
        self.client = Client(self.local)
        return self.client

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
        if self.local is not None:
            self.local.close()


def _check_readable(client, path: str) -> None:
    """Every worker can read ``path``, or one line saying which cannot."""
    got = client.run(probe_input, path)
    for worker, err in sorted(got.items()):
        if err is not None:
            raise DistributedError(f"worker {worker}: cannot read {path}: {err}")


# --------------------------------------------------------------------------
# Parquet written by the workers
#
# A piece's decoding stays on the worker that made it (Dask keeps a task's
# result where it ran and runs the tasks that need it there: Dask docs,
# "Data Locality").  The client fetches a small summary of it (block count,
# images and runs met, the events before its first block, the gaps), which
# is all it needs to number the piece as the single pass would: its first
# row (the blocks of the pieces before), its images in order of first use,
# whether the flow has a gap before its first block.  Then a write task on
# that worker attributes the piece (QueueSink, the single pass's rules) and
# writes its Parquet part files.  The one value that needs the next piece is
# the duration of the piece's last block: the write task gets the next
# piece's first block and the events before it (and those of empty pieces
# between), so its sink ends exactly where the single pass's would.


def _image_of(ctx: QueueContexts, desc: tuple) -> Image:
    """The image a :func:`_WorkerContexts.describe` description names."""
    if desc[0] == "base":
        return ctx.image_for(desc[4])
    base = _image_of(ctx, desc[1])
    store = ctx.revisions_for(base)
    assert store is not None
    return store.overlay(base, desc[2])


def write_piece(task: PieceTask, fix: dict, directory: str, settings: dict) -> dict:
    """Decode a piece again (as :func:`summarize_piece` did), attribute the blocks and
    write their rows into the flow directory ``directory`` (a Dask task),
    batch by batch: a worker holds a batch and the writer's row groups,
    never a whole piece.

    ``fix``: what the client worked out from the summaries: ``part`` (the
    files' name), ``images`` (the piece's images' numbers in the queue),
    ``n_images``, ``row`` (its first block's number), ``gap`` (a gap before
    it, from the pieces before), ``drop_lead_ptw`` (the PTWRITEs before its
    first block belong to an earlier piece's last block: written there),
    ``lead`` (events of earlier pieces, none with blocks, to take first),
    ``follow`` (events after it up to the next block, and that block; None:
    the queue ends).  ``settings``: the writer's metadata, ``bucket_ns``,
    ``instructions`` and ``batch_rows``.  Returns the rows written, the
    instructions decoded, the names met and the threads seen."""
    from ..export.parquet import FlowParquetWriter, Names, build_ids_of

    queue = task.queue
    inp = _open_input(task.path, task.symfs)
    cpu, tid, _, _ = inp.queues[queue]
    if inp.build_ids is None:
        inp.build_ids = build_ids_of(inp.sb)
    names = Names(build_ids=inp.build_ids)
    writer = FlowParquetWriter(directory, settings["metadata"], names=names,
                               bucket_ns=settings["bucket_ns"],
                               instructions=settings["instructions"], part=fix["part"],
                               compression=settings["compression"])  # fmt: skip
    tids: set[int] = set()

    def emit(b: PerfBlocks) -> None:
        writer.write_blocks(b)
        if len(b):
            first_tid = int(b.tid[0])
            if (b.tid == first_tid).all():
                tids.add(first_tid)
            else:
                tids.update(np.unique(b.tid).tolist())

    forward = _Forward(fix, task.base)

    def make_sink(ctx: QueueContexts, dec: FlowDecoder) -> FlowSink:
        q = QueueInfo(queue, cpu, tid, [None] * fix["n_images"], _ctx=ctx, _code={})
        sink = QueueSink(q, ctx, emit, settings["batch_rows"])
        sink.start_at(fix["row"], fix["gap"])
        for ev, off in fix["lead"]:
            sink.batch(_events_batch(ev, off))
        forward.start(sink, q, dec)
        return forward

    try:
        _decode(task, forward, make_sink)
        sink = forward.sink
        follow = fix["follow"]
        if follow is None:
            sink.finish()
        else:
            (ev, off), (image, ip, ninsn, mode, time, run, offset) = follow
            sink.batch(FlowBatch(ip, ninsn, _EMPTY, mode, offset, time, ev, off,
                                 np.zeros(ev.shape[0], np.int64), None, image, run, 0, 0,
                                 0))  # fmt: skip
            sink.flush()  # all but that next block: the next piece's first row
        got = writer.close()
    except BaseException:
        writer.abort()
        raise
    # (The next piece's first block, held in the sink, is not written here.)
    return {"rows": got["rows"], "n_insn": writer.n_insn, "names": names.portable(),
            "tids": sorted(tids), "worker_pid": os.getpid()}  # fmt: skip


class _Forward(FlowSink):
    """The decoder's batches to a :class:`QueueSink`, numbered as the
    queue numbers them: images by the client's ``fix``, event offsets in
    the queue's trace; the PTWRITEs before the first block left out when an
    earlier piece wrote them."""

    def __init__(self, fix: dict, base: int) -> None:
        self.fix, self.base = fix, base
        self.rows = 0
        self.seen_block = False

    def start(self, sink: QueueSink, q: QueueInfo, dec: FlowDecoder) -> None:
        self.sink, self.q, self.dec = sink, q, dec

    def batch(self, b: FlowBatch) -> None:
        m = b.ip.shape[0]
        g = int(self.fix["images"][b.image])
        if self.q.images[g] is None:
            self.q.images[g] = self.dec.images[b.image]
        ev, off, at = b.events, b.event_offset + self.base, b.event_block
        if self.fix["drop_lead_ptw"] and not self.seen_block and ev.shape[0]:
            lead = (at == 0) if m else np.ones(ev.shape[0], np.bool_)
            keep = ~(lead & (ev[:, FK.E_TYPE] == FK.EV_PTWRITE))
            ev, off, at = ev[keep], off[keep], at[keep]
        self.seen_block |= bool(m)
        self.rows += m
        self.sink.batch(FlowBatch(b.ip, b.ninsn, _EMPTY, b.mode, b.offset + self.base, b.time,
                                  ev, off, at,
                                  None, g, b.run, b.n_insn, 0, b.n_virtual))  # fmt: skip


def _events_batch(ev: np.ndarray, off: np.ndarray) -> FlowBatch:
    z = np.zeros(0, np.uint64)
    return FlowBatch(z, np.zeros(0, np.uint32), _EMPTY, np.zeros(0, np.uint8), _EMPTY, z, ev, off,
                     np.zeros(ev.shape[0], np.int64), None, 0, np.zeros(0, np.int32))  # fmt: skip


@dataclass
class _Piece:
    """A summarised piece as the client knows it."""

    k: int
    start: tuple | None  # the state its decoding starts in (None: as the first)
    s: dict  # its summary
    images: np.ndarray  # its images' numbers in the queue
    row: int  # its first block's number
    bytes: int


def decode_to_parquet(
    path: str,
    writer,
    *,
    on_piece: Callable[[int, int], None] | None = None,
    **options: Any,
) -> tuple[PerfStream, set[int]]:
    """Decode the Intel PT of the perf.data at ``path`` into the flow
    directory of ``writer`` (a :class:`~hwtrace.export.parquet.FlowParquetWriter`,
    left open for the caller to close): the workers decode and write the
    blocks, instructions and events of their pieces (part files named by
    queue and piece), the client plans, numbers the pieces and counts what
    they wrote into ``writer``.  The rows are the single process's
    (:func:`~hwtrace.session.perfflow.stream_perf` through ``writer``).

    ``options``: :class:`ClusterOptions`' fields (``task_bytes`` default:
    :data:`PARQUET_TASK_BYTES`); the output directory must be shared with
    the workers like the input.  ``on_piece(trace bytes, blocks)``: called
    as each piece is written.  Returns the stream (queues, gaps, sideband,
    problems) and the threads the blocks ran in."""
    o = ClusterOptions(**options)
    plan = _plan(path, o.symfs, o.task_bytes or PARQUET_TASK_BYTES, o.chunk_bytes)
    locator, sb, problems, setup, plans, sizes = plan
    if setup is None:
        return PerfStream([], sb, None, problems), set()
    conv, _, kernel, queues = setup
    settings = {"metadata": {k: v for k, v in writer.metadata.items()
                             if k not in ("format", "bucket_ns", "instructions")},
                "bucket_ns": writer.bucket_ns, "instructions": writer.instructions is not None,
                "batch_rows": o.batch_rows, "compression": writer.compression}  # fmt: skip
    directory = str(Path(writer.root).resolve())
    tids: set[int] = set()
    with _client(o, path, directory) as client:
        tasks = _Tasks(client, o.retries)
        infos = _run_parquet(tasks, path, o.symfs, plans, sizes, queues, sb, conv, locator,
                             kernel, writer, settings, directory, tids, on_piece,
                             max(o.workers, _n_workers(client), 1))  # fmt: skip
    _remove_unfinished(Path(directory))
    problems += list(locator.problems.values()) + sb.revision_conflicts()
    return PerfStream(infos, sb, conv, problems), tids


def _remove_unfinished(root: Path) -> None:
    """The hidden files of writes that did not finish (a worker lost
    mid-write; Dask wrote that piece again elsewhere)."""
    for name in ("blocks", "instructions", "events"):
        if (root / name).is_dir():
            for p in (root / name).rglob(".q*-p*-*.parquet.tmp"):
                p.unlink(missing_ok=True)


def _run_parquet(tasks, path, symfs, plans, sizes, queues, sb, conv, locator, kernel, writer,
                 settings, directory, tids, on_piece, n_workers) -> list[QueueInfo]:  # fmt: skip
    # Summaries submitted ahead of the one being numbered, and writes not
    # yet collected: enough to keep every worker busy (a task's answer is
    # small, and a worker holds one piece's batch at a time).
    ahead = 2 * n_workers + 1
    pieces = _InOrder(tasks, summarize_piece, path, symfs, plans, ahead, locator)
    writes: deque = deque()

    def collect(keep: int) -> None:
        while len(writes) > keep:
            nbytes, h = writes.popleft()
            got = tasks.result(h)
            writer.add_part(got["rows"], got["n_insn"], got["names"])
            tids.update(got["tids"])
            if on_piece is not None:
                on_piece(nbytes, got["rows"]["blocks"])

    def submit_write(qi: int, got: list[_Piece], j: int, n_images: int, final: bool) -> bool:
        """The write of piece ``got[j]`` (False: it waits for a later piece)."""
        p = got[j]
        if not p.s["n"]:
            return True  # no block: its events go with a neighbour's write
        after = next((i for i in range(j + 1, len(got)) if got[i].s["n"]), None)
        if after is None and not final:
            return False
        follow = None
        if after is not None:
            heads = [got[i].s["head"] for i in range(j + 1, after + 1)]
            li, *cols = got[after].s["first"]
            follow = ((np.concatenate([h[0] for h in heads]),
                       np.concatenate([h[1] for h in heads])),
                      (int(got[after].images[li]), *cols))  # fmt: skip
        before = next((i for i in range(j - 1, -1, -1) if got[i].s["n"]), None)
        if before is None:
            lead = [got[i].s["head"] for i in range(j)]
            gap = False
        else:
            lead = []
            gap = any(got[i].s["tail_gap"] for i in range(before, j))
        fix = {"part": f"q{qi:05d}-p{p.k:06d}", "images": p.images, "n_images": n_images,
               "row": p.row, "gap": gap, "drop_lead_ptw": before is not None, "lead": lead,
               "follow": follow}  # fmt: skip
        task = PieceTask(path, symfs, qi, plans[qi][p.k], p.start, p.k == 0)
        h = tasks.submit(write_piece, task, fix, directory, settings)
        writes.append((p.bytes, h))
        collect(ahead)
        return True

    infos: list[QueueInfo] = []
    try:
        for qi, q, ctx, stitch_runs in _queues(queues, sizes, sb, conv, locator, kernel, infos):
            stitch = _Stitch(q, ctx, None, stitch_runs)  # type: ignore[arg-type]
            got: list[_Piece] = []
            done = 0  # pieces whose write is submitted (or needs none)
            row = 0
            for k in range(len(plans[qi])):
                s, start = pieces.take(qi, k, stitch)
                g, _ = stitch.number(s)
                q.n_insn += s["n_insn"]
                q.n_blocks += s["n"] + s["n_virtual"]
                q.gaps.extend(s["gaps"])
                ranges = plans[qi][k]
                got.append(_Piece(k, start, s, g, row, ranges[-1][1] - ranges[0][0]))
                row += s["n"]
                while done < len(got) and submit_write(qi, got, done, len(q.images), False):
                    done += 1
            while done < len(got):
                assert submit_write(qi, got, done, len(q.images), True)
                done += 1
        collect(0)
    finally:
        tasks.cancel(pieces.handles() + [h for _, h in writes])
    return infos


def _probe_dir(directory: str) -> str | None:
    """Whether this process can write into ``directory`` (None) or why not."""
    probe = Path(directory) / f".probe-{os.getpid()}-{threading.get_ident()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return e.strerror or str(e)
    return None


def _check_writable(client, directory: str) -> None:
    """Every worker can write into the output ``directory``, or one line
    saying which cannot."""
    got = client.run(_probe_dir, directory)
    for worker, err in sorted(got.items()):
        if err is not None:
            raise DistributedError(f"worker {worker}: cannot write into {directory}: {err}")
