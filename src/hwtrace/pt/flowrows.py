"""The decoded instruction flow's format: what the flow decoder writes and
what everything above :mod:`hwtrace.pt` reads.

The compiled flow decoder (:class:`~hwtrace.pt.flowdec.FlowDecoder`) writes
numpy columns, a batch at a time (:class:`~hwtrace.pt.flowdec.FlowBatch`):

* **block rows**: ``ip`` (first instruction), ``ninsn`` (instructions that
  ran one after another from there, straight-line or through direct jumps
  and calls), ``flags`` (:data:`O_NEW`, :data:`O_SPEC`, :data:`O_UNCACHED`),
  ``mode`` (16, 32 or 64), ``offset`` (trace offset where the block's
  decoding began), ``time`` (the decoder's time stamp then) and ``run``
  (the code table's run the row is, -1: a part of one).  One of libipt's
  blocks may take several rows; :data:`O_NEW` marks its first.
* **event rows**: a ``uint64`` matrix of :data:`EW` words a row.  Column
  :data:`E_TYPE` holds an :class:`Ev` (or an output marker ``X_*``),
  :data:`E_FLAGS` the ``F_*`` bits, :data:`E_IP`, :data:`E_AT` and
  :data:`E_TSC` the addresses and time; the payload words ``E_P0...``
  mean what the ``E_*`` aliases below say for the event's type.  Each
  event row comes with its trace offset and the number of block rows
  before it, which places it in the flow.

Instruction addresses within a block come from the code the decoder
walked: its :class:`CodeTable` (one per image).  Consumers read it in
compiled code, never instruction by instruction in Python: the arrays of
:attr:`CodeTable.tuple` at the ``T_*`` positions, :func:`find_insn` (an
instruction by address and mode) and :func:`insn_successor` (where it goes
without trace).  :class:`CodeView` keeps a table readable as it was (a
decoding's result); :func:`instructions_of` turns blocks into every
instruction's address (:func:`expand_blocks` is its compiled walk).

Gaps: an error row (``X_ERROR``) is a :class:`Gap` (:func:`error_gaps`);
after any of :data:`GAP_TYPES` that is no status update the flow has a gap
before the next block (:func:`gap_events`, :func:`gaps_before`).

Every name here is public; the compiled decoder uses the same ones (numba
reads module-level ints as constants).  The decoder's options are
:class:`EventOptions`, :class:`BlockFlags` and :class:`AddrFilter`
(defined in :mod:`hwtrace.pt.options`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .codetable import (
    C_MISS_IP,
    C_MISS_MODE,
    CLASS_CALL,
    CLASS_JUMP,
    EXPAND_DONE,
    EXPAND_MISS,
    EXPAND_NO_INSN,
    I_DIRECT,
    T_H_IP,
    T_H_MODE,
    T_H_VAL,
    T_I_CLASS,
    T_I_ERR,
    T_I_FLAGS,
    T_I_IP,
    T_I_SIZE,
    T_I_SPECIAL,
    T_I_TARGET,
    T_R_FIRST,
    T_R_INSN,
    T_R_LASTK,
    T_R_NINSN,
    T_X_TAB,
    CodeTable,
    build_run,
    expand_blocks,
    find_insn,
    hash_find,
    insn_successor,
)
from .errors import errstr
from .options import AddrFilter, BlockFlags, EventOptions

# ---------------------------------------------------------------------------
# Events.


class Ev(enum.IntEnum):
    """Event types (Intel's ``enum pt_event_type`` plus TNT and TIP)."""

    ENABLED = 0
    DISABLED = 1
    ASYNC_DISABLED = 2
    ASYNC_BRANCH = 3
    PAGING = 4
    ASYNC_PAGING = 5
    OVERFLOW = 6
    EXEC_MODE = 7
    TSX = 8
    STOP = 9
    VMCS = 10
    ASYNC_VMCS = 11
    EXSTOP = 12
    MWAIT = 13
    PWRE = 14
    PWRX = 15
    PTWRITE = 16
    TICK = 17
    CBR = 18
    MNT = 19
    TIP = 20
    TNT = 21
    IFLAGS = 22
    INTERRUPT = 23
    IRET = 24
    SMI = 25
    RSM = 26
    SIPI = 27
    INIT = 28
    VMENTRY = 29
    VMEXIT = 30
    SHUTDOWN = 31
    UINTR = 32
    UIRET = 33
    TRIG = 34
    IGNORE = 35  # internal: binds a packet that changed nothing
    SWINTR = 36  # software interrupt (INT n, INT3, INTO): Event Trace CFE 14
    SYSCALL = 37  # SYSCALL/SYSENTER: Event Trace CFE 15


class ExecMode(enum.IntEnum):
    """An execution mode (an EXEC_MODE event's ``mode``)."""

    UNKNOWN = 0
    BITS16 = 16
    BITS32 = 32
    BITS64 = 64


# Event types as plain ints (what event rows hold, and numba's constants).
EV_ENABLED = int(Ev.ENABLED)
EV_DISABLED = int(Ev.DISABLED)
EV_ASYNC_DISABLED = int(Ev.ASYNC_DISABLED)
EV_ASYNC_BRANCH = int(Ev.ASYNC_BRANCH)
EV_PAGING = int(Ev.PAGING)
EV_ASYNC_PAGING = int(Ev.ASYNC_PAGING)
EV_OVERFLOW = int(Ev.OVERFLOW)
EV_EXEC_MODE = int(Ev.EXEC_MODE)
EV_TSX = int(Ev.TSX)
EV_STOP = int(Ev.STOP)
EV_VMCS = int(Ev.VMCS)
EV_ASYNC_VMCS = int(Ev.ASYNC_VMCS)
EV_EXSTOP = int(Ev.EXSTOP)
EV_MWAIT = int(Ev.MWAIT)
EV_PWRE = int(Ev.PWRE)
EV_PWRX = int(Ev.PWRX)
EV_PTWRITE = int(Ev.PTWRITE)
EV_TICK = int(Ev.TICK)
EV_CBR = int(Ev.CBR)
EV_MNT = int(Ev.MNT)
EV_TIP = int(Ev.TIP)
EV_TNT = int(Ev.TNT)
EV_IFLAGS = int(Ev.IFLAGS)
EV_INTERRUPT = int(Ev.INTERRUPT)
EV_IRET = int(Ev.IRET)
EV_SMI = int(Ev.SMI)
EV_RSM = int(Ev.RSM)
EV_SIPI = int(Ev.SIPI)
EV_INIT = int(Ev.INIT)
EV_VMENTRY = int(Ev.VMENTRY)
EV_VMEXIT = int(Ev.VMEXIT)
EV_SHUTDOWN = int(Ev.SHUTDOWN)
EV_UINTR = int(Ev.UINTR)
EV_UIRET = int(Ev.UIRET)
EV_TRIG = int(Ev.TRIG)
EV_IGNORE = int(Ev.IGNORE)
EV_SWINTR = int(Ev.SWINTR)
EV_SYSCALL = int(Ev.SYSCALL)

# Output rows that are not events of the flow (X_*): every type from
# X_ERROR on.
X_ERROR = 64  # E_P0: the error code, E_P1: ERR_* below, E_IP: where, E_TSC: time
X_END = 65  # ptxed's "[end of trace]"
X_RESYNC_DISABLED = 66  # ptxed's "[disabled]" after resynchronising
# What an X_ERROR row's error ended: decoding, a synchronisation, a resync
# (ptxed's --resync-on-error); ERROR_KINDS as ptxed prints them.
ERR_DECODE, ERR_SYNC, ERR_RESYNC = 0, 1, 2
ERROR_KINDS = {ERR_DECODE: "error", ERR_SYNC: "sync error", ERR_RESYNC: "resync error"}

# Event-row columns.
E_TYPE, E_FLAGS, E_IP, E_AT, E_TSC, E_P0, E_P1, E_P2, E_P3, E_P4, E_P5 = range(11)
EW = 11  # words a row
# E_FLAGS bits: the IP is suppressed (E_IP means nothing); a status update
# (a PSB+ restating the state, no change of the flow); E_TSC holds a time;
# an ENABLED that resumes after a stop.
F_SUPP, F_STATUS, F_HAS_TSC, F_RESUMED = 1, 2, 4, 8
# A TNT whose first bit was taken: its time is the query time (libipt's
# pt_blk_time) until the next event is consumed.
F_STARTED = 16
# An ENABLED (not resumed) at the return address on top of the decoder's
# return stack: code outside the traced ranges, called (or tail-called)
# from the traced code, returned into it; nothing of the traced flow was
# lost (a function left out of an address filter, libc's under a traced
# function).  hwtrace's own: libipt reports such an enable as any other.
F_RETURNED = 32
# The enables after which the flow goes on where it would have: no gap.
F_ON_AGAIN = F_RESUMED | F_RETURNED
# Payload words by event type.
E_CR3, E_NR = E_P0, E_P1  # PAGING, ASYNC_PAGING
E_BASE = E_P0  # VMCS, ASYNC_VMCS
E_MODE = E_P0  # EXEC_MODE
E_SPEC, E_ABORTED = E_P0, E_P1  # TSX
E_HINTS, E_EXT = E_P0, E_P1  # MWAIT
E_STATE, E_SUBSTATE, E_HW = E_P0, E_P1, E_P2  # PWRE
E_LAST, E_DEEPEST, E_WAKE_INT, E_WAKE_ST, E_WAKE_HW = E_P0, E_P1, E_P2, E_P3, E_P4  # PWRX
E_SIZE, E_PAYLOAD = E_P0, E_P1  # PTWRITE (TNT: size and bits; MNT: payload)
E_BITS = E_P1
E_RATIO = E_P0  # CBR
E_IFLAG = E_P0  # IFLAGS
E_VECTOR, E_HAS_CR2, E_CR2 = E_P0, E_P1, E_P2  # INTERRUPT, SIPI, UINTR, SWINTR
E_HAS_VECTOR, E_HAS_VMXQ, E_VMXQ, E_HAS_VMXR, E_VMXR = E_P1, E_P2, E_P3, E_P4, E_P5  # VMEXIT
E_TRBV, E_MULT, E_ICNT = E_P0, E_P1, E_P2  # TRIG

# ---------------------------------------------------------------------------
# Blocks.

# Block-row flags.  O_NEW: the first row of one of libipt's blocks; O_SPEC:
# speculative (inside a TSX transaction); O_UNCACHED: instructions walked
# to a pending event, which libipt's block decoder does without its block
# cache (hwtrace.pt.bcache).
O_NEW, O_SPEC, O_UNCACHED = 1, 2, 4

# The decoder's output buffers (hwtrace.pt._flowloop.new_output), in order:
# the block-row columns, the event rows with their offsets and block counts,
# the block rows' runs, and a block store the decoder may store rows in.
(
    OUT_IP, OUT_NINSN, OUT_FLAGS, OUT_MODE, OUT_OFFSET, OUT_TIME, OUT_EVENTS, OUT_EVENT_OFFSET,
    OUT_EVENT_BLOCK, OUT_RUN, OUT_STORE,
) = range(11)  # fmt: skip


# ---------------------------------------------------------------------------
# Events as objects.


class Event:
    """One event.  ``ip`` is the event's address (the branch target for
    asynchronous branches); ``at`` the source of an asynchronous branch or
    disable.  Other attributes depend on the type."""

    # A plain __dict__ (not __slots__): creating and copying events, which
    # the reference decoder does at every PSB+, is then one C-level dict
    # update.
    FIELDS = (
        "aborted", "at", "autonomous", "base", "bits", "cr2", "cr3", "deepest", "ext",
        "has_cr2", "has_tsc", "has_vector", "has_vmxq", "has_vmxr", "hints", "hw", "icnt",
        "iflag", "interrupt", "ip", "ip_suppressed", "last", "lost_cyc", "lost_mtc", "mode",
        "mult", "non_root", "offset", "payload", "ratio", "resumed", "size", "speculative",
        "started", "state", "status_update", "store", "sub_state", "trbv", "tsc", "type",
        "vector", "vmxq", "vmxr",
    )  # fmt: skip

    def __init__(self, type: Ev = Ev.IGNORE) -> None:
        d = self.__dict__
        d.update(_EVENT_DEFAULTS)
        d["type"] = type

    def copy(self) -> Event:
        ev = Event.__new__(Event)
        ev.__dict__.update(self.__dict__)
        return ev

    def __repr__(self) -> str:
        return (
            f"Event({self.type.name}, ip={self.ip:#x}{' suppressed' if self.ip_suppressed else ''})"
        )


_EVENT_DEFAULTS = dict.fromkeys(Event.FIELDS, 0) | {
    "ip_suppressed": False,
    "status_update": False,
    "has_tsc": False,
    "started": False,  # a TNT whose first bit was taken
}


def event_object(row: np.ndarray) -> Event:
    """An :class:`Event` with the fields of an event row."""
    t = int(row[E_TYPE])
    ev = Event(Ev(t))
    flags = int(row[E_FLAGS])
    ev.ip_suppressed = bool(flags & F_SUPP)
    ev.status_update = bool(flags & F_STATUS)
    ev.has_tsc = bool(flags & F_HAS_TSC)
    ev.resumed = bool(flags & F_RESUMED)
    ev.ip = int(row[E_IP])
    ev.at = int(row[E_AT])
    ev.tsc = int(row[E_TSC])
    p = [int(v) for v in row[E_P0:]]
    if t in (Ev.PAGING, Ev.ASYNC_PAGING):
        ev.cr3, ev.non_root = p[0], p[1]
    elif t in (Ev.VMCS, Ev.ASYNC_VMCS):
        ev.base = p[0]
    elif t == Ev.EXEC_MODE:
        ev.mode = ExecMode(p[0])
    elif t == Ev.TSX:
        ev.speculative, ev.aborted = p[0], p[1]
    elif t == Ev.MWAIT:
        ev.hints, ev.ext = p[0], p[1]
    elif t == Ev.PWRE:
        ev.state, ev.sub_state, ev.hw = p[0], p[1], p[2]
    elif t == Ev.PWRX:
        ev.last, ev.deepest, ev.interrupt, ev.store, ev.autonomous = p[:5]
    elif t in (Ev.PTWRITE, Ev.TNT):
        ev.size, ev.payload = p[0], p[1]
        ev.bits = p[1]
    elif t == Ev.MNT:
        ev.payload = p[1]
    elif t == Ev.CBR:
        ev.ratio = p[0]
    elif t == Ev.IFLAGS:
        ev.iflag = p[0]
    elif t == Ev.INTERRUPT:
        ev.vector, ev.has_cr2, ev.cr2 = p[0], p[1], p[2]
    elif t in (Ev.SIPI, Ev.UINTR, Ev.SWINTR):
        ev.vector = p[0]
    elif t == Ev.VMEXIT:
        ev.vector, ev.has_vector, ev.has_vmxq, ev.vmxq, ev.has_vmxr, ev.vmxr = p[:6]
    elif t == Ev.TRIG:
        ev.trbv, ev.mult, ev.icnt = p[0], p[1], p[2]
    return ev


def flow_events(events: np.ndarray) -> np.ndarray:
    """Which event rows are events of the flow: neither output markers
    (``X_*``) nor status updates."""
    return (events[:, E_TYPE] < X_ERROR) & ((events[:, E_FLAGS] & F_STATUS) == 0)


# ---------------------------------------------------------------------------
# Gaps.


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


# Events after which the flow has a gap before the next block: what ran
# there is not in the trace (tracing stopped, an error, an overflow).
GAP_TYPES = np.array([X_ERROR, EV_DISABLED, EV_ASYNC_DISABLED, EV_OVERFLOW], np.uint64)


def error_gaps(events: np.ndarray, offsets: np.ndarray) -> list[Gap]:
    """The gaps the error rows among ``events`` (at trace ``offsets``)
    stand for, in order."""
    out = []
    for j in np.flatnonzero(events[:, E_TYPE] == X_ERROR).tolist():
        row = events[j]
        code = int(row[E_P0])
        reason = errstr(code)
        kind = int(row[E_P1])
        if kind != ERR_DECODE:
            reason = f"{ERROR_KINDS[kind]}: {reason}"
        out.append(Gap(int(offsets[j]), int(row[E_IP]), int(row[E_TSC]), reason, code))
    return out


def type_table(types: np.ndarray) -> np.ndarray:
    """A table of which event types are among ``types``, for
    :func:`type_in`."""
    table = np.zeros(int(max(types.max(initial=0), X_ERROR)) + 2, np.bool_)
    table[types.astype(np.int64)] = True
    return table


def type_in(types: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Which of the event ``types`` ``table`` (:func:`type_table`) holds:
    ``numpy.isin`` of a few types, without its sort (a tenth of the time
    on the few hundred events of a batch)."""
    return table[np.minimum(types, table.shape[0] - 1).astype(np.intp)]


#: :func:`type_table` of :data:`GAP_TYPES`
IS_GAP = type_table(GAP_TYPES)


# What a gap is (gap_kinds): none; the flow was lost (tracing stopped and
# did not come back where it would have gone on, an overflow, a decode
# error); or tracing stopped at a branch out of the traced ranges (a
# TIP.PGD with its target) and came back elsewhere with nothing lost in
# between (GAP_REJOINED: code outside the ranges called back into them, as
# libc's qsort calls its comparison function; or a traced function
# returned into it).  Where two meet at one place, the lost flow counts.
GAP_NONE, GAP_LOST, GAP_REJOINED = 0, 1, 2


def gap_kinds(events: np.ndarray) -> np.ndarray:
    """Which event rows put a gap in the flow before the next block, and
    which kind (GAP_*; see :data:`GAP_TYPES`; status updates never do).
    Tracing that stops and is enabled again where it stopped (libipt's
    *resumed*: a system call or an interrupt outside the traced privilege
    levels or address ranges, the user-space part of a trace) is no gap:
    the flow goes on at the same instruction, only its time moved on.  Nor
    is tracing enabled again at the return address of the call it stopped
    in (:data:`F_RETURNED`: a function outside the traced ranges ran and
    returned)."""
    types, flags = events[:, E_TYPE], events[:, E_FLAGS]
    real = (flags & F_STATUS) == 0
    gap = type_in(types, IS_GAP) & real
    kind = gap.astype(np.uint8)
    stops = np.flatnonzero(gap & ((types == EV_DISABLED) | (types == EV_ASYNC_DISABLED)))
    enables = np.flatnonzero((types == EV_ENABLED) & real)
    if stops.shape[0] and enables.shape[0]:
        at = np.searchsorted(enables, stops)
        then = enables[np.minimum(at, enables.shape[0] - 1)]
        # (with no other gap between the stop and the enable)
        before = np.cumsum(gap)
        clean = (at < enables.shape[0]) & (before[then] == before[stops])
        again = (flags[then] & F_ON_AGAIN) != 0
        kind[stops[clean & again]] = GAP_NONE
        left = (types[stops] == EV_DISABLED) & ((flags[stops] & F_SUPP) == 0)
        kind[stops[clean & ~again & left]] = GAP_REJOINED
    return kind


def gap_events(events: np.ndarray) -> np.ndarray:
    """Which event rows put a gap in the flow before the next block, of
    either kind (see :func:`gap_kinds`)."""
    return gap_kinds(events) != GAP_NONE


def joined_gap(kinds: np.ndarray) -> int:
    """The one gap that gaps of ``kinds`` at one place make: the lost flow
    where one lost it, else the largest kind."""
    return GAP_LOST if (kinds == GAP_LOST).any() else int(kinds.max(initial=GAP_NONE))


def mark_gaps(gap: np.ndarray, at: np.ndarray, kinds: np.ndarray) -> None:
    """Join gaps of ``kinds`` into the gap column ``gap`` at rows ``at``,
    as :func:`joined_gap` joins them."""
    for k in (GAP_REJOINED, GAP_LOST):  # (the lost flow last: it counts)
        rows = at[kinds == k]
        gap[rows] = np.where(gap[rows] == GAP_LOST, GAP_LOST, k)


def no_gaps(nrows: int) -> np.ndarray:
    """A gap column of ``nrows`` rows with no gap, for :func:`mark_gaps`.
    Its pages are written before they are read: a page of
    ``numpy.zeros`` first read maps the kernel's zero page, and its first
    write then flushes the TLB of every core the process's threads run on
    (a decode to Parquet lost 3% of its time to those)."""
    gap = np.empty(nrows, np.uint8)
    gap.fill(GAP_NONE)
    return gap


def gaps_before(nrows: int, events: np.ndarray, event_block: np.ndarray) -> tuple[np.ndarray, int]:
    """Where a batch of ``nrows`` block rows has a gap and of which kind
    (GAP_*): before each row (from its event rows and their block
    positions ``event_block``), and after its last row."""
    gap = no_gaps(nrows)
    if not len(events):
        return gap, GAP_NONE
    kind = gap_kinds(events)
    at = np.flatnonzero(kind)
    pos, kind = event_block[at], kind[at]
    inside = pos < nrows
    mark_gaps(gap, pos[inside], kind[inside])
    return gap, joined_gap(kind[~inside])


# ---------------------------------------------------------------------------
# Instructions of blocks.


_NO_REPLAY = (
    np.zeros(0, np.int64), np.zeros(0, np.uint16), np.zeros(0, np.uint64),
    np.zeros(0, np.int32),
)  # fmt: skip


class CodeView:
    """A read-only view of a :class:`CodeTable`'s instructions as it holds
    them now: they stay readable (``tuple``, :meth:`lookup`) however the
    table grows or is cleared later, as a decoding's result needs."""

    def __init__(self, table: CodeTable) -> None:
        # Without the decoder's replay cache (arrays of the same types,
        # empty): a result need not keep it.
        self.tuple = table.tuple[:T_X_TAB] + _NO_REPLAY
        self.index = table.index  # the image's number in its decoding

    def lookup(self, ip: int, mode: int) -> int:
        """The index of the entry decoded at ``(ip, mode)``, or -1."""
        ct = self.tuple
        return int(hash_find(ct[T_H_IP], ct[T_H_MODE], ct[T_H_VAL], np.uint64(ip), np.uint8(mode)))


def instructions_of(
    tables: Sequence[CodeTable | CodeView],
    block_ip: np.ndarray,
    block_ninsn: np.ndarray,
    block_mode: np.ndarray | int = 64,
    *,
    decode_missing: bool = False,
) -> np.ndarray:
    """The address of every instruction of the blocks, in order, from code
    ``tables`` of one image (several: decoded by several decoders).  Code
    none of them holds is decoded into the first with ``decode_missing``,
    else raises RuntimeError; a block that runs into bytes that are no
    instruction raises ValueError.  The walk is compiled
    (:func:`expand_blocks`); Python only sees the misses."""
    bip, bn, modes = _block_columns(block_ip, block_ninsn, block_mode)
    out = np.empty(int(bn.sum()), np.uint64)
    if not tables:
        # Nothing decoded: only blocks of at most one instruction are known.
        longer = np.flatnonzero(bn > 1)
        if longer.shape[0]:
            raise RuntimeError(f"block {int(longer[0])} walks into code that was never decoded")
        out[:] = bip[bn == 1]
        return out
    _expand(tables, bip, bn, modes, out, _NO_ROWS, decode_missing)
    return out


def instruction_rows(
    table: CodeTable,
    block_ip: np.ndarray,
    block_ninsn: np.ndarray,
    block_mode: np.ndarray | int = 64,
    *,
    out: tuple[np.ndarray, np.ndarray] | None = None,
    runs: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`instructions_of` from one table, decoding what it misses,
    with each instruction's index in the table (its ``i_*`` columns describe
    it: class, size, target, error), so per-instruction facts are gathered
    from per-table ones.  ``out``: a ``uint64`` and an ``int64`` array with
    room for them, written and returned (cut to size) instead of new ones;
    ``runs``: each block's run in the table where known (-1: not), whose
    instructions are copied, not looked up one by one."""
    bip, bn, modes = _block_columns(block_ip, block_ninsn, block_mode)
    total = int(bn.sum())
    if out is None:
        ips, rows = np.empty(total, np.uint64), np.empty(max(total, 1), np.int64)
    else:
        ips, rows = out
        if ips.shape[0] < total or rows.shape[0] < max(total, 1):
            raise ValueError(f"room for {min(ips.shape[0], rows.shape[0])} of {total} instructions")
    brun = _NO_ROWS if runs is None else np.ascontiguousarray(runs, np.int64)
    _expand([table], bip, bn, modes, ips, rows, True, brun)
    return ips[:total], rows[:total]


_NO_ROWS = np.zeros(0, np.int64)


def _block_columns(block_ip, block_ninsn, block_mode):
    bip = np.ascontiguousarray(block_ip, np.uint64)
    bn = np.ascontiguousarray(block_ninsn, np.int64)
    modes = np.ascontiguousarray(np.broadcast_to(np.asarray(block_mode), bip.shape), np.uint8)
    return bip, bn, modes


def _expand(tables, bip, bn, modes, out, rows, decode_missing: bool, runs=_NO_ROWS) -> None:
    """Run :func:`expand_blocks` over ``tables``, switching table or
    decoding into the first at each miss."""
    state = np.zeros(4, np.int64)  # block, output position, missed ip, missed mode
    cur = 0
    while True:
        r = expand_blocks(tables[cur].tuple, bip, bn, modes, runs, out, rows, state)
        if r == EXPAND_DONE:
            return
        ip, mode = int(state[2]) & 0xFFFFFFFFFFFFFFFF, int(state[3])
        if r == EXPAND_NO_INSN:
            raise ValueError(f"a block runs into bytes that are no instruction at {ip:#x}")
        held = [i for i, t in enumerate(tables) if i != cur and t.lookup(ip, mode) >= 0]
        if held:
            cur = held[0]
        elif decode_missing:
            cur = 0
            tables[0].fill(ip, mode)
        else:
            raise RuntimeError(f"block {int(state[0])} walks into code that was never decoded")


__all__ = [
    "CLASS_CALL",
    "CLASS_JUMP",
    "C_MISS_IP",
    "C_MISS_MODE",
    "ERROR_KINDS",
    "ERR_DECODE",
    "ERR_RESYNC",
    "ERR_SYNC",
    "EV_ASYNC_BRANCH",
    "EV_ASYNC_DISABLED",
    "EV_ASYNC_PAGING",
    "EV_ASYNC_VMCS",
    "EV_CBR",
    "EV_DISABLED",
    "EV_ENABLED",
    "EV_EXEC_MODE",
    "EV_EXSTOP",
    "EV_IFLAGS",
    "EV_IGNORE",
    "EV_INIT",
    "EV_INTERRUPT",
    "EV_IRET",
    "EV_MNT",
    "EV_MWAIT",
    "EV_OVERFLOW",
    "EV_PAGING",
    "EV_PTWRITE",
    "EV_PWRE",
    "EV_PWRX",
    "EV_RSM",
    "EV_SHUTDOWN",
    "EV_SIPI",
    "EV_SMI",
    "EV_STOP",
    "EV_SWINTR",
    "EV_SYSCALL",
    "EV_TICK",
    "EV_TIP",
    "EV_TNT",
    "EV_TRIG",
    "EV_TSX",
    "EV_UINTR",
    "EV_UIRET",
    "EV_VMCS",
    "EV_VMENTRY",
    "EV_VMEXIT",
    "EW",
    "EXPAND_DONE",
    "EXPAND_MISS",
    "EXPAND_NO_INSN",
    "E_ABORTED",
    "E_AT",
    "E_BASE",
    "E_BITS",
    "E_CR2",
    "E_CR3",
    "E_DEEPEST",
    "E_EXT",
    "E_FLAGS",
    "E_HAS_CR2",
    "E_HAS_VECTOR",
    "E_HAS_VMXQ",
    "E_HAS_VMXR",
    "E_HINTS",
    "E_HW",
    "E_ICNT",
    "E_IFLAG",
    "E_IP",
    "E_LAST",
    "E_MODE",
    "E_MULT",
    "E_NR",
    "E_P0",
    "E_P1",
    "E_P2",
    "E_P3",
    "E_P4",
    "E_P5",
    "E_PAYLOAD",
    "E_RATIO",
    "E_SIZE",
    "E_SPEC",
    "E_STATE",
    "E_SUBSTATE",
    "E_TRBV",
    "E_TSC",
    "E_TYPE",
    "E_VECTOR",
    "E_VMXQ",
    "E_VMXR",
    "E_WAKE_HW",
    "E_WAKE_INT",
    "E_WAKE_ST",
    "F_HAS_TSC",
    "F_ON_AGAIN",
    "F_RESUMED",
    "F_RETURNED",
    "F_STARTED",
    "F_STATUS",
    "F_SUPP",
    "GAP_LOST",
    "GAP_NONE",
    "GAP_REJOINED",
    "GAP_TYPES",
    "I_DIRECT",
    "OUT_EVENTS",
    "OUT_EVENT_BLOCK",
    "OUT_EVENT_OFFSET",
    "OUT_FLAGS",
    "OUT_IP",
    "OUT_MODE",
    "OUT_NINSN",
    "OUT_OFFSET",
    "OUT_RUN",
    "OUT_STORE",
    "OUT_TIME",
    "O_NEW",
    "O_SPEC",
    "O_UNCACHED",
    "T_H_IP",
    "T_H_MODE",
    "T_H_VAL",
    "T_I_CLASS",
    "T_I_ERR",
    "T_I_FLAGS",
    "T_I_IP",
    "T_I_SIZE",
    "T_I_SPECIAL",
    "T_I_TARGET",
    "T_R_FIRST",
    "T_R_INSN",
    "T_R_LASTK",
    "T_R_NINSN",
    "X_END",
    "X_ERROR",
    "X_RESYNC_DISABLED",
    "AddrFilter",
    "BlockFlags",
    "CodeTable",
    "CodeView",
    "Ev",
    "Event",
    "EventOptions",
    "ExecMode",
    "Gap",
    "build_run",
    "error_gaps",
    "event_object",
    "expand_blocks",
    "find_insn",
    "flow_events",
    "gap_events",
    "gap_kinds",
    "gaps_before",
    "hash_find",
    "insn_successor",
    "instruction_rows",
    "instructions_of",
    "joined_gap",
    "mark_gaps",
    "no_gaps",
]
