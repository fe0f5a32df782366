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

from .elf import (
    _SYM_FIELDS,
    SHN_UNDEF,
    STB_GLOBAL,
    STB_WEAK,
    STT_FUNC,
    STT_GNU_IFUNC,
    STT_OBJECT,
    _detached_debug,
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


def _names(strtab: bytes, offsets: np.ndarray) -> list[str]:
    out = []
    for start in offsets.tolist():
        stop = strtab.find(b"\0", start)
        out.append(strtab[start : stop if stop >= 0 else len(strtab)].decode("utf-8", "replace"))
    return out


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
        _names(strtab, entries["name"]),
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
    names = [n + "@plt" for n in _names(strtab, syms["name"][index])]
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
    tree = _RbTree(start.tolist())
    for i in range(n):  # symbols__insert, in table order
        tree.insert(i)
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
        _fixup_duplicate(tree, start, end, names, bind)
    # PLT entries come after the fix-ups, with their own sizes.
    pstart, psize, pnames = _plt(runtime)
    tree.key.extend(pstart.tolist())
    for name in ("left", "right", "parent"):
        getattr(tree, name).extend([-1] * len(pnames))
    tree.red.extend([False] * len(pnames))
    for j in range(len(pnames)):
        tree.insert(n + j)
    start = np.concatenate([start, pstart])
    end = np.concatenate([end, pstart + psize])
    names = names + pnames
    kinds = np.concatenate([np.where(obj, OBJECT, FUNCTION), np.full(len(pnames), FUNCTION)])
    live = tree.in_order()
    # symbols__find meets an ancestor first: a symbol inside the range of
    # one above it in the tree is never found.
    keep = [i for i in live if not _covered(tree, i, start, end)]
    keep_arr = np.array(keep, np.int64)
    return SymbolTable(
        start[keep_arr],
        (end - start)[keep_arr],
        np.arange(len(keep), dtype=np.int32),
        [names[i] for i in keep],
        kinds[keep_arr].astype(np.uint8),
    )


def _key(i: int, start, end, names, bind) -> tuple:
    """choose_best_symbol's preference as a key (larger wins)."""
    name = names[i]
    return (
        bool(end[i] > start[i]),
        bind[i] != STB_WEAK,
        bind[i] == STB_GLOBAL,
        -(len(name) - len(name.lstrip("_"))),
        len(name),
    )


def _fixup_duplicate(tree: _RbTree, start, end, names, bind) -> None:
    """symbols__fixup_duplicate: of neighbours with the same start, the
    better stays (the first on a tie), the other is erased from the tree."""
    curr = tree.first()
    while curr != -1:
        nxt = tree.next(curr)
        if nxt == -1:
            break
        if start[curr] != start[nxt]:
            curr = nxt
            continue
        if _key(curr, start, end, names, bind) >= _key(nxt, start, end, names, bind):
            tree.erase(nxt)
        else:
            tree.erase(curr)
            curr = nxt


def _covered(tree: _RbTree, i: int, start, end) -> bool:
    p = tree.parent[i]
    while p != -1:
        if start[p] <= start[i] and end[i] <= end[p] and start[p] < end[p]:
            return True
        p = tree.parent[p]
    return False


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
    """perf's symbol tree: a red-black tree keyed by start, an equal start
    going right of those already in (``__symbols__insert``), balanced as
    the kernel's ``lib/rbtree.c`` does (the textbook insertion and
    erasure, a successor taking an erased node's place).  Its shape
    decides which of two overlapping symbols ``symbols__find`` meets
    first."""

    def __init__(self, keys: list[int]) -> None:
        n = len(keys)
        self.key = keys
        # child[0] is left, child[1] right: each rebalancing case is
        # written once for a side d and its mirror 1 - d.
        self.child = ([-1] * n, [-1] * n)
        self.left, self.right = self.child
        self.parent = [-1] * n
        self.red = [False] * n
        self.root = -1

    def _rotate(self, x: int, d: int) -> None:
        """Rotate at ``x`` towards side ``d`` (0: a left rotation): its
        child on the other side takes its place and ``x`` hangs from it."""
        near, far = self.child[d], self.child[1 - d]
        y = far[x]
        far[x] = near[y]
        if near[y] != -1:
            self.parent[near[y]] = x
        self._replace(x, y)
        near[y] = x
        self.parent[x] = y

    def _replace(self, old: int, new: int) -> None:
        """Put ``new`` where ``old`` hangs from its parent."""
        p = self.parent[old]
        if new != -1:
            self.parent[new] = p
        if p == -1:
            self.root = new
        elif self.left[p] == old:
            self.left[p] = new
        else:
            self.right[p] = new

    def insert(self, z: int) -> None:
        y, x = -1, self.root
        while x != -1:
            y = x
            x = self.left[x] if self.key[z] < self.key[x] else self.right[x]
        self.parent[z] = y
        if y == -1:
            self.root = z
        elif self.key[z] < self.key[y]:
            self.left[y] = z
        else:
            self.right[y] = z
        self.red[z] = True
        while self.parent[z] != -1 and self.red[self.parent[z]]:
            p = self.parent[z]
            g = self.parent[p]
            d = 0 if p == self.left[g] else 1  # the side p hangs on
            far = self.child[1 - d]
            u = far[g]
            if u != -1 and self.red[u]:
                self.red[p] = self.red[u] = False
                self.red[g] = True
                z = g
                continue
            if z == far[p]:
                z = p
                self._rotate(z, d)
                p = self.parent[z]
            self.red[p] = False
            self.red[g] = True
            self._rotate(g, 1 - d)
        self.red[self.root] = False

    def first(self) -> int:
        x = self.root
        while x != -1 and self.left[x] != -1:
            x = self.left[x]
        return x

    def in_order(self) -> list[int]:
        """The nodes in the tree, by key (equal keys in insertion order)."""
        out = []
        x = self.first()
        while x != -1:
            out.append(x)
            x = self.next(x)
        return out

    def next(self, x: int) -> int:
        if self.right[x] != -1:
            x = self.right[x]
            while self.left[x] != -1:
                x = self.left[x]
            return x
        p = self.parent[x]
        while p != -1 and x == self.right[p]:
            x, p = p, self.parent[p]
        return p

    def erase(self, z: int) -> None:
        if self.left[z] == -1 or self.right[z] == -1:
            child = self.left[z] if self.left[z] != -1 else self.right[z]
            parent = self.parent[z]
            self._replace(z, child)
            black_removed = not self.red[z]
        else:
            y = self.right[z]
            while self.left[y] != -1:
                y = self.left[y]
            child = self.right[y]
            black_removed = not self.red[y]
            if self.parent[y] == z:
                parent = y
            else:
                parent = self.parent[y]
                self._replace(y, child)
                self.right[y] = self.right[z]
                self.parent[self.right[y]] = y
            self._replace(z, y)
            self.left[y] = self.left[z]
            self.parent[self.left[y]] = y
            self.red[y] = self.red[z]
        if black_removed:
            self._erase_fixup(child, parent)

    def _erase_fixup(self, x: int, parent: int) -> None:
        red = self.red
        while x != self.root and (x == -1 or not red[x]):
            d = 0 if x == self.left[parent] else 1  # the side x hangs on
            near, far = self.child[d], self.child[1 - d]
            w = far[parent]
            if red[w]:
                red[w] = False
                red[parent] = True
                self._rotate(parent, d)
                w = far[parent]
            wn, wf = near[w], far[w]
            if (wn == -1 or not red[wn]) and (wf == -1 or not red[wf]):
                red[w] = True
                x, parent = parent, self.parent[parent]
                continue
            if wf == -1 or not red[wf]:
                red[wn] = False
                red[w] = True
                self._rotate(w, 1 - d)
                w = far[parent]
            red[w] = red[parent]
            red[parent] = False
            if far[w] != -1:
                red[far[w]] = False
            self._rotate(parent, d)
            x = self.root
        if x != -1:
            red[x] = False
