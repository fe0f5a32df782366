"""``hwtrace ptxed``'s reference path: Intel's decoders as plain Python
(:mod:`oracles.events`, :mod:`oracles.flow`), printed line by line.

:func:`decode_reference` takes the place of :func:`hwtrace.cli.ptxed.decode`
(``ptxed.main(argv, out, decoder=decode_reference)``): the tests hold the
compiled decoder and formatter to its output, byte for byte.
"""

from __future__ import annotations

from hwtrace.cli.ptxed import (
    Options,
    _print_stats,
    _Printer,
    _replays_block_cache,
    _sideband_notes,
)
from hwtrace.isa.x86 import Formatter, InsnCache
from hwtrace.pt.errors import PtError, errstr
from hwtrace.pt.flowrows import Ev
from hwtrace.pt.kinds import DecodeError
from hwtrace.pt.options import EventOptions
from hwtrace.pt.packets import decode_range, packet_errata, sync_forward
from oracles.events import DecodeFailure, EventDecoder
from oracles.flow import EOS, EVENT_PENDING, IP_SUPPRESSED, Block, BlockCache, BlockDecoder


def decode_reference(
    buf, image, config, flags, addr_filter, iflags, keep_tcal, opts, out, sideband=None
) -> None:
    """Decode and print as :func:`hwtrace.cli.ptxed.decode` does, with
    Intel's decoders as plain Python."""
    formatter = None if opts.no_inst else Formatter(att=opts.att)
    cache = InsnCache(image.read)

    def section_of(ip: int) -> int:
        # Blocks do not span sections; any identity of the section will do.
        return id(image.find(ip))

    def sideband_event(ev) -> None:
        # Records due by the event's time are printed and applied; the image
        # may change (a context switch, or sections mapped into it).
        nonlocal image, cache
        session, sb_flags = sideband
        ctx = session.event(ev, sb_flags, out.line)
        if session.notes:
            _sideband_notes(session)
        if ctx is not None:
            image = ctx.image
            if ctx.cache is None:
                ctx.cache = InsnCache(image.read)
            cache = ctx.cache
            blk.cache = cache

    end = buf.shape[0]
    errata = packet_errata(config)
    ev_opts = EventOptions(iflags=iflags, keep_tcal_on_ovf=keep_tcal)
    stats_insn = 0
    stats_blocks = 0
    # Lives as long as the sections: libipt keeps it across resyncs.
    bcache = BlockCache() if _replays_block_cache(opts) else None
    pos = 0
    last_sync = -1
    sync_progress = -1
    # The last block decoded (Intel's ptxed reports errors against it).
    block = Block()

    def diagnose(what: str, code: PtError) -> None:
        out.line(f"[{evdec.offset():x}, {block_error_ip(code):x}: {what}: {errstr(code)}]")

    def block_error_ip(code: PtError) -> int:
        # Errors refer to the instruction after the block, except a query
        # that does not match, which refers to the block's last one.
        if not block.ninsn:
            return block.ip
        last = block.insns[-1]
        if code == PtError.BAD_QUERY:
            return last.ip
        ip = last.next_ip
        if last.is_direct:
            ip = (ip + last.displacement) & 0xFFFFFFFFFFFFFFFF
        return ip

    def handle_one_event() -> int:
        offset = evdec.offset()
        status, ev = blk.next_event()
        if not opts.quiet and not ev.status_update:
            out.line(_event_text(ev, opts, offset))
        if sideband is not None:
            sideband_event(ev)
        return status

    def decode_one_block() -> int:
        nonlocal block, stats_insn, stats_blocks
        offset = evdec.offset()
        time = blk.time()  # Intel's ptxed: pt_blk_time before pt_blk_next
        block = Block()
        try:
            return blk.next_block(block)
        finally:
            # Counted and shown even when decoding it failed part way.
            stats_insn += block.ninsn
            stats_blocks += 1
            _print_block(block, opts, out, offset, time, stats_blocks, formatter)

    def resync_block() -> int:
        while True:
            try:
                status = blk.resync()
                break
            except DecodeFailure as exc:
                if exc.code != PtError.EVENT_IGNORED:
                    raise
            handle_one_event()
        if status & IP_SUPPRESSED and not opts.quiet:
            out.line("[disabled]")
        return status

    done = False
    while not done:
        start = pos + 16 if pos == last_sync else pos
        off = sync_forward(buf, start) if start < end else -1
        if off < 0:
            break
        seg = decode_range(buf, off, end, resync=False, errata=errata)
        end_error = PtError.EOS
        if len(seg.err_code):
            code = int(seg.err_code[0])
            end_error = {
                int(DecodeError.BAD_OPCODE): PtError.BAD_OPC,
                int(DecodeError.BAD_PACKET): PtError.BAD_PACKET,
            }.get(code, PtError.EOS)
        evdec = EventDecoder(seg, config, ev_opts, end_error)
        blk = BlockDecoder(evdec, cache, config, flags, addr_filter, section_of, bcache)
        last_sync = off
        block = Block()
        try:
            status = blk.start()
        except DecodeFailure as exc:
            if exc.code == PtError.EOS:
                break
            diagnose("sync error", exc.code)
            new = evdec.next_position()
            if new <= sync_progress:
                break
            sync_progress = new
            pos = new
            continue
        while True:
            try:
                while True:
                    while status & EVENT_PENDING:
                        status = handle_one_event()
                    if status & EOS:
                        if not (status & IP_SUPPRESSED) and not opts.quiet:
                            out.line("[end of trace]")
                        raise DecodeFailure(PtError.EOS)
                    status = decode_one_block()
            except DecodeFailure as exc:
                error = exc.code
            if error == PtError.EOS:
                done = True
                break
            diagnose("error", error)
            if not opts.resync_on_error:
                break
            try:
                status = resync_block()
            except DecodeFailure as exc:
                diagnose("resync error", exc.code)
                break
        pos = evdec.next_position()

    _print_stats(opts, stats_insn, stats_blocks, out)


def _print_block(
    block, opts: Options, out: _Printer, offset: int, time: int, count: int, formatter
) -> None:
    if opts.quiet:
        return
    if opts.show_blocks:
        out.line(f"[block {count:x}]" if opts.stats else "[block]")
    for insn in block.insns:
        text = ""
        if opts.offset:
            text += f"{offset:016x}  "
        if opts.time:
            text += f"{time:016x}  "
        if block.speculative:
            text += "? "
        text += f"{insn.ip:016x}"
        if formatter is not None:
            if opts.raw_insn:
                text += "".join(f" {b:02x}" for b in insn.raw) + "   " * (15 - len(insn.raw))
            text += "  " + formatter.format(insn)
        out.line(text)


def _event_text(ev, opts: Options, offset: int) -> str:
    parts = ["["]
    if opts.offset:
        parts.append(f"{offset:016x}  ")
    if opts.event_time and ev.has_tsc:
        parts.append(f"{ev.tsc:016x}  ")
    t = ev.type
    ip = opts.event_ip and not ev.ip_suppressed
    ipx = f", ip: {ev.ip:016x}" if ip else ""
    if t == Ev.ENABLED:
        body = "resumed" if ev.resumed else "enabled"
        if opts.event_ip:
            body += f", ip: {ev.ip:016x}"
    elif t == Ev.DISABLED:
        body = "disabled" + ipx
    elif t == Ev.ASYNC_DISABLED:
        body = "disabled"
        if opts.event_ip:
            body += f", at: {ev.at:016x}" + (f", ip: {ev.ip:016x}" if not ev.ip_suppressed else "")
    elif t == Ev.ASYNC_BRANCH:
        body = "interrupt"
        if opts.event_ip:
            body += f", from: {ev.at:016x}" + (
                f", to: {ev.ip:016x}" if not ev.ip_suppressed else ""
            )
    elif t in (Ev.PAGING, Ev.ASYNC_PAGING):
        body = f"paging, cr3: {ev.cr3:016x}" + (", nr" if ev.non_root else "")
        if t == Ev.ASYNC_PAGING and opts.event_ip:
            body += f", ip: {ev.ip:016x}"
    elif t == Ev.OVERFLOW:
        body = "overflow" + ipx
    elif t == Ev.EXEC_MODE:
        mode = {0: "<unknown>", 16: "16-bit", 32: "32-bit", 64: "64-bit"}[int(ev.mode)]
        body = f"exec mode: {mode}" + ipx
    elif t == Ev.TSX:
        body = "aborted" if ev.aborted else ("begin transaction" if ev.speculative else "committed")
        body += ipx
    elif t == Ev.STOP:
        body = "stopped"
    elif t in (Ev.VMCS, Ev.ASYNC_VMCS):
        body = f"vmcs, base: {ev.base:016x}"
        if t == Ev.ASYNC_VMCS and opts.event_ip:
            body += f", ip: {ev.ip:016x}"
    elif t == Ev.EXSTOP:
        body = "exstop" + ipx
    elif t == Ev.MWAIT:
        body = f"mwait {ev.hints:x} {ev.ext:x}" + ipx
    elif t == Ev.PWRE:
        body = f"pwre c{(ev.state + 1) & 0xF}.{(ev.sub_state + 1) & 0xF}" + (" hw" if ev.hw else "")
    elif t == Ev.PWRX:
        body = "pwrx "
        if ev.interrupt:
            body += "int: "
        if ev.store:
            body += "st: "
        if ev.autonomous:
            body += "hw: "
        body += f"c{(ev.last + 1) & 0xF} (c{(ev.deepest + 1) & 0xF})"
    elif t == Ev.PTWRITE:
        body = f"ptwrite: {ev.payload:x}" + ipx
    elif t == Ev.TICK:
        body = "tick" + ipx
    elif t == Ev.CBR:
        body = f"cbr: {ev.ratio:x}"
    elif t == Ev.MNT:
        body = f"mnt: {ev.payload:x}"
    elif t == Ev.IFLAGS:
        body = "interrupts " + ("enabled" if ev.iflag else "disabled") + ipx
    elif t == Ev.INTERRUPT:
        body = f"interrupt {ev.vector}"
        if ev.has_cr2:
            body += f", cr2: {ev.cr2:016x}"
        body += ipx
    elif t == Ev.IRET:
        body = "iret" + ipx
    elif t == Ev.SMI:
        body = "smi" + ipx
    elif t == Ev.RSM:
        body = "rsm" + ipx
    elif t == Ev.SIPI:
        body = f"sipi: {ev.vector:x}"
    elif t == Ev.INIT:
        body = "init" + ipx
    elif t == Ev.VMENTRY:
        body = "vmentry" + ipx
    elif t == Ev.VMEXIT:
        body = "vmexit"
        if ev.has_vector:
            body += f", intr: {ev.vector}"
        if ev.has_vmxr:
            body += f", vmxr: {ev.vmxr:016x}"
        if ev.has_vmxq:
            body += f", vmxq: {ev.vmxq:016x}"
        body += ipx
    elif t == Ev.SHUTDOWN:
        body = "shutdown" + ipx
    elif t == Ev.UINTR:
        body = f"uintr {ev.vector}" + ipx
    elif t == Ev.UIRET:
        body = "uiret" + ipx
    elif t == Ev.SWINTR:
        body = f"swintr {ev.vector}" + ipx
    elif t == Ev.SYSCALL:
        body = "syscall" + ipx
    elif t == Ev.TRIG:
        body = f"trig {ev.trbv:02x}" + (", mult" if ev.mult else "") + ipx
        if ev.icnt:
            body += f", icnt: {ev.icnt}"
    else:
        body = f"event {t.name.lower()}"
    parts.append(body)
    parts.append("]")
    return "".join(parts)
