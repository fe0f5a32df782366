"""Intel ptxed's text, written by a compiled kernel from the flow decoder's
output (:class:`~hwtrace.pt.flowdec.FlowBatch`).

One line per instruction (its address; with disassembly unless
``--no-inst``) and one bracketed line per event, error and marker, exactly
as Intel's ``ptxed`` prints them.  The kernel writes many lines per call into
a byte buffer, so a large trace costs no Python work per instruction or per
event; Python only disassembles each distinct instruction once (iced-x86)
and writes the buffer out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numba as nb
import numpy as np

from . import _flowkernel as K
from .codetable import CodeTable, hash_find
from .errors import errstr
from .events import Ev
from .flowdec import FlowSink
from .ptdump import _dec, _hex, _row, _s, _string_table

# Option bits (PtxedStyle.bits).
S_QUIET, S_NO_INST, S_OFFSET, S_TIME, S_RAW, S_EV_TIME, S_EV_IP, S_SHOW_BLOCKS, S_STATS = (
    1 << i for i in range(9)
)

# Formatter state (int64) and its unsigned part.
F_ROW, F_DONE, F_EVENT, F_NBLOCKS, F_NINSN, F_SPEC, F_BLKOFF = range(7)
NF = 8
FU_TIME, FU_IP = range(2)
NFU = 2

LINE_MAX = 512  # no line is longer (raw bytes, disassembly, event text)

_ERR_TAB, _ERR_LEN = _string_table({i: errstr(i) for i in range(32)}, 32)
_KIND_TAB, _KIND_LEN = _string_table(
    {K.ERR_DECODE: "error", K.ERR_SYNC: "sync error", K.ERR_RESYNC: "resync error"}, 4
)
_NAME_TAB, _NAME_LEN = _string_table({int(e): f"event {e.name.lower()}" for e in Ev}, 64)


@dataclass
class PtxedStyle:
    """What ptxed's options say about the text."""

    quiet: bool = False
    no_inst: bool = False
    offset: bool = False
    time: bool = False
    raw_insn: bool = False
    event_time: bool = False
    event_ip: bool = False
    show_blocks: bool = False
    stats: bool = False

    @property
    def bits(self) -> int:
        flags = (
            self.quiet, self.no_inst, self.offset, self.time, self.raw_insn, self.event_time,
            self.event_ip, self.show_blocks, self.stats,
        )  # fmt: skip
        return sum(1 << i for i, on in enumerate(flags) if on)


@nb.njit(cache=True, inline="always")
def _ipx(out, p, row, ev_ip):
    """ptxed's ``, ip: %016x`` when asked for and the IP is known."""
    if ev_ip and not (row[K.E_FLAGS] & K.F_SUPP):
        p = _s(out, p, ", ip: ")
        p = _hex(out, p, row[K.E_IP], 16)
    return p


@nb.njit(cache=True)
def _event(out, p, row, offset, style):
    """One event line (ptxed's print_event)."""
    ev_ip = (style & S_EV_IP) != 0
    t = row[K.E_TYPE]
    supp = (row[K.E_FLAGS] & K.F_SUPP) != 0
    out[p] = 91  # [
    p += 1
    if style & S_OFFSET:
        p = _hex(out, p, offset, 16)
        p = _s(out, p, "  ")
    if style & S_EV_TIME and row[K.E_FLAGS] & K.F_HAS_TSC:
        p = _hex(out, p, row[K.E_TSC], 16)
        p = _s(out, p, "  ")
    if t == K.EV_ENABLED:
        if row[K.E_FLAGS] & K.F_RESUMED:
            p = _s(out, p, "resumed")
        else:
            p = _s(out, p, "enabled")
        if ev_ip:
            p = _s(out, p, ", ip: ")
            p = _hex(out, p, row[K.E_IP], 16)
    elif t == K.EV_DISABLED:
        p = _s(out, p, "disabled")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_ASYNC_DISABLED:
        p = _s(out, p, "disabled")
        if ev_ip:
            p = _s(out, p, ", at: ")
            p = _hex(out, p, row[K.E_AT], 16)
            if not supp:
                p = _s(out, p, ", ip: ")
                p = _hex(out, p, row[K.E_IP], 16)
    elif t == K.EV_ASYNC_BRANCH:
        p = _s(out, p, "interrupt")
        if ev_ip:
            p = _s(out, p, ", from: ")
            p = _hex(out, p, row[K.E_AT], 16)
            if not supp:
                p = _s(out, p, ", to: ")
                p = _hex(out, p, row[K.E_IP], 16)
    elif t == K.EV_PAGING or t == K.EV_ASYNC_PAGING:
        p = _s(out, p, "paging, cr3: ")
        p = _hex(out, p, row[K.E_CR3], 16)
        if row[K.E_NR]:
            p = _s(out, p, ", nr")
        if t == K.EV_ASYNC_PAGING and ev_ip:
            p = _s(out, p, ", ip: ")
            p = _hex(out, p, row[K.E_IP], 16)
    elif t == K.EV_OVERFLOW:
        p = _s(out, p, "overflow")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_EXEC_MODE:
        p = _s(out, p, "exec mode: ")
        m = row[K.E_MODE]
        if m == 16:
            p = _s(out, p, "16-bit")
        elif m == 32:
            p = _s(out, p, "32-bit")
        elif m == 64:
            p = _s(out, p, "64-bit")
        else:
            p = _s(out, p, "<unknown>")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_TSX:
        if row[K.E_ABORTED]:
            p = _s(out, p, "aborted")
        elif row[K.E_SPEC]:
            p = _s(out, p, "begin transaction")
        else:
            p = _s(out, p, "committed")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_STOP:
        p = _s(out, p, "stopped")
    elif t == K.EV_VMCS or t == K.EV_ASYNC_VMCS:
        p = _s(out, p, "vmcs, base: ")
        p = _hex(out, p, row[K.E_BASE], 16)
        if t == K.EV_ASYNC_VMCS and ev_ip:
            p = _s(out, p, ", ip: ")
            p = _hex(out, p, row[K.E_IP], 16)
    elif t == K.EV_EXSTOP:
        p = _s(out, p, "exstop")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_MWAIT:
        p = _s(out, p, "mwait ")
        p = _hex(out, p, row[K.E_HINTS], 0)
        p = _s(out, p, " ")
        p = _hex(out, p, row[K.E_EXT], 0)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_PWRE:
        p = _s(out, p, "pwre c")
        p = _dec(out, p, (row[K.E_STATE] + np.uint64(1)) & np.uint64(0xF))
        p = _s(out, p, ".")
        p = _dec(out, p, (row[K.E_SUBSTATE] + np.uint64(1)) & np.uint64(0xF))
        if row[K.E_HW]:
            p = _s(out, p, " hw")
    elif t == K.EV_PWRX:
        p = _s(out, p, "pwrx ")
        if row[K.E_WAKE_INT]:
            p = _s(out, p, "int: ")
        if row[K.E_WAKE_ST]:
            p = _s(out, p, "st: ")
        if row[K.E_WAKE_HW]:
            p = _s(out, p, "hw: ")
        p = _s(out, p, "c")
        p = _dec(out, p, (row[K.E_LAST] + np.uint64(1)) & np.uint64(0xF))
        p = _s(out, p, " (c")
        p = _dec(out, p, (row[K.E_DEEPEST] + np.uint64(1)) & np.uint64(0xF))
        p = _s(out, p, ")")
    elif t == K.EV_PTWRITE:
        p = _s(out, p, "ptwrite: ")
        p = _hex(out, p, row[K.E_PAYLOAD], 0)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_TICK:
        p = _s(out, p, "tick")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_CBR:
        p = _s(out, p, "cbr: ")
        p = _hex(out, p, row[K.E_RATIO], 0)
    elif t == K.EV_MNT:
        p = _s(out, p, "mnt: ")
        p = _hex(out, p, row[K.E_PAYLOAD], 0)
    elif t == K.EV_IFLAGS:
        p = _s(out, p, "interrupts ")
        if row[K.E_IFLAG]:
            p = _s(out, p, "enabled")
        else:
            p = _s(out, p, "disabled")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_INTERRUPT:
        p = _s(out, p, "interrupt ")
        p = _dec(out, p, row[K.E_VECTOR])
        if row[K.E_HAS_CR2]:
            p = _s(out, p, ", cr2: ")
            p = _hex(out, p, row[K.E_CR2], 16)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_IRET:
        p = _s(out, p, "iret")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_SMI:
        p = _s(out, p, "smi")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_RSM:
        p = _s(out, p, "rsm")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_SIPI:
        p = _s(out, p, "sipi: ")
        p = _hex(out, p, row[K.E_VECTOR], 0)
    elif t == K.EV_INIT:
        p = _s(out, p, "init")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_VMENTRY:
        p = _s(out, p, "vmentry")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_VMEXIT:
        p = _s(out, p, "vmexit")
        if row[K.E_HAS_VECTOR]:
            p = _s(out, p, ", intr: ")
            p = _dec(out, p, row[K.E_VECTOR])
        if row[K.E_HAS_VMXR]:
            p = _s(out, p, ", vmxr: ")
            p = _hex(out, p, row[K.E_VMXR], 16)
        if row[K.E_HAS_VMXQ]:
            p = _s(out, p, ", vmxq: ")
            p = _hex(out, p, row[K.E_VMXQ], 16)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_SHUTDOWN:
        p = _s(out, p, "shutdown")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_UINTR:
        p = _s(out, p, "uintr ")
        p = _dec(out, p, row[K.E_VECTOR])
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_UIRET:
        p = _s(out, p, "uiret")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_SWINTR:
        p = _s(out, p, "swintr ")
        p = _dec(out, p, row[K.E_VECTOR])
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_SYSCALL:
        p = _s(out, p, "syscall")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_TRIG:
        p = _s(out, p, "trig ")
        p = _hex(out, p, row[K.E_TRBV], 2)
        if row[K.E_MULT]:
            p = _s(out, p, ", mult")
        p = _ipx(out, p, row, ev_ip)
        if row[K.E_ICNT]:
            p = _s(out, p, ", icnt: ")
            p = _dec(out, p, row[K.E_ICNT])
    else:
        p = _row(out, p, _NAME_TAB, _NAME_LEN, t)
    out[p] = 93  # ]
    out[p + 1] = 10
    return p + 2


@nb.njit(cache=True)
def _marker(out, p, row, offset, style):
    """An error, or one of ptxed's own lines; -1 when nothing is printed."""
    t = row[K.E_TYPE]
    if t == K.X_ERROR:
        out[p] = 91
        p = _hex(out, p + 1, offset, 0)
        p = _s(out, p, ", ")
        p = _hex(out, p, row[K.E_IP], 0)
        p = _s(out, p, ": ")
        p = _row(out, p, _KIND_TAB, _KIND_LEN, row[K.E_P1])
        p = _s(out, p, ": ")
        p = _row(out, p, _ERR_TAB, _ERR_LEN, min(row[K.E_P0], np.uint64(31)))
        return _s(out, p, "]\n")
    if style & S_QUIET:
        return p
    if t == K.X_END:
        return _s(out, p, "[end of trace]\n")
    return _s(out, p, "[disabled]\n")  # X_RESYNC_DISABLED


@nb.njit(cache=True)
def format_batch(
    b_ip, b_ninsn, b_flags, b_mode, b_offset, ev_rows, ev_off, ev_blk, ct, t_bytes, t_off,
    style, st, stu, out,
):  # fmt: skip
    """Write the batch's lines into ``out`` from where ``st`` says; returns
    the bytes written.  ``st[F_ROW] == len(b_ip) + 1`` when the batch is
    done; otherwise call again with an emptied buffer."""
    h_ip, h_mode, h_val, i_ip, i_size, i_class, i_flags, i_target, i_raw = (
        ct[0], ct[1], ct[2], ct[3], ct[4], ct[5], ct[7], ct[8], ct[11]
    )  # fmt: skip
    quiet = (style & S_QUIET) != 0
    no_inst = (style & S_NO_INST) != 0
    raw = (style & S_RAW) != 0
    cap = out.shape[0] - LINE_MAX
    nrows = b_ip.shape[0]
    nev = ev_blk.shape[0]
    p = 0
    i = st[F_ROW]
    j = st[F_EVENT]
    while i <= nrows:
        # The events before block row i (after the last row: all the rest,
        # which also places events among rows that were only counted).
        while j < nev and (ev_blk[j] <= i or i == nrows):
            if p >= cap:
                st[F_ROW] = i
                st[F_EVENT] = j
                return p
            row = ev_rows[j]
            t = row[K.E_TYPE]
            if t >= K.X_ERROR:
                p = _marker(out, p, row, ev_off[j], style)
            else:
                stu[FU_TIME] = row[K.E_TSC]
                if not quiet and not (row[K.E_FLAGS] & K.F_STATUS):
                    p = _event(out, p, row, ev_off[j], style)
            j += 1
        if i == nrows:
            i += 1
            break
        n = np.int64(b_ninsn[i])
        done = st[F_DONE]
        if done == 0:
            if b_flags[i] & K.O_NEW:
                st[F_NBLOCKS] += 1
                st[F_BLKOFF] = b_offset[i]
                st[F_SPEC] = 1 if b_flags[i] & K.O_SPEC else 0
                if not quiet and style & S_SHOW_BLOCKS:
                    if p >= cap:
                        st[F_ROW] = i
                        st[F_EVENT] = j
                        return p
                    if style & S_STATS:
                        p = _s(out, p, "[block ")
                        p = _hex(out, p, st[F_NBLOCKS], 0)
                        p = _s(out, p, "]\n")
                    else:
                        p = _s(out, p, "[block]\n")
            st[F_NINSN] += n
            stu[FU_IP] = b_ip[i]
        if quiet:
            i += 1
            continue
        ip = stu[FU_IP]
        mode = b_mode[i]
        while done < n:
            if p >= cap:
                st[F_ROW] = i
                st[F_EVENT] = j
                st[F_DONE] = done
                stu[FU_IP] = ip
                return p
            k = hash_find(h_ip, h_mode, h_val, ip, mode)
            if style & S_OFFSET:
                p = _hex(out, p, st[F_BLKOFF], 16)
                p = _s(out, p, "  ")
            if style & S_TIME:
                p = _hex(out, p, stu[FU_TIME], 16)
                p = _s(out, p, "  ")
            if st[F_SPEC]:
                p = _s(out, p, "? ")
            p = _hex(out, p, ip, 16)
            if not no_inst and k >= 0:
                if raw:
                    size = np.int64(i_size[k])
                    for q in range(size):
                        out[p] = 32
                        p = _hex(out, p + 1, i_raw[k, q], 2)
                    for _ in range(15 - size):
                        p = _s(out, p, "   ")
                out[p] = 32
                out[p + 1] = 32
                p += 2
                for q in range(t_off[k], t_off[k + 1]):
                    out[p] = t_bytes[q]
                    p += 1
            out[p] = 10
            p += 1
            done += 1
            if k < 0:
                break  # cannot happen: the decoder read every instruction it reports
            c = i_class[k]
            if i_flags[k] & 1 and (c == 2 or c == 4):  # a direct CALL or JUMP
                ip = i_target[k]
            else:
                ip = i_ip[k] + np.uint64(i_size[k])
        st[F_DONE] = 0
        i += 1
    st[F_ROW] = nrows + 1
    st[F_EVENT] = j
    return p


class TextTable:
    """Disassembly of a code table's instructions as one byte string with
    offsets, for the kernel (each instruction is formatted once)."""

    def __init__(self, att: bool) -> None:
        from ..isa.x86 import Formatter

        self.formatter = Formatter(att=att)
        self.table: CodeTable | None = None
        self.generation = -1
        self.chunks: list[bytes] = []
        self.offsets = [0]
        self.bytes = np.zeros(0, np.uint8)
        self.off = np.zeros(1, np.int64)

    def update(self, table: CodeTable) -> None:
        if table is not self.table or table.generation != self.generation:
            self.table, self.generation = table, table.generation
            self.chunks, self.offsets = [], [0]
        n = table.n_insns
        have = len(self.offsets) - 1
        if n == have:
            return
        for k in range(have, n):
            text = ""
            if not table.i_err[k]:
                insn = table.insn(k)
                if not isinstance(insn, int):
                    text = self.formatter.format(insn)
            data = text.encode()
            self.chunks.append(data)
            self.offsets.append(self.offsets[-1] + len(data))
        self.bytes = np.frombuffer(b"".join(self.chunks), np.uint8) if self.chunks else self.bytes
        self.off = np.array(self.offsets, np.int64)


@dataclass
class PtxedWriter(FlowSink):
    """Formats batches as ptxed text and hands the bytes to ``write``."""

    style: PtxedStyle
    write: object  # callable(bytes-like)
    att: bool = False
    buffer_size: int = 1 << 20
    state: np.ndarray = field(default_factory=lambda: np.zeros(NF, np.int64))
    ustate: np.ndarray = field(default_factory=lambda: np.zeros(NFU, np.uint64))

    def __post_init__(self) -> None:
        self.out = np.zeros(self.buffer_size + LINE_MAX, np.uint8)
        self.bits = self.style.bits
        self.texts = None if self.style.no_inst or self.style.quiet else TextTable(self.att)
        self._empty_bytes = np.zeros(1, np.uint8)
        self._empty_off = np.zeros(1, np.int64)
        self.n_insn = 0  # instructions and blocks seen (ptxed's --stat)
        self.n_blocks = 0

    def batch(self, b) -> None:
        self.n_insn += b.n_insn
        self.n_blocks += b.n_blocks
        if self.texts is not None:
            self.texts.update(b.table)
            t_bytes, t_off = self.texts.bytes, self.texts.off
            if not t_bytes.shape[0]:
                t_bytes = self._empty_bytes
        else:
            t_bytes, t_off = self._empty_bytes, self._empty_off
        st = self.state
        st[F_ROW] = 0
        st[F_EVENT] = 0
        st[F_DONE] = 0
        nrows = b.ip.shape[0]
        while st[F_ROW] <= nrows:
            n = format_batch(
                b.ip, b.ninsn, b.flags, b.mode, b.offset, b.events, b.event_offset,
                b.event_block, b.table.tuple, t_bytes, t_off, self.bits, st, self.ustate,
                self.out,
            )  # fmt: skip
            if n:
                self.write(self.out[:n])


__all__ = ["PtxedStyle", "PtxedWriter", "TextTable", "format_batch"]
