"""An ELF file's symbols as Linux perf loads them, so that a listing names
every address as ``perf script`` does.

perf's rules (``tools/perf/util/symbol-elf.c`` ``dso__load_sym`` and
``dso__synthesize_plt_symbols``, ``tools/perf/util/symbol.c``
``symbols__fixup_end``, ``symbols__fixup_duplicate`` and
``choose_best_symbol``):

- one table: ``.symtab`` (the file's, else a detached debug file's), else
  ``.dynsym``; functions and objects with a name and a section, and
  untyped labels in a section whose name holds ``text`` (not hidden);
  symbols of sections that take no memory (no ``SHF_ALLOC``) are left out;
- zero sizes are fixed up in address order: a symbol whose size is 0 ends
  where the next one starts (the last at the next page boundary but one),
  which names ``.init``/``.plt`` code ``_init+0x38``;
- of symbols starting at the same address one is kept: one with a size,
  then not weak, then global, then with fewer leading underscores, then
  the longer name; on a tie the one first in the table;
- PLT entries are named ``name@plt`` from the relocations of ``.rela.plt``
  (``.rel.plt``) against ``.dynsym``, one ``.plt`` entry each after the
  header (entry and header size: ``.plt``'s ``sh_entsize``).

hwtrace's own tables (:mod:`hwtrace.image.elf`) keep sized symbols only
and prefer the short public name; this one is for output that must read as
perf's does.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from ._perftree import new_tree, perf_tree, tree_erase, tree_first, tree_insert, tree_next
from .elf import (
    _SYM_FIELDS,
    SHN_UNDEF,
    STT_FUNC,
    STT_GNU_IFUNC,
    STT_OBJECT,
    _detached_debug,
    c_strings,
)
from .elfheaders import ElfHeaders
from .sections import ImageError
from .symbols import FUNCTION, OBJECT, SymbolTable

__all__ = ["perf_symbols"]

STT_NOTYPE = 0
SHN_ABS = 0xFFF1
STV_INTERNAL, STV_HIDDEN = 1, 2
SHF_ALLOC = 2
PAGE = 4096


class _Elf:
    """The parts of one ELF file the loading needs."""

    def __init__(self, path: str) -> None:
        self.path = path
        head = ElfHeaders(path)
        self.buf = head.buf
        self.elfclass = head.elfclass
        self.little = head.little
        self.build_id = head.build_id()
        self.sections = [
            (name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_entsize, sh_link)
            for name, (_, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, _, _,
                       sh_entsize) in zip(head.section_names,
                                          head.section_headers.tolist(), strict=True)
        ]  # fmt: skip

    def index(self, name: str) -> int:
        return next((i for i, s in enumerate(self.sections) if s[0] == name), -1)

    def table(self, index: int) -> tuple[np.ndarray, bytes]:
        """The entries of symbol table ``index`` and its string table."""
        _, _, _, _, offset, size, entsize, link = self.sections[index]
        dtype = np.dtype(_SYM_FIELDS[self.elfclass]).newbyteorder("<" if self.little else ">")
        total = self.buf.shape[0]
        if entsize != dtype.itemsize or size % entsize or offset + size > total:
            raise ImageError(f"{self.path}: malformed symbol table {self.sections[index][0]}")
        strtab = self.sections[link]
        if strtab[4] + strtab[5] > total:
            raise ImageError(f"{self.path}: string table {strtab[0]} beyond the file's end")
        entries = self.buf[offset : offset + size].view(dtype)
        return entries, bytes(self.buf[strtab[4] : strtab[4] + strtab[5]])


def _load(src: _Elf) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray, np.ndarray]:
    """``dso__load_sym``'s selection: start, size, name, bind and whether an
    object, in table order."""
    entries, strtab = src.table(src.index(".symtab"))
    kind = entries["info"] & 0xF
    shndx = entries["shndx"].astype(np.int64)
    named = (entries["name"] != 0) & (shndx != SHN_UNDEF)
    typed = (kind == STT_FUNC) | (kind == STT_GNU_IFUNC) | (kind == STT_OBJECT)
    vis = entries["other"] & 3
    label = (kind == STT_NOTYPE) & (shndx != SHN_ABS) & (vis != STV_HIDDEN) & (vis != STV_INTERNAL)
    nsec = len(src.sections)
    in_section = shndx < nsec
    sec = np.where(in_section, shndx, 0)
    alloc = np.array([bool(s[2] & SHF_ALLOC) for s in src.sections], bool)
    text = np.array(["text" in s[0] for s in src.sections], bool)
    keep = named & in_section & alloc[sec] & (typed | (label & text[sec]))
    entries = entries[keep]
    return (
        entries["value"].astype(np.uint64),
        entries["size"].astype(np.uint64),
        c_strings(strtab, entries["name"]),
        (entries["info"] >> 4).astype(np.int64),
        (entries["info"] & 0xF) == STT_OBJECT,
    )


def _plt(runtime: _Elf) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """``dso__synthesize_plt_symbols``: a ``name@plt`` per PLT relocation."""
    none = (np.zeros(0, np.uint64), np.zeros(0, np.uint64), [])
    dynsym = runtime.index(".dynsym")
    rel = runtime.index(".rela.plt")
    rela = rel >= 0
    if rel < 0:
        rel = runtime.index(".rel.plt")
    plt = runtime.index(".plt")
    if dynsym < 0 or rel < 0 or plt < 0 or runtime.sections[rel][7] != dynsym:
        return none
    wide = runtime.elfclass == 64
    _, _, _, _, offset, size, entsize, _ = runtime.sections[rel]
    fields = [("offset", "u8" if wide else "u4"), ("info", "u8" if wide else "u4")]
    if rela:
        fields.append(("addend", "i8" if wide else "i4"))
    dtype = np.dtype(fields).newbyteorder("<" if runtime.little else ">")
    if entsize != dtype.itemsize or offset + size > runtime.buf.shape[0]:
        return none
    relocs = runtime.buf[offset : offset + size - size % entsize].view(dtype)
    index = (relocs["info"] >> (32 if wide else 8)).astype(np.int64)
    syms, strtab = runtime.table(dynsym)
    index = np.minimum(index, len(syms) - 1) if len(syms) else index[:0]
    names = [n + "@plt" for n in c_strings(strtab, syms["name"][index])]
    step = runtime.sections[plt][6]
    base = runtime.sections[plt][3] + step  # the PLT header is one entry
    start = base + step * np.arange(len(names), dtype=np.uint64)
    return start.astype(np.uint64), np.full(len(names), step, np.uint64), names


@functools.lru_cache(maxsize=64)
def perf_symbols(path: str) -> SymbolTable:
    """The symbols of the ELF file ``path`` at its link addresses, as perf
    loads them (see the module doc); module ``""``."""
    runtime = _Elf(os.fspath(path))
    syms = runtime
    if runtime.index(".symtab") < 0:
        debug = _detached_debug(runtime.build_id)
        if debug is not None:
            try:
                got = _Elf(debug)
                if got.index(".symtab") >= 0:
                    syms = got
            except (ImageError, OSError, ValueError):
                pass
    if syms.index(".symtab") < 0 and syms.index(".dynsym") < 0:
        return SymbolTable.empty()
    if syms.index(".symtab") < 0:  # perf falls back to the dynamic symbols
        entries_src = _DynAsSym(syms)
        start, size, names, bind, obj = _load(entries_src)
    else:
        start, size, names, bind, obj = _load(syms)
    n = start.shape[0]
    end = start + size
    if n:
        # symbols__fixup_end: in tree order (by start, equal starts as
        # inserted), a symbol of size 0 ends where the next starts.
        order = np.argsort(start, kind="stable")
        s_start, s_end = start[order], end[order]
        zero = s_start == s_end
        s_end = np.where(zero, np.append(s_start[1:], np.uint64(0)), s_end)
        if zero[-1]:
            page = np.uint64(PAGE)
            s_end[-1] = (s_start[-1] + page - np.uint64(1)) // page * page + page
        end[order] = s_end
    # PLT entries come after the fix-ups, with their own sizes.
    pstart, psize, pnames = _plt(runtime)
    start = np.ascontiguousarray(np.concatenate([start, pstart]), np.uint64)
    end = np.ascontiguousarray(np.concatenate([end, pstart + psize]), np.uint64)
    kinds = np.concatenate([np.where(obj, OBJECT, FUNCTION), np.full(len(pnames), FUNCTION)])
    underscores = np.array([len(m) - len(m.lstrip("_")) for m in names], np.int64)
    length = np.array([len(m) for m in names], np.int64)
    names = names + pnames
    keep = np.empty(start.shape[0], np.int64)
    count = perf_tree(
        start, end, np.ascontiguousarray(bind, np.uint8), underscores, length, n,
        *new_tree(start.shape[0]), keep,
    )  # fmt: skip
    keep = keep[:count]
    return SymbolTable(
        start[keep],
        (end - start)[keep],
        np.arange(count, dtype=np.int32),
        [names[i] for i in keep.tolist()],
        kinds[keep].astype(np.uint8),
    )


class _DynAsSym:
    """An :class:`_Elf` whose ``.dynsym`` stands in for ``.symtab``."""

    def __init__(self, src: _Elf) -> None:
        self._src = src
        self.sections = src.sections

    def index(self, name: str) -> int:
        return self._src.index(".dynsym" if name == ".symtab" else name)

    def table(self, index: int):
        return self._src.table(index)


class _RbTree:
    """perf's symbol tree node by node (:mod:`hwtrace.image._perftree`),
    one operation at a time: what the tests check the compiled tree by."""

    def __init__(self, keys: list[int]) -> None:
        self.key = np.array(keys, np.uint64)
        self.left, self.right, self.parent, self.red, self._st = new_tree(len(keys))

    @property
    def root(self) -> int:
        return int(self._st[0])

    def insert(self, z: int) -> None:
        tree_insert(self.key, self.left, self.right, self.parent, self.red, self._st, z)

    def erase(self, z: int) -> None:
        tree_erase(self.left, self.right, self.parent, self.red, self._st, z)

    def first(self) -> int:
        return int(tree_first(self.left, self._st))

    def next(self, x: int) -> int:
        return int(tree_next(self.left, self.right, self.parent, x))

    def in_order(self) -> list[int]:
        """The nodes in the tree, by key (equal keys in insertion order)."""
        out = []
        x = self.first()
        while x != -1:
            out.append(x)
            x = self.next(x)
        return out
