"""The bytes the patch backend puts into a process for one module.

For each window (see :mod:`.sites`) a trampoline holds the window's other
instructions, moved (RIP-relative operands adjusted), and the instrumented
instruction's template from :mod:`._patchcode`; the window's first 5 bytes
become ``jmp rel32`` to it and the rest ``int3``.  A jump into the middle
of a window, which no leader predicted (an indirect branch), meets an
``int3`` and is sent to the instruction's copy in the trampoline: every
instruction boundary inside the jump's displacement must read ``0xCC``
too, so such a jump goes to a *stub* (``jmp`` to the trampoline) at an
address whose displacement has those bytes (E9Patch's "instruction
punning" constraint).  A trap site is ``int3`` over the instruction alone.

Direct branches of trampolines go straight to the trampoline of their
target where it has one, so that a hot loop stays in trampolines: a
window reaches back to the first instruction of its block (a branch
target; past the padding NOPs that may start it, which often lie before
a function no symbol names) where a jump fits there, else it is the
shortest that holds one.

With return compression every call pushes onto the runtime's return
stack.  A direct call of 5 bytes keeps its place and its length: its
displacement goes to a *thunk* that pushes and jumps to the callee, so
the processor's own return prediction still pairs it with its return and
the code before it runs in place.  Other direct calls (and all with
address ranges or calls' extents) get a window of the code before them
in their block, the call itself left in place, or, where that holds
fewer than 5 bytes, the call alone, moved (``push`` of the original
return address, ``jmp``).

With address ranges (an address filter), only the branches inside them
are instrumented, and every system call (which disables and enables
tracing, and tells hwtrace of new code and signal returns).  A range's
start and the return address of each call inside one are *entries*: the
first window of the block an entry starts begins with ``tpl_enter``
(TIP.PGE at the entry where tracing is off: the code between them runs
straight through; a block with no instrumented instruction gets a window
at its last instruction for it), and no window reaches back across one.  A direct
branch inside whose target (or a conditional branch whose next
instruction) lies outside them disables tracing in ``tpl_leave``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import iced_x86 as iced
import numpy as np

from ...aot import user_cache_dir
from . import _patchcode as pc
from .sites import (
    INSTRUMENTED,
    K_BAD,
    K_CALL,
    K_COND,
    K_FAR,
    K_ICALL,
    K_IJMP,
    K_JMP,
    K_OTHER,
    K_RET,
    K_SYSCALL,
    SOURCE_DIGEST,
    CodeMap,
)

__all__ = [
    "ARENA_STUBS",
    "FAR_OFFSET",
    "FAR_SPAN",
    "REDIRECT_HASH",
    "SCRATCH_SIZE",
    "ModulePlan",
    "PlanError",
    "plan_module",
    "redirect_table",
]

ARENA_STUBS = 32 << 20  # stub space of a near arena: every 64 KiB band of 16 MiB
FAR_OFFSET = 0x34000000  # stubs whose displacement's top byte is 0xCC lie this far below
FAR_SPAN = 0x01000000  # ... within this much
SCRATCH_SIZE = 256
_STUB_GAP = 1024  # near stubs this close are written as one run
_JMP = 0xE9
_THUNK_SIZE = (len(pc.TPL_PUSH) + 5 + 15) & ~15  # a call's: tpl_push, jmp
_INT3 = 0xCC


class PlanError(Exception):
    """The module cannot be laid out (no room for its trampolines)."""


class AddressMap:
    """Address to address, for hundreds of thousands of entries (an int3 of
    the patches to its copy, a moved instruction to its original): sorted
    arrays, one run per module's plan, beside a dict of single entries.
    A plan keeps its maps so (loading a cached plan builds no dict) and
    the patcher merges them by reference; a look-up is a binary search
    per run."""

    __slots__ = ("_keys", "_one", "_values")

    def __init__(self, items: dict[int, int] | None = None) -> None:
        self._keys: list[np.ndarray] = []
        self._values: list[np.ndarray] = []
        self._one: dict[int, int] = {}
        if items:
            keys = np.fromiter(items.keys(), np.uint64, len(items))
            values = np.fromiter(items.values(), np.uint64, len(items))
            order = np.argsort(keys)
            self._keys.append(keys[order])
            self._values.append(values[order])

    def update(self, other: AddressMap) -> None:
        """Add ``other``'s entries (the maps of modules do not overlap)."""
        self._keys += other._keys
        self._values += other._values
        self._one.update(other._one)

    def __setitem__(self, key: int, value: int) -> None:
        self._one[key] = value

    def get(self, key: int, default: int | None = None) -> int | None:
        got = self._one.get(key)
        if got is not None:
            return got
        if 0 <= key < 1 << 64:
            k = np.uint64(key)
            for keys, values in zip(self._keys, self._values, strict=True):
                i = int(np.searchsorted(keys, k))
                if i < keys.shape[0] and keys[i] == k:
                    return int(values[i])
        return default

    def __contains__(self, key: int) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return sum(k.shape[0] for k in self._keys) + len(self._one)

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Every entry: keys and values (uint64)."""
        one_k = np.fromiter(self._one.keys(), np.uint64, len(self._one))
        one_v = np.fromiter(self._one.values(), np.uint64, len(self._one))
        return np.concatenate([*self._keys, one_k]), np.concatenate([*self._values, one_v])


@dataclass
class ModulePlan:
    """What to write for one module: ``code`` (address, bytes) in its arenas,
    ``patches`` over its code and ``redirects`` (an ``int3`` address and
    where a thread meeting it goes)."""

    code: list[tuple[int, bytes]] = field(default_factory=list)
    patches: list[tuple[int, bytes]] = field(default_factory=list)
    redirects: AddressMap = field(default_factory=AddressMap)
    runtime: int = 0  # address of the runtime routines' copy
    scratch: int = 0  # SCRATCH_SIZE bytes for hwtrace's use (a path for open)
    stats: dict[str, int] = field(default_factory=dict)
    source: dict[int, bytes] = field(default_factory=dict)  # the code it was made for
    arenas: list[tuple[int, int]] = field(default_factory=list)
    # trampoline address of each moved instruction -> its original address
    origin: AddressMap = field(default_factory=AddressMap)
    syscalls: dict[int, int] = field(default_factory=dict)  # trampoline syscall -> original
    # (start, end, original address) of each instrumented instruction's code
    parts: list[tuple[int, int, int]] = field(default_factory=list)
    # code_writes() and patch_writes(), made once (a cached plan has them)
    writes: tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]] | None = None

    def __getstate__(self) -> dict:
        # Kept (the plan cache): once the writes are made they are what is
        # used, code and patches are in them (the first patch tells a
        # module's patches are in place).
        state = self.__dict__.copy()
        if state["writes"] is not None:
            state["code"] = []
            state["patches"] = state["patches"][:1]
        return state

    def make_writes(self) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
        """:meth:`code_writes` and :meth:`patch_writes`, kept."""
        if self.writes is None:
            self.writes = (self.code_writes(), self.patch_writes())
        return self.writes

    def code_writes(self) -> list[tuple[int, bytes]]:
        """``code`` as few writes: the runtime and trampolines one run (the
        padding between them int3); the near arena's stubs in runs (the arena
        is the module's own, fresh: zeros between them); far stubs
        as they are (far stub space is shared with other modules)."""
        tail = [(a, d) for a, d in self.code if a >= self.runtime]
        near_lo = self.arenas[0][0] if self.arenas else self.runtime
        out = [(a, d) for a, d in self.code if a < near_lo]
        near = sorted((a, d) for a, d in self.code if near_lo <= a < self.runtime)
        run_at, run = 0, bytearray()
        for a, d in near:
            if run and a - (run_at + len(run)) <= _STUB_GAP:
                run += bytes(a - (run_at + len(run))) + d
                continue
            if run:
                out.append((run_at, bytes(run)))
            run_at, run = a, bytearray(d)
        if run:
            out.append((run_at, bytes(run)))
        if not tail:
            return out
        lo = min(a for a, _ in tail)
        buf = bytearray(b"\xcc" * (max(a + len(d) for a, d in tail) - lo))
        for a, d in tail:
            buf[a - lo : a - lo + len(d)] = d
        return [*out, (lo, bytes(buf))]

    def patch_writes(self) -> list[tuple[int, bytes]]:
        """``patches`` as one write per section: from its first patched byte
        to its last, the code between as it was."""
        out = []
        placed = 0
        for lo, data in sorted(self.source.items()):
            mine = [(a, d) for a, d in self.patches if lo <= a < lo + len(data)]
            placed += len(mine)
            if not mine:
                continue
            buf = bytearray(data)
            for a, d in mine:  # in order: a later patch wins
                buf[a - lo : a - lo + len(d)] = d
            first = min(a for a, _ in mine) - lo
            last = max(a + len(d) for a, d in mine) - lo
            out.append((lo + first, bytes(buf[first:last])))
        if placed != len(self.patches):
            raise PlanError("a patch lies outside the code it was planned for")
        return out


def _is_nop(raw: bytes) -> bool:
    """A NOP as compilers pad code with (90, 0F 1F /0, under 66/2E/3E
    prefixes)."""
    k = 0
    while k < len(raw) and raw[k] in (0x66, 0x2E, 0x3E):
        k += 1
    return raw[k : k + 1] == b"\x90" or raw[k : k + 2] == b"\x0f\x1f"


def _short_cond(raw: bytes, over: int) -> bytes:
    """The conditional branch ``raw`` as a rel8 branch ``over`` bytes ahead."""
    i = 0
    prefix = b""
    while raw[i] in (0x2E, 0x3E, 0xF2, 0x67):  # branch hints, BND; 67: jecxz/loopd
        if raw[i] == 0x67:
            prefix = b"\x67"
        i += 1
    op = raw[i]
    if op == 0x0F:
        return bytes([0x70 | (raw[i + 1] & 0x0F), over])
    if 0x70 <= op <= 0x7F or 0xE0 <= op <= 0xE3:
        return prefix + bytes([op, over])
    raise PlanError(f"not a conditional branch: {raw.hex()}")


def _ret_bytes(raw: bytes) -> bytes:
    i = 0
    while raw[i] in (0xF2, 0xF3, 0x66):  # bnd ret, rep ret
        i += 1
    return raw[i : i + 3] if raw[i] == 0xC2 else b"\xc3"


def _load_operand(raw: bytes, ip: int, at: int) -> bytes:
    """``mov rcx, <operand of the indirect branch raw at ip>``, encoded at ``at``."""
    ins = next(iter(iced.Decoder(64, raw, ip=ip)))
    R = iced.Register
    if ins.op0_kind == iced.OpKind.REGISTER:
        mov = iced.Instruction.create_reg_reg(iced.Code.MOV_R64_RM64, R.RCX, ins.op0_register)
    else:
        base = ins.memory_base
        displ = ins.ip_rel_memory_address if base == R.RIP else ins.memory_displacement
        if displ >= 1 << 63:
            displ -= 1 << 64
        mem = iced.MemoryOperand(base, ins.memory_index, ins.memory_index_scale, displ,
                                 ins.memory_displ_size, False, ins.segment_prefix)  # fmt: skip
        mov = iced.Instruction.create_reg_mem(iced.Code.MOV_R64_RM64, R.RCX, mem)
    return _encode(mov, at)


def _encode(ins: iced.Instruction, at: int) -> bytes:
    enc = iced.Encoder(64)
    enc.encode(ins, at)
    return enc.take_buffer()


def _part_size(kind: int, raw: bytes, ip: int, keep: bool, retcomp: bool, ranged: bool) -> int:
    # With address ranges (or an entry's window), an upper bound: tpl_enter
    # and two tpl_leave.
    extra = len(pc.TPL_ENTER) + 2 * (len(pc.TPL_LEAVE) + 5) if ranged else 0
    return extra + _base_part_size(kind, raw, ip, keep, retcomp)


def _base_part_size(kind: int, raw: bytes, ip: int, keep: bool, retcomp: bool) -> int:
    if kind == K_CALL:
        return len(pc.TPL_PUSH) + (5 if keep else len(pc.TPL_CALL))
    if kind == K_ICALL and retcomp:
        return len(pc.TPL_PUSH) + _base_part_size(kind, raw, ip, keep, False)
    if kind == K_COND:
        return len(_short_cond(raw, 0)) + len(pc.TPL_BIT1) + len(pc.TPL_BIT0)
    if kind == K_JMP:
        return 5
    if kind == K_OTHER:
        return len(raw) + 5
    if kind in (K_IJMP, K_ICALL):
        tpl = pc.TPL_IJMP if kind == K_IJMP else pc.TPL_ICALL
        return len(pc.TPL_HEAD) + len(_load_operand(raw, ip, ip)) + len(tpl)
    if kind == K_RET:
        return len(pc.TPL_RET) + len(_ret_bytes(raw))
    return len(pc.TPL_SYS)


def _put64(buf: bytearray, at: int, value: int) -> None:
    buf[at : at + 8] = (value & ((1 << 64) - 1)).to_bytes(8, "little")


def _rel32(buf: bytearray, at: int, field_address: int, target: int) -> None:
    buf[at : at + 4] = _rel(field_address + 4, target)


def _constraint(boundaries: list[int]) -> tuple[int, int]:
    """The displacement bytes a jump over instruction boundaries at these
    offsets (1-4 matter) must hold: ``(mask, pattern)``."""
    mask = pat = 0
    for b in boundaries:
        if 1 <= b <= 4:
            mask |= 0xFF << (8 * (b - 1))
            pat |= _INT3 << (8 * (b - 1))
    return mask, pat


REDIRECT_HASH = 0x5BD1E995  # runtime.S's REDIRECT: ((ip * this) >> 12) & mask
_PROBE_TAIL = 256  # slots past the last: a probe never wraps


def redirect_table(redirects: AddressMap) -> tuple[np.ndarray, int]:
    """The runtime's redirect table for ``redirects`` (from -> to): the
    uint64 words (key, value pairs) and the slot mask.  Open addressing
    with linear probes, as runtime.S's TABLE_PROBE reads it: keys sorted by
    their home slot each take the first free slot at or after it (slot n
    = n + the running maximum of home - n), so every slot between a key's
    home and its own is taken, and a probe never runs past the table's
    tail (else the table doubles)."""
    keys, values = redirects.arrays()
    slots = 1 << max(10, (4 * len(keys)).bit_length())
    while True:
        home = ((keys * np.uint64(REDIRECT_HASH)) >> np.uint64(12)) & np.uint64(slots - 1)
        order = np.argsort(home, kind="stable")
        n = np.arange(len(keys), dtype=np.int64)
        at = n + np.maximum.accumulate(home[order].astype(np.int64) - n) if len(keys) else n
        if not len(keys) or at[-1] < slots + _PROBE_TAIL:
            table = np.zeros(2 * (slots + _PROBE_TAIL), np.uint64)
            table[2 * at] = keys[order]
            table[2 * at + 1] = values[order]
            return table, slots - 1
        slots *= 2


def _place(pending: list, ips, near_lo: int, stub_hi: int, far: list, occ_near) -> None:
    """Stubs for the jump windows of ``pending`` whose displacement covers
    instruction boundaries; a window whose constraint no free address meets
    starts one instruction earlier (in its block, then across leaders of the
    code falling into it) and tries again, else becomes a trap."""
    from ._loops import place_stubs

    pending = [s for s in pending if not s.trap]
    while pending:
        cons = [_constraint([int(ips[k] - ips[s.first]) for k in range(s.first + 1, s.index + 1)])
                for s in pending]  # fmt: skip
        need = [n for n, (m, _) in enumerate(cons) if m]
        got = np.full(len(need), -1, np.int64)
        if need:
            at = np.array([int(ips[pending[n].first]) for n in need], np.int64)
            masks = np.array([cons[n][0] for n in need], np.uint32)
            pats = np.array([cons[n][1] for n in need], np.uint32)
            got = place_stubs(at, masks, pats, near_lo, stub_hi, occ_near)
            for lo, hi, occ in far:
                miss = got < 0
                if not miss.any():
                    break
                got[miss] = place_stubs(at[miss], masks[miss], pats[miss], lo, hi, occ)
        placed = dict(zip(need, got.tolist(), strict=True))
        again = []
        for n, s in enumerate(pending):
            if not cons[n][0]:
                s.entry = -1  # the trampoline itself
            elif placed[n] >= 0:
                s.entry = placed[n]
            elif s.first < s.shortest:
                s.first = s.shortest  # from the block's start: now the shortest
                s.shortest = -1
                again.append(s)
            elif s.first > s.reach:
                s.first -= 1
                again.append(s)
            elif s.keep:
                s.keep = False  # the call alone, moved: no constraint
                s.first = s.index
                s.entry = -1
            else:
                s.trap = True  # no stub address: traps at the window's instructions
                s.first = s.reach  # (see plan_module: moved from where code falls in)
        pending = again


@dataclass
class _Site:
    index: int  # the instrumented instruction
    first: int  # the window's first instruction
    trap: bool
    body: int = 0
    entry: int = 0
    block: int = 0  # the first instruction of its block
    reach: int = 0  # the first a window may start at (across leaders)
    keep: bool = False  # a call left in place: the window ends before it
    enter: bool = False  # its block starts at an entry (tpl_enter first)
    enter_ip: int = 0  # that entry
    shortest: int = -1  # the first of its shortest window (tried next)

    @property
    def last(self) -> int:
        """The window's last instruction."""
        return self.index - 1 if self.keep else self.index


def plan_module(
    cm: CodeMap,
    read,
    near: tuple[int, int],
    far: list[tuple[int, int, np.ndarray]] = (),
    retcomp: bool = True,
    ranges: np.ndarray | None = None,
    entries: np.ndarray | None = None,
) -> ModulePlan:
    """Lay out the trampolines of module ``cm`` (code read with ``read``) in
    the arena ``near`` = ``(start, end)`` (stubs in its first
    :data:`ARENA_STUBS` bytes, then the runtime and the trampolines) and,
    for stubs that must lie below the module, the pieces of ``far``
    (``(start, end, occupancy)``: one byte per address, 1 where taken;
    modules close to each other share them); ``retcomp``: return
    compression (calls push onto the runtime's return stack); ``ranges``:
    ``(start, end)`` rows of the address ranges traced (None: all code);
    ``entries``: with all code patched, where tracing goes on (the
    functions whose calls are traced)."""
    from ._loops import flags_dead_everywhere, windows

    kinds = cm.kinds
    ips = cm.ips.astype(np.int64)
    lens = cm.lens.astype(np.int64)
    targets = cm.targets.astype(np.int64)
    leaders = cm.leaders
    wanted = np.isin(kinds, np.array(INSTRUMENTED))
    if retcomp:  # a call to the next instruction pushes nothing (decoders agree)
        wanted |= (kinds == K_CALL) & (targets != ips + lens)
    ranged = ranges is not None
    called = entries is not None  # calls' extents: indirect branches marked
    inside = _inside(ranges)
    entry_idx = np.zeros(0, np.int64)
    if ranged:
        here = inside(ips)
        direct = np.isin(kinds, np.array([K_COND, K_JMP, K_CALL]))
        leaving = here & direct & ~inside(targets)
        falls = here & ~inside(ips + lens)
        leaving |= falls & (kinds == K_COND)
        leaving |= falls & (kinds == K_OTHER)  # moved, then tpl_leave (FUP, TIP.PGD)
        wanted = (wanted & here) | (kinds == K_SYSCALL) | leaving
        entry_idx, leaders = _entries(cm, ranges[:, 0], here)
        wanted |= _entry_ends(cm, entry_idx, leaders, wanted)
    elif entries is not None and entries.shape[0]:
        entry_idx, leaders = _entries(cm, entries, np.zeros(len(cm), np.bool_))
        wanted |= _entry_ends(cm, entry_idx, leaders, wanted)
    # A direct call of 5 bytes (E8 rel32) stays whole and in place, its
    # displacement pointed at a thunk that pushes onto the return stack and
    # jumps to the callee: the processor's return prediction pairs it with
    # its return, and the code before it runs in place.
    thunked = np.zeros(len(cm), np.bool_)
    if retcomp and not ranged and not called:
        thunked = (kinds == K_CALL) & (targets != ips + lens) & (lens == 5)
        wanted &= ~thunked
    idx = np.flatnonzero(wanted)
    keep = kinds[idx] == K_CALL
    first, block, reach = windows(cm.ips, cm.lens, kinds, leaders, idx.astype(np.int64), keep)
    moved_alone = np.flatnonzero(wanted & (kinds == K_OTHER))
    enter = _clamp_to_entries(entry_idx, moved_alone, idx, first, block, reach)
    first[keep & (first < 0)] = idx[keep & (first < 0)]  # the call alone, moved
    keep &= first != idx
    # A block too short for a jump that the code before it falls into: the
    # window starts there, across the leader(s) between (each then an
    # int3 inside the window, reached through its copy).
    for w in np.flatnonzero((first < 0) & (reach < block) & ~keep).tolist():
        i, k = int(idx[w]), int(block[w])
        total = int(ips[i] + lens[i] - ips[k])
        while total < 5 and k > reach[w]:
            k -= 1
            total += int(lens[k])
        if total >= 5:
            first[w] = k
    plan = ModulePlan()
    redirects: dict[int, int] = {}  # kept as AddressMaps when done
    origin: dict[int, int] = {}
    plan.arenas = [near] + [(lo, hi) for lo, hi, _ in far]
    near_lo, near_hi = near
    stub_hi = near_lo + ARENA_STUBS
    plan.runtime = stub_hi
    plan.scratch = (stub_hi + len(pc.RUNTIME) + 15) & ~15
    cursor = (plan.scratch + SCRATCH_SIZE + 63) & ~63
    sites: list[_Site] = []
    raws: dict[int, bytes] = {}
    occ_near = np.zeros(ARENA_STUBS, np.uint8)
    is_site = np.zeros(len(cm), np.bool_)
    jumps8 = np.flatnonzero((kinds == K_JMP) & (lens == 2))
    if ranged:  # outside the ranges conditional branches are not sites: theirs too
        jumps8 = np.flatnonzero(((kinds == K_JMP) & (lens == 2)) | (kinds == K_COND))
    while idx.shape[0]:
        new_sites = []
        for i, j, b, r, kp, en in zip(idx.tolist(), first.tolist(), block.tolist(),
                                      reach.tolist(), keep.tolist(), enter.tolist(),
                                      strict=True):  # fmt: skip
            # A block too short for a jump is moved whole, int3 at each of
            # its instructions: branches to it from trampolines go straight
            # to the copy, only entries from elsewhere trap.  So is the code
            # falling into it from the last control transfer: a return
            # there (after a call) goes to the copy too, not through traps.
            trap = j < 0
            start = r if trap else b if j >= b else j  # (j < b: across leaders)
            while not trap and start < j and _is_nop(read(int(ips[start]), int(lens[start]))):
                start += 1  # padding before a function no symbol names
            s = _Site(
                i,
                start,
                trap,
                shortest=j,
                block=b,
                reach=r,
                keep=kp,
                enter=en >= 0,
                enter_ip=int(ips[en]) if en >= 0 else 0,
            )
            raws[i] = read(int(ips[i]), int(lens[i]))
            new_sites.append(s)
            is_site[i] = True
        sites += new_sites
        _place(new_sites, ips, near_lo, stub_hi, list(far), occ_near)
        # Where plain code may jump to and find an int3: a block moved
        # whole, a leader inside a window.  A jmp rel8 there gets a window
        # of its own (a jmp or call with a rel32 has its displacement
        # rewritten, below); that window may make more such places.
        entries = set()
        for s in new_sites:
            if s.trap:
                entries.update(ips[s.first : s.index + 1].tolist())
            elif s.first < s.block:
                inner = np.arange(s.first + 1, s.block + 1)
                entries.update(ips[inner[leaders[inner]]].tolist())
        into = np.array(sorted(entries), np.int64)
        hit = np.isin(cm.targets[jumps8].astype(np.int64), into)
        if ranged:  # a conditional branch falling into one
            hit |= (kinds[jumps8] == K_COND) & np.isin(ips[jumps8] + lens[jumps8], into)
        more = jumps8[~is_site[jumps8] & hit]
        idx = more
        keep = np.zeros(idx.shape[0], np.bool_)
        first, block, reach = windows(cm.ips, cm.lens, kinds, leaders, idx.astype(np.int64),
                                      keep)  # fmt: skip
        enter = _clamp_to_entries(entry_idx, moved_alone, idx, first, block, reach)
    sites.sort(key=lambda s: s.index)
    for s in sites:
        size = int(ips[s.index] - ips[s.first]) + _part_size(int(kinds[s.index]), raws[s.index],
                                                              int(ips[s.index]), s.keep, retcomp,
                                                              ranged or s.enter)  # fmt: skip
        if called and kinds[s.index] in (K_IJMP, K_ICALL):
            size += len(pc.TPL_MARK)
        s.body = cursor
        cursor = (cursor + size + 15) & ~15
        if s.entry == -1:
            s.entry = s.body
        elif s.entry and not s.trap:
            plan.code.append((s.entry, bytes([_JMP]) + _rel(s.entry + 5, s.body)))
    thunks = np.flatnonzero(thunked)
    thunk_at = cursor + np.arange(thunks.shape[0], dtype=np.int64) * _THUNK_SIZE
    cursor += thunks.shape[0] * _THUNK_SIZE
    if cursor > near_hi:
        raise PlanError(
            f"the arena at {near_lo:#x} is too small: {cursor - near_lo:#x} bytes needed"
        )
    # Where each instruction of a window is in its trampoline.
    # Every int3 of the patches goes on at its instruction's copy.
    # (An entry's window: its first instruction is reached through the
    # tpl_enter before its copy.)
    moved: dict[int, int] = {}
    for s in sites:
        at = s.body + (len(pc.TPL_ENTER) if s.enter else 0)
        for k in range(s.first, s.last + 1):
            moved[int(ips[k])] = at
            at += int(lens[k])
        if s.enter and int(ips[s.first]) == s.enter_ip:
            moved[s.enter_ip] = s.body
        for a in ips[s.first if s.trap else s.first + 1 : s.last + 1].tolist():
            redirects[a] = moved[a]
    stats = {"sites": len(sites), "traps": 0, "stubs": 0, "windows": 0}
    dead_at = flags_dead_everywhere(cm.ips, cm.lens, kinds, cm.flags, cm.targets)

    def dead(x: int) -> bool:
        k = int(np.searchsorted(cm.ips, np.uint64(x)))
        return k < len(cm) and int(cm.ips[k]) == x and bool(dead_at[k])

    rt = plan.runtime
    plan.code.append((rt, pc.RUNTIME))
    for s in sites:
        i = s.index
        ip = int(ips[i])
        nxt = ip + int(lens[i])
        body = bytearray()
        if s.enter:
            body += _enter(s.enter_ip, s.body, rt)
        for k in range(s.first, i):
            origin[s.body + len(body)] = int(ips[k])
            body += _moved(cm, read, k, s.body + len(body))
        part_at = s.body + len(body)
        if int(kinds[i]) == K_OTHER:  # an entry's block end: the instruction moved
            origin[part_at] = ip
            raws[i] = _moved(cm, read, i, part_at)
        if int(kinds[i]) == K_SYSCALL:
            plan.syscalls[part_at + pc.F_sys_syscall] = ip
        # A return to after a call whose next instruction is an int3 goes
        # to its copy instead (see runtime.S's tpl_ret).
        cont = redirects.get(nxt, 0)
        if called and int(kinds[i]) in (K_IJMP, K_ICALL):
            mark = bytearray(pc.TPL_MARK)
            _put64(mark, pc.F_mark_ip, ip)
            body += mark
            part_at = s.body + len(body)
        body += _part(int(kinds[i]), raws[i], ip, nxt, int(cm.targets[i]), part_at, rt, moved,
                      cont, s.keep, retcomp, inside if ranged else None, dead)  # fmt: skip
        plan.parts.append((part_at, s.body + len(body), ip))
        plan.code.append((s.body, bytes(body)))
        start = int(ips[s.first])
        wlen = int(ips[s.last] + lens[s.last]) - start
        if s.trap:
            stats["traps"] += 1
            plan.patches += [(int(ips[k]), b"\xcc") for k in range(s.first, i + 1)]
        else:
            stats["windows"] += 1
            stats["stubs"] += s.entry != s.body
            plan.patches.append((start, bytes([_JMP]) + _rel(start + 5, s.entry) +
                                 b"\xcc" * (wlen - 5)))  # fmt: skip
    for k, at in zip(thunks.tolist(), thunk_at.tolist(), strict=True):
        ip = int(ips[k])
        nxt = ip + 5
        push = _push(nxt, redirects.get(nxt, 0))
        target = int(cm.targets[k])
        plan.code.append(
            (at, push + bytes([_JMP]) + _rel(at + len(push) + 5, moved.get(target, target)))
        )
        plan.patches.append((ip + 1, _rel(nxt, at)))
    stats["thunks"] = int(thunks.shape[0])
    # Direct jumps and calls with a rel32 to an int3 of the patches (a block
    # moved whole, a leader inside a window, a window made a trap because
    # no stub address met its constraint) go to the copy.
    # (Not a call moved into its window: its jump is the patch.)
    moved_call = np.zeros(len(cm), np.bool_)
    moved_call[[s.index for s in sites if not s.keep and kinds[s.index] == K_CALL]] = True
    rel32 = np.flatnonzero(
        np.isin(kinds, np.array([K_JMP, K_CALL])) & (lens == 5) & ~moved_call & ~thunked
    )
    if ranged:  # and a Jcc rel32 (0F 8x) that is not a site
        rel32 = np.sort(np.concatenate([rel32, np.flatnonzero((kinds == K_COND) & (lens == 6)
                                                                & ~is_site)]))  # fmt: skip
    hits = rel32[np.isin(cm.targets[rel32].astype(np.int64),
                         np.fromiter(redirects, np.int64, len(redirects)))]  # fmt: skip
    hits = [k for k in hits.tolist() if kinds[k] != K_COND or read(int(ips[k]), 1) == b"\x0f"]
    for k in hits:  # E8/E9 rel32: 5 bytes leave no room for a prefix; 0F 8x
        at = int(ips[k])
        n = int(lens[k])
        plan.patches.append((at + n - 4, _rel(at + n, redirects[int(cm.targets[k])])))
        stats["retargeted"] = stats.get("retargeted", 0) + 1
    plan.redirects, plan.origin = AddressMap(redirects), AddressMap(origin)
    plan.stats = stats
    return plan


def _rel(origin: int, target: int) -> bytes:
    rel = target - origin
    if not -(1 << 31) <= rel < 1 << 31:
        raise PlanError(f"{target:#x} is out of reach of {origin:#x}")
    return (rel & 0xFFFFFFFF).to_bytes(4, "little")


def _moved(cm: CodeMap, read, k: int, at: int) -> bytes:
    ip = int(cm.ips[k])
    raw = bytearray(read(ip, int(cm.lens[k])))
    d = int(cm.rip_disp[k])
    if d:
        raw[d : d + 4] = _rel(at + len(raw), int(cm.rip_targets[k]))
    return bytes(raw)


def _push(nxt: int, cont: int) -> bytes:
    t = bytearray(pc.TPL_PUSH)
    _put64(t, pc.F_push_neg, -nxt)
    _put64(t, pc.F_push_cont, cont)
    return bytes(t)


def _enter(ip: int, at: int, rt: int) -> bytes:
    t = bytearray(pc.TPL_ENTER)
    _put64(t, pc.F_enter_ip, ip)
    _rel32(t, pc.F_enter_rt, at + pc.F_enter_rt, rt + pc.RT_PGE)
    return bytes(t)


def _leave(target: int, at: int, rt: int, dst: int | None, falls: bool = False) -> bytes:
    """``tpl_leave`` for a branch to ``target`` (``falls``: code falling
    through to it), then a jump to ``dst`` (its copy, if it has one; None:
    the branch follows)."""
    t = bytearray(pc.TPL_LEAVE)
    _put64(t, pc.F_leave_ip, target)
    _rel32(t, pc.F_leave_rt, at + pc.F_leave_rt, rt + (pc.RT_LEAVE_FUP if falls else pc.RT_LEAVE))
    if dst is None:
        return bytes(t)
    return bytes(t) + bytes([_JMP]) + _rel(at + len(t) + 5, dst)


_BITS = {  # (bit, flags dead): template, its fields (ip, routine, destination)
    (1, False): (pc.TPL_BIT1, pc.F_bit1_ip, pc.F_bit1_rt, pc.F_bit1_dst),
    (0, False): (pc.TPL_BIT0, pc.F_bit0_ip, pc.F_bit0_rt, pc.F_bit0_dst),
    (1, True): (pc.TPL_SHIFT1, pc.F_shift1_ip, pc.F_shift1_rt, pc.F_shift1_dst),
    (0, True): (pc.TPL_SHIFT0, pc.F_shift0_ip, pc.F_shift0_rt, pc.F_shift0_dst),
}


def _bit(bit: int, ip: int, dst: int, at: int, rt: int, dead: bool) -> bytes:
    """One TNT bit's code at ``at``, going on to ``dst`` (a full TNT goes
    out with NEXTIP ``ip``): the flag-free template, or the shift where
    the flags are ``dead`` there (see runtime.S)."""
    tpl, f_ip, f_rt, f_dst = _BITS[bit, dead]
    t = bytearray(tpl)
    _put64(t, f_ip, ip)
    _rel32(t, f_rt, at + f_rt, rt + pc.RT_TNT_FULL)
    _rel32(t, f_dst, at + f_dst, dst)
    return bytes(t)


def _inside(ranges: np.ndarray | None):
    """A vectorized test: which addresses lie in ``ranges`` (all: None)."""

    def inside(a):
        a = np.asarray(a, np.int64)
        if ranges is None:
            return np.ones(a.shape, np.bool_)
        got = np.zeros(a.shape, np.bool_)
        for lo, hi in ranges.tolist():
            got |= (a >= lo) & (a < hi)
        return got

    return inside


def _entries(cm: CodeMap, starts: np.ndarray, here: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the entries in ``cm`` (``starts``: each range's start;
    the instruction after each call inside one, ``here``) and the leaders
    with them."""
    ips = cm.ips.astype(np.int64)
    starts = starts.astype(np.int64)
    at = np.searchsorted(ips, starts)
    ok = at < len(cm)
    at = at[ok][ips[at[ok]] == starts[ok]]
    calls = np.flatnonzero(here & np.isin(cm.kinds, np.array([K_CALL, K_ICALL])))
    after = calls + 1
    after = after[(after < len(cm)) & here[np.minimum(after, len(cm) - 1)]]
    entries = np.unique(np.concatenate([at, after]))
    entries = entries[cm.kinds[entries] != K_BAD]
    leaders = cm.leaders.copy()
    leaders[entries] = True
    return entries, leaders


def _entry_ends(cm: CodeMap, entries: np.ndarray, leaders: np.ndarray,
                wanted: np.ndarray) -> np.ndarray:  # fmt: skip
    """The last instruction of each entry's block that holds no instrumented
    instruction: it gets a window (moved) so that the entry has one."""
    out = np.zeros(len(cm), np.bool_)
    n = len(cm)
    for e in entries.tolist():
        k = e
        while True:
            if wanted[k] or cm.kinds[k] in (K_BAD, K_FAR):
                break
            last = k + 1 >= n or leaders[k + 1] or cm.kinds[k] != K_OTHER
            last = last or cm.ips[k] + cm.lens[k] != cm.ips[k + 1]
            if last:
                if cm.kinds[k] in (K_OTHER, K_JMP, K_CALL):
                    out[k] = True
                break
            k += 1
    return out


def _clamp_to_entries(entries, alone, idx, first, block, reach) -> np.ndarray:
    """No window reaches back across an entry (its int3 would skip the
    entry's tpl_enter) or over an instruction moved for one (``alone``);
    returns, per window, the entry whose block it is the first of (its
    tpl_enter enables tracing there), else -1."""
    enter = np.full(idx.shape[0], -1, np.int64)
    if not entries.shape[0]:
        return enter
    if alone.shape[0]:
        k = np.searchsorted(alone, idx, side="left") - 1
        np.maximum(reach, np.where(k >= 0, alone[np.maximum(k, 0)] + 1, 0), out=reach)
    k = np.searchsorted(entries, idx, side="right") - 1
    has = k >= 0
    e = np.where(has, entries[np.maximum(k, 0)], -1)
    np.maximum(reach, e, out=reach)
    np.maximum(block, e, out=block)
    cross = (first >= 0) & (first < e)
    first[cross] = -1  # would cross it: a trap site (moved whole from the block)
    at_block = has & (block == e)
    if at_block.any():
        _, one = np.unique(e[at_block], return_index=True)
        firsts = np.flatnonzero(at_block)[one]
        enter[firsts] = e[firsts]
    return enter


def _part(kind, raw, ip, nxt, target, at, rt, moved, cont, keep, retcomp, inside=None,
          dead=None) -> bytes:  # fmt: skip
    """The code of instrumented instruction ``raw`` at ``ip`` (next: ``nxt``,
    a direct branch's ``target``) placed at ``at``; ``dead(x)``: whether
    the arithmetic flags are dead at address ``x``."""

    def dest(x: int) -> int:
        return moved.get(x, x)

    def leaves(x: int) -> bool:
        return inside is not None and not bool(inside(x))

    if inside is not None and not inside(ip) and kind == K_COND:
        # Outside the ranges (a branch into a window's copy): no packets.
        head = _short_cond(raw, 5)
        base = at + len(head)
        return (
            head
            + bytes([_JMP])
            + _rel(base + 5, dest(nxt))
            + bytes([_JMP])
            + _rel(base + 10, dest(target))
        )
    if kind == K_OTHER:  # moved (raw: its bytes there), then on
        if leaves(nxt):
            return raw + _leave(nxt, at + len(raw), rt, dest(nxt), falls=True)
        return raw + bytes([_JMP]) + _rel(at + len(raw) + 5, dest(nxt))
    if kind == K_CALL:
        head = _push(nxt, cont) if retcomp and target != nxt else b""
        if leaves(target):
            head += _leave(target, at + len(head), rt, None)
        if keep:  # back to the call, in place
            return head + bytes([_JMP]) + _rel(at + len(head) + 5, ip)
        t = bytearray(pc.TPL_CALL)
        base = at + len(head)
        _rel32(t, pc.F_call_dst, base + pc.F_call_dst, dest(target))
        _put64(t, pc.F_call_ret, nxt)
        return head + bytes(t)
    if kind == K_ICALL and retcomp:
        head = _push(nxt, cont)
        return head + _part(kind, raw, ip, nxt, target, at + len(head), rt, moved, 0, keep, False)
    if kind == K_JMP:
        if leaves(target) and inside(ip):
            return _leave(target, at, rt, dest(target))
        return bytes([_JMP]) + _rel(at + 5, dest(target))
    if kind == K_COND:
        # The condition over the not-taken code; each side a TNT bit or,
        # leaving the ranges, a TIP.PGD.
        def side(bit: int, to: int, base: int) -> bytes:
            if leaves(to):
                return _leave(to, base, rt, dest(to))
            return _bit(bit, to, dest(to), base, rt, dead is not None and dead(to))

        size = len(_short_cond(raw, 0))
        other = side(0, nxt, at + size)
        taken = side(1, target, at + size + len(other))
        return _short_cond(raw, len(other)) + other + taken
    if kind in (K_IJMP, K_ICALL):
        load = _load_operand(raw, ip, at + len(pc.TPL_HEAD))
        base = at + len(pc.TPL_HEAD) + len(load)
        if kind == K_IJMP:
            t = bytearray(pc.TPL_IJMP)
            _rel32(t, pc.F_ijmp_rt, base + pc.F_ijmp_rt, rt + pc.RT_TIP)
        else:
            t = bytearray(pc.TPL_ICALL)
            _rel32(t, pc.F_icall_rt, base + pc.F_icall_rt, rt + pc.RT_TIP)
            _put64(t, pc.F_icall_ret, nxt)
        return pc.TPL_HEAD + load + bytes(t)
    if kind == K_RET:
        t = bytearray(pc.TPL_RET)
        _rel32(t, pc.F_ret_rt, at + pc.F_ret_rt, rt + pc.RT_TIP_RET)
        _rel32(t, pc.F_ret_trt, at + pc.F_ret_trt, rt + pc.RT_TNT_FULL)
        ret = _ret_bytes(raw)
        pop = 8 + (int.from_bytes(ret[1:3], "little") if ret[0] == 0xC2 else 0)
        t[pc.F_ret_pop : pc.F_ret_pop + 4] = pop.to_bytes(4, "little")
        t[pc.F_ret_ret : pc.F_ret_ret + len(ret)] = ret
        return bytes(t) + ret
    t = bytearray(pc.TPL_SYS)
    _put64(t, pc.F_sys_next1, nxt)
    _put64(t, pc.F_sys_next2, nxt)
    _rel32(t, pc.F_sys_pgd, at + pc.F_sys_pgd, rt + pc.RT_PGD)
    _rel32(t, pc.F_sys_pge, at + pc.F_sys_pge, rt + pc.RT_PGE)
    _rel32(t, pc.F_sys_dst, at + pc.F_sys_dst, dest(nxt))
    return bytes(t)


# The planning code, the runtime's and the sweep's: a cached plan is theirs.
_PLAN_DIGEST = hashlib.sha256(
    Path(__file__).read_bytes() + Path(pc.__file__).read_bytes() + SOURCE_DIGEST.encode()
).hexdigest()[:16]


def plan_module_cached(
    path: str,
    cm: CodeMap,
    read,
    sections: list[tuple[int, int]],
    near: tuple[int, int],
    far: list[tuple[int, int, np.ndarray]] = (),
    retcomp: bool = True,
    ranges: np.ndarray | None = None,
    entries: np.ndarray | None = None,
    identity: str | None = None,
) -> ModulePlan:
    """:func:`plan_module` of a module mapped from file ``path``, kept in a
    cache by all it depends on: the file's identity (device, inode, size,
    modification time; or ``identity``, for code no file holds), where the module and its arenas are, what of
    ``far`` other modules took, ``retcomp``, ``ranges``, ``entries`` and the planning code.  The
    same program run again (without address randomization) is planned once.
    ``far``'s occupancy is updated as planning would.  The plan comes with
    its ``source`` (the code of ``sections``) and its writes made."""

    def made() -> ModulePlan:
        plan = plan_module(cm, read, near, far, retcomp, ranges, entries)
        plan.source = {lo: read(lo, hi - lo) for lo, hi in sections}
        plan.make_writes()
        return plan

    if identity is None:
        try:
            st = os.stat(path)
        except OSError:
            plan = made()
            for _, _, occ in far:
                _OCCUPANCY.pop(id(occ), None)  # changed unseen
            return plan
        identity = repr((st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    key = repr((_PLAN_DIGEST, path, identity,
                int(cm.ips[0]) if len(cm) else 0, len(cm), near, retcomp,
                None if ranges is None else ranges.tolist(),
                None if entries is None else entries.tolist(),
                [(lo, hi, _occupancy_digest(occ)) for lo, hi, occ in far]))  # fmt: skip
    digest = hashlib.sha256(key.encode()).hexdigest()
    name = user_cache_dir() / "patch-plans" / digest[:32]
    try:
        with open(name, "rb") as f:
            plan, placed = pickle.load(f)
        for (_, _, occ), more in zip(far, placed, strict=True):
            occ[more] = 1
        _after(far, digest)
        os.utime(name)  # used: kept longest when the cache is trimmed
        return plan
    except (OSError, EOFError, ValueError, TypeError, pickle.UnpicklingError):
        pass
    taken = [np.flatnonzero(occ) for _, _, occ in far]
    plan = made()
    _after(far, digest)
    placed = [
        np.setdiff1d(np.flatnonzero(occ), t) for (_, _, occ), t in zip(far, taken, strict=True)
    ]
    try:
        name.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=name.parent, delete=False) as f:
            pickle.dump((plan, placed), f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(f.name, name)
        _trim(name.parent)
    except OSError:
        pass  # no cache: planned again next time
    return plan


# What each far piece's occupancy is, as a digest: of its bytes when first
# seen, then of the plan that last placed stubs there (the planning is
# deterministic, so that plan's key, which holds the digests before it,
# names the occupancy after it) -- hashing 16 MiB per piece and module
# cost more than loading the plan.  By id, with a weak reference that
# tells a new array from a freed one's id.
_OCCUPANCY: dict[int, tuple[weakref.ref, str]] = {}


def _occupancy_digest(occ: np.ndarray) -> str:
    got = _OCCUPANCY.get(id(occ))
    if got is not None and got[0]() is occ:
        return got[1]
    digest = hashlib.sha256(np.flatnonzero(occ).tobytes()).hexdigest()
    _OCCUPANCY[id(occ)] = (weakref.ref(occ), digest)
    return digest


def _after(far: list[tuple[int, int, np.ndarray]], key_digest: str) -> None:
    for n, (_, _, occ) in enumerate(far):
        _OCCUPANCY[id(occ)] = (weakref.ref(occ), f"{key_digest}:{n}")


PLAN_CACHE_BYTES = 2 << 30  # past this, the plans used longest ago go


def _trim(directory: Path) -> None:
    files = sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime_ns)
    total = sum(p.stat().st_size for p in files)
    while total > PLAN_CACHE_BYTES and files:
        old = files.pop(0)
        total -= old.stat().st_size
        old.unlink()
