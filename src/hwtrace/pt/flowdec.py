"""The instruction-flow decoder: an Intel PT trace and its image in, the
executed blocks and the events out, in compiled code.

:class:`FlowDecoder` is the one decoder behind ``hwtrace ptxed``, the
library's :func:`hwtrace.pt.decode.decode_trace` and the perf.data commands.
It follows Intel's reference decoder (libipt's block decoder over its event
decoder) to the letter; the test suite holds the same semantics in plain
Python, as its reference.

Decoding goes segment by segment: a segment starts at a PSB and ends at the
end of the trace or at an error, after which decoding looks for the next PSB
(:attr:`FlowOptions.keep_going` chooses where: after the failing packet, as
Intel's ptxed does, or at it, losing nothing).  With
:attr:`FlowOptions.resync_on_error` an error does not end the segment: the
decoder goes on at the next packet that tells where execution is, as
ptxed's ``--resync-on-error``.

Output comes in :class:`FlowBatch` es, handed to a sink as the decoder goes,
so memory stays bounded whatever the trace's size.  A batch's arrays are
reused for the next one: a sink copies what it keeps.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..image.revisions import EXACT_SOURCES, CodeRevisions, Revision
from . import _flowloop as K
from ._loops import sync_forward as _sync_forward_loop
from ._state import ROWS_FOLD_CYC
from ._window import (
    TS_OTHER,
    TS_ROWS,
    TS_START,
    WA_BYTES,
    WA_CONTINUE,
    WA_END,
    WA_EXT,
    WA_GROW,
    WA_LIMIT,
    WA_OPENED,
    WA_SAVED,
    WA_SIZE,
    WA_START,
    WA_TIME,
    WIN_READY,
    WIN_ROOM,
)
from ._window import open_window as _open_window
from ._window import window_extent as _window_extent
from .blocks import BlockStore
from .codetable import C_MISS_IP, C_MISS_MODE, CodeTable
from .config import PtConfig
from .errors import PtError
from .flowrows import O_NEW, O_SPEC, OUT_STORE
from .kinds import DecodeError, Kind
from .options import AddrFilter, BlockFlags, EventOptions
from .packets import (
    FAULT_AROUND,
    PacketBuffers,
    as_buffer,
    decode_range,
    is_mapped,
    map_file,
    packet_errata,
    release,
)
from .timing import (
    TimeBuffers,
    estimate_time,
    new_time_state,
    time_options,
    uncalibrated_output,
)

_MASK64 = (1 << 64) - 1
_ERRATA_BITS = {
    "bdm70": K.ER_BDM70,
    "bdm64": K.ER_BDM64,
    "skd022": K.ER_SKD022,
    "skd010": K.ER_SKD010,
    "skl014": K.ER_SKL014,
    "apl11": K.ER_APL11,
    "apl12": K.ER_APL12,
}


@dataclass
class FlowSettings:
    """What decoding is told beyond the PT configuration, by the library
    (:class:`~hwtrace.pt.decode.DecodeOptions`) and by the commands
    (:class:`FlowOptions`) alike."""

    flags: BlockFlags = field(default_factory=BlockFlags)
    addr_filter: AddrFilter = field(default_factory=AddrFilter)
    events: EventOptions = field(default_factory=EventOptions)
    fast: bool = True  # walk plain flow a run of code at a time
    replay: bool = True  # replay stretches of plain flow decoded before (with fast)


@dataclass
class FlowOptions(FlowSettings):
    """How to decode, beyond the PT configuration."""

    resync_on_error: bool = False  # ptxed's --resync-on-error
    keep_going: bool = False  # after an error, look for a PSB at the failure, not after it
    empty_blocks: bool = True  # report blocks of no instruction (ptxed counts them)
    count_only: bool = False  # plain flow is counted, not written as block rows
    status_events: bool = True  # a PSB+'s status updates among the events


@dataclass
class FlowBatch:
    """Part of a decoding's output, in flow order.

    Block rows: ``ip``, ``ninsn``, ``flags`` (``NEW``: the first row of one
    of libipt's blocks, ``SPECULATIVE``), ``mode``, ``offset`` (the trace
    offset where the block's decoding began) and ``time`` (the decoder's
    time stamp then).  Event rows: ``events`` (``EW`` words each, see
    :mod:`hwtrace.pt.flowrows`), their ``event_offset`` and
    ``event_block``, the number of this batch's block rows before each.
    ``table`` holds the code the blocks ran (``image`` its index among the
    decoding's images).  ``n_insn`` and ``n_blocks`` count the instructions
    and libipt's blocks the batch covers, ``n_virtual`` the block rows that
    were only counted (:attr:`FlowOptions.count_only`); the event rows'
    block numbers count those too.
    """

    ip: np.ndarray
    ninsn: np.ndarray
    flags: np.ndarray
    mode: np.ndarray
    offset: np.ndarray
    time: np.ndarray
    events: np.ndarray
    event_offset: np.ndarray
    event_block: np.ndarray
    table: CodeTable
    image: int
    run: np.ndarray | None = None  # each row's run in ``table`` (-1: a part of one)
    n_insn: int = 0
    n_blocks: int = 0
    n_virtual: int = 0

    NEW = O_NEW
    SPECULATIVE = O_SPEC


class FlowSink:
    """Receives batches (override :meth:`batch`).

    :meth:`output` gives the arrays the decoder writes its next rows into
    (see :func:`hwtrace.pt._flowloop.new_output`); the default is one set
    of buffers, reused after every batch.  A sink that keeps everything can
    hand out views into its own growing columns instead, so rows are written
    once, where they stay.
    """

    BLOCK_ROWS = 1 << 16
    EVENT_ROWS = 1 << 14

    def output(self) -> tuple:
        out = getattr(self, "_out", None)
        if out is None:
            out = self._out = K.new_output(self.BLOCK_ROWS, self.EVENT_ROWS)
        return out

    def storing_output(self, store: BlockStore | None) -> tuple:
        """:meth:`output` with ``store`` as the block store the decoder
        stores rows in itself while it can (:mod:`hwtrace.pt.blocks`);
        what it cannot comes to :meth:`batch` as batch rows, after them."""
        out = FlowSink.output(self)
        if store is not None:
            kernel = store.kernel_store()
            if out[OUT_STORE] is not kernel:
                out = self._out = out[:OUT_STORE] + (kernel,)
        return out

    def batch(self, batch: FlowBatch) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def make_room(self) -> None:
        """The decoder stopped with its output or its block store full (after
        :meth:`batch` took what it had): a sink whose store the decoder
        stores into grows it where it is full."""


# What to do at an event the decoder stopped at: return an image to decode
# with from now on, or None to keep the current one.
EventHook = Callable[[np.ndarray, int], object]


@dataclass(frozen=True, slots=True)
class UnplacedRevision:
    """A revision of code that ran whose start the trace cannot place
    among the instructions decoded near trace ``offset`` (no time stamps
    there, or it began between two flow packets): the instructions at
    ``ips`` were decoded from its bytes, but may have run the bytes it
    replaced."""

    address: int
    size: int
    valid_from: int
    offset: int
    source: str
    ips: tuple[int, ...]

    def __str__(self) -> str:
        return (
            f"code revision at {self.address:#x} ({self.source}, from time {self.valid_from}) "
            f"cannot be placed in the flow near trace offset {self.offset:#x}: "
            f"{len(self.ips)} instruction(s) decoded from it (at {self.ips[0]:#x}"
            f"{', …' if len(self.ips) > 1 else ''}) may have run the bytes it replaced"
        )


@dataclass
class _Window:
    """Packets of one stretch of a segment, and the time model's state at
    its start and at its limit (where the next window starts); ``epoch``:
    the code revisions' epoch its flow runs in (None: no revisions)."""

    start: int
    ext: int
    limit: int
    limit_index: int
    packets: tuple
    start_state: np.ndarray
    limit_state: np.ndarray
    epoch: int | None = None
    # Revisions whose place among the instructions decoded from the window's
    # start (its first flow packet's; all of it without time) is not known.
    unplaced: list[Revision] = field(default_factory=list)


# Packets that say where the flow goes; a change of code revisions takes
# effect before one of them (see FlowDecoder._revision_cut).
_FLOW_KINDS = np.array(
    [Kind.TNT8, Kind.TNT64, Kind.TIP, Kind.TIP_PGE, Kind.TIP_PGD, Kind.FUP], np.uint8
)
_NO_TIME = np.iinfo(np.int64).max
# Windows the flow loop may open itself before Python sees the decoding
# again: of a trace in memory any number; of a mapped file a few (2 MiB),
# after which Python lets their pages go.
_AHEAD, _AHEAD_MAPPED = 1 << 62, 16


def _before_psb(kind: np.ndarray, at: int) -> int:
    """Packet ``at``, or the PSB of the PSB+ it lies in: a window ends there."""
    psb = np.flatnonzero(kind[: at + 1] == Kind.PSB)
    if psb.shape[0]:
        p = int(psb[-1])
        if not (kind[p:at] == Kind.PSBEND).any():
            return p
    return at


class FlowDecoder:
    """Decodes traces against an image (see the module docstring).

    ``on_event(row, offset)`` is called after each event ``stop_at`` names
    (``"enabled"``: tracing enabled, how sideband follows context switches;
    ``"all"``); it may return the image to decode with from then on.

    ``revisions``: code that changed while the trace ran
    (:class:`~hwtrace.image.revisions.CodeRevisions`, in the trace's TSC),
    or a function giving the store for an image (None: none).  The decoder
    then reads code as it was at the time of the flow it decodes: the
    revisions in force are laid over the image (an overlay per epoch,
    :meth:`~hwtrace.image.revisions.CodeRevisions.overlay`), and where a
    revision begins the decoder changes code right after the last flow
    packet before its time, since the instructions walked after that
    packet may already run the new code (FlowJIT's rule: a revision is
    valid from its first execution).  Without time stamps the latest code
    is used.  Revisions the trace cannot place among the instructions
    decoded from them are reported in :attr:`unplaced`
    (:class:`UnplacedRevision`).
    """

    # Packets decoded at a time: the memory a decoding needs is about 30
    # bytes per trace byte of one window (and its limit's PSB+).  Now
    # that a window reads ahead only through its limit's PSB+ (not a whole
    # PSB period past it) and the flow loop opens the next window itself,
    # 16 KiB keeps a window's packets and times (~0.5 MiB) in the core's
    # L2: 3-6% faster than 128 KiB on the decode benchmark's traces here,
    # as fast as 8 KiB.
    window_bytes = 1 << 14

    def __init__(
        self,
        image,
        config: PtConfig | None = None,
        options: FlowOptions | None = None,
        *,
        on_event: EventHook | None = None,
        stop_at: str = "enabled",
        images: list | None = None,
        revisions: CodeRevisions | Callable[[object], CodeRevisions | None] | None = None,
    ) -> None:
        self.config = config or PtConfig()
        self.options = options or FlowOptions()
        self.on_event = on_event
        # The images used, numbered in order of first use (shared with other
        # decoders of the same trace so the numbers agree).
        self.images: list = images if images is not None else []
        self._tables: dict[int, CodeTable] = {}
        self.revisions = revisions
        self._base = image  # the image without code revisions
        self._epoch = 0
        # Revisions whose place the trace could not tell (see _check_watch).
        self.unplaced: list[UnplacedRevision] = []
        self._watch: tuple | None = None
        self.image = image
        self._expect_bytes = 0
        self.table = self._table_for(image)
        self.state = K.new_state()
        # One window's packets and times at a time: their memory is reused.
        self._packet_buffers = PacketBuffers()
        self._time_buffers = TimeBuffers()
        # The flow loop's tuple of the buffers' whole columns, and the
        # columns it was made of (see _window_packets).
        self._packets: tuple = ((), (), ())
        # What _open_compiled hands the compiled window opener: for a
        # configuration, the decoder state as words and the time model's
        # settings; the time model's scratch state; the columns (see
        # _window_columns).
        self._window_setup: tuple = (None, None, (), ())
        self._time_work = new_time_state()
        # The time model's state at a segment's start (never written), and
        # two for the states at window limits: a window starts from one and
        # saves into the other; rows of one array the window opener takes
        # whole, with its scalars in another (the very arrays from call to
        # call: its call is prepared once, see _open_compiled).
        self._time_states = np.zeros((TS_ROWS, new_time_state().shape[0]), np.int64)
        self._time_rows = tuple(self._time_states[i] for i in range(TS_ROWS))
        self._time_start = self._time_rows[TS_START]
        self._window_args = np.zeros(WA_SIZE, np.int64)
        self._window_opener: tuple | None = None
        self._window_call = None
        self._window_held: tuple = ((), ())
        self.out: tuple = ()
        self.cf = self._config_arrays(stop_at if on_event is not None else "none")

    # -- set-up --------------------------------------------------------------
    def _config_arrays(self, stop_at: str) -> tuple[np.ndarray, np.ndarray]:
        opts = self.options
        flags = opts.flags
        errata = 0
        for name, bit in _ERRATA_BITS.items():
            if name in self.config.errata:
                errata |= bit
        cf = np.zeros(K.NCF, np.int64)
        cf[K.CF_FAST] = (
            opts.fast
            and not flags.tick_events
            and not flags.end_on_call
            and not flags.end_on_jump
            and not errata & K.ER_BDM64
        )
        cf[K.CF_TICK] = flags.tick_events
        cf[K.CF_END_ON_CALL] = flags.end_on_call
        cf[K.CF_END_ON_JUMP] = flags.end_on_jump
        cf[K.CF_IFLAGS] = opts.events.iflags
        cf[K.CF_RESYNC] = opts.resync_on_error
        cf[K.CF_KEEP_GOING] = opts.keep_going
        cf[K.CF_DROP_EMPTY] = not opts.empty_blocks
        cf[K.CF_COUNT] = opts.count_only
        cf[K.CF_REPLAY] = opts.replay
        cf[K.CF_STATUS_EVENTS] = opts.status_events
        cf[K.CF_STOP_EVENTS] = {"none": K.STOP_NONE, "enabled": K.STOP_ENABLED, "all": K.STOP_ALL}[
            stop_at
        ]
        cf[K.CF_ERRATA] = errata
        ranges = opts.addr_filter.ranges
        cf[K.CF_NFILTER] = len(ranges)
        cfu = np.zeros(max(3 * len(ranges), 3), np.uint64)
        for i, (cfg, a, b) in enumerate(ranges):
            cfu[3 * i : 3 * i + 3] = (cfg & _MASK64, a & _MASK64, b & _MASK64)
        return cf, cfu

    def _image_index(self, image) -> int:
        for i, known in enumerate(self.images):
            if known is image:
                return i
        self.images.append(image)
        return len(self.images) - 1

    def _table_for(self, image) -> CodeTable:
        table = self._tables.get(id(image))
        if table is None:
            # An image that maps more than one decoded before (a process
            # that mapped more code) takes over that one's table: its code
            # is not decoded again.
            for key, old in list(self._tables.items()):
                if old.extend_to(image):
                    del self._tables[key]
                    table = old
                    break
            else:
                table = CodeTable(image)
                table.reserve_replay(self._expect_bytes)
            self._tables[id(image)] = table
        table.index = self._image_index(image)
        return table

    def expect(self, trace_bytes: int) -> None:
        """Say how much trace this decoder will be given (sizes its caches)."""
        self._expect_bytes = max(self._expect_bytes, trace_bytes)
        for table in self._tables.values():
            table.reserve_replay(self._expect_bytes)

    @property
    def tables(self) -> list[CodeTable]:
        """The code tables of every image decoded so far."""
        return list(self._tables.values())

    def release_tables(self, images: set[int]) -> int:
        """Let go of the code tables (but the one in use) of which every
        image is among the image numbers ``images``: code the trace will not
        run again (a process that exec'd), whose rows are all passed on (a
        row's ``run`` names its table's instructions).  Should the trace go
        there after all, the code is decoded again.  Returns how many."""
        gone = [key for key, table in self._tables.items()
                if table is not self.table and table.indices <= images]  # fmt: skip
        for key in gone:
            del self._tables[key]
        return len(gone)

    def use_table(self, table: CodeTable) -> None:
        """Decode with ``table`` from now on (a sideband context's own)."""
        if table is not self.table:
            table.index = self._image_index(table.image)
            self.table = table
            self.image = table.image

    def switch_image(self, image) -> None:
        """Decode with ``image`` from now on (with the code revisions in
        force laid over it)."""
        if image is None:
            return
        self._base = image
        code = self._code_of(image, self._epoch)
        if code is not self.image:
            self.use_table(self._table_for(code))

    def _store(self, image) -> CodeRevisions | None:
        r = self.revisions
        store = r(image) if callable(r) else r
        return store if store is not None and len(store) else None

    def _code_of(self, image, epoch: int):
        store = self._store(image)
        return image if store is None else store.overlay(image, epoch)

    def _change_code(self, change: Callable[[], None]) -> None:
        """Run ``change`` (which may switch the code table) keeping the
        instructions the decoder holds."""
        held = self._held()
        before, generation = self.table, self.table.generation
        change()
        if self.table is not before or self.table.generation != generation:
            SI = self.state[0]
            for slot, data in held:
                SI[slot] = self.table.add_row(data)
            self.state[14][:] = -1  # run indices are the old table's

    def _enter(self, win: _Window) -> None:
        """Decode ``win`` in its code revisions' epoch."""
        if win.epoch is not None and win.epoch != self._epoch:
            self._epoch = win.epoch
            code = self._code_of(self._base, win.epoch)
            if code is not self.image:
                self._change_code(lambda: self.use_table(self._table_for(code)))
        if win.unplaced:
            self._check_watch()
            offset = int(win.packets[4][0]) if self.state[0][K.W_N] else win.start
            self._watch = (self.table, self.table.n_insns, win.unplaced, offset)

    def _check_watch(self) -> None:
        """The instructions decoded since the watch began, in code whose
        revision the trace could not place: those whose bytes differ from
        the bytes the revision replaced make it an :class:`UnplacedRevision`."""
        if self._watch is None:
            return
        table, first, revisions, offset = self._watch
        self._watch = None
        store = self._store(self._base)
        last = table.n_insns
        if store is None or last <= first:
            return
        rewrites = store.rewrites(self._base)
        rows = np.arange(first, last)
        rows = rows[(table.i_adopted[first:last] == 0) & (table.i_err[first:last] == 0)]
        ips, sizes = table.i_ip[rows], table.i_size[rows].astype(np.int64)
        for r in revisions:
            differ = rewrites.get(r.id)
            if differ is None:
                continue
            # Bytes that differ, counted up to each offset: an instruction
            # differs where the count grows over its bytes.
            count = np.concatenate([[0], np.cumsum(differ)])
            lo = ips.astype(np.int64) - r.address
            inside = (lo >= 0) & (lo < differ.shape[0])
            lo, hi = lo[inside], np.minimum(lo[inside] + sizes[inside], differ.shape[0])
            hit = np.sort(ips[inside][count[hi] > count[lo]])
            if hit.shape[0]:
                self.unplaced.append(UnplacedRevision(
                    r.address, len(r.data), r.valid_from, offset, r.source,
                    tuple(hit.tolist())))  # fmt: skip

    def _held(self) -> list[tuple[int, dict]]:
        """The instructions the decoder holds (the one whose event is
        pending, the last block's last), to keep across a change of code."""
        SI = self.state[0]
        held = []
        for slot, live in (
            (K.BS_INSN, SI[K.BS_PROC]),
            (K.CB_LAST, SI[K.CB_LAST] >= 0 and SI[K.CB_NINSN] > 0),
            (K.BS_LAST, SI[K.BS_LAST] >= 0),
        ):
            if live:
                held.append((slot, self.table.row(int(SI[slot]))))
        return held

    # -- decoding --------------------------------------------------------------
    def decode(self, data, sink: FlowSink, start: int = 0, end: int | None = None) -> None:
        """Decode ``data[start:end]`` (bytes, a numpy buffer or a file path),
        handing batches to ``sink``."""
        buf = map_file(data) if isinstance(data, (str, os.PathLike)) else as_buffer(data)
        end = buf.shape[0] if end is None else min(end, buf.shape[0])
        self.expect(end - start)
        self.out = sink.output()
        pos, last_sync, sync_progress = start, -1, -1
        try:
            while pos < end:
                first = pos + 16 if pos == last_sync else pos
                off = int(_sync_forward_loop(buf, first, start, end)) if first < end else -1
                if off < 0:
                    break
                last_sync = off
                code, nxt, synced = self._segment(buf, off, end, sink)
                if code == PtError.EOS:
                    break
                if not synced:
                    if nxt <= sync_progress:
                        break
                    sync_progress = nxt
                pos = nxt
        finally:
            # (The prepared window opener holds the trace: a mapped file's
            # mapping would outlive its decoding.)
            self._window_call = self._window_opener = None

    def _reset(self) -> None:
        for arr in self.state:
            arr[...] = 0
        self.state[14][:] = -1  # no run known for any return address

    def _open(
        self,
        buf: np.ndarray,
        ws: int,
        end: int,
        tstate: np.ndarray,
        grow: int = -1,
        fresh: bool = False,
    ):
        """The window of packets from ``ws``: up to a PSB ``window_bytes``
        on (its limit, where the next window starts), and on through that
        PSB's PSB+, which is as far as decoding ahead of the limit reads but
        for a rare step, which asks for the window again reaching further.
        ``grow``: make it reach past that offset; ``fresh``: a segment
        starts there (not the last window's flow)."""
        if self._store(self._base) is None:
            win = self._open_compiled(buf, ws, end, tstate, grow)
            if win is not None:
                return win
        self._window_args[WA_SAVED] = -1  # (the flow loop leaves the next one to Python)
        limit, ext = (int(x) for x in _window_extent(buf, ws, end, self.window_bytes, grow))
        table = decode_range(buf, ws, ext, resync=False, errata=packet_errata(self.config),
                             buffers=self._packet_buffers)  # fmt: skip
        n = len(table)
        limit_index = -1
        if limit >= 0:
            idx = int(np.searchsorted(table.offset, limit))
            if idx < n and int(table.offset[idx]) == limit:
                limit_index = idx
        if len(table.err_code):
            end_error = {
                int(DecodeError.BAD_OPCODE): PtError.BAD_OPC,
                int(DecodeError.BAD_PACKET): PtError.BAD_PACKET,
            }.get(int(table.err_code[0]), PtError.EOS)
        else:
            end_error = PtError.EOS if ext >= end else K.ABORT_WINDOW
        times, saved = self._times(table, tstate, limit_index)
        epoch = None
        exact = False
        unplaced: list[Revision] = []
        store = self._store(self._base)
        if store is not None and n:
            cut, epoch = self._revision_cut(table, times, store)
            unplaced, first_flow = self._unplaced(table, times, store, epoch, fresh)
            if unplaced and first_flow > 0 and (cut < 0 or first_flow < cut):
                # Watch the code decoded up to the first flow packet's last
                # branch: the window ends at the next flow packet.
                cut = first_flow
            if cut > 0 and (limit_index < 0 or cut < limit_index):
                exact = True
                # End the window where the code changes: the next one starts
                # there, in the new epoch.
                limit_index, limit = cut, int(table.offset[cut])
                times, saved = self._times(table, tstate, limit_index)
        SI, SU = self.state[0], self.state[1]
        SI[K.W_N] = n
        SI[K.W_END_ERR] = int(end_error)
        SI[K.W_LIMIT] = limit_index
        SI[K.W_EXACT] = exact
        SU[K.W_END_OFFSET] = int(table.offset[-1] + table.size[-1]) if n else ws
        pk = self._window_packets(table, times)
        return _Window(ws, ext, limit, limit_index, pk, tstate, saved, epoch, unplaced)

    def _open_compiled(self, buf: np.ndarray, ws: int, end: int, tstate: np.ndarray, grow: int):
        """:meth:`_open` in one compiled call into the kept columns
        (:func:`hwtrace.pt._window.open_window`), when no code revisions
        apply; None when it leaves the window to :meth:`_open`."""
        pb, tb = self._packet_buffers, self._time_buffers
        rows_of = self._time_rows
        which = next((i for i, r in enumerate(rows_of) if r is tstate), TS_OTHER)
        if which == TS_OTHER:
            rows_of[TS_OTHER][...] = tstate  # (a state the long way made)
        wargs = self._window_args
        wargs[WA_START], wargs[WA_END], wargs[WA_BYTES], wargs[WA_GROW], wargs[WA_TIME] = (
            ws, end, self.window_bytes, grow, which
        )  # fmt: skip
        while True:
            wo = self._opener(buf)
            call = self._window_call
            if call is None or call.args is not wo:
                call = self._window_call = _open_window.prepare(*wo)
            what, limit, ext, n, limit_index, end_error, end_offset = call()
            if what != WIN_ROOM:
                break
            pb.take(n)
            tb.take(n)
            tb.starts(n)
            tb.diagnostics(n)
        if what != WIN_READY:
            return None
        SI, SU = self.state[0], self.state[1]
        SI[K.W_N] = n
        SI[K.W_END_ERR] = end_error
        SI[K.W_LIMIT] = limit_index
        SI[K.W_EXACT] = False
        SU[K.W_END_OFFSET] = end_offset
        limit_state = rows_of[int(wargs[WA_SAVED])]  # (the row open_window saved into)
        return _Window(ws, ext, limit, limit_index, self._window_columns()[4], tstate, limit_state)

    def _opener(self, buf: np.ndarray) -> tuple:
        """open_window's arguments (its scalars' values aside, see
        :meth:`_open_compiled`): the very tuple of the last call while its
        objects are the same, which the flow loop also takes to open the
        next window itself."""
        c, keep_tcal = self.config, self.options.events.keep_tcal_on_ovf
        setup = self._window_setup
        if setup[0] is not c or setup[1] != keep_tcal:
            # The decoder state as words and the time model's settings, for
            # this configuration.  (A CYC and the TNT-8 after it in one row:
            # these windows' rows go to the time model and the flow loop
            # only, which take it as the two packets.)
            fresh, state = self._packet_buffers.decoder_states(
                False, packet_errata(c) | ROWS_FOLD_CYC
            )
            tc = np.array([c.mtc_freq, c.nom_freq, c.cpuid_0x15_eax, c.cpuid_0x15_ebx,
                           time_options(c, keep_tcal_on_ovf=keep_tcal)], np.int64)  # fmt: skip
            words = (fresh.view(np.int64), state.view(np.int64), state)
            setup = self._window_setup = (c, keep_tcal, words, tc)
        held, tc = setup[2], setup[3]
        rows, errs, starts, tout, _ = self._window_columns()
        wo = (buf, self._window_args, *held, rows, errs, tc, self._time_states, self._time_work,
              starts, tout)  # fmt: skip
        last = self._window_opener
        if last is not None and all(a is b for a, b in zip(last, wo, strict=True)):
            return last
        self._window_opener = wo
        return wo

    def _window_now(self, pk: tuple) -> _Window:
        """The window the flow loop decodes, which it opened itself."""
        wargs, rows_of = self._window_args, self._time_rows
        return _Window(
            int(wargs[WA_START]), int(wargs[WA_EXT]), int(wargs[WA_LIMIT]),
            int(self.state[0][K.W_LIMIT]), pk, rows_of[int(wargs[WA_TIME])],
            rows_of[int(wargs[WA_SAVED])],
        )  # fmt: skip

    def _window_columns(self) -> tuple:
        """The kept columns open_window fills, and the flow loop's tuple of
        them: the very tuples of the last window while the columns are the
        same (their arguments are then not looked at again, see
        hwtrace.aot)."""
        pb, tb = self._packet_buffers, self._time_buffers
        key = (pb.columns(), pb.errors(), tb.columns(), tb.starts(0), tb.diagnostics(0))
        held = self._window_held
        if len(held[0]) != len(key) or any(a is not b for a, b in zip(held[0], key, strict=True)):
            cols, errs, tcols, starts, diag = key
            offset, kind, size, a, b, c = cols
            tout = uncalibrated_output(tcols[0], tcols[1], diag)  # (no calibration kept)
            pk = (kind, a, b, c, offset, size, tcols[0].view(np.uint64), tcols[1])
            held = self._window_held = (key, (cols, errs, starts, tout, pk))
        return held[1]

    def _window_packets(self, table, times) -> tuple:
        """The packet and time columns the flow loop reads, of which it
        reads the window's rows only (``W_N``): the buffers' whole columns
        when the table and times are in them, the very tuple of the last
        window (the loop's arguments are then not looked at again, see
        hwtrace.aot), else the table's and times' own."""
        cols, tcols = self._buffered(table), self._time_buffers.columns()
        if cols is None or times.tsc.base is not tcols[0]:
            return (
                table.kind, table.a, table.b, table.c, table.offset, table.size,
                times.tsc, times.have_tsc,
            )  # fmt: skip
        held = self._packets
        if held[0] is not cols or held[1] is not tcols:
            offset, kind, size, a, b, c = cols
            pk = (kind, a, b, c, offset, size, tcols[0].view(np.uint64), tcols[1])
            held = self._packets = (cols, tcols, pk)
        return held[2]

    def _buffered(self, table) -> tuple | None:
        """The packet buffers' whole columns when ``table`` is in them
        (decoded in one part), else None."""
        cols = self._packet_buffers.columns()
        return cols if table.kind.base is cols[1] else None

    def _unplaced(self, table, times, store: CodeRevisions, epoch: int, fresh: bool):
        """The revisions a window starting in ``epoch`` cannot place, and
        the index of its second flow packet (-1: none), where the code they
        may have changed has been decoded.  Without time stamps, every
        rewrite up to ``epoch`` (the latest code is read); with them, the
        rewrites from a source that did not time them at a trace point
        (:data:`~hwtrace.image.revisions.EXACT_SOURCES`) that began since
        the time the window's flow follows on from (the last flow packet
        before it, or its PSB's)."""
        rewrites = store.rewrites(self._base)
        if not rewrites:
            return [], -1
        have = times.have_tsc
        if not have.any():
            return [r for r in store.between(0, epoch) if r.id in rewrites], -1
        if fresh:
            first = int(np.searchsorted(store.boundaries(), np.int64(times.tsc[np.argmax(have)]),
                                        side="right"))  # fmt: skip
        else:
            first = self._epoch
        if epoch <= first:
            return [], -1
        revs = [
            r for r in store.between(first, epoch)
            if r.id in rewrites and r.source not in EXACT_SOURCES
        ]  # fmt: skip
        flow = np.flatnonzero(np.isin(table.kind, _FLOW_KINDS))
        return revs, (_before_psb(table.kind, int(flow[1])) if flow.shape[0] > 1 else -1)

    def _times(self, table, tstate: np.ndarray, save_at: int):
        """The time of every packet of a window from the time model's state
        ``tstate``, and that state before packet ``save_at``."""
        saved = new_time_state()
        cols = self._buffered(table)
        whole = None if cols is None else (cols[1], cols[3], cols[4])  # kind, a, b
        times = estimate_time(
            table,
            self.config,
            keep_tcal_on_ovf=self.options.events.keep_tcal_on_ovf,
            state=tstate.copy(),
            save_at=save_at,
            saved=saved,
            buffers=self._time_buffers,
            fcr=False,
            columns=whole,
        )
        return times, saved

    @staticmethod
    def _revision_cut(table, times, store: CodeRevisions) -> tuple[int, int]:
        """Where in a window of packets the code revisions' epoch changes
        (-1: nowhere) and the epoch its flow starts in.

        A flow packet (a TNT, TIP or FUP) is written when its last branch
        runs: the instructions walked after the packet before it, up to
        its last branch, ran before its time, after that packet's.  They
        run in the epoch of its time (FlowJIT: a revision is valid from its
        first execution, so code first run among them is in force).  The
        window ends at the first flow packet in another epoch (at the PSB
        of a PSB+ it lies in): the decoder takes every branch outcome before
        it, then fetches it in the next window, with that epoch's code.
        """
        kind = table.kind
        flow = np.flatnonzero(np.isin(kind, _FLOW_KINDS))
        t = np.where(times.have_tsc, times.tsc.astype(np.int64), _NO_TIME)
        bounds = store.boundaries()
        if flow.shape[0] == 0:
            return -1, int(np.searchsorted(bounds, t[-1], side="right"))
        epochs = np.searchsorted(bounds, t[flow], side="right")
        change = np.flatnonzero(epochs != epochs[0])
        if change.shape[0] == 0:
            return -1, int(epochs[0])
        return _before_psb(kind, int(flow[change[0]])), int(epochs[0])

    def _segment(self, buf: np.ndarray, off: int, end: int, sink: FlowSink):
        """Decode the segment starting at the PSB at ``off``: returns
        ``(code, next offset, synced)`` with the error that ended it (EOS at
        the end of the trace) and whether the PSB+ could be read."""
        self._reset()
        SI, SU = self.state[0], self.state[1]
        SI[K.DR_PHASE] = K.PH_START
        SI[K.DR_SYNC] = off
        SI[K.CB_LAST] = -1
        SI[K.BS_LAST] = -1
        win = self._open(buf, off, end, self._time_start, fresh=True)
        self._enter(win)
        # The flow loop opens the next window itself unless Python has to
        # see it: code revisions to place; a mapped file's pages to release
        # (every few windows: what is resident stays bounded).
        wargs = self._window_args
        if self._store(self._base) is not None:
            ahead = 0
        else:
            ahead = _AHEAD_MAPPED if is_mapped(buf) else _AHEAD
        wargs[WA_CONTINUE] = ahead
        opened = int(wargs[WA_OPENED])
        released = off  # (the pages before it let go)
        call = None
        while True:
            # (The same objects from call to call, mostly: laid out again
            # only when one of them is another.)
            args = (self.state, win.packets, self.cf, self.table.tuple, self.out, self._opener(buf),
                    self.table.code_space())  # fmt: skip
            if call is None or not call.holds(*args):
                call = K.run.prepare(*args)
            r = call()
            self.table.book_filled()
            if wargs[WA_OPENED] != opened:
                opened = int(wargs[WA_OPENED])
                win = self._window_now(win.packets)
            if r == K.R_MISS:
                counts = self.table.counts
                self.table.fill(int(counts[C_MISS_IP]) & _MASK64, int(counts[C_MISS_MODE]))
            elif r == K.R_GROW:
                self.table.grow_runs()
            elif r == K.R_FULL:
                self._flush(sink)
                make_room = getattr(sink, "make_room", None)  # (sinks need not be FlowSinks)
                if make_room is not None:
                    make_room()
                    self.out = sink.output()
            elif r == K.R_EVENT:
                self._flush(sink)
                self._event(win.packets)
            elif r == K.R_MORE:
                # Go on in the next window, which starts at this one's limit.
                shift = win.limit_index
                release(buf, max(released - FAULT_AROUND, 0), win.limit)
                released = win.limit
                wargs[WA_CONTINUE] = ahead
                self._check_watch()
                win = self._open(buf, win.limit, end, win.limit_state)
                SI[K.ES_POS] -= shift
                self._enter(win)
            elif r == K.R_WINDOW:
                # A step read past the window: the same window, reaching further.
                win = self._open(buf, win.start, end, win.start_state, grow=win.ext)
                self._enter(win)
            else:  # R_DONE
                self._flush(sink)
                self._check_watch()
                # The last windows' pages too: a trace decoded range by
                # range would otherwise keep them resident.  (The last
                # window of a range has no limit, -1: up to where its
                # packets end.)
                last = win.limit if win.limit >= 0 else win.ext
                release(buf, max(released - FAULT_AROUND, 0), last)
                synced = not SI[K.DR_SYNC_FAILED]
                return int(SI[K.DR_END]), int(SU[K.DR_NEXT]), synced

    def _event(self, pk) -> None:
        if self.on_event is None:
            return
        row = self.state[13].copy()
        SI, SU = self.state[0], self.state[1]
        pos = int(SI[K.ES_POS])
        offset = int(pk[4][pos]) if pos < int(SI[K.W_N]) else int(SU[K.W_END_OFFSET])
        self._change_code(lambda: self.switch_image(self.on_event(row, offset)))
        # A hook may say until when (TSC) its answer holds: no stop before.
        until = getattr(self.on_event, "stop_from", None)
        if until is not None:
            self.cf[0][K.CF_STOP_TSC] = until()

    def _flush(self, sink: FlowSink) -> None:
        SI = self.state[0]
        nb_, ne = int(SI[K.O_NBLK]), int(SI[K.O_NEV])
        n_insn, n_blocks, n_virtual = int(SI[K.O_NINSN]), int(SI[K.O_NBLOCKS]), int(SI[K.O_VBLK])
        if not (nb_ or ne or n_insn or n_blocks or n_virtual):
            return
        o = self.out
        sink.batch(
            FlowBatch(
                o[0][:nb_], o[1][:nb_], o[2][:nb_], o[3][:nb_], o[4][:nb_], o[5][:nb_],
                o[6][:ne], o[7][:ne], o[8][:ne], self.table, self.table.index, o[9][:nb_],
                n_insn, n_blocks, n_virtual,
            )
        )  # fmt: skip
        for slot in (K.O_NBLK, K.O_NEV, K.O_NINSN, K.O_NBLOCKS, K.O_VBLK):
            SI[slot] = 0
        self.out = sink.output()


__all__ = [
    "EventHook",
    "FlowBatch",
    "FlowDecoder",
    "FlowOptions",
    "FlowSettings",
    "FlowSink",
    "UnplacedRevision",
]
