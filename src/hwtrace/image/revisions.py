"""Code revisions: the bytes code had at a time, wherever they came from.

A trace decoder follows the flow through the code's bytes; when code
changes while it runs (JIT compilers, BPF JITs, static keys and other
live patching), the bytes on disk are not the ones that ran.  After
Sharma's FlowJIT (thesis, ch. 7): every revision of a code range is kept
with the time from which it is valid, and the decoder reads through the
store at the time of the instruction it decodes.

A :class:`Revision` is (address space, address, bytes, valid from), with
its ``source`` (``capture``, ``stepper``, ``jitdump``, ``bpf``,
``text_poke``, …) and what the source knew (thread, CPU, TSC, the IP
that ran it first).  A revision is valid from its time until a later
revision of the same bytes begins.  :meth:`CodeRevisions.read` gives the
bytes at an address at a time; :meth:`CodeRevisions.around` also the
neighbouring revision, for a decode that falls in the window where
another CPU may still run the old bytes (Linux's TEXT_POKE notes: no
single timestamp tells).  Two sources that disagree about the same bytes
at the same time are a :class:`Conflict`.

Times are whatever clock the caller keeps consistent (TSC or ns); the
store only orders them.
"""

from __future__ import annotations

from bisect import bisect_right, insort
from dataclasses import dataclass, field

import numpy as np

from .sections import ANY, Asid

__all__ = ["CodeRevisions", "Conflict", "Revision"]


@dataclass(frozen=True)
class Revision:
    """The bytes at ``address`` from time ``valid_from`` on."""

    asid: Asid
    address: int
    data: bytes
    valid_from: int
    source: str
    tid: int = -1
    cpu: int = -1
    tsc: int = -1
    ip: int = -1
    name: str = ""  # a function's name where the source gives one (jitdump, ksymbol)
    id: int = field(default=-1, compare=False)

    @property
    def end(self) -> int:
        return self.address + len(self.data)

    def covers(self, address: int, size: int = 1) -> bool:
        return self.address <= address and address + size <= self.end


@dataclass(frozen=True)
class Conflict:
    """Two revisions of different sources, valid from the same time, whose
    bytes differ where they overlap (at ``address``)."""

    first: Revision
    second: Revision
    address: int

    def __str__(self) -> str:
        return (
            f"{self.first.source} and {self.second.source} disagree about the code at "
            f"{self.address:#x} from time {self.first.valid_from}"
        )


class CodeRevisions:
    """Revisions per address space, found by address then by time."""

    def __init__(self) -> None:
        self._by_asid: dict[Asid, list[Revision]] = {}
        self._starts: dict[Asid, list[tuple[int, int]]] = {}  # (address, id), sorted
        self.revisions: list[Revision] = []
        self.conflicts: list[Conflict] = []
        self._longest = 0

    def __len__(self) -> int:
        return len(self.revisions)

    def add(
        self,
        address: int,
        data: bytes,
        valid_from: int,
        source: str,
        *,
        asid: Asid = ANY,
        tid: int = -1,
        cpu: int = -1,
        tsc: int = -1,
        ip: int = -1,
        name: str = "",
    ) -> Revision | None:
        """Add a revision; returns it, or None when the same source already
        has these bytes there from an earlier time (nothing changed)."""
        if not data:
            raise ValueError(f"a revision at {address:#x} without bytes")
        if address < 0 or address + len(data) > 1 << 64:
            raise ValueError(
                f"a revision at {address:#x} of {len(data)} bytes is outside the address space"
            )
        current = self.at(address, valid_from, asid=asid, size=len(data))
        if current is not None and current.address == address and current.data == data:
            return None
        rev = Revision(asid, address, bytes(data), valid_from, source, tid, cpu, tsc, ip, name,
                       id=len(self.revisions))  # fmt: skip
        for other in self._overlapping(asid, address, rev.end):
            if other.valid_from == valid_from and other.source != source:
                at = _first_difference(rev, other)
                if at is not None:
                    self.conflicts.append(Conflict(other, rev, at))
        self.revisions.append(rev)
        self._by_asid.setdefault(asid, []).append(rev)
        insort(self._starts.setdefault(asid, []), (address, rev.id))
        self._longest = max(self._longest, len(data))
        return rev

    def _overlapping(self, asid: Asid, begin: int, end: int) -> list[Revision]:
        out = []
        for key, starts in self._starts.items():
            if not key.matches(asid):
                continue
            lo = bisect_right(starts, (begin - self._longest, 1 << 62))
            hi = bisect_right(starts, (end, -1))
            for _, rid in starts[lo:hi]:
                r = self.revisions[rid]
                if r.address < end and begin < r.end:
                    out.append(r)
        return out

    def history(self, address: int, *, asid: Asid = ANY) -> list[Revision]:
        """Every revision covering ``address``, oldest first."""
        revs = [r for r in self._overlapping(asid, address, address + 1)]
        return sorted(revs, key=lambda r: (r.valid_from, r.id))

    def at(self, address: int, time: int, *, asid: Asid = ANY, size: int = 1) -> Revision | None:
        """The revision in force at ``time`` for the ``size`` bytes at
        ``address`` (the latest that began at or before ``time`` and covers
        them all), or None."""
        best = None
        for r in self._overlapping(asid, address, address + size):
            if r.valid_from > time or not r.covers(address, size):
                continue
            if best is None or (r.valid_from, r.id) > (best.valid_from, best.id):
                best = r
        # A later revision that covers only part of the range still replaced
        # those bytes: the range has no single revision then.
        if best is not None:
            for r in self._overlapping(asid, address, address + size):
                if best.valid_from < r.valid_from <= time and not r.covers(address, size):
                    return None
        return best

    def read(self, address: int, size: int, time: int, *, asid: Asid = ANY) -> bytes | None:
        """The ``size`` bytes at ``address`` at ``time``, or None when no
        single revision holds them."""
        r = self.at(address, time, asid=asid, size=size)
        if r is None:
            return None
        off = address - r.address
        return r.data[off : off + size]

    def around(
        self, address: int, time: int, *, asid: Asid = ANY
    ) -> tuple[Revision | None, Revision | None]:
        """The revision in force at ``time`` and the one before it (for a
        decode inside a modification window)."""
        hist = [r for r in self.history(address, asid=asid) if r.valid_from <= time]
        now = self.at(address, time, asid=asid)
        before = None
        if now is not None:
            older = [r for r in hist if (r.valid_from, r.id) < (now.valid_from, now.id)]
            before = older[-1] if older else None
        return now, before

    def differs_from(self, address: int, data: bytes, time: int, *, asid: Asid = ANY) -> bool:
        """Do the bytes in force at ``time`` differ from ``data`` (e.g. the
        file's bytes a decoder would otherwise use)?  The decoder flags such
        decodes: without the store they would be wrong yet succeed."""
        got = self.read(address, len(data), time, asid=asid)
        return got is not None and got != data


def _first_difference(a: Revision, b: Revision) -> int | None:
    lo, hi = max(a.address, b.address), min(a.end, b.end)
    x = np.frombuffer(a.data, np.uint8, hi - lo, lo - a.address)
    y = np.frombuffer(b.data, np.uint8, hi - lo, lo - b.address)
    differ = np.flatnonzero(x != y)
    return lo + int(differ[0]) if differ.size else None
