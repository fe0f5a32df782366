"""Where a trampoline may go: the constrained allocator.

The 5-byte ``jmp rel32`` written at a site ``A`` covers the first bytes of
every instruction that starts at ``A+1 .. A+4``.  Each such byte must read
``0xCC`` (``int3``), so that a thread arriving there traps instead of running
displacement bytes (Harper-Cyr, "Fast & Flexible Tracepoints in x86").  A
fixed byte at ``A+p`` is byte ``p-1`` of the little-endian rel32, so the
constraint is ``rel32 & mask == pattern``: one address in 256 when ``A+1``
is fixed, a 16 MiB window about 820 MiB below the site when ``A+4`` is.

:func:`next_match` finds the smallest rel32 at or above a bound that meets
the constraint, exactly (not by trying offsets).  :class:`TrampolineSpace`
keeps the trampoline pages already mapped in a process and sub-allocates in
them, so trampolines of the same constraint class share pages, and finds
room for new pages in the gaps of ``/proc/PID/maps`` within reach.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ..image.process import Mapping

__all__ = [
    "CHUNK_CODE",
    "CHUNK_SIZE",
    "Chunk",
    "TrampolineSpace",
    "constraint",
    "free_gaps",
    "next_match",
]

PAGE = 0x1000
# Two code pages, so that a trampoline may start anywhere in the first page
# whatever its size (a constraint that fixes rel32's low 12 bits fixes its
# offset in every page), followed by as many data bytes, the code's mirror.
CHUNK_CODE = 2 * PAGE  # code bytes per chunk (R-X) ...
CHUNK_SIZE = 2 * CHUNK_CODE  # ... and data (RW-, shared with hwtrace)
REL_MIN, REL_MAX = -(1 << 31), (1 << 31) - 1
LOWEST = 0x10000  # vm.mmap_min_addr's usual value; nothing goes below
HIGHEST = 0x7FFF_FFFF_F000  # end of the 47-bit user address space
HEAP_ROOM = 256 << 20  # left free above [heap] for brk to grow
STACK_ROOM = 64 << 20  # ... and below [stack]


def constraint(starts: Iterable[int]) -> tuple[int, int]:
    """``(mask, pattern)`` for rel32 given the offsets from the site of the
    covered instructions' starts: offsets 1-4 fix a displacement byte."""
    mask = pat = 0
    for p in starts:
        if 1 <= p <= 4:
            mask |= 0xFF << (8 * (p - 1))
            pat |= 0xCC << (8 * (p - 1))
    return mask, pat


def next_match(x: int, mask: int, pattern: int) -> int | None:
    """The smallest signed 32-bit ``v >= x`` with ``v & mask == pattern``
    (bits of ``v`` as unsigned), or None.

    Works in the unsigned order obtained by flipping bit 31, where the
    signed order is the plain one: keep ``x``'s free bits and force the
    fixed ones; if that went down, carry into the lowest free bit above the
    highest difference that is still 0 and clear the free bits below it.
    """
    if x > REL_MAX:
        return None
    x = max(x, REL_MIN)
    b = 1 << 31
    u = (x & 0xFFFFFFFF) ^ b
    patu = pattern ^ (b & mask)
    free = ~mask & 0xFFFFFFFF
    c = (u & free) | patu
    if c == u:
        v = c
    elif c > u:
        h = (c ^ u).bit_length() - 1
        v = c & ~(free & ((1 << h) - 1))
    else:
        h = (c ^ u).bit_length() - 1
        t = free & ~((1 << (h + 1)) - 1) & ~c
        if t == 0:
            return None
        j = (t & -t).bit_length() - 1
        v = (c | (1 << j)) & ~(free & ((1 << j) - 1))
    v ^= b
    return v - (1 << 32) if v >= b else v


def _place(lo: int, hi: int, site_end: int, mask: int, pat: int, size: int) -> int | None:
    """The lowest address ``t`` with ``[t, t+size)`` inside ``[lo, hi)`` and
    ``t - site_end`` meeting the constraint."""
    r0 = max(lo - site_end, REL_MIN)
    r1 = min(hi - size - site_end, REL_MAX)
    if r0 > r1:
        return None
    rel = next_match(r0, mask, pat)
    if rel is None or rel > r1:
        return None
    return site_end + rel


def free_gaps(maps: Sequence[Mapping]) -> list[tuple[int, int]]:
    """The unmapped ranges of an address space, page aligned, leaving room
    for the heap and the main stack to grow."""
    gaps = []
    prev_end, prev_path = LOWEST, ""
    for m in sorted(maps, key=lambda m: m.start):
        lo = prev_end + (HEAP_ROOM if prev_path == "[heap]" else 0)
        hi = m.start - (STACK_ROOM if m.path == "[stack]" else 0)
        if hi - lo >= CHUNK_SIZE:
            gaps.append((lo, hi))
        prev_end, prev_path = max(prev_end, m.end), m.path
    lo = prev_end + (HEAP_ROOM if prev_path == "[heap]" else 0)
    if HIGHEST - lo >= CHUNK_SIZE:
        gaps.append((lo, HIGHEST))
    return gaps


@dataclass
class Chunk:
    """A mapped trampoline chunk: ``CHUNK_CODE`` bytes of code at ``base``,
    their data mirror one page up; ``free`` lists the unused code ranges."""

    base: int
    page: int = 0  # its data page in the shared counter memory
    free: list[tuple[int, int]] = field(default_factory=list)
    used: int = 0  # trampolines in it

    def __post_init__(self) -> None:
        if not self.free and not self.used:
            self.free = [(self.base, self.base + CHUNK_CODE)]

    def take(self, t: int, size: int) -> None:
        for i, (lo, hi) in enumerate(self.free):
            if lo <= t and t + size <= hi:
                parts = [(lo, t)] if t > lo else []
                if t + size < hi:
                    parts.append((t + size, hi))
                self.free[i : i + 1] = parts
                self.used += 1
                return
        raise ValueError(f"{t:#x}+{size} is not free in the chunk at {self.base:#x}")

    def give(self, t: int, size: int) -> None:
        ranges = sorted([*self.free, (t, t + size)])
        merged: list[tuple[int, int]] = []
        for lo, hi in ranges:
            if merged and merged[-1][1] >= lo:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        self.free = merged
        self.used -= 1

    @property
    def empty(self) -> bool:
        return self.used == 0


class TrampolineSpace:
    """The trampoline chunks of one process and the choice of new ones."""

    def __init__(self) -> None:
        self.chunks: dict[int, Chunk] = {}

    def in_chunks(
        self,
        site: int,
        starts: Iterable[int],
        size: int,
        reach: tuple[int, int] = (0, 1 << 64),
    ) -> tuple[int, Chunk] | None:
        """Room for a trampoline of ``size`` bytes for the site in a chunk
        already mapped: ``(address, chunk)`` or None.  ``reach`` bounds the
        trampoline further (the targets of RIP-relative data operands)."""
        mask, pat = constraint(starts)
        site_end = site + 5
        best: tuple[int, Chunk] | None = None
        for chunk in self.chunks.values():
            for lo, hi in chunk.free:
                lo, hi = max(lo, reach[0]), min(hi, reach[1])
                t = _place(lo, hi, site_end, mask, pat, size)
                if t is not None and (best is None or abs(t - site) < abs(best[0] - site)):
                    best = (t, chunk)
                    break
        return best

    def new_chunk(
        self,
        site: int,
        starts: Iterable[int],
        size: int,
        gaps: Sequence[tuple[int, int]],
        reach: tuple[int, int] = (0, 1 << 64),
    ) -> tuple[int, int] | None:
        """Where a new chunk could be mapped for the site: ``(trampoline
        address, chunk base)`` in the gap nearest to the site, or None."""
        mask, pat = constraint(starts)
        site_end = site + 5
        reach_lo = max(site_end + REL_MIN, reach[0])
        reach_hi = min(site_end + REL_MAX + 1, reach[1])
        order = sorted(gaps, key=lambda g: 0 if g[0] <= site < g[1] else min(
            abs(g[0] - site), abs(g[1] - site)))  # fmt: skip
        for glo, ghi in order:
            lo, hi = max(glo, reach_lo), min(ghi, reach_hi)
            while hi - lo >= size:
                t = _place(lo, hi, site_end, mask, pat, size)
                if t is None:
                    break
                base = t & ~(PAGE - 1)
                if base >= glo and base + CHUNK_SIZE <= ghi and t + size <= base + CHUNK_CODE:
                    return t, base
                lo = base + PAGE  # past the gap's end, or a trampoline larger than a page
        return None

    def add_chunk(self, base: int, page: int = 0) -> Chunk:
        chunk = Chunk(base, page)
        self.chunks[base] = chunk
        return chunk

    def holds(self, address: int) -> bool:
        """Whether ``address`` is in the code of a chunk."""
        try:
            self.chunk_of(address)
        except KeyError:
            return False
        return True

    def chunk_of(self, t: int) -> Chunk:
        """The chunk whose code holds address ``t``."""
        for base in range(t & ~(PAGE - 1), t - CHUNK_CODE, -PAGE):
            chunk = self.chunks.get(base)
            if chunk is not None:
                return chunk
        raise KeyError(f"no trampoline chunk holds {t:#x}")
