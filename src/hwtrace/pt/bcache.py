"""libipt's block cache, as far as it decides where blocks end.

libipt's block decoder (``pt_block_decoder.c``) walks code it has not seen
before one instruction at a time and fills a per-section block cache as it
goes (``pt_blk_proceed_no_event_fill_cache``); code it has seen it crosses
with one cache entry per stretch (``pt_blk_proceed_no_event_cached``).
While filling, a block also ends where no trace is needed:

- after a near direct call and after a near direct backward jump (the
  cache gets a decode entry there),
- after ``0x400`` filled instructions (``bcache_fill_steps``: a trampoline
  entry to the next instruction),
- after an instruction whose successor is cached but whose own entry would
  overflow (``ninsn`` is 8 bits, the displacement to the decision point
  16 bits): a trampoline again.

Crossing cached code never ends a block early.  The flow decoder's blocks
end only where trace or events end them; :func:`split_blocks` replays the
cache over its rows and splits them where libipt's block decoder would, so
block counts and boundaries match Intel's ``ptxed --block-decoder``.  The
cache is keyed by the code table's instruction index (one entry per
instruction, as libipt has one per section offset).
"""

from __future__ import annotations

import numpy as np

from .. import aot
from . import flowrows as R
from .codetable import (
    CLASS_CALL,
    CLASS_JUMP,
    CLASS_OTHER,
    CLASS_PTWRITE,
    I_DIRECT,
    hash_find,
)
from .flowrows import O_NEW, O_UNCACHED
from .ptxed import _next_ip

FILL_STEPS = 0x400  # libipt's bcache_fill_steps
NINSN_MAX = 0xFF  # pt_bcache_entry.ninsn: 8 bits
DISP_MIN, DISP_MAX = -(1 << 15), (1 << 15) - 1  # pt_bcache_entry.displacement: 16 bits

# Replay state (int64): what the next instruction meets, the fill steps
# left, the instructions an entry still covers, the pending fill frames.
B_MODE, B_STEPS, B_SKIP, B_NFRAME = range(4)
NB = 4
M_LOOKUP, M_SKIP, M_FILL, M_END = range(4)


@aot.njit(cache=True, _nrt=False)
def _put(valid, e_ninsn, e_dip, k, ninsn, dip):
    valid[k] = 1
    e_ninsn[k] = ninsn
    e_dip[k] = dip


@aot.njit(cache=True, _nrt=False)
def _trampoline(valid, e_ninsn, e_dip, k, ip, nip):
    """pt_blk_add_trampoline: continue at ``nip`` (or decode ``ip`` again
    when the displacement does not fit)."""
    d = np.int64(nip - ip)
    if DISP_MIN <= d <= DISP_MAX:
        _put(valid, e_ninsn, e_dip, k, 1, nip)
    else:
        _put(valid, e_ninsn, e_dip, k, 1, ip)


@aot.njit(cache=True, _nrt=False)
def _extend(valid, e_ninsn, e_dip, k, ip, nk, nip):
    """The entry of instruction ``k`` at ``ip`` from its successor's entry
    ``nk``; returns False where a trampoline had to be used instead."""
    n = e_ninsn[nk] + 1
    dip = e_dip[nk]
    d = np.int64(dip - ip)
    if n > NINSN_MAX or d < DISP_MIN or d > DISP_MAX:
        _trampoline(valid, e_ninsn, e_dip, k, ip, nip)
        return False
    _put(valid, e_ninsn, e_dip, k, n, dip)
    return True


@aot.njit(cache=True, _nrt=False)
def _unwind(ct, valid, e_ninsn, e_dip, frames, fr_nip, fr_mode, st):
    """The end of a block: the fill frames still waiting add their entries
    from their successors' (last frame first), as libipt's recursion
    returns."""
    h_ip, h_mode, h_val = ct[R.T_H_IP], ct[R.T_H_MODE], ct[R.T_H_VAL]
    i_ip = ct[R.T_I_IP]
    for f in range(st[B_NFRAME] - 1, -1, -1):
        k = frames[f]
        nip = fr_nip[f]
        nk = hash_find(h_ip, h_mode, h_val, nip, fr_mode[f])
        if nk < 0 or not valid[nk]:
            continue  # libipt: "we're done" without an entry
        _extend(valid, e_ninsn, e_dip, k, i_ip[k], nk, nip)
    st[B_NFRAME] = 0
    st[B_MODE] = M_LOOKUP


@aot.njit(cache=True, _nrt=False)
def split_blocks(b_ip, b_ninsn, b_flags, b_mode, b_run, ct, valid, e_ninsn, e_dip, frames, fr_nip,
                 fr_mode, st, starts, counts):  # fmt: skip
    """Replays libipt's block cache over a batch's rows: ``starts[r]`` gets
    the instruction index in row ``r`` at which each piece starts and
    ``counts[r]`` the number of extra blocks that begin inside row ``r``.
    Returns the number of pieces written to ``starts`` (flattened: each
    row's extra starts, in order)."""
    h_ip, h_mode, h_val = ct[R.T_H_IP], ct[R.T_H_MODE], ct[R.T_H_VAL]
    i_size, i_class = ct[R.T_I_SIZE], ct[R.T_I_CLASS]
    i_flags, i_target = ct[R.T_I_FLAGS], ct[R.T_I_TARGET]
    r_first, r_insn = ct[R.T_R_FIRST], ct[R.T_R_INSN]
    npieces = 0
    for r in range(b_ip.shape[0]):
        counts[r] = 0
        if b_flags[r] & (O_NEW | O_UNCACHED):
            # A new block, or a walk to an event: libipt's no-event walk
            # returned (and starts afresh after the event).
            _unwind(ct, valid, e_ninsn, e_dip, frames, fr_nip, fr_mode, st)
        if b_flags[r] & O_UNCACHED:
            continue
        ip = b_ip[r]
        mode = b_mode[r]
        run = b_run[r]
        n = np.int64(b_ninsn[r])
        for q in range(n):
            if run >= 0:
                k = np.int64(r_insn[r_first[run] + q])
            else:
                k = hash_find(h_ip, h_mode, h_val, ip, mode)
            if k < 0:
                break  # cannot happen: the decoder read every instruction it reports
            c = i_class[k]
            direct = (i_flags[k] & I_DIRECT) != 0 and (c == CLASS_CALL or c == CLASS_JUMP)
            if direct:
                nip = i_target[k]
            else:
                nip = ip + np.uint64(i_size[k])
            m = st[B_MODE]
            if m == M_END:
                # libipt ended the block here; the flow goes on: a new one.
                _unwind(ct, valid, e_ninsn, e_dip, frames, fr_nip, fr_mode, st)
                starts[npieces] = q
                npieces += 1
                counts[r] += 1
                m = M_LOOKUP
            if m == M_SKIP:
                st[B_SKIP] -= 1
                if st[B_SKIP] == 0:
                    st[B_MODE] = M_LOOKUP
                ip = nip
                continue
            if m == M_LOOKUP:
                if valid[k]:
                    left = e_ninsn[k] - 1
                    if left > 0:
                        st[B_SKIP] = left
                        st[B_MODE] = M_SKIP
                    ip = nip
                    continue
                st[B_MODE] = M_FILL
                st[B_STEPS] = FILL_STEPS
            # Filling (pt_blk_proceed_no_event_fill_cache).
            if not (direct or c == CLASS_OTHER or c == CLASS_PTWRITE):
                _put(valid, e_ninsn, e_dip, k, 1, ip)  # a decision point: trace ends the block
                st[B_MODE] = M_END
            elif c == CLASS_CALL or (c == CLASS_JUMP and i_target[k] < ip + np.uint64(i_size[k])):
                _put(valid, e_ninsn, e_dip, k, 1, ip)  # a decode stop
                st[B_MODE] = M_END
            else:
                nk = hash_find(h_ip, h_mode, h_val, nip, mode)
                if nk >= 0 and valid[nk]:
                    if _extend(valid, e_ninsn, e_dip, k, ip, nk, nip):
                        st[B_MODE] = M_LOOKUP  # on through the cache
                    else:
                        st[B_MODE] = M_END
                else:
                    st[B_STEPS] -= 1
                    if st[B_STEPS] == 0:
                        _trampoline(valid, e_ninsn, e_dip, k, ip, nip)
                        st[B_MODE] = M_END
                    else:
                        f = st[B_NFRAME]
                        frames[f] = k
                        fr_nip[f] = nip
                        fr_mode[f] = mode
                        st[B_NFRAME] = f + 1
            ip = nip
    return npieces


@aot.njit(cache=True, _nrt=False)
def apply_splits(b_ip, b_ninsn, b_flags, b_mode, b_offset, b_time, b_run, ev_blk, ct, starts, counts,
                 remap, o_ip, o_ninsn, o_flags, o_mode, o_offset, o_time, o_run, o_evblk):  # fmt: skip
    """The batch's rows with each row cut where ``split_blocks`` said; the
    events' row numbers follow."""
    h_ip, h_mode, h_val = ct[R.T_H_IP], ct[R.T_H_MODE], ct[R.T_H_VAL]
    i_ip, i_size, i_class = ct[R.T_I_IP], ct[R.T_I_SIZE], ct[R.T_I_CLASS]
    i_flags, i_target = ct[R.T_I_FLAGS], ct[R.T_I_TARGET]
    r_first, r_insn = ct[R.T_R_FIRST], ct[R.T_R_INSN]
    nrows = b_ip.shape[0]
    o = 0
    s = 0
    for r in range(nrows):
        remap[r] = o
        cuts = counts[r]
        prev = np.int64(0)
        ip = b_ip[r]
        run = b_run[r]
        for c in range(cuts + 1):
            end = np.int64(b_ninsn[r]) if c == cuts else np.int64(starts[s + c])
            if end > prev or cuts == 0:
                o_ip[o] = ip
                o_ninsn[o] = end - prev
                o_flags[o] = b_flags[r] if prev == 0 and c == 0 else (b_flags[r] | O_NEW)
                o_mode[o] = b_mode[r]
                o_offset[o] = b_offset[r]
                o_time[o] = b_time[r]
                o_run[o] = run if prev == 0 else -1
                o += 1
            # Walk to the next piece's first instruction.
            for q in range(prev, end):
                if run >= 0:
                    k = np.int64(r_insn[r_first[run] + q])
                else:
                    k = hash_find(h_ip, h_mode, h_val, ip, b_mode[r])
                if k < 0:
                    break
                ip = _next_ip(i_ip, i_size, i_class, i_flags, i_target, k)
            prev = end
        s += cuts
    remap[nrows] = o
    for j in range(ev_blk.shape[0]):
        e = ev_blk[j]
        o_evblk[j] = remap[e] if 0 <= e <= nrows else e
    return o


class BlockCache:
    """libipt's block cache for one decoding, replayed batch by batch."""

    def __init__(self) -> None:
        self.table = None
        self.generation = -1
        self.valid = np.zeros(0, np.uint8)
        self.ninsn = np.zeros(0, np.int64)
        self.dip = np.zeros(0, np.uint64)
        self.frames = np.zeros(FILL_STEPS + 1, np.int64)
        self.fr_nip = np.zeros(FILL_STEPS + 1, np.uint64)
        self.fr_mode = np.zeros(FILL_STEPS + 1, np.uint8)
        self.state = np.zeros(NB, np.int64)

    def split(self, b) -> tuple:
        """The batch's block rows and event row numbers with libipt's
        extra block ends: (ip, ninsn, flags, mode, offset, time, run,
        event_block, extra blocks)."""
        table = b.table
        if table is not self.table or table.generation != self.generation:
            self.table, self.generation = table, table.generation
            self.valid = np.zeros(0, np.uint8)  # other code: start afresh
        n = table.n_insns
        if self.valid.shape[0] < n:
            size = max(2 * n, 1024)
            self.valid = np.concatenate(
                [self.valid, np.zeros(size - self.valid.shape[0], np.uint8)]
            )
            self.ninsn = np.resize(self.ninsn, size)
            self.dip = np.resize(self.dip, size)
        nrows = b.ip.shape[0]
        run = b.run if b.run is not None else np.full(nrows, -1, np.int64)
        ct = table.tuple
        total = int(b.ninsn.sum()) if nrows else 0
        starts = np.zeros(total + 1, np.int64)
        counts = np.zeros(nrows, np.int64)
        extra = split_blocks(b.ip, b.ninsn, b.flags, b.mode, run, ct, self.valid, self.ninsn,
                             self.dip, self.frames, self.fr_nip, self.fr_mode, self.state, starts,
                             counts)  # fmt: skip
        if extra == 0:
            return b.ip, b.ninsn, b.flags, b.mode, b.offset, b.time, run, b.event_block, 0
        m = nrows + extra
        out = (
            np.empty(m, b.ip.dtype), np.empty(m, b.ninsn.dtype), np.empty(m, b.flags.dtype),
            np.empty(m, b.mode.dtype), np.empty(m, b.offset.dtype), np.empty(m, b.time.dtype),
            np.empty(m, np.int64), np.empty_like(b.event_block),
        )  # fmt: skip
        m = apply_splits(b.ip, b.ninsn, b.flags, b.mode, b.offset, b.time, run, b.event_block, ct,
                         starts, counts, np.empty(nrows + 1, np.int64), *out)  # fmt: skip
        return (*(a[:m] for a in out[:7]), out[7], extra)


__all__ = ["BlockCache", "split_blocks"]
