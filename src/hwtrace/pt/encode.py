"""A software Intel PT encoder: the packets hardware would write for an
executed instruction path.

Ground truth for the flow decoders.  An emulator or single-stepper records
which instructions ran, in order; :func:`encode_path` turns that path into the
Intel PT stream a processor tracing it would have produced, so decoding the
stream must give the path back exactly.  The rules follow the SDM's Intel PT
chapter and what Intel's reference decoder (libipt) relies on:

* the stream starts with PSB+ (PSB, optional TSC/TMA/CBR, MODE.Exec, PSBEND;
  no FUP, tracing is not yet enabled) followed by MODE.Exec and TIP.PGE with
  the first instruction's IP;
* conditional branches are TNT bits (TNT-8 with up to 6 bits, or TNT-64 with
  up to 47); the pending bits are flushed before any TIP, FUP, TIP.PGD or PSB
  so the decoder meets them in execution order;
* indirect jumps and calls, far transfers and uncompressed returns are TIPs
  with the smallest IP compression against the decoder's last IP; optionally
  the TIPs of indirect jumps and calls are deferred behind an in-progress TNT
  (an optional hardware optimization the SDM describes), never those of
  returns: a decoder tells a compressed RET from an uncompressed one by
  whether TNT bits are in progress;
* with return compression a near RET to the address pushed by the matching
  CALL is a taken TNT bit.  The call stack mirrors the decoder's: 64 entries,
  the oldest dropped on overflow, no push for a zero-displacement CALL, popped
  only by compressed returns.  It starts empty at every PSB and TIP.PGE,
  because a decoder may start there (SDM: only RETs whose CALLs were seen
  since the last PSB may be compressed);
* direct jumps and calls produce nothing;
* every ``psb_period`` bytes, at the next instruction boundary, a PSB+ with a
  FUP of the next instruction's IP (the last IP is reset at a PSB, so IPs
  after it are sent uncompressed);
* an asynchronous interrupt between two instructions is FUP(the IP that would
  have run next) + TIP(the handler's IP);
* tracing switched off is TIP.PGD: bound to the branch whose target left the
  traced region (TIP.PGD with the target IP, no TNT bit or TIP for the
  branch) or asynchronous (FUP(next IP) + TIP.PGD with the IP suppressed);
  switched on again it is MODE.Exec + TIP.PGE at the IP where tracing resumes.
  The path ends with a TIP.PGD the same way.
* events are placed only where every decoder binds them to the same
  instruction.  A decoder with an event pending walks the straight-line code
  after the last branch outcome it used until it reaches the event's IP; if
  that IP occurs in that code before the intended place, the stream is
  ambiguous.  For a TIP.PGD bound to a branch (whose target IP can be any
  earlier instruction, e.g. a loop head) libipt's block decoder and hwtrace
  stop at the first occurrence while libipt's instruction decoder binds to
  the branch; the encoder then disables asynchronously instead.  For a FUP
  (whose IP is the next instruction) this needs an infinite loop of
  straight-line code; the encoder refuses it.
* timing, optional: TSC (and TMA with MTC) in PSB+, MTC packets whenever the
  crystal clock crosses an MTC period, CYC packets with the cycles since the
  previous CYC before each TNT, TIP, FUP, TIP.PGE, TIP.PGD and MTC.  Time is
  modelled as ``cycles`` core clocks per instruction; TSC runs at the core
  clock and the crystal clock at TSC / ``ctc_ratio``.

Each distinct IP is classified once (iced-x86, :mod:`hwtrace.isa.x86`); the
walk over the path and the packet emission run in a compiled loop that
writes packet columns, which :func:`~hwtrace.pt.packets.encode_table` turns
into bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import aot
from ..columns import distinct, distinct_inverse, distinct_rows_inverse, member
from ..image import Image
from ..isa.x86 import IClass, InsnCache, Special
from ._loops import encoded_size
from .config import PtConfig
from .kinds import Kind
from .packets import encode_table

Reader = Callable[[int, int], bytes]

# The loop Python calls (the others are built into it: hwtrace.aot).
AOT_ENTRIES = ("encode_loop",)

# Instruction classes of the loop.
C_BAD, C_OTHER, C_COND, C_JMP, C_CALL, C_IJMP, C_ICALL, C_RET, C_FAR = range(9)

# Events between path[p - 1] and path[p], indexed by p.
EV_NONE, EV_INTERRUPT, EV_DISABLE, EV_ENABLE = 0, 1, 2, 3

# Loop error codes.
ERR_BAD_INSN = 1  # no valid instruction at the IP
ERR_FLOW = 2  # the next IP is impossible after this instruction
ERR_AMBIGUOUS = 3  # a decoder would bind the event earlier in the path
ERR_NO_END_IP = 4  # the path ends on a branch and no end_ip was given

_ERROR_TEXT = {
    ERR_BAD_INSN: "no valid instruction at {ip:#x}",
    ERR_FLOW: "the instruction at {ip:#x} cannot continue at the next IP of the path",
    ERR_AMBIGUOUS: (
        "the event after the instruction at {ip:#x} would bind earlier: its IP "
        "is reached by straight-line code since the last branch"
    ),
    ERR_NO_END_IP: "the path ends at {ip:#x} where the next IP is not known: pass end_ip",
}

# Statistics the loop counts (indexes into its stats array).
STAT_NAMES = (
    "tnt_bits",
    "tip",
    "ret_compressed",
    "ret_uncompressed",
    "psb",
    "sync_disable",
    "async_disable",
    "interrupt",
    "enable",
    "max_call_depth",
    "call_overflow",
    "mtc",
    "cyc",
    "deferred_tip",
    "tsc",
    "ptw",
)
_ST_TNT_BITS, _ST_TIP, _ST_RET_C, _ST_RET_U, _ST_PSB = 0, 1, 2, 3, 4
_ST_SYNC_OFF, _ST_ASYNC_OFF, _ST_INTR, _ST_ENABLE, _ST_DEPTH = 5, 6, 7, 8, 9
_ST_OVERFLOW, _ST_MTC, _ST_CYC, _ST_DEFERRED, _ST_TSC = 10, 11, 12, 13, 14
_ST_PTW = 15


_RETSTACK = 64
_MAX_DEFERRED = 32  # deferred TIPs held back at most (then the TNT is sent)
_MODE_64 = 1  # MODE.Exec CS.L

# Loop state: one int64 array (helpers update it in place) ...
_ROW, _BYTES, _PSB_AT, _TNT_N, _HAVE_LAST, _CYCLES, _LAST_CYC, _MTC_LAST = range(8)
_CYC_ON, _IP_COMP, _N_DEFERRED, _POS = 8, 9, 10, 11
_N_ST = 12
# ... and one uint64 array: TNT bits, last IP, then the deferred TIPs' IPs.
_TNT_BITS, _LAST_IP, _DEFERRED = 0, 1, 2

_U64 = np.uint64
# Packet kinds as the loops use them (plain ints: no enum in native code).
_K_CBR = int(Kind.CBR)
_K_CYC = int(Kind.CYC)
_K_FUP = int(Kind.FUP)
_K_MODE_EXEC = int(Kind.MODE_EXEC)
_K_MTC = int(Kind.MTC)
_K_PSB = int(Kind.PSB)
_K_PSBEND = int(Kind.PSBEND)
_K_PTW = int(Kind.PTW)
_K_TIP = int(Kind.TIP)
_K_TIP_PGD = int(Kind.TIP_PGD)
_K_TIP_PGE = int(Kind.TIP_PGE)
_K_TMA = int(Kind.TMA)
_K_TNT64 = int(Kind.TNT64)
_K_TNT8 = int(Kind.TNT8)
_K_TSC = int(Kind.TSC)


@aot.njit(cache=True, inline="always", _nrt=False)
def _put(out, st, kind, a, b):
    r = st[_ROW]
    if r < out[0].shape[0]:
        out[0][r] = kind
        out[1][r] = a
        out[2][r] = b
        out[3][r] = 0
        out[4][r] = st[_BYTES]
        out[5][r] = st[_POS]
    st[_ROW] = r + 1
    st[_BYTES] += encoded_size(kind, a, b, 0)


@aot.njit(cache=True, _nrt=False)
def _cyc(out, st, stats):
    """A CYC with the cycles since the last one, before a CYC-eligible packet,
    when at least ``st[_CYC_ON]`` cycles went by (the CYC threshold; 0: no
    CYC packets)."""
    if st[_CYC_ON] and st[_CYCLES] - st[_LAST_CYC] >= st[_CYC_ON]:
        _put(out, st, _K_CYC, _U64(st[_CYCLES] - st[_LAST_CYC]), 0)
        st[_LAST_CYC] = st[_CYCLES]
        stats[_ST_CYC] += 1


@aot.njit(cache=True, _nrt=False)
def _compress(ip, last, have_last, ip_comp):
    """The smallest IP compression reproducing ``ip`` (as packets.compress_ip)."""
    if ip_comp and have_last:
        if (ip >> _U64(16)) == (last >> _U64(16)):
            return 1, ip & _U64(0xFFFF)
        if (ip >> _U64(32)) == (last >> _U64(32)):
            return 2, ip & _U64(0xFFFFFFFF)
    top = ip >> _U64(47)
    if ip_comp and (top == _U64(0) or top == _U64(0x1FFFF)):
        return 3, ip & _U64(0xFFFFFFFFFFFF)
    if ip_comp and have_last and (ip >> _U64(48)) == (last >> _U64(48)):
        return 4, ip & _U64(0xFFFFFFFFFFFF)
    return 6, ip


@aot.njit(cache=True, _nrt=False)
def _ip_packet(out, st, su, kind, ip):
    ipc, payload = _compress(ip, su[_LAST_IP], st[_HAVE_LAST] != 0, st[_IP_COMP] != 0)
    _put(out, st, kind, payload, ipc)
    su[_LAST_IP] = ip
    st[_HAVE_LAST] = 1


@aot.njit(cache=True, _nrt=False)
def _flush(out, st, su, stats):
    """Send the pending TNT bits, then the TIPs deferred behind them."""
    n = st[_TNT_N]
    if n:
        _cyc(out, st, stats)
        _put(out, st, _K_TNT8 if n <= 6 else _K_TNT64, su[_TNT_BITS], n)
        st[_TNT_N] = 0
        su[_TNT_BITS] = _U64(0)
    for j in range(st[_N_DEFERRED]):
        _ip_packet(out, st, su, _K_TIP, su[_DEFERRED + j])
    st[_N_DEFERRED] = 0


@aot.njit(cache=True, _nrt=False)
def _tnt_bit(out, st, su, stats, bit, tnt_max):
    su[_TNT_BITS] = (su[_TNT_BITS] << _U64(1)) | _U64(bit)
    st[_TNT_N] += 1
    stats[_ST_TNT_BITS] += 1
    if st[_TNT_N] >= tnt_max:
        _flush(out, st, su, stats)


@aot.njit(cache=True, _nrt=False)
def _tip(out, st, su, stats, ip, defer):
    """A TIP, held back behind an in-progress TNT when ``defer`` (the SDM's
    deferred TIPs: the TNT goes out first, when full or forced out)."""
    stats[_ST_TIP] += 1
    if defer and st[_TNT_N] > 0 and st[_N_DEFERRED] < _MAX_DEFERRED:
        su[_DEFERRED + st[_N_DEFERRED]] = ip
        st[_N_DEFERRED] += 1
        stats[_ST_DEFERRED] += 1
        return
    _flush(out, st, su, stats)
    _cyc(out, st, stats)
    _ip_packet(out, st, su, _K_TIP, ip)


@aot.njit(cache=True, _nrt=False)
def _psb_plus(out, st, su, stats, fup, fup_ip, timing):
    """PSB+ at the current boundary; ``timing`` = (tsc_on, tsc0, mtc_on, ctc_ratio, cbr)."""
    tsc_on, tsc0, mtc_on, ctc_ratio, cbr = timing
    st[_PSB_AT] = st[_BYTES]
    _put(out, st, _K_PSB, _U64(0), 0)
    st[_HAVE_LAST] = 0  # the decoder's last IP is reset at a PSB
    if tsc_on:
        tsc = tsc0 + st[_CYCLES]
        _put(out, st, _K_TSC, _U64(tsc) & _U64(0xFFFFFFFFFFFFFF), 0)
        if mtc_on:
            _put(out, st, _K_TMA, _U64((tsc // ctc_ratio) & 0xFFFF), tsc % ctc_ratio)
        if cbr > 0:
            _put(out, st, _K_CBR, _U64(cbr), 0)
    _put(out, st, _K_MODE_EXEC, _U64(_MODE_64), 0)
    if fup:
        _ip_packet(out, st, su, _K_FUP, fup_ip)
    _put(out, st, _K_PSBEND, _U64(0), 0)
    stats[_ST_PSB] += 1


@aot.njit(cache=True, _nrt=False)
def _time_anchor(out, st, stats, timing):
    """A TSC (and its TMA with MTC) giving the time now, where the code
    changes: the flow packets before it are earlier, those after it later,
    so a decoder places the change between them (see encode_path's
    ``anchors``)."""
    tsc_on, tsc0, mtc_on, ctc_ratio = timing[0], timing[1], timing[2], timing[3]
    if not tsc_on:
        return
    _cyc(out, st, stats)
    tsc = tsc0 + st[_CYCLES]
    _put(out, st, _K_TSC, _U64(tsc) & _U64(0xFFFFFFFFFFFFFF), 0)
    if mtc_on:
        _put(out, st, _K_TMA, _U64((tsc // ctc_ratio) & 0xFFFF), tsc % ctc_ratio)
    stats[_ST_TSC] += 1


@aot.njit(cache=True, _nrt=False)
def _straight_hits(ips, start, stop, ip):
    """Whether ``ip`` is among ``ips[start:stop]``: a decoder waiting for an
    event at ``ip`` would bind it there, before the instruction we mean."""
    for m in range(max(start, 0), stop):
        if ips[m] == ip:
            return True
    return False


def _loop_work() -> tuple:
    """The state :func:`encode_loop` starts from (zeroed here: the loop
    allocates nothing, so it runs from the native library)."""
    return (
        np.zeros(_N_ST, np.int64),
        np.zeros(_DEFERRED + _MAX_DEFERRED, np.uint64),
        np.zeros(_RETSTACK, np.uint64),
    )


@aot.njit(cache=True, _nrt=False)
def encode_loop(path, code, events, end_ip, have_end_ip, cost, opts, timing, out, stats, work):
    """Walk the path and write packet columns into ``out`` = (kind, a, b, c,
    byte offset, path position of the next instruction); rows past their size
    are only counted.

    ``path`` = (ips, uid): the IPs and each one's index into ``code`` = (class,
    fall-through IP, direct target, pushes); ``events`` = (traced, kind, ip)
    per position; ``opts`` = (ret_comp, tnt_max, psb_period, sync_disable,
    ip_comp, mtc_freq, cyc_min, defer_tips), ``cyc_min`` the cycles a CYC
    needs (0: no CYC).  Returns ``(rows, error, position)``
    with ``error`` 0 or an ``ERR_*`` code for the instruction at ``position``.
    ``work``: the loop's zeroed state (:func:`_loop_work`).
    """
    ips, uid = path
    u_cls, u_fall, u_target, u_push = code
    traced, ev_kind, ev_ip, ptw_size, ptw_value, ptw_fup, anchor = events
    ret_comp, tnt_max, psb_period, sync_disable, ip_comp, mtc_freq, cyc_on, defer = opts
    tsc0, mtc_on, ctc_ratio = timing[1], timing[2], timing[3]
    n = ips.shape[0]
    st, su, stack = work
    st[_CYC_ON] = cyc_on
    st[_IP_COMP] = ip_comp
    depth = 0  # entries on the call stack (a ring; ``top`` is the next slot)
    top = 0
    if mtc_on:
        st[_MTC_LAST] = (tsc0 // ctc_ratio) >> mtc_freq  # in full, to see wraps
    # Where the decoder last took an IP or branch outcome from the trace: it
    # walks the straight-line code after it while an event is pending.
    last_trace = -1

    _psb_plus(out, st, su, stats, False, _U64(0), timing)
    if n > 0 and traced[0]:
        _put(out, st, _K_MODE_EXEC, _U64(_MODE_64), 0)
        _cyc(out, st, stats)
        _ip_packet(out, st, su, _K_TIP_PGE, ips[0])
        stats[_ST_ENABLE] += 1

    for i in range(n):
        st[_POS] = i + 1
        if not traced[i]:
            st[_CYCLES] += cost[i]
            if i + 1 < n and traced[i + 1]:
                # Tracing resumes: a fresh call stack, as at a PSB.
                depth = 0
                if anchor[i + 1]:
                    _time_anchor(out, st, stats, timing)
                _put(out, st, _K_MODE_EXEC, _U64(_MODE_64), 0)
                _cyc(out, st, stats)
                _ip_packet(out, st, su, _K_TIP_PGE, ips[i + 1])
                stats[_ST_ENABLE] += 1
                last_trace = i
            continue

        if i + 1 == n:
            if not have_end_ip:
                return st[_ROW], ERR_NO_END_IP, i
            nxt = end_ip
            ek = EV_DISABLE
        else:
            nxt = ips[i + 1]
            ek = ev_kind[i + 1]
        eff = ev_ip[i + 1] if ek == EV_INTERRUPT else nxt  # where this instruction went
        u = uid[i]
        cls = u_cls[u]
        if cls == C_BAD:
            return st[_ROW], ERR_BAD_INSN, i

        # Tracing stops at this branch: TIP.PGD with the target replaces the
        # branch's TNT bit or TIP (a decoder binds it to the first branch that
        # needs trace, or to a direct one going to the PGD's IP).
        bound = False
        if ek == EV_DISABLE and sync_disable:
            binds = cls == C_COND or cls == C_IJMP or cls == C_ICALL or cls == C_RET
            binds = binds or cls == C_FAR
            if (cls == C_JMP or cls == C_CALL) and u_target[u] == nxt:
                binds = True
            if binds and not _straight_hits(ips, last_trace + 1, i + 1, nxt):
                _flush(out, st, su, stats)
                _cyc(out, st, stats)
                _ip_packet(out, st, su, _K_TIP_PGD, nxt)
                stats[_ST_SYNC_OFF] += 1
                bound = True

        if not bound:
            if cls == C_OTHER:
                if eff != u_fall[u]:
                    return st[_ROW], ERR_FLOW, i
            elif cls == C_COND:
                if eff == u_target[u]:
                    bit = 1
                elif eff == u_fall[u]:
                    bit = 0
                else:
                    return st[_ROW], ERR_FLOW, i
                _tnt_bit(out, st, su, stats, bit, tnt_max)
                last_trace = i
            elif cls == C_JMP or cls == C_CALL:
                if eff != u_target[u]:
                    return st[_ROW], ERR_FLOW, i
            elif cls == C_RET:
                if ret_comp and depth > 0 and stack[(top - 1) % _RETSTACK] == eff:
                    top = (top - 1) % _RETSTACK
                    depth -= 1
                    _tnt_bit(out, st, su, stats, 1, tnt_max)
                    stats[_ST_RET_C] += 1
                else:
                    # Never deferred: a decoder tells a compressed RET from
                    # an uncompressed one by whether TNT bits are in progress.
                    _tip(out, st, su, stats, eff, False)
                    stats[_ST_RET_U] += 1
                last_trace = i
            else:  # indirect jump or call, far transfer
                _tip(out, st, su, stats, eff, defer and cls != C_FAR)
                last_trace = i
            if u_push[u] and ret_comp:
                stack[top] = u_fall[u]
                top = (top + 1) % _RETSTACK
                if depth == _RETSTACK:
                    stats[_ST_OVERFLOW] += 1  # the oldest entry is overwritten
                else:
                    depth += 1
                stats[_ST_DEPTH] = max(stats[_ST_DEPTH], depth)

            if ek == EV_INTERRUPT or ek == EV_DISABLE:
                # Asynchronous: the decoder binds the FUP where it reaches its IP.
                if _straight_hits(ips, last_trace + 1, i + 1, eff):
                    return st[_ROW], ERR_AMBIGUOUS, i
                _flush(out, st, su, stats)
                _cyc(out, st, stats)
                _ip_packet(out, st, su, _K_FUP, eff)
                if ek == EV_INTERRUPT:
                    _ip_packet(out, st, su, _K_TIP, nxt)
                    stats[_ST_INTR] += 1
                    last_trace = i
                else:
                    _put(out, st, _K_TIP_PGD, _U64(0), 0)
                    stats[_ST_ASYNC_OFF] += 1

        if ptw_size[i]:
            # PTWRITE: its PTW packet (after the branch outcomes before it,
            # so a decoder reaches it in order), with the instruction's IP
            # in a FUP when FUPonPTW is set.
            _flush(out, st, su, stats)
            r = st[_ROW]
            _put(out, st, _K_PTW, ptw_value[i], 1 if ptw_size[i] == 8 else 0)
            if ptw_fup:
                if r < out[0].shape[0]:
                    out[3][r] = 1
                _ip_packet(out, st, su, _K_FUP, ips[i])
            stats[_ST_PTW] += 1

        # The code changes before the next instruction: the branch outcomes
        # so far go out now, at this instruction's time.
        change = anchor[i + 1] and ek != EV_DISABLE
        if change:
            _flush(out, st, su, stats)
        st[_CYCLES] += cost[i]
        if ek == EV_DISABLE:
            continue
        if mtc_on:
            now = ((tsc0 + st[_CYCLES]) // ctc_ratio) >> mtc_freq
            if now != st[_MTC_LAST]:
                # Timing packets leave the TNT buffer alone.
                _cyc(out, st, stats)
                if now - st[_MTC_LAST] >= 256:
                    # A whole MTC wrap or more went by (the hardware sends an
                    # MTC every period; one here would lose the wraps): the
                    # time in full, as TSC with its TMA.
                    tsc = tsc0 + st[_CYCLES]
                    _put(out, st, _K_TSC, _U64(tsc) & _U64(0xFFFFFFFFFFFFFF), 0)
                    _put(out, st, _K_TMA, _U64((tsc // ctc_ratio) & 0xFFFF), tsc % ctc_ratio)
                    stats[_ST_TSC] += 1
                else:
                    _put(out, st, _K_MTC, _U64(now & 0xFF), 0)
                    stats[_ST_MTC] += 1
                st[_MTC_LAST] = now
        if change:
            _time_anchor(out, st, stats, timing)
        if psb_period > 0 and st[_BYTES] - st[_PSB_AT] >= psb_period:
            _flush(out, st, su, stats)
            _psb_plus(out, st, su, stats, True, nxt, timing)
            depth = 0
    _flush(out, st, su, stats)
    return st[_ROW], 0, -1


@dataclass
class EncodedTrace:
    """An encoded path: the stream and what decoding it must give back.

    One row per packet in ``kind``, ``a``, ``b`` (the payload columns of
    :mod:`hwtrace.pt.kinds`), ``offset`` (where it starts in ``data``) and
    ``position`` (the index in ``ips`` of the instruction to run next when
    it was written).  ``stats`` counts what was encoded (``STAT_NAMES``).
    """

    data: bytes
    expected: np.ndarray  # uint64 IPs of the traced instructions, in order
    config: PtConfig  # the timing parameters a decoder needs
    ips: np.ndarray  # the whole path
    traced: np.ndarray  # bool per path position
    kind: np.ndarray
    a: np.ndarray
    b: np.ndarray
    offset: np.ndarray
    position: np.ndarray
    stats: dict[str, int] = field(default_factory=dict)

    def psb_offsets(self) -> np.ndarray:
        """Byte offsets of the PSBs, where a decoder may start."""
        return self.offset[self.kind == Kind.PSB]

    def expected_from(self, offset: int) -> np.ndarray:
        """The instructions a decoder starting at the PSB at ``offset`` must give."""
        rows = np.flatnonzero((self.offset == offset) & (self.kind == Kind.PSB))
        if rows.shape[0] != 1:
            raise ValueError(f"no PSB at offset {offset}")
        pos = int(self.position[rows[0]])
        return self.ips[pos:][self.traced[pos:]]


def _classify_unique(uniq: np.ndarray, read: Reader) -> tuple[np.ndarray, ...]:
    """Class, fall-through IP, direct target and push flag of each distinct IP."""
    cache = InsnCache(read)
    m = uniq.shape[0]
    cls = np.zeros(m, np.int8)
    fall = np.zeros(m, np.uint64)
    target = np.zeros(m, np.uint64)
    push = np.zeros(m, np.bool_)
    for j in range(m):
        insn = cache.get(int(uniq[j]), 64)
        if isinstance(insn, int):
            continue  # C_BAD
        fall[j] = insn.next_ip
        c = insn.iclass
        direct = insn.is_direct and insn.special != Special.JMPABS
        if direct:
            target[j] = (insn.next_ip + insn.displacement) & 0xFFFFFFFFFFFFFFFF
        if c in (IClass.OTHER, IClass.PTWRITE):
            cls[j] = C_OTHER
        elif c == IClass.COND_JUMP:
            cls[j] = C_COND
        elif c == IClass.JUMP:
            cls[j] = C_JMP if direct else C_IJMP
        elif c == IClass.CALL:
            cls[j] = C_CALL if direct else C_ICALL
            # A call to the next instruction (getting the IP) is no call.
            push[j] = not (direct and insn.displacement == 0)
        elif c == IClass.RETURN:
            cls[j] = C_RET
        elif c in (IClass.FAR_CALL, IClass.FAR_RETURN, IClass.FAR_JUMP):
            cls[j] = C_FAR
    return cls, fall, target, push


def _classify_versions(
    ips: np.ndarray, code: Sequence[Image | Reader], versions: np.ndarray
) -> tuple[np.ndarray, ...]:
    """:func:`_classify_unique` per distinct (version, IP) of a path that
    ran in several versions of its code; also each instruction's index."""
    readers = [c.read if isinstance(c, Image) else c for c in code]  # type: ignore[union-attr]
    ver = np.ascontiguousarray(versions, np.int64)
    if ver.shape != ips.shape or (ver < 0).any() or (ver >= len(readers)).any():
        raise ValueError("versions needs one index into code per instruction")
    keys = np.stack([ver.astype(np.uint64), ips], axis=1)
    uniq, inv = distinct_rows_inverse(keys)
    cols = [np.zeros(uniq.shape[0], t) for t in (np.int8, np.uint64, np.uint64, np.bool_)]
    for v in distinct(uniq[:, 0]).tolist():
        rows = np.flatnonzero(uniq[:, 0] == v)
        for col, got in zip(cols, _classify_unique(uniq[rows, 1], readers[v]), strict=True):
            col[rows] = got
    return (*cols, inv.reshape(-1))


def trace_points(
    ips: np.ndarray, code: Sequence[Image | Reader], versions: np.ndarray
) -> np.ndarray:
    """Per instruction of a path (run in ``code[versions[i]]``): does a
    decoder take its outcome or target from the trace (a conditional
    branch, an indirect jump or call, a return, a far transfer)?  Between
    two of these the flow follows from the code alone."""
    ips = np.ascontiguousarray(ips, np.uint64)
    if ips.shape[0] == 0:
        return np.zeros(0, np.bool_)
    u_cls, _, _, _, inv = _classify_versions(ips, code, versions)
    takes = member(u_cls, np.sort(np.array([C_COND, C_IJMP, C_ICALL, C_RET, C_FAR], np.int8)))
    return takes[inv.reshape(-1)]


@dataclass(frozen=True)
class PathCode:
    """The instructions of an executed path, classified for the encoder
    (:func:`classify_path`): encoding one path with several settings
    classifies its instructions once."""

    ips: np.ndarray
    cls: np.ndarray  # per distinct instruction: its C_* class,
    fall: np.ndarray  # fall-through IP,
    target: np.ndarray  # direct target
    push: np.ndarray  # and whether it pushes a return address
    uid: np.ndarray  # per instruction of the path: its distinct instruction


def classify_path(
    ips: np.ndarray,
    code: Image | Reader | Sequence[Image | Reader],
    versions: np.ndarray | None = None,
) -> PathCode:
    """Classify the instructions of path ``ips`` (``code`` and ``versions``
    as :func:`encode_path` takes them) for :func:`encode_path`."""
    ips = np.ascontiguousarray(ips, np.uint64)
    if versions is None:
        read: Reader = code.read if isinstance(code, Image) else code  # type: ignore[assignment]
        uniq, inv = distinct_inverse(ips)
        u_cls, u_fall, u_target, u_push = _classify_unique(uniq, read)
    else:
        u_cls, u_fall, u_target, u_push, inv = _classify_versions(ips, code, versions)
    return PathCode(ips, u_cls, u_fall, u_target, u_push, inv.reshape(-1).astype(np.int64))


def encode_path(
    ips: np.ndarray,
    code: Image | Reader | Sequence[Image | Reader] | PathCode,
    *,
    versions: np.ndarray | None = None,
    end_ip: int | None = None,
    ret_compression: bool = True,
    long_tnt: bool = False,
    ip_compression: bool = True,
    psb_period: int = 4096,
    sync_disable: bool = True,
    defer_tips: bool = False,
    interrupts: Sequence[tuple[int, int]] = (),
    trace_off: Sequence[tuple[int, int]] = (),
    tsc: int | None = None,
    mtc_freq: int | None = None,
    cyc: bool = False,
    cyc_thresh: int = 0,
    ctc_ratio: int = 4,
    cbr: int = 8,
    cycles: np.ndarray | None = None,
    ptwrites: Sequence[tuple[int, int, int]] = (),
    fup_on_ptw: bool = True,
    anchors: Sequence[int] = (),
) -> EncodedTrace:
    """Encode an executed instruction path as Intel PT.

    ``ips`` are the IPs of the executed instructions in execution order (64-bit
    code); ``code`` is an :class:`Image` or a ``read(address, size)`` callback
    giving the code bytes, or the :class:`PathCode` of a path that begins
    with ``ips`` (:func:`classify_path`).  ``end_ip`` is where execution went after the last
    instruction (needed when that is a branch the trace must describe); the
    trace ends with a TIP.PGD there.

    Options: ``ret_compression`` (RETs to the matching call's return address
    as a taken TNT bit), ``long_tnt`` (TNT-64 packets of up to 47 bits),
    ``ip_compression`` (False: every IP sent in full), ``psb_period`` (bytes
    between PSB+; 0 for only the first), ``sync_disable`` (disable at a branch
    with TIP.PGD(target) where that is unambiguous, else FUP + TIP.PGD),
    ``defer_tips`` (hold the TIPs of indirect jumps and calls back behind an
    in-progress TNT, the SDM's optional "deferred TIPs").

    Events, by position ``p`` in ``ips`` (the event happens between
    ``ips[p - 1]`` and ``ips[p]``):

    * ``interrupts``: ``(p, source_ip)``: an asynchronous interrupt taken where
      ``source_ip`` would have run next; ``ips[p]`` is the handler's first
      instruction (so the path must contain the handler, e.g. spliced in);
    * ``trace_off``: ``(p, q)``: tracing is off for ``ips[p:q]`` (``q`` may be
      ``len(ips)``: off to the end); those instructions are not in
      :attr:`EncodedTrace.expected`;
    * ``ptwrites``: ``(p, payload, size)``: ``ips[p]`` is a PTWRITE that wrote
      ``payload`` (``size`` 4 or 8 bytes): a PTW packet, with a FUP of
      ``ips[p]`` when ``fup_on_ptw`` (IA32_RTIT_CTL.FUPonPTW);
    * ``anchors``: ``p``: the code changes before ``ips[p]`` (a new code
      revision begins there): the branch outcomes before it go out in a TNT
      of their own at ``ips[p - 1]``'s time, and a TSC (with TMA) follows
      with ``ips[p]``'s, so a decoder reading code revisions by time puts
      the change between the two (with ``tsc``; where tracing resumes at
      ``p``, the TSC comes before the TIP.PGE).

    Timing (all optional): ``tsc`` is the TSC at the first instruction (None:
    no timing packets); ``mtc_freq`` (0-15) adds TMA in PSB+ and MTC packets;
    ``cyc`` adds CYC packets, each when at least 2**(``cyc_thresh`` - 1)
    cycles went by since the last (IA32_RTIT_CTL.CycThresh; 0: at every
    CYC-eligible packet with cycles to report); ``ctc_ratio`` is TSC ticks per crystal clock
    tick, ``cbr`` the core:bus ratio sent in PSB+; ``cycles`` gives each
    executed instruction's cost in core clocks (default 1).

    Raises ValueError when the path cannot have executed (an instruction that
    does not continue at the next IP without an event to explain it, an IP
    with no valid instruction) or an event cannot be placed unambiguously.
    """
    ips = np.ascontiguousarray(ips, np.uint64)
    n = int(ips.shape[0])
    if n == 0:
        raise ValueError("empty path")
    if isinstance(code, PathCode):
        if code.ips.shape[0] < n or not np.array_equal(code.ips[:n], ips):
            raise ValueError("code is the PathCode of another path")
        pc = code
    else:
        pc = classify_path(ips, code, versions)
    u_cls, u_fall, u_target, u_push = pc.cls, pc.fall, pc.target, pc.push
    uid = pc.uid[:n]

    traced = np.ones(n, np.bool_)
    ev_kind = np.zeros(n + 1, np.int8)
    ev_ip = np.zeros(n + 1, np.uint64)
    for p, q in sorted(trace_off):
        if not 0 <= p < q <= n:
            raise ValueError(f"trace_off ({p}, {q}) is not a range of positions in the path")
        if not traced[p:q].all() or (p > 0 and not traced[p - 1]) or (q < n and not traced[q]):
            raise ValueError(f"trace_off ({p}, {q}) overlaps or touches another range")
        traced[p:q] = False
        if p > 0:
            ev_kind[p] = EV_DISABLE
        if q < n:
            ev_kind[q] = EV_ENABLE
    for p, source in interrupts:
        if not 0 < p < n or not (traced[p - 1] and traced[p]) or ev_kind[p] != EV_NONE:
            raise ValueError(
                f"interrupt at {p}: needs traced instructions on both sides and no other event"
            )
        ev_kind[p] = EV_INTERRUPT
        ev_ip[p] = source

    anchor = np.zeros(n + 1, np.bool_)
    for p in anchors:
        if not 0 <= p < n:
            raise ValueError(f"anchor at {p}: not a position in the path")
        anchor[p] = p > 0
    ptw_size = np.zeros(n, np.int8)
    ptw_value = np.zeros(n, np.uint64)
    for p, payload, size in ptwrites:
        if not 0 <= p < n or not traced[p] or size not in (4, 8):
            raise ValueError(f"ptwrite at {p}: needs a traced position and a size of 4 or 8")
        ptw_size[p] = size
        ptw_value[p] = int(payload) & ((1 << (8 * size)) - 1)

    have_end = end_ip is not None
    if not have_end:
        # The next IP is known when the last instruction needs no trace.
        j = int(uid[-1])
        if u_cls[j] == C_OTHER:
            end_ip, have_end = int(u_fall[j]), True
        elif u_cls[j] in (C_JMP, C_CALL):
            end_ip, have_end = int(u_target[j]), True
    if cycles is None:
        cost = np.ones(n, np.int64)
    else:
        cost = np.ascontiguousarray(cycles, np.int64)
        if cost.shape != (n,) or (cost < 1).any():
            raise ValueError("cycles needs one positive count per instruction")
    if mtc_freq is not None and not 0 <= mtc_freq <= 15:
        raise ValueError("mtc_freq must be 0-15")
    if not 0 <= cyc_thresh <= 15:
        raise ValueError("cyc_thresh must be 0-15")
    if not 1 <= ctc_ratio <= 0x1FF:
        raise ValueError("ctc_ratio must be 1-511 (TMA's fast counter holds 9 bits)")
    mtc_on = tsc is not None and mtc_freq is not None
    timing = (tsc is not None, int(tsc or 0), mtc_on, int(ctc_ratio), int(cbr))
    opts = (
        ret_compression,
        47 if long_tnt else 6,
        int(psb_period),
        sync_disable,
        ip_compression,
        int(mtc_freq or 0),
        (1 << max(cyc_thresh - 1, 0)) if cyc else 0,
        defer_tips,
    )

    def run(cap: int) -> tuple[Any, ...]:
        out_k = np.zeros(cap, np.uint8)
        out_a = np.zeros(cap, np.uint64)
        out_b = np.zeros(cap, np.uint32)
        out_c = np.zeros(cap, np.uint8)
        out_off = np.zeros(cap, np.int64)
        out_pos = np.zeros(cap, np.int64)
        stats = np.zeros(len(STAT_NAMES), np.int64)
        rows, err, pos = encode_loop(
            (ips, uid),
            (u_cls, u_fall, u_target, u_push),
            (traced, ev_kind, ev_ip, ptw_size, ptw_value, fup_on_ptw, anchor),
            np.uint64(end_ip or 0),
            have_end,
            cost,
            opts,
            timing,
            (out_k, out_a, out_b, out_c, out_off, out_pos),
            stats,
            _loop_work(),
        )
        if err:
            text = _ERROR_TEXT[err].format(ip=int(ips[pos]))
            raise ValueError(f"path position {pos}: {text}")
        return out_k, out_a, out_b, out_c, out_off, out_pos, stats, int(rows)

    # A counting pass sizes the columns exactly; the second one writes them.
    *_, rows = run(0)
    out_k, out_a, out_b, out_c, out_off, out_pos, stats, rows = run(rows)
    config = PtConfig(
        mtc_freq=int(mtc_freq or 0),
        nom_freq=int(cbr) if tsc is not None else 0,
        cpuid_0x15_eax=1 if mtc_on else 0,
        cpuid_0x15_ebx=int(ctc_ratio) if mtc_on else 0,
    )
    return EncodedTrace(
        data=encode_table(out_k, out_a, out_b, out_c),
        expected=ips[traced],
        config=config,
        ips=ips,
        traced=traced,
        kind=out_k,
        a=out_a,
        b=out_b,
        offset=out_off,
        position=out_pos,
        stats={name: int(v) for name, v in zip(STAT_NAMES, stats, strict=True)},
    )


__all__ = ["EncodedTrace", "PathCode", "classify_path", "encode_path", "trace_points"]
