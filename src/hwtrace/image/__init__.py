"""Memory images: what was mapped where, for instruction-flow decoding.

An Intel PT trace says which way each branch went, not which instructions
ran: a decoder reads the code itself from an :class:`Image`, the address
spaces of the traced system (libipt's ``pt_image``).  Sections come from ELF
files (:meth:`Image.add_elf`), raw dumps (:meth:`Image.add_raw`, ptxed's
``--raw``) or memory (:meth:`Image.add_section`), each in an address space
named by an :class:`Asid` (CR3 and VMCS base; unset fields are wildcards).

Overlaps behave as in libipt: a section added later replaces the part of
every earlier section it overlaps whose asid matches its own (the older one
is truncated or split in two), so the newest mapping wins, as after an
``mmap`` over an existing mapping.

Reads are O(log n): per asid the sections are kept sorted by address and
found by bisection.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator

from .elf import ElfFile, LoadedElf, Segment, load_elf, read_elf
from .sections import (
    ANY,
    Asid,
    ImageError,
    RawSpec,
    Section,
    map_file,
    parse_c_uint,
    parse_elf_spec,
    parse_raw_spec,
)
from .symbols import FUNCTION, OBJECT, SymbolTable

__all__ = [
    "ANY",
    "FUNCTION",
    "OBJECT",
    "Asid",
    "ElfFile",
    "Image",
    "ImageError",
    "LoadedElf",
    "RawSpec",
    "Section",
    "Segment",
    "SymbolTable",
    "load_elf",
    "map_file",
    "parse_c_uint",
    "parse_elf_spec",
    "parse_raw_spec",
    "read_elf",
]


class _Space:
    """The sections of one exact asid: sorted, never overlapping."""

    __slots__ = ("ends", "generations", "sections", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.sections: list[Section] = []
        self.generations: list[int] = []  # when each was added; pieces keep it

    def insert(self, section: Section, generation: int) -> None:
        i = bisect_right(self.starts, section.address)
        self.starts.insert(i, section.address)
        self.ends.insert(i, section.end)
        self.sections.insert(i, section)
        self.generations.insert(i, generation)

    def cut(self, begin: int, end: int) -> None:
        """Remove the bytes ``begin .. end``, keeping what sticks out on either side."""
        i = bisect_right(self.starts, begin) - 1
        if i < 0 or self.ends[i] <= begin:
            i += 1
        j = i
        while j < len(self.starts) and self.starts[j] < end:
            j += 1
        if i == j:
            return
        pieces: list[tuple[Section, int]] = []
        for k in range(i, j):
            old, generation = self.sections[k], self.generations[k]
            if old.address < begin:
                pieces.append((old.slice(old.address, begin), generation))
            if end < old.end:
                pieces.append((old.slice(end, old.end), generation))
        self.starts[i:j] = [p.address for p, _ in pieces]
        self.ends[i:j] = [p.end for p, _ in pieces]
        self.sections[i:j] = [p for p, _ in pieces]
        self.generations[i:j] = [g for _, g in pieces]

    def find(self, address: int) -> int:
        """The index of the section holding ``address``, or -1."""
        i = bisect_right(self.starts, address) - 1
        return i if i >= 0 and address < self.ends[i] else -1


class Image:
    """A collection of address spaces, each a set of non-overlapping sections.

    Queries take the asid the decoder is in.  A fully specified asid sees its
    own sections and the wildcard ones; a query with wildcards sees every
    address space it matches, and where several of those map an address the
    most recently added section is used.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._spaces: dict[Asid, _Space] = {}
        self._matching: dict[Asid, list[_Space]] = {}
        self._last: tuple[Asid | None, list[_Space]] = (None, [])
        self._generation = 0  # (see version)
        self._loads: list[LoadedElf] = []
        self._symbols: SymbolTable | None = None

    # -- building -------------------------------------------------------------

    def add_section(self, section: Section, asid: Asid = ANY) -> Section:
        """Map ``section`` in ``asid``; it replaces what it overlaps in matching asids."""
        for key, space in self._spaces.items():
            if key.matches(asid):
                space.cut(section.address, section.end)
        space = self._spaces.get(asid)
        if space is None:
            space = self._spaces[asid] = _Space()
            self._forget_matches()
        self._generation += 1
        space.insert(section, self._generation)
        return section

    @property
    def version(self) -> int:
        """A number that changes whenever a section is mapped or unmapped:
        what a reader copied of the image's bytes holds while it stays."""
        return self._generation

    def add_raw(
        self,
        filename: str | os.PathLike[str],
        offset: int = 0,
        size: int | None = None,
        address: int = 0,
        asid: Asid = ANY,
        *,
        mapped: str | None = None,
    ) -> Section:
        """Map bytes ``offset .. offset+size`` of a file (to its end when size is None)
        at ``address``; the file is memory-mapped, not read.  ``mapped``: the
        path a recording mapped, where ``filename`` is a copy of it
        (:class:`~hwtrace.image.sections.Section`)."""
        section = Section.from_file(filename, offset, size, address, mapped=mapped)
        return self.add_section(section, asid)

    def add_raw_spec(self, spec: str, asid: Asid = ANY) -> Section:
        """Map a ptxed ``--raw <file>[:<from>[-<to>]]:<base>`` argument."""
        return self.add_raw(*parse_raw_spec(spec), asid=asid)

    def add_elf(
        self,
        path: str | os.PathLike[str],
        load_address: int | None = None,
        asid: Asid = ANY,
        *,
        executable_only: bool = False,
        mapped: str | None = None,
    ) -> LoadedElf:
        """Map an ELF file's ``PT_LOAD`` segments and add its symbols.

        Every segment with file bytes is mapped (as ptxed does; only the
        executable ones with ``executable_only``).  ``load_address`` places
        the lowest segment (bias = load_address - lowest vaddr); None keeps
        the link addresses.  ``mapped``: the path a recording mapped, where
        ``path`` is a copy of it (named after it).
        """
        loaded = load_elf(path, load_address, asid, executable_only=executable_only,
                          mapped=mapped)  # fmt: skip
        for section in loaded.sections:
            self.add_section(section, asid)
        self._loads.append(loaded)
        self._symbols = None
        return loaded

    def remove(self, filename: str | os.PathLike[str] | None = None, asid: Asid = ANY) -> int:
        """Unmap the sections of ``filename`` (all files when None) in the address
        spaces matching ``asid``; returns how many sections went."""
        wanted = None if filename is None else os.fspath(filename)
        removed = 0
        for key in list(self._spaces):
            if not key.matches(asid):
                continue
            space = self._spaces[key]
            kept = [
                (s, g)
                for s, g in zip(space.sections, space.generations, strict=True)
                if wanted is not None and s.filename != wanted
            ]
            removed += len(space.sections) - len(kept)
            if kept:
                space.starts = [s.address for s, _ in kept]
                space.ends = [s.end for s, _ in kept]
                space.sections = [s for s, _ in kept]
                space.generations = [g for _, g in kept]
            else:
                del self._spaces[key]
        self._generation += 1
        self._forget_matches()
        loads = [
            load
            for load in self._loads
            if not (load.asid.matches(asid) and (wanted is None or load.path == wanted))
        ]
        if len(loads) != len(self._loads):
            self._loads = loads
            self._symbols = None
        return removed

    def copy(self, name: str | None = None) -> Image:
        """A new image with the same mappings and symbols (sections are shared, not copied)."""
        other = Image(self.name if name is None else name)
        for key, space in self._spaces.items():
            clone = other._spaces[key] = _Space()
            clone.starts = list(space.starts)
            clone.ends = list(space.ends)
            clone.sections = list(space.sections)
            clone.generations = list(space.generations)
        other._generation = self._generation
        other._loads = list(self._loads)
        return other

    # -- reading (the decoder's hot path) --------------------------------------

    def _forget_matches(self) -> None:
        self._matching.clear()
        self._last = (None, [])

    def _spaces_for(self, asid: Asid) -> list[_Space]:
        spaces = self._matching.get(asid)
        if spaces is None:
            spaces = [space for key, space in self._spaces.items() if key.matches(asid)]
            self._matching[asid] = spaces
        self._last = (asid, spaces)
        return spaces

    def find(self, address: int, asid: Asid = ANY) -> Section | None:
        """The section mapping ``address`` in ``asid``, or None."""
        last_asid, spaces = self._last
        if asid is not last_asid:  # decoders keep passing the same Asid object
            spaces = self._spaces_for(asid)
        if len(spaces) == 1:
            space = spaces[0]
            i = bisect_right(space.starts, address) - 1
            if i >= 0 and address < space.ends[i]:
                return space.sections[i]
            return None
        best: Section | None = None
        best_generation = -1
        for space in spaces:
            i = bisect_right(space.starts, address) - 1
            if i >= 0 and address < space.ends[i] and space.generations[i] > best_generation:
                best = space.sections[i]
                best_generation = space.generations[i]
        return best

    def sole_section(self, address: int, asid: Asid = ANY) -> Section | None:
        """The section mapping ``address`` when it alone is what reads in
        its range see (``asid`` matches one address space, whose sections
        never overlap), else None: a decoder may then read a stretch of
        code straight from the section's bytes."""
        last_asid, spaces = self._last
        if asid is not last_asid:
            spaces = self._spaces_for(asid)
        if len(spaces) != 1:
            return None
        i = spaces[0].find(address)
        return spaces[0].sections[i] if i >= 0 else None

    def read(self, address: int, size: int, asid: Asid = ANY) -> bytes:
        """Up to ``size`` bytes at ``address``: fewer where the section ends, b"" if unmapped.

        Like libipt's pt_image_read, a read never continues into the next
        section; read again at the returned end for more.
        """
        section = self.find(address, asid)
        if section is None or size <= 0:
            return b""
        start = address - section.address
        return section.data[start : start + size].tobytes()

    def read_span(self, address: int, size: int, asid: Asid = ANY) -> bytes:
        """Up to ``size`` bytes at ``address``, on across sections while they
        are contiguous (fewer where the mapped bytes end)."""
        out = b""
        while len(out) < size:
            piece = self.read(address + len(out), size - len(out), asid)
            if not piece:
                break
            out += piece
        return out

    # -- looking at it ----------------------------------------------------------

    def added_since(self, other: Image) -> list[tuple[int, int]] | None:
        """The address ranges this image maps beyond ``other`` when it maps
        every section of ``other`` as ``other`` does (the very section
        objects: an image grown from a copy of ``other``), else None."""
        if self._spaces.keys() != other._spaces.keys():
            return None
        added: list[tuple[int, int]] = []
        for key, space in self._spaces.items():
            old = other._spaces[key].sections
            mine = {id(s) for s in space.sections}
            if any(id(s) not in mine for s in old):
                return None
            theirs = {id(s) for s in old}
            added += [(s.address, s.end) for s in space.sections if id(s) not in theirs]
        return added

    def __len__(self) -> int:
        return sum(len(space.sections) for space in self._spaces.values())

    def __iter__(self) -> Iterator[Section]:
        """The sections in address order (across all address spaces)."""
        for _, section in self.mappings():
            yield section

    def mappings(self) -> Iterator[tuple[Asid, Section]]:
        """``(asid, section)`` pairs in address order."""
        pairs = [(s, key) for key, space in self._spaces.items() for s in space.sections]
        pairs.sort(key=lambda p: (p[0].address, p[0].end))
        for section, key in pairs:
            yield key, section

    @property
    def loaded(self) -> tuple[LoadedElf, ...]:
        """The ELF files added, in order, with their bias and relocated symbols."""
        return tuple(self._loads)

    @property
    def symbols(self) -> SymbolTable:
        """The symbols of every loaded ELF file, relocated; ``module`` names the file."""
        if self._symbols is None:
            self._symbols = SymbolTable.merge(load.symbols for load in self._loads)
        return self._symbols

    def symbolize(self, address: int, asid: Asid = ANY, with_module: bool = True) -> str:
        """``"libc.so.6!memcpy+0x10"`` for an address, or ``""``.

        The file mapped at the address in ``asid`` decides whose symbols are
        used, so the same address in two processes resolves correctly.
        """
        section = self.find(address, asid)
        if section is not None and section.filename is not None:
            for load in reversed(self._loads):
                if load.path == section.filename and load.asid.matches(asid):
                    text = load.symbols.symbolize(address, with_module)
                    if text:
                        return text
        return self.symbols.symbolize(address, with_module)

    def locate(self, address: int, asid: Asid = ANY) -> str:
        """``"liblttng-ust.so.1+0x2f2f0"`` (the file's name and the address's
        offset in it) for an address no symbol covers, ``"[vdso]+0x9f0"``
        or ``"name+0x10"`` for a section of no file, ``""`` when unmapped:
        where a stripped library's local function is, as ``backtrace_symbols``
        and perf's ``[unknown] (dso)`` say it."""
        section = self.find(address, asid)
        if section is None:
            return ""
        where = os.path.basename(section.path) if section.path else section.name
        return f"{where or '?'}+{address - section.address + section.offset:#x}"

    def __repr__(self) -> str:
        label = f"{self.name!r}, " if self.name else ""
        return f"Image({label}{len(self)} sections, {len(self._spaces)} address spaces)"
