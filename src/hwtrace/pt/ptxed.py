"""Intel ptxed's text, written by a compiled loop from the flow decoder's
output (:class:`~hwtrace.pt.flowdec.FlowBatch`).

One line per instruction (its address; with disassembly unless
``--no-inst``) and one bracketed line per event, error and marker, exactly
as Intel's ``ptxed`` prints them.  The loop writes many lines per call into
a byte buffer, so a large trace costs no Python work per instruction or per
event; Python only disassembles each distinct instruction once (iced-x86)
and writes the buffer out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import aot
from ..textout import (
    COPY_SLACK,
    put_dec,
    put_hex,
    put_row,
    put_slice,
    put_slice_over,
    put_text,
    string_table,
)
from . import _flowloop as K
from ._loops import c_state
from .codetable import CLASS_CALL, CLASS_JUMP, I_DIRECT, CodeTable, hash_find
from .errors import errstr
from .flowdec import FlowSink
from .flowrows import Ev
from .ptxedstyle import (
    S_EV_IP,
    S_EV_TIME,
    S_NO_INST,
    S_OFFSET,
    S_QUIET,
    S_RAW,
    S_SHOW_BLOCKS,
    S_STATS,
    S_TIME,
    PtxedStyle,
)

# Formatter state (int64) and its unsigned part.
F_ROW, F_DONE, F_EVENT, F_NBLOCKS, F_NINSN, F_SPEC, F_BLKOFF = range(7)
NF = 8
FU_TIME, FU_IP = range(2)
NFU = 2

LINE_MAX = 512  # no line is longer (raw bytes, disassembly, event text)

_ERR_TAB, _ERR_LEN = string_table({i: errstr(i) for i in range(32)}, 32)
_KIND_TAB, _KIND_LEN = string_table(
    {K.ERR_DECODE: "error", K.ERR_SYNC: "sync error", K.ERR_RESYNC: "resync error"}, 4
)
_NAME_TAB, _NAME_LEN = string_table({int(e): f"event {e.name.lower()}" for e in Ev}, 64)
# Events printed as a word, then (uintr, swintr) the vector, then the IP.
_WORD_TAB, _WORD_LEN = string_table(
    {
        K.EV_DISABLED: "disabled", K.EV_OVERFLOW: "overflow", K.EV_EXSTOP: "exstop",
        K.EV_TICK: "tick", K.EV_IRET: "iret", K.EV_SMI: "smi", K.EV_RSM: "rsm", K.EV_INIT: "init",
        K.EV_VMENTRY: "vmentry", K.EV_SHUTDOWN: "shutdown", K.EV_UINTR: "uintr ",
        K.EV_UIRET: "uiret", K.EV_SWINTR: "swintr ", K.EV_SYSCALL: "syscall",
    },
    64,
)  # fmt: skip
# Events printed as a label and one field in hex, then (ptwrite) the IP.
_VALUES = {
    K.EV_PTWRITE: ("ptwrite: ", K.E_PAYLOAD), K.EV_CBR: ("cbr: ", K.E_RATIO),
    K.EV_MNT: ("mnt: ", K.E_PAYLOAD), K.EV_SIPI: ("sipi: ", K.E_VECTOR),
}  # fmt: skip
_VALUE_TAB, _VALUE_LEN = string_table({t: label for t, (label, _) in _VALUES.items()}, 64)
_VALUE_FIELD = np.zeros(64, np.int64)
_VALUE_FIELD[list(_VALUES)] = [column for _, column in _VALUES.values()]


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_ip(out, p, row):
    """ptxed's ``, ip: %016x``."""
    p = put_text(out, p, ", ip: ")
    return put_hex(out, p, row[K.E_IP], 16)


@aot.njit(cache=True, inline="always", _nrt=False)
def _ipx(out, p, row, ev_ip):
    """ptxed's ``, ip: %016x`` when asked for and the IP is known."""
    if ev_ip and not (row[K.E_FLAGS] & K.F_SUPP):
        p = _put_ip(out, p, row)
    return p


@aot.njit(cache=True, _nrt=False)
def _event(out, p, row, offset, style):
    """One event line (ptxed's print_event)."""
    ev_ip = (style & S_EV_IP) != 0
    t = row[K.E_TYPE]
    supp = (row[K.E_FLAGS] & K.F_SUPP) != 0
    out[p] = 91  # [
    p += 1
    if style & S_OFFSET:
        p = put_hex(out, p, offset, 16)
        p = put_text(out, p, "  ")
    if style & S_EV_TIME and row[K.E_FLAGS] & K.F_HAS_TSC:
        p = put_hex(out, p, row[K.E_TSC], 16)
        p = put_text(out, p, "  ")
    if t < K.X_ERROR and _WORD_LEN[t]:
        p = put_row(out, p, _WORD_TAB, _WORD_LEN, t)
        if t == K.EV_UINTR or t == K.EV_SWINTR:
            p = put_dec(out, p, row[K.E_VECTOR])
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_ENABLED:
        if row[K.E_FLAGS] & K.F_RESUMED:
            p = put_text(out, p, "resumed")
        else:
            p = put_text(out, p, "enabled")
        if ev_ip:
            p = _put_ip(out, p, row)
    elif t == K.EV_ASYNC_DISABLED:
        p = put_text(out, p, "disabled")
        if ev_ip:
            p = put_text(out, p, ", at: ")
            p = put_hex(out, p, row[K.E_AT], 16)
            if not supp:
                p = _put_ip(out, p, row)
    elif t == K.EV_ASYNC_BRANCH:
        p = put_text(out, p, "interrupt")
        if ev_ip:
            p = put_text(out, p, ", from: ")
            p = put_hex(out, p, row[K.E_AT], 16)
            if not supp:
                p = put_text(out, p, ", to: ")
                p = put_hex(out, p, row[K.E_IP], 16)
    elif t == K.EV_PAGING or t == K.EV_ASYNC_PAGING:
        p = put_text(out, p, "paging, cr3: ")
        p = put_hex(out, p, row[K.E_CR3], 16)
        if row[K.E_NR]:
            p = put_text(out, p, ", nr")
        if t == K.EV_ASYNC_PAGING and ev_ip:
            p = _put_ip(out, p, row)
    elif t == K.EV_EXEC_MODE:
        p = put_text(out, p, "exec mode: ")
        m = row[K.E_MODE]
        if m == 16:
            p = put_text(out, p, "16-bit")
        elif m == 32:
            p = put_text(out, p, "32-bit")
        elif m == 64:
            p = put_text(out, p, "64-bit")
        else:
            p = put_text(out, p, "<unknown>")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_TSX:
        if row[K.E_ABORTED]:
            p = put_text(out, p, "aborted")
        elif row[K.E_SPEC]:
            p = put_text(out, p, "begin transaction")
        else:
            p = put_text(out, p, "committed")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_STOP:
        p = put_text(out, p, "stopped")
    elif t == K.EV_VMCS or t == K.EV_ASYNC_VMCS:
        p = put_text(out, p, "vmcs, base: ")
        p = put_hex(out, p, row[K.E_BASE], 16)
        if t == K.EV_ASYNC_VMCS and ev_ip:
            p = _put_ip(out, p, row)
    elif t == K.EV_MWAIT:
        p = put_text(out, p, "mwait ")
        p = put_hex(out, p, row[K.E_HINTS], 0)
        p = put_text(out, p, " ")
        p = put_hex(out, p, row[K.E_EXT], 0)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_PWRE:
        p = put_text(out, p, "pwre c")
        p = put_dec(out, p, c_state(row[K.E_STATE]))
        p = put_text(out, p, ".")
        p = put_dec(out, p, c_state(row[K.E_SUBSTATE]))
        if row[K.E_HW]:
            p = put_text(out, p, " hw")
    elif t == K.EV_PWRX:
        p = put_text(out, p, "pwrx ")
        if row[K.E_WAKE_INT]:
            p = put_text(out, p, "int: ")
        if row[K.E_WAKE_ST]:
            p = put_text(out, p, "st: ")
        if row[K.E_WAKE_HW]:
            p = put_text(out, p, "hw: ")
        p = put_text(out, p, "c")
        p = put_dec(out, p, c_state(row[K.E_LAST]))
        p = put_text(out, p, " (c")
        p = put_dec(out, p, c_state(row[K.E_DEEPEST]))
        p = put_text(out, p, ")")
    elif t < K.X_ERROR and _VALUE_LEN[t]:
        p = put_row(out, p, _VALUE_TAB, _VALUE_LEN, t)
        p = put_hex(out, p, row[_VALUE_FIELD[t]], 0)
        if t == K.EV_PTWRITE:
            p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_IFLAGS:
        p = put_text(out, p, "interrupts ")
        if row[K.E_IFLAG]:
            p = put_text(out, p, "enabled")
        else:
            p = put_text(out, p, "disabled")
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_INTERRUPT:
        p = put_text(out, p, "interrupt ")
        p = put_dec(out, p, row[K.E_VECTOR])
        if row[K.E_HAS_CR2]:
            p = put_text(out, p, ", cr2: ")
            p = put_hex(out, p, row[K.E_CR2], 16)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_VMEXIT:
        p = put_text(out, p, "vmexit")
        if row[K.E_HAS_VECTOR]:
            p = put_text(out, p, ", intr: ")
            p = put_dec(out, p, row[K.E_VECTOR])
        if row[K.E_HAS_VMXR]:
            p = put_text(out, p, ", vmxr: ")
            p = put_hex(out, p, row[K.E_VMXR], 16)
        if row[K.E_HAS_VMXQ]:
            p = put_text(out, p, ", vmxq: ")
            p = put_hex(out, p, row[K.E_VMXQ], 16)
        p = _ipx(out, p, row, ev_ip)
    elif t == K.EV_TRIG:
        p = put_text(out, p, "trig ")
        p = put_hex(out, p, row[K.E_TRBV], 2)
        if row[K.E_MULT]:
            p = put_text(out, p, ", mult")
        p = _ipx(out, p, row, ev_ip)
        if row[K.E_ICNT]:
            p = put_text(out, p, ", icnt: ")
            p = put_dec(out, p, row[K.E_ICNT])
    else:
        p = put_row(out, p, _NAME_TAB, _NAME_LEN, t)
    out[p] = 93  # ]
    out[p + 1] = 10
    return p + 2


@aot.njit(cache=True, _nrt=False)
def _marker(out, p, row, offset, style):
    """An error, or one of ptxed's own lines; -1 when nothing is printed."""
    t = row[K.E_TYPE]
    if t == K.X_ERROR:
        out[p] = 91
        p = put_hex(out, p + 1, offset, 0)
        p = put_text(out, p, ", ")
        p = put_hex(out, p, row[K.E_IP], 0)
        p = put_text(out, p, ": ")
        p = put_row(out, p, _KIND_TAB, _KIND_LEN, row[K.E_P1])
        p = put_text(out, p, ": ")
        p = put_row(out, p, _ERR_TAB, _ERR_LEN, min(row[K.E_P0], np.uint64(31)))
        return put_text(out, p, "]\n")
    if style & S_QUIET:
        return p
    if t == K.X_END:
        return put_text(out, p, "[end of trace]\n")
    return put_text(out, p, "[disabled]\n")  # X_RESYNC_DISABLED


@aot.njit(cache=True, inline="always", _nrt=False)
def _next_ip(i_ip, i_size, i_class, i_flags, i_target, k):
    """Where instruction ``k`` goes when it needs no trace: a direct call's
    or jump's target, else the next instruction."""
    c = i_class[k]
    if i_flags[k] & I_DIRECT and (c == CLASS_CALL or c == CLASS_JUMP):
        return i_target[k]
    return i_ip[k] + np.uint64(i_size[k])


@aot.njit(cache=True)
def build_lines(ct, i_mode, n_insns, t_bytes, t_off, style, first, lines, line_off, contig):
    """Each instruction's line (without the per-block prefixes of
    ``--offset``/``--time``) from instruction ``first`` on, into ``lines``
    at ``line_off``; returns how many instructions got a line (fewer when
    ``lines`` is full).  ``contig[k]``: how many instructions from ``k`` on
    run one after another at consecutive indices (all of them, again)."""
    i_ip, i_size, i_class, i_flags, i_target, i_err, i_raw = (
        ct[3], ct[4], ct[5], ct[7], ct[8], ct[10], ct[11]
    )  # fmt: skip
    no_inst = (style & S_NO_INST) != 0
    raw = (style & S_RAW) != 0
    p = line_off[first]
    k = first
    while k < n_insns:
        if p + LINE_MAX + COPY_SLACK > lines.shape[0]:
            break
        p = put_hex(lines, p, i_ip[k], 16)
        if not no_inst:
            if raw:
                size = np.int64(i_size[k])
                for q in range(size):
                    lines[p] = 32
                    p = put_hex(lines, p + 1, i_raw[k, q], 2)
                for _ in range(15 - size):
                    p = put_text(lines, p, "   ")
            lines[p] = 32
            lines[p + 1] = 32
            p += 2
            if not i_err[k]:
                for q in range(t_off[k], t_off[k + 1]):
                    lines[p] = t_bytes[q]
                    p += 1
        lines[p] = 10
        p += 1
        k += 1
        line_off[k] = p
    done = k
    if done > 0:
        contig[done - 1] = 1
    for k in range(done - 2, -1, -1):
        seq = i_mode[k + 1] == i_mode[k] and i_ip[k + 1] == _next_ip(
            i_ip, i_size, i_class, i_flags, i_target, k
        )
        contig[k] = contig[k + 1] + 1 if seq else 1
        if not seq and k < first:
            break  # the runs before this one end where they did
    return done


@aot.njit(cache=True, inline="always", _nrt=False)
def _run_span(run, r_ninsn, r_first, r_insn, line_off, contig, span):
    """Where the lines of run ``run`` are in the line table, cached in
    ``span`` (start, end; -1: not known yet); start -1 when they are not
    one stretch of it (so far: code decoded later may join them)."""
    a = span[2 * run]
    if a >= 0:
        return a, span[2 * run + 1]
    k = np.int64(r_insn[r_first[run]])
    n = np.int64(r_ninsn[run])
    if n == 0 or contig[k] < n:
        return np.int64(-1), np.int64(-1)
    a = line_off[k]
    e = line_off[k + n]
    span[2 * run + 1] = e
    span[2 * run] = a
    return a, e


@aot.njit(cache=True, _nrt=False)
def _run_rows(b_ninsn, b_flags, b_offset, b_run, i, stop, r_ninsn, r_first, r_insn, lines,
              line_off, contig, span, st, out, p, cap):  # fmt: skip
    """ptxed's plain lines (no per-line prefix) of rows ``i`` up to
    ``stop`` while each is a whole run of straight code and no block is
    speculative: one copy from the line table per row.  Returns where it
    stopped and the new position in ``out``."""
    n_blocks = np.int64(0)
    n_insn = np.int64(0)
    new_at = np.int64(-1)
    while i < stop:
        run = b_run[i]
        if run < 0:
            break
        f = b_flags[i]
        if f & K.O_SPEC:
            break
        a, e = _run_span(run, r_ninsn, r_first, r_insn, line_off, contig, span)
        if a < 0 or p + (e - a) > cap:
            break
        p = put_slice_over(out, p, lines, a, e)
        if f & K.O_NEW:
            n_blocks += 1
            new_at = i
        n_insn += b_ninsn[i]
        i += 1
    st[F_NBLOCKS] += n_blocks
    st[F_NINSN] += n_insn
    if new_at >= 0:
        st[F_BLKOFF] = b_offset[new_at]
    return i, p


@aot.njit(cache=True, _nrt=False)
def format_batch(
    b_ip, b_ninsn, b_flags, b_mode, b_offset, b_time, b_run, ev_rows, ev_off, ev_blk, ct, lines,
    line_off, contig, span, style, st, stu, out,
):  # fmt: skip
    """Write the batch's lines into ``out`` from where ``st`` says; returns
    the bytes written.  ``st[F_ROW] == len(b_ip) + 1`` when the batch is
    done; otherwise call again with an emptied buffer.  A row that is a
    whole run of the code table (``b_run``) finds its instructions there,
    without a lookup by address; ``span`` caches where each run's lines are
    (see :func:`_run_rows`)."""
    h_ip, h_mode, h_val, i_ip, i_size, i_class, i_flags, i_target = (
        ct[0], ct[1], ct[2], ct[3], ct[4], ct[5], ct[7], ct[8]
    )  # fmt: skip
    r_ninsn, r_first, r_insn = ct[17], ct[21], ct[23]
    quiet = (style & S_QUIET) != 0
    fast = (style & (S_QUIET | S_OFFSET | S_TIME | S_SHOW_BLOCKS)) == 0
    cap = out.shape[0] - LINE_MAX - COPY_SLACK
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
        if fast and st[F_DONE] == 0 and st[F_SPEC] == 0:
            # Up to the next event: rows that are whole runs of straight
            # code are one stretch of the line table each.
            stop = ev_blk[j] if j < nev else nrows
            i, p = _run_rows(b_ninsn, b_flags, b_offset, b_run, i, stop, r_ninsn, r_first,
                             r_insn, lines, line_off, contig, span, st, out, p, cap)  # fmt: skip
            if i >= stop:
                continue
        n = np.int64(b_ninsn[i])
        done = st[F_DONE]
        if done == 0:
            if b_flags[i] & K.O_NEW:
                st[F_NBLOCKS] += 1
                st[F_BLKOFF] = b_offset[i]
                stu[FU_TIME] = b_time[i]  # Intel's ptxed: pt_blk_time before pt_blk_next
                st[F_SPEC] = 1 if b_flags[i] & K.O_SPEC else 0
                if not quiet and style & S_SHOW_BLOCKS:
                    if p >= cap:
                        st[F_ROW] = i
                        st[F_EVENT] = j
                        return p
                    if style & S_STATS:
                        p = put_text(out, p, "[block ")
                        p = put_hex(out, p, st[F_NBLOCKS], 0)
                        p = put_text(out, p, "]\n")
                    else:
                        p = put_text(out, p, "[block]\n")
            st[F_NINSN] += n
            stu[FU_IP] = b_ip[i]
        if quiet:
            i += 1
            continue
        ip = stu[FU_IP]
        mode = b_mode[i]
        plain = (style & (S_OFFSET | S_TIME)) == 0 and st[F_SPEC] == 0
        while done < n:
            if p >= cap:
                st[F_ROW] = i
                st[F_EVENT] = j
                st[F_DONE] = done
                stu[FU_IP] = ip
                return p
            run = b_run[i]
            if run >= 0:
                k = np.int64(r_insn[r_first[run] + done])
            else:
                k = hash_find(h_ip, h_mode, h_val, ip, mode)
            if k < 0:  # cannot happen: the decoder read every instruction it reports
                p = put_hex(out, p, ip, 16)
                out[p] = 10
                p += 1
                done = n
                break
            # Instructions k, k+1, ... ran one after another: their lines
            # are one stretch of the line table.
            m = min(np.int64(contig[k]), n - done)
            if plain:
                a = line_off[k]
                if p + (line_off[k + m] - a) > cap:
                    fit = 1  # one line always fits (LINE_MAX spare)
                    while fit < m and p + (line_off[k + fit + 1] - a) <= cap:
                        fit += 1
                    m = fit
                e = line_off[k + m]
                p = put_slice_over(out, p, lines, a, e)
            else:
                for q in range(m):
                    if p >= cap:
                        st[F_ROW] = i
                        st[F_EVENT] = j
                        st[F_DONE] = done + q
                        stu[FU_IP] = i_ip[k + q]
                        return p
                    if style & S_OFFSET:
                        p = put_hex(out, p, st[F_BLKOFF], 16)
                        p = put_text(out, p, "  ")
                    if style & S_TIME:
                        p = put_hex(out, p, stu[FU_TIME], 16)
                        p = put_text(out, p, "  ")
                    if st[F_SPEC]:
                        p = put_text(out, p, "? ")
                    a = line_off[k + q]
                    e = line_off[k + q + 1]
                    p = put_slice(out, p, lines, a, e)
            done += m
            if run < 0 and done < n:  # a run's rows find the rest by index
                ip = _next_ip(i_ip, i_size, i_class, i_flags, i_target, k + m - 1)
        st[F_DONE] = 0
        i += 1
    st[F_ROW] = nrows + 1
    st[F_EVENT] = j
    return p


class TextTable:
    """Disassembly of a code table's instructions as one byte string with
    offsets, for the loop (each instruction is formatted once)."""

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
        err, size, raw = table.i_err, table.i_size, table.i_raw
        ip, mode, special = table.i_ip, table.i_mode, table.i_special
        fmt = self.formatter.format_bytes
        for k in range(have, n):
            text = ""
            if not err[k]:
                # The table's bytes: truncated ones too (the instruction
                # continues in the next section; iced-x86 decodes them whole).
                text = fmt(raw[k, : size[k]].tobytes(), int(ip[k]), int(mode[k]), int(special[k]))
            data = text.encode()
            self.chunks.append(data)
            self.offsets.append(self.offsets[-1] + len(data))
        self.bytes = np.frombuffer(b"".join(self.chunks), np.uint8) if self.chunks else self.bytes
        self.off = np.array(self.offsets, np.int64)


class LineTable:
    """Every instruction's ptxed line (address, raw bytes, disassembly) as
    one byte string in instruction order, so the formatter copies the lines
    of a stretch of straight-line code at once."""

    def __init__(self, style_bits: int, att: bool) -> None:
        self.style = style_bits
        self.texts = None if style_bits & S_NO_INST else TextTable(att)
        self.table: CodeTable | None = None
        self.generation = -1
        self.n = 0
        self.lines = np.zeros(1 << 16, np.uint8)
        self.line_off = np.zeros(1 << 12, np.int64)
        self.contig = np.zeros(1 << 12, np.int32)
        # Per run of the code table: where its lines are (format_batch).
        self.span = np.full(2 << 12, -1, np.int64)
        self._empty = np.zeros(1, np.uint8), np.zeros(1, np.int64)

    def update(self, table: CodeTable) -> None:
        if table is not self.table or table.generation != self.generation:
            self.table, self.generation, self.n = table, table.generation, 0
            # A new array: a formatting thread may still read the old one.
            self.span = np.full(self.span.shape[0], -1, np.int64)
        runs = table.r_ip.shape[0]
        if self.span.shape[0] < 2 * runs:
            # Replaced, not grown in place; spans the formatter caches in
            # the old one meanwhile are only found again.
            span = np.full(2 * runs, -1, np.int64)
            span[: self.span.shape[0]] = self.span
            self.span = span
        n = table.n_insns
        if n == self.n:
            return
        t_bytes, t_off = self._empty
        if self.texts is not None:
            self.texts.update(table)
            t_bytes, t_off = self.texts.bytes, self.texts.off
        if self.line_off.shape[0] < n + 1:
            size = max(n + 1, 2 * self.line_off.shape[0])
            self.line_off = np.resize(self.line_off, size)
            contig = np.zeros(size, np.int32)
            contig[: self.n] = self.contig[: self.n]
            self.contig = contig
        while True:
            done = build_lines(
                table.tuple, table.i_mode, n, t_bytes, t_off, self.style, self.n, self.lines,
                self.line_off, self.contig,
            )  # fmt: skip
            self.n = done
            if done == n:
                break
            self.lines = np.resize(self.lines, 2 * self.lines.shape[0])


@dataclass
class PtxedWriter(FlowSink):
    """Formats batches as ptxed text and hands the bytes to ``write``.

    With ``pipelined``, a second thread formats and writes each batch while
    the decoder goes on with the next (both loops run without the GIL):
    the decoder then writes into a few sets of output buffers in turn.  The
    formatting thread reads the code and line tables the decoding thread
    appends to; entries, once written, never change (hash slots are only
    ever filled, arrays that grow are replaced, not resized in place), and a
    batch only names instructions decoded before it.  Call :meth:`finish`
    before writing anything else to the output."""

    style: PtxedStyle
    write: object  # callable(bytes-like)
    att: bool = False
    buffer_size: int = 1 << 20
    pipelined: bool = False
    # Replay libipt's block cache (:mod:`hwtrace.pt.bcache`) so blocks end
    # where Intel's block decoder ends them; only worth it where block
    # boundaries show (block lines, block counts, per-block offsets/times).
    block_cache: bool = False
    BUFFER_SETS = 3  # batches the decoder may run ahead of the formatter, plus one
    state: np.ndarray = field(default_factory=lambda: np.zeros(NF, np.int64))
    ustate: np.ndarray = field(default_factory=lambda: np.zeros(NFU, np.uint64))

    def __post_init__(self) -> None:
        self.out = np.zeros(self.buffer_size + LINE_MAX + COPY_SLACK, np.uint8)
        self.bits = self.style.bits
        self.lines = LineTable(self.bits, self.att)
        self.n_insn = 0  # instructions and blocks seen (ptxed's --stat)
        self.n_blocks = 0
        self._pool = None
        self._sets: list = [None] * self.BUFFER_SETS  # the decoder's output buffers, in turn
        self._pending: list = [None] * self.BUFFER_SETS  # the formatting of each set's batch
        self._set = -1
        self._bcache = None
        if self.block_cache:
            from .bcache import BlockCache

            self._bcache = BlockCache()
        if self.pipelined and not self.style.quiet:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(1, thread_name_prefix="ptxed-format")

    def output(self) -> tuple:
        if self._pool is None:
            return super().output()
        self._set = (self._set + 1) % self.BUFFER_SETS
        self._wait(self._set)
        if self._sets[self._set] is None:
            self._sets[self._set] = K.new_output(self.BLOCK_ROWS, self.EVENT_ROWS)
        return self._sets[self._set]

    def _wait(self, which: int) -> None:
        job, self._pending[which] = self._pending[which], None
        if job is not None:
            job.result()

    def finish(self) -> None:
        """Wait until every batch is written (and stop the thread)."""
        if self._pool is not None:
            try:
                for k in range(1, self.BUFFER_SETS + 1):  # oldest first
                    which = (self._set + k) % self.BUFFER_SETS
                    self._wait(which)
            finally:
                self._pool.shutdown()
                self._pool = None

    def batch(self, b) -> None:
        self.n_insn += b.n_insn
        self.n_blocks += b.n_blocks
        lines = self.lines
        if not self.style.quiet:
            lines.update(b.table)
        if self._bcache is not None:
            ip, ninsn, flags, mode, offset, time, run, event_block, extra = self._bcache.split(b)
            self.n_blocks += extra
        else:
            ip, ninsn, flags, mode, offset, time, run, event_block = (
                b.ip, b.ninsn, b.flags, b.mode, b.offset, b.time, b.run, b.event_block,
            )  # fmt: skip
        # What the formatting reads, as it is now (tables grow by new arrays).
        args = (
            ip, ninsn, flags, mode, offset, time, run, b.events, b.event_offset, event_block,
            b.table.tuple, lines.lines, lines.line_off, lines.contig, lines.span,
        )  # fmt: skip
        if self._pool is None:
            self._format(args)
        else:
            self._pending[self._set] = self._pool.submit(self._format, args)

    def _format(self, args: tuple) -> None:
        st = self.state
        st[F_ROW] = 0
        st[F_EVENT] = 0
        st[F_DONE] = 0
        nrows = args[0].shape[0]
        while st[F_ROW] <= nrows:
            n = format_batch(*args, self.bits, st, self.ustate, self.out)
            if n:
                self.write(self.out[:n])


__all__ = ["LineTable", "PtxedStyle", "PtxedWriter", "TextTable", "format_batch"]
