"""Latency (delta) profiling of a decoded flow, in compiled code.

Sharma's Algorithm 1 (2017, ch. 5), done properly: intervals
open and close at *markers* (:mod:`hwtrace.analysis.patterns`: instructions,
addresses, function entries and exits, super-instructions) and are kept per
thread or per CPU; each closed interval gives its duration (Δt, from the
PT time model) and its instruction count (ΔIC, the close instruction's
index minus the open one's in the thread's or CPU's flow).  A function
call's ΔIC is the instructions it executed: N for a call whose entry
through its return are N instructions, both counted (as ``report --call``
keeps them, and the call-path profile counts them).

The walk runs over the decoder's block rows as they come, a code run at a
time: the per-instruction work (markers, sequences) happens only in runs
that hold an instruction some atom matches; elsewhere a run costs a
counter update and, at its end, a call or return on the per-thread stack of
frames.  That stack (return addresses, as :mod:`hwtrace.session.callcut`
keeps one) pairs ``exit:`` markers with the frame their function was
entered in, gives each function call its own interval (``funclatency``),
and names the call path (interned, parent and callee) where an interval
opened.

What never makes an interval: a second open before the close (counted,
the first open stands), a close with nothing open (counted), and an open
interval when the trace has a gap (tracing disabled, an overflow, a decode
error, lost data): it is dropped and counted.  A call interval with a gap
inside is dropped and counted the same way.  Tracing that goes off and on
again at the same instruction (a system call in a user-space trace), or at
the return address of the call it went off in (a function outside the
traced ranges ran and returned, hwtrace.pt.flowrows.F_RETURNED), is no gap:
the interval stands, its Δt with the untraced time, its ΔIC the
instructions traced.  Nor is tracing that left the traced ranges at a
call or a return and came back elsewhere with nothing lost
(hwtrace.pt.flowrows.GAP_REJOINED): code outside them called back into
them, as qsort calls its comparison function.  The function entered there
gets a frame of its own (called from outside), which its return out of the
ranges pops, and the call that left stays on the stack until the flow
comes back at its return address.

Time resolution: an instruction's time is its block's, the decoder's
estimate at the last timing packet it consumed before the block.  Timing
packets come before the packet they time, and a TNT packet is written
after the branches it reports, so the instruction ran between the
decoder's previous and next distinct times of the same trace stream
(``t⁻ ≤ true ≤ t⁺``; for the stream's first time, from the PSB+ decoding
started at, ``t⁻`` is that time).  The walk keeps each time as its index
among the stream's distinct times, so its neighbours are at hand.  A Δt ``t_c - t_o`` is therefore within
``max((t_c⁺ - t_c) + (t_o - t_o⁻), (t_c - t_c⁻) + (t_o⁺ - t_o))`` of the
truth; every interval carries that bound (:attr:`Intervals.resolution`,
-1 where the stream has no time before or after an end).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field

import numpy as np

from .. import aot
from ..columns import Columns
from ..isa.x86 import IClass
from ..pt import flowrows as R
from ..pt.codeindex import K_CALL, K_IJUMP, K_OTHER, K_RET
from ..pt.flowrows import (
    I_DIRECT,
    CodeTable,
    find_insn,
    gaps_before,
    hash_find,
    insn_successor,
)
from .patterns import M_ATOM, M_EXIT, M_SEQUENCE, AtomTable, PatternSet

# Per-slot state (int64): instructions so far; stack depth; the last
# instruction (kind, fall-through, direct target, index, time) whose transition
# the next instruction tells; the open interval (flag, marker, time,
# index, path, cpu); ...; whether its flow starts again at its next row
# (after a gap), the CPU of its last row.
(
    S_IC, S_SP, S_PK, S_PFALL, S_PSUCC, S_PIC, S_PT, S_OPEN, S_OM, S_OT, S_OIC, S_OPATH,
    S_OCPU, S_SEQ, S_ROOTIP, S_ROOT, S_CUR, S_GROUP, S_TPATH, S_TLAST, S_FRESH, S_CPU,
) = range(22)  # fmt: skip
NS = 22
# A call path's parent when it is a root: the function the flow was in
# with no call of it seen (where a thread's trace starts, or where a
# return left the outermost frame seen), named by an address in it.  A
# root of group ``g`` (see LatencyProfiler's ``group``) has parent
# ``ROOT - 1 - g``.
ROOT = -3
# Frame columns (int64): return address (UNSEEN: the frame of a marked
# function the flow entered at its first instruction, right after a gap or
# at its start, whose call is not in the trace), the callee's address, the call
# path (-1: not worked out yet: paths are interned only when an interval
# needs one), the exit marker its function has (-1: none), the call's
# entry time and index (-1: not a marked function's call), a gap inside it,
# whether only jumps ran in it yet (a tail-jump stub: the function its
# jump goes to is then the callee), and where a call through a PLT stub is
# (PLT_*).
F_RET, F_CALLEE, F_PATH, F_EXIT, F_T, F_IC, F_GAP, F_FRESH, F_LAZY = range(9)
NF = 9
UNSEEN = -1
# The return address of a function that code outside the traced ranges
# called (tracing came back at its entry, flowrows.GAP_REJOINED, as at
# qsort's calls of its comparison function): its return leaves the traced
# code again.
CALLED_BACK = -2
_CALLED_BACK_IP = np.uint64(CALLED_BACK & 0xFFFFFFFFFFFFFFFF)
# A call through a PLT stub: the stub's ``jmp *GOT`` goes to the function
# (PLT_IN: the call is in the stub).  If the GOT slot is not bound yet it
# goes back into the PLT (the stub's own ``push $index; jmp PLT0``; with
# IBT, a .plt.sec stub's slot leads to its .plt entry, which pushes and
# jumps to PLT0), and PLT0 jumps into ld.so's ``_dl_runtime_resolve``,
# which binds the slot and jumps to the function (System V x86-64 psABI,
# "Procedure Linkage Table").  PLT_LAZY: the next indirect jump of the
# frame enters the resolver (the frame is named after it); PLT_RESOLVER:
# the next one enters the function, and the frame is the function's call
# from then on, as it is when the slot was bound before.  While a call is
# PLT_IN or PLT_LAZY, what runs (the stub, PLT0) counts in the caller's
# path, as callgrind counts PLT code (its --skip-plt).
PLT_NONE, PLT_IN, PLT_LAZY, PLT_RESOLVER = 0, 1, 2, 3
# Bits of an instruction's atom mask (``atoms``) that are no atom: the
# instruction is in a PLT stub; it is the first of a function.
FLAG_PLT = np.uint64(1 << 63)
FLAG_START = np.uint64(1 << 62)
ATOM_MASK = np.uint64((1 << 62) - 1)
# Counters (int64).
(
    C_RECS, C_PATHS, C_REPEAT, C_UNMATCHED, C_GAPPED, C_CALL_GAPPED, C_SKIPPED, C_DEEP,
    C_TIMES, C_LAST_SLOT, C_LAST_T, C_HAVE_T, C_LAST_PATH, C_LAST_T_VALUE, C_TL,
) = range(15)  # fmt: skip
NC = 15
# Interval records (int64): kind (R_PAIR: open/close markers; R_CALL: a
# function call), slot, cpu, open and close markers, open and close
# instruction index, the open's call path, open and close time, stream.
R_KIND, R_SLOT, R_CPU, R_MOPEN, R_MCLOSE, R_ICO, R_ICC, R_PATH, R_TO, R_TC, R_STREAM = range(11)
NR = 11
R_PAIR, R_CALL = 0, 1

_CALL = int(IClass.CALL)
_FAR_CALL = int(IClass.FAR_CALL)
_RET = int(IClass.RETURN)
_FAR_RET = int(IClass.FAR_RETURN)
_JUMP = int(IClass.JUMP)
_FAR_JUMP = int(IClass.FAR_JUMP)
_EMPTY = np.int64(-2)


@aot.njit(cache=True, inline="always", _nrt=False)
def _kind(c, flags):
    if c == _CALL or c == _FAR_CALL:
        return K_CALL
    if c == _RET or c == _FAR_RET:
        return K_RET
    if (c == _JUMP and not (flags & I_DIRECT)) or c == _FAR_JUMP:
        return K_IJUMP
    return K_OTHER


@aot.njit(cache=True, _nrt=False)
def _intern(parent, addr, paths, counts):
    """The call path ``parent`` then a call of ``addr`` (made if new)."""
    h_parent, h_addr, h_val, p_parent, p_addr = paths[0], paths[1], paths[2], paths[3], paths[4]
    mask = h_parent.shape[0] - 1
    h = (np.uint64(parent) * np.uint64(0x9E3779B97F4A7C15)) ^ np.uint64(addr)
    s = np.int64((h * np.uint64(0xBF58476D1CE4E5B9)) >> np.uint64(33)) & mask
    while True:
        if h_parent[s] == _EMPTY:
            n = counts[C_PATHS]
            h_parent[s] = parent
            h_addr[s] = addr
            h_val[s] = n
            p_parent[n] = parent
            p_addr[n] = addr
            counts[C_PATHS] = n + 1
            return n
        if h_parent[s] == parent and h_addr[s] == addr:
            return h_val[s]
        s = (s + 1) & mask


@aot.njit(cache=True, nogil=True, _nrt=False)
def _intern_again(parent, addr, n, paths, counts):
    """Intern paths ``0..n`` (``parent``, ``addr``) into new tables, in
    order: their numbers stay."""
    for p in range(n):
        _intern(parent[p], addr[p], paths, counts)


# Totals per interval kind (int64): count, sums, extremes, and the
# intervals whose time went backwards (not in the time histogram).
A_COUNT, A_SUM_DT, A_SUM_DIC, A_MIN_DT, A_MAX_DT, A_MIN_DIC, A_MAX_DIC, A_NEGATIVE = range(8)
NA = 8
# Histogram buckets: exact below 8, then 8 per power of two (within 12.5%).
SUB = 8
NB = SUB + 60 * SUB


@aot.njit(cache=True, inline="always", _nrt=False)
def bucket_of(v):
    """The histogram bucket of ``v`` >= 0."""
    if v < SUB:
        return v
    e = 0
    x = v
    for shift in (32, 16, 8, 4, 2, 1):
        if x >> shift:
            e += shift
            x >>= shift
    return SUB + (e - 3) * SUB + ((v >> (e - 3)) & (SUB - 1))


def bucket_bounds(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The lowest and highest value of each bucket."""
    b = np.asarray(b, np.int64)
    small = b < SUB
    e = np.where(small, 0, (b - SUB) // SUB + 3)
    sub = np.where(small, 0, (b - SUB) % SUB)
    low = np.where(small, b, (SUB + sub) << (e - 3))
    high = np.where(small, b, ((SUB + sub + 1) << (e - 3)) - 1)
    return low, high


@aot.njit(cache=True, _nrt=False)
def _emit(out, counts, kind, slot, cpu, mo, mc, ico, icc, path, to, tc, stream):
    """An interval: its record, and its part of the totals and histograms
    (``out``: records, the stream's times, histograms, totals)."""
    rec, times, hist, agg, _ = out
    n = counts[C_RECS]
    rec[n, R_KIND], rec[n, R_SLOT], rec[n, R_CPU], rec[n, R_MOPEN] = kind, slot, cpu, mo
    rec[n, R_MCLOSE], rec[n, R_ICO], rec[n, R_ICC], rec[n, R_PATH] = mc, ico, icc, path
    rec[n, R_TO], rec[n, R_TC], rec[n, R_STREAM] = to, tc, stream
    counts[C_RECS] = n + 1
    dt = times[tc] - times[to]
    dic = icc - ico
    if agg[kind, A_COUNT] == 0:
        agg[kind, A_MIN_DT], agg[kind, A_MAX_DT] = dt, dt
        agg[kind, A_MIN_DIC], agg[kind, A_MAX_DIC] = dic, dic
    agg[kind, A_COUNT] += 1
    agg[kind, A_SUM_DIC] += dic
    agg[kind, A_MIN_DIC] = min(agg[kind, A_MIN_DIC], dic)
    agg[kind, A_MAX_DIC] = max(agg[kind, A_MAX_DIC], dic)
    hist[kind, 1, bucket_of(dic)] += 1
    if dt < 0:
        agg[kind, A_NEGATIVE] += 1
        return
    agg[kind, A_SUM_DT] += dt
    agg[kind, A_MIN_DT] = min(agg[kind, A_MIN_DT], dt)
    agg[kind, A_MAX_DT] = max(agg[kind, A_MAX_DT], dt)
    hist[kind, 0, bucket_of(dt)] += 1


@aot.njit(cache=True, _nrt=False)
def _root_path(s, ss, paths, counts):
    """Slot ``s``'s root call path (-1: none known)."""
    root = ss[s, S_ROOT]
    if root == -2:
        ip = ss[s, S_ROOTIP]
        parent = np.int64(ROOT - 1 - ss[s, S_GROUP])
        root = _intern(parent, np.uint64(ip), paths, counts) if ip else np.int64(-1)
        ss[s, S_ROOT] = root
    return root


@aot.njit(cache=True, _nrt=False)
def _path_of(s, d, ss, fr, paths, counts):
    """The call path of slot ``s``'s frame ``d`` (the root's below 0),
    interned from the innermost frame whose path is known."""
    if d < 0:
        return _root_path(s, ss, paths, counts)
    known = d
    while known >= 0 and fr[s, known, F_PATH] < 0:
        known -= 1
    path = fr[s, known, F_PATH] if known >= 0 else _root_path(s, ss, paths, counts)
    for j in range(known + 1, d + 1):
        path = _intern(path, np.uint64(fr[s, j, F_CALLEE]), paths, counts)
        fr[s, j, F_PATH] = path
        paths[7][path + 1] += 1  # a call made this path (once per frame)
    return path


@aot.njit(cache=True, inline="always", _nrt=False)
def _path_now(ss, fr, s, paths, counts):
    d = min(ss[s, S_SP], fr.shape[1]) - 1
    if d >= 0 and (fr[s, d, F_LAZY] == PLT_IN or fr[s, d, F_LAZY] == PLT_LAZY):
        d -= 1  # in a PLT stub: the caller's
    return _path_of(s, d, ss, fr, paths, counts)


@aot.njit(cache=True, inline="always", _nrt=False)
def _new_root(s, ip, ss):
    """The flow of slot ``s`` is in a function with no call of it seen."""
    ss[s, S_ROOTIP] = np.int64(ip)
    ss[s, S_ROOT] = -2
    ss[s, S_CUR] = -2


@aot.njit(cache=True, inline="always", _nrt=False)
def _open(m, s, ic, t, cpu, ss, fr, paths, counts):
    ss[s, S_OPEN], ss[s, S_OM], ss[s, S_OT], ss[s, S_OIC] = 1, m, t, ic
    ss[s, S_OPATH], ss[s, S_OCPU] = _path_now(ss, fr, s, paths, counts), cpu


@aot.njit(cache=True, _nrt=False)
def _fire(m, s, ic, t, cpu, ss, fr, counts, marks, masks, rec, paths, stream):
    """Marker ``m`` at instruction ``ic`` (time ``t``) of slot ``s``."""
    marks[m] += 1
    bit = np.uint64(1) << np.uint64(m)
    open_mask, close_mask, toggle_mask = masks[0], masks[1], masks[2]
    if toggle_mask & bit:
        if ss[s, S_OPEN]:
            _emit(rec, counts, R_PAIR, s, ss[s, S_OCPU], ss[s, S_OM], m, ss[s, S_OIC], ic,
                  ss[s, S_OPATH], ss[s, S_OT], t, stream)  # fmt: skip
            ss[s, S_OPEN] = 0
        else:
            _open(m, s, ic, t, cpu, ss, fr, paths, counts)
        return
    if close_mask & bit:
        if ss[s, S_OPEN]:
            _emit(rec, counts, R_PAIR, s, ss[s, S_OCPU], ss[s, S_OM], m, ss[s, S_OIC], ic,
                  ss[s, S_OPATH], ss[s, S_OT], t, stream)  # fmt: skip
            ss[s, S_OPEN] = 0
        elif not (open_mask & bit):
            counts[C_UNMATCHED] += 1
    if open_mask & bit:
        if ss[s, S_OPEN]:
            counts[C_REPEAT] += 1  # the first open stands
        else:
            _open(m, s, ic, t, cpu, ss, fr, paths, counts)


@aot.njit(cache=True, inline="always", _nrt=False)
def _returned(s, ip, cpu, ss, fr, counts, marks, masks, rec, paths, stream):
    """Slot ``s``'s last instruction, a return, went to ``ip``: pop down
    to the frame whose return address that is (the frames above it were
    left without a return: dropped, but for functions called back from
    outside the traced ranges, which returned there first); an exit marker
    fires at the return that pops its function's frame, and a marked
    call's interval closes."""
    top = ss[s, S_SP]
    if top > fr.shape[1]:
        ss[s, S_SP] = top - 1  # into a frame that was only counted
        ss[s, S_CUR] = -2
        return
    d = top - 1
    if d < 0 or fr[s, d, F_RET] != UNSEEN:  # (an unseen call returns anywhere)
        while d >= 0 and fr[s, d, F_RET] != np.int64(ip):
            d -= 1
    if d < 0:
        if top == 0:
            _new_root(s, ip, ss)  # out of the outermost function seen
        return  # (else to an address on no frame: a signal handler's)
    while top - 1 > d and fr[s, top - 1, F_RET] == CALLED_BACK:
        top -= 1
        _popped(s, top, cpu, ss, fr, counts, marks, masks, rec, paths, stream)
    counts[C_SKIPPED] += top - 1 - d
    _popped(s, d, cpu, ss, fr, counts, marks, masks, rec, paths, stream)


@aot.njit(cache=True, _nrt=False)
def _popped(s, d, cpu, ss, fr, counts, marks, masks, rec, paths, stream):
    """Slot ``s``'s frame ``d`` (the top now) returned at its last
    instruction."""
    e = fr[s, d, F_EXIT]
    ss[s, S_SP] = d
    ss[s, S_CUR] = -2
    if e >= 0 or (masks[7] and fr[s, d, F_IC] >= 0):  # (masks[7]: every call, e -1)
        ic, t = ss[s, S_PIC], ss[s, S_PT]
        if masks[4]:  # function calls are intervals of their own
            if fr[s, d, F_GAP]:
                counts[C_CALL_GAPPED] += 1
            elif fr[s, d, F_IC] >= 0:
                # A call's instructions: its entry through its return, both
                # counted (the close index is the one after the return).
                _emit(rec, counts, R_CALL, s, cpu, e, e, fr[s, d, F_IC], ic + 1,
                      _path_of(s, d, ss, fr, paths, counts), fr[s, d, F_T], t, stream)  # fmt: skip
        if e >= 0:
            _fire(e, s, ic, t, cpu, ss, fr, counts, marks, masks, rec, paths, stream)


@aot.njit(cache=True, inline="always", _nrt=False)
def _transition(s, ip, tbits, t, cpu, ss, fr, counts, marks, masks, rec, paths, stream):
    """What slot ``s``'s last instruction did to its stack, now that the
    next instruction (at ``ip``, its atom mask ``tbits``, time index
    ``t``) tells: a call pushes a frame, a return pops
    (:func:`_returned`), a PLT stub's jump names its frame."""
    k = ss[s, S_PK]
    if k == K_CALL:
        if np.int64(ip) == ss[s, S_PFALL]:
            return  # went out of the traced code and came back: no frame seen
        top = ss[s, S_SP]
        if top < fr.shape[1]:
            fr[s, top, F_RET], fr[s, top, F_CALLEE], fr[s, top, F_PATH] = ss[s, S_PFALL], ip, -1
            fr[s, top, F_EXIT], fr[s, top, F_T], fr[s, top, F_IC], fr[s, top, F_GAP] = -1, 0, -1, 0
            fr[s, top, F_FRESH] = 1
            fr[s, top, F_LAZY] = PLT_IN if tbits & FLAG_PLT else PLT_NONE
            if masks[7]:  # every call: this one from the callee's first instruction
                fr[s, top, F_T], fr[s, top, F_IC] = t, ss[s, S_IC]
        else:
            counts[C_DEEP] += 1
        ss[s, S_SP] = top + 1
        ss[s, S_CUR] = -2
    elif k == K_RET:
        _returned(s, ip, cpu, ss, fr, counts, marks, masks, rec, paths, stream)
    elif k == K_IJUMP:
        top = min(ss[s, S_SP], fr.shape[1])
        if top <= 0:
            return
        d = top - 1
        lazy = fr[s, d, F_LAZY]
        if lazy == PLT_IN and tbits & FLAG_PLT:
            # Not bound yet: the slot leads back into the PLT (the stub's
            # own push, or IBT's .plt entry for a .plt.sec stub), on to PLT0.
            fr[s, d, F_LAZY] = PLT_LAZY
        elif lazy == PLT_LAZY:
            fr[s, d, F_CALLEE], fr[s, d, F_PATH], fr[s, d, F_LAZY] = ip, -1, PLT_RESOLVER
            ss[s, S_CUR] = -2
        elif lazy == PLT_IN or lazy == PLT_RESOLVER:
            # A PLT stub's destination (bound now, or by the resolver): the
            # callee.  A call of a marked function entered at the stub
            # (an IFUNC's, whose implementation only the flow tells)
            # starts here.
            fr[s, d, F_CALLEE], fr[s, d, F_PATH], fr[s, d, F_LAZY] = ip, -1, PLT_NONE
            ss[s, S_CUR] = -2
            if (fr[s, d, F_EXIT] >= 0 or masks[7]) and fr[s, d, F_IC] >= 0:
                fr[s, d, F_IC], fr[s, d, F_T] = ss[s, S_IC], t
        elif fr[s, d, F_FRESH] and tbits & FLAG_START:
            # A tail-jump stub called: the function it jumps to is the callee
            # (a jump inside the function, e.g. through a switch's table, is not).
            fr[s, d, F_CALLEE], fr[s, d, F_PATH] = ip, -1
            ss[s, S_CUR] = -2


@aot.njit(cache=True, inline="always", _nrt=False)
def _count(s, k, atoms, t, cpu, ss, fr, seq, counts, marks, masks, mk, rec, paths, stream):
    """Count instruction ``k`` (its code-table index) in slot ``s``, and
    match its markers when it has any or a sequence is under way."""
    ic = ss[s, S_IC]
    ss[s, S_IC] = ic + 1
    bits = atoms[k] & ATOM_MASK
    if bits or ss[s, S_SEQ]:
        _instruction(s, bits, ic, t, cpu, ss, fr, seq, counts, marks, masks, mk, rec, paths,
                     stream)  # fmt: skip


@aot.njit(cache=True, _nrt=False)
def _instruction(s, bits, ic, t, cpu, ss, fr, seq, counts, marks, masks, mk, rec, paths,
                 stream):  # fmt: skip
    """The markers at one instruction (its atom ``bits``) of slot ``s``."""
    kinds, atom0, seq_atoms, seq_len = mk
    nm = kinds.shape[0]
    fired = np.uint64(0)
    active = 0
    for m in range(nm):
        km = kinds[m]
        if km == M_ATOM:
            if (bits >> np.uint64(atom0[m])) & np.uint64(1):
                fired |= np.uint64(1) << np.uint64(m)
        elif km == M_SEQUENCE:
            b = np.uint64(0)
            n = seq_len[m]
            for j in range(n):
                if (bits >> np.uint64(seq_atoms[m, j])) & np.uint64(1):
                    b |= np.uint64(1) << np.uint64(j)
            d = ((seq[s, m] << np.uint64(1)) | np.uint64(1)) & b
            seq[s, m] = d
            if d:
                active = 1
            if (d >> np.uint64(n - 1)) & np.uint64(1):
                fired |= np.uint64(1) << np.uint64(m)
    ss[s, S_SEQ] = active
    if bits & masks[3]:
        # A marked function's entry: its frame (the call's, or a PLT stub's
        # call that jumped here) gets the function's exit marker.
        top = min(ss[s, S_SP], fr.shape[1])
        if top > 0 and fr[s, top - 1, F_EXIT] < 0:
            for m in range(nm):
                if kinds[m] == M_EXIT and (bits >> np.uint64(atom0[m])) & np.uint64(1):
                    d = top - 1
                    fr[s, d, F_EXIT], fr[s, d, F_T], fr[s, d, F_IC], fr[s, d, F_GAP] = m, t, ic, 0
                    break
    if fired:
        for m in range(nm):
            if (fired >> np.uint64(m)) & np.uint64(1):
                _fire(m, s, ic, t, cpu, ss, fr, counts, marks, masks, rec, paths, stream)


@aot.njit(cache=True, _nrt=False)
def _clear_sequences(s, ss, seq):
    if ss[s, S_SEQ]:
        for m in range(seq.shape[1]):
            seq[s, m] = 0
        ss[s, S_SEQ] = 0


@aot.njit(cache=True, _nrt=False)
def _gap(s, ss, fr, seq, counts):
    """A gap in slot ``s``'s flow: what is open there cannot be measured."""
    ss[s, S_FRESH] = 1
    if ss[s, S_OPEN]:
        counts[C_GAPPED] += 1
        ss[s, S_OPEN] = 0
    top = min(ss[s, S_SP], fr.shape[1])
    for d in range(top):
        if fr[s, d, F_IC] >= 0:
            fr[s, d, F_GAP] = 1
    _clear_sequences(s, ss, seq)


@aot.njit(cache=True, _nrt=False)
def last_return(s, ss, fr, counts, marks, masks, rec, paths, stream):
    """Slot ``s``'s flow stops (a gap, or its end) after a return: it went
    to the innermost frame (where is not in the trace, as when tracing
    stops at the return of a call recorded with its extent)."""
    top = min(ss[s, S_SP], fr.shape[1])
    if ss[s, S_PK] == K_RET and top > 0:
        _returned(s, np.uint64(fr[s, top - 1, F_RET]), ss[s, S_CPU], ss, fr, counts, marks,
                  masks, rec, paths, stream)  # fmt: skip
        ss[s, S_PK] = K_OTHER


@aot.njit(cache=True, _nrt=False)
def _stop(s, ss, fr, seq, counts, marks, masks, rec, paths, stream):
    """Slot ``s``'s flow stops at a gap: its last return is taken, then
    what is open cannot be measured."""
    last_return(s, ss, fr, counts, marks, masks, rec, paths, stream)
    _gap(s, ss, fr, seq, counts)


@aot.njit(cache=True, _nrt=False)
def _unseen_call(s, ip, t, ss, fr, masks, ret):
    """Slot ``s``'s flow starts (after a gap) at a marked function's first
    instruction (any function's, with masks[7]: every call): a frame for
    the call the trace does not show (return address ``ret``), which the
    function's first return pops (its exit marker is set as at any
    entry)."""
    _push(s, ret, ip, ss, fr)
    top = ss[s, S_SP] - 1
    if masks[7] and top < fr.shape[1]:
        fr[s, top, F_T], fr[s, top, F_IC] = t, ss[s, S_IC]


@aot.njit(cache=True, inline="always", _nrt=False)
def _push(s, ret, callee, ss, fr):
    """A frame on slot ``s``'s stack: a call of ``callee`` returning to
    ``ret``, no interval yet."""
    top = ss[s, S_SP]
    if top < fr.shape[1]:
        fr[s, top, F_RET], fr[s, top, F_CALLEE], fr[s, top, F_PATH] = ret, callee, -1
        fr[s, top, F_EXIT], fr[s, top, F_T], fr[s, top, F_IC], fr[s, top, F_GAP] = -1, 0, -1, 0
        fr[s, top, F_FRESH], fr[s, top, F_LAZY] = 0, PLT_NONE
    ss[s, S_SP] = top + 1  # (deeper than the frames kept: only counted)
    ss[s, S_CUR] = -2


@aot.njit(cache=True, inline="always", _nrt=False)
def _back_from_tail_call(s, ip, ss, fr):
    """Whether slot ``s``'s flow, whose last instruction went neither to
    its fall-through nor to its direct target (tracing was off between),
    comes back at ``ip`` after a function called back from outside the
    traced ranges jumped out of them (a tail call: its callee returned to
    the code that called it back, which went on outside): a return, which
    pops that function's frame."""
    if np.int64(ip) == ss[s, S_PSUCC] or np.int64(ip) == ss[s, S_PFALL]:
        return False
    top = min(ss[s, S_SP], fr.shape[1])
    return top > 0 and fr[s, top - 1, F_RET] == CALLED_BACK


@aot.njit(cache=True, _nrt=False)
def _rejoin(s, ip, t, cpu, ss, fr, seq, counts, marks, masks, rec, paths, stream):
    """Slot ``s``'s flow left the traced ranges at its last instruction and
    comes back at ``ip`` with nothing lost (flowrows.GAP_REJOINED): a call
    out of them pushes its frame (the return to its return address pops
    it); a return or a jump out of them (a tail call, whose callee returns
    there) ends the function called back from there, whose frame it pops;
    the flow goes on in a function called from outside (CALLED_BACK).
    False, with nothing done, when the flow left otherwise (a jump out of
    a function not called back): that is a gap."""
    if ss[s, S_PK] == K_CALL:
        _push(s, ss[s, S_PFALL], ss[s, S_PSUCC], ss, fr)
    else:
        top = min(ss[s, S_SP], fr.shape[1])
        if top == 0 or fr[s, top - 1, F_RET] != CALLED_BACK:
            return False
        _returned(s, _CALLED_BACK_IP, cpu, ss, fr, counts, marks, masks, rec, paths, stream)
    _unseen_call(s, ip, t, ss, fr, masks, CALLED_BACK)
    ss[s, S_PK] = K_OTHER
    _clear_sequences(s, ss, seq)
    return True


@aot.njit(cache=True, inline="always", _nrt=False)
def _run_info(run, atoms, ct, info):
    """Whether run ``run`` holds no instruction an atom matches (bit 3)
    and its last instruction's kind (bits 0-2), cached in ``info`` (-1:
    not known yet)."""
    q = info[run]
    if q < 0:
        r_ninsn, r_first, r_insn, r_lastk = (
            ct[R.T_R_NINSN],
            ct[R.T_R_FIRST],
            ct[R.T_R_INSN],
            ct[R.T_R_LASTK],
        )
        quiet = 8
        first = r_first[run]
        for j in range(r_ninsn[run]):
            if atoms[r_insn[first + j]] & ATOM_MASK:
                quiet = 0
                break
        k = r_lastk[run]
        kind = _kind(ct[R.T_I_CLASS][k], ct[R.T_I_FLAGS][k]) if k >= 0 else K_OTHER
        q = np.int8(quiet | kind)
        info[run] = q
    return q


@aot.njit(cache=True, inline="always", _nrt=False)
def _timeline(tl, counts, s, tv, p, ss):
    """Slot ``s`` is in call path ``p`` from time ``tv`` on (-2: none)."""
    if ss[s, S_TPATH] == p:
        return
    k = counts[C_TL]
    tl[0, k] = s
    tl[1, k] = tv
    tl[2, k] = p
    counts[C_TL] = k + 1
    ss[s, S_TPATH] = p


@aot.njit(cache=True, nogil=True, _nrt=False)
def walk(rows, start, ct, atoms, info, ss, fr, seq, counts, marks, masks, mk, rec, paths, stream):
    """Profile rows ``start...`` of a batch (``rows``: ip, ninsn, mode, run,
    time, slot, cpu, gap_before; ``rec``: records, the stream's times,
    histograms, totals); returns the row it stopped at (the number of rows
    when done; less when the records, paths or times need more room)."""
    times = rec[1]
    b_ip, b_ninsn, b_mode, b_run, b_time, b_slot, b_cpu, b_gap = rows
    h_ip, h_mode, h_val = ct[R.T_H_IP], ct[R.T_H_MODE], ct[R.T_H_VAL]
    i_ip, i_size, i_class, i_flags = ct[R.T_I_IP], ct[R.T_I_SIZE], ct[R.T_I_CLASS], ct[R.T_I_FLAGS]
    i_target = ct[R.T_I_TARGET]
    r_first, r_insn, r_lastk = ct[R.T_R_FIRST], ct[R.T_R_INSN], ct[R.T_R_LASTK]
    rec_cap = rec[0].shape[0]
    tl = rec[4]  # the timeline: (slot, time, path) where a slot's path changed
    tl_cap = tl.shape[1] if masks[6] else 0
    path_cap = paths[3].shape[0]
    depth = fr.shape[1]
    last_slot = counts[C_LAST_SLOT]
    last_t = counts[C_LAST_T]
    last_path = counts[C_LAST_PATH]
    last_tv = counts[C_LAST_T_VALUE]
    p_insns, p_time = paths[5], paths[6]
    have_t = counts[C_HAVE_T]
    n_times = counts[C_TIMES]
    i = start
    nrows = b_ip.shape[0]
    while i < nrows:
        n = np.int64(b_ninsn[i])
        # Room for what one row can add: two intervals per instruction, a
        # call path of a frame per stack level and instruction.
        if (counts[C_RECS] + 2 * n + 4 > rec_cap or counts[C_PATHS] + n + depth + 2 > path_cap
                or n_times >= times.shape[0] or (masks[6] and counts[C_TL] + 2 > tl_cap)):  # fmt: skip
            break
        s = b_slot[i]
        cpu = b_cpu[i]
        tv = np.int64(b_time[i])
        if not have_t or tv != last_t:
            times[n_times] = tv
            n_times += 1
            last_t = tv
            have_t = 1
        # Times are kept as indices into the stream's distinct times: its
        # neighbours bound when the instruction ran (see the module doc).
        t = n_times - 1
        g = b_gap[i]
        if g and last_slot >= 0:
            if not (g == R.GAP_REJOINED and s == last_slot
                    and _rejoin(s, b_ip[i], t, cpu, ss, fr, seq, counts, marks, masks, rec,
                                paths, stream)):  # fmt: skip
                _stop(last_slot, ss, fr, seq, counts, marks, masks, rec, paths, stream)
                last_path = -2  # the gap's time belongs to no path
                if masks[6]:
                    _timeline(tl, counts, last_slot, ss[last_slot, S_TLAST], -2, ss)
        last_slot = s
        if n == 0:
            i += 1
            continue
        ip = b_ip[i]
        if ss[s, S_PK] > K_OTHER:
            tbits = np.uint64(0)
            if ss[s, S_PK] == K_IJUMP or ss[s, S_PK] == K_CALL:
                run = b_run[i]
                k0 = (r_insn[r_first[run]] if run >= 0
                      else hash_find(h_ip, h_mode, h_val, ip, b_mode[i]))  # fmt: skip
                tbits = atoms[k0] if k0 >= 0 else tbits
            _transition(s, ip, tbits, t, cpu, ss, fr, counts, marks, masks, rec, paths, stream)
        elif ss[s, S_PK] == K_OTHER and _back_from_tail_call(s, ip, ss, fr):
            _returned(s, ip, cpu, ss, fr, counts, marks, masks, rec, paths, stream)
        fresh = ss[s, S_FRESH]
        ss[s, S_FRESH] = 0
        ss[s, S_CPU] = cpu
        if fresh and (masks[3] or masks[7]):
            run = b_run[i]
            k0 = r_insn[r_first[run]] if run >= 0 else hash_find(h_ip, h_mode, h_val, ip, b_mode[i])
            if k0 >= 0 and (atoms[k0] & masks[3] or (masks[7] and atoms[k0] & FLAG_START)):
                _unseen_call(s, ip, t, ss, fr, masks, UNSEEN)
        if ss[s, S_ROOTIP] == 0 and ss[s, S_SP] == 0:
            _new_root(s, ip, ss)
        if fresh and masks[5] and ss[s, S_SP] == 0 and ss[s, S_ROOTIP] == np.int64(ip):
            # The flow starts (again) at the root function's first
            # instruction: a call of it, as a frame's is counted (tracing
            # on at a function's entry, hwtrace record -f).
            run = b_run[i]
            k0 = r_insn[r_first[run]] if run >= 0 else hash_find(h_ip, h_mode, h_val, ip, b_mode[i])
            if k0 >= 0 and atoms[k0] & FLAG_START:
                root = _root_path(s, ss, paths, counts)
                if root >= 0:
                    paths[7][root + 1] += 1
        if masks[5]:
            # The call-path profile: the row's instructions to the path it
            # ran in, the time since the stream's last row to that row's.
            p = ss[s, S_CUR]
            if p == -2:
                p = ss[s, S_CUR] = _path_now(ss, fr, s, paths, counts)
            p_insns[p + 1] += n
            if last_path != -2:
                p_time[last_path + 1] += tv - last_tv
            last_path = p
            last_tv = tv
            if masks[6]:
                if p != ss[s, S_TPATH]:
                    _timeline(tl, counts, s, tv, p, ss)
                ss[s, S_TLAST] = tv
        run = b_run[i]
        q = _run_info(run, atoms, ct, info) if run >= 0 else np.int8(0)
        if q & 8:
            # Nothing to match in the run: count it; only its last
            # instruction (a branch) can move the stack.
            ss[s, S_IC] += n
            _clear_sequences(s, ss, seq)
            k = r_lastk[run]
            ss[s, S_PK] = q & 7
        elif run >= 0:
            # A run: straight code up to its last instruction, so nothing
            # but that one moves the stack.
            first = r_first[run]
            for j in range(n):
                k = np.int64(r_insn[first + j])
                _count(s, k, atoms, t, cpu, ss, fr, seq, counts, marks, masks, mk, rec, paths,
                       stream)  # fmt: skip
            ss[s, S_PK] = q & 7
        else:
            k = -1
            for j in range(n):
                if j:
                    ip = insn_successor(ct, k)
                    ss[s, S_PIC] = ss[s, S_IC] - 1
                    ss[s, S_PT] = t
                    k = find_insn(ct, ip, b_mode[i])
                    if ss[s, S_PK] > K_OTHER:  # (a call or return: direct flow in a row)
                        tb = atoms[k] if k >= 0 else np.uint64(0)
                        _transition(s, ip, tb, t, cpu, ss, fr, counts, marks, masks, rec, paths,
                                    stream)  # fmt: skip
                else:
                    k = find_insn(ct, ip, b_mode[i])
                if k < 0:
                    break  # cannot happen: the decoder read every instruction it reports
                _count(s, k, atoms, t, cpu, ss, fr, seq, counts, marks, masks, mk, rec, paths,
                       stream)  # fmt: skip
                ss[s, S_PK] = _kind(i_class[k], i_flags[k])
                ss[s, S_PFALL] = np.int64(i_ip[k] + np.uint64(i_size[k]))
            if k < 0:
                ss[s, S_PK] = -1
                i += 1
                continue
        ss[s, S_PFALL] = np.int64(i_ip[k] + np.uint64(i_size[k]))
        ss[s, S_PSUCC] = np.int64(i_target[k])
        ss[s, S_PIC] = ss[s, S_IC] - 1
        ss[s, S_PT] = t
        if ss[s, S_PK] != K_IJUMP:
            top = min(ss[s, S_SP], depth)
            if top > 0 and fr[s, top - 1, F_FRESH]:
                fr[s, top - 1, F_FRESH] = 0
        i += 1
    counts[C_LAST_SLOT] = last_slot
    counts[C_LAST_T] = last_t
    counts[C_LAST_PATH] = last_path
    counts[C_LAST_T_VALUE] = last_tv
    counts[C_HAVE_T] = have_t
    counts[C_TIMES] = n_times
    return i


def _grown(arr: np.ndarray, size: int, fill=0) -> np.ndarray:
    out = np.full((size, *arr.shape[1:]), fill, arr.dtype)
    out[: arr.shape[0]] = arr
    return out


class _TableAtoms:
    """The atoms' bits per instruction of one code table, and which of its
    runs hold none (-1: not known yet)."""

    def __init__(self, table: CodeTable, atoms: AtomTable) -> None:
        self.table, self.generation, self.atoms = table, table.generation, atoms
        self.bits = np.zeros(1 << 10, np.uint64)
        self.info = np.full(1 << 10, -1, np.int8)  # per run, see _run_info
        self.n = 0

    def update(self) -> None:
        t = self.table
        if t.generation != self.generation:
            self.generation, self.n = t.generation, 0
            self.info[:] = -1
        n = t.n_insns
        if self.bits.shape[0] < n:
            self.bits = _grown(self.bits, max(n, 2 * self.bits.shape[0]))
        if n > self.n:
            first = self.n
            ips = t.i_ip[first:n]
            decoded = t.i_err[first:n] == 0
            bits = self.atoms.bits_of(ips, t.i_class[first:n], decoded, lambda i: t.insn(first + i))
            plt, start = self.atoms.places(ips)
            self.bits[first:n] = bits | np.where(plt, FLAG_PLT, 0) | np.where(start, FLAG_START, 0)
        self.n = n
        runs = t.r_ip.shape[0]
        if self.info.shape[0] < runs:
            self.info = _grown(self.info, runs, -1)


@dataclass
class Intervals(Columns):
    """Closed intervals as columns: ``kind`` (:data:`R_PAIR`, :data:`R_CALL`),
    the thread or CPU ``key``, ``cpu``, the ``open`` and ``close`` markers,
    ``dt`` (time, in the trace's time units: TSC ticks, or ns for
    perf.data), its ``resolution`` (same units; -1 when the stream had no
    later time), ``dic`` (instructions), the open and close ``time``, and
    the call ``path`` (an index into :attr:`LatencyResult.paths`)."""

    kind: np.ndarray
    key: np.ndarray
    cpu: np.ndarray
    open: np.ndarray
    close: np.ndarray
    t_open: np.ndarray
    t_close: np.ndarray
    dt: np.ndarray
    resolution: np.ndarray
    dic: np.ndarray
    path: np.ndarray

    def select(self, sel) -> Intervals:
        return Intervals(*(getattr(self, f)[sel] for f in self.__dataclass_fields__))


@dataclass
class Timeline(Columns):
    """When each thread's (or CPU's) call path changed, in flow order:
    its ``key`` (tid or CPU) and profiler ``slot``, the ``time`` (the
    flow's unit) and the ``path`` it was in from then on (-2: none, where
    its trace stopped or had a gap)."""

    key: np.ndarray
    slot: np.ndarray
    time: np.ndarray
    path: np.ndarray


def root_group(parent: int) -> int:
    """The group a root path's ``parent`` value names (-1: none)."""
    return ROOT - 1 - parent if parent <= ROOT else -1


@dataclass
class LatencyResult:
    """What :class:`LatencyProfiler` found."""

    patterns: PatternSet
    intervals: Intervals
    marker_counts: np.ndarray  # occurrences per marker
    instructions: int  # instructions walked
    repeated_opens: int
    unmatched_closes: int
    gapped: int  # open intervals a gap ended
    gapped_calls: int  # function calls with a gap inside
    skipped_frames: int  # frames left without a return (longjmp, exceptions)
    paths: list[tuple[int, int]]  # (parent path, callee entry address) per path
    missing_symbols: set[str] = field(default_factory=set)
    # Every interval's part, whether or not each is kept: histograms per kind
    # (R_PAIR, R_CALL), Δt (0) and ΔIC (1), in bucket_of's buckets, and
    # totals (A_* columns).
    histograms: np.ndarray = field(default_factory=lambda: np.zeros((2, 2, NB), np.int64))
    totals: np.ndarray = field(default_factory=lambda: np.zeros((2, NA), np.int64))
    every_interval: bool = True  # ``intervals`` holds all of them (else the longest)
    # The call-path profile (with ``profile``): instructions and time per
    # path, at ``path + 1`` (0: no path known).
    path_insns: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    path_time: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    path_calls: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    # With ``timeline``: where each thread's or CPU's call path changed.
    timeline: Timeline | None = None

    def path_addresses(self, path: int) -> list[int]:
        """From the outermost call to the innermost, the callee entries (a
        root path's first is an address in the function it began in)."""
        out = []
        while path >= 0:
            parent, addr = self.paths[path]
            out.append(addr)
            path = parent
        return out[::-1]

    def group_of(self, path: int) -> int:
        """The group (see LatencyProfiler) whose root ``path`` descends from
        (-1: none)."""
        while path >= 0:
            parent, _ = self.paths[path]
            if parent < 0:
                return root_group(parent)
            path = parent
        return -1

    def folded(
        self, name: Callable[[int], str], by: str = "insn",
        group: Callable[[int], str] | None = None,
    ) -> list[str]:  # fmt: skip
        """The call-path profile as folded stacks, one line per path with
        the instructions (``by="insn"``) or the time executed in it:
        ``root;caller;callee count`` (FlameGraph's input), each path after
        its group's name (``group(number)``) when given."""
        weight = self.path_insns if by == "insn" else self.path_time
        return self.weighted_paths(weight, name, group)

    def path_names(
        self, path: int, name: Callable[[int], str], group: Callable[[int], str] | None = None
    ) -> list[str]:
        """A call path's functions, outermost first, by ``name`` (the
        address where it has none; ``[unknown]`` for an empty path), after
        its group's name when ``group`` is given."""
        addrs = self.path_addresses(path)
        parts = [name(a) or f"{a:#x}" for a in addrs] if addrs else ["[unknown]"]
        if group is not None:
            parts.insert(0, group(self.group_of(path)))
        return parts

    def weighted_paths(
        self, weight: np.ndarray, name: Callable[[int], str],
        group: Callable[[int], str] | None = None,
    ) -> list[str]:  # fmt: skip
        """``caller;callee weight`` lines, sorted, for the paths whose
        weight (indexed ``path + 1``) is not zero."""
        wanted = np.flatnonzero(weight)
        lines = self.path_texts((wanted - 1).tolist(), name, group)
        # (in place: a real program's lines run to a GB)
        for i, w in enumerate(weight[wanted].tolist()):
            lines[i] = f"{lines[i]} {w}"
        lines.sort()
        return lines

    def path_texts(
        self, paths: list[int], name: Callable[[int], str],
        group: Callable[[int], str] | None = None,
    ) -> list[str]:  # fmt: skip
        """:meth:`path_names` of each of ``paths``, joined by ``;``: each
        address named once, and the text of a path's callers made once
        for all the paths below them (a real program's deep call paths
        share most of their frames)."""
        has_child = [False] * len(self.paths)
        for p, _ in self.paths:
            if p >= 0:
                has_child[p] = True
        known: dict[int, str] = {}  # (of paths with paths below them)
        out = []
        for at, chain, frames in self.walk_new(paths, known, name, group):
            text = known[at] if at >= 0 else None
            for node, called in zip(chain, frames, strict=True):
                text = called if text is None else text + ";" + called
                if node >= 0 and has_child[node]:
                    known[node] = text
            out.append(text)
        return out

    def walk_new(
        self, paths: list[int], known: Container[int], name: Callable[[int], str],
        group: Callable[[int], str] | None = None,
    ) -> Iterator[tuple[int, list[int], list[str]]]:  # fmt: skip
        """For each of ``paths`` in turn, its frames not yet walked:
        ``(at, chain, names)``, ``chain`` the paths from below the first
        in ``known`` (``at``; below 0 when none is, the frames starting at
        the root) down to it, with their :meth:`path_names` (the group's first, as path
        -2, when ``group`` is given; ``[unknown]`` as path -1 for the empty
        path).  The caller adds the paths it wants to find again to
        ``known`` (each address is named once)."""
        parent_of = [p for p, _ in self.paths]
        addr_of = [a for _, a in self.paths]
        names: dict[int, str] = {}
        for path in paths:
            chain = []
            p = path
            while p >= 0 and p not in known:
                chain.append(p)
                p = parent_of[p]
            chain.reverse()
            frames = []
            for node in chain:
                addr = addr_of[node]
                called = names.get(addr)
                if called is None:
                    called = names[addr] = name(addr) or f"{addr:#x}"
                frames.append(called)
            if path < 0:
                chain, frames = [-1], ["[unknown]"]
            if p < 0 and group is not None:
                chain.insert(0, -2)
                frames.insert(0, group(root_group(p)))
            yield p, chain, frames

    def path_parents(self) -> np.ndarray:
        """Each path's caller path (below 0 for a root: its group, see
        :meth:`group_of`)."""
        return np.fromiter((p for p, _ in self.paths), np.int64, len(self.paths))

    def path_heads(self) -> np.ndarray:
        """Each path's innermost address (the function it ends in)."""
        return np.fromiter((a for _, a in self.paths), np.uint64, len(self.paths))

    def inclusive(self, by: str = "insn") -> np.ndarray:
        """Each path's weight with all the paths below it (the instructions
        executed along it up to its tail and beyond), at ``path + 1``."""
        weight = (self.path_insns if by == "insn" else self.path_time).copy()
        parents = self.path_parents()
        for level in reversed(depth_levels(path_depths(parents))[1:]):
            np.add.at(weight, parents[level] + 1, weight[level + 1])
        return weight


def path_depths(parents: np.ndarray) -> np.ndarray:
    """Each node's depth in a forest given by its parents (below 0 for a
    root, depth 0), by pointer jumping: log2 of the deepest passes."""
    depth = (parents >= 0).astype(np.int64)
    up = np.where(parents >= 0, parents, -1)
    live = np.flatnonzero(up >= 0)
    while live.size:
        above = up[live]
        depth[live] += depth[above]  # (both read before either is written)
        up[live] = up[above]
        live = live[up[live] >= 0]
    return depth


def depth_levels(depth: np.ndarray) -> list[np.ndarray]:
    """The nodes at each depth, ascending, from depth 0."""
    order = np.argsort(depth, kind="stable")
    bounds = np.searchsorted(depth[order], np.arange(int(depth.max(initial=-1)) + 2))
    return [order[lo:hi] for lo, hi in itertools.pairwise(bounds.tolist())]


class LatencyProfiler:
    """Walks decoded flow batch by batch (:meth:`add`), stream by stream
    (a trace, or one perf AUX queue), keeping intervals per thread or CPU
    (the patterns' ``per``)."""

    def __init__(self, patterns: PatternSet, depth: int = 256, *, keep: bool = True,
                 longest: int = 64, calls: bool = True, profile: bool = False,
                 group: Callable[[int, int], int] | None = None,
                 timeline: bool = False, every_call: bool = False) -> None:  # fmt: skip
        """``keep``: keep every interval (else only the ``longest`` of each
        kind, with every interval counted in the histograms and totals:
        memory bounded whatever the number of intervals).  ``calls``: each
        call of a function with an ``exit:`` marker is an interval of its
        own (:data:`R_CALL`), as well as the markers' (:data:`R_PAIR`).
        ``profile``: count instructions and time per call path as well
        (:meth:`LatencyResult.folded`), with roots per group:
        ``group(stream, key)`` numbers the group (thread, process, CPU...)
        of a thread or CPU's flow (-1: none).  ``timeline``: keep when each
        thread or CPU's call path changed (:attr:`LatencyResult.timeline`;
        implies ``profile``).  ``every_call``: every call the flow shows
        (a CALL and the return that leaves its frame, or a flow that starts
        at a function's first instruction) is an interval (:data:`R_CALL`,
        markers -1), with its instructions from the callee's first through
        its return."""
        self.group = group
        self.patterns = patterns
        self.depth = depth
        self.keep = keep
        self.longest = longest
        self.top: np.ndarray | None = None  # the longest so far, when not keeping all
        nm = len(patterns.markers)
        self.marks = np.zeros(max(nm, 1), np.int64)
        profile = profile or timeline
        # open, close, toggle, exit entries, calls, profile, timeline, every call
        masks = np.zeros(8, np.uint64)
        for i, name in enumerate(("open", "close", "toggle")):
            for m in getattr(patterns, name):
                masks[i] |= np.uint64(1 << m)
        kinds = np.array([m.kind for m in patterns.markers] or [M_ATOM], np.int64)
        atom0 = np.array([m.atoms[0] for m in patterns.markers] or [0], np.int64)
        seq_atoms = np.zeros((max(nm, 1), 16), np.int64)
        seq_len = np.zeros(max(nm, 1), np.int64)
        for i, m in enumerate(patterns.markers):
            if m.kind == M_SEQUENCE:
                seq_atoms[i, : len(m.atoms)] = m.atoms
                seq_len[i] = len(m.atoms)
            if m.kind == M_EXIT:
                masks[3] |= np.uint64(1 << m.atoms[0])
        masks[4] = calls or every_call
        masks[7] = every_call
        masks[5] = profile
        masks[6] = timeline
        self.tl = np.zeros((3, 1 << 14 if timeline else 1), np.int64)
        self.tl_done: list[np.ndarray] = []
        self.masks = masks
        self.mk = (kinds[:nm] if nm else kinds[:0], atom0, seq_atoms, seq_len)
        self.counts = np.zeros(NC, np.int64)
        self.counts[C_LAST_SLOT] = -1
        self.slots: dict[tuple[int, int], int] = {}
        self.ss = np.zeros((0, NS), np.int64)
        self.fr = np.zeros((0, depth, NF), np.int64)
        self.seq = np.zeros((0, max(nm, 1)), np.uint64)
        # A row per interval (a field per column would put the fields' rows a
        # power of two apart: one cache set for all, evicting each other).
        self.rec = np.zeros((1 << 12 if keep else 1 << 16, NR), np.int64)
        self.rec_done: list[np.ndarray] = []
        self.hist = np.zeros((2, 2, NB), np.int64)  # [kind, Δt or ΔIC, bucket]
        self.agg = np.zeros((2, NA), np.int64)
        self._fills: dict[int, np.ndarray] = {}
        self._n = 0
        cap = 1 << 12
        # Interned call paths (a hash table, each path's parent and callee)
        # and, with ``profile``, instructions, time and calls per path (+1:
        # none).
        self.paths = (np.full(2 * cap, _EMPTY, np.int64), np.zeros(2 * cap, np.uint64),
                      np.zeros(2 * cap, np.int64), np.zeros(cap, np.int64),
                      np.zeros(cap, np.uint64), np.zeros(cap + 1, np.int64),
                      np.zeros(cap + 1, np.int64), np.zeros(cap + 1, np.int64))  # fmt: skip
        self.streams: list[dict] = []
        self._tables: dict[int, _TableAtoms] = {}
        self.missing: set[str] = set()
        self.key_of_slot: list[int] = []

    def stream(self) -> int:
        """A new stream (its times are its own); returns its number."""
        self.streams.append({"times": np.zeros(1 << 12, np.int64), "n": 0, "last_slot": -1,
                             "last_t": 0, "have_t": 0, "last_path": -2,
                             "last_tv": 0})  # fmt: skip
        return len(self.streams) - 1

    def _table_atoms(self, table: CodeTable, atoms: AtomTable) -> _TableAtoms:
        held = self._tables.get(id(table))
        if held is None or held.table is not table or held.atoms is not atoms:
            held = self._tables[id(table)] = _TableAtoms(table, atoms)
            self.missing |= atoms.missing
        held.update()
        return held

    def _filled(self, value: int, n: int) -> np.ndarray:
        """``n`` copies of ``value`` (int64), from a cache: batches of one
        thread or CPU are the common case."""
        held = self._fills.get(value)
        if held is None or held.shape[0] < n:
            held = self._fills[value] = np.full(max(n, 1 << 16), value, np.int64)
        return held[:n]

    def _slot_of(self, stream: int, keys) -> np.ndarray:
        if np.ndim(keys) == 0:
            return self._filled(int(self._slot_of(stream, np.array([keys], np.int64))[0]), self._n)
        if keys.shape[0] > 1 and (keys == keys[0]).all():
            # (a batch of one thread's rows, the common case: no sort)
            return self._filled(int(self._slot_of(stream, keys[:1])[0]), keys.shape[0])
        uniq, inverse = np.unique(keys, return_inverse=True)
        slots = np.empty(uniq.shape[0], np.int64)
        for j, key in enumerate(uniq.tolist()):
            slot = self.slots.get((stream, key))
            if slot is None:
                slot = self.slots[(stream, key)] = len(self.slots)
                self.key_of_slot.append(key)
                if slot >= self.ss.shape[0]:
                    size = max(2 * self.ss.shape[0], 4)
                    self.ss = _grown(self.ss, size)
                    self.fr = _grown(self.fr, size)
                    self.seq = _grown(self.seq, size)
                self.ss[slot, S_PK] = -1  # no last instruction yet
                self.ss[slot, S_ROOT] = -2
                self.ss[slot, S_CUR] = -2
                self.ss[slot, S_GROUP] = self.group(stream, key) if self.group else -1
                self.ss[slot, S_TPATH] = -2
                self.ss[slot, S_FRESH] = 1
            slots[j] = slot
        return slots[inverse.reshape(-1)]

    def add(
        self,
        stream: int,
        table: CodeTable,
        atoms: AtomTable,
        ip: np.ndarray,
        ninsn: np.ndarray,
        mode: np.ndarray,
        run: np.ndarray,
        time: np.ndarray,
        key: np.ndarray | int,
        cpu: np.ndarray | int,
        gap_before: np.ndarray,
    ) -> None:
        """Walk one batch of ``stream``'s block rows, in flow order:
        decoded against ``table`` (``run``: each row's code run in it, -1
        for none), ``key`` the thread or CPU each row is counted for and
        ``cpu`` where it ran (an array, or one value for every row),
        ``gap_before`` where the flow has a gap before the row, of which
        kind (hwtrace.pt.flowrows.GAP_*)."""
        if ip.shape[0] == 0:
            return
        ta = self._table_atoms(table, atoms)
        self.walk_batch(stream, table.tuple, ta.bits, ta.info, ip, ninsn, mode, run, time, key,
                        cpu, gap_before)  # fmt: skip

    def prepare(self, table: CodeTable, atoms: AtomTable) -> _TableAtoms:
        """The atoms' bits of ``table``'s instructions so far (for
        :meth:`walk_batch`; on the thread that decodes into ``table``)."""
        return self._table_atoms(table, atoms)

    def walk_batch(self, stream: int, code: tuple, bits: np.ndarray, info: np.ndarray,
                   ip, ninsn, mode, run, time, key, cpu, gap_before) -> None:  # fmt: skip
        """:meth:`add`'s walk, with the code table's arrays (``code``) and
        its atoms' ``bits`` and run ``info`` as :meth:`prepare` left them."""
        n = ip.shape[0]
        if n == 0:
            return
        self._n = n
        slots = self._slot_of(stream, key if np.ndim(key) == 0 else np.asarray(key, np.int64))
        if np.ndim(cpu) == 0:
            cpu = self._filled(int(cpu), n)
        st = self.streams[stream]
        c = self.counts
        c[C_TIMES], c[C_LAST_SLOT], c[C_LAST_T], c[C_HAVE_T] = (
            st["n"], st["last_slot"], st["last_t"], st["have_t"]
        )  # fmt: skip
        c[C_LAST_PATH], c[C_LAST_T_VALUE] = st["last_path"], st["last_tv"]
        rows = (
            np.ascontiguousarray(ip, np.uint64), np.ascontiguousarray(ninsn, np.uint32),
            np.ascontiguousarray(mode, np.uint8), np.ascontiguousarray(run, np.int32),
            np.ascontiguousarray(time, np.uint64), slots,
            np.ascontiguousarray(cpu, np.int64), np.ascontiguousarray(gap_before, np.uint8),
        )  # fmt: skip
        start = 0
        while True:
            out = (self.rec, st["times"], self.hist, self.agg, self.tl)
            start = walk(rows, start, code, bits, info, self.ss, self.fr, self.seq,
                         c, self.marks, self.masks, self.mk, out, self.paths, stream)  # fmt: skip
            st["n"], st["last_slot"], st["last_t"], st["have_t"] = (
                int(c[C_TIMES]), int(c[C_LAST_SLOT]), int(c[C_LAST_T]), int(c[C_HAVE_T])
            )  # fmt: skip
            st["last_path"], st["last_tv"] = int(c[C_LAST_PATH]), int(c[C_LAST_T_VALUE])
            if start >= n:
                return
            self._room(int(ninsn[start]), st)

    def gap(self, stream: int) -> None:
        """A gap after the stream's last row (tracing stopped, an error)."""
        st = self.streams[stream]
        if st["last_slot"] >= 0:
            self._room(1, st)
            out = (self.rec, st["times"], self.hist, self.agg, self.tl)
            _stop(st["last_slot"], self.ss, self.fr, self.seq, self.counts, self.marks,
                  self.masks, out, self.paths, stream)  # fmt: skip
            if self.masks[6]:
                self._end_timeline(st["last_slot"])
        st["last_path"] = -2

    def _end_timeline(self, slot: int) -> None:
        """Slot ``slot``'s path ends at its last row's time."""
        if self.ss[slot, S_TPATH] == -2:
            return
        if self.counts[C_TL] + 1 > self.tl.shape[1]:
            self.tl_done.append(self.tl[:, : int(self.counts[C_TL])])
            self.tl = np.zeros((3, self.tl.shape[1] * 2), np.int64)
            self.counts[C_TL] = 0
        _timeline(self.tl, self.counts, slot, self.ss[slot, S_TLAST], -2, self.ss)

    def _room(self, ninsn: int, st: dict) -> None:
        c = self.counts
        if c[C_RECS] + 2 * ninsn + 4 > self.rec.shape[0]:
            if self.keep:
                # Records go on in a new chunk (joined once, at the end).
                self.rec_done.append(self.rec[: int(c[C_RECS])].T)
                self.rec = np.zeros((max(2 * self.rec.shape[0], 2 * ninsn + 4), NR), np.int64)
            else:
                self._keep_longest()
                if 2 * ninsn + 4 > self.rec.shape[0]:
                    self.rec = np.zeros((2 * ninsn + 4, NR), np.int64)
            c[C_RECS] = 0
        self.reserve_paths(int(c[C_PATHS]) + ninsn + self.depth + 2)
        if c[C_TIMES] >= st["times"].shape[0]:
            st["times"] = _grown(st["times"], 2 * st["times"].shape[0])
        if self.masks[6] and c[C_TL] + 2 > self.tl.shape[1]:
            self.tl_done.append(self.tl[:, : int(c[C_TL])])  # joined once, at the end
            self.tl = np.zeros((3, self.tl.shape[1] * 2), np.int64)
            c[C_TL] = 0

    def reserve_paths(self, need: int) -> None:
        """Room for ``need`` call paths: when there is not, the paths are
        interned again into tables twice as large (or ``need``)."""
        if need > self.paths[3].shape[0]:
            self._grow_paths(max(2 * self.paths[3].shape[0], need))

    def _grow_paths(self, cap: int) -> None:
        n = int(self.counts[C_PATHS])
        parent = _grown(self.paths[3][:n], cap)
        addr = _grown(self.paths[4][:n], cap)
        insns = _grown(self.paths[5][: n + 1], cap + 1)
        time = _grown(self.paths[6][: n + 1], cap + 1)
        calls = _grown(self.paths[7][: n + 1], cap + 1)
        size = 1
        while size < 2 * cap:
            size <<= 1
        h_parent = np.full(size, _EMPTY, np.int64)
        h_addr = np.zeros(size, np.uint64)
        h_val = np.zeros(size, np.int64)
        self.paths = (h_parent, h_addr, h_val, parent, addr, insns, time, calls)
        self.counts[C_PATHS] = 0
        _intern_again(parent, addr, n, self.paths, self.counts)

    def _durations(self, rec: np.ndarray) -> np.ndarray:
        dt = np.zeros(rec.shape[1], np.int64)
        for sid, st in enumerate(self.streams):
            sel = rec[R_STREAM] == sid
            times = st["times"]
            dt[sel] = times[rec[R_TC][sel]] - times[rec[R_TO][sel]]
        return dt

    def _keep_longest(self) -> None:
        """Keep the longest intervals of each kind among those so far and
        the records at hand (which are then free again)."""
        rec = self.rec[: int(self.counts[C_RECS])].T
        if self.top is not None:
            rec = np.concatenate([self.top, rec], axis=1)
        dt = self._durations(rec)
        keep = []
        for kind in (R_PAIR, R_CALL):
            mine = np.flatnonzero(rec[R_KIND] == kind)
            if mine.shape[0] > self.longest:
                mine = mine[np.argpartition(-dt[mine], self.longest - 1)[: self.longest]]
            keep.append(mine)
        self.top = rec[:, np.sort(np.concatenate(keep))].copy()

    def _last_returns(self) -> None:
        """Each flow that ended after a return: it went to the innermost frame."""
        for (stream, _), slot in self.slots.items():
            if self.ss[slot, S_PK] == K_RET:
                st = self.streams[stream]
                self._room(1, st)
                out = (self.rec, st["times"], self.hist, self.agg, self.tl)
                last_return(slot, self.ss, self.fr, self.counts, self.marks, self.masks, out,
                            self.paths, stream)  # fmt: skip

    def result(self) -> LatencyResult:
        self._last_returns()
        c = self.counts
        if self.keep:
            rec = self.rec[: int(c[C_RECS])].T
            if self.rec_done:
                rec = np.concatenate([*self.rec_done, rec], axis=1)
        else:
            self._keep_longest()
            rec = self.top
        count = rec.shape[1]
        t_open = np.zeros(count, np.int64)
        t_close = np.zeros(count, np.int64)
        resolution = np.full(count, -1, np.int64)
        for sid, st in enumerate(self.streams):
            sel = rec[R_STREAM] == sid if len(self.streams) > 1 else slice(None)
            times = st["times"][: st["n"]]
            io, ic = rec[R_TO][sel], rec[R_TC][sel]
            if not io.shape[0]:
                continue
            to, tc = times[io], times[ic]
            po, no = _neighbours(times, io)
            pc, nc = _neighbours(times, ic)
            res = np.maximum((nc - tc) + (to - po), (tc - pc) + (no - to))
            res[(no < 0) | (nc < 0)] = -1
            resolution[sel] = res
            t_open[sel], t_close[sel] = to, tc
        keys = np.array(self.key_of_slot, np.int64)
        n = int(c[C_PATHS])
        paths = list(zip(self.paths[3][:n].tolist(), self.paths[4][:n].tolist(), strict=True))
        iv = Intervals(
            kind=rec[R_KIND], key=keys[rec[R_SLOT]] if len(keys) else rec[R_SLOT],
            cpu=rec[R_CPU], open=rec[R_MOPEN], close=rec[R_MCLOSE], t_open=t_open,
            t_close=t_close, dt=t_close - t_open, resolution=resolution,
            dic=rec[R_ICC] - rec[R_ICO], path=rec[R_PATH],
        )  # fmt: skip
        out = LatencyResult(
            self.patterns, iv, self.marks[: len(self.patterns.markers)].copy(),
            int(self.ss[: len(self.slots), S_IC].sum()), int(c[C_REPEAT]), int(c[C_UNMATCHED]),
            int(c[C_GAPPED]), int(c[C_CALL_GAPPED]), int(c[C_SKIPPED]), paths, set(self.missing),
        )  # fmt: skip
        out.histograms, out.totals, out.every_interval = (
            self.hist.copy(),
            self.agg.copy(),
            self.keep,
        )
        out.path_insns = self.paths[5][: n + 1].copy()
        out.path_time = self.paths[6][: n + 1].copy()
        out.path_calls = self.paths[7][: n + 1].copy()
        if self.masks[6]:
            for slot in range(len(self.slots)):
                self._end_timeline(slot)
            tl = np.concatenate([*self.tl_done, self.tl[:, : int(c[C_TL])]], axis=1)
            self.tl_done = [tl]
            self.tl = np.zeros((3, 1 << 14), np.int64)
            c[C_TL] = 0
            out.timeline = Timeline(keys[tl[0]] if len(keys) else tl[0], tl[0], tl[1], tl[2])
        return out


class ProfilerThread:
    """A :class:`LatencyProfiler` walking on a thread of its own, behind a
    short queue, while the caller goes on decoding: decoder and walk are
    compiled code that releases the GIL, so on two cores the analysis
    costs little more than the decoding.

    What the decoder's thread owns stays there: the code table, and the
    atoms' bits of its instructions (worked out for each batch before it
    is queued, from the table as it is then; the walk gets those arrays,
    which later growth replaces rather than changes).  A table cleared for
    new code waits for the batches of the old.  The batches' columns are
    copied (decoders reuse their buffers)."""

    def __init__(self, profiler: LatencyProfiler, depth: int = 3) -> None:
        import queue
        import threading

        self.profiler = profiler
        self._queue: queue.Queue = queue.Queue(depth)
        self._error: BaseException | None = None
        self._generations: dict[int, int] = {}
        self._thread = threading.Thread(target=self._work, name="hwtrace-walk", daemon=True)
        self._thread.start()

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                if self._error is None:
                    item[0](*item[1:])
            except BaseException as e:  # handed to the caller's thread
                self._error = e
            finally:
                self._queue.task_done()

    def _put(self, *item) -> None:
        if self._error is not None:
            raise self._error
        self._queue.put(item)

    def stream(self) -> int:
        self._queue.join()
        return self.profiler.stream()

    def add(self, stream, table: CodeTable, atoms: AtomTable, ip, ninsn, mode, run, time, key,
            cpu, gap_before) -> None:  # fmt: skip
        """As :meth:`LatencyProfiler.add`."""
        if ip.shape[0] == 0:
            return
        if self._generations.setdefault(id(table), table.generation) != table.generation:
            self._queue.join()  # the old code's batches first
            self._generations[id(table)] = table.generation
        ta = self.profiler.prepare(table, atoms)
        copy = [np.array(a) if isinstance(a, np.ndarray) else a
                for a in (ip, ninsn, mode, run, time, key, cpu, gap_before)]  # fmt: skip
        self._put(self.profiler.walk_batch, stream, table.tuple, ta.bits, ta.info, *copy)

    def gap(self, stream: int) -> None:
        self._put(self.profiler.gap, stream)

    def result(self) -> LatencyResult:
        self.close()
        return self.profiler.result()

    def close(self) -> None:
        """Wait for the queued batches; raise what the walk raised."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if self._error is not None:
            raise self._error

    @property
    def patterns(self) -> PatternSet:
        return self.profiler.patterns


def _neighbours(times: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The times before and after the ``index``-th of a stream's distinct
    times, in stream order (-1 after the last; the first is its own
    predecessor: it comes from the PSB+ decoding started at)."""
    prev = times[np.maximum(index - 1, 0)]
    after = index + 1
    nxt = np.where(after < times.shape[0], times[np.minimum(after, times.shape[0] - 1)], -1)
    return prev, nxt


# -- sources -------------------------------------------------------------------


class _TraceSink:
    """Feeds a decoder's batches of one trace to a profiler (one thread, or
    the CPU ``cpu``)."""

    def __init__(self, profiler: LatencyProfiler, key: int, cpu: int) -> None:
        from ..pt.flowdec import FlowSink

        self.profiler, self.key, self.cpu = profiler, key, cpu
        self.stream = profiler.stream()
        self._atoms: dict[int, tuple[object, AtomTable]] = {}
        self._pending_gap = R.GAP_NONE  # (a rejoin after the last batch's last row)
        self._sink = FlowSink()

    def atoms(self, image) -> AtomTable:
        held = self._atoms.get(id(image))
        if held is None or held[0] is not image:
            symbols = getattr(image, "symbols", None)
            held = self._atoms[id(image)] = (image, AtomTable(self.profiler.patterns, symbols))
        return held[1]

    def output(self) -> tuple:
        return self._sink.output()

    def batch(self, b) -> None:
        n = b.ip.shape[0]
        gap, after = gaps_before(n, b.events, b.event_block)
        if n:
            if not gap[0]:
                gap[0] = self._pending_gap
            self._pending_gap = R.GAP_NONE
            p = self.profiler
            p.add(self.stream, b.table, self.atoms(b.table.image), b.ip, b.ninsn, b.mode, b.run,
                  b.time, self.key, self.cpu, gap)  # fmt: skip
        if after == R.GAP_REJOINED:
            # (what the flow left by, the next row tells)
            self._pending_gap = R.GAP_REJOINED
        elif after:
            self._pending_gap = R.GAP_NONE
            self.profiler.gap(self.stream)


def profile_trace(
    data, image, patterns: PatternSet, config=None, *, cpu: int = -1, keep: bool = True,
    longest: int = 64, calls: bool = True, profile: bool = False, timeline: bool = False,
    threaded: bool = True,
) -> LatencyResult:  # fmt: skip
    """Latency-profile a raw Intel PT trace (bytes, buffer or path) of one
    CPU or thread against ``image`` (``keep``, ``longest``, ``calls``,
    ``profile``, ``timeline``: as for :class:`LatencyProfiler`), walking
    on a second thread while decoding (``threaded``, with more than one
    CPU)."""
    import os

    from ..pt.config import PtConfig
    from ..pt.decode import DecodeOptions, chunk_ranges
    from ..pt.flowdec import FlowDecoder
    from ..pt.packets import as_buffer, map_file

    profiler = LatencyProfiler(
        patterns, keep=keep, longest=longest, calls=calls, profile=profile, timeline=timeline
    )
    front = ProfilerThread(profiler) if threaded and (os.cpu_count() or 1) > 1 else profiler
    buf = map_file(data) if isinstance(data, (str, os.PathLike)) else as_buffer(data)
    dec = FlowDecoder(image, config or PtConfig(), DecodeOptions().flow_options())
    sink = _TraceSink(front, key=max(cpu, 0), cpu=cpu)
    try:
        for s, e in chunk_ranges(buf):
            dec.decode(buf, sink, s, e)
    finally:
        if front is not profiler:
            front.close()
    return profiler.result()
