"""Decoded code for the compiled flow decoder.

The flow decoder walks the traced program's code between trace packets.
Decoding x86 is iced-x86's job and happens in Python, once per instruction
address; the compiled decoder then reads what it needs from plain arrays:

* the **instruction table**: for each decoded ``(ip, mode)`` the length, how
  control leaves it (:class:`~hwtrace.isa.x86.IClass`), the instructions
  events bind to (:class:`~hwtrace.isa.x86.Special`), a direct branch's
  target, the section it lies in, and its raw bytes; addresses that hold no
  instruction are kept too, with libipt's error code (no memory mapped,
  unknown instruction);
* **runs**: straight-line stretches of instructions ending at the first one
  that may transfer control, which the decoder's fast loop follows a whole
  run at a time.

Both are found through open-addressing hash tables keyed by ``(ip, mode)``.
When the compiled decoder meets an address that is not decoded yet it stops
and says which; :meth:`CodeTable.fill` decodes a straight-line stretch from
there and the decoder goes on.  The tables only grow between decoder calls.
64-bit code in a section a fill has read once is decoded by the flow loop
itself when it meets it again (:func:`fill_missing`, from the table's
:meth:`CodeTable.code_space`): only code the compiled decoder does not know
returns to Python.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import deque
from itertools import repeat

import numpy as np

from .. import aot
from ..columns import random_access_zeros
from ..isa.quick import QUICK_UNKNOWN, decode_quick
from ..isa.x86 import IClass, InsnCache, Special

# Instruction flags.
I_DIRECT = 1  # a near branch with a displacement (i_target is its target)
I_TRUNCATED = 2  # its bytes come from more than one section
I_NO_PUSH = 4  # a CALL to the next instruction: reads the IP, pushes nothing

# How a run ends (its last instruction).
RUN_FALL = 0  # no branch: the next run follows (the run was cut short)
RUN_COND = 1  # conditional branch: one TNT bit
RUN_JUMP = 2  # direct jump: no trace
RUN_CALL = 3  # direct call: no trace, pushes the return address
RUN_IJUMP = 4  # indirect jump: TIP
RUN_ICALL = 5  # indirect call: TIP, pushes the return address
RUN_RET = 6  # near return: compressed (TNT bit) or TIP
RUN_STOP = 7  # anything else: far transfers, code errors; the event path decides

RUN_MAX = 4096  # instructions in one run
FILL_MAX = 256  # instructions decoded by one fill
PREFETCH_MAX = 1024  # instructions decoded ahead by one fill
#: Bytes of code the tables of a process copy for their flow loops to
#: decode from by themselves (see CodeTable.code_space), at most.
CODE_SPACE_MAX = 1 << 28
MAX_INSN_BYTES = 15  # (x86)

# counts[] slots: instructions, runs and run instructions held, where the
# last miss was, the image's number in its decoding (FlowDecoder), and the
# block store whose keys ``r_key`` holds (see hwtrace.pt.blocks); then the
# replay cache's generation, how much of its two pools is used and whose
# block keys its pool holds (a store's number; -2: none, rows only counted),
# and how many block rows it has replayed; how many times the fast loop
# took tracing off and on again itself, and a PSB+.
C_INSNS, C_RUNS, C_RUN_INSNS, C_MISS_IP, C_MISS_MODE, C_INDEX, C_KEY_OWNER = range(7)
C_X_GEN, C_X_POOL, C_X_PUSH, C_X_OWNER, C_X_ROWS, C_OFF_ON, C_PSB = 7, 8, 9, 10, 11, 12, 13
_NCOUNTS = 16

# The arrays of CodeTable.tuple, what the compiled code takes, in order.
(
    T_H_IP, T_H_MODE, T_H_VAL, T_I_IP, T_I_SIZE, T_I_CLASS, T_I_SPECIAL, T_I_FLAGS, T_I_TARGET,
    T_I_ISID, T_I_ERR, T_I_RAW, T_R_HIP, T_R_HMODE, T_R_HVAL, T_R_IP, T_R_MODE, T_R_NINSN,
    T_R_KIND, T_R_NEXT, T_R_TARGET, T_R_FIRST, T_R_ISID, T_R_INSN, T_COUNTS, T_R_SUCC,
    T_R_TAKEN, T_R_RET, T_R_LASTK, T_R_LASTC, T_R_KEY, T_X_TAB, T_X_KEY, T_X_PIP, T_X_PRUN,
) = range(35)  # fmt: skip

# The replay cache (see hwtrace.pt._flowloop): decoded stretches of runs,
# keyed by the run they start at and the trace bits that drive them: entries
# (X_FIELDS words each: the half a replay reads in one cache line, 64
# bytes apart, the other half after all of those), and pools for the
# block-store keys of the stretches' runs and for the return addresses they
# push; a full pool empties the cache.  Its size follows the trace a decoder is given (see
# CodeTable.reserve_replay), from X_SLOTS_MIN entries (0.3 MiB in all) to
# X_SLOTS_MAX (5 MiB).
X_FIELDS = 16
X_SLOTS_MIN, X_SLOTS_MAX = 1 << 10, 1 << 14
X_POOL_PER_SLOT = 64  # keys
X_PUSH_PER_SLOT = 4  # return addresses
X_BYTES_PER_SLOT = 1 << 10  # of trace, in the decoder's guess

_EMPTY = np.uint64(0xFFFFFFFFFFFFFFFF)
_NO_U64 = np.zeros(0, np.uint64)
_NO_I64 = np.zeros(0, np.int64)

#: Instructions iced-x86 decoded where the compiled decoder did not know
#: them (AVX-512 in libc's string functions, LOCK, ...), by their bytes:
#: plain 64-bit instructions (no branch, nothing special), whose bytes
#: alone make them what they are, wherever they lie.  An address whose
#: first bytes are one of them holds that instruction (an instruction's
#: bytes are no other's first bytes), so the compiled fills decode it
#: without iced-x86: in the next process exec'ing the same library too.
#: Open addressing on a hash of the bytes: each slot's length (0: empty)
#: and bytes; the count and which lengths occur.  One table per thread (a
#: thread's flow loops read it while only that thread's fills write it),
#: at most half full (then nothing more is learned).
LEARNED_SLOTS = 1 << 14
_learned_here = threading.local()


def _learned() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    got = getattr(_learned_here, "table", None)
    if got is None:
        got = _learned_here.table = (np.zeros(LEARNED_SLOTS, np.uint8),
                                     np.zeros((LEARNED_SLOTS, 16), np.uint8),
                                     np.zeros(2, np.int64))  # fmt: skip
    return got


class _CodeArena:
    """The copies of the sections of code the tables' flow loops decode
    from by themselves, one per section object for every table of the
    process (a kernel's text, in every process image, is copied once),
    and one for sections that view the same bytes: each program a process
    exec's maps libc anew, its sections cut from the one memory map of
    the file (:func:`~hwtrace.image.sections.map_file`).  Bytes are
    appended, never moved: a full array grows into a new one, the old one
    left to the code spaces that hold it; at most CODE_SPACE_MAX in all,
    emptied once no section copied lives on."""

    def __init__(self) -> None:
        self.data = np.zeros(0, np.uint8)
        self.used = 0
        self.at: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # Where the bytes at an address (and of a length) were copied, and
        # a section that views them: while it lives, so does the memory it
        # views, so another section viewing that address holds those bytes.
        self.by_bytes: dict[tuple[int, int], tuple[int, weakref.ref]] = {}

    def place(self, section) -> int:
        """Where ``section``'s bytes are in :attr:`data` (copied now if
        they were not), or -1 when there is no room."""
        got = self.at.get(section)
        if got is not None:
            return got
        if not self.at:
            self.data, self.used, self.by_bytes = np.zeros(0, np.uint8), 0, {}
        size = int(section.data.shape[0])
        where = (section.data.__array_interface__["data"][0], size)
        twin = self.by_bytes.get(where)
        if twin is not None and twin[1]() is not None:
            self.at[section] = twin[0]
            return twin[0]
        used = self.used
        if used + size > CODE_SPACE_MAX:
            return -1
        if used + size > self.data.shape[0]:
            grown = np.empty(max(used + size, 2 * self.data.shape[0]), np.uint8)
            grown[:used] = self.data[:used]
            self.data = grown
        self.data[used : used + size] = section.data
        self.at[section] = used
        self.by_bytes[where] = (used, weakref.ref(section))
        self.used = used + size
        return used


_arena: tuple[int, _CodeArena] | None = None


def _code_arena() -> _CodeArena:
    global _arena
    if _arena is None or _arena[0] != os.getpid():
        _arena = (os.getpid(), _CodeArena())
    return _arena[1]


_MASK64 = 0xFFFFFFFFFFFFFFFF

CLASS_OTHER = int(IClass.OTHER)
CLASS_PTWRITE = int(IClass.PTWRITE)
CLASS_JUMP = int(IClass.JUMP)
CLASS_CALL = int(IClass.CALL)
CLASS_COND = int(IClass.COND_JUMP)


# ---------------------------------------------------------------------------
# Hash tables keyed by (ip, mode).


@aot.njit(cache=True, inline="always", _nrt=False)
def _slot(ip, mode, mask):
    h = ((ip ^ np.uint64(mode)) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(17)
    return np.int64(h & np.uint64(mask))


@aot.njit(cache=True, inline="always", _nrt=False)
def hash_find(h_ip, h_mode, h_val, ip, mode):
    """The value stored for ``(ip, mode)``, or -1.  (Unsigned slots: numba
    checks a signed index for a negative value, on every probe.)"""
    mask = np.uint64(h_ip.shape[0] - 1)
    s = np.uint64(_slot(ip, mode, mask))
    while True:
        v = h_val[s]
        if v < 0:
            return np.int64(-1)
        if h_ip[s] == ip and h_mode[s] == mode:
            return np.int64(v)
        s = (s + np.uint64(1)) & mask


@aot.njit(cache=True, _nrt=False)
def hash_lookup(h_ip, h_mode, h_val, ip, mode):
    """:func:`hash_find` called from Python (``ip`` a uint64, ``mode`` an
    int64: one specialisation)."""
    return hash_find(h_ip, h_mode, h_val, ip, mode)


@aot.njit(cache=True, _nrt=False)
def hash_put(h_ip, h_mode, h_val, ip, mode, value):
    mask = h_ip.shape[0] - 1
    s = _slot(ip, mode, mask)
    while h_val[s] >= 0 and not (h_ip[s] == ip and h_mode[s] == mode):
        s = (s + 1) & mask
    h_ip[s] = ip
    h_mode[s] = mode
    h_val[s] = value


@aot.njit(cache=True, _nrt=False)
def _rehash(h_ip, h_mode, h_val, ips, modes, n, skip):
    for i in range(n):
        if not skip[i]:
            hash_put(h_ip, h_mode, h_val, ips[i], modes[i], i)


def _new_hash(capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.full(capacity, _EMPTY, np.uint64),
        np.zeros(capacity, np.uint8),
        np.full(capacity, -1, np.int32),
    )


# ---------------------------------------------------------------------------
# Runs, built in compiled code from the instruction table.


@aot.njit(cache=True, inline="always", _nrt=False)
def is_plain(iclass):
    return iclass == CLASS_OTHER or iclass == CLASS_PTWRITE


@aot.njit(cache=True, _nrt=False)
def build_run(ct, ip, mode):
    """Add the run starting at ``(ip, mode)``.  Returns its index, -1 when an
    instruction on the way is not decoded yet (``ct[MISS]`` says where), -2
    when the run arrays are full (the miss or the need is noted in
    ``counts``)."""
    (
        h_ip, h_mode, h_val, _, i_size, i_class, i_special, i_flags, i_target,
        i_isid, i_err, _, r_hip, r_hmode, r_hval, r_ip, r_mode, r_ninsn, r_kind,
        r_next, r_target, r_first, r_isid, r_insn, counts, r_succ, r_taken, r_ret, r_lastk,
        r_lastc, _, _, _, _, _,
    ) = ct  # fmt: skip
    n_runs = counts[C_RUNS]
    n_rinsn = counts[C_RUN_INSNS]
    if n_runs >= r_ip.shape[0] or n_rinsn + RUN_MAX > r_insn.shape[0]:
        return -2
    first = n_rinsn
    at = ip
    n = 0
    isid = -1
    kind = RUN_STOP
    nxt = at
    target = np.uint64(0)
    while True:
        k = hash_find(h_ip, h_mode, h_val, at, mode)
        if k < 0:
            counts[C_MISS_MODE] = mode
            counts[C_MISS_IP] = np.int64(at)
            return -1
        if i_err[k] != 0 or i_flags[k] & I_TRUNCATED or i_special[k] == Special.JMPABS:
            # The event path reports it (or ends its block there).
            kind = RUN_FALL if n else RUN_STOP
            nxt = at
            break
        if isid >= 0 and i_isid[k] != isid:
            # Blocks do not span sections: a new run, so a new block, starts.
            kind = RUN_FALL
            nxt = at
            break
        isid = i_isid[k]
        c = i_class[k]
        if is_plain(c):
            if n >= RUN_MAX:
                kind = RUN_FALL
                nxt = at
                break
            r_insn[n_rinsn + n] = k
            n += 1
            at = at + np.uint64(i_size[k])
            continue
        nxt = at + np.uint64(i_size[k])
        target = i_target[k]
        direct = i_flags[k] & I_DIRECT
        if c == IClass.COND_JUMP:
            kind = RUN_COND
        elif c == CLASS_JUMP:
            kind = RUN_JUMP if direct else RUN_IJUMP
        elif c == CLASS_CALL:
            if direct:
                kind = RUN_JUMP if i_flags[k] & I_NO_PUSH else RUN_CALL
            else:
                kind = RUN_ICALL
        elif c == IClass.RETURN:
            kind = RUN_RET
        else:
            kind = RUN_FALL if n else RUN_STOP
            nxt = at
            break
        r_insn[n_rinsn + n] = k
        n += 1
        break
    idx = n_runs
    r_ip[idx] = ip
    r_mode[idx] = mode
    r_ninsn[idx] = n
    r_kind[idx] = kind
    r_next[idx] = nxt
    r_target[idx] = target
    r_first[idx] = first
    r_isid[idx] = isid
    r_succ[idx] = -1
    r_taken[idx] = -1
    r_ret[idx] = -1
    if n:
        last = r_insn[n_rinsn + n - 1]
        r_lastk[idx] = last
        r_lastc[idx] = i_class[last]
    else:
        r_lastk[idx] = -1
        r_lastc[idx] = 0
    counts[C_RUNS] = n_runs + 1
    counts[C_RUN_INSNS] = n_rinsn + n
    hash_put(r_hip, r_hmode, r_hval, ip, mode, idx)
    return idx


# ---------------------------------------------------------------------------
# Reading the table from compiled code: instructions by address, and the
# instructions of blocks.


@aot.njit(cache=True, inline="always", _nrt=False)
def find_insn(ct, ip, mode):
    """The index of the instruction decoded at ``(ip, mode)`` in the table
    ``ct`` (a :attr:`CodeTable.tuple`), or -1; its ``i_err`` is libipt's
    error code where no instruction could be decoded."""
    return hash_find(ct[T_H_IP], ct[T_H_MODE], ct[T_H_VAL], ip, mode)


@aot.njit(cache=True, inline="always", _nrt=False)
def insn_successor(ct, k):
    """Where instruction ``k`` goes when it needs no trace: a direct JMP's
    or CALL's target (not JMPABS's, whose target is absolute), else the
    next instruction.  (A block ends at any other transfer.)"""
    c = ct[T_I_CLASS][k]
    if (
        ct[T_I_FLAGS][k] & I_DIRECT
        and (c == CLASS_JUMP or c == CLASS_CALL)
        and ct[T_I_SPECIAL][k] != Special.JMPABS
    ):
        return ct[T_I_TARGET][k]
    return ct[T_I_IP][k] + np.uint64(ct[T_I_SIZE][k])


# expand_blocks results.
EXPAND_DONE, EXPAND_MISS, EXPAND_NO_INSN = 0, 1, 2


@aot.njit(cache=True, nogil=True, _nrt=False)
def expand_blocks(ct, bip, bn, bmode, brun, out, outk, state):
    """Write the address of every instruction of blocks ``bip``/``bn``
    (execution modes ``bmode``) into ``out``, walking the table ``ct``, and,
    when ``outk`` is not empty, each one's index in the table into
    ``outk``.  A block whose ``brun`` (when not empty) names a run of the
    table with its address and length is copied from the run's list of
    instructions instead.  ``state``: the block and output position to go on from, then
    where the walk stopped.  Returns EXPAND_DONE, or EXPAND_MISS /
    EXPAND_NO_INSN when a block needs the successor of an instruction the
    table does not hold / that is no instruction (``state[2:4]``: its
    address and mode; ``state[:2]`` the block's start, to go on from)."""
    rows = outk.shape[0] != 0
    runs = brun.shape[0] != 0
    i = state[0]
    j = state[1]
    while i < bip.shape[0]:
        ip = bip[i]
        mode = bmode[i]
        n = bn[i]
        if runs:
            r = brun[i]
            if r >= 0 and ct[T_R_NINSN][r] == n and ct[T_R_IP][r] == ip and ct[T_R_MODE][r] == mode:
                f = ct[T_R_FIRST][r]
                for m in range(n):
                    k = ct[T_R_INSN][f + m]
                    out[j] = ct[T_I_IP][k]
                    if rows:
                        outk[j] = k
                    j += 1
                i += 1
                continue
        start = j
        for m in range(n):
            out[j] = ip
            last = m + 1 == n
            if last and not rows:
                j += 1
                break  # the last instruction's successor is not needed
            k = find_insn(ct, ip, mode)
            if k < 0 or (ct[T_I_ERR][k] != 0 and not last):
                state[0] = i
                state[1] = start
                state[2] = np.int64(ip)
                state[3] = mode
                return EXPAND_MISS if k < 0 else EXPAND_NO_INSN
            if rows:
                outk[j] = k
            j += 1
            if last:
                break
            ip = insn_successor(ct, k)
        i += 1
    state[0] = i
    state[1] = j
    return EXPAND_DONE


# The per-instruction and per-run columns of a CodeTable: name, dtype (with
# a width: one row of that many), fill.  Allocation and growth walk these;
# the compiled loops see them in the order of CodeTable.tuple (T_*).
# i_raw: the instruction's bytes; i_adopted: not in the hash (see adopt).
_INSN_COLUMNS = (
    ("i_ip", "u8", 0), ("i_size", "u1", 0), ("i_class", "u1", 0), ("i_special", "u1", 0),
    ("i_flags", "u1", 0), ("i_target", "u8", 0), ("i_isid", "i4", 0), ("i_err", "u1", 0),
    ("i_raw", ("u1", 16), 0), ("i_mode", "u1", 0), ("i_adopted", "u1", 0),
)  # fmt: skip
# r_first: the run's first entry in r_insn.  Where control goes next, as run
# indices filled in as the decoder learns them (-1: not yet): r_succ, the
# next run (fall-through, direct jump or call, branch not taken); r_taken,
# the branch taken; r_ret, for a call, the run it returns to.  r_lastk and
# r_lastc: the last instruction (index) and its class.  r_key: the run's key
# in the block store counts[C_KEY_OWNER] names (-1: not known yet), when the
# decoder stores its rows itself.
_RUN_COLUMNS = (
    ("r_ip", "u8", 0), ("r_mode", "u1", 0), ("r_ninsn", "i4", 0), ("r_kind", "u1", 0),
    ("r_next", "u8", 0), ("r_target", "u8", 0), ("r_first", "i8", 0), ("r_isid", "i4", 0),
    ("r_succ", "i4", -1), ("r_taken", "i4", -1), ("r_ret", "i4", -1), ("r_lastk", "i4", -1),
    ("r_lastc", "u1", 0), ("r_key", "i4", -1),
)  # fmt: skip


def _alloc(table: object, columns: tuple, cap: int) -> None:
    """Fresh ``columns`` of ``cap`` rows on ``table``."""
    for name, dtype, fill in columns:
        shape = (cap, dtype[1]) if isinstance(dtype, tuple) else cap
        dtype = dtype[0] if isinstance(dtype, tuple) else dtype
        # np.zeros leaves the pages untouched until written (calloc): room
        # the decoder never reaches costs no memory.
        setattr(table, name, np.full(shape, fill, dtype) if fill else np.zeros(shape, dtype))


def _successors(insn) -> list[int]:
    """Where a decoded instruction ending a run may go without trace."""
    out = []
    if insn.is_direct and insn.iclass in (IClass.JUMP, IClass.COND_JUMP, IClass.CALL):
        out.append((insn.next_ip + insn.displacement) & _MASK64)
    if insn.iclass in (IClass.COND_JUMP, IClass.CALL):
        out.append(insn.next_ip)
    return out


class CodeTable:
    """The decoded code of one address space (an image), for the compiled
    decoder.  ``tuple`` is what the compiled code takes; it is rebuilt when
    the arrays grow, between decoder calls.  ``cache``: the decoded
    instructions to share (by default the table's own)."""

    def __init__(self, image, capacity: int = 1 << 12, cache: InsnCache | None = None) -> None:
        self.image = image
        self._served: set[int] = set()
        self._own_cache = cache is None
        self.cache = cache if cache is not None else InsnCache(image.read)
        self._sections: dict[int, int] = {}
        # (ip, mode) -> entry, for the slow paths' lookups an instruction at
        # a time.  What the compiled fill decodes is in the compiled hash
        # and joins the dict only when a slow path needs it (_unpended):
        # most decodings never take one for 64-bit code.
        self._index: dict[tuple[int, int], int] = {}
        self._pending: list[tuple[int, int]] = []  # entry ranges not in _index
        self._alloc_insns(capacity)
        self._alloc_runs(capacity)
        self.counts = np.zeros(_NCOUNTS, np.int64)
        self.counts[C_KEY_OWNER] = -1
        self._alloc_replay(X_SLOTS_MIN)
        self._queue = np.zeros(2 * (FILL_MAX + PREFETCH_MAX) + 2, np.uint64)
        self.texts: list[str] | None = None  # disassembly per instruction, when kept
        self.generation = 0  # counts clear()s
        # Instructions below this index have their Python-side bookkeeping
        # (_pending, i_mode, texts); those above were decoded by the flow
        # loop itself (see book_filled).
        self._booked = 0
        self._forget_code_space()
        # Names the numbering of the runs: a new object whenever the same
        # run numbers come to mean other code (clear()).
        self.run_numbering = object()
        self._refresh()

    @property
    def index(self) -> int:
        """The image's number in its decoding (see FlowDecoder)."""
        return int(self.counts[C_INDEX])

    @index.setter
    def index(self, value: int) -> None:
        self.counts[C_INDEX] = value
        self._served.add(int(value))

    @property
    def indices(self) -> frozenset[int]:
        """The numbers of every image the table has decoded (see
        :meth:`extend_to`; its own, :attr:`index`, among them)."""
        return frozenset(self._served | {self.index})

    # -- storage ------------------------------------------------------------
    def _alloc_insns(self, cap: int) -> None:
        self.h_ip, self.h_mode, self.h_val = _new_hash(cap * 2)
        _alloc(self, _INSN_COLUMNS, cap)

    def _alloc_runs(self, cap: int) -> None:
        self.r_hip, self.r_hmode, self.r_hval = _new_hash(cap * 2)
        _alloc(self, _RUN_COLUMNS, cap)
        self.r_insn = np.zeros(cap * 4 + RUN_MAX, np.int32)

    @property
    def replayed_rows(self) -> int:
        """Block rows the decoder's replay chain gave, so far: from its
        cache's stretches and from the branches it walks between them."""
        return int(self.counts[C_X_ROWS])

    @property
    def fast_off_on(self) -> int:
        """How many times, so far, the decoder's fast loop took tracing
        turned off and on again (a system call, an interrupt) itself."""
        return int(self.counts[C_OFF_ON])

    @property
    def fast_psb(self) -> int:
        """How many PSB+ in the middle of the flow the decoder's fast loop
        took itself, so far."""
        return int(self.counts[C_PSB])

    def _alloc_replay(self, slots: int) -> None:
        # Zeroed pages, touched only as the cache fills; a large cache on
        # huge pages (its entries are looked up anywhere in it).
        words = random_access_zeros(slots * X_FIELDS + 8, np.int64)
        skip = (-words.ctypes.data % 64) // 8
        # (the compiled code takes the words in one row: an entry's place is
        # a shift, not a multiplication by the row length read from memory)
        self.x_words = words[skip : skip + slots * X_FIELDS]
        self.x_slots = slots
        self.x_key = random_access_zeros(slots * X_POOL_PER_SLOT, np.uint16)
        self.x_pip = np.zeros(slots * X_PUSH_PER_SLOT, np.uint64)
        self.x_prun = np.zeros(slots * X_PUSH_PER_SLOT, np.int32)
        self.counts[C_X_GEN] += 1
        self.counts[C_X_POOL] = self.counts[C_X_PUSH] = 0
        self.counts[C_X_OWNER] = -1

    def reserve_replay(self, trace_bytes: int) -> None:
        """Size the replay cache for a decoding of ``trace_bytes`` (it only
        grows; growing empties it): a small trace's decoding touches little
        memory, a large one's cache holds its program's stretches."""
        slots = X_SLOTS_MIN
        while slots < X_SLOTS_MAX and slots * X_BYTES_PER_SLOT < trace_bytes:
            slots *= 2
        if slots > self.x_slots:
            self._alloc_replay(slots)
            self._refresh()

    def _refresh(self) -> None:
        self.tuple = (
            self.h_ip, self.h_mode, self.h_val, self.i_ip, self.i_size, self.i_class,
            self.i_special, self.i_flags, self.i_target, self.i_isid, self.i_err, self.i_raw,
            self.r_hip, self.r_hmode, self.r_hval, self.r_ip, self.r_mode, self.r_ninsn,
            self.r_kind, self.r_next, self.r_target, self.r_first, self.r_isid, self.r_insn,
            self.counts, self.r_succ, self.r_taken, self.r_ret, self.r_lastk, self.r_lastc,
            self.r_key, self.x_words, self.x_key, self.x_pip, self.x_prun,
        )  # fmt: skip
        # fill_quick's columns, the very tuple from call to call while they
        # stay (its arguments are then not looked at again, see hwtrace.aot).
        self._fill_columns = self.tuple[: T_I_RAW + 1] + (self.counts,)

    @property
    def n_insns(self) -> int:
        return int(self.counts[C_INSNS])

    @property
    def n_runs(self) -> int:
        return int(self.counts[C_RUNS])

    def clear(self) -> None:
        """Forget everything decoded (the image changed)."""
        self.cache.clear()
        self._sections.clear()
        self._index.clear()
        self._pending.clear()
        self._alloc_insns(self.i_ip.shape[0])
        self._alloc_runs(self.r_ip.shape[0])
        self.counts[:C_INDEX] = 0
        self.counts[C_KEY_OWNER] = -1
        # Stretches of the old runs: a new generation makes them stale.
        self.counts[C_X_GEN] += 1
        self.counts[C_X_POOL] = self.counts[C_X_PUSH] = 0
        self.generation += 1
        self.run_numbering = object()
        self._served = set()
        self._booked = 0
        self._forget_code_space()
        if self.texts is not None:
            self.texts = []
        self._refresh()

    def _grow_insns(self, need: int) -> None:
        n = self.n_insns
        cap = self.i_ip.shape[0]
        if n + need <= cap:
            return
        new_cap = cap
        while n + need > new_cap:
            new_cap *= 2
        old = {name: getattr(self, name) for name, _, _ in _INSN_COLUMNS}
        self._alloc_insns(new_cap)
        for name, arr in old.items():
            getattr(self, name)[:n] = arr[:n]
        _rehash(self.h_ip, self.h_mode, self.h_val, self.i_ip, self.i_mode, n, self.i_adopted)
        self._refresh()

    def grow_runs(self) -> None:
        """Make room for more runs (the compiled decoder ran out)."""
        n = int(self.counts[C_RUNS])
        old = {name: getattr(self, name) for name, _, _ in _RUN_COLUMNS}
        old_insn = self.r_insn
        self._alloc_runs(self.r_ip.shape[0] * 2)
        for name, arr in old.items():
            getattr(self, name)[:n] = arr[:n]
        used = int(self.counts[C_RUN_INSNS])
        self.r_insn[:used] = old_insn[:used]
        _rehash(
            self.r_hip, self.r_hmode, self.r_hval, self.r_ip, self.r_mode, n,
            np.zeros(n, np.uint8),
        )  # fmt: skip
        self._refresh()

    # -- decoding -----------------------------------------------------------
    def section_id(self, ip: int) -> int:
        """A small number naming the section that holds ``ip`` (blocks do not
        span sections); 0 where nothing is mapped."""
        section = self.image.find(ip)
        return 0 if section is None else self._section_number(section)

    def _section_number(self, section) -> int:
        key = id(section)
        sid = self._sections.get(key)
        if sid is None:
            sid = self._sections[key] = len(self._sections) + 1
        return sid

    def fill(self, ip: int, mode: int) -> None:
        """Decode the straight-line code from ``(ip, mode)``: up to and
        including the first instruction that may transfer control (or an
        address without one); then, ahead of the decoder, the code its
        direct branches lead to (see :meth:`_prefetch`).

        64-bit code in a section the image reads alone is decoded in
        compiled code (:func:`fill_quick`) as far as it knows the
        instructions; iced-x86 decodes from where it stops."""
        find = getattr(self.image, "sole_section", None) if mode == 64 else None
        for _ in range(FILL_MAX if find is not None else 0):
            section = find(ip)
            if section is None:
                break
            self._learn_section(section)
            stop = self._fill_quick(ip, section, False)
            if stop < 0:
                return
            ip += stop
            if not section.address <= ip < section.end:
                continue  # on in the section there (or none: iced-x86's way)
            # An instruction it does not know: iced-x86's, then on as before.
            got = self.cache.get(ip, mode)
            if self.lookup(ip, mode) < 0:
                self._add([(ip, got)], mode)
            if (not isinstance(got, int) and not got.truncated and got.iclass == IClass.OTHER
                    and got.special == Special.NONE):  # fmt: skip
                learn(_learned(), np.frombuffer(got.raw, np.uint8).copy())
            if isinstance(got, int) or got.truncated:
                return
            if got.iclass not in (IClass.OTHER, IClass.PTWRITE):
                self._fill_quick(ip, section, True)
                return
            ip = got.next_ip
        self._fill_slow(ip, mode)

    def _fill_quick(self, ip: int, section, ahead: bool) -> int:
        self._grow_insns(2 * FILL_MAX + PREFETCH_MAX)
        stop = int(
            fill_quick(
                self._fill_columns, section.data,
                np.uint64(section.address), np.uint64(ip), self.section_id(ip), FILL_MAX,
                PREFETCH_MAX, self._queue, ahead, _learned(),
            )
        )  # fmt: skip
        self.book_filled()
        return stop

    def extend_to(self, image) -> bool:
        """Decode ``image`` from now on, keeping what was decoded, when it
        maps everything the table's image maps as that one does (a process
        that mapped more code) and nothing decoded depends on what it adds:
        no address the table or its cache found unmapped, undecodable or
        decoded across sections' ends lies in (or just before) the new
        ranges.  False (nothing changed) otherwise."""
        added_since = getattr(image, "added_since", None)
        if not self._own_cache or added_since is None or type(image) is not type(self.image):
            return False
        added = added_since(self.image)
        if added is None:
            return False
        if added:
            n = self.n_insns
            odd = (self.i_err[:n] != 0) | ((self.i_flags[:n] & I_TRUNCATED) != 0)
            ips = self.i_ip[:n][odd]
            for start, end in added:
                near = (ips >= np.uint64(max(start - MAX_INSN_BYTES, 0))) & (ips < np.uint64(end))
                if near.any():
                    return False
            self.cache.forget(added, MAX_INSN_BYTES)
        self.cache.read = image.read
        self.image = image
        if self._cs_version is not None:
            # (the sections copied are the new image's too)
            self._cs_version = getattr(image, "version", None)
        # The runs' keys into a block store, and the stretches replayed,
        # name blocks of the image before (a block's key holds its image's
        # number): found again for this one.
        self.counts[C_KEY_OWNER] = -1
        self.counts[C_X_GEN] += 1
        self.counts[C_X_POOL] = self.counts[C_X_PUSH] = 0
        self.counts[C_X_OWNER] = -1
        return True

    # -- code the flow loop decodes itself ----------------------------------
    def _forget_code_space(self) -> None:
        # (the sections copied, sorted by address, with where their bytes
        # are in the process's code arena)
        self._cs_sections: list[tuple[object, int]] = []
        self._cs_version = getattr(self.image, "version", None)
        self._code_space = (_NO_U64, _NO_U64, _NO_I64, _NO_I64, np.zeros(0, np.uint8),
                            self._queue, _learned())  # fmt: skip

    def code_space(self) -> tuple:
        """The sections of 64-bit code the flow loop may decode from by
        itself (:func:`fill_missing`): those a fill has read, while the
        image stays as it was (a tuple of arrays; the very tuple from call
        to call while it stays)."""
        if getattr(self.image, "version", None) != self._cs_version:
            self._forget_code_space()
        space, learned, data = self._code_space, _learned(), _code_arena().data
        if space[6] is not learned or (self._cs_sections and space[4] is not data):
            # (the decoding thread's learned instructions: only its own
            # fills write them; the arena's array now, which holds every
            # copy an older one did: that one goes)
            self._code_space = (*space[:4], data if self._cs_sections else space[4], space[5],
                                learned)  # fmt: skip
        return self._code_space

    def _learn_section(self, section) -> None:
        """Add a section a fill reads alone to the code space (its bytes
        copied into the process's code arena, unless there is no room:
        fills of its code then return to Python)."""
        if self._cs_version is None or any(x is section for x, _ in self._cs_sections):
            return
        if getattr(self.image, "version", None) != self._cs_version:
            self._forget_code_space()
        arena = _code_arena()
        at = arena.place(section)
        if at < 0:
            return
        self._cs_sections.append((section, at))
        self._cs_sections.sort(key=lambda x: x[0].address)
        held = self._cs_sections
        self._code_space = (
            np.array([x.address for x, _ in held], np.uint64),
            np.array([x.address + int(x.data.shape[0]) for x, _ in held], np.uint64),
            np.array([at for _, at in held], np.int64),
            np.array([self._section_number(x) for x, _ in held], np.int64),
            arena.data, self._queue, _learned(),
        )  # fmt: skip

    def book_filled(self) -> None:
        """The bookkeeping of the instructions the flow loop decoded by
        itself since the last call (see :func:`fill_missing`): after each
        call of the flow loop, before the table is used from Python."""
        first, end = self._booked, self.n_insns
        if end > first:
            self._pending.append((first, end))
            self.i_mode[first:end] = 64
            self.i_adopted[first:end] = 0
            if self.texts is not None:
                self.texts.extend([""] * (end - first))
            self._booked = end

    def _unpended(self) -> dict[tuple[int, int], int]:
        """The dict of every entry (the compiled fill's too)."""
        for first, end in self._pending:
            ips = self.i_ip[first:end].tolist()
            self._index.update(zip(zip(ips, repeat(64)), range(first, end), strict=False))
        self._pending.clear()
        return self._index

    def _fill_slow(self, ip: int, mode: int) -> None:
        index = self._unpended()
        new: list[tuple[int, object]] = []
        at = ip
        for _ in range(FILL_MAX):
            got = self.cache.get(at, mode)
            if (at, mode) not in index:
                new.append((at, got))
            if isinstance(got, int) or got.truncated:
                break
            if got.iclass not in (IClass.OTHER, IClass.PTWRITE):
                break
            at = got.next_ip
        if not isinstance(got, int) and not got.truncated:
            new += self._prefetch(got, mode, {a for a, _ in new})
        if new:
            self._add(new, mode)

    def _prefetch(self, branch, mode: int, taken: set[int]) -> list[tuple[int, object]]:
        """The straight-line stretches a run ending at ``branch`` may go on
        to without trace (a direct branch's target, a conditional branch's
        or a call's fall-through), and theirs, breadth first, up to
        :data:`PREFETCH_MAX` instructions in ``branch``'s section.  Each
        decoder stop for an undecoded address costs a return to Python:
        decoding a region per stop instead of a run cuts those stops
        several times over on a first decode.  Only instructions are
        kept: an address that decodes to an error is left for the decoder
        to find (if it ever goes there)."""
        section = self.image.find(branch.ip)
        if section is None:
            return []
        lo, hi = section.address, section.address + section.size
        out: list[tuple[int, object]] = []
        todo = deque(_successors(branch))
        while todo and len(out) < PREFETCH_MAX:
            at = todo.popleft()
            for _ in range(FILL_MAX):
                if not lo <= at < hi or at in taken or (at, mode) in self._index:
                    break
                got = self.cache.get(at, mode)
                if isinstance(got, int) or got.truncated or got.iclass == IClass.UNKNOWN:
                    break
                taken.add(at)
                out.append((at, got))
                if got.iclass not in (IClass.OTHER, IClass.PTWRITE):
                    todo.extend(_successors(got))
                    break
                at = got.next_ip
        return out

    def _add(self, insns: list[tuple[int, object]], mode: int) -> None:
        """Add decoded instructions (or libipt error codes) at their
        addresses, a column at a time, and hash them in one call."""
        n = len(insns)
        if not n:
            return
        self._grow_insns(n)
        first = self.n_insns
        end = first + n
        index = self._index
        rows = []
        raw = bytearray(16 * n)
        for j, (at, got) in enumerate(insns):
            index[(at, mode)] = first + j
            values = _columns_of(got)
            if not isinstance(got, int):
                values = (*values[:_ISID], self.section_id(at), *values[_ISID + 1 :])
                b = got.raw[:16]
                raw[16 * j : 16 * j + len(b)] = b
            rows.append(values)
        sl = slice(first, end)
        self.i_ip[sl] = np.array([at for at, _ in insns], np.uint64)
        self.i_mode[sl] = mode
        for name, values in zip(_FILLED, zip(*rows, strict=True), strict=True):
            column = getattr(self, name)
            column[sl] = np.array(values, column.dtype)
        self.i_raw[sl] = np.frombuffer(raw, np.uint8).reshape(n, 16)
        self.i_adopted[sl] = 0
        _hash_range(self.h_ip, self.h_mode, self.h_val, self.i_ip, self.i_mode, first, end)
        self.counts[C_INSNS] = end
        self._booked = end
        if self.texts is not None:
            self.texts.extend([""] * len(insns))

    _ROW = (
        "i_ip", "i_size", "i_class", "i_special", "i_flags", "i_target", "i_isid", "i_err",
        "i_raw", "i_mode",
    )  # fmt: skip

    def row(self, index: int) -> dict:
        """Instruction ``index``'s entry (see :meth:`add_row`)."""
        data = {name: getattr(self, name)[index].copy() for name in self._ROW}
        data["text"] = self.texts[index] if self.texts else ""
        return data

    def add_row(self, data: dict) -> int:
        """Add an entry taken from another table, unhashed (lookups by
        address still see this table's own code), and return its index:
        the decoder keeps the instructions it holds across a change of
        image, as libipt's decoder keeps its last instruction."""
        self._grow_insns(1)
        i = self.n_insns
        for name in self._ROW:
            getattr(self, name)[i] = data[name]
        self.i_adopted[i] = 1
        self.counts[C_INSNS] = i + 1
        self._booked = i + 1
        if self.texts is not None:
            self.texts.append(data["text"])
        return i

    def lookup(self, ip: int, mode: int) -> int:
        """The index of the entry decoded at ``(ip, mode)``, or -1."""
        found = self._index.get((ip, mode), -1)
        if found < 0 and mode == 64 and self._pending:
            ip64, mode64 = np.uint64(ip), np.int64(mode)
            found = int(hash_lookup(self.h_ip, self.h_mode, self.h_val, ip64, mode64))
        return found

    def insn(self, index: int):
        """The decoded instruction (iced-x86 classified) at table ``index``."""
        return self.cache.get(int(self.i_ip[index]), int(self.i_mode[index]))


@aot.njit(cache=True, inline="always", _nrt=False)
def _put_quick(table, data, base, at, isid, r):
    """Append the instruction ``decode_quick`` gave (``r``) at ``at`` to the
    instruction columns and hash it; its index."""
    (h_ip, h_mode, h_val, i_ip, i_size, i_class, i_special, i_flags, i_target, i_isid, i_err,
     i_raw, counts) = table  # fmt: skip
    k = counts[C_INSNS]
    size = r[0]
    i_ip[k] = at
    i_size[k] = size
    i_class[k] = r[1]
    i_special[k] = r[2]
    flags = 0
    target = np.uint64(0)
    if r[3]:
        flags = I_DIRECT
        target = r[4]
        if r[1] == CLASS_CALL and target == at + np.uint64(size):
            flags |= I_NO_PUSH
    i_flags[k] = flags
    i_target[k] = target
    i_isid[k] = isid
    i_err[k] = 0
    off = np.int64(at - base)
    for j in range(16):
        i_raw[k, j] = data[off + j] if j < size else 0
    hash_put(h_ip, h_mode, h_val, at, 64, k)
    counts[C_INSNS] = k + 1
    return k


@aot.njit(cache=True, inline="always", _nrt=False)
def _push_successors(queue, qt, cls, flags, target, next_ip):
    """Queue where an instruction ending a run may go without trace (as
    :func:`_successors`)."""
    if flags & I_DIRECT and (cls == CLASS_JUMP or cls == CLASS_COND or cls == CLASS_CALL):
        queue[qt] = target
        qt += 1
    if cls == CLASS_COND or cls == CLASS_CALL:
        queue[qt] = next_ip
        qt += 1
    return qt


@aot.njit(cache=True, inline="always", _nrt=False)
def _byte_hash(data, off, n):
    h = np.uint64(n) * np.uint64(0x9E3779B97F4A7C15)
    for j in range(n):
        h = (h ^ np.uint64(data[off + j])) * np.uint64(0x100000001B3)
    return h ^ (h >> np.uint64(29))


@aot.njit(cache=True, inline="always", _nrt=False)
def _learned_slot(l_len, l_bytes, data, off, n):
    """The slot of the learned instruction whose bytes are ``data[off:off +
    n]``, else the empty slot where it would go; and whether it is there."""
    mask = np.uint64(l_len.shape[0] - 1)
    s = _byte_hash(data, off, n) & mask
    while l_len[s] != 0:
        if l_len[s] == n:
            same = True
            for j in range(n):
                if l_bytes[s, j] != data[off + j]:
                    same = False
                    break
            if same:
                return s, True
        s = (s + np.uint64(1)) & mask
    return s, False


@aot.njit(cache=True, _nrt=False)
def learned_length(learned, data, off, end):
    """The length of the learned instruction (see LEARNED_SLOTS) whose bytes
    ``data[off:]`` begins with (its bytes end at ``end``), or 0."""
    l_len, l_bytes, l_info = learned
    lengths = l_info[1]
    if lengths == 0:
        return 0
    for n in range(1, 16):
        if (
            (lengths >> n) & 1 != 0
            and off + n <= end
            and _learned_slot(l_len, l_bytes, data, off, n)[1]
        ):
            return n
    return 0


@aot.njit(cache=True, _nrt=False)
def learn(learned, raw):
    """Learn the plain instruction whose bytes are ``raw`` (see LEARNED_SLOTS)."""
    l_len, l_bytes, l_info = learned
    n = raw.shape[0]
    if n < 1 or n > 15 or 2 * (l_info[0] + 1) > l_len.shape[0]:
        return
    s, there = _learned_slot(l_len, l_bytes, raw, 0, n)
    if there:
        return
    l_len[s] = n
    for j in range(n):
        l_bytes[s, j] = raw[j]
    l_info[0] += 1
    l_info[1] |= np.int64(1) << np.int64(n)


@aot.njit(cache=True, inline="always", _nrt=False)
def _decode_known(data, off, at, learned):
    """decode_quick, else an instruction learned from iced-x86."""
    r = decode_quick(data, off, data.shape[0], at)
    if r[1] == QUICK_UNKNOWN:
        n = learned_length(learned, data, off, data.shape[0])
        if n > 0:
            return (n, CLASS_OTHER, 0, False, np.uint64(0))
    return r


@aot.njit(cache=True, _nrt=False)
def fill_quick(table, data, base, ip, isid, fill_max, prefetch_max, queue, ahead, learned):
    """:meth:`CodeTable.fill` in compiled code for 64-bit code in one
    section (``data`` at address ``base``, section number ``isid``), as far
    as :func:`~hwtrace.isa.quick.decode_quick` knows the instructions.
    Returns -1 when done, else the offset from ``ip`` of the first
    instruction of the straight-line stretch it could not decode (which
    :meth:`CodeTable.fill` then decodes with iced-x86); the stretches ahead
    it prefetches just stop there.  ``ahead``: only prefetch, from where
    the branch at ``ip`` (in the table) may go.  ``table`` has room for
    ``2 * fill_max + prefetch_max`` more instructions; ``queue`` for
    ``2 * (fill_max + prefetch_max) + 2`` addresses.  ``base`` and ``ip``
    are uint64: with int64 ones numba would compare and subtract addresses
    as floats (and kernel addresses would need another specialisation)."""
    h_ip, h_mode, h_val = table[0], table[1], table[2]
    i_size, i_class, i_flags, i_target, i_err = table[4], table[5], table[7], table[8], table[10]
    end = np.uint64(base) + np.uint64(data.shape[0])
    at = np.uint64(ip)
    k = -1
    if ahead:
        k = hash_find(h_ip, h_mode, h_val, at, 64)
        if k < 0 or i_err[k] != 0 or i_flags[k] & I_TRUNCATED:
            return np.int64(-1)
    for _ in range(0 if ahead else fill_max):
        k = hash_find(h_ip, h_mode, h_val, at, 64)
        if k < 0:
            if at < base or at >= end:
                return np.int64(at - np.uint64(ip))
            r = _decode_known(data, np.int64(at - base), at, learned)
            if r[1] == QUICK_UNKNOWN:
                return np.int64(at - np.uint64(ip))
            k = _put_quick(table, data, base, at, isid, r)
        elif i_err[k] != 0 or i_flags[k] & I_TRUNCATED:
            return np.int64(-1)
        if not is_plain(i_class[k]):
            break
        at = at + np.uint64(i_size[k])
    if k < 0 or is_plain(i_class[k]):
        return np.int64(-1)
    qt = _push_successors(queue, 0, i_class[k], i_flags[k], i_target[k], at + np.uint64(i_size[k]))
    qh = 0
    added = 0
    while qh < qt and added < prefetch_max:
        at = queue[qh]
        qh += 1
        for _ in range(fill_max):
            if at < base or at >= end or hash_find(h_ip, h_mode, h_val, at, 64) >= 0:
                break
            r = _decode_known(data, np.int64(at - base), at, learned)
            if r[1] == QUICK_UNKNOWN:
                break
            k = _put_quick(table, data, base, at, isid, r)
            added += 1
            if not is_plain(r[1]):
                qt = _push_successors(
                    queue, qt, r[1], i_flags[k], i_target[k], at + np.uint64(r[0])
                )
                break
            at = at + np.uint64(r[0])
    return np.int64(-1)


@aot.njit(cache=True, _nrt=False)
def fill_missing(ct, cs):
    """:meth:`CodeTable.fill`'s compiled part, in the flow loop, for the
    address the decoder missed (``ct``'s counts say where) when it is
    64-bit code in a section of the code space ``cs``
    (:meth:`CodeTable.code_space`) and the table has room: whether the
    address is decoded now.  False leaves the miss to Python (code the
    compiled decoder does not know, another section, a table to grow)."""
    counts = ct[T_COUNTS]
    base, end, off, isid, data, queue, learned = cs
    n = base.shape[0]
    if counts[C_MISS_MODE] != 64 or n == 0:
        return False
    ip = np.uint64(counts[C_MISS_IP])
    s = np.searchsorted(base, ip, side="right") - 1
    if s < 0 or ip >= end[s]:
        return False
    if counts[C_INSNS] + 2 * FILL_MAX + PREFETCH_MAX > ct[T_I_IP].shape[0]:
        return False
    a = off[s]
    table = (ct[T_H_IP], ct[T_H_MODE], ct[T_H_VAL], ct[T_I_IP], ct[T_I_SIZE], ct[T_I_CLASS],
             ct[T_I_SPECIAL], ct[T_I_FLAGS], ct[T_I_TARGET], ct[T_I_ISID], ct[T_I_ERR],
             ct[T_I_RAW], counts)  # fmt: skip
    stop = fill_quick(table, data[a : a + np.int64(end[s] - base[s])], base[s], ip, isid[s],
                      FILL_MAX, PREFETCH_MAX, queue, False, learned)  # fmt: skip
    return stop < 0 and hash_find(ct[T_H_IP], ct[T_H_MODE], ct[T_H_VAL], ip, 64) >= 0


@aot.njit(cache=True, _nrt=False)
def _hash_range(h_ip, h_mode, h_val, ips, modes, start, end):
    for i in range(start, end):
        hash_put(h_ip, h_mode, h_val, ips[i], modes[i], i)


# The instruction columns filled from a decoded instruction (see _columns_of).
_FILLED = ("i_size", "i_class", "i_special", "i_flags", "i_target", "i_isid", "i_err")
_ISID = _FILLED.index("i_isid")  # (the section: the table's, not the instruction's)


def _columns_of(got) -> tuple[int, ...]:
    """An instruction's values for :data:`_FILLED` (``got`` is the decoded
    instruction or libipt's error code; the section is the caller's)."""
    if isinstance(got, int):
        return 0, 0, 0, 0, 0, 0, got
    flags = 0
    target = 0
    if got.is_direct:
        flags |= I_DIRECT
        target = (got.next_ip + got.displacement) & _MASK64
        if got.iclass == IClass.CALL and got.displacement == 0:
            flags |= I_NO_PUSH
    if got.truncated:
        flags |= I_TRUNCATED
    return got.size, int(got.iclass), int(got.special), flags, target, 0, 0


__all__ = [
    "EXPAND_DONE",
    "EXPAND_MISS",
    "EXPAND_NO_INSN",
    "I_DIRECT",
    "I_NO_PUSH",
    "I_TRUNCATED",
    "RUN_CALL",
    "RUN_COND",
    "RUN_FALL",
    "RUN_ICALL",
    "RUN_IJUMP",
    "RUN_JUMP",
    "RUN_MAX",
    "RUN_RET",
    "RUN_STOP",
    "CodeTable",
    "build_run",
    "expand_blocks",
    "fill_missing",
    "find_insn",
    "hash_find",
    "insn_successor",
]
