"""The library decoder's reference: Intel's decoders in plain Python.

:func:`decode_reference` decodes a whole trace with the interpreted event and
block decoders (:mod:`oracles.events`, :mod:`oracles.flow`) the way
:func:`hwtrace.pt.decode.decode_trace` does with the compiled decoder: same
segments, same resynchronisation after errors (at the failing packet, so
nothing after a gap is lost), same error address rule (Intel ptxed's), block
times taken when a block starts.  Tests hold the compiled decoder to it.
"""

from __future__ import annotations

import numpy as np

from hwtrace.image import Image
from hwtrace.pt import flowrows as K
from hwtrace.pt._loops import sync_forward as _sync_forward_loop
from hwtrace.pt.config import PtConfig
from hwtrace.pt.decode import DecodeOptions, FlowResult
from hwtrace.pt.errors import PtError, errstr
from hwtrace.pt.flowrows import Event, Gap
from hwtrace.pt.kinds import DecodeError, Kind
from hwtrace.pt.packets import as_buffer, decode_range, packet_errata
from oracles.events import DecodeFailure, EventDecoder
from oracles.flow import EOS, EVENT_PENDING, Block, BlockDecoder

_MASK64 = (1 << 64) - 1


def error_ip(block: Block, code: int) -> int:
    """Intel ptxed's rule: after the block's last instruction (its branch
    target when it has a displacement), except BAD_QUERY: the last one."""
    if not block.ninsn:
        return block.ip
    last = block.insns[-1]
    if code == PtError.BAD_QUERY:
        return last.ip
    ip = last.next_ip
    if last.is_direct:
        ip = (ip + last.displacement) & _MASK64
    return ip


def _resume_offset(seg, pos: int, sync: int) -> int:
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


def _row(ev: Event) -> np.ndarray:
    """An event as the compiled decoder's row (the fields tests compare)."""
    row = np.zeros(K.EW, np.uint64)
    row[K.E_TYPE] = int(ev.type)
    row[K.E_FLAGS] = (
        (K.F_SUPP if ev.ip_suppressed else 0)
        | (K.F_STATUS if ev.status_update else 0)
        | (K.F_HAS_TSC if ev.has_tsc else 0)
    )
    row[K.E_IP] = ev.ip & _MASK64
    row[K.E_AT] = ev.at & _MASK64
    row[K.E_TSC] = ev.tsc & _MASK64
    return row


def decode_reference(
    data, image: Image, config: PtConfig | None = None, options: DecodeOptions | None = None
) -> FlowResult:
    config = config or PtConfig()
    options = options or DecodeOptions()
    buf = as_buffer(data) if not isinstance(data, np.ndarray) else data
    end = buf.shape[0]
    from hwtrace.isa.x86 import InsnCache

    cache = InsnCache(image.read)
    blocks: list[tuple[int, int, int, int, int]] = []
    events: list[tuple[int, Event, int]] = []
    gaps: list[Gap] = []
    errata = packet_errata(config)
    pos, last_sync, sync_progress = 0, -1, -1
    while pos < end:
        first = pos + 16 if pos == last_sync else pos
        off = int(_sync_forward_loop(buf, first, 0, end)) if first < end else -1
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
        evdec = EventDecoder(seg, config, options.events, end_error)
        blk = BlockDecoder(
            evdec,
            cache,
            config,
            options.flags,
            options.addr_filter,
            lambda ip: id(image.find(ip)),
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
        block = Block()
        error = None
        while True:
            try:
                while status & EVENT_PENDING:
                    offset = evdec.offset()
                    status, ev = blk.next_event()
                    if not ev.status_update:
                        events.append((offset, ev, len(blocks)))
                if status & EOS:
                    break
                offset = evdec.offset()
                tsc = blk.tsc
                block = Block()
                try:
                    status = blk.next_block(block)
                finally:
                    if block.ninsn:
                        blocks.append((block.ip, block.ninsn, tsc, offset, block.mode))
            except DecodeFailure as exc:
                error = exc.code
                break
        if error is None or error == PtError.EOS:
            break
        gaps.append(Gap(evdec.offset(), error_ip(block, error), blk.tsc, errstr(error), error))
        pos = _resume_offset(seg, evdec.pos, off)
    cols = list(zip(*blocks, strict=True)) if blocks else [[], [], [], [], []]
    res = FlowResult(
        np.array(cols[0], np.uint64),
        np.array(cols[1], np.uint32),
        np.array(cols[2], np.uint64),
        np.array(cols[3], np.int64),
        np.array(cols[4], np.uint8),
        gaps=gaps,
    )
    res.event_rows = (
        np.array([_row(e) for _, e, _ in events]) if events else np.zeros((0, K.EW), np.uint64)
    )
    res.event_offset = np.array([o for o, _, _ in events], np.int64)
    res.event_block = np.array([b for _, _, b in events], np.int64)
    res.reference_cache = cache
    return res


def instructions(res: FlowResult) -> np.ndarray:
    """Every executed instruction of a reference result."""
    cache = res.reference_cache
    out = []
    for ip, n, mode in zip(res.block_ip, res.block_ninsn, res.block_mode, strict=True):
        ip = int(ip)
        for _ in range(int(n)):
            out.append(ip)
            insn = cache.get(ip, int(mode))
            nxt = insn.next_ip
            if insn.is_direct and int(insn.iclass) in (2, 4):  # CALL, JUMP
                nxt = (nxt + insn.displacement) & _MASK64
            ip = nxt
    return np.array(out, np.uint64)
