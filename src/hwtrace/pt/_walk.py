"""The compiled fast path of flow reconstruction.

Most of a trace is conditional branches (TNT bits), indirect targets (TIP)
and timing packets between them.  :func:`walk` consumes exactly those while
walking the address space's basic blocks, which live in a :class:`BlockTable`
(numpy arrays with an open-addressing hash index).  Everything else (PSB+,
FUP, mode changes, overflows, paging, power events, errata, errors, code
that is not decoded yet) makes it stop and hand its state back to the
interpreted decoder in :mod:`hwtrace.pt.flow`, which follows Intel's
reference semantics to the letter; the kernel re-enters as soon as the
state is plain again.  Both paths therefore give one truth, and the test
suite checks that they agree instruction for instruction.

A table block is a run of instructions executed one after the other: it
ends at the first instruction that may transfer control (any branch), so
the kernel follows direct jumps and calls itself.  The block's last
instruction decides what happens next (``BK_*``).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .kinds import Kind

# How a table block ends.
BK_FALL = 0  # next block follows without a branch (a decode stop, see below)
BK_COND = 1  # conditional branch: one TNT bit
BK_JUMP = 2  # direct jump: no trace
BK_CALL = 3  # direct call: no trace, pushes the return address
BK_IJUMP = 4  # indirect jump: TIP
BK_ICALL = 5  # indirect call: TIP, pushes the return address
BK_RET = 6  # near return: compressed (TNT bit) or TIP
BK_STOP = 7  # anything else: far branches, code errors; the slow path decides

# Why the kernel returned.
R_FULL = 1  # output arrays full
R_MISS = 2  # no table block at ip yet
R_STOP = 3  # the next block needs the interpreted decoder; state at its start
R_FETCH = 4  # the next packet is not plain flow; the event decoder takes it
R_LOOP = 5  # too many blocks without trace (a jump-to-self loop)

# State vector slots (int64): positions, sizes and flags.
S_POS, S_EVT, S_TNT_SIZE, S_HAS_TSC, S_EV_HAS_TSC, S_ICNT, S_HAS_ICNT = range(7)
S_NOUT, S_RS_TOP, S_RS_N, S_CBR = range(7, 11)
S_SIZE = 11
# State vector slots (uint64): addresses, bits and times.
U_IP, U_TIP, U_LAST_IP, U_TSC, U_EV_TSC, U_TNT_BITS = range(6)
U_SIZE = 6
# Current event kinds in S_EVT.
EV_TNT, EV_TIP = 1, 2

RETSTACK_SIZE = 64
_RS_MASK = RETSTACK_SIZE - 1  # a power of two: wrap with a mask
_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
_NO_TRACE_LIMIT = 1 << 20


class BlockTable:
    """Basic blocks of one address space and execution mode, growable.

    ``insn[first[i] : first[i] + ninsn[i]]`` are block ``i``'s instruction
    addresses, for walks that must stop inside a block (a PSB+'s address).
    """

    def __init__(self, capacity: int = 1 << 12) -> None:
        self.n = 0
        self.ip = np.zeros(capacity, np.uint64)
        self.ninsn = np.zeros(capacity, np.uint32)
        self.kind = np.zeros(capacity, np.uint8)
        self.next_ip = np.zeros(capacity, np.uint64)  # after the last instruction
        self.target = np.zeros(capacity, np.uint64)  # direct branch target
        self.first = np.zeros(capacity, np.int64)
        self.keys = np.full(capacity * 2, _EMPTY, np.uint64)
        self.slots = np.full(capacity * 2, -1, np.int32)
        self.n_insn = 0
        self.insn = np.zeros(capacity * 4, np.uint64)

    def add(self, ip: int, kind: int, next_ip: int, target: int, insns: list[int]) -> int:
        if self.n == self.ip.shape[0]:
            self._grow()
        while self.n_insn + len(insns) > self.insn.shape[0]:
            self.insn = np.concatenate([self.insn, np.zeros_like(self.insn)])
        i = self.n
        self.ip[i], self.ninsn[i], self.kind[i] = ip, len(insns), kind
        self.next_ip[i], self.target[i] = next_ip, target
        self.first[i] = self.n_insn
        self.insn[self.n_insn : self.n_insn + len(insns)] = insns
        self.n_insn += len(insns)
        self.n += 1
        _insert(self.keys, self.slots, np.uint64(ip), i)
        return i

    def _grow(self) -> None:
        cap = self.ip.shape[0] * 2
        for name in ("ip", "ninsn", "kind", "next_ip", "target", "first"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)
        self.keys = np.full(cap * 2, _EMPTY, np.uint64)
        self.slots = np.full(cap * 2, -1, np.int32)
        _rehash(self.keys, self.slots, self.ip, self.n)


@nb.njit(cache=True, inline="always")
def _hash(ip, mask):
    h = (ip * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)
    return np.int64(h & np.uint64(mask))


@nb.njit(cache=True)
def _insert(keys, slots, ip, index):
    mask = keys.shape[0] - 1
    h = _hash(ip, mask)
    while keys[h] != _EMPTY and keys[h] != ip:
        h = (h + 1) & mask
    keys[h] = ip
    slots[h] = index


@nb.njit(cache=True)
def _rehash(keys, slots, ips, n):
    for i in range(n):
        _insert(keys, slots, ips[i], i)


@nb.njit(cache=True, inline="always")
def _lookup(keys, slots, ip):
    mask = keys.shape[0] - 1
    h = _hash(ip, mask)
    while True:
        k = keys[h]
        if k == ip:
            return slots[h]
        if k == _EMPTY:
            return -1
        h = (h + 1) & mask


@nb.njit(cache=True, inline="always")
def _decompress(ipc, payload, last_ip):
    """The IP of a TIP packet, or -1 as ipc when it cannot be taken here."""
    if ipc == 1:
        return (last_ip & ~np.uint64(0xFFFF)) | (payload & np.uint64(0xFFFF)), 1
    if ipc == 2:
        return (last_ip & ~np.uint64(0xFFFFFFFF)) | (payload & np.uint64(0xFFFFFFFF)), 1
    if ipc == 3:
        if payload & np.uint64(1 << 47):
            return payload | np.uint64(0xFFFF000000000000), 1
        return payload, 1
    if ipc == 4:
        m = np.uint64(0xFFFFFFFFFFFF)
        return (last_ip & ~m) | (payload & m), 1
    if ipc == 6:
        return payload, 1
    return last_ip, -1


@nb.njit(cache=True, inline="always")
def _emit(out_ip, out_ninsn, out_time, out_off, out_mode, nout, ip, ninsn, time, off, mode):
    out_ip[nout] = ip
    out_ninsn[nout] = ninsn
    out_time[nout] = time
    out_off[nout] = off
    out_mode[nout] = mode
    return nout + 1


@nb.njit(cache=True, inline="always")
def _push(retstack, rs_top, rs_n, address):
    """Push a return address; the oldest entry goes when the stack is full."""
    rs_top = (rs_top + 1) & _RS_MASK
    retstack[rs_top] = address
    return rs_top, min(rs_n + 1, RETSTACK_SIZE)


@nb.njit(cache=True, inline="always")
def _time(tsc, have_tsc, p):
    # Events without a time stamp carry 0, as the reference decoder's do.
    return tsc[p] if have_tsc[p] else np.uint64(0)


@nb.njit(cache=True)
def _psb_plus(kind, a, b, n, p, mode_bits):
    """Read the PSB+ at packet ``p`` when it only restates the state: tracing
    on (FUP with an IP), the same MODE.Exec, time and CBR.  Returns
    ``(psbend, ip, cbr)``; psbend -1 when the reference decoder must take it."""
    q = p + 1
    ip = np.uint64(0)
    have_ip = False
    cbr = np.int64(-1)
    while q < n:
        k = kind[q]
        if k == 1 or k == 15 or k == 16 or k == 17 or k == 18:  # PAD TSC MTC TMA CYC
            pass
        elif k == 14:  # CBR
            cbr = np.int64(a[q])
        elif k == 9:  # FUP
            if b[q] == 0:
                return -1, ip, cbr
            ip, ok = _decompress(b[q], a[q], np.uint64(0))
            if ok < 0:
                return -1, ip, cbr
            have_ip = True
        elif k == 10:  # MODE.Exec
            if np.int64(a[q] & np.uint64(3)) != mode_bits:
                return -1, ip, cbr
        elif k == 3:  # PSBEND
            if not have_ip:
                return -1, ip, cbr
            return q, ip, cbr
        else:
            return -1, ip, cbr
        q += 1
    return -1, ip, cbr


@nb.njit(cache=True, inline="always")
def _fetch(kind, a, b, tsc, have_tsc, n, p, last_ip):
    """The next flow event from packet ``p`` on.

    Returns ``(evt, pos, bits_or_ip, size, last_ip, ev_tsc, ev_has_tsc)``;
    ``evt`` is 0 when the packet at ``pos`` is not plain flow (the event
    decoder must take it).
    """
    while p < n:
        k = kind[p]
        if k == 1 or k == 15 or k == 16 or k == 17 or k == 18:  # PAD TSC MTC TMA CYC
            p += 1
            continue
        if k == 4 or k == 5:  # TNT8 TNT64
            if b[p] == 0:
                break
            return (
                EV_TNT,
                p + 1,
                a[p],
                np.int64(b[p]),
                last_ip,
                _time(tsc, have_tsc, p),
                have_tsc[p],
            )
        if k == 6:  # TIP
            ip, ok = _decompress(b[p], a[p], last_ip)
            if ok < 0 or b[p] == 0:
                break
            return EV_TIP, p, ip, np.int64(0), ip, _time(tsc, have_tsc, p), have_tsc[p]
        break
    return 0, p, np.uint64(0), np.int64(0), last_ip, np.uint64(0), False


@nb.njit(cache=True, nogil=True)
def walk(
    kind, a, b, tsc, have_tsc, offsets, mode, psb_mode_bits,
    t_keys, t_slots, t_ip, t_ninsn, t_kind, t_next, t_target, t_first, t_insn,
    retstack, su, si,
    out_ip, out_ninsn, out_time, out_off, out_mode,
):  # fmt: skip
    """Walk blocks against the current TNT/TIP event until something needs
    the interpreted decoder.  Appends blocks to ``out_*`` from ``si[S_NOUT]``;
    ``offsets`` has the trace offset of each packet and one past the last.

    The state lives in locals (registers) and goes back to ``su``/``si`` on
    return.  A PSB+ that only restates the state (``psb_mode_bits`` >= 0: the
    MODE.Exec CS.L/CS.D bits it must carry) is taken here too: the flow is
    walked to the address it names, as the reference decoder does.
    """
    n = kind.shape[0]
    cap = out_ip.shape[0]
    nout = si[S_NOUT]
    ip = su[U_IP]
    pos = si[S_POS]
    evt = si[S_EVT]
    size = si[S_TNT_SIZE]
    bits = su[U_TNT_BITS]
    tip = su[U_TIP]
    last_ip = su[U_LAST_IP]
    cur_tsc = su[U_TSC]
    has_tsc = si[S_HAS_TSC] != 0
    ev_tsc = su[U_EV_TSC]
    ev_has_tsc = si[S_EV_HAS_TSC] != 0
    icnt = si[S_ICNT]
    has_icnt = si[S_HAS_ICNT] != 0
    rs_top = si[S_RS_TOP]
    rs_n = si[S_RS_N]
    quiet = 0
    one = np.uint64(1)
    r = 0
    while True:
        if nout >= cap:
            r = R_FULL
            break
        blk = _lookup(t_keys, t_slots, ip)
        if blk < 0:
            r = R_MISS
            break
        bk = t_kind[blk]
        # Check the block's exit can be taken here before emitting it, so a
        # stop leaves the state at the block's start.
        if bk == BK_STOP:
            r = R_STOP
            break
        if bk == BK_COND:
            if evt != EV_TNT:
                r = R_STOP
                break
        elif bk == BK_IJUMP or bk == BK_ICALL:
            if evt != EV_TIP:
                r = R_STOP
                break
        elif bk == BK_RET:
            if evt == EV_TNT:
                if ((bits >> np.uint64(size - 1)) & one) == 0 or rs_n == 0:
                    r = R_STOP
                    break
            elif evt != EV_TIP:
                r = R_STOP
                break
        ninsn = t_ninsn[blk]
        nout = _emit(
            out_ip, out_ninsn, out_time, out_off, out_mode,
            nout, ip, ninsn, cur_tsc, offsets[pos], mode,
        )  # fmt: skip
        if has_icnt:
            icnt += ninsn
        if bk == BK_FALL:
            ip = t_next[blk]
        elif bk == BK_JUMP:
            ip = t_target[blk]
        elif bk == BK_CALL:
            rs_top, rs_n = _push(retstack, rs_top, rs_n, t_next[blk])
            ip = t_target[blk]
        elif bk == BK_COND:
            size -= 1
            if (bits >> np.uint64(size)) & one:
                ip = t_target[blk]
            else:
                ip = t_next[blk]
        elif bk == BK_RET and evt == EV_TNT:
            size -= 1
            ip = retstack[rs_top]
            rs_top = (rs_top - 1) & _RS_MASK
            rs_n -= 1
        else:  # TIP: indirect jump or call, uncompressed return
            if bk == BK_ICALL:
                rs_top, rs_n = _push(retstack, rs_top, rs_n, t_next[blk])
            ip = tip
            evt = 0  # consumed
        if bk <= BK_CALL and bk != BK_COND:
            # No trace consumed (fall-through, direct jump or call).
            quiet += 1
            if quiet > _NO_TRACE_LIMIT:
                r = R_LOOP
                break
            continue
        quiet = 0
        # The consumed event's time is the decoder's time from now on.
        cur_tsc = ev_tsc
        has_tsc = ev_has_tsc
        icnt = 0
        has_icnt = True
        if evt == EV_TNT and size > 0:
            continue
        p = pos if evt == EV_TNT else pos + 1
        evt, pos, val, size, last_ip, ev_tsc, ev_has_tsc = _fetch(
            kind, a, b, tsc, have_tsc, n, p, last_ip
        )
        if evt == EV_TNT:
            bits = val
            continue
        if evt == EV_TIP:
            tip = val
            continue
        # Not plain flow.  A PSB+ that restates the state: walk to its IP.
        # (Only while no event is pending: after a TNT, ``pos`` is already
        # past it and a PSB+ there must wait until its bits are used up.)
        while evt == 0 and psb_mode_bits >= 0 and pos < n and kind[pos] == 2:
            psbend, target, cbr = _psb_plus(kind, a, b, n, pos, psb_mode_bits)
            if psbend < 0:
                break
            psb_tsc = _time(tsc, have_tsc, psbend)
            reached = False
            steps = 0
            while steps < _NO_TRACE_LIMIT and nout < cap:
                steps += 1
                if ip == target:
                    reached = True
                    break
                blk = _lookup(t_keys, t_slots, ip)
                if blk < 0:
                    break
                bk = t_kind[blk]
                first = t_first[blk]
                inside = -1
                for j in range(1, t_ninsn[blk]):
                    if t_insn[first + j] == target:
                        inside = j
                        break
                if inside > 0:
                    nout = _emit(
                        out_ip, out_ninsn, out_time, out_off, out_mode,
                        nout, ip, inside, psb_tsc, offsets[psbend], mode,
                    )  # fmt: skip
                    ip = target
                    reached = True
                    break
                if bk != BK_FALL and bk != BK_JUMP and bk != BK_CALL:
                    break  # trace needed before the PSB+'s IP: an error
                nout = _emit(
                    out_ip, out_ninsn, out_time, out_off, out_mode,
                    nout, ip, t_ninsn[blk], psb_tsc, offsets[psbend], mode,
                )  # fmt: skip
                if bk == BK_CALL:
                    rs_top, rs_n = _push(retstack, rs_top, rs_n, t_next[blk])
                    ip = t_target[blk]
                elif bk == BK_JUMP:
                    ip = t_target[blk]
                else:
                    ip = t_next[blk]
            if not reached:
                break
            # The PSB+'s status events: time, the trigger anchor, CBR.
            cur_tsc = psb_tsc
            has_tsc = have_tsc[psbend]
            icnt = 0
            has_icnt = True
            last_ip = target
            if cbr >= 0:
                si[S_CBR] = cbr
            evt, pos, val, size, last_ip, ev_tsc, ev_has_tsc = _fetch(
                kind, a, b, tsc, have_tsc, n, psbend + 1, last_ip
            )
            if evt == EV_TNT:
                bits = val
            elif evt == EV_TIP:
                tip = val
        if evt == 0:
            r = R_FETCH
            break
    su[U_IP] = ip
    si[S_POS] = pos
    si[S_EVT] = evt
    si[S_TNT_SIZE] = size
    su[U_TNT_BITS] = bits
    su[U_TIP] = tip
    su[U_LAST_IP] = last_ip
    su[U_TSC] = cur_tsc
    si[S_HAS_TSC] = has_tsc
    su[U_EV_TSC] = ev_tsc
    si[S_EV_HAS_TSC] = ev_has_tsc
    si[S_ICNT] = icnt
    si[S_HAS_ICNT] = has_icnt
    si[S_RS_TOP] = rs_top
    si[S_RS_N] = rs_n
    si[S_NOUT] = nout
    return r


__all__ = [
    "BK_CALL",
    "BK_COND",
    "BK_FALL",
    "BK_ICALL",
    "BK_IJUMP",
    "BK_JUMP",
    "BK_RET",
    "BK_STOP",
    "EV_TIP",
    "EV_TNT",
    "RETSTACK_SIZE",
    "R_FETCH",
    "R_FULL",
    "R_LOOP",
    "R_MISS",
    "R_STOP",
    "BlockTable",
    "Kind",
    "walk",
]
