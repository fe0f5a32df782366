"""A live process's address space as ``/proc/PID/maps`` shows it, and the
ELF files mapped into it with their symbols at their load addresses.

Both the software recorder and the dynamic tracepoints resolve names
(``func``, ``module!func``) in a running process; this is where that lives.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

from .elf import read_elf
from .sections import ImageError
from .symbols import SymbolTable

__all__ = [
    "FunctionSymbol",
    "Mapping",
    "ProcessModules",
    "code_slack",
    "load_bias",
    "read_maps",
]

PAGE = 0x1000


@dataclass(frozen=True)
class Mapping:
    """One line of ``/proc/PID/maps``."""

    start: int
    end: int
    prot: str  # "r-xp"
    offset: int  # file offset (page offset * page size)
    inode: int
    path: str  # "" for anonymous memory, "[vdso]", "[stack]" ...

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def executable(self) -> bool:
        return "x" in self.prot


def read_maps(pid: int) -> list[Mapping]:
    """The mappings of a process (``/proc/PID/maps``), in address order."""
    out = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = parts[0].split("-")
            out.append(
                Mapping(
                    start=int(lo, 16),
                    end=int(hi, 16),
                    prot=parts[1],
                    offset=int(parts[2], 16),
                    inode=int(parts[4]),
                    path=parts[5].strip() if len(parts) > 5 else "",
                )
            )
    return out


AT_ENTRY = 9  # the auxiliary vector's program entry point


def program_entry(pid: int) -> int | None:
    """The entry point of the program process ``pid`` runs (``AT_ENTRY`` of
    ``/proc/PID/auxv``), or None."""
    with open(f"/proc/{pid}/auxv", "rb") as f:
        raw = f.read()
    for i in range(0, len(raw) - 15, 16):
        if int.from_bytes(raw[i : i + 8], "little") == AT_ENTRY:
            return int.from_bytes(raw[i + 8 : i + 16], "little")
    return None


def _alias(path: str, name: str) -> tuple[int, int] | None:
    """``(link address, size)`` of function ``name`` in the ELF symbol
    tables of ``path`` (pyelftools), or None."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile

    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            for section in (elf.get_section_by_name(".symtab"), elf.get_section_by_name(".dynsym")):
                if section is None:
                    continue
                for sym in section.get_symbol_by_name(name) or ():
                    if sym["st_info"]["type"] in ("STT_FUNC", "STT_GNU_IFUNC") and sym["st_size"]:
                        return sym["st_value"], sym["st_size"]
    except (OSError, ELFError):
        pass
    return None


def load_bias(maps: list[Mapping], path: str, min_vaddr: int) -> int | None:
    """Where the ELF file ``path`` is loaded: address minus link address."""
    first = [m for m in maps if m.path == path and m.offset == 0]
    if not first:
        return None
    return min(m.start for m in first) - (min_vaddr & ~(PAGE - 1))


@dataclass(frozen=True)
class FunctionSymbol:
    """A function of a mapped file, at its address in the process."""

    name: str
    path: str  # the mapped file
    start: int
    size: int
    bias: int  # address in the process minus link address

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def module(self) -> str:
        return os.path.basename(self.path)


class ProcessModules:
    """The ELF files mapped executable into a process, symbols read on demand.

    A plain name is looked up in the main executable first, then in the
    other files in the order of their first mapping; ``module!name`` looks
    in the file whose base name is ``module`` (``libc.so.6!qsort``).
    """

    def __init__(self, pid: int, maps: list[Mapping] | None = None) -> None:
        self.pid = pid
        self.maps = read_maps(pid) if maps is None else maps
        try:
            exe = os.readlink(f"/proc/{pid}/exe")
        except OSError:
            exe = ""
        files: list[str] = []
        for m in self.maps:
            if m.executable and m.path.startswith("/") and m.path not in files:
                files.append(m.path)
        files.sort(key=lambda p: p != exe)
        self.files = files
        self._tables: dict[str, tuple[SymbolTable, int] | None] = {}

    def symbols(self, path: str) -> tuple[SymbolTable, int] | None:
        """The function symbols of a mapped file (link addresses) and its load
        bias; None when the file cannot be read as ELF."""
        if path not in self._tables:
            try:
                elf = read_elf(path)
            except ImageError:
                self._tables[path] = None
            else:
                bias = load_bias(self.maps, path, elf.min_vaddr)
                self._tables[path] = None if bias is None else (elf.symbols.functions, bias)
        return self._tables[path]

    def _symbol_tables(self, module: str) -> Iterator[tuple[str, tuple[SymbolTable, int]]]:
        """(path, (function table, load bias)) of the mapped files named
        ``module`` (every file when empty) that have a symbol table.  A
        library's soname names its file too (``liblzma.so.5`` is
        ``liblzma.so.5.4.1``)."""
        for path in self.files:
            base = os.path.basename(path)
            if module and base != module and not base.startswith(module + "."):
                continue
            entry = self.symbols(path)
            if entry is not None:
                yield path, entry

    def find_function(self, spec: str) -> FunctionSymbol | None:
        """The function named ``name`` or ``module!name``, or None."""
        module, _, name = spec.rpartition("!")
        for path, (table, bias) in self._symbol_tables(module):
            for start, size, sym, _ in table:
                if sym == name and size > 0:
                    return FunctionSymbol(name, path, start + bias, size, bias)
        # An alias the symbol table merged away (libc's getpid is __getpid's).
        for path, (_, bias) in self._symbol_tables(module):
            found = _alias(path, name)
            if found is not None:
                start, size = found
                return FunctionSymbol(name, path, start + bias, size, bias)
        return None

    def module_at(self, address: int) -> Mapping | None:
        """The mapping that holds ``address``, or None."""
        for m in self.maps:
            if m.start <= address < m.end:
                return m
        return None

    def function_at(self, address: int) -> FunctionSymbol | None:
        """The function whose extent holds ``address``, or None."""
        m = self.module_at(address)
        if m is None or not m.path.startswith("/"):
            return None
        entry = self.symbols(m.path)
        if entry is None:
            return None
        table, bias = entry
        index, _ = table.lookup([address - bias])
        i = int(index[0])
        if i < 0:
            return None
        start = int(table.start[i]) + bias
        return FunctionSymbol(table.name(i), m.path, start, int(table.size[i]), bias)


def syscall_instruction(pid: int, mem: int) -> int | None:
    """The address of a ``syscall`` instruction (``0f 05``) in process
    ``pid``'s code (its vDSO's first; ``mem``: its ``/proc/PID/mem`` open),
    for making one of its stopped threads run a system call; None if none."""
    maps = sorted(read_maps(pid), key=lambda m: m.path != "[vdso]")
    for m in maps:
        if not m.executable or m.path == "[vsyscall]":
            continue
        try:
            data = os.pread(mem, min(m.length, 1 << 22), m.start)
        except OSError:
            continue
        at = data.find(b"\x0f\x05")
        if at >= 0:
            return m.start + at
    return None


def _elf_extent(head: bytes, file_offset: int | None) -> int | None:
    """Where the bytes an ELF image uses end.  ``file_offset`` None: the
    image is loaded whole from its start (a vDSO): the end of every
    segment, section and header table, as an offset.  Else: the end, as an
    offset from the page at ``file_offset``, of the executable ``PT_LOAD``
    segment mapped from that page.  None when ``head`` is not such an ELF
    (64-bit, little-endian)."""
    if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    u16 = lambda o: int.from_bytes(head[o : o + 2], "little")  # noqa: E731
    u64 = lambda o: int.from_bytes(head[o : o + 8], "little")  # noqa: E731
    phoff, shoff, phent, phnum, shent, shnum = (
        u64(0x20), u64(0x28), u16(0x36), u16(0x38), u16(0x3A), u16(0x3C),
    )  # fmt: skip
    if phoff + phent * phnum > len(head):
        return None
    end = max(64, phoff + phent * phnum, shoff + shent * shnum)
    for i in range(phnum):
        p = phoff + i * phent
        p_type, p_flags = int.from_bytes(head[p : p + 4], "little"), head[p + 4]
        offset, filesz, memsz = u64(p + 8), u64(p + 32), u64(p + 40)
        if p_type != 1:  # PT_LOAD
            continue
        if file_offset is None:
            end = max(end, offset + filesz, u64(p + 16) + memsz)
        elif p_flags & 1 and offset & ~(PAGE - 1) == file_offset:  # PF_X, from that page
            return offset - file_offset + memsz
    if file_offset is not None:
        return None
    if shoff + shent * shnum <= len(head):
        for i in range(shnum):
            sh = shoff + i * shent
            if int.from_bytes(head[sh + 4 : sh + 8], "little") != 8:  # not SHT_NOBITS
                end = max(end, u64(sh + 24) + u64(sh + 32))
    return end


def code_slack(pid: int, mem: int, size: int) -> int | None:
    """``size`` bytes of process ``pid``'s executable memory that nothing
    in it uses, 16-byte aligned: the padding of its vDSO's pages after the
    image (segments, sections, headers), or of the last page of an ELF
    file's executable segment after the segment, still all zero bytes.  A
    debugger's scratch code goes there (``mem``: its ``/proc/PID/mem``
    open); None if none."""
    maps = sorted(read_maps(pid), key=lambda m: m.path != "[vdso]")
    for m in maps:
        if not m.executable or m.path == "[vsyscall]":
            continue
        try:
            if m.path == "[vdso]":
                end = _elf_extent(os.pread(mem, min(m.length, 1 << 16), m.start), None)
            elif m.path.startswith("/"):
                with open(f"/proc/{pid}/map_files/{m.start:x}-{m.end:x}", "rb") as f:
                    end = _elf_extent(f.read(1 << 16), m.offset)
            else:
                continue
        except OSError:
            continue
        if end is None:
            continue
        at = (m.start + end + 15) & ~15
        if at + size > m.end:
            continue
        try:
            if os.pread(mem, size, at).count(0) == size:  # not another tool's already
                return at
        except OSError:
            continue
    return None
