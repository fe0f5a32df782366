"""Instruction-flow reconstruction as a library: trace bytes + image → columns.

:func:`decode_trace` turns an Intel PT stream into a :class:`FlowResult`:
the executed basic blocks as numpy columns (start IP, instruction count,
time, trace offset), the events, and every gap where decoding failed.  A
trace is cut at PSB boundaries into chunks that decode independently: in
order for :func:`iter_flow` (bounded memory, any trace size) or on several
threads for :func:`decode_trace` with ``jobs``.

Each chunk is decoded by :class:`SegmentWalker`: Intel's reference semantics
(:mod:`hwtrace.pt.events`, :mod:`hwtrace.pt.flow`) for everything that is
not plain flow, the compiled walk (:mod:`hwtrace.pt._walk`) for the rest.

Why a chunk also reads the next chunk's PSB+: the PSB+ says where execution
was when it was written (its FUP), which may be in the middle of a block.
Decoding it walks the previous chunk's flow exactly up to that address, so
the next chunk, which starts there, neither repeats nor misses instructions.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numba as nb
import numpy as np

from ..image.symbols import SymbolTable
from ..isa.x86 import IClass, InsnCache, Special
from . import _walk as W
from ._kernels import sync_forward as _sync_forward_kernel
from .config import PtConfig
from .errors import PtError, errstr
from .events import DecodeFailure, Ev, Event, EventDecoder, EventOptions
from .flow import EOS, EVENT_PENDING, AddrFilter, Block, BlockDecoder, BlockFlags
from .kinds import DecodeError, Kind
from .packets import as_buffer, decode_range, map_file, packet_errata

# Which image runs from an enabling of tracing on: ``context(tsc, ip)``, tsc
# None when the trace has no time there; returns None to keep the image.
Context = Callable[[int | None, int], object]

_MAX_TABLE_BLOCK = 4096  # instructions in one table block


@dataclass(frozen=True, slots=True)
class Gap:
    """A stretch of trace that could not be decoded."""

    offset: int  # trace offset where decoding failed
    ip: int  # the instruction address it failed at (0: unknown)
    time: int  # the last time stamp before the failure (0: none yet)
    reason: str  # libipt's wording, e.g. "no memory mapped at this address"
    code: int  # the PtError code

    def __str__(self) -> str:
        return f"[{self.offset:x}, {self.ip:x}: error: {self.reason}]"


@dataclass
class FlowResult:
    """Executed blocks as columns, events, gaps.

    ``block_ip[i]`` starts ``block_ninsn[i]`` instructions that ran one after
    another (straight-line or through direct jumps and calls);
    ``block_time`` is the time stamp of the last packet consumed before the
    block and ``block_offset`` the trace offset of the packet being decoded.
    """

    block_ip: np.ndarray
    block_ninsn: np.ndarray
    block_time: np.ndarray
    block_offset: np.ndarray
    block_mode: np.ndarray | None = None  # 16, 32 or 64 (None: all 64)
    events: list[tuple[int, Event]] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    # Per code key (execution mode, plus 256 times the image's index in
    # ``images`` when a context switched images): sorted instruction
    # addresses and where each goes without trace (next instruction or
    # direct branch target).
    successors: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    # (instructions, blocks) when decoded with keep_blocks=False: the
    # columns are then empty.
    counted: tuple[int, int] | None = None
    # The image each block ran in, as an index into ``images`` (None: all
    # in the first); set when a decoding context switched images.
    block_image: np.ndarray | None = None
    images: list = field(default_factory=list)

    @property
    def n_insn(self) -> int:
        if self.counted is not None:
            return self.counted[0]
        return int(self.block_ninsn.sum(dtype=np.uint64))

    @property
    def n_blocks(self) -> int:
        if self.counted is not None:
            return self.counted[1]
        return int(self.block_ip.shape[0])

    def instructions(self) -> np.ndarray:
        """The address of every executed instruction, in order."""
        if self.counted is not None:
            raise ValueError("decoded with keep_blocks=False: only counts were kept")
        mode = self.block_mode
        if mode is None:
            mode = np.full(self.block_ip.shape[0], 64, np.uint8)
        code_key = mode.astype(np.int64)
        if self.block_image is not None:
            code_key += self.block_image.astype(np.int64) << 8
        # One sorted table per code key, concatenated; each block searches
        # its own table's slice.
        order = sorted(self.successors)
        tables = [self.successors[k] for k in order]
        sizes = np.array([len(t[0]) for t in tables], np.int64)
        ends = np.cumsum(sizes)
        keys = np.concatenate([t[0] for t in tables]) if tables else np.zeros(0, np.uint64)
        succ = np.concatenate([t[1] for t in tables]) if tables else np.zeros(0, np.uint64)
        table = np.searchsorted(np.array(order, np.int64), code_key)
        table = np.minimum(table, max(len(order) - 1, 0))
        known = np.array(order, np.int64)[table] == code_key if order else code_key < 0
        table = np.where(known, table, -1)
        out = np.empty(self.n_insn, np.uint64)
        bad = _expand(self.block_ip, self.block_ninsn, table, ends - sizes, ends, keys, succ, out)
        if bad >= 0:
            raise RuntimeError(f"block {bad} walks into code that was never decoded")
        return out

    def event_columns(self) -> dict[str, np.ndarray]:
        """The events as columns: ``type`` (:class:`Ev`), ``ip`` (0 when
        suppressed), ``time``, ``offset`` and ``block``, the index of the first
        block after the event, which places it in the instruction flow."""
        evs = self.events
        n = len(evs)
        return {
            "type": np.fromiter((int(e.type) for _, e in evs), np.uint8, n),
            "ip": np.fromiter((0 if e.ip_suppressed else e.ip for _, e in evs), np.uint64, n),
            "time": np.fromiter((e.tsc if e.has_tsc else 0 for _, e in evs), np.uint64, n),
            "offset": np.fromiter((o for o, _ in evs), np.int64, n),
            "block": np.fromiter((e.block for _, e in evs), np.int64, n),
        }

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


@nb.njit(cache=True, nogil=True)
def _expand(bip, bn, btable, tstart, tend, keys_all, succ_all, out):
    j = 0
    for i in range(bip.shape[0]):
        ip = bip[i]
        t = btable[i]
        if t < 0:
            return i
        keys = keys_all[tstart[t] : tend[t]]
        succ = succ_all[tstart[t] : tend[t]]
        for _ in range(bn[i]):
            out[j] = ip
            j += 1
            k = np.searchsorted(keys, ip)
            if k >= keys.shape[0] or keys[k] != ip:
                return i
            ip = succ[k]
    return -1


def _successors(
    caches: list[InsnCache] | list[tuple[int, InsnCache]],
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Where each decoded instruction goes when it needs no trace, per code
    key (mode + 256 * image index; caches given alone are image 0)."""
    tables: dict[int, dict[int, int]] = {}
    for entry in caches:
        space, cache = entry if isinstance(entry, tuple) else (0, entry)
        for (ip, mode), insn in cache._cache.items():
            if isinstance(insn, int):
                continue
            nxt = insn.next_ip
            if insn.is_direct and insn.iclass in (IClass.JUMP, IClass.CALL):
                nxt = (nxt + insn.displacement) & 0xFFFFFFFFFFFFFFFF
            tables.setdefault(mode + (space << 8), {})[ip] = nxt
    out = {}
    for mode, table in tables.items():
        keys = np.fromiter(table.keys(), np.uint64, len(table))
        vals = np.fromiter(table.values(), np.uint64, len(table))
        order = np.argsort(keys)
        out[mode] = (keys[order], vals[order])
    return out


# --------------------------------------------------------------------------
# The block table: basic blocks for the compiled walk, built from the cache.

_PLAIN = (IClass.OTHER, IClass.PTWRITE)


class CodeTables:
    """One address space's decoded code: instructions and table blocks."""

    def __init__(self, read) -> None:
        self.cache = InsnCache(read)
        self.tables: dict[int, W.BlockTable] = {}

    def table(self, mode: int) -> W.BlockTable:
        t = self.tables.get(mode)
        if t is None:
            t = self.tables[mode] = W.BlockTable()
        return t

    def build(self, ip: int, mode: int) -> None:
        """Add the table block starting at ``ip``."""
        table = self.table(mode)
        ips: list[int] = []
        at = ip
        while True:
            insn = self.cache.get(at, mode)
            stop = isinstance(insn, int) or insn.truncated or insn.special == Special.JMPABS
            if not stop and insn.iclass in _PLAIN and len(ips) < _MAX_TABLE_BLOCK:
                ips.append(at)
                at = insn.next_ip
                continue
            if stop or len(ips) >= _MAX_TABLE_BLOCK:
                table.add(ip, W.BK_STOP if not ips else W.BK_FALL, at, 0, ips)
                return
            break
        c = insn.iclass
        nxt = insn.next_ip
        target = (nxt + insn.displacement) & 0xFFFFFFFFFFFFFFFF if insn.is_direct else 0
        if c == IClass.COND_JUMP:
            kind = W.BK_COND
        elif c == IClass.JUMP:
            kind = W.BK_JUMP if insn.is_direct else W.BK_IJUMP
        elif c == IClass.CALL:
            if insn.is_direct:
                # A call to the next instruction reads the IP; it pushes nothing.
                kind = W.BK_JUMP if insn.displacement == 0 else W.BK_CALL
            else:
                kind = W.BK_ICALL
        elif c == IClass.RETURN:
            kind = W.BK_RET
        else:
            # Far transfers and the like: the slow path takes them.
            if ips:
                table.add(ip, W.BK_FALL, insn.ip, 0, ips)
            else:
                table.add(ip, W.BK_STOP, ip, 0, [])
            return
        ips.append(at)
        table.add(ip, kind, nxt, target, ips)


# --------------------------------------------------------------------------
# Decoding one chunk.


class FlowSink:
    """Where decoding appends: block columns, events and gaps.

    The compiled walk writes straight into the current column chunk, so a
    block costs no Python work; full chunks are kept (``keep``) or only
    counted, for decoding that wants totals and events but not every block.
    """

    CHUNK = 1 << 20
    COUNT_CHUNK = 1 << 16

    def __init__(self, keep: bool = True) -> None:
        self.keep = keep
        self.done: list[tuple[np.ndarray, ...]] = []
        self.counted_insn = 0
        self.counted_blocks = 0
        self.events: list[tuple[int, Event]] = []
        self.gaps: list[Gap] = []
        # (first block, image index) wherever the image changed (from 0).
        self.image_runs: list[tuple[int, int]] = []
        self.image = 0
        self._fresh()

    def set_image(self, index: int) -> None:
        """The blocks from now on run in image ``index``."""
        if index != self.image:
            self.image_runs.append((self.n_total(), index))
            self.image = index

    def _fresh(self) -> None:
        # Counting reuses one cache-sized chunk; keeping fills large ones.
        cap = self.CHUNK if self.keep else self.COUNT_CHUNK
        self.n = 0
        self.ip = np.empty(cap, np.uint64)
        self.ninsn = np.empty(cap, np.uint32)
        self.time = np.empty(cap, np.uint64)
        self.offset = np.empty(cap, np.int64)
        self.mode = np.empty(cap, np.uint8)

    def full(self) -> None:
        """The current chunk is full: keep or count it and start another."""
        if self.keep:
            self.done.append(self.columns_current())
            self._fresh()
        else:
            self.counted_insn += int(self.ninsn[: self.n].sum(dtype=np.uint64))
            self.counted_blocks += self.n
            self.n = 0

    def append(self, ip: int, ninsn: int, time: int, offset: int, mode: int) -> None:
        if self.n == self.ip.shape[0]:
            self.full()
        i = self.n
        self.ip[i], self.ninsn[i], self.time[i], self.offset[i] = ip, ninsn, time, offset
        self.mode[i] = mode
        self.n = i + 1

    def columns_current(self) -> tuple[np.ndarray, ...]:
        n = self.n
        return self.ip[:n], self.ninsn[:n], self.time[:n], self.offset[:n], self.mode[:n]

    def n_total(self) -> int:
        """Blocks appended so far (kept or counted)."""
        return self.counted_blocks + sum(len(d[0]) for d in self.done) + self.n

    def columns(self) -> tuple[np.ndarray, ...]:
        if not self.keep:
            self.full()
        if not self.done:
            return self.columns_current()
        parts = [*self.done, self.columns_current()]
        return tuple(np.concatenate(c) for c in zip(*parts, strict=True))


@dataclass
class DecodeOptions:
    """What the library decoder is told beyond the PT configuration."""

    flags: BlockFlags = field(default_factory=BlockFlags)
    addr_filter: AddrFilter = field(default_factory=AddrFilter)
    events: EventOptions = field(default_factory=EventOptions)
    fast: bool = True  # use the compiled walk where the state allows


class ImageRegistry:
    """The images one decoding used, numbered in order of first use (shared
    by the threads of a parallel decoding, so the numbers agree)."""

    def __init__(self) -> None:
        self.images: list = []
        self._lock = threading.Lock()

    def index(self, image) -> int:
        with self._lock:
            for i, known in enumerate(self.images):
                if known is image:
                    return i
            self.images.append(image)
            return len(self.images) - 1


class SegmentWalker:
    """Decodes byte ranges of one trace into blocks, events and gaps."""

    def __init__(
        self,
        image,
        config: PtConfig,
        options: DecodeOptions | None = None,
        context: Context | None = None,
        images: ImageRegistry | None = None,
    ) -> None:
        self.image = image
        self.config = config
        self.options = options or DecodeOptions()
        self.code = CodeTables(image.read)
        self._context = context
        self.images = images or ImageRegistry()
        self._image_index = self.images.index(image)
        # id(image) -> (image, its code tables, its index in the registry)
        self._codes: dict[int, tuple[object, CodeTables, int]] = {
            id(image): (image, self.code, self._image_index)
        }
        self._su = np.zeros(W.U_SIZE, np.uint64)
        self._si = np.zeros(W.S_SIZE, np.int64)
        self._rs = np.zeros(W.RETSTACK_SIZE, np.uint64)
        opts = self.options
        self._fast = (
            opts.fast
            and not opts.flags.tick_events
            and not opts.flags.end_on_call
            and not opts.flags.end_on_jump
            and "bdm64" not in config.errata
        )

    def section_of(self, ip: int) -> int:
        return id(self.image.find(ip))

    def decode(self, buf: np.ndarray, start: int, end: int, sink: FlowSink) -> None:
        """Decode ``buf[start:end]`` segment by segment (a segment runs from a
        PSB to the first error), resynchronising after every error."""
        gaps = sink.gaps
        sink.set_image(self._image_index)
        errata = packet_errata(self.config)
        pos, last_sync, sync_progress = start, -1, -1
        while pos < end:
            first = pos + 16 if pos == last_sync else pos
            off = int(_sync_forward_kernel(buf, first, start, end)) if first < end else -1
            if off < 0:
                break
            last_sync = off
            seg = decode_range(buf, off, end, resync=False, errata=errata)
            end_error = PtError.EOS
            if len(seg.err_code):
                end_error = {
                    int(DecodeError.BAD_OPCODE): PtError.BAD_OPC,
                    int(DecodeError.BAD_PACKET): PtError.BAD_PACKET,
                }.get(int(seg.err_code[0]), PtError.EOS)
            evdec = EventDecoder(seg, self.config, self.options.events, end_error)
            blk = BlockDecoder(
                evdec,
                self.code.cache,
                self.config,
                self.options.flags,
                self.options.addr_filter,
                self.section_of,
            )
            try:
                status = blk.start()
            except DecodeFailure as exc:
                if exc.code == PtError.EOS:
                    break
                gaps.append(Gap(evdec.offset(), 0, 0, "sync error: " + errstr(exc.code), exc.code))
                new = evdec.next_position()
                if new <= sync_progress:
                    break
                sync_progress = pos = new
                continue
            offs = np.append(seg.offset, seg.offset[-1] + seg.size[-1] if len(seg) else off)
            error = self._run(seg, offs, evdec, blk, status, sink)
            if error is None:
                break
            code, block = error
            gaps.append(Gap(evdec.offset(), _error_ip(block, code), blk.tsc, errstr(code), code))
            pos = _resume_offset(seg, evdec.pos, off)

    def _run(self, seg, offs, evdec, blk, status, sink: FlowSink):
        """Decode one segment; None at its end, else (error code, block)."""
        block = Block()
        offset = evdec.offset()
        while True:
            try:
                while status & EVENT_PENDING:
                    offset = evdec.offset()
                    status, ev = blk.next_event()
                    if ev.type == Ev.ENABLED and self._context is not None:
                        self._enter(blk, ev, sink)
                    if not ev.status_update:
                        # Where the event happened in the flow: before block
                        # number ``block`` (counted within this sink).
                        ev.block = sink.n_total()
                        sink.events.append((offset, ev))
                if status & EOS:
                    return None
                if self._fast and self._plain(blk):
                    got = self._walk(seg, offs, evdec, blk, sink)
                    if got is not None:
                        status = got
                        continue
                offset = evdec.offset()
                block = Block()
                status = blk.next_block(block)
            except DecodeFailure as exc:
                if block.ninsn:
                    sink.append(block.ip, block.ninsn, blk.tsc, offset, block.mode)
                return exc.code, block
            if block.ninsn:
                sink.append(block.ip, block.ninsn, blk.tsc, offset, block.mode)
            block = Block()

    def _enter(self, blk: BlockDecoder, ev: Event, sink: FlowSink) -> None:
        """Tracing (re)enabled: the thread, so the image, may have changed."""
        image = self._context(ev.tsc if ev.has_tsc else None, ev.ip)
        if image is None or image is self.image:
            return
        kept = self._codes.get(id(image))
        if kept is None:
            kept = (image, CodeTables(image.read), self.images.index(image))
            self._codes[id(image)] = kept
        self.image, self.code, self._image_index = kept
        blk.cache = self.code.cache
        sink.set_image(self._image_index)

    def code_caches(self) -> list[tuple[int, InsnCache]]:
        """(image index, instruction cache) of every image decoded."""
        return [(index, code.cache) for _, code, index in self._codes.values()]

    @staticmethod
    def _plain(blk: BlockDecoder) -> bool:
        ev = blk.event
        if blk.status is not None or not blk.enabled or blk.process_insn:
            return False
        if blk.evdec.queue.entries:
            return False
        if ev.type == Ev.TNT:
            # bound: a deferred TIP was read ahead of these bits (its packet
            # is behind the decoder, not ahead of it).
            return ev.size > 0 and not blk.evdec.bound
        return ev.type == Ev.TIP and not ev.ip_suppressed and blk.evdec.bound

    def _walk(self, seg, offs, evdec: EventDecoder, blk: BlockDecoder, sink: FlowSink):
        """Run the compiled walk from the decoders' state and hand it back.
        Returns the status, or None when the next block needs the
        interpreted decoder."""
        su, si, rs = self._su, self._si, self._rs
        ev = blk.event
        su[W.U_IP] = blk.ip
        su[W.U_LAST_IP] = evdec.last_ip
        su[W.U_TSC] = blk.tsc
        si[W.S_HAS_TSC] = blk.has_tsc
        si[W.S_ICNT] = blk.icnt
        si[W.S_HAS_ICNT] = blk.has_icnt
        si[W.S_POS] = evdec.pos
        su[W.U_EV_TSC] = ev.tsc
        si[W.S_EV_HAS_TSC] = ev.has_tsc
        if ev.type == Ev.TNT:
            si[W.S_EVT] = W.EV_TNT
            su[W.U_TNT_BITS] = ev.bits
            si[W.S_TNT_SIZE] = ev.size
        else:
            si[W.S_EVT] = W.EV_TIP
            su[W.U_TIP] = ev.ip
        stack = blk.retstack
        depth = len(stack)
        rs[:depth] = stack
        si[W.S_RS_TOP] = (depth - 1) % W.RETSTACK_SIZE
        si[W.S_RS_N] = depth
        si[W.S_CBR] = -1
        # PSB+ in the compiled walk only where nothing about it can differ.
        psb_bits = -1
        if evdec.mode_exec_valid and not self.options.events.iflags:
            if "bdm70" not in self.config.errata:
                psb_bits = (evdec.csd << 1) | evdec.csl
        table = self.code.table(blk.mode)
        tb = evdec.times
        while True:
            si[W.S_NOUT] = sink.n
            r = W.walk(
                seg.kind, seg.a, seg.b, tb.tsc, tb.have_tsc, offs, blk.mode, psb_bits,
                table.keys, table.slots, table.ip, table.ninsn, table.kind, table.next_ip,
                table.target, table.first, table.insn, rs, su, si, sink.ip, sink.ninsn, sink.time, sink.offset, sink.mode,
            )  # fmt: skip
            sink.n = int(si[W.S_NOUT])
            if r == W.R_MISS:
                self.code.build(int(su[W.U_IP]), blk.mode)
                table = self.code.table(blk.mode)
                continue
            if r == W.R_FULL:
                sink.full()
                continue
            break
        # Hand the state back.
        blk.ip = int(su[W.U_IP])
        depth = int(si[W.S_RS_N])
        top = int(si[W.S_RS_TOP])
        blk.retstack = np.roll(rs, W.RETSTACK_SIZE - 1 - top)[W.RETSTACK_SIZE - depth :].tolist()
        blk.tsc, blk.has_tsc = int(su[W.U_TSC]), bool(si[W.S_HAS_TSC])
        blk.icnt, blk.has_icnt = int(si[W.S_ICNT]), bool(si[W.S_HAS_ICNT])
        last_ip = int(su[W.U_LAST_IP])
        if last_ip != evdec.last_ip:
            evdec.last_ip, evdec.have_ip, evdec.ip_suppressed = last_ip, True, False
        if si[W.S_CBR] >= 0:
            blk.cbr = int(si[W.S_CBR])
        evdec.pos = int(si[W.S_POS])
        if r == W.R_FETCH:
            evdec.bound = False
            try:
                blk.event = evdec.next()
                blk.status = None
            except DecodeFailure as exc:
                blk.status = exc.code
                blk.event = Event(Ev.IGNORE)
            return blk._trailing(None)
        cur = Event(Ev.TNT if si[W.S_EVT] == W.EV_TNT else Ev.TIP)
        cur.tsc, cur.has_tsc = int(su[W.U_EV_TSC]), bool(si[W.S_EV_HAS_TSC])
        if cur.type == Ev.TNT:
            cur.bits, cur.size = int(su[W.U_TNT_BITS]), int(si[W.S_TNT_SIZE])
            evdec.bound = False
        else:
            cur.ip = int(su[W.U_TIP])
            evdec.bound = True
        blk.event = cur
        return None


def _resume_offset(seg, pos: int, sync: int) -> int:
    """Where to look for the next PSB after an error at packet ``pos``.

    Unlike ptxed, nothing after the gap may be lost: the failing packet has
    not been used, and when the error came while taking a PSB+ (walking to
    the address it names), that PSB+ starts good trace of its own.
    """
    kinds = seg.kind[: pos + 1]
    psbs = np.flatnonzero(kinds == Kind.PSB)
    if len(psbs):
        last = int(psbs[-1])
        ends = np.flatnonzero(seg.kind[last:] == Kind.PSBEND)
        inside = not len(ends) or pos <= last + int(ends[0])
        if inside and int(seg.offset[last]) > sync:
            return int(seg.offset[last])
    n = len(seg)
    return int(seg.offset[pos]) if pos < n else int(seg.offset[-1] + seg.size[-1]) if n else sync


def _error_ip(block: Block, code: PtError) -> int:
    """Where ptxed reports an error: after the block's last instruction."""
    if not block.ninsn:
        return block.ip
    last = block.insns[-1]
    if code in (PtError.NOMAP, PtError.BAD_INSN):
        ip = last.next_ip
        if last.is_direct:
            ip = (ip + last.displacement) & 0xFFFFFFFFFFFFFFFF
        return ip
    return last.ip


# --------------------------------------------------------------------------
# Chunks and the public entry points.


def _chunk_ranges(buf: np.ndarray, chunk_bytes: int) -> list[tuple[int, int]]:
    """PSB-aligned ranges; each but the last extends over the next chunk's
    PSB+ so the flow up to the next chunk's start IP is decoded once."""
    from .packets import psb_chunks

    ranges = psb_chunks(buf, chunk_bytes)
    out = []
    for i, (s, e) in enumerate(ranges):
        if i + 1 < len(ranges):
            e = _psb_plus_end(buf, e)
        out.append((s, e))
    return out


def _psb_plus_end(buf: np.ndarray, psb: int) -> int:
    """The offset just after the PSBEND of the PSB+ at ``psb``."""
    end = buf.shape[0]
    span = 4096
    while True:
        table = decode_range(buf, psb, min(end, psb + span), resync=False)
        hit = np.flatnonzero(table.kind == Kind.PSBEND)
        if len(hit):
            i = int(hit[0])
            return int(table.offset[i] + table.size[i])
        if psb + span >= end or len(table.err_code):
            return psb
        span *= 4


def _as_buffer(data) -> np.ndarray:
    if isinstance(data, (str, os.PathLike)):
        return map_file(data)
    return as_buffer(data)


def _result(sinks: list[FlowSink], walkers: list[SegmentWalker]) -> FlowResult:
    if len(sinks) == 1:
        cols = sinks[0].columns()
    else:
        cols = tuple(np.concatenate(c) for c in zip(*(k.columns() for k in sinks), strict=True))
    caches = [entry for w in walkers for entry in w.code_caches()]
    res = FlowResult(*cols, successors=_successors(caches), images=walkers[0].images.images)
    base = 0
    runs: list[tuple[int, int]] = []
    for k in sinks:
        if base:
            for _, ev in k.events:
                ev.block += base
        runs += [(base, 0)] + [(base + b, i) for b, i in k.image_runs]
        base += k.n_total()
    if sinks[0].keep and any(i for _, i in runs):
        starts = np.array([b for b, _ in runs], np.int64)
        lengths = np.diff(starts, append=base)
        res.block_image = np.repeat(np.array([i for _, i in runs], np.uint16), lengths)
    res.events = [e for k in sinks for e in k.events]
    res.gaps = [g for k in sinks for g in k.gaps]
    if not sinks[0].keep:
        res.counted = (sum(k.counted_insn for k in sinks), sum(k.counted_blocks for k in sinks))
    return res


def decode_trace(
    data,
    image,
    config: PtConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    jobs: int = 1,
    chunk_bytes: int = 1 << 20,
    keep_blocks: bool = True,
    context: Context | None = None,
) -> FlowResult:
    """Decode a whole trace (bytes, numpy buffer or file path) against
    ``image``.  ``jobs`` > 1 decodes PSB-aligned chunks on that many threads
    (each with its own code cache) and merges them in order.  Without
    ``keep_blocks`` only the totals, events and gaps are kept.

    ``context(tsc, ip)``, when given, is asked at every enabling of tracing
    (a PSB+ with tracing on, TIP.PGE) for the image of the code running then
    (None: keep the current one): how sideband switches processes."""
    config = config or PtConfig()
    buf = _as_buffer(data)
    ranges = _chunk_ranges(buf, chunk_bytes)
    if jobs <= 1 or len(ranges) <= 1:
        walker = SegmentWalker(image, config, options, context)
        sink = FlowSink(keep_blocks)
        for s, e in ranges:
            walker.decode(buf, s, e, sink)
        return _result([sink], [walker])
    jobs = min(jobs, len(ranges))
    images = ImageRegistry()
    walkers = [SegmentWalker(image, config, options, context, images) for _ in range(jobs)]
    # Contiguous runs of chunks per thread keep each code cache warm.
    per = -(-len(ranges) // jobs)
    groups = [ranges[i * per : (i + 1) * per] for i in range(jobs)]

    def run(i: int) -> FlowSink:
        sink = FlowSink(keep_blocks)
        for s, e in groups[i]:
            walkers[i].decode(buf, s, e, sink)
        return sink

    with ThreadPoolExecutor(jobs) as pool:
        sinks = list(pool.map(run, range(jobs)))
    return _result(sinks, walkers)


def iter_flow(
    data,
    image,
    config: PtConfig | None = None,
    options: DecodeOptions | None = None,
    *,
    chunk_bytes: int = 1 << 20,
    context: Context | None = None,
) -> Iterator[FlowResult]:
    """Decode chunk by chunk, in order, with bounded memory."""
    config = config or PtConfig()
    buf = _as_buffer(data)
    walker = SegmentWalker(image, config, options, context)
    for s, e in _chunk_ranges(buf, chunk_bytes):
        sink = FlowSink()
        walker.decode(buf, s, e, sink)
        yield _result([sink], [walker])


__all__ = [
    "CodeTables",
    "DecodeOptions",
    "FlowResult",
    "FlowSink",
    "Gap",
    "SegmentWalker",
    "Symbolized",
    "decode_trace",
    "iter_flow",
]
