"""Per-CPU ring buffers shared between a traced process and hwtrace.

A tracepoint that records events writes them from its trampoline into the
buffer of the CPU it runs on (``rdtscp`` gives the TSC and, in
``TSC_AUX``, the CPU number Linux puts there), with no system call: a slot
is reserved by ``lock xadd`` on the buffer's head, invalidated, filled and
committed by storing its sequence number (index + 1) last.  x86 keeps
stores in order, so a committed slot is whole.  The buffer overwrites the
oldest slots when hwtrace falls behind (as LTTng's overwrite mode does);
hwtrace notices and counts them lost: a slot is taken only when its
sequence number is the one expected and no writer had lapped it by the
time the copy was made.

hwtrace creates the memory (a memfd), maps it, and has the target map the
same file through ``/proc/HWTRACE/fd/N``; draining is numpy over whole
buffers, no per-event Python.
"""

from __future__ import annotations

import mmap
import os
import time
from dataclasses import dataclass

import numpy as np

from ..columns import pow2_at_least

__all__ = [
    "EVENT_DTYPE",
    "HEADER_BYTES",
    "SLOT_BYTES",
    "Clock",
    "CounterPages",
    "Rings",
    "clock_pair",
]

SLOT_BYTES = 64
HEADER_BYTES = 64  # per buffer, one cache line: head (u64) at 0
NREGS = 4
EVENT_DTYPE = np.dtype(
    [
        ("seq", "<u8"),
        ("tsc", "<u8"),
        ("tid", "<u4"),
        ("cpu", "<u4"),
        ("probe", "<u4"),
        ("kind", "<u4"),  # 0: hit (entry), 1: return
        ("regs", "<u8", (NREGS,)),
    ]
)
assert EVENT_DTYPE.itemsize == SLOT_BYTES

# Offsets of the slot fields, for the code generator.
F_SEQ, F_TSC, F_TID, F_CPU, F_PROBE, F_KIND, F_REGS = (
    EVENT_DTYPE.fields[n][1] for n in ("seq", "tsc", "tid", "cpu", "probe", "kind", "regs")
)


@dataclass(frozen=True)
class Geometry:
    """Where things are in the shared memory: ``buffers`` buffers (a power
    of two, at least the CPU count) of ``slots`` slots each (a power of
    two).  The buffers' headers (one cache line each: the head, a u64, at
    its start) come first, then the buffers' slots, each buffer's together."""

    buffers: int
    slots: int

    @property
    def slots_offset(self) -> int:
        return (self.buffers * HEADER_BYTES + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE

    @property
    def buffer_shift(self) -> int:
        """log2 of one buffer's slot bytes."""
        return (self.slots * SLOT_BYTES).bit_length() - 1

    @property
    def size(self) -> int:
        return self.slots_offset + (self.buffers << self.buffer_shift)


def clock_pair() -> tuple[int, int]:
    """(TSC, CLOCK_MONOTONIC ns) read together: the tightest of a few
    readings, the ns the middle of its window."""
    from ..isa.tsc import rdtsc

    best = None
    for _ in range(5):
        n0 = time.monotonic_ns()
        c = int(rdtsc())
        n1 = time.monotonic_ns()
        if best is None or n1 - n0 < best[0]:
            best = (n1 - n0, c, (n0 + n1) // 2)
    return best[1], best[2]


class Clock:
    """TSC to CLOCK_MONOTONIC nanoseconds, from (TSC, ns) pairs taken by
    hwtrace around the recording (both clocks are the same for every CPU of
    this machine: constant, synchronised TSC)."""

    def __init__(self) -> None:
        from ..isa.tsc import rdtsc

        self._rdtsc = rdtsc
        rdtsc()  # its machine code mapped now, not inside a reading
        self.pairs = [self._pair()]

    def _pair(self) -> tuple[int, int]:
        return clock_pair()

    def mark(self) -> None:
        self.pairs.append(self._pair())

    def to_ns(self, tsc: np.ndarray) -> np.ndarray:
        (c0, n0), (c1, n1) = self.pairs[0], self.pairs[-1]
        if c1 <= c0:
            return np.zeros(tsc.shape, np.int64)
        rate = (n1 - n0) / (c1 - c0)
        return (n0 + (tsc.astype(np.float64) - c0) * rate).astype(np.int64)


class Rings:
    """The shared buffers, on hwtrace's side."""

    def __init__(self, cpus: int | None = None, slots: int = 1 << 16) -> None:
        cpus = cpus or os.cpu_count() or 1
        self.geometry = Geometry(pow2_at_least(max(cpus, _possible_cpus())), pow2_at_least(slots))
        self.fd = os.memfd_create("hwtrace-probe-events", 0)
        size = self.geometry.size
        os.ftruncate(self.fd, size)
        self.map = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        g = self.geometry
        raw = np.frombuffer(self.map, dtype=np.uint8)
        self._raw = raw
        self.heads = [raw[i * HEADER_BYTES : i * HEADER_BYTES + 8].view("<u8")
                      for i in range(g.buffers)]  # fmt: skip
        first, step = g.slots_offset, 1 << g.buffer_shift
        self.slots = [
            raw[first + i * step : first + (i + 1) * step].view(EVENT_DTYPE)
            for i in range(g.buffers)
        ]
        self.positions = [0] * g.buffers
        self.lost = 0
        self.clock = Clock()

    @property
    def path(self) -> str:
        """Where the target opens the memory."""
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def drain(self, final: bool = False) -> np.ndarray:
        """The events committed since the last drain, in TSC order
        (:data:`EVENT_DTYPE`; ``seq`` is the event's index in its buffer).
        ``final``: the writers are gone, so slots never committed count as
        lost.  Each buffer's new slots are copied as at most two contiguous
        runs (the ring wraps once) and checked after the copy."""
        g = self.geometry
        cap = g.slots
        self.clock.mark()
        parts = []
        for b in range(g.buffers):
            pos = self.positions[b]
            h0 = int(self.heads[b][0])
            if h0 - pos > cap:
                self.lost += h0 - pos - cap
                pos = h0 - cap
            n = h0 - pos
            if n <= 0:
                continue
            first = pos & (cap - 1)
            ring = self.slots[b]
            if first + n <= cap:
                copy = ring[first : first + n].copy()
            else:
                copy = np.concatenate((ring[first:], ring[: first + n - cap]))
            h1 = int(self.heads[b][0])
            expected = np.arange(pos + 1, h0 + 1, dtype=np.uint64)
            ok = copy["seq"] == expected
            overwritten = max(h1 - cap - pos, 0)  # slots a writer may have reused meanwhile
            if overwritten:
                ok[:overwritten] = False
            if ok.all():
                stop = n
            elif final:
                stop = n
            else:
                pending = ~ok
                pending[:overwritten] = False
                stop = int(np.argmax(pending)) if pending.any() else n
            kept = copy[:stop] if ok[:stop].all() else copy[:stop][ok[:stop]]
            self.lost += stop - kept.shape[0]
            self.positions[b] = pos + stop
            if kept.shape[0]:
                parts.append(kept)
        if not parts:
            return np.zeros(0, EVENT_DTYPE)
        events = parts[0] if len(parts) == 1 else np.concatenate(parts)
        # A buffer is in TSC order only nearly: a writer preempted between
        # its rdtscp and its slot's reservation commits after a later time.
        # A stable sort orders it (and merges the buffers' runs).
        tsc = events["tsc"]
        if (tsc[1:] < tsc[:-1]).any():
            events = events[np.argsort(tsc, kind="stable")]
        return events

    def close(self) -> None:
        self.heads, self.slots = [], []
        del self._raw
        try:
            self.map.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes with the process
        os.close(self.fd)


class CounterPages:
    """The trampolines' data pages (their hit counters), shared with hwtrace
    through a memfd, so counts can be read without a system call and after
    the process is gone.  A sparse file: pages take memory once used."""

    SIZE = 64 << 20  # of address space

    def __init__(self, unit: int) -> None:
        self.unit = unit  # bytes per chunk
        self.fd = os.memfd_create("hwtrace-probe-counters", 0)
        self.size = self.SIZE
        os.ftruncate(self.fd, self.size)
        self.map = mmap.mmap(self.fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self._free = list(range(self.size // unit - 1, -1, -1))

    @property
    def path(self) -> str:
        return f"/proc/{os.getpid()}/fd/{self.fd}"

    def take(self) -> int:
        if not self._free:
            raise RuntimeError("no counter pages left")
        return self._free.pop()

    def give(self, page: int) -> None:
        self._free.append(page)

    def clear(self, page: int) -> None:
        at = page * self.unit
        self.map[at : at + self.unit] = bytes(self.unit)

    def read(self, page: int, offset: int) -> int:
        at = page * self.unit + offset
        return int.from_bytes(self.map[at : at + 8], "little")

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)


def _possible_cpus() -> int:
    """CPUs that may come online (``/sys/devices/system/cpu/possible``)."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    top = 0
    for part in text.split(","):
        top = max(top, int(part.split("-")[-1]))
    return top + 1
