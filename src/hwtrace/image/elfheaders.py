"""ELF headers as numpy arrays: the file header, program headers, section
headers and their names, notes and relocation tables.

The tables are fixed-size records (System V ABI, "ELF-64 Object File
Format"), so each is one structured view of the file's memory map: reading
the headers of a shared library costs microseconds, where a parser that
builds an object per header (pyelftools) costs milliseconds per file, paid
by every command that opens a recording of a program linked against a few
libraries.  Every offset and size is checked against the file first: a
damaged file gets one :class:`~hwtrace.image.sections.ImageError` naming
the file, the table and the offset.
"""

from __future__ import annotations

import os

import numpy as np

from .sections import ImageError, map_file

__all__ = ["ElfHeaders"]

PT_LOAD = 1
SHT_SYMTAB, SHT_NOTE, SHT_NOBITS, SHT_DYNSYM = 2, 7, 8, 11
SHN_XINDEX = 0xFFFF

_TYPES = {0: "ET_NONE", 1: "ET_REL", 2: "ET_EXEC", 3: "ET_DYN", 4: "ET_CORE"}
_MACHINES = {
    3: "EM_386", 8: "EM_MIPS", 20: "EM_PPC", 21: "EM_PPC64", 22: "EM_S390", 40: "EM_ARM",
    62: "EM_X86_64", 183: "EM_AARCH64", 243: "EM_RISCV", 247: "EM_BPF",
}  # fmt: skip

_HEADER = {
    64: [("ident", "V16"), ("type", "u2"), ("machine", "u2"), ("version", "u4"),
         ("entry", "u8"), ("phoff", "u8"), ("shoff", "u8"), ("flags", "u4"),
         ("ehsize", "u2"), ("phentsize", "u2"), ("phnum", "u2"), ("shentsize", "u2"),
         ("shnum", "u2"), ("shstrndx", "u2")],
    32: [("ident", "V16"), ("type", "u2"), ("machine", "u2"), ("version", "u4"),
         ("entry", "u4"), ("phoff", "u4"), ("shoff", "u4"), ("flags", "u4"),
         ("ehsize", "u2"), ("phentsize", "u2"), ("phnum", "u2"), ("shentsize", "u2"),
         ("shnum", "u2"), ("shstrndx", "u2")],
}  # fmt: skip
_PROGRAM = {
    64: [("p_type", "u4"), ("p_flags", "u4"), ("p_offset", "u8"), ("p_vaddr", "u8"),
         ("p_paddr", "u8"), ("p_filesz", "u8"), ("p_memsz", "u8"), ("p_align", "u8")],
    32: [("p_type", "u4"), ("p_offset", "u4"), ("p_vaddr", "u4"), ("p_paddr", "u4"),
         ("p_filesz", "u4"), ("p_memsz", "u4"), ("p_flags", "u4"), ("p_align", "u4")],
}  # fmt: skip
_SECTION = {
    64: [("sh_name", "u4"), ("sh_type", "u4"), ("sh_flags", "u8"), ("sh_addr", "u8"),
         ("sh_offset", "u8"), ("sh_size", "u8"), ("sh_link", "u4"), ("sh_info", "u4"),
         ("sh_addralign", "u8"), ("sh_entsize", "u8")],
    32: [("sh_name", "u4"), ("sh_type", "u4"), ("sh_flags", "u4"), ("sh_addr", "u4"),
         ("sh_offset", "u4"), ("sh_size", "u4"), ("sh_link", "u4"), ("sh_info", "u4"),
         ("sh_addralign", "u4"), ("sh_entsize", "u4")],
}  # fmt: skip
_RELA = {
    64: [("r_offset", "u8"), ("r_info", "u8"), ("r_addend", "i8")],
    32: [("r_offset", "u4"), ("r_info", "u4"), ("r_addend", "i4")],
}
NT_GNU_BUILD_ID = 3


class ElfHeaders:
    """The headers of the ELF file at ``path`` (its bytes: ``buf``, the
    file's read-only map when not given)."""

    def __init__(self, path: str | os.PathLike[str], buf: np.ndarray | None = None) -> None:
        self.path = os.fspath(path)
        self.buf = map_file(self.path) if buf is None else buf
        buf = self.buf
        total = buf.shape[0]
        if total < 4 or bytes(buf[:4]) != b"\x7fELF":
            raise ImageError(f"{self.path}: not an ELF file")
        if total < 6:
            raise ImageError(f"{self.path}: truncated ELF file: {total} bytes")
        if buf[4] not in (1, 2) or buf[5] not in (1, 2):
            raise ImageError(
                f"{self.path}: unsupported ELF class {int(buf[4])} / data encoding {int(buf[5])}"
            )
        self.elfclass = 64 if buf[4] == 2 else 32
        self.little = bool(buf[5] == 1)
        header = self._dtype(_HEADER)
        if total < header.itemsize:
            raise ImageError(
                f"{self.path}: truncated ELF file: the header needs {header.itemsize} bytes, "
                f"the file has {total}"
            )
        h = buf[: header.itemsize].view(header)[0]
        self.e_type = int(h["type"])
        self.e_machine = int(h["machine"])
        self.program_headers = self._table(
            "program headers", _PROGRAM, int(h["phoff"]), int(h["phentsize"]), int(h["phnum"])
        )
        shoff, shnum, shstrndx = int(h["shoff"]), int(h["shnum"]), int(h["shstrndx"])
        if (shoff and shnum == 0) or shstrndx == SHN_XINDEX:
            # Too many sections for the header's fields: section 0 holds them.
            first = self._table("section headers", _SECTION, shoff, int(h["shentsize"]), 1)
            if first.shape[0]:
                shnum = shnum or int(first["sh_size"][0])
                if shstrndx == SHN_XINDEX:
                    shstrndx = int(first["sh_link"][0])
        self.section_headers = self._table(
            "section headers", _SECTION, shoff, int(h["shentsize"]), shnum
        )
        # (a message about the names' own section names it by number)
        self.section_names = [""] * self.section_headers.shape[0]
        self.section_names = self._section_names(shstrndx)
        self._by_name = {}
        for i, name in enumerate(self.section_names):
            self._by_name.setdefault(name, i)

    @property
    def elf_type(self) -> str:
        """``ET_EXEC``, ``ET_DYN``, ... (the number, as text, for others)."""
        return _TYPES.get(self.e_type, str(self.e_type))

    @property
    def machine(self) -> str:
        """``EM_X86_64``, ... (the number, as text, for others)."""
        return _MACHINES.get(self.e_machine, str(self.e_machine))

    def _dtype(self, fields: dict) -> np.dtype:
        return np.dtype(fields[self.elfclass]).newbyteorder("<" if self.little else ">")

    def _table(self, what: str, fields: dict, offset: int, entsize: int, count: int) -> np.ndarray:
        dtype = self._dtype(fields)
        if offset == 0 or count == 0:
            return np.zeros(0, dtype)
        if entsize != dtype.itemsize:
            raise ImageError(
                f"{self.path}: malformed ELF file: {what} of {entsize} bytes each "
                f"(ELF{self.elfclass} has {dtype.itemsize})"
            )
        end = offset + entsize * count
        if end > self.buf.shape[0]:
            raise ImageError(
                f"{self.path}: truncated ELF file: the {what} at offset {offset:#x} end at "
                f"{end:#x}, beyond the end of the file ({self.buf.shape[0]:#x})"
            )
        return self.buf[offset:end].view(dtype)

    def _section_names(self, shstrndx: int) -> list[str]:
        n = self.section_headers.shape[0]
        if n == 0 or shstrndx == 0 or shstrndx >= n:
            return [""] * n
        strtab = self.section_bytes(shstrndx)
        return [c_string(strtab, int(o)) for o in self.section_headers["sh_name"]]

    def section_index(self, name: str) -> int:
        """The index of the first section named ``name``, or -1."""
        return self._by_name.get(name, -1)

    def section_bytes(self, index: int) -> bytes:
        """Section ``index``'s bytes in the file (none for ``SHT_NOBITS``)."""
        s = self.section_headers[index]
        if int(s["sh_type"]) == SHT_NOBITS:
            return b""
        return bytes(self._range(index, int(s["sh_offset"]), int(s["sh_size"])))

    def _range(self, index: int, offset: int, size: int) -> np.ndarray:
        if offset + size > self.buf.shape[0]:
            name = self.section_names[index] or f"#{index}"
            raise ImageError(
                f"{self.path}: truncated ELF file: section {name} at offset {offset:#x} "
                f"(size {size:#x}) extends beyond the end of the file ({self.buf.shape[0]:#x})"
            )
        return self.buf[offset : offset + size]

    def notes(self) -> list[tuple[bytes, int, bytes]]:
        """``(name, type, descriptor)`` of every note of the note sections
        (or, in a file without sections, of the ``PT_NOTE`` segments)."""
        out: list[tuple[bytes, int, bytes]] = []
        order = "<" if self.little else ">"
        spans = [
            (int(s["sh_offset"]), int(s["sh_size"]), int(s["sh_addralign"]))
            for s in self.section_headers
            if int(s["sh_type"]) == SHT_NOTE
        ]
        if not spans:
            spans = [
                (int(p["p_offset"]), int(p["p_filesz"]), int(p["p_align"]))
                for p in self.program_headers
                if int(p["p_type"]) == 4  # PT_NOTE
            ]
        total = self.buf.shape[0]
        for offset, size, align in spans:
            if offset + size > total:
                continue
            data = bytes(self.buf[offset : offset + size])
            step = 8 if align == 8 else 4
            p = 0
            while p + 12 <= len(data):
                namesz, descsz, kind = np.frombuffer(data, f"{order}u4", 3, p).tolist()
                name_at = p + 12
                desc_at = name_at + -(-namesz // step) * step
                end = desc_at + -(-descsz // step) * step
                if desc_at + descsz > len(data):
                    break
                out.append((data[name_at : name_at + namesz].rstrip(b"\0"), kind,
                            data[desc_at : desc_at + descsz]))  # fmt: skip
                p = end
        return out

    def build_id(self) -> bytes | None:
        """The GNU build id (``NT_GNU_BUILD_ID``), or None."""
        for name, kind, desc in self.notes():
            if name == b"GNU" and kind == NT_GNU_BUILD_ID:
                return desc
        return None

    def relocations(self, index: int) -> np.ndarray:
        """The entries of ``SHT_RELA`` section ``index`` (``r_offset``,
        ``r_info``, ``r_addend``)."""
        s = self.section_headers[index]
        dtype = self._dtype(_RELA)
        size, entsize = int(s["sh_size"]), int(s["sh_entsize"])
        if entsize != dtype.itemsize:
            raise ImageError(
                f"{self.path}: malformed relocation section {self.section_names[index]} "
                f"(entry size {entsize})"
            )
        return self._range(index, int(s["sh_offset"]), size - size % entsize).view(dtype)

    def symbol_tables(self) -> list[tuple[str, int, int, int, int, int]]:
        """``.symtab`` and ``.dynsym``: (name, offset, size, entry size,
        offset and size of the string table they name into)."""
        out = []
        n = self.section_headers.shape[0]
        for i, s in enumerate(self.section_headers):
            if int(s["sh_type"]) not in (SHT_SYMTAB, SHT_DYNSYM):
                continue
            link = int(s["sh_link"])
            if link >= n:
                raise ImageError(
                    f"{self.path}: malformed symbol table {self.section_names[i]}: "
                    f"string table {link} of {n} sections"
                )
            strtab = self.section_headers[link]
            out.append((self.section_names[i], int(s["sh_offset"]), int(s["sh_size"]),
                        int(s["sh_entsize"]), int(strtab["sh_offset"]),
                        int(strtab["sh_size"])))  # fmt: skip
        return out


def c_string(table: bytes, offset: int) -> str:
    """The NUL-terminated string at ``offset`` of a string table."""
    if offset >= len(table):
        return ""
    stop = table.find(b"\0", offset)
    return table[offset : stop if stop >= 0 else len(table)].decode("utf-8", "replace")
