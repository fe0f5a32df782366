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
from dataclasses import dataclass, field, replace

import numpy as np

from . import Image
from .sections import ANY, Asid, Section

__all__ = ["EXACT_SOURCES", "CodeRevisions", "Conflict", "Revision", "revision_of_section"]

# Sources that time a revision where the trace can switch code: just after
# the flow packet of the last branch before the new bytes first ran (the
# software recorder, which steps every instruction, see
# hwtrace.record.software.place_revisions).  A decoder with time stamps
# switches code exactly there; any other revision may begin anywhere
# between two flow packets.
EXACT_SOURCES = ("stepper",)

# Sections an overlay adds are named after their revision (see
# revision_of_section).
_SECTION_PREFIX = "[code revision "


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
        # Overlays made so far, per base image (id) and epoch; revisions
        # only grow, so they stay right until the next add().
        self._overlays: dict[tuple[int, int], Image] = {}
        self._bounds: np.ndarray | None = None

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
        self._append(rev)
        return rev

    def _append(self, rev: Revision) -> None:
        self.revisions.append(rev)
        self._overlays.clear()
        self._bounds = None
        self._by_asid.setdefault(rev.asid, []).append(rev)
        insort(self._starts.setdefault(rev.asid, []), (rev.address, rev.id))
        self._longest = max(self._longest, len(rev.data))

    def retimed(self, revision: Revision, valid_from: int) -> CodeRevisions:
        """A copy of the store in which ``revision`` begins at
        ``valid_from`` (how a decoder tries the neighbouring revision inside
        a modification window)."""
        out = CodeRevisions()
        for r in self.revisions:
            out._append(replace(r, valid_from=valid_from) if r.id == revision.id else r)
        out.conflicts = list(self.conflicts)
        return out

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
        """The ``size`` bytes at ``address`` at ``time``, each from the
        revision in force over it, or None when some byte has none."""
        out = self.overlay(None, self.epoch(time)).read_span(address, size, asid)
        return out if len(out) == size else None

    # -- epochs: the decoder's view ---------------------------------------------------

    def boundaries(self) -> np.ndarray:
        """The distinct times at which revisions begin, sorted (int64)."""
        if self._bounds is None:
            times = np.array([r.valid_from for r in self.revisions], np.int64)
            self._bounds = np.unique(times)
        return self._bounds

    def epoch(self, time: int) -> int:
        """How many of :meth:`boundaries` are at or before ``time``: the
        code is the same at any two times of one epoch."""
        return int(np.searchsorted(self.boundaries(), np.int64(time), side="right"))

    def overlay(self, base: Image | None, epoch: int) -> Image:
        """``base`` (None: nothing) with the revisions in force during
        ``epoch`` on top: where a revision covers code, its bytes replace
        the base's.  Each added section is named after its revision
        (:func:`revision_of_section` finds it again)."""
        if epoch <= 0:
            return base if base is not None else Image("no code revisions")
        key = (id(base), epoch)
        got = self._overlays.get(key)
        if got is not None:
            return got
        bounds = self.boundaries()
        epoch = min(epoch, bounds.shape[0])
        prev = self._overlays.get((id(base), epoch - 1))
        if prev is not None:
            # One epoch on from a known one: only the revisions that begin here.
            image = prev.copy()
            start = int(bounds[epoch - 1])
            revs = [r for r in self.revisions if r.valid_from == start]
        else:
            name = f"{base.name if base is not None else ''} + code revisions".strip()
            image = base.copy(name) if base is not None else Image(name)
            end = int(bounds[epoch - 1])
            revs = [r for r in self.revisions if r.valid_from <= end]
        revs.sort(key=lambda r: (r.valid_from, r.id))
        for r in revs:
            image.add_section(Section.from_bytes(r.data, r.address, _section_name(r)), r.asid)
        # What the overlay was made of, for revised_instructions().
        image.code_revisions = self  # type: ignore[attr-defined]
        image.revision_base = base  # type: ignore[attr-defined]
        self._overlays[key] = image
        return image

    def rewrites(self, base: Image | None) -> dict[int, np.ndarray]:
        """Per revision (by id) that replaced other code: which of its bytes
        differ from the bytes in force there just before it (``base``'s,
        or those of the revisions before it, in time order then in the
        order they were added).  A revision of code that was not there
        before (a JIT's new code) is no rewrite: nothing else can have run
        at its addresses."""
        key = (id(base), len(self.revisions))
        cached = getattr(self, "_rewrites", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        out: dict[int, np.ndarray] = {}
        for r in self.revisions:
            size = len(r.data)
            old = np.zeros(size, np.uint8)
            known = np.zeros(size, np.bool_)
            if base is not None:
                got = base.read_span(r.address, size, r.asid)
                old[: len(got)] = np.frombuffer(got, np.uint8)
                known[: len(got)] = True
            earlier = [o for o in self._overlapping(r.asid, r.address, r.end)
                       if (o.valid_from, o.id) < (r.valid_from, r.id)]  # fmt: skip
            for o in sorted(earlier, key=lambda o: (o.valid_from, o.id)):
                lo, hi = max(o.address, r.address), min(o.end, r.end)
                old[lo - r.address : hi - r.address] = np.frombuffer(
                    o.data, np.uint8, hi - lo, lo - o.address
                )
                known[lo - r.address : hi - r.address] = True
            differ = known & (old != np.frombuffer(r.data, np.uint8))
            if differ.any():
                out[r.id] = differ
        self._rewrites = (key, out)
        return out

    def between(self, first: int, last: int) -> list[Revision]:
        """The revisions that begin after epoch ``first`` and by epoch
        ``last`` (see :meth:`epoch`)."""
        bounds = self.boundaries()
        if last <= 0 or first >= last:
            return []
        order = getattr(self, "_time_order", None)
        if order is None or order.shape[0] != len(self.revisions):
            times = np.array([r.valid_from for r in self.revisions], np.int64)
            order = self._time_order = np.argsort(times, kind="stable")
            self._sorted_times = times[order]
        hi = bounds[min(last, bounds.shape[0]) - 1]
        a = int(np.searchsorted(self._sorted_times, bounds[first - 1], "right")) if first > 0 else 0
        b = int(np.searchsorted(self._sorted_times, hi, "right"))
        return [self.revisions[i] for i in order[a:b].tolist()]

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


def revised_instructions(images: list, which: np.ndarray, ips: np.ndarray) -> np.ndarray:
    """For instructions at ``ips`` decoded in ``images[which]``: True where
    the image is a revisions overlay (:meth:`CodeRevisions.overlay`) and
    the instruction's bytes there differ from its base image's (the files'),
    or the base has no code there at all."""
    from ..isa.x86 import InsnCache

    out = np.zeros(ips.shape[0], np.bool_)
    if ips.shape[0] == 0:
        return out
    keys = np.stack([which.astype(np.uint64), ips.astype(np.uint64)], axis=1)
    uniq, inverse = np.unique(keys, axis=0, return_inverse=True)
    flags = np.zeros(uniq.shape[0], np.bool_)
    caches: dict[int, InsnCache] = {}
    for j, (k, ip) in enumerate(uniq.tolist()):
        image = images[k] if 0 <= k < len(images) else None
        if getattr(image, "code_revisions", None) is None:
            continue
        section = image.find(ip)
        if section is None or revision_of_section(section) < 0:
            continue
        cache = caches.get(k)
        if cache is None:
            cache = caches[k] = InsnCache(image.read)
        insn = cache.get(ip, 64)
        size = 1 if isinstance(insn, int) else insn.size
        base = image.revision_base
        mine = image.read_span(ip, size)
        theirs = base.read_span(ip, size) if base is not None else b""
        flags[j] = mine != theirs
    out[:] = flags[inverse.reshape(-1)]
    return out


def _section_name(r: Revision) -> str:
    return f"{_SECTION_PREFIX}{r.id}: {r.source}{' ' + r.name if r.name else ''}]"


def revision_of_section(section: Section) -> int:
    """The id of the revision whose bytes an overlay's ``section`` holds,
    or -1 for any other section."""
    name = section.name
    if section.filename is not None or not name.startswith(_SECTION_PREFIX):
        return -1
    digits = name[len(_SECTION_PREFIX) :].split(":", 1)[0]
    return int(digits) if digits.isdigit() else -1


def _first_difference(a: Revision, b: Revision) -> int | None:
    lo, hi = max(a.address, b.address), min(a.end, b.end)
    x = np.frombuffer(a.data, np.uint8, hi - lo, lo - a.address)
    y = np.frombuffer(b.data, np.uint8, hi - lo, lo - b.address)
    differ = np.flatnonzero(x != y)
    return lo + int(differ[0]) if differ.size else None
