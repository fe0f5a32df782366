"""The time Linux perf gives each instruction of an Intel PT flow, so that
``hwtrace script`` prints perf script's times to the nanosecond.

perf's decoder (``tools/perf/util/intel-pt-decoder/intel-pt-decoder.c``)
keeps a TSC estimate, ``timestamp``, moved by the timing packets as it
reads them:

- TSC: the 7-byte value completed with the top byte of the AUX buffer's
  reference (the first TSC after a buffer start) or of the current
  estimate (a value a little behind it is taken as the estimate: TSC
  slip; one further behind wraps);
- TMA: ``ctc_timestamp = tsc - FC - CTC mod 2**mtc_shift`` ticks (the
  CPUID 0x15 ratio, integer when exact, else ``t/d*n + t%d*n/d``);
- MTC: ``ctc_timestamp`` plus the CTC periods since the TMA (an MTC equal
  to the last counts 256), never backwards;
- CYC: after an MTC or TSC that follows a CYC, the cycles since, times
  the TSC ticks per cycle measured up to the next MTC (looking ahead in
  the buffer; the CBR-based ratio when that fails), never backwards.

An instruction sample takes not that estimate but ``sample_timestamp``,
which follows it only when the decoder returns in a state that is not
waiting on a packet: so the instructions before the branch that consumes
a TNT bit or a TIP carry the time of the previous such branch, and the
consuming branch carries the time of every packet up to its own.  Trace
(re)starts (PSB+ when not in sync, TIP.PGE), a changed CBR and an
asynchronous FUP (with its TIP or TIP.PGD) move it without an
instruction; a PTWRITE's FUP (no TIP follows) gives its instruction the
estimate of the packets before it.  perf keeps each queue's time from
going backwards, except where tracing begins in user space (TIP.PGE):
there the queue takes the decoder's estimate, ``sample_timestamp`` plus
two ticks an instruction walked since a timing packet last set
``timestamp`` (times the maximum non-turbo ratio over the CBR, when both
are known).  In sync, perf walks
to a PSB+'s FUP before it reads the packets after PSBEND, so the
instructions up to it count before those packets set the estimate again.

:class:`PerfClock` runs that over a queue's packets alongside its decoded
instructions (their addresses and transfer classes), batch by batch, in a
compiled loop.
"""

from __future__ import annotations

import numpy as np

from .. import aot
from ..isa.x86 import IClass, Special
from ..pt.decode import chunk_ranges
from ..pt.flowrows import I_DIRECT, CodeTable
from ..pt.kinds import Kind
from ..pt.packets import PacketBuffers, decode_range
from ..pt.timing import tsc_ns

__all__ = [
    "C_COND",
    "C_DIRECT",
    "C_FAR",
    "C_INDIRECT",
    "C_OTHER",
    "C_RET",
    "PerfClock",
    "table_transfer_classes",
    "transfer_class",
]

# Transfer classes of instructions, as the decoder consumes packets for them.
C_OTHER, C_COND, C_RET, C_INDIRECT, C_FAR = 0, 1, 2, 3, 4
# A direct near CALL or JMP: no packet, unless tracing stops at it (its
# target leaves the traced ranges: TIP.PGD with that target).  Callers
# that know where blocks end give it to a block's last instruction only.
C_DIRECT = 5

_PAD, _PSB, _PSBEND = int(Kind.PAD), int(Kind.PSB), int(Kind.PSBEND)
_TNT8, _TNT64, _TIP = int(Kind.TNT8), int(Kind.TNT64), int(Kind.TIP)
_PGE, _PGD, _FUP = int(Kind.TIP_PGE), int(Kind.TIP_PGD), int(Kind.FUP)
_PTW = int(Kind.PTW)
_CBR, _TSC, _MTC, _TMA, _CYC = (int(Kind.CBR), int(Kind.TSC), int(Kind.MTC), int(Kind.TMA),
                                int(Kind.CYC))  # fmt: skip
_OVF = int(Kind.OVF)

# Kernel state slots (int64).
(P, TS, TSC_TS, REF, HAVE_TMA, CTC_TS, CTC_DELTA, LAST_MTC, FIXUP, CYC_REF, CYC_CNT,
 HAVE_CALC, CBR, CBR_SEEN, SAMPLE, TNT_LEFT, LAST_IP, SYNCED, LAST_TYPE, IN_PSB,
 PSB_FUP, PEND, PEND_IP, PEND_TS, TS_INSN, NSTATE) = range(26)  # fmt: skip
# (TS_INSN: instructions since a timing packet last set the estimate,
# perf's timestamp_insn_cnt.)
# Float state slots.
CALC_CYC, CBR_CYC, MAX_NT = range(3)
TSC_SLIP = 0x10000


def transfer_class(iclass: int, is_direct: bool) -> int:
    """The class :class:`PerfClock` takes for an instruction of
    :class:`~hwtrace.isa.x86.IClass` ``iclass``."""
    if iclass == IClass.COND_JUMP:
        return C_COND
    if iclass == IClass.RETURN:
        return C_RET
    if iclass in (IClass.FAR_CALL, IClass.FAR_RETURN, IClass.FAR_JUMP):
        return C_FAR
    if iclass == IClass.INDIRECT or (iclass in (IClass.CALL, IClass.JUMP) and not is_direct):
        return C_INDIRECT
    return C_OTHER


def _class_table() -> np.ndarray:
    """transfer_class of every IClass value, taken as indirect."""
    out = np.zeros(256, np.uint8)
    for c in IClass:
        out[int(c)] = transfer_class(int(c), False)
    return out


_CLASS_OF = _class_table()
_DIRECT_OK = np.zeros(256, bool)  # classes a direct form of is no transfer for perf
_DIRECT_OK[[int(IClass.CALL), int(IClass.JUMP)]] = True


def table_transfer_classes(table: CodeTable, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`transfer_class` of the instructions ``rows`` of a code table
    (:class:`~hwtrace.pt.flowrows.CodeTable`; bytes that are no instruction:
    :data:`C_OTHER`), gathered from its columns, with direct near CALLs and
    JMPs as :data:`C_DIRECT`; and each one's branch target (0: none)."""
    icls = table.i_class[rows]
    out = _CLASS_OF[icls]
    direct = ((table.i_flags[rows] & I_DIRECT) != 0) & _DIRECT_OK[icls]
    direct &= table.i_special[rows] != int(Special.JMPABS)
    out[direct] = C_DIRECT
    out[table.i_err[rows] != 0] = C_OTHER
    target = np.where(out == C_DIRECT, table.i_target[rows], np.uint64(0))
    return out, target


@aot.njit(cache=True, _nrt=False)
def _monotonic_ns(out, last, shift, mult, zero):
    """``out`` (TSC values, 0: none) kept from going below ``last`` or the
    one before, converted in place to perf time as ``tsc_to_perf_time``
    (u64 arithmetic that wraps; -1: none); returns the last TSC.  Times
    repeat for runs of instructions: each value is converted once."""
    prev = np.int64(-1)
    prev_ns = np.int64(-1)
    for i in range(out.shape[0]):
        t = out[i]
        if t < last:
            t = last
        last = t
        if t != prev:
            prev = t
            if t == 0:
                prev_ns = -1
            else:
                prev_ns = tsc_ns(t, shift, mult, zero)
        out[i] = prev_ns
    return last


@aot.njit(cache=True)
def _multdiv(t, n, d):
    if d == 0:
        return 0
    return (t // d) * n + ((t % d) * n) // d


@aot.njit(cache=True)
def _ip(payload, ipc, last):
    if ipc == 1:
        return (last & ~np.int64(0xFFFF)) | payload
    if ipc == 2:
        return (last & ~np.int64(0xFFFFFFFF)) | payload
    if ipc == 3:
        ip = payload
        if ip & 0x800000000000:
            ip |= ~np.int64(0xFFFFFFFFFFFF)
        return ip
    if ipc == 4:
        return (last & ~np.int64(0xFFFFFFFFFFFF)) | payload
    if ipc == 6:
        return payload
    return last


@aot.njit(cache=True)
def _ctc_ticks(t, n, d, mult):
    return t * mult if mult else _multdiv(t, n, d)


@aot.njit(cache=True)
def _mtc_step(mtc, last, fixup, shift):
    """An MTC against the last: the last MTC's bits the TMA lacked filled
    in (intel_pt_fixup_last_mtc, when ``fixup``), and the CTC ticks since
    (an MTC equal to the last counts 256 periods).  Returns (last, ticks)."""
    if shift > 8 and fixup:
        first = np.int64(1) << (16 - shift)
        last |= mtc & ~(first - 1)
        if last >= mtc:
            last = (last - first) & 0xFF
    delta = mtc - last if mtc > last else mtc + 256 - last
    return last, delta << shift


@aot.njit(cache=True)
def _cyc_restart(st):
    """A TSC or MTC right after a CYC: cycles count from its time."""
    st[CYC_REF] = st[TS]
    st[CYC_CNT] = 0
    st[HAVE_CALC] = 0


# Packets that end perf's look-ahead for the cycle ratio (intel_pt_calc_cyc_cb).
_STOPS = (int(Kind.TIP_PGD), int(Kind.STOP), int(Kind.EXSTOP), int(Kind.MWAIT), int(Kind.PWRE),
          int(Kind.PWRX), int(Kind.OVF), int(Kind.INVALID), _TSC, _TMA)  # fmt: skip


@aot.njit(cache=True)
def _lookahead_cyc(kind, a, p, npk, st, fs, shift, n, d, mult):
    """intel_pt_calc_cyc_to_tsc after an MTC that followed a CYC: the TSC
    ticks per cycle up to the next MTC that follows a CYC."""
    cycles = 0
    cbr = 0
    cbr_cyc = 0.0
    last_mtc = st[LAST_MTC]
    ctc_delta = st[CTC_DELTA]
    ts = st[TS]
    fixup = st[FIXUP] != 0
    last_type = st[LAST_TYPE]  # the packet before the MTC: a CYC
    for q in range(p, npk):
        k = kind[q]
        if k == _PAD:
            continue
        if k in _STOPS:
            return
        if k == _CYC:
            cycles += a[q]
        elif k == _CBR:
            c = a[q] & 0xFF
            if cbr and cbr != c:
                return
            cbr = c
            cbr_cyc = fs[MAX_NT] / c
        elif k == _MTC and st[HAVE_TMA]:
            mtc = a[q]
            _, ticks = _mtc_step(mtc, last_mtc, fixup, shift)
            fixup = False
            ctc_delta += ticks
            last_mtc = mtc
            stamp = st[CTC_TS] + _ctc_ticks(ctc_delta, n, d, mult)
            if stamp < ts:
                return
            if last_type == _CYC:
                if cbr == 0 and st[CBR]:
                    cbr = st[CBR]
                    cbr_cyc = fs[CBR_CYC]
                if cycles == 0:
                    return
                ratio = (stamp - st[TS]) / cycles
                if cbr and ratio > cbr_cyc and ratio / cbr_cyc > 1.25:
                    return
                fs[CALC_CYC] = ratio
                st[HAVE_CALC] = 1
                return
            ts = stamp
        last_type = k


@aot.njit(cache=True)
def _timing(kind, a, b, p, npk, st, fs, shift, n, d, mult):
    """Apply the timing packet at ``p`` (TSC, TMA, MTC, CYC) to the estimate."""
    k = kind[p]
    if k == _TSC:
        st[HAVE_TMA] = 0
        v = np.int64(a[p])
        top = np.int64(0xFF) << 56
        if st[REF] != 0:
            ref = st[REF]
            ts = v | (ref & top)
            if ts < ref:
                if ref - ts > (np.int64(1) << 55):
                    ts += np.int64(1) << 56
            elif ts - ref > (np.int64(1) << 55):
                ts -= np.int64(1) << 56
            st[TSC_TS] = ts
            st[TS] = ts
            st[REF] = 0
            st[TS_INSN] = 0
        elif st[TS] != 0:
            ts = v | (st[TS] & top)
            st[TSC_TS] = ts
            if ts < st[TS] and st[TS] - ts < TSC_SLIP:
                ts = st[TS]
            if ts < st[TS]:
                ts += np.int64(1) << 56
                st[TSC_TS] = ts
            st[TS] = ts
            st[TS_INSN] = 0
        if st[LAST_TYPE] == _CYC:
            _cyc_restart(st)
    elif k == _TMA:
        if d == 0:
            return
        ctc = np.int64(a[p])
        fc = np.int64(b[p])
        st[LAST_MTC] = (ctc >> shift) & 0xFF
        st[CTC_TS] = st[TSC_TS] - fc - _ctc_ticks(ctc & ((1 << shift) - 1), n, d, mult)
        st[CTC_DELTA] = 0
        st[HAVE_TMA] = 1
        st[FIXUP] = 1
    elif k == _MTC:
        if not st[HAVE_TMA]:
            return
        mtc = np.int64(a[p])
        _, ticks = _mtc_step(mtc, st[LAST_MTC], st[FIXUP] != 0, shift)
        st[FIXUP] = 0 if shift > 8 else st[FIXUP]
        st[CTC_DELTA] += ticks
        ts = st[CTC_TS] + _ctc_ticks(st[CTC_DELTA], n, d, mult)
        if ts >= st[TS]:
            st[TS] = ts
        st[TS_INSN] = 0
        st[LAST_MTC] = mtc
        if st[LAST_TYPE] == _CYC:
            _cyc_restart(st)
            _lookahead_cyc(kind, a, p + 1, npk, st, fs, shift, n, d, mult)
    elif k == _CYC:
        st[CYC_CNT] += np.int64(a[p])
        if st[CYC_REF] == 0:
            return
        if st[HAVE_CALC]:
            ts = np.int64(np.float64(st[CYC_REF]) + st[CYC_CNT] * fs[CALC_CYC])
        elif st[CBR]:
            ts = np.int64(np.float64(st[CYC_REF]) + st[CYC_CNT] * fs[CBR_CYC])
        else:
            return
        if ts >= st[TS]:
            st[TS] = ts
        st[TS_INSN] = 0


@aot.njit(cache=True)
def _run(kind, a, b, npk, st, fs, shift, n, d, mult, ips, cls, tgt, out, i0):
    """Times (TSC) of instructions ``i0..`` into ``out``; returns the first
    instruction not timed for want of packets (the table is used up).
    ``tgt``: the targets of the :data:`C_DIRECT` instructions."""
    m = ips.shape[0]
    i = i0
    while i < m:
        c = cls[i]
        if st[PEND] and st[PEND_IP] == np.int64(ips[i]):
            st[PEND] = 0
            st[SAMPLE] = st[PEND_TS]
        if st[TNT_LEFT] > 0:
            if c == C_COND or c == C_RET:
                st[TNT_LEFT] -= 1
                st[SAMPLE] = st[TS]
            out[i] = st[SAMPLE]
            st[TS_INSN] += 1
            i += 1
            continue
        if st[PEND] and (c == C_OTHER or c == C_DIRECT):
            # perf walks to the PSB+'s FUP before it reads on: the
            # instructions before it consume nothing, and count before
            # what follows the PSB+ sets the estimate again.
            out[i] = st[SAMPLE]
            st[TS_INSN] += 1
            i += 1
            continue
        # Read up to the next packet an instruction consumes.
        p = st[P]
        restart = False
        to_fup = False
        while p < npk:
            k = kind[p]
            if k == _PAD or (not st[SYNCED] and not st[IN_PSB] and k != _PSB):
                p += 1  # perf looks for a PSB first, reading nothing before it
                continue
            if k == _TSC or k == _TMA or k == _MTC or k == _CYC:
                _timing(kind, a, b, p, npk, st, fs, shift, n, d, mult)
            elif k == _CBR:
                c8 = np.int64(a[p] & 0xFF)
                if c8 != st[CBR] and c8 != 0:
                    st[CBR] = c8
                    fs[CBR_CYC] = fs[MAX_NT] / c8
                if st[CBR] != st[CBR_SEEN] and not st[IN_PSB]:
                    st[CBR_SEEN] = st[CBR]
                    st[SAMPLE] = st[TS]
            elif k == _PSB:
                st[IN_PSB] = 1
                st[PSB_FUP] = 0
                st[LAST_IP] = 0
            elif k == _PSBEND:
                st[IN_PSB] = 0
                if not st[SYNCED] or st[CBR] != st[CBR_SEEN]:
                    st[SYNCED] = 1
                    st[CBR_SEEN] = st[CBR]
                    st[SAMPLE] = st[TS]
                elif st[PSB_FUP]:
                    # In sync, perf walks to the PSB+'s FUP and returns
                    # there (intel_pt_psb_with_fup): the time moves at
                    # that instruction.
                    st[PEND] = 1
                    st[PEND_IP] = st[LAST_IP]
                    st[PEND_TS] = st[TS]
                    to_fup = True
            elif k == _OVF:
                st[TNT_LEFT] = 0
                st[TS_INSN] = 0
                st[SAMPLE] = st[TS]
            elif k == _PGE:
                st[LAST_IP] = _ip(np.int64(a[p]), b[p], st[LAST_IP])
                st[SAMPLE] = st[TS]
                if st[LAST_IP] > 0:
                    # Tracing begins in user space: perf's queue takes the
                    # decoder's estimate there (intel_pt_est_timestamp: two
                    # ticks an instruction since the estimate was set, at
                    # the maximum non-turbo ratio over the core's).
                    est = st[TS_INSN] << 1
                    if st[CBR] and fs[MAX_NT]:
                        est = est * np.int64(fs[MAX_NT]) // st[CBR]
                    st[SAMPLE] = st[TS] + est
            elif k == _FUP and st[IN_PSB]:
                st[LAST_IP] = _ip(np.int64(a[p]), b[p], st[LAST_IP])
                st[PSB_FUP] = 1
            elif k == _TNT8 or k == _TNT64 or k == _TIP or k == _PGD or k == _FUP:
                break
            st[LAST_TYPE] = k
            p += 1
            if to_fup:
                break
        st[P] = p
        if to_fup:
            continue  # (instruction i again: at the FUP, or walked to it)
        if p >= npk:
            return i
        if st[PEND] and st[PEND_IP] == np.int64(ips[i]):
            st[PEND] = 0
            st[SAMPLE] = st[PEND_TS]
        k = kind[p]
        taken = False
        if k == _TNT8 or k == _TNT64:
            if c == C_COND or c == C_RET:
                st[TNT_LEFT] = np.int64(b[p]) - 1
                taken = True
        elif k == _TIP:
            if c == C_RET or c == C_INDIRECT or c == C_FAR:
                st[LAST_IP] = _ip(np.int64(a[p]), b[p], st[LAST_IP])
                taken = True
        elif k == _PGD:
            if c == C_DIRECT:
                # Tracing stopped at a direct branch: its TIP.PGD names
                # where the branch went (perf ends the walk there).
                to = _ip(np.int64(a[p]), b[p], st[LAST_IP])
                if b[p] != 0 and to == np.int64(tgt[i]):
                    st[LAST_IP] = to
                    taken = True
            elif c != C_OTHER:
                st[LAST_IP] = _ip(np.int64(a[p]), b[p], st[LAST_IP])
                taken = True
        else:  # FUP: an event at the instruction it names
            at = _ip(np.int64(a[p]), b[p], st[LAST_IP])
            before = p - 1
            while before >= 0 and kind[before] == _PAD:
                before -= 1
            if at == np.int64(ips[i]) and before >= 0 and kind[before] == _PTW:
                # A PTWRITE's FUP (its IP bit): no TIP follows.  perf
                # returns the PTWRITE at that instruction with the time of
                # the packets read so far, those before the FUP (after a
                # PSB+ in the middle of the flow, its TSC's); the packets
                # after it wait for the next branch.
                st[LAST_IP] = at
                st[LAST_TYPE] = _FUP
                st[P] = p + 1
                st[SAMPLE] = st[TS]
                continue  # (instruction i again, with the packets after)
            if at == np.int64(ips[i]):
                # Its TIP or TIP.PGD, past the timing packets in between.
                q = p + 1
                while q < npk and (kind[q] == _PAD or kind[q] == _TSC or kind[q] == _TMA
                                   or kind[q] == _MTC or kind[q] == _CYC):  # fmt: skip
                    q += 1
                if q >= npk:
                    return i
                st[LAST_IP] = at
                st[LAST_TYPE] = _FUP
                p += 1
                while p < q:
                    if kind[p] != _PAD:
                        _timing(kind, a, b, p, npk, st, fs, shift, n, d, mult)
                        st[LAST_TYPE] = kind[p]
                    p += 1
                if kind[q] == _TIP or kind[q] == _PGD:
                    st[LAST_IP] = _ip(np.int64(a[q]), b[q], st[LAST_IP])
                    st[LAST_TYPE] = kind[q]
                    p = q + 1
                st[P] = p
                st[SAMPLE] = st[TS]
                if c == C_FAR:  # the FUP is this instruction's own (a syscall)
                    out[i] = st[SAMPLE]
                    st[TS_INSN] += 1
                    i += 1
                    continue
                restart = True
        if restart:
            continue  # time instruction i again after the event
        if taken:
            st[LAST_TYPE] = k
            st[P] = p + 1
            st[SAMPLE] = st[TS]
        out[i] = st[SAMPLE]
        st[TS_INSN] += 1
        i += 1
    return i


_NO_TARGETS = np.zeros(1, np.uint64)


class PerfClock:
    """perf's instruction times over one queue's trace (see the module
    doc): give it the queue's instructions in flow order, batch by batch.

    ``mtc_shift``, ``ratio`` (CPUID 0x15 EBX/EAX: TSC ticks per CTC tick)
    and ``max_non_turbo_ratio`` are the trace's, from the perf.data's
    AUXTRACE_INFO; ``reference`` is the first AUX buffer's reference TSC."""

    def __init__(
        self,
        trace: np.ndarray,
        mtc_shift: int,
        ratio: tuple[int, int],
        max_non_turbo_ratio: int,
        reference: int = 0,
        chunk_bytes: int = 1 << 17,
    ) -> None:
        self.trace = trace
        # One chunk's packets at a time, in memory reused from chunk to chunk.
        self._buffers = PacketBuffers()
        n, d = int(ratio[0]), int(ratio[1])
        if not n:
            d = 0
        self.params = (int(mtc_shift), n, d, n // d if d and n % d == 0 else 0)
        self.state = np.zeros(NSTATE, np.int64)
        self.state[REF] = np.int64(reference & 0x7FFFFFFFFFFFFFFF)
        self.fstate = np.zeros(3, np.float64)
        self.fstate[MAX_NT] = float(max_non_turbo_ratio)
        self._chunk_bytes = chunk_bytes
        # (the chunks are found when the first instruction's time is asked
        # for: a stream that never asks, to Parquet, does not look)
        self._cuts: list[int] | None = None
        self._next = 0
        self._table = None
        self._last = 0  # the latest time given

    def _load(self) -> bool:
        if self._cuts is None:
            trace = self.trace
            starts = (
                [s for s, _ in chunk_ranges(trace, self._chunk_bytes)] if trace.shape[0] else []
            )
            self._cuts = [*starts, int(trace.shape[0])]
        if self._next + 1 >= len(self._cuts):
            return False
        lo, hi = self._cuts[self._next], self._cuts[self._next + 1]
        self._next += 1
        table = decode_range(self.trace, lo, hi, buffers=self._buffers)
        self._table = (
            np.ascontiguousarray(table.kind, np.int64),
            np.ascontiguousarray(table.a, np.uint64).view(np.int64),
            np.ascontiguousarray(table.b, np.int64),
        )
        self.state[P] = 0
        return True

    def times(
        self,
        ips: np.ndarray,
        cls: np.ndarray,
        to_ns: tuple[int, int, int] | None = None,
        *,
        out: np.ndarray | None = None,
        targets: np.ndarray | None = None,
    ) -> np.ndarray:
        """The TSC perf gives each of ``ips`` (transfer classes ``cls``, the
        instructions following those of the previous call); 0: none.  With
        ``to_ns`` (perf's ``time_shift``, ``time_mult``, ``time_zero``) the
        perf time in nanoseconds instead (int64; -1: none), into ``out``
        when given (an int64 array of their size).  ``targets``: where each
        :data:`C_DIRECT` instruction branches to (needed with those)."""
        ips = np.ascontiguousarray(ips, np.uint64)
        cls = np.ascontiguousarray(cls, np.uint8)
        tgt = _NO_TARGETS if targets is None else np.ascontiguousarray(targets, np.uint64)
        if out is None:
            out = np.zeros(ips.shape[0], np.int64)
        else:
            out[:] = 0
        i = 0
        while i < ips.shape[0]:
            if self._table is None and not self._load():
                out[i:] = self.state[SAMPLE]
                break
            kind, a, b = self._table
            i = _run(kind, a, b, kind.shape[0], self.state, self.fstate, *self.params,
                     ips, cls, tgt, out, i)  # fmt: skip
            if i < ips.shape[0] and not self._load():
                out[i:] = self.state[SAMPLE]
                break
        # perf keeps a queue's time from going backwards (intel_pt_run_decoder).
        if to_ns is None:
            out = np.maximum.accumulate(np.maximum(out, self._last))
            if out.shape[0]:
                self._last = int(out[-1])
            return out.view(np.uint64)
        shift, mult, zero = to_ns
        self._last = int(
            _monotonic_ns(out, self._last, shift, np.uint64(mult), np.uint64(zero % (1 << 64)))
        )
        return out
